//! Events the programs saw but could not record, by reason: counted, never
//! dropped silently.

/// Why an event was not recorded; indexes the `DROPS` per-CPU array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drop {
    /// `TASK_LOCKREF` was full: a lockref call went untimed.
    PendingFull = 0,
    /// `LOCK_STATS` was full: a new lock could not be added.
    StatsFull = 1,
    /// A spinlock's `contention_begin` found the thread still waiting for
    /// that lock, or a thread had [`crate::OPEN_WAITS`] waits open and began
    /// another: a wait's end was never seen (it fired inside another BPF
    /// program), so that wait is lost (the oldest, for a full slot).
    StalePending = 2,
    /// `LOCK_USERS` was full: a process on a lock was not recorded.
    UsersFull = 3,
    /// `TASK_FILTER` was full: a child of the traced command is not followed.
    FollowFull = 4,
    /// Tracepoint mode: a contention inside a pipe call's syscall that ran
    /// in interrupt context (on an interrupt stack): not that call's, so
    /// not recorded.
    InInterrupt = 5,
    /// Hooked modes: a pipe call found its thread's slot in `TASK_PIPE`
    /// (indexed by thread id modulo [`crate::TASK_SLOTS`]) held by another thread
    /// inside a pipe call: the call was not traced. Tracepoint mode: a
    /// thread took over a `TASK_WAITS` slot in which another thread had a
    /// wait open: that wait is lost. Both: a program found its thread's
    /// slot taken by another thread's program running at that moment (see
    /// [`crate::ThreadSlot`]): the event was not recorded.
    SlotBusy = 6,
    /// `DETAIL_A/B` were full: a part of a lock's figures (by owner, caller
    /// or task) was not recorded (the lock's own figures were).
    DetailFull = 7,
    /// `WATCHED` was full: a waiter's wait was not split by what the
    /// owner was doing.
    WatchFull = 8,
    /// A call stack could not be stored (`STACKS` full, or a hash
    /// collision there): that wait's caller is unknown.
    StackLost = 9,
    /// `ASKED_TWICE` was full: a task that asked for a mutex it owns was
    /// not named (the others were).
    AskedTwiceFull = 10,
}

impl Drop {
    pub const COUNT: u32 = 11;
    pub const ALL: [Self; 11] = [
        Self::PendingFull,
        Self::StatsFull,
        Self::StalePending,
        Self::UsersFull,
        Self::FollowFull,
        Self::InInterrupt,
        Self::SlotBusy,
        Self::DetailFull,
        Self::WatchFull,
        Self::StackLost,
        Self::AskedTwiceFull,
    ];

    /// How the report names it.
    pub fn name(self) -> &'static str {
        match self {
            Self::PendingFull => "pending_full",
            Self::StatsFull => "stats_full",
            Self::StalePending => "stale_pending",
            Self::UsersFull => "users_full",
            Self::FollowFull => "follow_full",
            Self::InInterrupt => "in_interrupt",
            Self::SlotBusy => "slot_busy",
            Self::DetailFull => "detail_full",
            Self::WatchFull => "watch_full",
            Self::StackLost => "stack_lost",
            Self::AskedTwiceFull => "asked_twice_full",
        }
    }
}
