//! `run --trace` keeps each run's own lock figures, and `compare` judges
//! them across runs.
use std::collections::BTreeMap;

use pipelock_user::model::{
    LockClass, RunResult, TraceReport,
    judge::{self, Measure, Subject},
};

use super::*;

/// Which count: acquisitions or contentions.
#[derive(Clone, Copy, Debug)]
enum Count {
    Acquisitions,
    Contentions,
}

/// Per lock class, the sum of a count over the trace's rows.
fn trace_counts(trace: &TraceReport, count: Count) -> BTreeMap<LockClass, f64> {
    let mut sums = BTreeMap::new();
    for row in &trace.locks {
        let n = match count {
            Count::Acquisitions => row.acquisitions,
            Count::Contentions => Some(row.contentions),
        };
        if let (Some(class), Some(n)) = (row.class, n) {
            *sums.entry(class).or_default() += n as f64;
        }
    }
    sums
}

/// Per lock class, each run's figure of the count per operation (as the
/// judge reads it) times the run's operations, summed over the runs.
fn per_run_counts(result: &RunResult, count: Count) -> Result<BTreeMap<LockClass, f64>> {
    let measure = match count {
        Count::Acquisitions => Measure::AcquisitionsPerOperation,
        Count::Contentions => Measure::ContentionsPerOperation,
    };
    let mut sums = BTreeMap::new();
    for run in &result.runs {
        let ops = run.operations.as_ref().context("a run without operations")?.count;
        let figures = judge::run_lock_figures(run).context("a run without its trace")?;
        for (figure, value) in figures {
            if let (Subject::Class(class), true) = (figure.subject, figure.measure == measure) {
                *sums.entry(class).or_default() += value * ops as f64;
            }
        }
    }
    Ok(sums)
}

/// The runs' figures partition the trace: each event of the workload is in
/// exactly one run's part, so the per-run counts add up to the whole
/// trace's, class by class. Then `compare` prints the lock table with each
/// class's percentiles and their interval. That table has the figures
/// every run has, so each side is run again (up to 5 times) until every one
/// of its runs saw a pipe lock: tracepoint mode sees contended locks only,
/// and a herd contends only while two of its members run at once, which a
/// machine busy with something else need not allow.
fn run_trace_splits_its_lock_figures_by_run() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    let (a, b) = (scratch("compare-a.json"), scratch("compare-b.json"));
    // The check is arithmetic on whatever the runs saw: a few thousand
    // messages a run give every class of the herd under TCG too.
    let limit = if in_vm() { "2000" } else { "200000" };
    let result = (|| {
        for (json, forks) in [(&a, "3"), (&b, "4")] {
            for attempt in 1..=5 {
                let out = run(pipelock()
                    .args([
                        "run",
                        "pipe-herd",
                        "-k",
                        forks,
                        "--limit",
                        limit,
                        "--runs",
                        "3",
                        "-q",
                        "--trace",
                        "--json",
                    ])
                    .arg(json))?;
                ensure!(out.status.success(), "run: {}", text(&out.stderr));
                let result: RunResult = serde_json::from_str(&fs::read_to_string(json)?)?;
                let quiet: Vec<u32> = result
                    .runs
                    .iter()
                    .filter(|run| {
                        run.trace
                            .as_ref()
                            .is_none_or(|t| t.locks.iter().all(|row| row.class.is_none()))
                    })
                    .map(|run| run.run)
                    .collect();
                if quiet.is_empty() {
                    break;
                }
                ensure!(
                    attempt < 5,
                    "runs {quiet:?} of the -k {forks} herd saw no pipe lock in 5 attempts"
                );
                println!("  -k {forks}, attempt {attempt}: runs {quiet:?} saw no pipe lock contended; again");
            }
        }
        let mut checked = 0;
        for json in [&a, &b] {
            let result: RunResult = serde_json::from_str(&fs::read_to_string(json)?)?;
            let trace = result.trace.as_ref().context("no trace")?;
            for what in [Count::Contentions, Count::Acquisitions] {
                let whole = trace_counts(trace, what);
                let parts = per_run_counts(&result, what)?;
                for (class, total) in &whole {
                    let summed = parts.get(class).copied().unwrap_or(0.0);
                    ensure!(
                        (summed - total).abs() <= 0.5 + total * 1e-9,
                        "{class:?}: the runs' {what:?} add up to {summed}, the trace has {total}"
                    );
                    checked += 1;
                }
                ensure!(
                    parts.keys().all(|class| whole.contains_key(class)),
                    "a run has a class the trace lacks: {parts:?} against {whole:?}"
                );
            }
        }
        ensure!(checked > 0, "the herd's trace has no lock class");
        let out = run(pipelock().arg("compare").arg(&a).arg(&b))?;
        let table = text(&out.stdout);
        ensure!(out.status.success(), "compare: {}", text(&out.stderr));
        ensure!(
            table.contains("lock figures, per run")
                && table.contains("95% CI")
                && table.contains("wait p99 (ns)")
                && table.contains("wait p50 (ns)"),
            "{table}"
        );
        println!("  {checked} class counts: the runs' parts add up to the trace");
        Ok(())
    })();
    let _ = (fs::remove_file(&a), fs::remove_file(&b));
    result.map(|()| Outcome::Passed)
}
register!(Kernel run_trace_splits_its_lock_figures_by_run);
