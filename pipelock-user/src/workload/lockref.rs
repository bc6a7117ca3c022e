//! `lockref-stat`: a stat() storm on one path, in the spirit of Linus's 2013
//! `./t` lockref test and will-it-scale's stat2. Every lookup takes and drops a
//! reference on the path's dentry (`d_lockref`); with `--mode same` all workers
//! fight over one dentry, `--mode separate` gives each its own (the control).
use std::{
    ffi::CString,
    path::{Path, PathBuf},
    sync::atomic::Ordering,
    time::Duration,
};

use serde_json::json;

use super::{
    Measurement, Progress, Workload,
    report::{Metric, Run},
    sys::{self, Shared},
};
use crate::Error;

/// What a lockref-stat run records beyond its rate.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LockrefDetails {
    /// Calls made by all workers.
    pub total: u64,
    pub per_worker: Vec<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Op {
    /// stat(2) the path: a full path walk per call.
    Stat,
    /// fstat(2) an open descriptor: no path walk (no lockref traffic).
    Fstat,
    /// access(2) the path.
    Access,
    /// open(2) then close(2) the path.
    OpenClose,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Every worker uses one path.
    Same,
    /// One path per worker (the control case).
    Separate,
}

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Worker threads (default: the number of CPUs).
    #[arg(long, value_name = "N", conflicts_with = "procs", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub threads: Option<u32>,
    /// Worker processes instead of threads.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub procs: Option<u32>,
    /// Seconds to run.
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = crate::units::parse_seconds, allow_negative_numbers = true)]
    pub duration: Duration,
    /// The shared path (default: a file created for the run).
    #[arg(long, value_name = "PATH")]
    pub path: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Op::Stat)]
    pub op: Op,
    #[arg(long, value_enum, default_value_t = Mode::Same)]
    pub mode: Mode,
}

pub struct LockrefStat {
    args: Args,
    workers: u32,
    /// The files the run stats: one (same) or one per worker (separate).
    paths: Vec<CString>,
    /// A directory this run created, removed when done.
    scratch: Option<PathBuf>,
}

impl LockrefStat {
    /// Validates the arguments and creates the files the run needs.
    pub fn new(args: Args) -> Result<Self, Error> {
        let workers = args
            .procs
            .or(args.threads)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32));
        let cstring = |p: &Path| {
            CString::new(p.as_os_str().as_encoded_bytes())
                .map_err(|_| Error::Usage(format!("{}: path contains NUL", p.display())))
        };
        if let Some(path) = &args.path {
            if args.mode == Mode::Separate {
                return Err(Error::Usage(
                    "--path names one shared file; --mode separate creates one file per worker".into(),
                ));
            }
            if !path.exists() {
                return Err(Error::Usage(format!(
                    "--path {}: no such file or directory",
                    path.display()
                )));
            }
            return Ok(Self {
                paths: vec![cstring(path)?],
                args,
                workers,
                scratch: None,
            });
        }
        let scratch = std::env::temp_dir().join(format!("pipelock-lockref-{}", std::process::id()));
        std::fs::create_dir_all(&scratch).map_err(|source| Error::Output {
            path: scratch.clone(),
            source,
        })?;
        let count = if args.mode == Mode::Same { 1 } else { workers };
        let mut paths = Vec::new();
        for n in 0..count {
            let file = scratch.join(format!("t{n}"));
            std::fs::write(&file, b"").map_err(|source| Error::Output {
                path: file.clone(),
                source,
            })?;
            paths.push(cstring(&file)?);
        }
        Ok(Self {
            args,
            workers,
            paths,
            scratch: Some(scratch),
        })
    }

    fn path_of(&self, worker: usize) -> &CString {
        &self.paths[worker % self.paths.len()]
    }
}

