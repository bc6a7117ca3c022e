//! Why a wait happened: its owner and what the owner was doing, its call
//! stack, its thread. The kernel side records them as parts of a lock's
//! figures ([`DetailKey`]); userspace reads them back the same way.
use crate::LockKey;

/// What a lock's owner was doing while a waiter waited for it.
pub mod holder {
    /// Running on a CPU: the critical section's own work.
    pub const ON_CPU: usize = 0;
    /// Runnable, not running: preempted (lock-holder preemption).
    pub const RUNNABLE: usize = 1;
    /// Sleeping with the lock held (a page fault, reclaim, I/O).
    pub const SLEEPING: usize = 2;
    pub const STATES: usize = 3;

    /// A mutex owner's states over a contended wait of `ns`, of which the
    /// owner was watched (`since_sleep`, all 0 if never) only from the
    /// waiter's first sleep on: before it the waiter spun, which the kernel
    /// does only while the owner runs (`mutex_spin_on_owner` stops when
    /// `owner_on_cpu` fails), so the rest of the wait is time on a CPU.
    #[inline(always)]
    pub fn with_spin(mut since_sleep: [u64; STATES], ns: u64) -> [u64; STATES] {
        let watched = since_sleep
            .iter()
            .fold(0u64, |sum, part| sum.saturating_add(*part));
        since_sleep[ON_CPU] = since_sleep[ON_CPU].saturating_add(ns.saturating_sub(watched));
        since_sleep
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_wait_that_only_spun_is_the_owners_time_on_a_cpu() {
            assert_eq!(with_spin([0; STATES], 700), [700, 0, 0]);
        }

        #[test]
        fn the_spin_before_a_sleep_is_added_to_the_watched_clock() {
            // 50 ms asleep behind a sleeping owner, after 2 us of spinning.
            assert_eq!(with_spin([0, 0, 50_000_000], 50_002_000), [2_000, 0, 50_000_000]);
            assert_eq!(with_spin([10, 20, 30], 100), [50, 20, 30]);
        }

        #[test]
        fn a_clock_read_past_the_wait_adds_nothing() {
            // The clock's parts are read without a lock: they may sum past the wait.
            assert_eq!(with_spin([80, 40, 0], 100), [80, 40, 0]);
        }
    }
}

/// A watched lock owner's time in each [`holder`] state, kept by the
/// scheduler tracepoints while at least one waiter waits for it (`WATCHED`,
/// keyed by its `task_struct`). A waiter takes the clock when it starts
/// waiting and again when it stops: the difference splits its wait.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HolderClock {
    /// Waits watching this task (the entry goes when the last ends).
    pub waiters: u64,
    pub state: u32,
    pub _pad: u32,
    /// When it entered `state`.
    pub since_ns: u64,
    /// Time in each state before `since_ns`, since the entry was made.
    pub total_ns: [u64; holder::STATES],
}

impl HolderClock {
    /// Time in each state up to `now`.
    #[inline(always)]
    pub fn at(&self, now: u64) -> [u64; holder::STATES] {
        let mut times = self.total_ns;
        if let Some(current) = times.get_mut(self.state as usize) {
            *current += now.saturating_sub(self.since_ns);
        }
        times
    }
}

/// What a [`DetailKey`] breaks one lock's figures down by.
pub mod detail {
    /// `id`: the thread that owned the mutex when a waiter began waiting
    /// (0: it could not be read; the lock was being handed over).
    pub const OWNER: u32 = 0;
    /// `id`: the waiter's kernel call stack (its id in `STACKS`).
    pub const CALLER: u32 = 1;
    /// `id`: the waiting (hooked modes: acquiring) thread.
    pub const TASK: u32 = 2;
    /// `id` 0: the mutex's holds (hooked modes, `--hold-states`), with
    /// what the holder itself was doing while it held the lock.
    pub const HOLD: u32 = 3;
}

/// One part of a lock's figures: by owner, by caller or by task.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DetailKey {
    pub lock: LockKey,
    pub kind: u32,
    pub id: u32,
}

/// A part's figures (atomic adds, like [`crate::LockStats`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DetailStats {
    /// Every acquisition (hooked modes; 0 in tracepoint mode).
    pub acquisitions: u64,
    pub contentions: u64,
    pub wait_ns: u64,
    pub wait_max_ns: u64,
    pub hold_ns: u64,
    /// By owner: of `wait_ns`, the time the owner was in each [`holder`]
    /// state (0 for every state where it was not watched).
    pub holder_ns: [u64; holder::STATES],
}

/// A thread's names, for owner and per-task rows (`TASK_NAMES`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskName {
    pub tgid: u32,
    pub _pad: u32,
    pub comm: [u8; 16],
}

/// A stack id that names no stack (not recorded, or lost).
pub const NO_STACK: u32 = u32::MAX;

/// Frames `STACKS` keeps per call stack: the tracing and locking frames
/// at its top, then the callers (`--stack-depth` of them are shown).
pub const STACK_FRAMES: usize = 32;
