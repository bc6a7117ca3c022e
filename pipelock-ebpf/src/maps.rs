//! The maps and the global the programs share with userspace, and the
//! lookups into them (the statistics pair an interval names, created on
//! first use). Names are the ones in `pipelock_common::maps`.
use aya_ebpf::{
    bindings::BPF_NOEXIST,
    btf_maps::StackTrace,
    macros::{btf_map, map},
    maps::{Array, HashMap, LruHashMap},
};
use pipelock_common::{
    DetailKey, DetailStats, Drop, HolderClock, LockInfo, LockKey, LockStats, LockUser, STACK_FRAMES,
    TASK_SLOTS, TaskLockref, TaskName, TaskPipe, TaskWaits, ThreadSlot, TraceConfig,
    asked_twice::{AskedKey, AskedTwice},
};

use crate::{
    counters::{Atomic, MapValue},
    drops::count_drop,
};

/// Filled in by userspace at load time (`EbpfLoader::override_global`).
#[unsafe(no_mangle)]
pub(crate) static TRACE_CONFIG: TraceConfig = TraceConfig {
    kiocb_filp: 0,
    task_files: 0,
    files_fdt: 0,
    fdt_max_fds: 0,
    fdt_fd: 0,
    file_inode: 0,
    file_private_data: 0,
    inode_mode: 0,
    inode_ino: 0,
    pipe_rd_wait_lock: 0,
    pipe_wr_wait_lock: 0,
    regs_syscall_nr: 0,
    regs_arg0: 0,
    regs_arg1: 0,
    regs_arg2: 0,
    nr_read: 0,
    nr_write: 0,
    nr_readv: 0,
    nr_writev: 0,
    nr_splice: 0,
    nr_tee: 0,
    nr_vmsplice: 0,
    task_stack: 0,
    thread_size: 0,
    task_group_leader: 0,
    task_comm: 0,
    filter_tasks: 0,
    task_tgid: 0,
    class_mask: 0,
    path_dentry: 0,
    dentry_lockref: 0,
    dentry_name: 0,
    dentry_hash: 0,
    rq_lock: 0,
    rq_self: 0,
    rq_cpu: 0,
    mutex_wait_lock: 0,
    task_pi_lock: 0,
    task_pid: 0,
    mutex_owner: 0,
    task_on_cpu: 0,
    task_state: 0,
    details: 0,
    filter_comm_set: 0,
    filter_comm: [0; 16],
    runs_unpreempted: 0,
    btf_file: 0,
    btf_inode: 0,
    btf_kiocb: 0,
    btf_mutex: 0,
    btf_task: 0,
    btf_pt_regs: 0,
    stacks_exact: 0,
    stack_sample: 0,
};

/// Zeroed template for a lock's first per-CPU entry (too big for the stack).
pub(crate) static EMPTY_STATS: LockStats = LockStats::EMPTY;

