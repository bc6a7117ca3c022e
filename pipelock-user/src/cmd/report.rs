//! `pipelock report RESULT.json --html FILE`: the page of a result file,
//! whichever command wrote it: `trace --json` (a trace report), `run
//! --json` (a workload's runs and, with `--trace`, their trace) or `ab
//! --json` (two kernels' runs and their comparison).
use std::path::Path;

use pipelock_common::Histogram;
use serde::{Deserialize, de::IgnoredAny};

use crate::{
    Error,
    model::{AbResult, CommandResult, RunResult, Timing, TraceReport, format, timing::merge},
    output::{Format, Outputs},
    render::html::{AbKernel, AbPage, AbRow, ClassHistograms, Page, render_html},
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

/// The fields that tell pipelock's three result files apart.
#[derive(Deserialize)]
struct Shape {
    kernels: Option<IgnoredAny>,
    workload: Option<IgnoredAny>,
    locks: Option<IgnoredAny>,
}

/// The trace of a result, and for a run result its workload and headline
/// figure.
fn trace_of(result: CommandResult) -> Result<(TraceReport, Option<(String, String)>), String> {
    let run: RunResult = match result {
        CommandResult::Trace(trace) => return Ok((*trace, None)),
        CommandResult::Run(run) => *run,
    };
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
    let Some(trace) = run.trace else {
        return Err(without_trace(&run));
    };
    Ok((
        trace,
        Some((run.workload.clone(), format!("{}: {figure}", run.workload))),
    ))
}

fn without_trace(run: &RunResult) -> String {
    format!("a {} result without a trace (run it with --trace)", run.workload)
}

/// Each class's waits and holds over every run of one kernel.
fn merged_classes(runs: &[CommandResult]) -> Result<ClassHistograms, String> {
    let mut classes = ClassHistograms::new();
    for run in runs {
        let trace = match run {
            CommandResult::Trace(trace) => trace.as_ref(),
            CommandResult::Run(run) => run.trace.as_ref().ok_or_else(|| without_trace(run))?,
        };
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

fn ab_page(result: &AbResult) -> Result<AbPage, String> {
    let kernel = |k: &crate::model::KernelRuns| -> Result<AbKernel, String> {
        Ok(AbKernel {
            release: k.release.clone(),
            runs: k.runs.len(),
            classes: merged_classes(&k.runs)?,
        })
    };
    let rows = result
        .table
        .iter()
        .map(|row| AbRow {
            metric: row.metric.clone(),
            a: row.a.mean,
            b: row.b.mean,
            change_percent: row.change_percent,
            ci_percent: row.difference.map(|d| (d.ci_low_percent, d.ci_high_percent)),
            significant: row.significant,
        })
        .collect();
    Ok(AbPage {
        command: result.command.join(" "),
        kernels: [kernel(&result.kernels[0])?, kernel(&result.kernels[1])?],
        rows,
    })
}

/// Reads a result file as what its fields say it is: an old or foreign
/// file is one line saying what it is not.
fn read(text: &str) -> Result<Loaded, String> {
    let shape: Shape = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let what = match (&shape.kernels, &shape.workload, &shape.locks) {
        (Some(_), ..) => "ab result",
        (None, Some(_), _) => "run result",
        (None, None, Some(_)) => "trace",
        (None, None, None) => return Err("not a pipelock result (trace, run or ab --json)".to_owned()),
    };
    if let Some(why) = format::refusal(text) {
        return Err(format!("a pipelock {what}, but {why}"));
    }
    let fail = |e: serde_json::Error| format!("not a pipelock {what}: {e}");
    let result = match what {
        "ab result" => return ab_page(&serde_json::from_str(text).map_err(fail)?).map(Loaded::Ab),
        "run result" => CommandResult::Run(serde_json::from_str(text).map_err(fail)?),
        _ => CommandResult::Trace(serde_json::from_str(text).map_err(fail)?),
    };
    trace_of(result).map(|(trace, workload)| Loaded::Trace(Box::new(trace), workload))
}

fn load(path: &Path) -> Result<Loaded, Error> {
    let text = std::fs::read_to_string(path).map_err(Error::read(path))?;
    read(&text).map_err(|why| invalid(path, why))
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
    use crate::model::FORMAT;

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
                &format!("{{\"format\": {FORMAT}, \"workload\": \"pipe-herd\", \"runs\": []}}"),
                "not a pipelock run result: missing field",
            ),
            (
                "ab",
                &format!("{{\"format\": {FORMAT}, \"kernels\": [], \"table\": []}}"),
                "not a pipelock ab result",
            ),
            (
                "older run",
                "{\"workload\": \"pipe-herd\", \"trace\": {\"locks\": []}}",
                "a pipelock run result, but no result format field",
            ),
            (
                "newer trace",
                "{\"format\": 3, \"locks\": [{\"lock\": 1}]}",
                "a pipelock trace, but written in result format 3",
            ),
            (
                "foreign trace",
                &format!("{{\"format\": {FORMAT}, \"locks\": [{{\"lock\": 1}}]}}"),
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
    fn a_run_result_without_its_trace_says_so() {
        let mut result: RunResult = serde_json::from_str(
            &std::fs::read_to_string(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/results/pipe-herd.json"),
            )
            .unwrap(),
        )
        .unwrap();
        let text = serde_json::to_string(&result).unwrap();
        let Err(why) = read(&text) else {
            panic!("a page without a trace")
        };
        assert!(why.contains("pipe-herd result without a trace"), "{why}");
        result.trace = Some(crate::model::fixtures::sample());
        assert!(matches!(
            read(&serde_json::to_string(&result).unwrap()),
            Ok(Loaded::Trace(_, Some(_)))
        ));
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
