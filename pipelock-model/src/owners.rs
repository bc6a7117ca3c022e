//! Why a lock was waited for: who owned it (the waits each owner caused)
//! and what the owners were doing meanwhile (on a CPU, runnable, sleeping).
use std::collections::HashMap;

use pipelock_common::{DetailKey, DetailStats, LockKey, detail, holder};
use serde::{Deserialize, Serialize};

/// A lock's figures broken down by owner, caller or task, as drained.
/// Boxed for the reason `Stats` is: the table is cheap to grow.
pub type Details = HashMap<DetailKey, Box<DetailStats>>;

/// A thread's process id and command name (`TASK_NAMES`).
pub type TaskNames = HashMap<u32, (u32, String)>;

pub fn merge_detail(into: &mut DetailStats, from: &DetailStats) {
    into.acquisitions += from.acquisitions;
    into.contentions += from.contentions;
    into.wait_ns += from.wait_ns;
    into.wait_max_ns = into.wait_max_ns.max(from.wait_max_ns);
    into.hold_ns += from.hold_ns;
    for (into, from) in into.holder_ns.iter_mut().zip(from.holder_ns) {
        *into += from;
    }
    for (into, from) in into.sampled.iter_mut().zip(from.sampled) {
        *into = into.saturating_add(from);
    }
}

/// Adds `fresh` to `into`.
pub fn merge_details(into: &mut Details, fresh: &Details) {
    for (key, stats) in fresh {
        merge_detail(into.entry(*key).or_default(), stats);
    }
}

/// Where a waited-for owner spent the waits it caused. The three add up
/// to the wait of the waits whose owner was watched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderState {
    /// The owner ran: the critical section's own work.
    pub holder_on_cpu_ns: Option<u64>,
    /// The owner was runnable but not running: lock-holder preemption.
    pub holder_runnable_ns: Option<u64>,
    /// The owner slept with the lock held (a page fault, reclaim, I/O).
    pub holder_sleeping_ns: Option<u64>,
}

impl HolderState {
    fn of(ns: &[u64; holder::STATES]) -> Self {
        Self {
            holder_on_cpu_ns: Some(ns[holder::ON_CPU]),
            holder_runnable_ns: Some(ns[holder::RUNNABLE]),
            holder_sleeping_ns: Some(ns[holder::SLEEPING]),
        }
    }

    /// Split wait in all, if measured.
    pub fn total_ns(&self) -> Option<u64> {
        Some(self.holder_on_cpu_ns? + self.holder_runnable_ns? + self.holder_sleeping_ns?)
    }

    /// (on CPU, runnable, sleeping) as percentages of their sum.
    pub fn percentages(&self) -> Option<[f64; 3]> {
        let total = self.total_ns().filter(|t| *t > 0)? as f64;
        let pct = |ns: Option<u64>| ns.unwrap_or(0) as f64 * 100.0 / total;
        Some([
            pct(self.holder_on_cpu_ns),
            pct(self.holder_runnable_ns),
            pct(self.holder_sleeping_ns),
        ])
    }

    /// `on-CPU 3 % / runnable 1 % / sleeping 96 %`, or None unmeasured.
    pub fn summary(&self) -> Option<String> {
        let [on_cpu, runnable, sleeping] = self.percentages()?;
        Some(format!(
            "on-CPU {on_cpu:.0} % / runnable {runnable:.0} % / sleeping {sleeping:.0} %"
        ))
    }
}

/// `--hold-states`: where the holders of a mutex spent their holds (hooked
/// modes); the three add up to the hold time of the holds watched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldState {
    pub hold_on_cpu_ns: Option<u64>,
    pub hold_runnable_ns: Option<u64>,
    pub hold_sleeping_ns: Option<u64>,
}

impl HoldState {
    /// The same split as a [`HolderState`] (for its percentages and summary).
    pub fn as_holder(&self) -> HolderState {
        HolderState {
            holder_on_cpu_ns: self.hold_on_cpu_ns,
            holder_runnable_ns: self.hold_runnable_ns,
            holder_sleeping_ns: self.hold_sleeping_ns,
        }
    }
}

