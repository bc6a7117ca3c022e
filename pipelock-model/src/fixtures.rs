//! Values for tests, here and in the crates that render and judge them
//! (the `fixtures` feature).
use std::collections::BTreeMap;

use pipelock_common::Histogram;

use crate::{HoldState, HolderState, LockClass, LockRow, Timing, TraceReport};

/// A histogram of `values`.
pub fn hist(values: &[u64]) -> Histogram<u64> {
    let mut h = Histogram::EMPTY;
    values.iter().for_each(|v| h.record(*v));
    h
}

/// A row of `class` with the given counts and timings, the rest empty.
pub fn row(
    class: LockClass,
    acquisitions: Option<u64>,
    contentions: u64,
    wait: Option<Timing>,
    hold: Option<Timing>,
) -> LockRow {
    LockRow {
        class: Some(class),
        lock_addr: 0xffff_8880_0123_4000,
        owner: 0,
        pipe_ino: None,
        name: class.name().to_owned(),
        comms: Vec::new(),
        mode: String::new(),
        acquisitions,
        contentions,
        spin_only: 0,
        dropped: None,
        wait,
        hold,
        owners: Vec::new(),
        holder: HolderState::default(),
        holds: HoldState::default(),
        callers: Vec::new(),
    }
}

/// A tracepoint-mode report of one pipe mutex, contended three times.
pub fn sample() -> TraceReport {
    let rows = vec![LockRow {
        class: Some(LockClass::PipeMutex),
        lock_addr: 0xffff_8880_0123_4000,
        owner: 4242,
        pipe_ino: Some(4242),
        name: "pipe:[4242]".into(),
        comms: vec!["herd(10)".into(), "herd(11)".into()],
        mode: "tracepoint (tp_btf)".into(),
        acquisitions: None,
        contentions: 3,
        spin_only: 1,
        dropped: Some(2),
        wait: Timing::from_hist(&hist(&[100, 200, 4000])),
        hold: None,
        owners: Vec::new(),
        holder: HolderState::default(),
        holds: HoldState::default(),
        callers: Vec::new(),
    }];
    TraceReport {
        format: crate::FormatVersion,
        kernel: "6.18.44".into(),
        mode: "tracepoint (tp_btf)".into(),
        hold_unavailable_reason: Some("needs fentry or kprobe".into()),
        duration_s: 1.0,
        totals: TraceReport::totals(&rows),
        locks: rows,
        drops: BTreeMap::from([("stale_pending".to_owned(), 0)]),
        notes: vec!["lockref: n/a in tracepoint mode".into()],
        ..TraceReport::empty()
    }
}
