//! The maps' raw entries joined into model rows.
use pipelock_common::{LockKey, LockStats};

use crate::{
    bpf::maps::{Identities, Taken},
    kernel::{KernelSymbols, SymbolKind},
    model::{
        LockClass, LockRow, SortKey, Timing,
        naming::identify,
        sort_rows,
        why::{by_lock, owners_of},
    },
};

/// The row of the locks of one class a long trace folded together (the
/// longest idle, beyond the number of locks it tracks one by one).
pub fn retired(class: Option<LockClass>, count: u64, stats: &LockStats, mode: &str, hooked: bool) -> LockRow {
    LockRow {
        class,
        name: format!("({count} retired locks, idle longest)"),
        ..measured(stats, mode, hooked)
    }
}

/// A row's figures; what the lock is, the caller fills in.
fn measured(stats: &LockStats, mode: &str, hooked: bool) -> LockRow {
    LockRow {
        class: None,
        lock_addr: 0,
        owner: 0,
        pipe_ino: None,
        name: String::new(),
        comms: Vec::new(),
        mode: mode.to_owned(),
        // The tracepoints see contended acquisitions only, and no release.
        acquisitions: hooked.then_some(stats.acquisitions),
        contentions: stats.contentions,
        spin_only: stats.spin_only,
        dropped: hooked.then_some(stats.dropped),
        wait: Timing::from_hist(&stats.wait),
        hold: if hooked {
            Timing::from_hist(&stats.hold)
        } else {
            None
        },
        owners: Vec::new(),
        holder: Default::default(),
    }
}

/// One row per lock of `stats`, named from `ids` (and `symbols`, for a
/// static lock), busiest first.
/// `holder_split`: whether owners' states were watched (the scheduler
/// programs attached).
pub fn rows(
    taken: &Taken,
    ids: &Identities,
    symbols: &KernelSymbols,
    mode: &str,
    hooked: bool,
    holder_split: bool,
) -> Vec<LockRow> {
    let details = by_lock(&taken.details);
    let mut rows: Vec<LockRow> = taken
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
            let identity = identify(lock, info, symbols.name(lock, SymbolKind::Data).as_deref());
            let parts = details.get(key).map_or(&[][..], Vec::as_slice);
            let (owners, holder) = owners_of(key, parts, &ids.tasks, holder_split);
            LockRow {
                owners,
                holder,
                class: identity.class,
                lock_addr: lock,
                owner: key.owner,
                pipe_ino: identity.pipe_ino,
                name: identity.name,
                comms: users.iter().map(|(pid, comm)| format!("{comm}({pid})")).collect(),
                ..measured(merged, mode, hooked)
            }
        })
        .collect();
    sort_rows(&mut rows, SortKey::WaitTotal);
    rows
}
