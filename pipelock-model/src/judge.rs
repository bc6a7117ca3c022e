//! The judge of two sets of runs, A and B: what `ab` and `compare` print.
//! Each run gives its figures (the workload's headline and counters, and
//! per lock class the acquisitions and contentions per operation, wait and
//! hold mean, p50 and p99, what owners did), each keyed by what it
//! measures; the judge compares every figure both sides have with one
//! statistics path: Welch's test and interval over the per-run values,
//! counts per operation every run gave alike compared as they are, and the
//! runs needed to detect a change these runs cannot.
use std::collections::BTreeMap;

use pipelock_common::{Histogram, loglinear};
use serde::{Deserialize, Serialize};

use crate::{
    CommandResult, Counters, LockClass, Metric, Run, RunResult, Timing, TraceReport, skips,
    stats::{Difference, Summary, runs_needed, welch_t_test},
    timing::merge,
};

/// Significance level of the marks in the table.
pub const ALPHA: f64 = 0.05;
/// Changes smaller than this (%) are not marked, however consistent: a
/// count of 2.00001 against 2.00002 per operation is no change.
pub const SMALLEST_CHANGE: f64 = 0.5;

/// Whose figure it is: the workload's own, or a lock class's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Subject {
    Workload,
    Class(LockClass),
}

/// A statistic of a class's waits or holds, merged over its locks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Statistic {
    Mean,
    P50,
    P99,
}

impl Statistic {
    fn name(self) -> &'static str {
        match self {
            Self::Mean => "avg",
            Self::P50 => "p50",
            Self::P99 => "p99",
        }
    }
}

/// Where the owners of a class's locks were while others waited for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OwnerState {
    OnCpu,
    Runnable,
    Sleeping,
}

impl OwnerState {
    const ALL: [Self; 3] = [Self::OnCpu, Self::Runnable, Self::Sleeping];

    fn name(self) -> &'static str {
        match self {
            Self::OnCpu => "on-CPU",
            Self::Runnable => "runnable",
            Self::Sleeping => "sleeping",
        }
    }
}

/// What a figure measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Measure {
    /// The workload's own metric (its [`Metric`]).
    Headline,
    TaskClockMs,
    ContextSwitches,
    CpuMigrations,
    PageFaults,
    Nivcsw,
    /// Counts per operation of the workload, when it counts them.
    AcquisitionsPerOperation,
    ContentionsPerOperation,
    /// Counts of the whole run, when there are no operations to divide by.
    Acquisitions,
    Contentions,
    Wait(Statistic),
    Hold(Statistic),
    /// The class's lock with the most wait: a run's pipe is a new one each
    /// time, so it is known by its rank, not its name.
    BusiestLockWait(Statistic),
    /// % of the wait whose owner was watched.
    OwnersShare(OwnerState),
    /// The workload's operations in the run: with [`Self::SkippedOnPath`],
    /// how far a count per operation may fall short. Not a row.
    Operations,
    /// Runs of pipelock's programs the kernel skipped on the class's path
    /// ([`crate::skips`]): each can lose one of its events, so a run that
    /// skipped some gives a count that is a lower bound. Not a row.
    SkippedOnPath,
}

impl Measure {
    /// Counts events per operation: alike in every run, they are compared
    /// as numbers, not as means with noise.
    pub fn is_count_per_operation(self) -> bool {
        matches!(
            self,
            Self::AcquisitionsPerOperation | Self::ContentionsPerOperation
        )
    }

