//! Tracepoint mode: wait times of contended pipe locks from
//! `lock:contention_begin/end`, for kernels where neither fentry nor kprobes
//! work. Pipe locks are recognised only on the contended path, where the
//! event already costs a sleep or a spin: the waiting task's user registers
//! give the syscall and its fd, the fd gives the file, a FIFO inode says
//! it is a pipe, and `private_data` is the `pipe_inode_info` whose mutex
//! (offset 0) and wait-queue locks the address is compared against.
use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task, bpf_get_current_task_btf,
        bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_task_pt_regs,
    },
    macros::{btf_tracepoint, map, tracepoint},
    maps::{HashMap, PerCpuArray, PerCpuHashMap},
    programs::{BtfTracePointContext, TracePointContext},
};
use pipelock_common::{
    Drop, LCB_F_SPIN, LockInfo, LockStats, LockUser, Pending, TraceConfig, class, hist_bucket,
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
    nr_read: 0,
    nr_write: 0,
    nr_readv: 0,
    nr_writev: 0,
    filter_tgid: 0,
    class_mask: 0,
    path_dentry: 0,
    dentry_lockref: 0,
    dentry_name: 0,
    filter_comm_set: 0,
    filter_comm: [0; 16],
};

/// Zeroed template for a lock's first per-CPU entry (too big for the stack).
pub(crate) static EMPTY_STATS: LockStats = LockStats::EMPTY;

#[map]
static PENDING: HashMap<u32, Pending> = HashMap::with_max_entries(16384, 0);
#[map]
pub(crate) static LOCK_STATS: PerCpuHashMap<u64, LockStats> = PerCpuHashMap::with_max_entries(4096, 0);
#[map]
pub(crate) static LOCK_INFO: HashMap<u64, LockInfo> = HashMap::with_max_entries(4096, 0);
#[map]
pub(crate) static LOCK_USERS: HashMap<LockUser, [u8; 16]> = HashMap::with_max_entries(8192, 0);
#[map]
pub(crate) static DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Drop::COUNT, 0);

const S_IFMT: u16 = 0o170000;
const S_IFIFO: u16 = 0o010000;

#[inline(always)]
pub(crate) fn config() -> TraceConfig {
    // SAFETY: a plain global; the volatile read keeps the compiler from
    // folding the zero initialiser userspace overrides.
    unsafe { core::ptr::read_volatile(&TRACE_CONFIG) }
}

/// The `-p`/`-c` filters: whether the current task is one to record.
#[inline(always)]
pub(crate) fn wanted(cfg: &TraceConfig, tgid: u32) -> bool {
    if cfg.filter_tgid != 0 && cfg.filter_tgid != tgid {
        return false;
    }
    cfg.filter_comm_set == 0 || bpf_get_current_comm().is_ok_and(|comm| comm == cfg.filter_comm)
}

#[inline(always)]
pub(crate) fn count_drop(reason: Drop) {
    if let Some(slot) = DROPS.get_ptr_mut(reason as u32) {
        // SAFETY: this CPU's slot; tracing programs do not preempt each other on a CPU.
        unsafe { *slot += 1 };
    }
}

#[inline(always)]
pub(crate) fn read<T>(address: u64) -> Option<T> {
    // SAFETY: bpf_probe_read_kernel checks the address and fails cleanly.
    unsafe { bpf_probe_read_kernel(address as *const T).ok() }
}

/// (class, pipe, inode number) if `lock` belongs to, or is contended inside,
/// a read/write syscall on a pipe by the current task.
#[inline(always)]
fn classify(cfg: &TraceConfig, lock: u64) -> Option<(u32, u64, u64)> {
    // SAFETY: helpers without preconditions; the result is only read through
    // bpf_probe_read_kernel.
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as u64;
    let nr = read::<u64>(regs + cfg.regs_syscall_nr as u64)? as u32;
    if nr != cfg.nr_read && nr != cfg.nr_write && nr != cfg.nr_readv && nr != cfg.nr_writev {
        return None;
    }
    let fd = read::<u64>(regs + cfg.regs_arg0 as u64)? as u32 as u64;
    // SAFETY: no preconditions; used as an address for probe reads only.
    let task = unsafe { bpf_get_current_task() };
    let files = read::<u64>(task + cfg.task_files as u64)?;
    let fdt = read::<u64>(files + cfg.files_fdt as u64)?;
    let max_fds = read::<u32>(fdt + cfg.fdt_max_fds as u64)? as u64;
    if fd >= max_fds {
        return None;
    }
    let fd_array = read::<u64>(fdt + cfg.fdt_fd as u64)?;
    let file = read::<u64>(fd_array + fd * 8)?;
    let inode = read::<u64>(file + cfg.file_inode as u64)?;
    let mode = read::<u16>(inode + cfg.inode_mode as u64)?;
    if mode & S_IFMT != S_IFIFO {
        return None;
    }
    let pipe = read::<u64>(file + cfg.file_private_data as u64)?;
    let class = if lock == pipe {
        class::PIPE_MUTEX
    } else if lock == pipe + cfg.pipe_rd_wait_lock as u64 {
        class::PIPE_RD_WAIT
    } else if lock == pipe + cfg.pipe_wr_wait_lock as u64 {
        class::PIPE_WR_WAIT
    } else {
        class::OTHER_IN_PIPE_CALL
    };
    let ino = read::<u64>(inode + cfg.inode_ino as u64).unwrap_or(0);
    Some((class, pipe, ino))
}

