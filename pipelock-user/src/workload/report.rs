//! The result of `pipelock run`: a self-describing record (workload, exact
//! parameters, kernel, CPUs, every run with its counters) printed as text and
//! written as JSON or CSV. `pipelock compare` reads the JSON back.
use std::{fs, path::Path};

use serde::{Deserialize, Serialize};

use super::{CommonArgs, Workload, sys::Counters};
use crate::Error;
use crate::model::{TraceReport, stats::Summary};

/// The headline figure of a workload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metric {
    /// e.g. "throughput", "elapsed".
    pub name: String,
    /// e.g. "lps", "s", "MB/s", "ops/s".
    pub unit: String,
    pub higher_is_better: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub run: u32,
    pub value: f64,
    /// Wall time of the whole run (all passes), seconds.
    pub elapsed_s: f64,
    pub counters: Counters,
    pub details: serde_json::Value,
    /// `--trace`: this run's own lock figures (per class: counts per
    /// operation, wait and hold mean, p50 and p99, the owners' split), so
    /// `compare` can judge them across runs as it judges the headline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_figures: Option<std::collections::BTreeMap<String, f64>>,
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
pub struct Report {
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
    /// `--trace`: the trace of the runs, as `pipelock trace --json` writes
    /// it (the workloads only carry it: they know nothing of tracing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceReport>,
}

impl Report {
    pub fn new(workload: &dyn Workload, common: &CommonArgs) -> Self {
        let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_owned();
        Self {
            workload: workload.name().to_owned(),
            metric: workload.metric(),
            params: workload.params(),
            system: System {
                kernel,
                cpus_online: std::thread::available_parallelism().map_or(1, usize::from),
                cpus_pinned: common.cpus.as_ref().map(|c| c.0.clone()),
                pipelock_version: env!("CARGO_PKG_VERSION").to_owned(),
            },
            started_at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            runs: Vec::new(),
            summary: None,
            interrupted: false,
            trace: None,
        }
    }

    pub fn finish(&mut self) {
        self.summary = Summary::of(&self.values());
    }

    pub fn values(&self) -> Vec<f64> {
        self.runs.iter().map(|r| r.value).collect()
    }

    /// Human-readable report: header, per-run table with counters, summary.
    pub fn render(&self, extra: &[String]) -> String {
        let mut out = String::new();
        let params: Vec<String> = self
            .params
            .iter()
            .map(|(k, v)| format!("{k}={}", plain(v)))
            .collect();
        out.push_str(&format!(
            "pipelock run {}: kernel {}, {} CPUs online{}\nparameters: {}\n\n",
            self.workload,
            self.system.kernel,
            self.system.cpus_online,
            self.system
                .cpus_pinned
                .as_ref()
                .map(|c| format!(", pinned to {c:?}"))
                .unwrap_or_default(),
            params.join(" "),
        ));
        let mut table = comfy_table::Table::new();
        table.load_preset(comfy_table::presets::NOTHING).set_header(vec![
            "run".to_owned(),
            format!("{} ({})", self.metric.name, self.metric.unit),
            "elapsed (s)".to_owned(),
            "task-clock (ms)".to_owned(),
            "context-switches".to_owned(),
            "cpu-migrations".to_owned(),
            "page-faults".to_owned(),
            "nvcsw".to_owned(),
            "nivcsw".to_owned(),
        ]);
        for run in &self.runs {
            let c = &run.counters;
            table.add_row(vec![
                run.run.to_string(),
                format_value(run.value),
                format!("{:.2}", run.elapsed_s),
                format!("{:.1}", c.task_clock_ms),
                c.context_switches.to_string(),
                c.cpu_migrations.to_string(),
                c.page_faults.to_string(),
                c.nvcsw.to_string(),
                c.nivcsw.to_string(),
            ]);
        }
        out.push_str(&table.to_string());
        out.push('\n');
        if self
            .runs
            .iter()
            .any(|r| r.counters.source == super::sys::CounterSource::Getrusage)
        {
            out.push_str(
                "note: perf_event_open was unavailable; counters come from getrusage \
                 (context-switches = nvcsw + nivcsw, cpu-migrations not measured)\n",
            );
        }
        if let Some(s) = &self.summary {
            out.push_str(&format!(
                "\n{} ({}) over {} run{}: mean {}  min {}  max {}  stddev {} ({:.1} %)\n",
                self.metric.name,
                self.metric.unit,
                s.n,
                if s.n == 1 { "" } else { "s" },
                format_value(s.mean),
                format_value(s.min),
                format_value(s.max),
                format_value(s.stddev),
                s.cv_percent(),
            ));
        }
        for line in extra {
            out.push_str(line);
            out.push('\n');
        }
        if self.interrupted {
            out.push_str(&format!(
                "interrupted: {} run(s) finished before Ctrl-C\n",
                self.runs.len()
            ));
        }
        out
    }
}

fn plain(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Enough digits to compare, not more.
pub fn format_value(value: f64) -> String {
    if value.abs() >= 1000.0 {
        format!("{value:.1}")
    } else if value.abs() >= 1.0 {
        format!("{value:.3}")
    } else {
        format!("{value:.6}")
    }
}

/// One CSV row per run.
#[derive(Serialize)]
struct CsvRow<'a> {
    workload: &'a str,
    kernel: &'a str,
    run: u32,
    metric: &'a str,
    unit: &'a str,
    value: f64,
    elapsed_s: f64,
    task_clock_ms: f64,
    context_switches: u64,
    cpu_migrations: u64,
    page_faults: u64,
    nvcsw: u64,
    nivcsw: u64,
    counter_source: &'static str,
    params: String,
}

pub fn to_csv(report: &Report) -> Result<Vec<u8>, csv::Error> {
    let mut writer = csv::Writer::from_writer(Vec::new());
    let params = serde_json::Value::Object(report.params.clone()).to_string();
    for run in &report.runs {
        let c = &run.counters;
        writer.serialize(CsvRow {
            workload: &report.workload,
            kernel: &report.system.kernel,
            run: run.run,
            metric: &report.metric.name,
            unit: &report.metric.unit,
            value: run.value,
            elapsed_s: run.elapsed_s,
            task_clock_ms: c.task_clock_ms,
            context_switches: c.context_switches,
            cpu_migrations: c.cpu_migrations,
            page_faults: c.page_faults,
            nvcsw: c.nvcsw,
            nivcsw: c.nivcsw,
            counter_source: match c.source {
                super::sys::CounterSource::PerfEvent => "perf_event",
                super::sys::CounterSource::Getrusage => "getrusage",
            },
            params: params.clone(),
        })?;
    }
    writer.into_inner().map_err(|e| csv::Error::from(e.into_error()))
}

pub fn load(path: &Path) -> Result<Report, Error> {
    let text = fs::read_to_string(path).map_err(Error::read(path))?;
    serde_json::from_str(&text).map_err(|e| Error::Read {
        path: path.to_owned(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not a pipelock result file: {e}"),
        ),
    })
}
