use super::*;
use crate::{
    Operations, RunResult, System,
    fixtures::{hist, row},
};

fn timing(ns: &[u64]) -> Option<Timing> {
    Timing::from_hist(&hist(ns))
}

fn trace(locks: Vec<crate::LockRow>) -> TraceReport {
    TraceReport {
        locks,
        ..TraceReport::empty()
    }
}

/// A `pipelock run pipe-throughput --trace` result: `pairs` loops, the
/// pipe mutex taken twice per loop (held 970 or 1010 ns), `rd_wait.lock` `rd`
/// times per loop.
fn throughput_run(pairs: u64, rd: u64, lps: f64) -> CommandResult {
    let locks = vec![
        row(
            LockClass::PipeMutex,
            Some(2 * pairs),
            0,
            None,
            timing(
                &(0..2 * pairs)
                    .map(|i| if i % 2 == 0 { 970 } else { 1010 })
                    .collect::<Vec<_>>(),
            ),
        ),
        row(LockClass::PipeRdWait, Some(rd * pairs), 1, None, None),
    ];
    CommandResult::Run(Box::new(RunResult {
        format: crate::FormatVersion,
        workload: "pipe-throughput".into(),
        metric: Metric {
            name: "throughput".into(),
            unit: "lps".into(),
            higher_is_better: true,
        },
        params: serde_json::Map::new(),
        system: System {
            kernel: "6.18".into(),
            cpus_online: 2,
            cpus_pinned: None,
            pipelock_version: "0".into(),
        },
        started_at: 0,
        runs: vec![Run {
            run: 1,
            value: lps,
            elapsed_s: 1.0,
            counters: Counters::default(),
            operations: Some(Operations {
                count: pairs,
                name: "write+read pair".into(),
            }),
            details: serde_json::Value::Null,
            trace: None,
        }],
        summary: None,
        interrupted: false,
        trace: Some(trace(locks)),
    }))
}

fn figure(subject: Subject, measure: Measure) -> Figure {
    Figure { subject, measure }
}

const MUTEX: Subject = Subject::Class(LockClass::PipeMutex);
const RD_WAIT: Subject = Subject::Class(LockClass::PipeRdWait);

#[test]
fn per_operation_counts_come_from_the_trace_and_the_workload() {
    let result = throughput_run(1000, 3, 5e5);
    let f = figures(&result).unwrap();
    assert_eq!(f[&figure(Subject::Workload, Measure::Headline)], 5e5);
    assert_eq!(f[&figure(MUTEX, Measure::AcquisitionsPerOperation)], 2.0);
    assert_eq!(f[&figure(RD_WAIT, Measure::AcquisitionsPerOperation)], 3.0);
    // Holds of 970 and 1010 ns: the p99 is the midpoint of their bucket,
    // 960..1023 ns.
    assert_eq!(f[&figure(MUTEX, Measure::Hold(Statistic::Mean))], 990.0);
    assert_eq!(f[&figure(MUTEX, Measure::Hold(Statistic::P99))], 991.5);
    assert!(!f.contains_key(&figure(RD_WAIT, Measure::Wait(Statistic::Mean))));
    let CommandResult::Run(mut empty) = result else {
        unreachable!()
    };
    empty.runs.clear();
    assert!(figures(&CommandResult::Run(empty)).is_err());
}

#[test]
fn labels_name_the_workload_the_class_and_the_operation() {
    let result = throughput_run(10, 1, 1.0);
    let names = Names::of(&result);
    let label = |subject, measure| figure(subject, measure).label(&names);
    assert_eq!(
        label(Subject::Workload, Measure::Headline),
        "pipe-throughput throughput (lps)"
    );
    assert_eq!(
        label(RD_WAIT, Measure::AcquisitionsPerOperation),
        "pipe-rd-wait acquisitions per write+read pair"
    );
    assert_eq!(
        label(MUTEX, Measure::BusiestLockWait(Statistic::P50)),
        "pipe-mutex busiest lock wait p50 (ns)"
    );
    assert_eq!(
        label(MUTEX, Measure::OwnersShare(OwnerState::OnCpu)),
        "pipe-mutex owners on-CPU (% of wait)"
    );
    assert_eq!(label(Subject::Workload, Measure::TaskClockMs), "task-clock (ms)");
    let one_workload = Names {
        workload: None,
        ..names
    };
    assert_eq!(
        figure(Subject::Workload, Measure::Headline).label(&one_workload),
        "throughput (lps)"
    );
}

/// A trace whose pipe-mutex waits are `body` ns but for a 2 % tail of
/// `tail` ns, all scaled by `scale` (the runs' spread).
fn waits(body: u64, tail: u64, scale: f64) -> Figures {
    let values: Vec<u64> = (0..1000)
        .map(|i| if i < 980 { body } else { tail })
        .map(|v| (v as f64 * scale) as u64)
        .collect();
    let locks = vec![row(LockClass::PipeMutex, None, 1000, timing(&values), None)];
    figures(&CommandResult::Trace(Box::new(trace(locks)))).unwrap()
}

