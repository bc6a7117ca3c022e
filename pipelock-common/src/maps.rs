//! Map names in the eBPF object (the Rust static names of the maps).

/// `PerCpuArray<u64>` with one slot: `lock:contention_begin` events seen.
pub const CONTENTION_BEGIN_COUNT: &str = "CONTENTION_BEGIN_COUNT";
/// `PerCpuArray<u64>` with four slots: the self-test's interrupt-context
/// check (syscalls on/off a task stack, softirqs on/off one).
pub const INTERRUPT_CHECK: &str = "INTERRUPT_CHECK";
/// `Array<ThreadSlot<TaskWaits>>`, one slot per thread id modulo `TASK_SLOTS`
/// (tracepoint mode): contended acquisitions in progress.
pub const TASK_WAITS: &str = "TASK_WAITS";
/// `HashMap<LockKey, LockStats>`, twice: the programs add to the
/// one `STATS_SLOT` names while userspace drains the other.
pub const LOCK_STATS: [&str; 2] = ["LOCK_STATS_A", "LOCK_STATS_B"];
/// `PerCpuArray<CpuLocalStats>` with one slot, twice, switched and drained with
/// `LOCK_STATS`: each CPU's statistics of its hottest pipe locks
/// (tracepoint mode).
pub const CPU_LOCAL: [&str; 2] = ["CPU_LOCAL_A", "CPU_LOCAL_B"];
/// `PerCpuArray<CpuLocalDetails>` with one slot, twice, switched and drained
/// with `LOCK_DETAILS`: each CPU's figures of its busiest parts.
pub const CPU_DETAILS: [&str; 2] = ["CPU_DETAILS_A", "CPU_DETAILS_B"];
/// `Array<u32>` with one slot: which of `LOCK_STATS` the programs use.
pub const STATS_SLOT: &str = "STATS_SLOT";
/// `Array<ThreadSlot<TaskPipe>>`, one slot per thread id modulo `TASK_SLOTS` (hooked
/// modes): the pipe call a thread is in.
pub const TASK_PIPE: &str = "TASK_PIPE";
/// `LruHashMap<LockKey, LockInfo>`: what the lock belongs to.
pub const LOCK_INFO: &str = "LOCK_INFO";
/// `Array<u64>` with one slot: pipes freed since attach (hooked modes).
pub const PIPE_FREES: &str = "PIPE_FREES";
/// `HashMap<LockUser, [u8; 16]>`: processes (and their comm) seen on a lock.
pub const LOCK_USERS: &str = "LOCK_USERS";
/// `HashMap<u32 tid, TaskLockref>`: a lockref caller in progress.
pub const TASK_LOCKREF: &str = "TASK_LOCKREF";
/// `HashMap<u32 pid or tid, u32 task_filter bits>`: the tasks to record.
pub const TASK_FILTER: &str = "TASK_FILTER";
/// `PerCpuArray<u64>` indexed by [`crate::Drop`]: events not recorded, and why.
pub const DROPS: &str = "DROPS";
/// `HashMap<DetailKey, DetailStats>`, twice, drained like `LOCK_STATS`
/// (the same `STATS_SLOT`): a lock's figures by owner, caller or task.
pub const LOCK_DETAILS: [&str; 2] = ["LOCK_DETAILS_A", "LOCK_DETAILS_B"];
/// `HashMap<u64 task_struct, HolderClock>`: lock owners someone waits for.
pub const WATCHED: &str = "WATCHED";
/// `Array<u64>` with one slot: waits watching an owner, system-wide (0:
/// the scheduler programs return at once).
pub const WATCHERS: &str = "WATCHERS";
/// `LruHashMap<u32 tid, TaskName>`: owners' and waiters' names.
pub const TASK_NAMES: &str = "TASK_NAMES";
/// `StackTrace` (BTF map, [`crate::STACK_FRAMES`] frames): the kernel call
/// stacks of waits (`--callers`); never emptied, ids stay valid.
pub const STACKS: &str = "STACKS";
/// `HashMap<AskedKey, AskedTwice>`: tasks that asked for a mutex they own
/// (see [`crate::asked_twice`]); never emptied, a few entries at most.
pub const ASKED_TWICE: &str = "ASKED_TWICE";