    /// What the judge reads to weigh other figures, not a row of its own.
    pub fn is_shown(self) -> bool {
        !matches!(self, Self::Operations | Self::SkippedOnPath)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Figure {
    pub subject: Subject,
    pub measure: Measure,
}

impl Figure {
    fn class(class: LockClass, measure: Measure) -> Self {
        Self {
            subject: Subject::Class(class),
            measure,
        }
    }

    fn workload(measure: Measure) -> Self {
        Self {
            subject: Subject::Workload,
            measure,
        }
    }

    /// Its name in tables and prose: e.g. "pipe-mutex wait p99 (ns)",
    /// "pipe-rd-wait acquisitions per write+read pair".
    pub fn label(&self, names: &Names) -> String {
        let operation = names.operation.as_deref().unwrap_or("operation");
        let what = match self.measure {
            Measure::Headline => match &names.metric {
                Some(m) => format!("{} ({})", m.name, m.unit),
                None => "value".to_owned(),
            },
            Measure::TaskClockMs => "task-clock (ms)".to_owned(),
            Measure::ContextSwitches => "context-switches".to_owned(),
            Measure::CpuMigrations => "cpu-migrations".to_owned(),
            Measure::PageFaults => "page-faults".to_owned(),
            Measure::Nivcsw => "nivcsw".to_owned(),
            Measure::AcquisitionsPerOperation => format!("acquisitions per {operation}"),
            Measure::ContentionsPerOperation => format!("contentions per {operation}"),
            Measure::Acquisitions => "acquisitions".to_owned(),
            Measure::Contentions => "contentions".to_owned(),
            Measure::Wait(s) => format!("wait {} (ns)", s.name()),
            Measure::Hold(s) => format!("hold {} (ns)", s.name()),
            Measure::BusiestLockWait(s) => format!("busiest lock wait {} (ns)", s.name()),
            Measure::OwnersShare(state) => format!("owners {} (% of wait)", state.name()),
            Measure::Operations => format!("{operation}s"),
            Measure::SkippedOnPath => "runs of pipelock's programs skipped on its path".to_owned(),
        };
        let whose = match self.subject {
            Subject::Class(class) => Some(class.name()),
            Subject::Workload if self.measure == Measure::Headline => names.workload.as_deref(),
            Subject::Workload => None,
        };
        match whose {
            Some(whose) => format!("{whose} {what}"),
            None => what,
        }
    }
}

/// What figures are named after: the workload, its metric and its
/// operation, as the first run of A says.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Names {
    /// None where the table is of one workload already (`compare`'s).
    pub workload: Option<String>,
    pub metric: Option<Metric>,
    pub operation: Option<String>,
}

impl Names {
    pub fn of(result: &CommandResult) -> Self {
        match result {
            CommandResult::Run(run) => Self::of_run(run),
            CommandResult::Trace(_) => Self::default(),
        }
    }

