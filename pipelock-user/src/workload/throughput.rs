//! `pipe-throughput`: UnixBench's "Pipe Throughput". One process, one blocking
//! pipe, loop { write 512 bytes; read 512 bytes; count++ } until a timer fires;
//! `--passes` repetitions scored as UnixBench's `Run` scores them.
use std::{
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use serde_json::json;

use super::{
    Measurement, Progress, Workload,
    report::{Metric, Operations, Report, Run},
    sys::{self, Shared},
};
use crate::{
    Error,
    model::stats::{PIPE_THROUGHPUT_BASELINE_LPS, unixbench_index, unixbench_score},
};

/// What a pipe-throughput run records beyond its score.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ThroughputDetails {
    /// Each pass's loops per second.
    pub pass_lps: Vec<f64>,
    /// The passes the score keeps (UnixBench drops the worst third).
    pub samples_kept: usize,
    /// The score against UnixBench's baseline machine.
    pub index: f64,
}

/// UnixBench's pipe.c moves 512 bytes each way per iteration.
const MESSAGE: usize = 512;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Seconds per pass (UnixBench: 10).
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = crate::units::parse_seconds, allow_negative_numbers = true)]
    pub duration: Duration,
    /// Passes per run; the lowest third is dropped, the rest geometric-meaned.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub passes: u32,
    /// Independent processes, each with its own pipe (UnixBench's parallel copies).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub copies: u32,
}

pub struct PipeThroughput(pub Args);

/// Shared slots: 0 progress, then (count, elapsed ns) per copy.
fn count_slot(copy: usize) -> usize {
    1 + 2 * copy
}

/// The UnixBench loop; returns iterations completed before the stop flag.
fn pipe_loop() -> Result<u64, Error> {
    let fds = sys::pipe()?;
    let mut buf = [0u8; MESSAGE];
    let mut count = 0u64;
    while !sys::stopped() {
        // SAFETY: buf is MESSAGE bytes; raw syscalls as pipe.c makes them.
        unsafe {
            if libc::write(fds[1], buf.as_ptr().cast(), MESSAGE) != MESSAGE as isize {
                break;
            }
            if libc::read(fds[0], buf.as_mut_ptr().cast(), MESSAGE) != MESSAGE as isize {
                break;
            }
        }
        count += 1;
    }
    Ok(count)
}

impl Workload for PipeThroughput {
    fn name(&self) -> &'static str {
        "pipe-throughput"
    }

    fn metric(&self) -> Metric {
        Metric {
            name: "throughput".into(),
            unit: "lps".into(),
            higher_is_better: true,
        }
    }

    fn params(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut map = serde_json::Map::new();
        map.insert("duration_s".into(), json!(self.0.duration.as_secs_f64()));
        map.insert("passes".into(), json!(self.0.passes));
        map.insert("copies".into(), json!(self.0.copies));
        map.insert("message_bytes".into(), json!(MESSAGE));
        map
    }

    fn shared_slots(&self) -> usize {
        1 + 2 * self.0.copies as usize
    }

    fn progress(&self) -> Progress {
        Progress::Timed(self.0.duration * self.0.passes)
    }

    fn measure(&self, shared: &Shared) -> Result<Measurement, Error> {
        let mut pass_lps = Vec::new();
        // Write + read pairs, all passes and copies: what per-operation
        // lock counts are divided by (`pipelock ab`).
        let mut loops = 0u64;
        for _ in 0..self.0.passes {
            let mut pids = Vec::new();
            for copy in 0..self.0.copies as usize {
                let duration = self.0.duration;
                pids.push(sys::fork_worker(move || {
                    if sys::arm_stop_timer(duration).is_err() {
                        return 2;
                    }
                    let started = Instant::now();
                    let Ok(count) = pipe_loop() else { return 2 };
                    shared.get(count_slot(copy)).store(count, Ordering::Relaxed);
                    shared
                        .get(count_slot(copy) + 1)
                        .store(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    0
                })?);
            }
            if sys::wait_all(&pids) > 0 {
                return Err(Error::Workload {
                    reason: "a pipe-throughput copy failed".into(),
                });
            }
            loops += (0..self.0.copies as usize)
                .map(|copy| shared.get(count_slot(copy)).load(Ordering::Relaxed))
                .sum::<u64>();
            let lps: f64 = (0..self.0.copies as usize)
                .map(|copy| {
                    let count = shared.get(count_slot(copy)).load(Ordering::Relaxed) as f64;
                    let secs = shared.get(count_slot(copy) + 1).load(Ordering::Relaxed) as f64 / 1e9;
                    if secs > 0.0 { count / secs } else { 0.0 }
                })
                .sum();
            pass_lps.push(lps);
        }
        let (score, kept) = unixbench_score(&pass_lps).ok_or_else(|| Error::Workload {
            reason: "no pipe-throughput pass completed an iteration".into(),
        })?;
        Ok(Measurement {
            value: score,
            operations: Some(Operations {
                count: loops,
                name: "write+read pair".to_owned(),
            }),
            details: super::details(ThroughputDetails {
                index: unixbench_index(score, PIPE_THROUGHPUT_BASELINE_LPS),
                pass_lps,
                samples_kept: kept,
            })?,
        })
    }

    fn describe_run(&self, run: &Run) -> Vec<String> {
        let kept = super::details_of::<ThroughputDetails>(run).map_or(0, |d| d.samples_kept);
        vec![format!(
            "{:<46}{:>12.1} lps   ({:.1} s, {kept} samples)",
            "Pipe Throughput",
            run.value,
            self.0.duration.as_secs_f64()
        )]
    }

    fn describe_summary(&self, report: &Report) -> Vec<String> {
        let Some(summary) = &report.summary else {
            return Vec::new();
        };
        vec![
            String::new(),
            format!(
                "{:<40}{:>10}{:>13}{:>9}",
                "System Benchmarks Index Values", "BASELINE", "RESULT", "INDEX"
            ),
            format!(
                "{:<40}{:>10.1}{:>13.1}{:>9.1}",
                "Pipe Throughput",
                PIPE_THROUGHPUT_BASELINE_LPS,
                summary.mean,
                unixbench_index(summary.mean, PIPE_THROUGHPUT_BASELINE_LPS)
            ),
        ]
    }
}