/// Two kernels with the same mean wait, one with a 20 % longer tail: the
/// p99 is marked changed, the mean is not; a kernel against itself
/// changes nothing.
#[test]
fn a_longer_tail_with_the_same_mean_is_a_change_in_p99_only() {
    let scales = [0.97, 0.985, 1.0, 1.015, 1.03];
    // 980 × 2000 + 20 × 50 000 = 980 × 1796 + 20 × 60 000 (+ 80): equal means.
    let a: Vec<Figures> = scales.iter().map(|&s| waits(2000, 50_000, s)).collect();
    let b: Vec<Figures> = scales.iter().map(|&s| waits(1796, 60_000, s)).collect();
    let names = Names::default();
    let rows = compare(&a, &b, &names, 5.0);
    let row = |m: Measure| {
        rows.iter()
            .find(|r| r.figure == figure(MUTEX, m))
            .unwrap_or_else(|| panic!("{m:?}: {rows:?}"))
    };
    let mean = row(Measure::Wait(Statistic::Mean));
    assert!(mean.change_percent.abs() < 0.1 && !mean.significant, "{mean:?}");
    let p99 = row(Measure::Wait(Statistic::P99));
    assert!(p99.significant, "{p99:?}");
    assert_eq!(p99.metric, "pipe-mutex wait p99 (ns)");
    let d = p99.difference.unwrap();
    assert!((d.change_percent - 20.0).abs() < 6.25 * 2.0, "{d:?}");
    assert!(d.ci_low_percent > 0.0, "the interval excludes zero: {d:?}");
    assert!(
        compare(&a, &a, &names, 5.0)
            .iter()
            .all(|r| !r.significant && r.change_percent == 0.0)
    );
}

#[test]
fn the_busiest_lock_of_a_class_gets_its_own_percentiles() {
    let f = figures(&CommandResult::Trace(Box::new(trace(vec![
        row(LockClass::PipeMutex, None, 2, timing(&[100, 100]), None),
        row(LockClass::PipeMutex, None, 2, timing(&[5000, 5000]), None),
    ]))))
    .unwrap();
    // The midpoints of the buckets 4608..5119 and 96..103 ns.
    assert_eq!(
        f[&figure(MUTEX, Measure::BusiestLockWait(Statistic::P50))],
        4863.5
    );
    assert_eq!(f[&figure(MUTEX, Measure::Wait(Statistic::P50))], 99.5);
    // Without operations, counts are the run's own.
    assert_eq!(f[&figure(MUTEX, Measure::Contentions)], 4.0);
    assert!(
        !f.contains_key(&figure(MUTEX, Measure::Acquisitions)),
        "tracepoint mode"
    );
}

#[test]
fn a_count_that_moves_from_three_to_one_is_a_significant_change() {
    let side = |rd: u64, runs: [(u64, f64); 3]| -> (Vec<Figures>, Names) {
        let results: Vec<CommandResult> = runs.iter().map(|(n, lps)| throughput_run(*n, rd, *lps)).collect();
        (
            results.iter().map(|r| figures(r).unwrap()).collect(),
            Names::of(&results[0]),
        )
    };
    let (a, names) = side(3, [(1000, 4.9e5), (1200, 5.1e5), (900, 5e5)]);
    let (b, _) = side(1, [(1100, 5.0e5), (1000, 5.2e5), (950, 4.8e5)]);
    let rows = compare(&a, &b, &names, 5.0);
    assert_eq!(
        rows[0].figure,
        figure(Subject::Workload, Measure::Headline),
        "the workload's own figure comes first"
    );
    let row = |s: Subject, m: Measure| rows.iter().find(|r| r.figure == figure(s, m)).unwrap();
    let rd = row(RD_WAIT, Measure::AcquisitionsPerOperation);
    assert_eq!((rd.a.mean, rd.b.mean), (3.0, 1.0));
    assert!(
        rd.significant && rd.exact && rd.difference.is_none(),
        "exact on each side, apart: {rd:?}"
    );
    assert!((rd.change_percent + 66.67).abs() < 0.01);
    let mutex = row(MUTEX, Measure::AcquisitionsPerOperation);
    assert!(!mutex.significant, "2 and 2");
    // Consistently apart by a hair: not marked.
    let x = figure(Subject::Workload, Measure::Headline);
    let hair = compare(
        &[1.0, 1.0001, 1.0002].map(|v| Figures::from([(x, v)])),
        &[1.001, 1.0011, 1.0012].map(|v| Figures::from([(x, v)])),
        &names,
        5.0,
    );
    assert!(!hair[0].significant, "{hair:?}");
    let lps = row(Subject::Workload, Measure::Headline);
    assert!(!lps.significant, "{lps:?}");
    assert!(lps.difference.is_some() && !lps.exact);
}

