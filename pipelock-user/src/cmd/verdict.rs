//! What `pipelock ab` and `pipelock compare` judge: the figures of each
//! run's JSON result (the workload's headline, and per lock class the
//! acquisitions and contentions per operation, wait and hold mean, p50 and
//! p99, what owners did; `run --trace` stores them per run), and the
//! comparison table, as the kernel test robot prints it:
//! `A mean ± sd%   %change   B mean ± sd%   metric`, with Welch's test
//! marking what changed.
use std::collections::BTreeMap;

use pipelock_common::{Histogram, loglinear};
use serde::{Deserialize as _, Serialize};

use crate::model::{
    Timing,
    stats::{Difference, Summary, runs_needed, welch_t_test},
    timing::merge,
};

/// Significance level of the marks in the table.
pub const ALPHA: f64 = 0.05;
/// Changes smaller than this (%) are not marked, however consistent: a
/// count of 2.00001 against 2.00002 per operation is no change.
pub const SMALLEST_CHANGE: f64 = 0.5;

/// One run's figures, by metric name.
pub type Figures = BTreeMap<String, f64>;

fn u(value: &serde_json::Value) -> f64 {
    value.as_f64().unwrap_or(0.0)
}

/// A class's timings (wait or hold) merged over its rows.
struct Merged(Box<Histogram<u64>>);

impl Default for Merged {
    fn default() -> Self {
        Self(Box::new(Histogram::EMPTY))
    }
}

impl Merged {
    fn add(&mut self, timing: &serde_json::Value) {
        if let Ok(timing) = Timing::deserialize(timing) {
            merge(&mut self.0, &timing.to_hist());
        }
    }

    fn figures(&self, class: &str, what: &str, into: &mut Figures) {
        let hist = &self.0;
        if hist.count == 0 {
            return;
        }
        into.insert(
            format!("{class} {what} avg (ns)"),
            hist.total_ns as f64 / hist.count as f64,
        );
        percentiles(hist, &format!("{class} {what}"), into);
    }
}

/// The p50 and p99 of a histogram as `{label} p50 (ns)` and `{label} p99
/// (ns)`: each run gives one, and the runs of a kernel are compared like
/// any other figure (Welch's interval over the per-run values), so a
/// change in the tail is marked only when its interval excludes zero.
fn percentiles(hist: &Histogram<u64>, label: &str, into: &mut Figures) {
    for (q, name) in [(0.5, "p50"), (0.99, "p99")] {
        if let Some(p) = loglinear::percentile(&hist.buckets, hist.max_ns, q) {
            into.insert(format!("{label} {name} (ns)"), p.ns);
        }
    }
}

