//! The result of `pipelock run`: a self-describing record (workload, exact
//! parameters, kernel, CPUs, every run with its counters and, with
//! `--trace`, its own trace). `compare`, `ab` and `report` read it back.
use serde::{Deserialize, Serialize};

use crate::{TraceReport, format::FormatVersion, stats::Summary};

/// The headline figure of a workload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metric {
    /// e.g. "throughput", "elapsed".
    pub name: String,
    /// e.g. "lps", "s", "MB/s", "ops/s".
    pub unit: String,
    pub higher_is_better: bool,
}

/// How many of the workload's operations a run did, and what one is: lock
/// counts are judged per operation, so runs of different lengths compare.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operations {
    pub count: u64,
    /// e.g. "write+read pair".
    pub name: String,
}

/// perf-stat-like counters of a whole run, children included.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Counters {
    /// CPU time of all tasks, in milliseconds (perf's task-clock).
    pub task_clock_ms: f64,
    pub context_switches: u64,
    pub cpu_migrations: u64,
    pub page_faults: u64,
    /// Voluntary / involuntary context switches (getrusage), always available.
    pub nvcsw: u64,
    pub nivcsw: u64,
    /// "perf_event" or "getrusage" (then migrations are unknown and 0).
    pub source: CounterSource,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CounterSource {
    #[default]
    PerfEvent,
    Getrusage,
}

impl CounterSource {
    pub fn name(self) -> &'static str {
        match self {
            Self::PerfEvent => "perf_event",
            Self::Getrusage => "getrusage",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub run: u32,
    pub value: f64,
    /// Wall time of the whole run (all passes), seconds.
    pub elapsed_s: f64,
    pub counters: Counters,
    /// The workloads that count operations say how many this run did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operations: Option<Operations>,
    /// Workload-specific detail (per-pass rates, per-thread counts…), shown
    /// to the user; pipelock reads nothing back from it.
    pub details: serde_json::Value,
    /// `--trace`: this run's own part of the trace, so `compare` can judge
    /// each lock figure across runs as it judges the headline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceReport>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct System {
    pub kernel: String,
    pub cpus_online: usize,
    /// `--cpus`, if the workload was pinned.
    pub cpus_pinned: Option<Vec<usize>>,
    pub pipelock_version: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    pub format: FormatVersion,
    pub workload: String,
    pub metric: Metric,
    pub params: serde_json::Map<String, serde_json::Value>,
    pub system: System,
    /// Seconds since the Unix epoch when the first run started.
    pub started_at: u64,
    pub runs: Vec<Run>,
    /// Over `runs[*].value`; absent when no run finished.
    pub summary: Option<Summary>,
    /// Ctrl-C stopped the runs early; `runs` holds those that finished.
    pub interrupted: bool,
    /// `--trace`: the trace of all runs, as `pipelock trace --json` writes
    /// it (the workloads only carry it: they know nothing of tracing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceReport>,
}

impl RunResult {
    pub fn finish(&mut self) {
        self.summary = Summary::of(&self.values());
    }

    pub fn values(&self) -> Vec<f64> {
        self.runs.iter().map(|r| r.value).collect()
    }
}

/// What a command run for its result wrote with `--json`: a workload's
/// runs (`pipelock run`) or a trace (`pipelock trace`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CommandResult {
    Run(Box<RunResult>),
    Trace(Box<TraceReport>),
}

impl CommandResult {
    /// Reads pipelock's own JSON result, or says in one line why not.
    pub fn from_json(json: &str) -> Result<Self, String> {
        if let Some(why) = crate::format::refusal(json) {
            return Err(why);
        }
        let run = serde_json::from_str::<RunResult>(json);
        let trace = serde_json::from_str::<TraceReport>(json);
        match (run, trace) {
            (Ok(run), _) => Ok(Self::Run(Box::new(run))),
            (_, Ok(trace)) => Ok(Self::Trace(Box::new(trace))),
            (Err(run), Err(trace)) => Err(format!(
                "neither a run result ({run}) nor a trace report ({trace})"
            )),
        }
    }

    /// The whole trace: the trace report itself, or the runs' (`--trace`).
    pub fn trace(&self) -> Option<&TraceReport> {
        match self {
            Self::Run(run) => run.trace.as_ref(),
            Self::Trace(trace) => Some(trace),
        }
    }
}
