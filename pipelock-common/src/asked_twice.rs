//! A task that asks for a mutex it already owns: a deadlock in progress.
//!
//! `lock:contention_begin` runs on every contended mutex acquisition, and a
//! mutex its caller owns is always contended, so one compare of the owner
//! word there sees every such ask, in every attach mode, at no cost to an
//! uncontended acquisition.

/// `MUTEX_FLAG_PICKUP` in a mutex's owner word: the releaser has handed the
/// mutex to the task the word names, which is about to take it (a waiter
/// woken for a hand-off can begin again before it picks the mutex up).
pub const MUTEX_FLAG_PICKUP: u64 = 0x04;

/// The low bits of the owner word that are flags, not the task.
pub const MUTEX_FLAGS: u64 = 0x07;

/// Whether `owner_word` (a `struct mutex`'s `owner`) says that `task` (a
/// `task_struct` address) owns the mutex it now asks for.
#[inline(always)]
pub fn asks_twice(owner_word: u64, task: u64) -> bool {
    task != 0 && owner_word & !MUTEX_FLAGS == task && owner_word & MUTEX_FLAG_PICKUP == 0
}

/// `ASKED_TWICE`'s key: one entry per thread and mutex (the thread sleeps
/// on it for good, and may begin again at each spurious wake-up).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AskedKey {
    pub pid_tgid: u64,
    pub lock: u64,
}

/// What the kernel side knows at the ask.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AskedTwice {
    /// `bpf_ktime_get_ns` at the first ask.
    pub at_ns: u64,
    /// The pipe the lock is the mutex of, where the task's syscall names it
    /// by its first argument (0: not known to be a pipe's).
    pub pipe: u64,
    /// That pipe's inode number.
    pub ino: u64,
    /// The kernel stack where the task asked again (`NO_STACK`: lost).
    pub stack_id: u32,
    /// The syscall the task is in (`-1`: none).
    pub syscall: i32,
    pub comm: [u8; 16],
}

#[cfg(test)]
mod tests {
    use super::*;

    const TASK: u64 = 0xffff_8880_0123_4500;

    #[test]
    fn only_the_owner_without_a_hand_off_asks_twice() {
        assert!(asks_twice(TASK, TASK));
        // A waiter: the mutex has waiters and a hand-off asked for.
        assert!(asks_twice(TASK | 0x1 | 0x2, TASK));
        // Handed to this task, which has not picked it up yet.
        assert!(!asks_twice(TASK | MUTEX_FLAG_PICKUP, TASK));
        assert!(!asks_twice(TASK | MUTEX_FLAG_PICKUP | 0x1, TASK));
        // Another owner, no owner.
        assert!(!asks_twice(TASK + 0x1000, TASK));
        assert!(!asks_twice(0, TASK));
        assert!(!asks_twice(0, 0));
    }
}
