//! `pipelock report RESULT.json --html FILE`: the page of a result file,
//! whichever command wrote it: `trace --json` (a trace report), `run
//! --json` (a workload's runs and, with `--trace`, their trace) or `ab
//! --json` (two kernels' runs and their comparison).
use std::path::Path;

use pipelock_common::Histogram;
use serde::Deserialize as _;

use crate::{
    Error,
    model::{Timing, TraceReport, timing::merge},
    output::{Format, Outputs},
    render::html::{AbKernel, AbPage, AbRow, ClassHistograms, Page, render_html},
    workload::report::Report as RunResult,
};

/// A result file, read.
enum Loaded {
    Trace(Box<TraceReport>, Option<(String, String)>),
    Ab(AbPage),
}

fn invalid(path: &Path, why: String) -> Error {
    Error::Read {
        path: path.to_owned(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, why),
    }
}

/// The trace of a run result (`--trace`) or a trace report, and the run's
/// workload and headline figure, read as pipelock's own types: a file of
/// another version or program is one line saying what it is not.
fn trace_of(result: &serde_json::Value) -> Result<(TraceReport, Option<(String, String)>), String> {
    let Some(workload) = result.get("workload") else {
        let report = TraceReport::deserialize(result).map_err(|e| format!("not a pipelock trace: {e}"))?;
        return Ok((report, None));
    };
    if result.get("trace").is_none_or(serde_json::Value::is_null) {
        return Err(format!(
            "a {} result without a trace (run it with --trace)",
            workload.as_str().unwrap_or("workload")
        ));
    }
    let run = RunResult::deserialize(result).map_err(|e| format!("not a pipelock run result: {e}"))?;
    let figure = run.summary.map_or(String::new(), |summary| {
        format!(
            "{} {:.4} {} ({})",
            run.metric.name,
            summary.mean,
            run.metric.unit,
            if run.runs.len() == 1 {
                "1 run".to_owned()
            } else {
                format!("mean of {} runs", run.runs.len())
            }
        )
    });
    let trace = run.trace.ok_or("a run result without a trace")?;
    Ok((
        trace,
        Some((run.workload.clone(), format!("{}: {figure}", run.workload))),
    ))
}

/// Each class's waits and holds over every run of one kernel.
fn merged_classes(runs: &[serde_json::Value]) -> Result<ClassHistograms, String> {
    let mut classes = ClassHistograms::new();
    for run in runs {
        let (trace, _) = trace_of(run)?;
        for row in &trace.locks {
            let class = crate::model::class_label(row.class).to_owned();
            let at = match classes.iter().position(|(c, ..)| *c == class) {
                Some(at) => at,
                None => {
                    classes.push((class, Histogram::EMPTY, Histogram::EMPTY));
                    classes.len() - 1
                }
            };
            let (_, wait, hold) = &mut classes[at];
            for (into, timing) in [(wait, &row.wait), (hold, &row.hold)] {
                if let Some(timing) = timing {
                    merge(into, &Timing::to_hist(timing));
                }
            }
        }
    }
    Ok(classes)
}

