//! The result of `pipelock run`: a self-describing record (workload, exact
//! parameters, kernel, CPUs, every run with its counters) printed as text and
//! written as JSON or CSV. `pipelock compare` reads the JSON back.
use std::{fs, path::Path};

use serde::Serialize;

use super::{CommonArgs, Workload};
use crate::Error;
pub use crate::model::stats::format_value;
pub use crate::model::{CounterSource, Counters, Metric, Operations, Run, RunResult as Report, System};

/// A result with no runs yet, of `workload` with `common`'s settings on
/// this machine.
pub fn new(workload: &dyn Workload, common: &CommonArgs) -> Report {
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_owned();
    Report {
        format: crate::model::FormatVersion,
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

/// The result as text: header, per-run table with counters, summary.
pub fn render(report: &Report, extra: &[String]) -> String {
    let mut out = String::new();
    let params: Vec<String> = report
        .params
        .iter()
        .map(|(k, v)| format!("{k}={}", plain(v)))
        .collect();
    out.push_str(&format!(
        "pipelock run {}: kernel {}, {} CPUs online{}\nparameters: {}\n\n",
        report.workload,
        report.system.kernel,
        report.system.cpus_online,
        report
            .system
            .cpus_pinned
            .as_ref()
            .map(|c| format!(", pinned to {c:?}"))
            .unwrap_or_default(),
        params.join(" "),
    ));
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::NOTHING).set_header(vec![
        "run".to_owned(),
        format!("{} ({})", report.metric.name, report.metric.unit),
        "elapsed (s)".to_owned(),
        "task-clock (ms)".to_owned(),
        "context-switches".to_owned(),
        "cpu-migrations".to_owned(),
        "page-faults".to_owned(),
        "nvcsw".to_owned(),
        "nivcsw".to_owned(),
    ]);
    for run in &report.runs {
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
    if report
        .runs
        .iter()
        .any(|r| r.counters.source == CounterSource::Getrusage)
    {
        out.push_str(
            "note: perf_event_open was unavailable; counters come from getrusage \
             (context-switches = nvcsw + nivcsw, cpu-migrations not measured)\n",
        );
    }
    if let Some(s) = &report.summary {
        out.push_str(&format!(
            "\n{} ({}) over {} run{}: mean {}  min {}  max {}  stddev {} ({:.1} %)\n",
            report.metric.name,
            report.metric.unit,
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
    if report.interrupted {
        out.push_str(&format!(
            "interrupted: {} run(s) finished before Ctrl-C\n",
            report.runs.len()
        ));
    }
    out
}

fn plain(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
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
            counter_source: c.source.name(),
            params: params.clone(),
        })?;
    }
    writer.into_inner().map_err(|e| csv::Error::from(e.into_error()))
}

/// A `run --json` result file, or one line saying why it is not one.
pub fn load(path: &Path) -> Result<Report, Error> {
    let text = fs::read_to_string(path).map_err(Error::read(path))?;
    let invalid = |why: String| Error::Read {
        path: path.to_owned(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, why),
    };
    if let Some(why) = crate::model::format::refusal(&text) {
        return Err(invalid(why));
    }
    serde_json::from_str(&text).map_err(|e| invalid(format!("not a pipelock run result: {e}")))
}
