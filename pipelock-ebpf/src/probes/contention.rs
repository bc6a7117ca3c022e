//! Tracepoint mode: wait times of contended pipe locks from
//! `lock:contention_begin/end`, for kernels where neither fentry nor kprobes
//! work. Pipe locks are recognised only on the contended path, where the
//! event already costs a sleep or a spin: the waiting task's user registers
//! give the syscall and its fds (read, write, readv, writev, vmsplice: the
//! first argument; splice: in and out; tee: in and out), each fd gives a
//! file, a FIFO inode says it is a pipe, and `private_data` is the
//! `pipe_inode_info` whose mutex (offset 0) and wait-queue locks the
//! address is compared against. Events in interrupt context are left out
//! (`tp_btf` only, see `on_task_stack`): they are not the syscall's.
use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task_btf, bpf_ktime_get_ns, bpf_task_pt_regs},
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use pipelock_common::{
    Drop, LCB_F_MUTEX, LCB_F_SPIN, LockInfo, LockKey, Pending, PendingKey, TraceConfig, class,
};

use crate::{
    files::{file_of_fd, pipe_of_file},
    maps::{
        PENDING, bump, config, count_drop, name_lock, note_user, read, read_words, record, stats_of, wanted,
    },
    task::on_task_stack,
};

/// The class of `lock` if it is one of `pipe`'s own locks.
#[inline(always)]
fn pipe_class(cfg: &TraceConfig, pipe: u64, lock: u64) -> Option<u32> {
    if lock == pipe {
        Some(class::PIPE_MUTEX)
    } else if lock == pipe + cfg.pipe_rd_wait_lock as u64 {
        Some(class::PIPE_RD_WAIT)
    } else if lock == pipe + cfg.pipe_wr_wait_lock as u64 {
        Some(class::PIPE_WR_WAIT)
    } else {
        None
    }
}

/// The pipe behind the current task's fd in syscall argument register
/// `arg` (an offset in `pt_regs`).
#[inline(always)]
fn pipe_of_arg(cfg: &TraceConfig, regs: u64, arg: u32) -> Option<(u64, u64)> {
    let fd = read::<u64>(regs + arg as u64)? as u32 as u64;
    pipe_of_file(cfg, file_of_fd(cfg, fd)?)
}

/// (class, pipe, inode number) if `lock` belongs to, or is contended inside,
/// a pipe syscall of the current task.
#[inline(always)]
fn classify(cfg: &TraceConfig, lock: u64) -> Option<(u32, u64, u64)> {
    // SAFETY: helpers without preconditions; the result is only read through
    // bpf_probe_read_kernel.
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as u64;
    let (nr, arg0) = read_words(regs, cfg.regs_syscall_nr, cfg.regs_arg0)?;
    let nr = nr as u32;
    let second = if nr == cfg.nr_read
        || nr == cfg.nr_write
        || nr == cfg.nr_readv
        || nr == cfg.nr_writev
        || nr == cfg.nr_vmsplice
    {
        None
    } else if nr == cfg.nr_splice {
        Some(cfg.regs_arg2)
    } else if nr == cfg.nr_tee {
        Some(cfg.regs_arg1)
    } else {
        return None;
    };
    let first = file_of_fd(cfg, arg0 as u32 as u64).and_then(|file| pipe_of_file(cfg, file));
    if let Some((pipe, ino)) = first
        && let Some(class) = pipe_class(cfg, pipe, lock)
    {
        return Some((class, pipe, ino));
    }
    let second = second.and_then(|arg| pipe_of_arg(cfg, regs, arg));
    if let Some((pipe, ino)) = second
        && let Some(class) = pipe_class(cfg, pipe, lock)
    {
        return Some((class, pipe, ino));
    }
    // Another lock contended inside the call: the row of its (first) pipe.
    let (pipe, ino) = first.or(second)?;
    Some((class::OTHER_IN_PIPE_CALL, pipe, ino))
}

/// `ctx_address`: where a `tp_btf` program's arguments are (None for a
/// classic tracepoint, whose record is in the trace buffer: no check).
#[inline(always)]
fn on_begin(lock: u64, flags: u32, ctx_address: Option<*const core::ffi::c_void>) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let waiting = PendingKey {
        tid: pid_tgid as u32,
        _pad: 0,
        lock,
    };
    // One mutex acquisition can emit several begins (spin, then sleep, then
    // again after each wake-up) but exactly one end: keep the first. Any
    // other lock emits one begin per acquisition, so an open wait found here
    // is one whose end was missed: it restarts.
    if let Some(pending) = PENDING.get_ptr_mut(&waiting) {
        // SAFETY: a value of this map; only this task updates its entry.
        unsafe {
            if flags & LCB_F_MUTEX != 0 {
                (*pending).flags_or |= flags;
                (*pending).flags_and &= flags;
                return;
            }
        }
        count_drop(Drop::StalePending);
        let _ = PENDING.remove(&waiting);
    }
    let cfg = config();
    let tgid = (pid_tgid >> 32) as u32;
    if !wanted(cfg, pid_tgid) {
        return;
    }
    let Some((class, pipe, ino)) = classify(cfg, lock) else {
        return;
    };
    if cfg.class_mask & (1 << class) == 0 {
        return;
    }
    if let Some(at) = ctx_address
        && !on_task_stack(cfg, at)
    {
        count_drop(Drop::InInterrupt);
        return;
    }
    // Each lock is one row per pipe: a run-queue lock contended in calls on
    // pipes A and B is two rows, and a pipe at a freed pipe's address a new one.
    let key = LockKey { lock, owner: ino };
    let pending = Pending {
        lock,
        owner: ino,
        start_ns: unsafe { bpf_ktime_get_ns() },
        class,
        flags_or: flags,
        flags_and: flags,
        _pad: 0,
    };
    if PENDING.insert(&waiting, &pending, 0).is_err() {
        count_drop(Drop::PendingFull);
        return;
    }
    name_lock(&key, || LockInfo {
        pipe,
        ino,
        class,
        _pad: 0,
        name: [0; 32],
    });
    note_user(key, tgid);
}

#[inline(always)]
fn on_end(lock: u64) {
    let waiting = PendingKey {
        tid: bpf_get_current_pid_tgid() as u32,
        _pad: 0,
        lock,
    };
    // SAFETY: a value of this map, copied out before removal.
    let Some(pending) = (unsafe { PENDING.get(&waiting) }).copied() else {
        return;
    };
    let _ = PENDING.remove(&waiting);
    // SAFETY: no preconditions.
    let wait = unsafe { bpf_ktime_get_ns() }.saturating_sub(pending.start_ns);
    let key = LockKey {
        lock,
        owner: pending.owner,
    };
    let Some(stats) = stats_of(&key) else {
        return;
    };
    // SAFETY: a live map value; every update of it is atomic.
    unsafe {
        bump(&mut (*stats).contentions, 1);
        if pending.flags_and & LCB_F_SPIN != 0 {
            bump(&mut (*stats).spin_only, 1);
        }
        record(&mut (*stats).wait, wait);
    }
}

#[btf_tracepoint(function = "contention_begin")]
pub fn pipe_contention_begin_btf(ctx: BtfTracePointContext) -> i32 {
    // contention_begin(void *lock, unsigned int flags)
    let (lock, flags): (u64, u32) = (ctx.arg(0), ctx.arg(1));
    on_begin(lock, flags, Some(ctx.as_ptr().cast_const()));
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
        on_begin(lock, flags, None);
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