/// The figures of one run's result: a `pipelock run --json` report (with
/// its `--trace`), or a `pipelock trace --json` report.
pub fn figures(result: &serde_json::Value) -> Result<Figures, String> {
    let mut out = Figures::new();
    let mut per_op: Option<(f64, String)> = None;
    let trace = if let Some(workload) = result["workload"].as_str() {
        let runs = result["runs"]
            .as_array()
            .filter(|r| !r.is_empty())
            .ok_or("a result with no run")?;
        let metric = &result["metric"];
        let mean = runs.iter().map(|r| u(&r["value"])).sum::<f64>() / runs.len() as f64;
        out.insert(
            format!(
                "{workload} {} ({})",
                metric["name"].as_str().unwrap_or("value"),
                metric["unit"].as_str().unwrap_or("")
            ),
            mean,
        );
        let ops: f64 = runs.iter().map(|r| u(&r["details"]["operations"])).sum();
        if ops > 0.0 {
            let what = runs[0]["details"]["operation"]
                .as_str()
                .unwrap_or("operation")
                .to_owned();
            per_op = Some((ops, what));
        }
        &result["trace"]
    } else {
        result
    };
    let Some(locks) = trace["locks"].as_array() else {
        return Ok(out);
    };
    let mut classes: BTreeMap<String, Vec<&serde_json::Value>> = BTreeMap::new();
    for row in locks {
        if let Some(class) = row["class"].as_str() {
            classes.entry(class.to_owned()).or_default().push(row);
        }
    }
    for (class, rows) in &classes {
        let sum = |field: &str| rows.iter().map(|r| u(&r[field])).sum::<f64>();
        let hooked = rows.iter().any(|r| !r["acquisitions"].is_null());
        match &per_op {
            Some((ops, what)) => {
                if hooked {
                    out.insert(
                        format!("{class} acquisitions per {what}"),
                        sum("acquisitions") / ops,
                    );
                }
                out.insert(
                    format!("{class} contentions per {what}"),
                    sum("contentions") / ops,
                );
            }
            None => {
                if hooked {
                    out.insert(format!("{class} acquisitions"), sum("acquisitions"));
                }
                out.insert(format!("{class} contentions"), sum("contentions"));
            }
        }
        let (mut wait, mut hold) = (Merged::default(), Merged::default());
        for row in rows {
            wait.add(&row["wait"]);
            hold.add(&row["hold"]);
        }
        wait.figures(class, "wait", &mut out);
        hold.figures(class, "hold", &mut out);
        // The class's lock with the most wait: a run's pipe is a new one
        // each time, so it is known by its rank, not its name.
        let busiest = rows
            .iter()
            .filter_map(|r| Timing::deserialize(&r["wait"]).ok())
            .max_by_key(|t| t.total_ns);
        if rows.len() > 1
            && let Some(timing) = busiest
        {
            percentiles(&timing.to_hist(), &format!("{class} busiest lock wait"), &mut out);
        }
        let states = ["holder_on_cpu_ns", "holder_runnable_ns", "holder_sleeping_ns"].map(sum);
        let split: f64 = states.iter().sum();
        if split > 0.0 {
            for (name, ns) in ["on-CPU", "runnable", "sleeping"].iter().zip(states) {
                out.insert(format!("{class} owners {name} (% of wait)"), 100.0 * ns / split);
            }
        }
    }
    Ok(out)
}

#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub metric: String,
    pub a: Summary,
    pub b: Summary,
    pub change_percent: f64,
    /// Two-sided Welch p; None where it is undefined (a side without
    /// variance, or fewer than two runs).
    pub p_value: Option<f64>,
    /// p < 0.05, or both sides without variance and different.
    pub significant: bool,
    /// A count per operation that every run of each side gave alike (to
    /// two decimals): compared as numbers, not as means with noise.
    pub exact: bool,
    /// The change's confidence interval and the smallest change these
    /// runs detect; None for exact rows and with fewer than two runs.
    pub difference: Option<Difference>,
    /// Runs per kernel that would detect the change asked about
    /// (`--detect`), when these runs cannot.
    pub runs_needed: Option<usize>,
}

/// Whether a metric counts events per operation of the workload.
fn is_count_per_operation(metric: &str) -> bool {
    (metric.contains(" acquisitions per ") || metric.contains(" contentions per ")) && !metric.contains("(ns")
}

/// Every value the same to two decimals.
fn alike(values: &[f64]) -> bool {
    let rounded = |v: f64| (v * 100.0).round();
    values.iter().all(|v| rounded(*v) == rounded(values[0]))
}

/// Whether a metric is the workload's own figure rather than a lock's.
pub fn is_workload_figure(metric: &str) -> bool {
    crate::workload::WorkloadName::ALL
        .iter()
        .any(|w| metric.starts_with(&format!("{} ", w.name())))
}

