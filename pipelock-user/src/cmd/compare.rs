//! `pipelock compare A.json B.json`: the before/after table a patch author
//! pastes into a mail: the headline and counters of two `run --json`
//! results, then (with `run --trace`) each lock figure judged across runs,
//! as `pipelock ab` judges them.
use std::path::Path;

use crate::{
    Error,
    model::{
        judge::{self, Figures, Names, Row},
        stats::DEFAULT_DETECT_PERCENT,
    },
    render::judge::{headline_table, table},
    workload::report::{self, Report},
};

/// The headline's and the counters' rows.
pub fn rows(a: &Report, b: &Report) -> Result<Vec<Row>, Error> {
    if a.workload != b.workload {
        return Err(Error::Usage(format!(
            "cannot compare {} with {}",
            a.workload, b.workload
        )));
    }
    if a.runs.is_empty() || b.runs.is_empty() {
        return Err(Error::Usage("a result file holds no finished run".into()));
    }
    let figures = |r: &Report| -> Vec<Figures> { r.runs.iter().map(judge::run_figures).collect() };
    Ok(judge::compare(
        &figures(a),
        &figures(b),
        &names(a, false),
        DEFAULT_DETECT_PERCENT,
    ))
}

/// What `a`'s figures are called; `compare`'s first table is of one
/// workload, so its headline goes without the workload's name.
fn names(a: &Report, with_workload: bool) -> Names {
    Names {
        workload: with_workload.then(|| a.workload.clone()),
        ..Names::of_run(a)
    }
}

/// The lock figures' rows, as `pipelock ab` judges them; None unless every
/// run of both results has its trace (`run --trace`).
pub fn lock_rows(a: &Report, b: &Report) -> Option<Vec<Row>> {
    let figures =
        |r: &Report| -> Option<Vec<Figures>> { r.runs.iter().map(judge::run_lock_figures).collect() };
    Some(judge::compare(
        &figures(a)?,
        &figures(b)?,
        &names(a, true),
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
            table(a_name, b_name, &rows, DEFAULT_DETECT_PERCENT)
        ),
        None => "lock figures: not in both results (record each with `pipelock run … --trace --json F`)\n"
            .to_owned(),
    }
}

pub fn compare(a_path: &Path, b_path: &Path) -> Result<String, Error> {
    let (a, b) = (report::load(a_path)?, report::load(b_path)?);
    let rows = rows(&a, &b)?;
    let (a_name, b_name) = (a_path.display().to_string(), b_path.display().to_string());
    let mut text = headline_table(
        (&a_name, &b_name),
        (&a.workload, &a.system.kernel),
        &a.metric,
        &rows,
    );
    text.push('\n');
    text.push_str(&render_locks(&a_name, &b_name, &a, &b));
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        LockClass, TraceReport,
        fixtures::{hist, row},
        judge::{Figure, Measure, Statistic, Subject},
    };

    fn fixture() -> Report {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/results/pipe-herd.json");
        report::load(&path).unwrap()
    }

    #[test]
    fn identical_results_show_no_difference() {
        let a = fixture();
        let rows = rows(&a, &a).unwrap();
        assert_eq!(rows[0].metric, "wall time (s)");
        assert_eq!(rows[0].change_percent, 0.0);
        assert!(rows[0].p_value.is_none_or(|p| p > 0.99));
        assert!(rows.iter().all(|r| !r.significant));
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
        assert!(rows[0].change_percent < -40.0);
        assert!(rows[0].p_value.unwrap() < judge::ALPHA);
        let text = headline_table(("a", "b"), ("pipe-herd", "6.18"), &a2.metric, &rows);
        assert!(text.contains("yes: better"), "{text}");
    }

    /// Results of `run --trace` whose runs have the same mean wait, B's
    /// p99 about 20 % longer: the lock table marks the p99, not the mean.
    #[test]
    fn a_longer_tail_is_marked_in_p99_and_not_in_the_mean() {
        let with_tail = |tail: u64| {
            let mut report = fixture();
            for (run, noise) in report.runs.iter_mut().zip([0.99, 1.01]) {
                // 98 waits of 500 ns, 2 of `tail`; the mean differs by 1.6 %.
                let waits: Vec<u64> = (0..100)
                    .map(|i| if i < 98 { 500 } else { tail })
                    .map(|ns| (ns as f64 * noise) as u64)
                    .collect();
                let timing = crate::model::Timing::from_hist(&hist(&waits));
                run.trace = Some(TraceReport {
                    locks: vec![row(LockClass::PipeMutex, None, 100, timing, None)],
                    ..TraceReport::empty()
                });
            }
            report
        };
        let (a, b) = (with_tail(4000), with_tail(4800));
        let rows = lock_rows(&a, &b).unwrap();
        let row = |measure: Measure| {
            let figure = Figure {
                subject: Subject::Class(LockClass::PipeMutex),
                measure,
            };
            rows.iter().find(|r| r.figure == figure).unwrap()
        };
        let p99 = row(Measure::Wait(Statistic::P99));
        assert!(p99.significant && p99.change_percent > 15.0, "{p99:?}");
        assert!(p99.difference.unwrap().ci_low_percent > 0.0, "{p99:?}");
        assert!(!row(Measure::Wait(Statistic::P50)).significant);
        // The headline has its own table; it is not repeated here.
        assert!(rows.iter().all(|r| r.figure.subject != Subject::Workload));
        assert!(lock_rows(&a, &a).unwrap().iter().all(|r| !r.significant));
        assert!(render_locks("a", "b", &a, &b).contains("pipe-mutex wait p99 (ns)"));
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
