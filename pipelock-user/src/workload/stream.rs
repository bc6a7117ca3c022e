//! `pipe-stream`: pipebench's semantics. A source writes 128 KiB chunks of a
//! memory buffer (or a file) into a pipe; a middle process reads until it holds
//! `--bufsize` bytes, then writes them to the sink (/dev/null or a second pipe
//! drained by a third process). Reported like pipebench, base 1024.
use std::{
    ffi::CString,
    path::PathBuf,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use serde_json::json;

use super::{
    Measurement, Progress, Workload,
    report::{Metric, Run},
    sys::{self, Shared},
};
use crate::Error;

/// What a pipe-stream run records beyond its rate.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StreamDetails {
    /// Bytes that went through the pipe.
    pub bytes: u64,
    /// How long the stream ran, seconds.
    pub stream_s: f64,
}

/// pipebench's source writes this much per write(2).
const CHUNK: usize = 128 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Sink {
    /// Write to /dev/null, as `pipebench > /dev/null`.
    DevNull,
    /// Write into a second pipe that a third process drains.
    Pipe,
}

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Stream this many bytes (suffixes K, M, G: powers of 1024).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, conflicts_with = "duration")]
    pub bytes: Option<u64>,
    /// Stream for this long (the default, 10 s, when --bytes is not given).
    #[arg(long, value_name = "SECS", value_parser = crate::units::parse_seconds, allow_negative_numbers = true)]
    pub duration: Option<Duration>,
    /// The middle process's buffer (pipebench -b).
    #[arg(long, default_value_t = 819_200, value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    pub bufsize: u64,
    /// Read the data from this file instead of a memory buffer (until EOF).
    #[arg(long, value_name = "PATH")]
    pub source: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Sink::DevNull)]
    pub sink: Sink,
}

pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let (digits, scale) = match text.trim().to_ascii_uppercase().chars().last() {
        Some('K') => (&text[..text.len() - 1], 1 << 10),
        Some('M') => (&text[..text.len() - 1], 1 << 20),
        Some('G') => (&text[..text.len() - 1], 1 << 30),
        _ => (text, 1),
    };
    let value: u64 = digits
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a byte count like 512M"))?;
    match value.checked_mul(scale) {
        Some(0) | None => Err(format!("`{text}`: the byte count must be greater than 0")),
        Some(bytes) => Ok(bytes),
    }
}

pub struct PipeStream(pub Args);

const DEFAULT_DURATION: Duration = Duration::from_secs(10);

impl PipeStream {
    fn duration(&self) -> Option<Duration> {
        match (self.0.bytes, self.0.duration) {
            (Some(_), _) => None,
            (None, duration) => Some(duration.unwrap_or(DEFAULT_DURATION)),
        }
    }
}

/// `Piped 14.91 GB in 00h01m34.20s: 162.12 MB/second` (pipebench's summary).
pub fn pipebench_summary(bytes: u64, elapsed: f64) -> String {
    let (amount, unit) = scaled(bytes as f64);
    let rate = if elapsed > 0.0 {
        bytes as f64 / elapsed
    } else {
        0.0
    };
    let (rate, rate_unit) = scaled(rate);
    let hours = (elapsed / 3600.0).floor();
    let minutes = ((elapsed - hours * 3600.0) / 60.0).floor();
    let seconds = elapsed - hours * 3600.0 - minutes * 60.0;
    format!(
        "Piped {amount:.2} {unit} in {hours:02}h{minutes:02}m{seconds:05.2}s: {rate:.2} {rate_unit}/second"
    )
}

fn scaled(value: f64) -> (f64, &'static str) {
    let units = ["B", "kB", "MB", "GB", "TB"];
    let mut value = value;
    let mut unit = 0;
    while value >= 1024.0 && unit < units.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    (value, units[unit])
}

fn write_all(fd: i32, mut data: &[u8]) -> bool {
    while !data.is_empty() {
        // SAFETY: writing from a live slice.
        let n = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
        if n <= 0 {
            if n < 0
                && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
                && !sys::stopped()
            {
                continue;
            }
            return false;
        }
        data = &data[n as usize..];
    }
    true
}

fn close(fds: &[i32]) {
    // SAFETY: closing descriptors this process owns.
    fds.iter().for_each(|&fd| unsafe {
        libc::close(fd);
    });
}

