//! `pipelock compare A.json B.json`: the before/after table a patch author
//! pastes into a mail, with Welch's t-test on the per-run values.
use std::path::Path;

use super::verdict::{self, Figures};
use crate::{
    Error,
    model::stats::{DEFAULT_DETECT_PERCENT, Summary, welch_t_test},
    workload::report::{self, Report, format_value},
};

/// Significance level for the "significant" column.
pub const ALPHA: f64 = 0.05;

#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub name: String,
    pub a: Summary,
    pub b: Summary,
    pub delta_percent: f64,
    /// Two-sided Welch p-value; None with fewer than two runs a side.
    pub p_value: Option<f64>,
    pub higher_is_better: Option<bool>,
}

/// A compared quantity: its label, whether higher is better (headline only),
/// and how to read it from a run.
type Series = (String, Option<bool>, fn(&report::Run) -> f64);

pub fn rows(a: &Report, b: &Report) -> Result<Vec<Row>, Error> {
    if a.workload != b.workload {
        return Err(Error::Usage(format!(
            "cannot compare {} with {}",
            a.workload, b.workload
        )));
    }
    let series: [Series; 6] = [
        (
            format!("{} ({})", a.metric.name, a.metric.unit),
            Some(a.metric.higher_is_better),
            |r| r.value,
        ),
        ("task-clock (ms)".into(), None, |r| r.counters.task_clock_ms),
        ("context-switches".into(), None, |r| {
            r.counters.context_switches as f64
        }),
        ("cpu-migrations".into(), None, |r| {
            r.counters.cpu_migrations as f64
        }),
        ("page-faults".into(), None, |r| r.counters.page_faults as f64),
        ("nivcsw".into(), None, |r| r.counters.nivcsw as f64),
    ];
    let mut rows = Vec::new();
    for (name, higher_is_better, get) in series {
        let va: Vec<f64> = a.runs.iter().map(get).collect();
        let vb: Vec<f64> = b.runs.iter().map(get).collect();
        let (Some(sa), Some(sb)) = (Summary::of(&va), Summary::of(&vb)) else {
            return Err(Error::Usage("a result file holds no finished run".into()));
        };
        let delta_percent = if sa.mean == 0.0 {
            0.0
        } else {
            100.0 * (sb.mean - sa.mean) / sa.mean
        };
        rows.push(Row {
            name,
            a: sa,
            b: sb,
            delta_percent,
            p_value: welch_t_test(&va, &vb).map(|(_, _, p)| p),
            higher_is_better,
        });
    }
    Ok(rows)
}

pub fn render(a_name: &str, b_name: &str, a: &Report, rows: &[Row]) -> String {
    let mut table = comfy_table::Table::new();
    table
        .load_preset(comfy_table::presets::ASCII_MARKDOWN)
        .set_header(vec![
            "metric".to_owned(),
            format!("A: {a_name} (mean ± sd)"),
            format!("B: {b_name} (mean ± sd)"),
            "delta".to_owned(),
            "p (Welch)".to_owned(),
            "significant".to_owned(),
        ]);
    for row in rows {
        let verdict = match row.p_value {
            None => "n/a (need ≥ 2 runs each)".to_owned(),
            Some(p) if p < ALPHA => match row.higher_is_better {
                Some(higher) if (row.delta_percent > 0.0) == higher => "yes: better".to_owned(),
                Some(_) => "yes: worse".to_owned(),
                None => "yes".to_owned(),
            },
            Some(_) => "no".to_owned(),
        };
        table.add_row(vec![
            row.name.clone(),
            format!("{} ± {}", format_value(row.a.mean), format_value(row.a.stddev)),
            format!("{} ± {}", format_value(row.b.mean), format_value(row.b.stddev)),
            format!("{:+.2} %", row.delta_percent),
            row.p_value.map_or("-".to_owned(), |p| format!("{p:.4}")),
            verdict,
        ]);
    }
    format!(
        "pipelock compare: {} on kernel {} ({} runs) vs {} runs; significant at p < {ALPHA}\n{table}\n",
        a.workload,
        a.system.kernel,
        rows.first().map_or(0, |r| r.a.n),
        rows.first().map_or(0, |r| r.b.n),
    )
}

/// Each run's lock figures (`run --trace`), without the workload's own
/// (the table above has it); None unless every run of the result has them.
fn lock_figures(report: &Report) -> Option<Vec<Figures>> {
    report
        .runs
        .iter()
        .map(|run| {
            let mut figures = run.lock_figures.clone()?;
            figures.retain(|metric, _| !verdict::is_workload_figure(metric));
            Some(figures)
        })
        .collect()
}

