//! The maps' raw entries joined into model rows.
use pipelock_common::{LockKey, LockStats};

use crate::{
    bpf::maps::{Identities, Taken},
    kernel::{KernelSymbols, SymbolKind},
    model::{
        CallerRow, LockClass, LockRow, ReportView, SortKey, TaskRow, Timing,
        callers::{LockTotals, callers_of, merge_callers, tasks_of},
        naming::identify,
        owners::{by_lock, holds_of, owners_of},
        sort_rows,
    },
};

/// The row of the locks of one class a long trace folded together (the
/// longest idle, beyond the number of locks it tracks one by one).
pub fn retired(
    class: Option<LockClass>,
    count: u64,
    stats: &LockStats<u64>,
    mode: &str,
    hooked: bool,
) -> LockRow {
    LockRow {
        class,
        name: format!("({count} retired locks, idle longest)"),
        ..measured(stats, mode, hooked)
    }
}

/// A row's figures; what the lock is, the caller fills in.
fn measured(stats: &LockStats<u64>, mode: &str, hooked: bool) -> LockRow {
    LockRow {
        class: None,
        lock_addr: 0,
        owner: 0,
        pipe_ino: None,
        name: String::new(),
        comms: Vec::new(),
        mode: mode.to_owned(),
        // The tracepoints see contended acquisitions only, and no release.
        acquisitions: stats.acquisitions(hooked),
        contentions: stats.contended(hooked),
        spin_only: stats.spin_only(hooked),
        dropped: hooked.then_some(stats.dropped),
        wait: Timing::from_hist(&stats.wait),
        hold: if hooked {
            Timing::from_hist(&stats.hold)
        } else {
            None
        },
        owners: Vec::new(),
        holder: Default::default(),
        holds: Default::default(),
        callers: Vec::new(),
    }
}

/// What rows are built with, besides the maps' entries.
pub struct RowContext<'a> {
    pub ids: &'a Identities,
    pub symbols: &'a KernelSymbols,
    pub mode: &'a str,
    pub hooked: bool,
    /// Whether owners' states were watched (the scheduler programs attached).
    pub holder_split: bool,
    pub view: &'a ReportView,
    /// What a sampled call stack stood for (`TraceConfig::stack_sample`).
    pub stack_sample: u32,
}

/// The rows of one report: per lock (busiest first), and across locks by
/// caller and by task.
pub struct Rows {
    pub locks: Vec<LockRow>,
    pub by_caller: Vec<CallerRow>,
    pub by_task: Vec<TaskRow>,
}

/// One row per lock of `taken`, named from the identities (and kallsyms,
/// for a static lock), with its owners and callers; then the caller and
/// task rows of the locks the view keeps.
pub fn rows(taken: &Taken, cx: &RowContext) -> Rows {
    let details = by_lock(&taken.details);
    let ids = cx.ids;
    let stack_of = |id: u32| {
        ids.stacks
            .get(&id)
            .map(|frames| frames.iter().map(|a| cx.symbols.frame(*a)).collect())
    };
    let mut locks: Vec<LockRow> = taken
        .stats
        .iter()
        .map(|(key, merged)| {
            let lock = key.lock;
            let info = ids.info.get(key);
            // The hooked modes note processes once per pipe (at its mutex
            // address); every lock of that pipe shares them.
            let mut users = ids.users.get(key).cloned().unwrap_or_default();
            if let Some(pipe) = info.map(|i| i.pipe).filter(|p| *p != lock) {
                let mutex = LockKey {
                    lock: pipe,
                    owner: key.owner,
                };
                users.extend(ids.users.get(&mutex).cloned().unwrap_or_default());
            }
            users.sort();
            users.dedup();
            let identity = identify(lock, info, cx.symbols.name(lock, SymbolKind::Data).as_deref());
            let parts = details.get(key).map_or(&[][..], Vec::as_slice);
            let (owners, holder) = owners_of(key, parts, &ids.tasks, cx.holder_split);
            let mut callers = callers_of(
                identity.class,
                parts.iter().copied(),
                &stack_of,
                cx.view.stack_depth,
                cx.hooked,
                cx.stack_sample,
                &LockTotals {
                    acquisitions: merged.acquisitions(cx.hooked).unwrap_or(0),
                    contentions: merged.contended(cx.hooked),
                    wait_ns: merged.wait.total_ns,
                    hold_ns: merged.hold.total_ns,
                },
            );
            callers.retain(|c| cx.view.keeps_caller(c));
            LockRow {
                class: identity.class,
                lock_addr: lock,
                owner: key.owner,
                pipe_ino: identity.pipe_ino,
                name: identity.name,
                comms: users.iter().map(|(pid, comm)| format!("{comm}({pid})")).collect(),
                owners,
                holder,
                holds: if cx.holder_split {
                    holds_of(key, parts)
                } else {
                    Default::default()
                },
                callers,
                ..measured(merged, cx.mode, cx.hooked)
            }
        })
        .filter(|row| cx.view.keeps_lock(row))
        // With --caller, a lock none of whose waits came from there goes.
        .filter(|row| cx.view.caller.is_none() || !row.callers.is_empty())
        .collect();
    sort_rows(&mut locks, SortKey::WaitTotal);
    let by_caller = merge_callers(locks.iter().flat_map(|row| row.callers.iter().cloned()));
    let by_task = tasks_of(
        locks.iter().flat_map(|row| {
            let key = LockKey {
                lock: row.lock_addr,
                owner: row.owner,
            };
            let class = row.class;
            details
                .get(&key)
                .into_iter()
                .flatten()
                .map(move |(k, v)| (class, *k, *v))
        }),
        &ids.tasks,
        cx.hooked,
    );
    Rows {
        locks,
        by_caller,
        by_task,
    }
}
