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
    /// By caller: what the variances of the estimates above are made of,
    /// summed over the records of sampled stacks ([`sampling`]).
    pub sampled: [u64; sampling::FIELDS],
}

/// Sampled call stacks. Unwinding a kernel stack costs ten times the rest
/// of a `contention_begin`, so under heavy contention a CPU unwinds only
/// some: every one up to `TraceConfig::stacks_exact` an interval, then
/// each with probability 1/w (`TraceConfig::stack_sample`). Waits are
/// heavy-tailed, and a rare long wait left out would take its share of the
/// wait total with it: in tracepoint mode a wait of [`sampling::LONG_WAIT_NS`]
/// or more is always recorded, its stack unwound at `contention_end` if the
/// begin left it out. A record taken with probability 1/w counts w times in
/// its part's counts and totals, and the part also keeps its sampled
/// records' own sums (and sums of squares, for the margins): userspace
/// takes the exactly recorded figures out, and shares what the lock's own
/// exact figures leave over among the parts in proportion to their
/// sampled records (`model::callers`), so that no part claims more than
/// its lock had.
pub mod sampling {
    /// `DetailStats::sampled[RECORDS]`: records of sampled stacks.
    pub const RECORDS: usize = 0;
    /// Of them, contended acquisitions.
    pub const CONTENDED: usize = 1;
    /// Σ (wait_ns >> SQUARE_SHIFT)², Σ (hold_ns >> SQUARE_SHIFT)²: in
    /// units of 32 ns, fine for the sub-microsecond waits that are sampled
    /// (longer ones are not, in tracepoint mode), and a hold of a second
    /// (hooked modes) squares to 10^15.
    pub const WAIT_SQUARES: usize = 2;
    pub const HOLD_SQUARES: usize = 3;
    /// Σ wait_ns, Σ hold_ns of the sampled records, unweighted: how the
    /// part's totals split into what was recorded exactly and what was
    /// sampled.
    pub const WAIT_SUM: usize = 4;
    pub const HOLD_SUM: usize = 5;
    pub const FIELDS: usize = 6;
    pub const SQUARE_SHIFT: u32 = 5;

    /// Tracepoint mode: waits this long are never sampled.
    pub const LONG_WAIT_NS: u64 = 10_000;

    /// A stack id's flag: the stack was taken at random, one in
    /// `stack_sample` (ids are below the stack map's size, ≤ 2^18).
    pub const SAMPLED: u32 = 1 << 31;
    /// The stack id of a wait left out of the sample (its lock's own
    /// figures count it; no caller row does).
    pub const LEFT_OUT: u32 = super::NO_STACK - 1;

    /// Stacks a CPU unwinds per interval before it samples, and the
    /// default `stack_sample`: 1024 unwinds cost about 2.5 ms of a CPU's
    /// second, so tracing that is not under heavy contention stays exact.
    pub const EXACT_PER_INTERVAL: u32 = 1024;
    pub const DEFAULT_SAMPLE: u32 = 32;

    /// `(stack id, weight)` of a recorded id (None: left out).
    #[inline(always)]
    pub fn weighed(id: u32, sample: u32) -> Option<(u32, u64)> {
        match id {
            LEFT_OUT => None,
            super::NO_STACK => Some((id, 1)),
            _ if id & SAMPLED != 0 => Some((id & !SAMPLED, u64::from(sample.max(1)))),
            _ => Some((id, 1)),
        }
    }

    /// The squared figure a sampled record adds to its variance sums (in
    /// units of 2^SQUARE_SHIFT ns, rounded to the nearest).
    #[inline(always)]
    pub fn square(ns: u64) -> u64 {
        // (No `saturating_mul`: its 128-bit product is no BPF instruction.)
        let units = ns.saturating_add(1 << (SQUARE_SHIFT - 1)) >> SQUARE_SHIFT;
        if units > u64::from(u32::MAX) {
            u64::MAX
        } else {
            units * units
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_sampled_id_weighs_the_sample_and_keeps_its_stack() {
            assert_eq!(weighed(7 | SAMPLED, 32), Some((7, 32)));
            assert_eq!(weighed(7, 32), Some((7, 1)));
            assert_eq!(weighed(LEFT_OUT, 32), None);
            assert_eq!(
                weighed(super::super::NO_STACK, 32),
                Some((super::super::NO_STACK, 1))
            );
        }

        #[test]
        fn squares_are_in_32_ns_units_and_saturate() {
            assert_eq!(square(64), 4);
            assert_eq!(square(15), 0);
            assert_eq!(square(16), 1);
            assert_eq!(square(u64::MAX), u64::MAX);
        }
    }
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