/// Tracepoint mode: each thread's open waits, at `tid % TASK_SLOTS`. An
/// array slot, not a hash map keyed by (thread, lock): every
/// `contention_begin/end` of the system looks its thread up, and an array
/// lookup is inlined where a hash map (an LRU one, so that ends never seen
/// could not fill it) hashes, locks a bucket and, to insert, takes a node
/// off a shared list. A wait whose end was missed is replaced when the
/// thread needs its entry (`stale_pending`).
#[map]
pub(crate) static TASK_WAITS: Array<ThreadSlot<TaskWaits>> = Array::with_max_entries(TASK_SLOTS, 0);
/// Two statistics maps: the programs add to the one `STATS_SLOT`'s parity
/// names; userspace adds one to the slot (see [`interval`]), waits an RCU
/// grace period (no program still holds a pointer into the other map),
/// then reads and empties that one. A drained entry is never recycled
/// under a program writing to it.
///
/// One value per lock for all CPUs, not one per CPU: every counter is an
/// atomic add (which fentry programs need anyway, see `counters::Atomic`), and the
/// maps' memory does not grow with the CPU count (a per-CPU copy of these
/// ~1.1 KB values took 9 MB per CPU). Userspace sizes them (`--max-locks`).
#[map]
pub(crate) static LOCK_STATS_A: HashMap<LockKey, LockStats> = HashMap::with_max_entries(4096, 0);
#[map]
pub(crate) static LOCK_STATS_B: HashMap<LockKey, LockStats> = HashMap::with_max_entries(4096, 0);
#[map]
pub(crate) static STATS_SLOT: Array<u32> = Array::with_max_entries(1, 0);
/// A lock's figures by owner, caller or task; swapped and drained with the
/// statistics (same slot), sized by userspace.
#[map]
pub(crate) static LOCK_DETAILS_A: HashMap<DetailKey, DetailStats> = HashMap::with_max_entries(16384, 0);
#[map]
pub(crate) static LOCK_DETAILS_B: HashMap<DetailKey, DetailStats> = HashMap::with_max_entries(16384, 0);
/// Lock owners that waiters wait for, by `task_struct` (see `probes::holder`).
#[map]
pub(crate) static WATCHED: HashMap<u64, HolderClock> = HashMap::with_max_entries(16384, 0);
/// Waits watching an owner, system-wide: while 0 the scheduler programs
/// (which run on every context switch) return before any lookup.
#[map]
pub(crate) static WATCHERS: Array<u64> = Array::with_max_entries(1, 0);
/// Call stacks of waits (`--callers`): a few dozen distinct ones on a
/// pipe-heavy system, so the map is never emptied and ids stay valid;
/// userspace sizes it (`--stack-map-size`).
#[btf_map]
pub(crate) static STACKS: StackTrace<4096, 0, STACK_FRAMES> = StackTrace::new();
/// Tasks that asked for a mutex they own (`probes::asked_twice`); never
/// emptied: a deadlocked thread stays deadlocked.
#[map]
pub(crate) static ASKED_TWICE: HashMap<AskedKey, AskedTwice> = HashMap::with_max_entries(64, 0);
/// Names of owners and waiters, by thread id (LRU: threads come and go).
#[map]
pub(crate) static TASK_NAMES: LruHashMap<u32, TaskName> = LruHashMap::with_max_entries(16384, 0);
/// LRU: on a busy system lock instances come and go by the thousand; the
/// oldest identities make room (userspace keeps what it has read).
#[map]
pub(crate) static LOCK_INFO: LruHashMap<LockKey, LockInfo> = LruHashMap::with_max_entries(16384, 0);
/// Pipes freed since attach (hooked modes): a thread that knows a pipe by
/// its address checks its identity again once any pipe has been freed.
#[map]
pub(crate) static PIPE_FREES: Array<u64> = Array::with_max_entries(1, 0);
#[map]
pub(crate) static LOCK_USERS: HashMap<LockUser, [u8; 16]> = HashMap::with_max_entries(8192, 0);
/// The tasks to record, by process or thread id ([`task_filter`] bits);
/// children of a `FOLLOW` process are added as they are forked.
#[map]
pub(crate) static TASK_FILTER: HashMap<u32, u32> = HashMap::with_max_entries(16384, 0);
/// Per-thread pipe-call state, thread `tid` at slot `tid % TASK_SLOTS`
/// (kept between calls, `pipe` 0 while outside one). An array, not a hash
/// map keyed by thread id: every mutex and spinlock hook of the system
/// looks its thread up here, and an array lookup is a few inlined
/// instructions where a hash lookup hashes the key and walks a bucket. Two
/// threads whose ids share a slot cannot both be inside pipe calls: the
/// second call is not traced and counted (`slot_busy`).
#[map]
pub(crate) static TASK_PIPE: Array<ThreadSlot<TaskPipe>> = Array::with_max_entries(TASK_SLOTS, 0);

/// One entry per thread, kept between calls (`depth` 0 outside a caller):
/// `dput` runs on every path walk, and a lookup is much cheaper than an
/// insert and a delete. LRU so threads that are gone make room.
#[map]
pub(crate) static TASK_LOCKREF: LruHashMap<u32, TaskLockref> = LruHashMap::with_max_entries(16384, 0);