/// One row per metric every run of both sides has; the workload's own
/// figure first, then the lock classes in order.
pub fn compare(a: &[Figures], b: &[Figures], detect_percent: f64) -> Vec<Row> {
    let Some(first) = a.first() else {
        return Vec::new();
    };
    let mut metrics: Vec<&String> = first.keys().collect();
    metrics.sort_by_key(|m| (!is_workload_figure(m), (*m).clone()));
    metrics
        .into_iter()
        .filter(|metric| a.iter().chain(b).all(|run| run.contains_key(*metric)))
        .filter_map(|metric| {
            let va: Vec<f64> = a.iter().map(|run| run[metric]).collect();
            let vb: Vec<f64> = b.iter().map(|run| run[metric]).collect();
            let (sa, sb) = (Summary::of(&va)?, Summary::of(&vb)?);
            let p_value = welch_t_test(&va, &vb).map(|(_, _, p)| p);
            let constant_and_different =
                sa.n >= 2 && sb.n >= 2 && sa.stddev == 0.0 && sb.stddev == 0.0 && sa.mean != sb.mean;
            let change_percent = if sa.mean == 0.0 {
                0.0
            } else {
                100.0 * (sb.mean - sa.mean) / sa.mean
            };
            let exact = is_count_per_operation(metric) && alike(&va) && alike(&vb);
            let significant = if exact {
                (sa.mean * 100.0).round() != (sb.mean * 100.0).round()
            } else {
                (p_value.is_some_and(|p| p < ALPHA) || constant_and_different)
                    && (change_percent.abs() >= SMALLEST_CHANGE || sa.mean == 0.0 && sb.mean != 0.0)
            };
            let difference = (!exact).then(|| Difference::of(&sa, &sb)).flatten();
            let runs_needed = difference
                .filter(|d| d.detectable_percent > detect_percent)
                .and_then(|_| runs_needed(&sa, &sb, detect_percent));
            Some(Row {
                metric: metric.clone(),
                change_percent,
                significant,
                exact,
                difference,
                runs_needed,
                p_value,
                a: sa,
                b: sb,
            })
        })
        .collect()
}

fn value(x: f64) -> String {
    if x.abs() >= 100.0 || x == x.trunc() && x.abs() < 1e15 {
        format!("{x:.0}")
    } else if x.abs() >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.4}")
    }
}

/// The table, kernel-test-robot style: `*` marks a significant change.
pub fn render(a_name: &str, b_name: &str, rows: &[Row], detect_percent: f64) -> String {
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::NOTHING).set_header(vec![
        format!("{a_name} (A)"),
        String::new(),
        "%change".to_owned(),
        String::new(),
        "95% CI".to_owned(),
        format!("{b_name} (B)"),
        String::new(),
        "detects".to_owned(),
        "metric".to_owned(),
    ]);
    for row in rows {
        let spread = |s: &Summary| {
            if row.exact {
                "exact".to_owned()
            } else {
                format!("± {:.1}%", s.cv_percent())
            }
        };
        let (ci, detects) = match (&row.difference, row.exact) {
            (_, true) => ("exact".to_owned(), String::new()),
            (Some(d), false) => (
                format!("{:+.1}% … {:+.1}%", d.ci_low_percent, d.ci_high_percent),
                format!("±{:.1}%", d.detectable_percent),
            ),
            (None, false) => ("—".to_owned(), "—".to_owned()),
        };
        table.add_row(vec![
            value(row.a.mean),
            spread(&row.a),
            format!("{:+.1}%", row.change_percent),
            if row.significant { "*" } else { "" }.to_owned(),
            ci,
            value(row.b.mean),
            spread(&row.b),
            detects,
            row.metric.clone(),
        ]);
    }
    let mut text = format!(
        "{table}\n* significant: Welch's two-sided t-test p < {ALPHA} (or both sides without variance and \
         apart), and a change of at least {SMALLEST_CHANGE} %; exact: a count per operation every run gave \
         alike, compared as it is\n95% CI: of the change; detects: the smallest change these runs find \
         (5 % test, {:.0} % power)\n",
        crate::model::stats::POWER * 100.0
    );
    text.push_str(&verdicts(rows, detect_percent));
    text
}

