//! The judge's rows as text: the comparison table as the kernel test robot
//! prints it (`A mean ± sd%   %change   B mean ± sd%   metric`, `*` where
//! the change is significant), what the runs can tell about the workload's
//! own figure in words, and `compare`'s headline table with Welch's p.
use crate::model::{
    Metric,
    judge::{ALPHA, LowerBound, Row, SMALLEST_CHANGE, Side, Subject},
    stats::{POWER, Summary, format_value},
};

fn value(x: f64) -> String {
    if x.abs() >= 100.0 || x == x.trunc() && x.abs() < 1e15 {
        format!("{x:.0}")
    } else if x.abs() >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.4}")
    }
}

/// The table, kernel-test-robot style, then [`verdicts`].
pub fn table(a_name: &str, b_name: &str, rows: &[Row], detect_percent: f64) -> String {
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
        let spread = |s: &Summary, side: Side| {
            if row.exact && row.lower_bounds.iter().any(|l| l.side == side) {
                "exact†".to_owned()
            } else if row.exact {
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
            spread(&row.a, Side::A),
            format!("{:+.1}%", row.change_percent),
            if row.significant { "*" } else { "" }.to_owned(),
            ci,
            value(row.b.mean),
            spread(&row.b, Side::B),
            detects,
            row.metric.clone(),
        ]);
    }
    let mut text = format!(
        "{table}\n* significant: Welch's two-sided t-test p < {ALPHA} (or both sides without variance and \
         apart), and a change of at least {SMALLEST_CHANGE} %; exact: a count per operation every run gave \
         alike, compared as it is\n95% CI: of the change; detects: the smallest change these runs find \
         (5 % test, {:.0} % power)\n",
        POWER * 100.0
    );
    text.push_str(&lower_bound_notes(rows));
    text.push_str(&verdicts(rows, detect_percent));
    text
}

/// A line per side of a count row with runs whose count is a lower bound:
/// which runs, what they gave, and the skipped runs that allow it.
fn lower_bound_notes(rows: &[Row]) -> String {
    let mut out = String::new();
    for row in rows {
        for side in [Side::A, Side::B] {
            let runs: Vec<&LowerBound> = row.lower_bounds.iter().filter(|l| l.side == side).collect();
            if runs.is_empty() {
                continue;
            }
            let each: Vec<String> = runs
                .iter()
                .map(|l| format!("run {} gave {} with {} skipped", l.run, value(l.value), l.skipped))
                .collect();
            let judged = if row.exact {
                "; judged on the runs that agree"
            } else {
                ""
            };
            out.push_str(&format!(
                "{}{}: {side:?}'s {} (runs of pipelock's programs the kernel skipped on its path, each of which can \
                 lose one event: a lower bound){judged}\n",
                if row.exact { "† " } else { "" },
                row.metric,
                each.join(", ")
            ));
        }
    }
    out
}

/// What the runs can tell about the workload's own figures, in words.
pub fn verdicts(rows: &[Row], detect_percent: f64) -> String {
    let mut out = String::new();
    for row in rows.iter().filter(|r| r.figure.subject == Subject::Workload) {
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

/// `compare`'s first table: the headline and the counters of two results
/// of `workload` (whose headline is `metric`), with Welch's p and whether
/// the change is for the better.
pub fn headline_table(
    (a_name, b_name): (&str, &str),
    (workload, kernel): (&str, &str),
    metric: &Metric,
    rows: &[Row],
) -> String {
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
        let higher_is_better =
            (row.figure.measure == crate::model::judge::Measure::Headline).then_some(metric.higher_is_better);
        let verdict = match row.p_value {
            None if row.a.n < 2 || row.b.n < 2 => "n/a (need ≥ 2 runs each)".to_owned(),
            _ if !row.significant => "no".to_owned(),
            _ => match higher_is_better {
                Some(higher) if (row.change_percent > 0.0) == higher => "yes: better".to_owned(),
                Some(_) => "yes: worse".to_owned(),
                None => "yes".to_owned(),
            },
        };
        table.add_row(vec![
            row.metric.clone(),
            format!("{} ± {}", format_value(row.a.mean), format_value(row.a.stddev)),
            format!("{} ± {}", format_value(row.b.mean), format_value(row.b.stddev)),
            format!("{:+.2} %", row.change_percent),
            row.p_value.map_or("-".to_owned(), |p| format!("{p:.4}")),
            verdict,
        ]);
    }
    format!(
        "pipelock compare: {workload} on kernel {kernel} ({} runs) vs {} runs; significant at p < {ALPHA} \
         and a change of at least {SMALLEST_CHANGE} %\n{table}\n",
        rows.first().map_or(0, |r| r.a.n),
        rows.first().map_or(0, |r| r.b.n),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        LockClass,
        judge::{Figure, Figures, Measure, Names, compare},
    };

    /// A run of `pairs` write+read pairs, the pipe mutex taken `per_pair`
    /// times a pair, with `skipped` runs skipped on its path.
    fn run(per_pair: f64, skipped: u64) -> Figures {
        let class = |measure| Figure {
            subject: Subject::Class(LockClass::PipeMutex),
            measure,
        };
        Figures::from([
            (class(Measure::AcquisitionsPerOperation), per_pair),
            (class(Measure::SkippedOnPath), skipped as f64),
            (
                Figure {
                    subject: Subject::Workload,
                    measure: Measure::Operations,
                },
                10_000.0,
            ),
        ])
    }

    #[test]
    fn a_run_short_by_its_skips_is_named_under_the_table() {
        let names = Names {
            operation: Some("write+read pair".to_owned()),
            ..Names::default()
        };
        let rows = compare(
            &[run(2.0, 0), run(1.99, 140)],
            &[run(2.0, 0), run(2.0, 0)],
            &names,
            5.0,
        );
        let text = table("6.1", "6.1", &rows, 5.0);
        let line = text
            .lines()
            .find(|l| {
                l.trim_end()
                    .ends_with("pipe-mutex acquisitions per write+read pair")
            })
            .unwrap();
        assert!(
            line.contains("exact†") && line.matches("exact").count() == 3,
            "{text}"
        );
        assert!(
            text.contains(
                "† pipe-mutex acquisitions per write+read pair: A's run 2 gave 1.99 with 140 skipped (runs of \
                 pipelock's programs the kernel skipped on its path, each of which can lose one event: a lower \
                 bound); judged on the runs that agree"
            ),
            "{text}"
        );
        let whole = table(
            "6.1",
            "6.1",
            &compare(&[run(2.0, 0)], &[run(2.0, 0)], &names, 5.0),
            5.0,
        );
        assert!(!whole.contains('†'), "{whole}");
    }
}