#[inline(always)]
fn on_begin(lock: u64, flags: u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    // One mutex acquisition can emit several begins (spin, then sleep, then
    // again after each wake-up) but exactly one end: keep the first.
    if let Some(pending) = PENDING.get_ptr_mut(tid) {
        // SAFETY: a value of this map; only this task updates its entry.
        unsafe {
            if (*pending).lock == lock {
                (*pending).flags_or |= flags;
                (*pending).flags_and &= flags;
            } else {
                count_drop(Drop::Nested);
            }
        }
        return;
    }
    let cfg = config();
    let tgid = (pid_tgid >> 32) as u32;
    if !wanted(&cfg, tgid) {
        return;
    }
    let Some((class, pipe, ino)) = classify(&cfg, lock) else {
        return;
    };
    if cfg.class_mask & (1 << class) == 0 {
        return;
    }
    let pending = Pending {
        lock,
        start_ns: unsafe { bpf_ktime_get_ns() },
        class,
        flags_or: flags,
        flags_and: flags,
        _pad: 0,
    };
    if PENDING.insert(tid, pending, 0).is_err() {
        count_drop(Drop::PendingFull);
        return;
    }
    let info = LockInfo {
        pipe,
        ino,
        class,
        _pad: 0,
        name: [0; 32],
    };
    let _ = LOCK_INFO.insert(lock, info, BPF_NOEXIST as u64);
    note_user(lock, tgid);
}

#[inline(always)]
fn on_end(lock: u64) {
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: a value of this map, copied out before removal.
    let Some(pending) = (unsafe { PENDING.get(tid) }).copied() else {
        return;
    };
    if pending.lock != lock {
        count_drop(Drop::UnmatchedEnd);
        return;
    }
    let _ = PENDING.remove(tid);
    // SAFETY: no preconditions.
    let wait = unsafe { bpf_ktime_get_ns() }.saturating_sub(pending.start_ns);
    let stats = match LOCK_STATS.get_ptr_mut(lock) {
        Some(stats) => stats,
        None => {
            if LOCK_STATS
                .insert(&lock, &EMPTY_STATS, BPF_NOEXIST as u64)
                .is_err()
            {
                // Another CPU may have inserted it meanwhile; only a full map is a drop.
                if LOCK_STATS.get_ptr_mut(lock).is_none() {
                    count_drop(Drop::StatsFull);
                    return;
                }
            }
            match LOCK_STATS.get_ptr_mut(lock) {
                Some(stats) => stats,
                None => return,
            }
        }
    };
    // SAFETY: this CPU's copy of the value; not shared with other CPUs.
    unsafe {
        (*stats).contentions += 1;
        if pending.flags_and & LCB_F_SPIN != 0 {
            (*stats).spin_only += 1;
        }
        record(&mut (*stats).wait, wait);
    }
}

/// This CPU's statistics of `lock`, created empty on first use.
#[inline(always)]
pub(crate) fn stats_of(lock: u64) -> Option<*mut LockStats> {
    if let Some(stats) = LOCK_STATS.get_ptr_mut(lock) {
        return Some(stats);
    }
    // Another CPU may insert it meanwhile; only a full map is a drop.
    let _ = LOCK_STATS.insert(&lock, &EMPTY_STATS, BPF_NOEXIST as u64);
    let stats = LOCK_STATS.get_ptr_mut(lock);
    if stats.is_none() {
        count_drop(Drop::StatsFull);
    }
    stats
}

/// Adds one duration to a histogram (a per-CPU value: no atomics needed).
#[inline(always)]
pub(crate) fn record(hist: &mut pipelock_common::Histogram, ns: u64) {
    hist.count += 1;
    hist.total_ns += ns;
    if ns > hist.max_ns {
        hist.max_ns = ns;
    }
    if let Some(slot) = hist.buckets.get_mut(hist_bucket(ns)) {
        *slot += 1;
    }
}

/// Records the process on `lock` once (it shows in the report's processes).
#[inline(always)]
pub(crate) fn note_user(lock: u64, tgid: u32) {
    let user = LockUser { lock, tgid, _pad: 0 };
    // SAFETY: a lookup; the comm is only fetched for a process not seen yet.
    if unsafe { LOCK_USERS.get(user) }.is_none() {
        let comm = bpf_get_current_comm().unwrap_or([0; 16]);
        if LOCK_USERS.insert(user, comm, BPF_NOEXIST as u64).is_err() {
            count_drop(Drop::UsersFull);
        }
    }
}

#[btf_tracepoint(function = "contention_begin")]
pub fn pipe_contention_begin_btf(ctx: BtfTracePointContext) -> i32 {
    // contention_begin(void *lock, unsigned int flags)
    let (lock, flags): (u64, u32) = (ctx.arg(0), ctx.arg(1));
    on_begin(lock, flags);
    0
}

#[btf_tracepoint(function = "contention_end")]
pub fn pipe_contention_end_btf(ctx: BtfTracePointContext) -> i32 {
    // contention_end(void *lock, int ret)
    let lock: u64 = ctx.arg(0);
    on_end(lock);
    0
}

/// Offsets of the classic tracepoint records (same on every kernel since 5.19).
const TP_LOCK_ADDR: usize = 8;
const TP_FLAGS: usize = 16;

#[tracepoint(category = "lock", name = "contention_begin")]
pub fn pipe_contention_begin_tp(ctx: TracePointContext) -> u32 {
    // SAFETY: reads inside the tracepoint record.
    if let (Ok(lock), Ok(flags)) = unsafe { (ctx.read_at::<u64>(TP_LOCK_ADDR), ctx.read_at::<u32>(TP_FLAGS)) }
    {
        on_begin(lock, flags);
    }
    0
}

#[tracepoint(category = "lock", name = "contention_end")]
pub fn pipe_contention_end_tp(ctx: TracePointContext) -> u32 {
    // SAFETY: a read inside the tracepoint record.
    if let Ok(lock) = unsafe { ctx.read_at::<u64>(TP_LOCK_ADDR) } {
        on_end(lock);
    }
    0
}
