//! The maps' raw entries joined into model rows.
use pipelock_common::LockKey;

use crate::{
    bpf::maps::{Identities, Stats},
    model::{LockRow, SortKey, Timing, naming::identify, sort_rows},
};

/// One row per lock of `stats`, named from `ids`, busiest first.
pub fn rows(stats: &Stats, ids: &Identities, mode: &str, hooked: bool) -> Vec<LockRow> {
    let mut rows: Vec<LockRow> = stats
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
            let identity = identify(lock, info);
            LockRow {
                class: identity.class,
                lock_addr: lock,
                owner: key.owner,
                pipe_ino: identity.pipe_ino,
                name: identity.name,
                comms: users.iter().map(|(pid, comm)| format!("{comm}({pid})")).collect(),
                mode: mode.to_owned(),
                acquisitions: hooked.then_some(merged.acquisitions),
                contentions: merged.contentions,
                spin_only: merged.spin_only,
                dropped: hooked.then_some(merged.dropped),
                wait: Timing::from_hist(&merged.wait),
                hold: if hooked {
                    Timing::from_hist(&merged.hold)
                } else {
                    None
                },
            }
        })
        .collect();
    sort_rows(&mut rows, SortKey::WaitTotal);
    rows
}