impl Drop for LockrefStat {
    fn drop(&mut self) {
        // Only the parent created it; leaders and workers leave with _exit.
        if let Some(dir) = &self.scratch {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Repeats `op` on `path` until the stop flag; returns the count.
fn storm(op: Op, path: &CString) -> u64 {
    // SAFETY: every call gets a valid C path or an fd opened here, and a
    // zeroed stat buffer to fill.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        let fd = if op == Op::Fstat {
            libc::open(path.as_ptr(), libc::O_RDONLY)
        } else {
            -1
        };
        let mut count = 0u64;
        while !sys::stopped() {
            let ok = match op {
                Op::Stat => libc::stat(path.as_ptr(), &mut st) == 0,
                Op::Fstat => libc::fstat(fd, &mut st) == 0,
                Op::Access => libc::access(path.as_ptr(), libc::R_OK) == 0,
                Op::OpenClose => {
                    let fd = libc::open(path.as_ptr(), libc::O_RDONLY);
                    fd >= 0 && libc::close(fd) == 0
                }
            };
            if !ok {
                break;
            }
            count += 1;
        }
        if fd >= 0 {
            libc::close(fd);
        }
        count
    }
}

impl Workload for LockrefStat {
    fn name(&self) -> &'static str {
        "lockref-stat"
    }

    fn metric(&self) -> Metric {
        Metric {
            name: "rate".into(),
            unit: "ops/s".into(),
            higher_is_better: true,
        }
    }

    fn params(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut map = serde_json::Map::new();
        map.insert("workers".into(), json!(self.workers));
        map.insert(
            "worker_kind".into(),
            json!(if self.args.procs.is_some() {
                "processes"
            } else {
                "threads"
            }),
        );
        map.insert("duration_s".into(), json!(self.args.duration.as_secs_f64()));
        map.insert("op".into(), json!(format!("{:?}", self.args.op).to_lowercase()));
        map.insert(
            "mode".into(),
            json!(format!("{:?}", self.args.mode).to_lowercase()),
        );
        map.insert(
            "path".into(),
            json!(
                self.args
                    .path
                    .as_ref()
                    .map_or("(created for the run)".to_owned(), |p| p.display().to_string())
            ),
        );
        map
    }

    fn shared_slots(&self) -> usize {
        1 + self.workers as usize
    }

    fn progress(&self) -> Progress {
        Progress::Timed(self.args.duration)
    }

    fn measure(&self, shared: &Shared) -> Result<Measurement, Error> {
        let (op, duration) = (self.args.op, self.args.duration);
        let started = std::time::Instant::now();
        if self.args.procs.is_some() {
            let mut pids = Vec::new();
            for worker in 0..self.workers as usize {
                let path = self.path_of(worker);
                pids.push(sys::fork_worker(move || {
                    if sys::arm_stop_timer(duration).is_err() {
                        return 2;
                    }
                    shared.get(1 + worker).store(storm(op, path), Ordering::Relaxed);
                    0
                })?);
            }
            if sys::wait_all(&pids) > 0 {
                return Err(Error::Workload {
                    reason: "a lockref-stat worker failed".into(),
                });
            }
        } else {
            // One timer for the process: SIGALRM sets the flag all threads poll.
            sys::arm_stop_timer(duration)?;
            std::thread::scope(|scope| {
                for worker in 0..self.workers as usize {
                    let path = self.path_of(worker);
                    scope.spawn(move || shared.get(1 + worker).store(storm(op, path), Ordering::Relaxed));
                }
            });
        }
        let elapsed = started.elapsed().as_secs_f64();
        let counts: Vec<u64> = (0..self.workers as usize)
            .map(|w| shared.get(1 + w).load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return Err(Error::Workload {
                reason: format!("{:?} failed on the first call", self.args.op),
            });
        }
        Ok(Measurement {
            value: total as f64 / elapsed,
            operations: None,
            details: super::details(LockrefDetails {
                total,
                per_worker: counts,
            })?,
        })
    }

    fn describe_run(&self, run: &Run) -> Vec<String> {
        let Some(details) = super::details_of::<LockrefDetails>(run) else {
            return Vec::new();
        };
        let per_worker: Vec<String> = details.per_worker.iter().map(u64::to_string).collect();
        vec![format!(
            "lockref-stat: {} calls, {:.0} ops/s (per worker: {})",
            details.total,
            run.value,
            per_worker.join(" ")
        )]
    }
}