    pub fn of_run(run: &RunResult) -> Self {
        Self {
            workload: Some(run.workload.clone()),
            metric: Some(run.metric.clone()),
            operation: run
                .runs
                .iter()
                .find_map(|r| r.operations.as_ref().map(|o| o.name.clone())),
        }
    }
}

/// One run's figures.
pub type Figures = BTreeMap<Figure, f64>;

/// The figures of one command's result, as `ab` judges a boot: a workload
/// result's headline (the mean over its runs) and its whole trace's lock
/// figures per operation, or a trace report's lock figures.
pub fn figures(result: &CommandResult) -> Result<Figures, String> {
    match result {
        CommandResult::Run(run) => {
            if run.runs.is_empty() {
                return Err("a result with no run".to_owned());
            }
            let mean = run.values().iter().sum::<f64>() / run.runs.len() as f64;
            let operations: u64 = run
                .runs
                .iter()
                .filter_map(|r| r.operations.as_ref().map(|o| o.count))
                .sum();
            let mut out = run.trace.as_ref().map_or_else(Figures::new, |trace| {
                lock_figures(trace, (operations > 0).then_some(operations))
            });
            out.insert(Figure::workload(Measure::Headline), mean);
            Ok(out)
        }
        CommandResult::Trace(trace) => Ok(lock_figures(trace, None)),
    }
}

/// One run's own figures: its headline and counters.
pub fn run_figures(run: &Run) -> Figures {
    let Counters {
        task_clock_ms,
        context_switches,
        cpu_migrations,
        page_faults,
        nivcsw,
        ..
    } = run.counters;
    [
        (Measure::Headline, run.value),
        (Measure::TaskClockMs, task_clock_ms),
        (Measure::ContextSwitches, context_switches as f64),
        (Measure::CpuMigrations, cpu_migrations as f64),
        (Measure::PageFaults, page_faults as f64),
        (Measure::Nivcsw, nivcsw as f64),
    ]
    .into_iter()
    .map(|(measure, value)| (Figure::workload(measure), value))
    .collect()
}

/// One run's lock figures (`run --trace`), None without its trace.
pub fn run_lock_figures(run: &Run) -> Option<Figures> {
    let operations = run.operations.as_ref().map(|o| o.count).filter(|&n| n > 0);
    Some(lock_figures(run.trace.as_ref()?, operations))
}

/// The p50 and p99 of a histogram under `measure`: each run gives one, and
/// the runs of a kernel are compared like any other figure (Welch's
/// interval over the per-run values), so a change in the tail is marked
/// only when its interval excludes zero.
fn percentiles(
    hist: &Histogram<u64>,
    measure: fn(Statistic) -> Measure,
    class: LockClass,
    into: &mut Figures,
) {
    for (q, statistic) in [(0.5, Statistic::P50), (0.99, Statistic::P99)] {
        if let Some(p) = loglinear::percentile(&hist.buckets, hist.max_ns, q) {
            into.insert(Figure::class(class, measure(statistic)), p.ns);
        }
    }
}

/// A class's timings (wait or hold) merged over its rows: mean, p50, p99.
fn timing_figures(
    timings: impl Iterator<Item = Timing>,
    measure: fn(Statistic) -> Measure,
    class: LockClass,
    into: &mut Figures,
) {
    let mut hist = Histogram::EMPTY;
    for timing in timings {
        merge(&mut hist, &timing.to_hist());
    }
    if hist.count == 0 {
        return;
    }
    into.insert(
        Figure::class(class, measure(Statistic::Mean)),
        hist.total_ns as f64 / hist.count as f64,
    );
    percentiles(&hist, measure, class, into);
}

/// Per lock class of `trace`: counts (per operation, when `operations` is
/// known), wait and hold statistics, the busiest lock's wait percentiles
/// and the owners' split.
pub fn lock_figures(trace: &TraceReport, operations: Option<u64>) -> Figures {
    let mut out = Figures::new();
    if let Some(ops) = operations {
        out.insert(Figure::workload(Measure::Operations), ops as f64);
    }
    let mut classes: BTreeMap<LockClass, Vec<&crate::LockRow>> = BTreeMap::new();
    for row in &trace.locks {
        if let Some(class) = row.class {
            classes.entry(class).or_default().push(row);
        }
    }
    for (&class, rows) in &classes {
        let hooked = rows.iter().any(|r| r.acquisitions.is_some());
        let acquisitions: u64 = rows.iter().filter_map(|r| r.acquisitions).sum();
        let contentions: u64 = rows.iter().map(|r| r.contentions).sum();
        let skipped: u64 = skips::skipped_on_path(&trace.programs, class)
            .iter()
            .map(|(_, n)| n)
            .sum();
        out.insert(Figure::class(class, Measure::SkippedOnPath), skipped as f64);
        let (per, divisor) = match operations {
            Some(ops) => (
                [
                    Measure::AcquisitionsPerOperation,
                    Measure::ContentionsPerOperation,
                ],
                ops as f64,
            ),
            None => ([Measure::Acquisitions, Measure::Contentions], 1.0),
        };
        // Tracepoint mode sees contentions only.
        if hooked {
            out.insert(Figure::class(class, per[0]), acquisitions as f64 / divisor);
        }
        out.insert(Figure::class(class, per[1]), contentions as f64 / divisor);
        timing_figures(
            rows.iter().filter_map(|r| r.wait.clone()),
            Measure::Wait,
            class,
            &mut out,
        );
        timing_figures(
            rows.iter().filter_map(|r| r.hold.clone()),
            Measure::Hold,
            class,
            &mut out,
        );
        let busiest = rows
            .iter()
            .filter_map(|r| r.wait.as_ref())
            .max_by_key(|t| t.total_ns);
        if rows.len() > 1
            && let Some(timing) = busiest
        {
            percentiles(&timing.to_hist(), Measure::BusiestLockWait, class, &mut out);
        }
        let states: [u64; 3] = [
            |r: &crate::LockRow| r.holder.holder_on_cpu_ns,
            |r: &crate::LockRow| r.holder.holder_runnable_ns,
            |r: &crate::LockRow| r.holder.holder_sleeping_ns,
        ]
        .map(|get| rows.iter().filter_map(|r| get(r)).sum());
        let split: u64 = states.iter().sum();
        if split > 0 {
            for (state, ns) in OwnerState::ALL.into_iter().zip(states) {
                out.insert(
                    Figure::class(class, Measure::OwnersShare(state)),
                    100.0 * ns as f64 / split as f64,
                );
            }
        }
    }
    out
}

/// One figure, A against B.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub figure: Figure,
    /// The figure's name ([`Figure::label`]), for whoever reads the JSON.
    pub metric: String,
    pub a: Summary,
    pub b: Summary,
    pub change_percent: f64,
    /// Two-sided Welch p; None where it is undefined (a side without
    /// variance, or fewer than two runs).
    pub p_value: Option<f64>,
    /// p < [`ALPHA`] (or both sides without variance and apart), and a
    /// change of at least [`SMALLEST_CHANGE`] %; for exact rows, apart.
    pub significant: bool,
    /// A count per operation that every run of each side gave alike (to
    /// two decimals), apart from runs short of it by no more events than
    /// their path's programs skipped ([`Self::lower_bounds`]): compared as
    /// numbers, not as means with noise.
    pub exact: bool,
    /// The change's confidence interval and the smallest change these
    /// runs detect; None for exact rows and with fewer than two runs.
    pub difference: Option<Difference>,
    /// Runs per kernel that would detect the change asked about
    /// (`--detect`), when these runs cannot.
    pub runs_needed: Option<usize>,
    /// Runs whose count is a lower bound (counts per operation only): an
    /// exact row leaves those that fell short out, and its value is the
    /// other runs'.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lower_bounds: Vec<LowerBound>,
}

