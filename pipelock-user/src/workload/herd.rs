//! `pipe-herd`: the test program of Linux commit 0ddad21d3e99 ("pipe: use
//! exclusive waits when reading or writing"). One pipe holding {0, -1}; 2^K
//! processes made by K successive forks all read 4-byte tokens; a non-negative
//! token i is passed on as {i+1, -1} with length 4·(1 + (i & 1)), until the
//! count reaches the limit. The figure is the wall time until all have exited.
use std::{sync::atomic::Ordering, time::Instant};

use serde_json::json;

use super::{
    Measurement, Progress, Workload,
    report::{Metric, Operations, Run},
    sys::Shared,
};
use crate::Error;

/// What a pipe-herd run records beyond its wall time.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HerdDetails {
    /// The token's count when the herd stopped (the limit, or a few past it).
    pub final_count: u64,
}

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// K: the herd is 2^K processes, made by K successive forks (max 10).
    #[arg(long, short = 'k', default_value_t = 6, value_parser = clap::value_parser!(u32).range(0..=10))]
    pub forks: u32,
    /// Stop when the token count reaches this.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000_000))]
    pub limit: u64,
}

pub struct PipeHerd(pub Args);

/// One herd member's loop, as in the commit's test program. Returns when its
/// own last written count reached the limit.
fn member(read_fd: i32, write_fd: i32, limit: u64, progress: &std::sync::atomic::AtomicU64) -> i32 {
    let mut counters: [i32; 2] = [0, -1];
    loop {
        let mut i: i32 = 0;
        // SAFETY: reading 4 bytes into an i32.
        let got = unsafe { libc::read(read_fd, (&raw mut i).cast(), 4) };
        if got != 4 {
            return 1;
        }
        if i >= 0 {
            counters[0] = i + 1;
            let len = 4 * (1 + (i & 1)) as usize;
            // SAFETY: writing 4 or 8 bytes of an [i32; 2].
            if unsafe { libc::write(write_fd, counters.as_ptr().cast(), len) } != len as isize {
                return 1;
            }
            // Every 1024th token only: a store per token would bounce the
            // shared cache line between CPUs on every pass.
            if counters[0] & 1023 == 0 || counters[0] as u64 >= limit {
                progress.store(counters[0] as u64, Ordering::Relaxed);
            }
        }
        if counters[0] as u64 >= limit {
            return 0;
        }
    }
}

impl Workload for PipeHerd {
    fn name(&self) -> &'static str {
        "pipe-herd"
    }

    fn metric(&self) -> Metric {
        Metric {
            name: "wall time".into(),
            unit: "s".into(),
            higher_is_better: false,
        }
    }

    fn params(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut map = serde_json::Map::new();
        map.insert("forks".into(), json!(self.0.forks));
        map.insert("processes".into(), json!(1u64 << self.0.forks));
        map.insert("limit".into(), json!(self.0.limit));
        map
    }

    fn progress(&self) -> Progress {
        Progress::Counted(self.0.limit)
    }

    fn measure(&self, shared: &Shared) -> Result<Measurement, Error> {
        // The token count is an i32 in the original program.
        if self.0.limit > i32::MAX as u64 {
            return Err(Error::Workload {
                reason: format!("--limit must be at most {}", i32::MAX),
            });
        }
        let mut fds = [0; 2];
        // SAFETY: pipe fills two descriptors.
        if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
            return Err(Error::Io {
                what: "pipe",
                source: std::io::Error::last_os_error(),
            });
        }
        let start: [i32; 2] = [0, -1];
        // SAFETY: 8 bytes into a fresh, empty pipe.
        if unsafe { libc::write(fds[1], start.as_ptr().cast(), 8) } != 8 {
            return Err(Error::Io {
                what: "write",
                source: std::io::Error::last_os_error(),
            });
        }
        let (limit, forks, progress) = (self.0.limit, self.0.forks, shared.get(0));
        let started = Instant::now();
        // The herd's root is a plain child; its descendants are re-parented to
        // this leader (a subreaper) as their parents finish.
        // SAFETY: the child only forks, reads, writes and _exits.
        match unsafe { libc::fork() } {
            -1 => {
                return Err(Error::Io {
                    what: "fork",
                    source: std::io::Error::last_os_error(),
                });
            }
            0 => {
                for _ in 0..forks {
                    // SAFETY: as above; a failed fork leaves a smaller herd, so
                    // stop the member instead of running a different test.
                    if unsafe { libc::fork() } == -1 {
                        unsafe { libc::_exit(2) };
                    }
                }
                let code = member(fds[0], fds[1], limit, progress);
                // SAFETY: leave without running the leader's destructors.
                unsafe { libc::_exit(code) };
            }
            _ => {}
        }
        // SAFETY: the leader keeps no pipe ends; only the herd holds them.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        let mut failed = 0;
        let mut status = 0;
        // SAFETY: reaping every descendant until none is left.
        while unsafe { libc::waitpid(-1, &mut status, 0) } > 0 {
            if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
                failed += 1;
            }
        }
        let elapsed = started.elapsed().as_secs_f64();
        if failed > 0 {
            return Err(Error::Workload {
                reason: format!("{failed} herd member(s) failed"),
            });
        }
        let tokens = progress.load(Ordering::Relaxed);
        Ok(Measurement {
            value: elapsed,
            // A token passed is one write and one read on the pipe.
            operations: Some(Operations {
                count: tokens,
                name: "token (write+read)".to_owned(),
            }),
            details: super::details(HerdDetails { final_count: tokens })?,
        })
    }

    fn describe_run(&self, run: &Run) -> Vec<String> {
        vec![format!(
            "pipe-herd: {} processes passed {} tokens in {:.3} s",
            1u64 << self.0.forks,
            self.0.limit,
            run.value
        )]
    }
}
