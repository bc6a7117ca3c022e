//! An `App` with known rows and a key press, for the state and view tests.
use std::collections::BTreeMap;

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyEventState, KeyModifiers};
use pipelock_common::Histogram;

use ratatui::{Terminal, backend::TestBackend};

use super::{
    app::{App, Sample},
    groups::Groupings,
    view::draw,
};
use crate::model::{
    ByKey, CallerRow, HolderState, LockClass, LockRow, MapFill, OwnerRow, PERCENTILE_RESOLUTION,
    ProgramStats, Snapshot, TaskRow, Timing, TraceReport,
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
    let mut h = Histogram::<u64>::EMPTY;
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
        format: Default::default(),
        kernel: "6.12.117".into(),
        mode: "fentry".into(),
        refused: Vec::new(),
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
        collector: None,
        asked_twice: Vec::new(),
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
                    margin: None,
                }];
            }
            row
        })
        .collect();
    let mut app = App::new("6.12.117".into(), "fentry".into(), Vec::new(), 1.0).with_attach(true, Vec::new());
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

/// An app showing `by`, after one sample of two call stacks and two threads
/// (the second of each busier since start, the first busier now).
pub fn app_grouped(by: ByKey) -> App {
    let caller = |frame: &str, contentions: u64, wait: u64| CallerRow {
        class: Some(LockClass::PipeMutex),
        stack: vec![
            format!("{frame}+0x50"),
            "vfs_write+0x2a4".into(),
            "ksys_write+0x73".into(),
        ],
        acquisitions: Some(contentions * 3),
        contentions,
        wait_total_ns: wait,
        wait_max_ns: wait / 2,
        hold_total_ns: Some(wait / 10),
        margin: None,
    };
    let task = |tid: u32, contentions: u64, wait: u64| TaskRow {
        class: Some(LockClass::PipeMutex),
        tid,
        pid: Some(4000),
        comm: Some("herd".into()),
        acquisitions: Some(contentions * 3),
        contentions,
        wait_total_ns: wait,
        wait_max_ns: wait / 2,
        hold_total_ns: Some(wait / 10),
    };
    let mut interval = report(Vec::new(), 2.0);
    interval.by_caller = vec![
        caller("anon_pipe_write", 8, 8_000),
        caller("anon_pipe_read", 2, 2_000),
    ];
    interval.by_task = vec![task(4001, 8, 8_000), task(4002, 2, 2_000)];
    let mut total = report(Vec::new(), 10.0);
    total.by_caller = vec![
        caller("anon_pipe_write", 10, 10_000),
        caller("anon_pipe_read", 30, 90_000),
    ];
    total.by_task = vec![task(4001, 10, 10_000), task(4002, 30, 90_000)];
    let mut app = App::new("6.12.117".into(), "fentry".into(), Vec::new(), 1.0)
        .with_attach(true, Vec::new())
        .with_grouping(
            by,
            Groupings {
                callers: true,
                tasks: by == ByKey::Task,
            },
        );
    app.on_sample(Sample {
        snapshot: Snapshot {
            interval,
            total,
            fill: Vec::new(),
        },
        elapsed_s: 10.0,
    });
    app
}

/// What `app` draws on a `width` × `height` terminal, a line a row.
pub fn screen(app: &App, width: u16, height: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal.draw(|f| draw(f, app)).unwrap();
    let buffer = terminal.backend().buffer();
    buffer
        .content
        .chunks(usize::from(width))
        .map(|line| {
            line.iter()
                .map(|c| c.symbol())
                .collect::<String>()
                .trim_end()
                .to_owned()
        })
        .collect::<Vec<_>>()
        .join("\n")
}