fn ab_page(result: &serde_json::Value) -> Result<AbPage, String> {
    let kernels = result["kernels"]
        .as_array()
        .filter(|k| k.len() == 2)
        .ok_or("an ab result without its two kernels")?;
    let kernel = |k: &serde_json::Value| -> Result<AbKernel, String> {
        let runs = k["runs"].as_array().map_or(&[][..], Vec::as_slice);
        Ok(AbKernel {
            release: k["release"].as_str().unwrap_or("?").to_owned(),
            runs: runs.len(),
            classes: merged_classes(runs)?,
        })
    };
    let rows = result["table"]
        .as_array()
        .ok_or("an ab result without its table")?
        .iter()
        .map(|row| AbRow {
            metric: row["metric"].as_str().unwrap_or("").to_owned(),
            a: row["a"]["mean"].as_f64().unwrap_or(f64::NAN),
            b: row["b"]["mean"].as_f64().unwrap_or(f64::NAN),
            change_percent: row["change_percent"].as_f64().unwrap_or(0.0),
            ci_percent: row["difference"]["ci_low_percent"]
                .as_f64()
                .zip(row["difference"]["ci_high_percent"].as_f64()),
            significant: row["significant"] == true,
        })
        .collect();
    let command = result["command"]
        .as_array()
        .map(|words| {
            words
                .iter()
                .filter_map(|w| w.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    Ok(AbPage {
        command,
        kernels: [kernel(&kernels[0])?, kernel(&kernels[1])?],
        rows,
    })
}

fn load(path: &Path) -> Result<Loaded, Error> {
    let text = std::fs::read_to_string(path).map_err(Error::read(path))?;
    let result: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| invalid(path, format!("not JSON: {e}")))?;
    let loaded = if result.get("kernels").is_some() && result.get("table").is_some() {
        ab_page(&result).map(Loaded::Ab)
    } else if result.get("workload").is_some() || result.get("locks").is_some() {
        trace_of(&result).map(|(trace, workload)| Loaded::Trace(Box::new(trace), workload))
    } else {
        Err("not a pipelock result (trace, run or ab --json)".to_owned())
    };
    loaded.map_err(|why| invalid(path, why))
}

/// Reads `result` and writes its page to `html` (whole, or not at all).
pub fn run(result: &Path, html: &Path, top: usize) -> Result<(), Error> {
    let outputs = Outputs::prepare_all(&[(Some(html), Format::Html)])?;
    let page = match load(result)? {
        Loaded::Trace(report, workload) => render_html(
            &Page::Trace {
                report: &report,
                workload,
            },
            top,
        ),
        Loaded::Ab(ab) => render_html(&Page::Ab(&ab), top),
    };
    outputs.write_with(|_| Ok(page.clone().into_bytes()))?;
    println!("pipelock report: {}", html.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str, text: &str) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("pipelock-report-{}-{name}", std::process::id()));
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn what_is_no_result_is_one_error_and_no_page() {
        let html = std::env::temp_dir().join(format!("pipelock-report-{}.html", std::process::id()));
        for (name, text, says) in [
            ("broken", "{", "not JSON"),
            ("other", "{\"a\": 1}", "not a pipelock result"),
            (
                "untraced",
                "{\"workload\": \"pipe-herd\", \"runs\": []}",
                "without a trace",
            ),
            ("ab", "{\"kernels\": [], \"table\": []}", "two kernels"),
            (
                "foreign run",
                "{\"workload\": \"pipe-herd\", \"trace\": {\"locks\": []}}",
                "not a pipelock run result",
            ),
            (
                "foreign trace",
                "{\"locks\": [{\"lock\": 1}]}",
                "not a pipelock trace",
            ),
        ] {
            let path = scratch(name, text);
            let err = run(&path, &html, 8).unwrap_err();
            let line = format!("{err}: {}", std::error::Error::source(&err).unwrap());
            assert!(line.contains(says), "{name}: {line}");
            assert!(!html.exists(), "{name}: a page was written");
            let _ = std::fs::remove_file(path);
        }
        let missing = run(Path::new("/nonexistent.json"), &html, 8).unwrap_err();
        assert!(missing.to_string().contains("/nonexistent.json"), "{missing}");
    }

    #[test]
    fn a_trace_report_becomes_a_page() {
        let report = crate::model::fixtures::sample();
        let path = scratch("trace", &serde_json::to_string(&report).unwrap());
        let html = std::env::temp_dir().join(format!("pipelock-report-{}-t.html", std::process::id()));
        run(&path, &html, 8).unwrap();
        let page = std::fs::read_to_string(&html).unwrap();
        assert!(page.contains(&report.locks[0].name), "{page}");
        let _ = (std::fs::remove_file(path), std::fs::remove_file(html));
    }
}
