//! An `App` with known rows and a key press, for the state and view tests.
use std::collections::BTreeMap;

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyEventState, KeyModifiers};
use pipelock_common::Histogram;

use super::app::{App, Sample};
use crate::model::{
    CallerRow, HolderState, LockClass, LockRow, MapFill, OwnerRow, PERCENTILE_RESOLUTION, ProgramStats,
    Snapshot, Timing, TraceReport,
};

pub fn key(code: KeyCode) -> KeyEvent {
    KeyEvent {
        code,
        modifiers: KeyModifiers::NONE,
        kind: KeyEventKind::Press,
        state: KeyEventState::NONE,
    }
}

fn timing(values: &[u64]) -> Option<Timing> {
    let mut h = Histogram::EMPTY;
    values.iter().for_each(|v| h.record(*v));
    Timing::from_hist(&h)
}

fn row(addr: u64, class: LockClass, name: &str, contentions: u64, wait: &[u64]) -> LockRow {
    LockRow {
        class: Some(class),
        lock_addr: addr,
        owner: 0,
        pipe_ino: None,
        name: name.into(),
        comms: vec![format!("herd({addr})")],
        mode: "fentry".into(),
        acquisitions: Some(contentions * 10),
        contentions,
        spin_only: 0,
        dropped: Some(0),
        wait: timing(wait),
        hold: timing(&[100, 200]),
        owners: Vec::new(),
        holder: Default::default(),
        holds: Default::default(),
        callers: Vec::new(),
    }
}

pub fn report(locks: Vec<LockRow>, duration_s: f64) -> TraceReport {
    TraceReport {
        kernel: "6.12.117".into(),
        mode: "fentry".into(),
        hold_unavailable_reason: None,
        duration_s,
        totals: TraceReport::totals(&locks),
        locks,
        drops: BTreeMap::from([("stale_pending".to_owned(), 3)]),
        percentile_resolution: PERCENTILE_RESOLUTION.to_owned(),
        notes: Vec::new(),
        programs: vec![ProgramStats {
            name: "mutex_lock_entry".into(),
            run_count: 1000,
            run_time_ns: 50_000,
            recursion_misses: 0,
        }],
        maps: Vec::new(),
        tracer_cpu_s: None,
        by: Default::default(),
        by_caller: Vec::new(),
        by_task: Vec::new(),
    }
}

/// An app after one sample with `n` locks (lock i: 10·i contentions).
pub fn app_with(n: u64) -> App {
    let locks: Vec<LockRow> = (1..=n)
        .map(|i| {
            let class = if i % 2 == 0 {
                LockClass::PipeMutex
            } else {
                LockClass::PipeRdWait
            };
            let mut row = row(
                i,
                class,
                &format!("pipe:[{}]", 1000 + i),
                10 * i,
                &[i * 100, i * 1000],
            );
            if class == LockClass::PipeMutex {
                let holder = HolderState {
                    holder_on_cpu_ns: Some(100),
                    holder_runnable_ns: Some(0),
                    holder_sleeping_ns: Some(900),
                };
                row.owners = vec![OwnerRow {
                    tid: 4242,
                    pid: Some(4242),
                    comm: Some("writer".into()),
                    waits: 2,
                    wait_ns: 1000,
                    wait_max_ns: 900,
                    holder,
                }];
                row.holder = holder;
                row.callers = vec![CallerRow {
                    class: Some(class),
                    stack: vec!["anon_pipe_write+0x50".into(), "vfs_write+0x2a4".into()],
                    acquisitions: Some(3),
                    contentions: 2,
                    wait_total_ns: 1000,
                    wait_max_ns: 900,
                    hold_total_ns: Some(10),
                }];
            }
            row
        })
        .collect();
    let mut app = App::new("6.12.117".into(), "fentry".into(), Vec::new(), 1.0);
    app.on_sample(Sample {
        snapshot: Snapshot {
            interval: report(locks.clone(), 2.0),
            total: report(locks, 10.0),
            fill: vec![MapFill {
                name: "LOCK_STATS".into(),
                used: Some(n as usize),
                capacity: 4096,
                memlock_bytes: Some(5 << 20),
            }],
        },
        elapsed_s: 10.0,
    });
    app
}
