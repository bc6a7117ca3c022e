//! Counts per operation as the judge compares them: alike in every run,
//! they are exact; a run short of the others by no more events than the
//! kernel skipped on its class's path is a lower bound, not a different
//! count.
use serde::{Deserialize, Serialize};

use super::{Figure, Figures, Measure, Subject};

/// Every value the same to two decimals.
fn alike(values: &[f64]) -> bool {
    let rounded = |v: f64| (v * 100.0).round();
    values.iter().all(|v| rounded(*v) == rounded(values[0]))
}

/// Kernel A or B.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Side {
    A,
    B,
}

/// A run whose count per operation is a lower bound: the kernel skipped
/// runs of pipelock's programs on its class's path, each of which can
/// lose one event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LowerBound {
    pub side: Side,
    /// 1-based, in the order of the side's runs.
    pub run: usize,
    pub value: f64,
    /// The runs skipped on the path in that run.
    pub skipped: u64,
}

/// The runs of the path of `figure`'s class that `run` skipped.
fn skipped_in(run: &Figures, figure: Figure) -> u64 {
    match figure.subject {
        Subject::Class(class) => run
            .get(&Figure::class(class, Measure::SkippedOnPath))
            .map_or(0, |&n| n as u64),
        Subject::Workload => 0,
    }
}

/// A side's runs of a count per operation, as lower bounds where their
/// path skipped runs: the value every run gave alike; or, where they
/// differ, the value every run that skipped none gave alike (with those
/// that skipped some but agree), and the runs that fell short of it by no
/// more events than they skipped. None where the runs disagree otherwise,
/// or where every run that differs skipped: then the count is judged like
/// any noisy figure.
pub(super) fn exact_count(
    side: Side,
    runs: &[Figures],
    figure: Figure,
) -> Option<(Vec<f64>, Vec<LowerBound>)> {
    let rounded = |v: f64| (v * 100.0).round();
    // Alike, they lost nothing worth a hundredth per operation, skips or
    // not: losses would differ from run to run. A lone run that skipped
    // has nothing to agree with: it is a lower bound.
    let all: Vec<f64> = runs.iter().map(|run| run[&figure]).collect();
    let lone_skipping = all.len() == 1 && skipped_in(&runs[0], figure) > 0;
    if !all.is_empty() && alike(&all) && !lone_skipping {
        return Some((all, Vec::new()));
    }
    let (whole, skipping): (Vec<_>, Vec<_>) = runs
        .iter()
        .enumerate()
        .map(|(i, run)| (i, run[&figure], skipped_in(run, figure), run))
        .partition(|(_, _, skipped, _)| *skipped == 0);
    let mut exact: Vec<f64> = whole.iter().map(|(_, v, _, _)| *v).collect();
    if exact.is_empty() || !alike(&exact) {
        return None;
    }
    let least = exact.iter().copied().fold(f64::INFINITY, f64::min);
    let mut short = Vec::new();
    for (i, value, skipped, run) in skipping {
        if rounded(value) == rounded(exact[0]) {
            exact.push(value);
            continue;
        }
        let operations = run
            .get(&Figure::workload(Measure::Operations))
            .copied()
            .unwrap_or(1.0);
        let lost = (least - value) * operations;
        if value > least || lost > skipped as f64 + 0.5 {
            return None;
        }
        short.push(LowerBound {
            side,
            run: i + 1,
            value,
            skipped,
        });
    }
    Some((exact, short))
}

/// Every run of a side whose path skipped runs, as a lower bound.
pub(super) fn lower_bounds(side: Side, runs: &[Figures], figure: Figure) -> Vec<LowerBound> {
    runs.iter()
        .enumerate()
        .filter_map(|(i, run)| {
            let skipped = skipped_in(run, figure);
            (skipped > 0).then(|| LowerBound {
                side,
                run: i + 1,
                value: run[&figure],
                skipped,
            })
        })
        .collect()
}