/// The collection interval: userspace adds one to `STATS_SLOT` at each
/// drain, and its parity picks the statistics maps the programs write.
/// "Already recorded" caches hold for one interval. Userspace drains the
/// identity maps every interval and keeps what it read, but it forgets the
/// identities of locks it retires and names nobody refers to any more, so
/// a cache entry that outlived its interval could leave a lock or a thread
/// unnamed for good.
#[inline(always)]
pub(crate) fn interval() -> u32 {
    STATS_SLOT.get(0).copied().unwrap_or(0)
}

/// The configuration, read in place: a copy would take a third of the
/// 512-byte stack and cost a copy per run.
#[inline(always)]
pub(crate) fn config() -> &'static TraceConfig {
    let at: *const TraceConfig = &TRACE_CONFIG;
    // SAFETY: a plain global. The volatile read of its address hides from
    // the compiler where the fields are read, so it cannot fold the zero
    // initialiser that userspace overrides at load.
    unsafe { &*core::ptr::read_volatile(&at) }
}

/// How many pipes have been freed since attach.
#[inline(always)]
pub(crate) fn pipe_frees() -> u64 {
    PIPE_FREES.get(0).copied().unwrap_or(0)
}

/// `with(map)` on the map of a pair (`even`, `odd`) that the interval's
/// parity names, the call inlined once for each map. A map helper on a map
/// the verifier knows is rewritten to the map's own lookup: a few inlined
/// instructions for an array, a direct call for a hash map. On a map picked
/// at run time it stays `bpf_map_lookup_elem`, whose call through the map's
/// ops is an indirect call (a retpoline here) with its return thunks.
#[inline(always)]
pub(crate) fn in_interval_map<M, R>(odd_interval: bool, even: &M, odd: &M, with: impl Fn(&M) -> R) -> R {
    if odd_interval {
        let result = with(odd);
        // Distinct markers (one no-op jump, two): the compiler would
        // otherwise merge the two calls into one on a map pointer it
        // selects, which undoes the point. (A comment alone would leave a
        // line-info entry without an instruction, which the kernel refuses;
        // the verifier drops the no-ops.)
        // SAFETY: jumps to the next instruction.
        unsafe { core::arch::asm!("goto +0", options(nomem, nostack, preserves_flags)) };
        result
    } else {
        let result = with(even);
        // SAFETY: as above.
        unsafe { core::arch::asm!("goto +0", "goto +0", options(nomem, nostack, preserves_flags)) };
        result
    }
}

/// `key`'s value in the map of the pair (`even`, `odd`) the interval
/// names, inserted as `empty` on first use (another CPU may insert it
/// meanwhile; only a full map counts as `full`).
#[inline(always)]
fn entry_in_interval_map<K, V>(
    even: &HashMap<K, V>,
    odd: &HashMap<K, V>,
    key: &K,
    empty: &V,
    full: Drop,
) -> Option<*mut V> {
    let odd_interval = interval() % 2 != 0;
    if let Some(value) = in_interval_map(odd_interval, even, odd, |map| map.get_ptr_mut(key)) {
        return Some(value);
    }
    let map = if odd_interval { odd } else { even };
    let _ = map.insert(key, empty, BPF_NOEXIST as u64);
    let value = map.get_ptr_mut(key);
    if value.is_none() {
        count_drop(full);
    }
    value
}

/// The statistics of a lock, created empty on first use; every CPU
/// updates them.
#[inline(always)]
pub(crate) fn stats_of(key: &LockKey) -> Option<MapValue<LockStats, Atomic>> {
    let at = entry_in_interval_map(&LOCK_STATS_A, &LOCK_STATS_B, key, &EMPTY_STATS, Drop::StatsFull)?;
    // SAFETY: a live value of a hash map every CPU writes: atomic adds.
    Some(unsafe { MapValue::new(at) })
}

/// A lock's part (by owner, caller or task), created empty on first use;
/// every CPU updates it.
#[inline(always)]
pub(crate) fn detail_of(key: &DetailKey) -> Option<MapValue<DetailStats, Atomic>> {
    let at = entry_in_interval_map(
        &LOCK_DETAILS_A,
        &LOCK_DETAILS_B,
        key,
        &DetailStats::default(),
        Drop::DetailFull,
    )?;
    // SAFETY: as in `stats_of`.
    Some(unsafe { MapValue::new(at) })
}