impl Workload for PipeStream {
    fn name(&self) -> &'static str {
        "pipe-stream"
    }

    fn metric(&self) -> Metric {
        Metric {
            name: "rate".into(),
            unit: "MB/s".into(),
            higher_is_better: true,
        }
    }

    fn params(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut map = serde_json::Map::new();
        map.insert("bytes".into(), json!(self.0.bytes));
        map.insert(
            "duration_s".into(),
            json!(self.duration().map(|d| d.as_secs_f64())),
        );
        map.insert("bufsize".into(), json!(self.0.bufsize));
        map.insert("chunk".into(), json!(CHUNK));
        map.insert(
            "source".into(),
            json!(self.0.source.as_ref().map(|p| p.display().to_string())),
        );
        map.insert(
            "sink".into(),
            json!(match self.0.sink {
                Sink::DevNull => "/dev/null",
                Sink::Pipe => "pipe",
            }),
        );
        map
    }

    fn progress(&self) -> Progress {
        match (self.duration(), self.0.bytes) {
            (Some(duration), _) => Progress::Timed(duration),
            (None, bytes) => Progress::Counted(bytes.unwrap_or(0)),
        }
    }

    fn measure(&self, shared: &Shared) -> Result<Measurement, Error> {
        let source_file = match &self.0.source {
            Some(path) => {
                let c = CString::new(path.as_os_str().as_encoded_bytes())
                    .map_err(|_| Error::Usage(format!("{}: path contains NUL", path.display())))?;
                // SAFETY: opening a path read-only.
                let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
                if fd < 0 {
                    return Err(Error::read(path)(std::io::Error::last_os_error()));
                }
                Some(fd)
            }
            None => None,
        };
        let first = sys::pipe()?;
        let sink_pipe = match self.0.sink {
            Sink::Pipe => Some(sys::pipe()?),
            Sink::DevNull => None,
        };
        let (duration, limit, bufsize) = (self.duration(), self.0.bytes, self.0.bufsize as usize);
        let moved = shared.get(0);
        let started = Instant::now();
        let mut pids = Vec::new();

        pids.push(sys::fork_worker(|| {
            close(&[first[0]]);
            if let Some(p) = sink_pipe {
                close(&p);
            }
            if let Some(duration) = duration
                && sys::arm_stop_timer(duration).is_err()
            {
                return 2;
            }
            let mut buf = vec![0x5au8; CHUNK];
            let mut sent = 0u64;
            while !sys::stopped() && limit.is_none_or(|l| sent < l) {
                let want = limit.map_or(CHUNK, |l| CHUNK.min((l - sent) as usize));
                let chunk = match source_file {
                    // SAFETY: reading into our buffer.
                    Some(fd) => match unsafe { libc::read(fd, buf.as_mut_ptr().cast(), want) } {
                        n if n > 0 => n as usize,
                        _ => break,
                    },
                    None => want,
                };
                if !write_all(first[1], &buf[..chunk]) {
                    break;
                }
                sent += chunk as u64;
            }
            0
        })?);

        pids.push(sys::fork_worker(|| {
            close(&[first[1]]);
            let sink = match sink_pipe {
                Some(p) => {
                    close(&[p[0]]);
                    p[1]
                }
                // SAFETY: opening /dev/null for writing.
                None => unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY) },
            };
            let mut buf = vec![0u8; bufsize];
            loop {
                let mut filled = 0;
                while filled < bufsize {
                    // SAFETY: reading into the unfilled tail of our buffer.
                    let n =
                        unsafe { libc::read(first[0], buf[filled..].as_mut_ptr().cast(), bufsize - filled) };
                    if n <= 0 {
                        break;
                    }
                    filled += n as usize;
                }
                if filled == 0 || !write_all(sink, &buf[..filled]) {
                    return 0;
                }
                moved.fetch_add(filled as u64, Ordering::Relaxed);
            }
        })?);

        if let Some(p) = sink_pipe {
            pids.push(sys::fork_worker(|| {
                close(&[first[0], first[1], p[1]]);
                let mut buf = vec![0u8; CHUNK];
                // SAFETY: draining into our buffer until EOF.
                while unsafe { libc::read(p[0], buf.as_mut_ptr().cast(), CHUNK) } > 0 {}
                0
            })?);
            close(&p);
        }
        close(&first);
        if let Some(fd) = source_file {
            close(&[fd]);
        }
        if sys::wait_all(&pids) > 0 {
            return Err(Error::Workload {
                reason: "a pipe-stream process failed".into(),
            });
        }
        let elapsed = started.elapsed().as_secs_f64();
        let bytes = moved.load(Ordering::Relaxed);
        Ok(Measurement {
            value: bytes as f64 / elapsed / (1024.0 * 1024.0),
            operations: None,
            details: super::details(StreamDetails {
                bytes,
                stream_s: elapsed,
            })?,
        })
    }

    fn describe_run(&self, run: &Run) -> Vec<String> {
        super::details_of::<StreamDetails>(run)
            .map(|d| pipebench_summary(d.bytes, d.stream_s))
            .into_iter()
            .collect()
    }

    fn live_status(&self, shared: &Shared, elapsed: Duration) -> Option<String> {
        let bytes = shared.get(0).load(Ordering::Relaxed);
        let (rate, unit) = scaled(bytes as f64 / elapsed.as_secs_f64().max(1e-3));
        Some(format!("{rate:.2} {unit}/second"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipebench_summary_format() {
        // 14.91 GiB in 1 min 34.20 s → 162.08 MiB/s (pipebench divides by 1024).
        let bytes = (14.91 * 1024.0 * 1024.0 * 1024.0) as u64;
        assert_eq!(
            pipebench_summary(bytes, 94.2),
            "Piped 14.91 GB in 00h01m34.20s: 162.08 MB/second"
        );
        assert_eq!(
            pipebench_summary(512, 1.0),
            "Piped 512.00 B in 00h00m01.00s: 512.00 B/second"
        );
    }

    #[test]
    fn byte_counts_parse() {
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("3k"), Ok(3072));
        assert_eq!(parse_bytes("100"), Ok(100));
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("lots").is_err());
    }
}