/// The `HOLD` part of a lock, if recorded.
pub fn holds_of(lock: &LockKey, details: &[(&DetailKey, &DetailStats)]) -> HoldState {
    details
        .iter()
        .find(|(key, _)| key.kind == detail::HOLD && key.lock == *lock)
        .map_or_else(HoldState::default, |(_, stats)| HoldState {
            hold_on_cpu_ns: Some(stats.holder_ns[holder::ON_CPU]),
            hold_runnable_ns: Some(stats.holder_ns[holder::RUNNABLE]),
            hold_sleeping_ns: Some(stats.holder_ns[holder::SLEEPING]),
        })
}

/// One owner of one lock, as its waiters found it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerRow {
    /// The owning thread (0: none: a mutex that had no owner at any
    /// `contention_begin` of the wait, just released or being handed to a
    /// waiter; a spinlock whose last release was not seen).
    pub tid: u32,
    /// Its process, and its command name, where recorded.
    pub pid: Option<u32>,
    pub comm: Option<String>,
    /// Contended acquisitions that waited for it, and their wait.
    pub waits: u64,
    pub wait_ns: u64,
    pub wait_max_ns: u64,
    #[serde(flatten)]
    pub holder: HolderState,
}

impl OwnerRow {
    /// `comm(pid)` or `tid 123` when the name was not recorded.
    pub fn label(&self) -> String {
        match (&self.comm, self.tid) {
            (_, 0) => "(no owner)".to_owned(),
            (_, FOLDED) => "(other owners)".to_owned(),
            (Some(comm), tid) if self.pid.is_some_and(|p| p != tid) => {
                format!("{comm}({}/{tid})", self.pid.unwrap_or(0))
            }
            (Some(comm), tid) => format!("{comm}({tid})"),
            (None, tid) => format!("tid {tid}"),
        }
    }
}

/// The owners of `lock`, most wait caused first, and their states summed;
/// `split` says whether the owners' states were watched (the scheduler
/// programs attached), else the states are None.
pub fn owners_of(
    lock: &LockKey,
    details: &[(&DetailKey, &DetailStats)],
    names: &TaskNames,
    split: bool,
) -> (Vec<OwnerRow>, HolderState) {
    let mut total = [0u64; holder::STATES];
    let mut owners: Vec<OwnerRow> = details
        .iter()
        .filter(|(key, _)| key.kind == detail::OWNER && key.lock == *lock)
        .map(|(key, stats)| {
            let name = names.get(&key.id);
            for (sum, ns) in total.iter_mut().zip(stats.holder_ns) {
                *sum += ns;
            }
            OwnerRow {
                tid: key.id,
                pid: name.map(|(pid, _)| *pid),
                comm: name.map(|(_, comm)| comm.clone()),
                waits: stats.contentions,
                wait_ns: stats.wait_ns,
                wait_max_ns: stats.wait_max_ns,
                // A spinlock's owners were not watched: nothing to split.
                holder: if split && stats.holder_ns.iter().any(|ns| *ns > 0) {
                    HolderState::of(&stats.holder_ns)
                } else {
                    HolderState::default()
                },
            }
        })
        .collect();
    owners.sort_by(|a, b| b.wait_ns.cmp(&a.wait_ns).then(a.tid.cmp(&b.tid)));
    let state = if split && total.iter().any(|ns| *ns > 0) {
        HolderState::of(&total)
    } else {
        HolderState::default()
    };
    (owners, state)
}

/// The `id` of a part that stands for the many small ones folded together
/// ([`fold_details`]); `u32::MAX` is `NO_STACK`.
pub const FOLDED: u32 = u32::MAX - 1;

/// Keeps at most `keep` parts of each kind per lock (most wait first) and
/// folds the others into one part of id [`FOLDED`]: hours of thread churn
/// would otherwise give one owner (or task) part per thread ever seen.
pub fn fold_details(details: &mut Details, keep: usize) {
    let mut groups: HashMap<(LockKey, u32), Vec<(DetailKey, u64)>> = HashMap::new();
    for (key, stats) in details.iter() {
        if key.id != FOLDED {
            groups
                .entry((key.lock, key.kind))
                .or_default()
                .push((*key, stats.wait_ns));
        }
    }
    for ((lock, kind), mut parts) in groups {
        if parts.len() <= keep {
            continue;
        }
        parts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let folded = DetailKey {
            lock,
            kind,
            id: FOLDED,
        };
        for (key, _) in parts.into_iter().skip(keep) {
            if let Some(stats) = details.remove(&key) {
                merge_detail(details.entry(folded).or_default(), &stats);
            }
        }
    }
}

