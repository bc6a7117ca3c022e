//! `run --trace` keeps each run's own lock figures, and `compare` judges
//! them across runs.
use std::collections::BTreeMap;

use super::*;

/// Per lock class, the sum of a count over the trace's rows.
fn trace_counts(trace: &serde_json::Value, field: &str) -> BTreeMap<String, f64> {
    let mut sums = BTreeMap::new();
    for row in trace["locks"].as_array().into_iter().flatten() {
        if let (Some(class), Some(n)) = (row["class"].as_str(), row[field].as_f64()) {
            *sums.entry(class.to_owned()).or_default() += n;
        }
    }
    sums
}

/// Per lock class, a per-operation count of each run times its operations,
/// summed over the runs.
fn per_run_counts(result: &serde_json::Value, what: &str) -> Result<BTreeMap<String, f64>> {
    let mut sums = BTreeMap::new();
    for run in result["runs"].as_array().context("no runs")? {
        let ops = run["details"]["operations"]
            .as_f64()
            .context("a run without operations")?;
        let figures = run["lock_figures"]
            .as_object()
            .context("a run without lock figures")?;
        for (metric, value) in figures {
            if let Some((class, _)) = metric.split_once(&format!(" {what} per ")) {
                *sums.entry(class.to_owned()).or_default() += value.as_f64().unwrap_or(0.0) * ops;
            }
        }
    }
    Ok(sums)
}

/// The runs' figures partition the trace: each event of the workload is in
/// exactly one run's part, so the per-run counts add up to the whole
/// trace's, class by class. Then `compare` prints the lock table with each
/// class's percentiles and their interval.
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
        }
        let mut checked = 0;
        for json in [&a, &b] {
            let result: serde_json::Value = serde_json::from_str(&fs::read_to_string(json)?)?;
            for what in ["contentions", "acquisitions"] {
                let whole = trace_counts(&result["trace"], what);
                let parts = per_run_counts(&result, what)?;
                for (class, total) in &whole {
                    let summed = parts.get(class).copied().unwrap_or(0.0);
                    ensure!(
                        (summed - total).abs() <= 0.5 + total * 1e-9,
                        "{class}: the runs' {what} add up to {summed}, the trace has {total}"
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