/// The lock figures' rows, as `pipelock ab` judges them; None unless both
/// results have them.
pub fn lock_rows(a: &Report, b: &Report) -> Option<Vec<verdict::Row>> {
    Some(verdict::compare(
        &lock_figures(a)?,
        &lock_figures(b)?,
        DEFAULT_DETECT_PERCENT,
    ))
}

/// The lock figures' table, as `pipelock ab` prints it, or why there is
/// none.
pub fn render_locks(a_name: &str, b_name: &str, a: &Report, b: &Report) -> String {
    match lock_rows(a, b) {
        Some(rows) if rows.is_empty() => "lock figures: none that both results have\n".to_owned(),
        Some(rows) => format!(
            "lock figures, per run (each run's own percentiles, compared across runs):\n{}",
            verdict::render(a_name, b_name, &rows, DEFAULT_DETECT_PERCENT)
        ),
        None => "lock figures: not in both results (record each with `pipelock run … --trace --json F`)\n"
            .to_owned(),
    }
}

pub fn compare(a_path: &Path, b_path: &Path) -> Result<String, Error> {
    let (a, b) = (report::load(a_path)?, report::load(b_path)?);
    let rows = rows(&a, &b)?;
    let (a_name, b_name) = (a_path.display().to_string(), b_path.display().to_string());
    let mut text = render(&a_name, &b_name, &a, &rows);
    text.push('\n');
    text.push_str(&render_locks(&a_name, &b_name, &a, &b));
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> Report {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/results/pipe-herd.json");
        report::load(&path).unwrap()
    }

    #[test]
    fn identical_results_show_no_difference() {
        let a = fixture();
        let rows = rows(&a, &a).unwrap();
        assert_eq!(rows[0].name, "wall time (s)");
        assert_eq!(rows[0].delta_percent, 0.0);
        assert!(rows[0].p_value.is_none_or(|p| p > 0.99));
    }

    #[test]
    fn a_faster_herd_is_significantly_better() {
        let a = fixture();
        let mut b = a.clone();
        for (run, factor) in b.runs.iter_mut().zip([0.5, 0.52]) {
            run.value = a.runs[0].value * factor;
        }
        let mut a2 = a.clone();
        a2.runs[1].value = a.runs[0].value * 1.02;
        let rows = rows(&a2, &b).unwrap();
        assert!(rows[0].delta_percent < -40.0);
        assert!(rows[0].p_value.unwrap() < ALPHA);
        let text = render("a", "b", &a2, &rows);
        assert!(text.contains("yes: better"), "{text}");
    }

    /// Results of `run --trace` whose runs have the same mean wait, B's
    /// p99 20 % longer: the lock table marks the p99, not the mean.
    #[test]
    fn a_longer_tail_is_marked_in_p99_and_not_in_the_mean() {
        let with_tail = |p99: f64| {
            let mut report = fixture();
            for (run, noise) in report.runs.iter_mut().zip([0.99, 1.01]) {
                run.lock_figures = Some(Figures::from([
                    ("pipe-herd wall time (s)".to_owned(), 1.0),
                    ("pipe-mutex wait avg (ns)".to_owned(), 500.0 * noise),
                    ("pipe-mutex wait p99 (ns)".to_owned(), p99 * noise),
                ]));
            }
            report
        };
        let (a, b) = (with_tail(4000.0), with_tail(4800.0));
        let rows = lock_rows(&a, &b).unwrap();
        let row = |metric: &str| rows.iter().find(|r| r.metric == metric).unwrap();
        let p99 = row("pipe-mutex wait p99 (ns)");
        assert!(
            p99.significant && (p99.change_percent - 20.0).abs() < 1e-9,
            "{p99:?}"
        );
        assert!(p99.difference.unwrap().ci_low_percent > 0.0, "{p99:?}");
        assert!(!row("pipe-mutex wait avg (ns)").significant);
        // The headline has its own table; it is not repeated here.
        assert!(rows.iter().all(|r| !r.metric.contains("wall time")));
        assert!(lock_rows(&a, &a).unwrap().iter().all(|r| !r.significant));
        assert!(render_locks("a", "b", &a, &b).contains("wait p99 (ns)"));
        assert!(render_locks("a", "b", &fixture(), &b).contains("not in both results"));
    }

    #[test]
    fn different_workloads_do_not_compare() {
        let a = fixture();
        let mut b = a.clone();
        b.workload = "pipe-stream".into();
        assert!(matches!(rows(&a, &b), Err(Error::Usage(_))));
    }
}