#[test]
fn run_figures_are_the_headline_and_the_counters() {
    let CommandResult::Run(result) = throughput_run(10, 1, 7.0) else {
        unreachable!()
    };
    let run = &result.runs[0];
    let f = run_figures(run);
    assert_eq!(f[&figure(Subject::Workload, Measure::Headline)], 7.0);
    assert_eq!(f.len(), 6, "{f:?}");
    assert!(run_lock_figures(run).is_none(), "no trace of its own");
    let traced = Run {
        trace: result.trace.clone(),
        ..run.clone()
    };
    let locks = run_lock_figures(&traced).unwrap();
    assert_eq!(locks[&figure(MUTEX, Measure::AcquisitionsPerOperation)], 2.0);
}

/// `throughput_run`'s trace with the pipe mutex `lost` acquisitions short,
/// and `skipped` runs of `mutex_lock_entry` (on the mutex's path) and
/// `others` of a spinlock program (not on it).
fn short_run(pairs: u64, lost: u64, skipped: u64, others: u64) -> Figures {
    let CommandResult::Run(mut result) = throughput_run(pairs, 3, 5e5) else {
        unreachable!()
    };
    let trace = result.trace.as_mut().unwrap();
    trace.locks[0].acquisitions = Some(2 * pairs - lost);
    let program = |name: &str, misses: u64| crate::ProgramStats {
        name: name.to_owned(),
        run_count: 4 * pairs,
        run_time_ns: 1,
        recursion_misses: misses,
    };
    trace.programs = vec![
        program("mutex_lock_entry", skipped),
        program("spin_lock_irq_exit", others),
    ];
    figures(&CommandResult::Run(result)).unwrap()
}

/// A run short of the others by no more acquisitions than its mutex path
/// skipped is a lower bound: the row stays exact, judged on the others,
/// and names that run. Short by more, or with the skips on another path,
/// the count is noise again; so is a side whose every run skipped.
#[test]
fn a_count_short_by_its_paths_skipped_runs_is_a_lower_bound() {
    let names = Names::of(&throughput_run(1, 1, 1.0));
    let mutex = figure(MUTEX, Measure::AcquisitionsPerOperation);
    let row = |a: &[Figures], b: &[Figures]| {
        compare(a, b, &names, 5.0)
            .into_iter()
            .find(|r| r.figure == mutex)
            .unwrap()
    };
    let b = [short_run(10_000, 0, 0, 0), short_run(12_000, 0, 0, 0)];
    let whole = short_run(11_000, 0, 0, 9);
    // 100 of 20 000 lost (1.99 per pair) with 140 skipped.
    let allowed = row(&[whole.clone(), short_run(10_000, 100, 140, 0)], &b);
    assert!(allowed.exact && !allowed.significant, "{allowed:?}");
    assert_eq!((allowed.a.mean, allowed.a.n), (2.0, 1));
    assert_eq!(
        allowed.lower_bounds,
        vec![LowerBound {
            side: Side::A,
            run: 2,
            value: 1.99,
            skipped: 140
        }]
    );
    // The same loss with 60 skipped on the path and 900 elsewhere.
    let beyond = row(&[whole.clone(), short_run(10_000, 100, 60, 900)], &b);
    assert!(!beyond.exact, "{beyond:?}");
    assert_eq!(beyond.lower_bounds.len(), 1, "{beyond:?}");
    let elsewhere = row(&[whole.clone(), short_run(10_000, 100, 0, 900)], &b);
    assert!(
        !elsewhere.exact && elsewhere.lower_bounds.is_empty(),
        "{elsewhere:?}"
    );
    // A run that skipped some but lost none counts as whole.
    let lossless = row(&[whole.clone(), short_run(10_000, 0, 140, 0)], &b);
    assert!(
        lossless.exact && lossless.lower_bounds.is_empty() && lossless.a.n == 2,
        "{lossless:?}"
    );
    let all_short = row(
        &[short_run(10_000, 100, 140, 0), short_run(10_000, 50, 140, 0)],
        &b,
    );
    assert!(
        !all_short.exact && all_short.lower_bounds.len() == 2,
        "{all_short:?}"
    );
    assert!(
        compare(&[whole], &b, &names, 5.0)
            .iter()
            .all(|r| r.figure.measure.is_shown()),
        "operations and skipped runs are read, not shown"
    );
}

/// Runs that all skipped some but agree lost nothing: exact.
#[test]
fn runs_that_all_skipped_but_agree_are_exact() {
    let names = Names::of(&throughput_run(1, 1, 1.0));
    let mutex = figure(MUTEX, Measure::AcquisitionsPerOperation);
    let a = [short_run(10_000, 0, 7, 0), short_run(11_000, 0, 3, 0)];
    let b = [short_run(10_000, 0, 0, 0), short_run(12_000, 0, 0, 0)];
    let row = compare(&a, &b, &names, 5.0)
        .into_iter()
        .find(|r| r.figure == mutex)
        .unwrap();
    assert!(
        row.exact && row.lower_bounds.is_empty() && row.a.n == 2,
        "{row:?}"
    );
    // One run each, A's having skipped: a lower bound, not exact.
    let lone = compare(&a[..1], &b[..1], &names, 5.0)
        .into_iter()
        .find(|r| r.figure == mutex)
        .unwrap();
    assert!(!lone.exact && lone.lower_bounds.len() == 1, "{lone:?}");
}