/// Details grouped by lock (one pass over the drained map per report).
pub fn by_lock(details: &Details) -> HashMap<LockKey, Vec<(&DetailKey, &DetailStats)>> {
    let mut grouped: HashMap<LockKey, Vec<_>> = HashMap::new();
    for (key, stats) in details {
        grouped.entry(key.lock).or_default().push((key, &**stats));
    }
    grouped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(
        lock: LockKey,
        tid: u32,
        waits: u64,
        wait_ns: u64,
        split: [u64; 3],
    ) -> (DetailKey, Box<DetailStats>) {
        (
            DetailKey {
                lock,
                kind: detail::OWNER,
                id: tid,
            },
            Box::new(DetailStats {
                contentions: waits,
                wait_ns,
                wait_max_ns: wait_ns / waits.max(1),
                holder_ns: split,
                ..DetailStats::default()
            }),
        )
    }

    #[test]
    fn owners_come_busiest_first_with_their_states_summed() {
        let lock = LockKey { lock: 0x10, owner: 7 };
        let other = LockKey { lock: 0x20, owner: 7 };
        let details: Details = [
            owner(lock, 100, 2, 1_000, [100, 0, 900]),
            owner(lock, 200, 5, 9_000, [0, 9_000, 0]),
            owner(other, 300, 1, 50, [50, 0, 0]),
        ]
        .into_iter()
        .collect();
        let names: TaskNames = [(100, (99, "writer".to_owned()))].into_iter().collect();
        let grouped = by_lock(&details);
        let (owners, state) = owners_of(&lock, &grouped[&lock], &names, true);
        assert_eq!(owners.iter().map(|o| o.tid).collect::<Vec<_>>(), [200, 100]);
        assert_eq!(owners[1].label(), "writer(99/100)");
        assert_eq!(owners[0].label(), "tid 200");
        assert_eq!(
            (
                state.holder_on_cpu_ns,
                state.holder_runnable_ns,
                state.holder_sleeping_ns
            ),
            (Some(100), Some(9_000), Some(900))
        );
        assert_eq!(state.total_ns(), Some(10_000));
        assert_eq!(
            state.summary().as_deref(),
            Some("on-CPU 1 % / runnable 90 % / sleeping 9 %")
        );
        // Unwatched (no scheduler programs): owners, but no states.
        let (owners, state) = owners_of(&lock, &grouped[&lock], &names, false);
        assert_eq!(owners.len(), 2);
        assert_eq!(state, HolderState::default());
        assert_eq!(owners[0].holder.total_ns(), None);
    }

    #[test]
    fn many_small_owners_fold_into_one_part() {
        let lock = LockKey { lock: 1, owner: 1 };
        let mut details: Details = (1..=10)
            .map(|tid| owner(lock, tid, 1, u64::from(tid) * 100, [0; 3]))
            .collect();
        let before: u64 = details.values().map(|d| d.wait_ns).sum();
        fold_details(&mut details, 3);
        assert_eq!(details.len(), 4);
        let kept: Vec<u32> = {
            let mut ids: Vec<u32> = details.keys().map(|k| k.id).collect();
            ids.sort();
            ids
        };
        assert_eq!(kept, [8, 9, 10, FOLDED], "the three that caused most wait stay");
        assert_eq!(details.values().map(|d| d.wait_ns).sum::<u64>(), before);
        let folded = &details[&DetailKey {
            lock,
            kind: detail::OWNER,
            id: FOLDED,
        }];
        assert_eq!(folded.contentions, 7);
        fold_details(&mut details, 3);
        assert_eq!(details.len(), 4, "folding again changes nothing");
    }

    #[test]
    fn merged_details_add_and_keep_the_maximum() {
        let lock = LockKey { lock: 1, owner: 1 };
        let mut total = Details::new();
        let (key, a) = owner(lock, 5, 1, 10, [1, 2, 7]);
        let (_, b) = owner(lock, 5, 1, 30, [30, 0, 0]);
        merge_details(&mut total, &[(key, a)].into_iter().collect());
        merge_details(&mut total, &[(key, b)].into_iter().collect());
        let merged = &total[&key];
        assert_eq!(
            (merged.contentions, merged.wait_ns, merged.wait_max_ns),
            (2, 40, 30)
        );
        assert_eq!(merged.holder_ns, [31, 2, 7]);
    }
}