/// One row per figure every run of both sides has, in the order of
/// [`Figure`]: the workload's own first, then the lock classes.
pub fn compare(a: &[Figures], b: &[Figures], names: &Names, detect_percent: f64) -> Vec<Row> {
    let Some(first) = a.first() else {
        return Vec::new();
    };
    first
        .keys()
        .filter(|figure| figure.measure.is_shown())
        .filter(|figure| a.iter().chain(b).all(|run| run.contains_key(*figure)))
        .filter_map(|&figure| {
            let va: Vec<f64> = a.iter().map(|run| run[&figure]).collect();
            let vb: Vec<f64> = b.iter().map(|run| run[&figure]).collect();
            let counted = figure.measure.is_count_per_operation();
            let exact_sides = counted
                .then(|| Some((exact_count(Side::A, a, figure)?, exact_count(Side::B, b, figure)?)))
                .flatten();
            let exact = exact_sides.is_some();
            let (sa, sb, lower_bounds) = match exact_sides {
                Some(((ea, la), (eb, lb))) => (Summary::of(&ea)?, Summary::of(&eb)?, [la, lb].concat()),
                None => (
                    Summary::of(&va)?,
                    Summary::of(&vb)?,
                    if counted {
                        [lower_bounds(Side::A, a, figure), lower_bounds(Side::B, b, figure)].concat()
                    } else {
                        Vec::new()
                    },
                ),
            };
            let p_value = welch_t_test(&va, &vb).map(|(_, _, p)| p);
            let constant_and_different =
                sa.n >= 2 && sb.n >= 2 && sa.stddev == 0.0 && sb.stddev == 0.0 && sa.mean != sb.mean;
            let change_percent = if sa.mean == 0.0 {
                0.0
            } else {
                100.0 * (sb.mean - sa.mean) / sa.mean
            };
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
                figure,
                metric: figure.label(names),
                change_percent,
                significant,
                exact,
                difference,
                runs_needed,
                p_value,
                a: sa,
                b: sb,
                lower_bounds,
            })
        })
        .collect()
}

#[path = "judge_exact.rs"]
mod exact;
pub use exact::{LowerBound, Side};
use exact::{exact_count, lower_bounds};

#[cfg(test)]
#[path = "judge_tests.rs"]
mod tests;
