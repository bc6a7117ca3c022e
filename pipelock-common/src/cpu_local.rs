//! Tracepoint mode: each CPU's own statistics of the locks and parts its
//! waits end on most, updated with plain adds instead of atomic adds on a
//! value every CPU writes. On a herd every wait of the hot mutex bounced
//! its `LockStats` and owner row between CPUs. A wait the local table has no
//! room for goes to the shared maps; userspace merges each CPU's local table
//! into the interval's figures and empties it when it drains.
//!
//! A few KB per CPU (per interval parity): the memory bound holds, the
//! cold locks stay in the shared maps.
use crate::{DetailKey, DetailStats, LockKey, LockStats};

/// Locks a CPU's [`CpuLocalStats`] holds: the first pipe locks whose waits end on
/// that CPU in an interval (a herd has one pipe, three locks).
pub const CPU_LOCAL_LOCKS: usize = 4;

/// A CPU's own statistics of a few pipe locks. A key whose `lock` is 0 is
/// a free entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuLocalStats {
    pub keys: [LockKey; CPU_LOCAL_LOCKS],
    pub stats: [LockStats; CPU_LOCAL_LOCKS],
}

impl CpuLocalStats {
    pub const EMPTY: Self = Self {
        keys: [LockKey { lock: 0, owner: 0 }; CPU_LOCAL_LOCKS],
        stats: [LockStats::EMPTY; CPU_LOCAL_LOCKS],
    };

    /// The statistics of the locks this table holds.
    pub fn entries(&self) -> impl Iterator<Item = (&LockKey, &LockStats)> {
        self.keys.iter().zip(&self.stats).filter(|(key, _)| key.lock != 0)
    }
}

/// Parts (a lock's owner, caller or task rows) a CPU's [`CpuLocalDetails`]
/// holds: a herd's mutex has one owner row per process.
pub const CPU_LOCAL_PARTS: usize = 128;

/// A CPU's own figures of the parts its waits end on, two-way
/// set-associative: a part goes to one of the two entries its key hashes
/// to ([`CpuLocalDetails::sets`]), or to the shared map if both hold others.
/// A key whose `lock.lock` is 0 is a free entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuLocalDetails {
    pub keys: [DetailKey; CPU_LOCAL_PARTS],
    pub stats: [DetailStats; CPU_LOCAL_PARTS],
}

impl CpuLocalDetails {
    pub const EMPTY: Self = Self {
        keys: [DetailKey {
            lock: LockKey { lock: 0, owner: 0 },
            kind: 0,
            id: 0,
        }; CPU_LOCAL_PARTS],
        stats: [DetailStats {
            acquisitions: 0,
            contentions: 0,
            wait_ns: 0,
            wait_max_ns: 0,
            hold_ns: 0,
            holder_ns: [0; crate::holder::STATES],
            sampled: [0; crate::sampling::FIELDS],
        }; CPU_LOCAL_PARTS],
    };

    /// The first of the two entries `key` may take (the other is this one
    /// with its lowest bit flipped): a multiplicative hash of the lock, its
    /// owner and the part, whose top bits spread a lock's owner rows.
    #[inline(always)]
    pub fn sets(key: &DetailKey) -> usize {
        let mixed =
            key.lock.lock ^ key.lock.owner.rotate_left(29) ^ (u64::from(key.kind) << 32 | u64::from(key.id));
        (mixed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - CPU_LOCAL_PARTS.trailing_zeros())) as usize
    }

    /// The figures of the parts this table holds.
    pub fn entries(&self) -> impl Iterator<Item = (&DetailKey, &DetailStats)> {
        self.keys
            .iter()
            .zip(&self.stats)
            .filter(|(key, _)| key.lock.lock != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_locks_owner_rows_spread_over_the_sets() {
        let lock = LockKey {
            lock: 0xffff_8881_0a2b_3c00,
            owner: 1_751_873,
        };
        let mut used = [0u32; CPU_LOCAL_PARTS];
        for tid in 14_689..14_689 + 64 {
            let set = CpuLocalDetails::sets(&DetailKey {
                lock,
                kind: crate::detail::OWNER,
                id: tid,
            });
            assert!(set < CPU_LOCAL_PARTS);
            used[set] += 1;
        }
        // Two ways per set: a part goes to the shared map only where three
        // or more land on one pair of entries.
        let pairs = (0..CPU_LOCAL_PARTS / 2).map(|p| used[2 * p] + used[2 * p + 1]);
        let overflow: u32 = pairs.map(|n| n.saturating_sub(2)).sum();
        assert!(
            overflow <= 12,
            "{overflow} of 64 owner rows find no entry: {used:?}"
        );
    }

    #[test]
    fn only_taken_entries_are_read_back() {
        let mut table = CpuLocalStats::EMPTY;
        table.keys[2] = LockKey { lock: 7, owner: 1 };
        table.stats[2].slept = 3;
        let mut entries = table.entries();
        let (key, stats) = entries.next().unwrap();
        assert_eq!((key.lock, stats.slept), (7, 3));
        assert!(entries.next().is_none());
        assert_eq!(CpuLocalDetails::EMPTY.entries().count(), 0);
    }
}