/// What the runs can tell about the workload's own figures, in words.
pub fn verdicts(rows: &[Row], detect_percent: f64) -> String {
    let mut out = String::new();
    for row in rows.iter().filter(|r| is_workload_figure(&r.metric)) {
        let line = match &row.difference {
            None => format!(
                "{}: {:+.1}% from one run per kernel: no interval (--runs 3 or more)",
                row.metric, row.change_percent
            ),
            Some(d) => {
                let mut line = format!(
                    "{}: {:+.1}% (95% CI {:+.1}% … {:+.1}%); these runs detect changes of ±{:.1}% or more",
                    row.metric, d.change_percent, d.ci_low_percent, d.ci_high_percent, d.detectable_percent
                );
                if d.detectable_percent > detect_percent {
                    line.push_str(&match row.runs_needed {
                        Some(n) => format!("; a {detect_percent}% change needs {n} runs per kernel"),
                        None => format!("; no number of runs up to 10000 detects a {detect_percent}% change"),
                    });
                }
                line
            }
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A `pipelock run pipe-throughput --trace` result: `pairs` loops, the
    /// pipe mutex taken twice per loop, `rd_wait.lock` `rd` times.
    fn run(pairs: u64, rd: u64, lps: f64) -> serde_json::Value {
        json!({
            "workload": "pipe-throughput",
            "metric": {"name": "throughput", "unit": "lps", "higher_is_better": true},
            "runs": [{"value": lps, "details": {"operations": pairs, "operation": "write+read pair"}}],
            "trace": {"locks": [
                {"class": "pipe-mutex", "acquisitions": 2 * pairs, "contentions": 0,
                 "wait": {"count": 2 * pairs, "total_ns": 0, "avg_ns": 0, "p50_ns": 0, "p99_ns": 0,
                          "max_ns": 0, "buckets": [[0, 2 * pairs]]},
                 "hold": {"count": 2 * pairs, "total_ns": 2000 * pairs, "avg_ns": 1000, "p50_ns": 992,
                          "p99_ns": 992, "max_ns": 1020, "buckets": [[960, 2 * pairs]]}},
                {"class": "pipe-rd-wait", "acquisitions": rd * pairs, "contentions": 1,
                 "wait": null, "hold": null}
            ]}
        })
    }

    #[test]
    fn per_operation_counts_come_from_the_trace_and_the_workload() {
        let f = figures(&run(1000, 3, 5e5)).unwrap();
        assert_eq!(f["pipe-throughput throughput (lps)"], 5e5);
        assert_eq!(f["pipe-mutex acquisitions per write+read pair"], 2.0);
        assert_eq!(f["pipe-rd-wait acquisitions per write+read pair"], 3.0);
        assert_eq!(f["pipe-mutex hold avg (ns)"], 1000.0);
        // The midpoint of the bucket 960..1023 ns.
        assert_eq!(f["pipe-mutex hold p99 (ns)"], 991.5);
        assert!(!f.contains_key("pipe-rd-wait wait avg (ns)"));
        assert!(figures(&json!({"workload": "x", "runs": []})).is_err());
    }

    /// A run whose pipe-mutex waits are `body` ns but for a 2 % tail of
    /// `tail` ns, all scaled by `scale` (the runs' spread).
    fn waits(body: u64, tail: u64, scale: f64) -> Figures {
        let values: Vec<u64> = (0..1000)
            .map(|i| if i < 980 { body } else { tail })
            .map(|v| (v as f64 * scale) as u64)
            .collect();
        let timing = Timing::from_hist(&crate::model::fixtures::hist(&values));
        figures(&json!({"locks": [{"class": "pipe-mutex", "contentions": 1000, "wait": timing}]})).unwrap()
    }

    /// Two kernels with the same mean wait, one with a 20 % longer tail:
    /// the p99 is marked changed, the mean is not; a kernel against itself
    /// changes nothing.
    #[test]
    fn a_longer_tail_with_the_same_mean_is_a_change_in_p99_only() {
        let scales = [0.97, 0.985, 1.0, 1.015, 1.03];
        // 980 × 2000 + 20 × 50 000 = 980 × 1796 + 20 × 60 000 (+ 80): equal means.
        let a: Vec<Figures> = scales.iter().map(|&s| waits(2000, 50_000, s)).collect();
        let b: Vec<Figures> = scales.iter().map(|&s| waits(1796, 60_000, s)).collect();
        let rows = compare(&a, &b, 5.0);
        let row = |m: &str| {
            rows.iter()
                .find(|r| r.metric == m)
                .unwrap_or_else(|| panic!("{m}: {rows:?}"))
        };
        let mean = row("pipe-mutex wait avg (ns)");
        assert!(mean.change_percent.abs() < 0.1 && !mean.significant, "{mean:?}");
        let p99 = row("pipe-mutex wait p99 (ns)");
        assert!(p99.significant, "{p99:?}");
        let d = p99.difference.unwrap();
        assert!((d.change_percent - 20.0).abs() < 6.25 * 2.0, "{d:?}");
        assert!(d.ci_low_percent > 0.0, "the interval excludes zero: {d:?}");
        assert!(
            compare(&a, &a, 5.0)
                .iter()
                .all(|r| !r.significant && r.change_percent == 0.0)
        );
    }

    #[test]
    fn the_busiest_lock_of_a_class_gets_its_own_percentiles() {
        let timing = |ns: &[u64]| Timing::from_hist(&crate::model::fixtures::hist(ns));
        let f = figures(&json!({"locks": [
            {"class": "pipe-mutex", "contentions": 2, "wait": timing(&[100, 100])},
            {"class": "pipe-mutex", "contentions": 2, "wait": timing(&[5000, 5000])},
        ]}))
        .unwrap();
        // The midpoints of the buckets 4608..5119 and 96..103 ns.
        assert_eq!(f["pipe-mutex busiest lock wait p50 (ns)"], 4863.5);
        assert_eq!(f["pipe-mutex wait p50 (ns)"], 99.5);
    }

    #[test]
    fn a_count_that_moves_from_three_to_one_is_a_significant_change() {
        let a: Vec<Figures> = [(1000, 4.9e5), (1200, 5.1e5), (900, 5e5)]
            .iter()
            .map(|(n, lps)| figures(&run(*n, 3, *lps)).unwrap())
            .collect();
        let b: Vec<Figures> = [(1100, 5.0e5), (1000, 5.2e5), (950, 4.8e5)]
            .iter()
            .map(|(n, lps)| figures(&run(*n, 1, *lps)).unwrap())
            .collect();
        let rows = compare(&a, &b, 5.0);
        let row = |m: &str| rows.iter().find(|r| r.metric == m).unwrap();
        let rd = row("pipe-rd-wait acquisitions per write+read pair");
        assert_eq!((rd.a.mean, rd.b.mean), (3.0, 1.0));
        assert!(
            rd.significant && rd.exact && rd.difference.is_none(),
            "exact on each side, apart: {rd:?}"
        );
        assert!((rd.change_percent + 66.67).abs() < 0.01);
        let mutex = row("pipe-mutex acquisitions per write+read pair");
        assert!(!mutex.significant, "2 and 2");
        // Consistently apart by a hair: not marked.
        let hair = compare(
            &[1.0, 1.0001, 1.0002].map(|v| Figures::from([("x".to_owned(), v)])),
            &[1.001, 1.0011, 1.0012].map(|v| Figures::from([("x".to_owned(), v)])),
            5.0,
        );
        assert!(!hair[0].significant, "{hair:?}");
        let lps = row("pipe-throughput throughput (lps)");
        assert!(!lps.significant, "{lps:?}");
        assert!(lps.difference.is_some() && !lps.exact);
        let text = render("6.1", "6.18", &rows, 5.0);
        assert!(
            text.lines()
                .any(|l| l.starts_with("pipe-throughput throughput (lps): ") && l.contains("95% CI")),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.contains("exact") && l.contains("pipe-rd-wait acquisitions")),
            "{text}"
        );
        assert!(text.contains("-66.7%"), "{text}");
        assert!(
            text.lines()
                .any(|l| l.contains('*') && l.contains("pipe-rd-wait acquisitions")),
            "{text}"
        );
    }
}
