//! `pipelock compare A.json B.json`: the before/after table a patch author
//! pastes into a mail, with Welch's t-test on the per-run values.
use std::path::Path;

use crate::{
    Error,
    workload::{
        report::{self, Report, format_value},
        stats::{Summary, welch_t_test},
    },
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

pub fn compare(a_path: &Path, b_path: &Path) -> Result<String, Error> {
    let (a, b) = (report::load(a_path)?, report::load(b_path)?);
    let rows = rows(&a, &b)?;
    Ok(render(
        &a_path.display().to_string(),
        &b_path.display().to_string(),
        &a,
        &rows,
    ))
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

    #[test]
    fn different_workloads_do_not_compare() {
        let a = fixture();
        let mut b = a.clone();
        b.workload = "pipe-stream".into();
        assert!(matches!(rows(&a, &b), Err(Error::Usage(_))));
    }
}
