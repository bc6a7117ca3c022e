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
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, tracepoint},
    programs::tracing::StackIdContext,
    programs::{BtfTracePointContext, TracePointContext},
};
use pipelock_common::{
    Drop, LCB_F_MUTEX, LCB_F_SPIN, LockInfo, LockKey, NO_STACK, Pending, RECORDED, TASK_SLOTS, TaskWaits,
    TraceConfig, class, detail, holder::STATES, known, sampling,
};

use super::holder::{mutex_owner, name_task, owner_split, owners_wanted, record_owner_here, unwatch, watch};

use crate::{
    btf_ptr::BtfPtr,
    counters::{field, with_value},
    cpu_local::{record_contended_wait, record_contended_weighed, stats_to_record},
    details::{name_current, take_stack, unwound},
    drops::count_drop,
    files::{file_of_fd, pipe_of_file},
    filter::wanted,
    maps::{TASK_WAITS, config, interval},
    recognise::recognise,
    recorded::{name_lock, note_user},
    task::{on_task_stack, pid_tgid_of},
    thread_slot::Taken,
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

/// The pipe behind `task`'s fd in syscall argument register `arg` (an
/// offset in `pt_regs`).
#[inline(always)]
fn pipe_of_arg(cfg: &TraceConfig, task: BtfPtr, regs: BtfPtr, arg: u32) -> Option<(u64, u64)> {
    pipe_of_file(cfg, file_of_fd(cfg, task, regs.word(arg) as u32 as u64)?)
}

/// The user registers of the slot's thread, the current `task`: at the
/// address the slot keeps where the kernel has `bpf_rdonly_cast`, else
/// from a helper call.
#[inline(always)]
fn user_regs(cfg: &TraceConfig, slot: &TaskWaits, task: BtfPtr) -> BtfPtr {
    if slot.regs != 0
        && let Some(regs) = BtfPtr::cast(slot.regs, cfg.btf_pt_regs)
    {
        return regs;
    }
    BtfPtr::user_regs_of(task)
}

/// (class, pipe, inode number) if `lock` belongs to, or is contended inside,
/// a pipe syscall of the current `task`, whose user registers are `regs`.
#[inline(always)]
fn classify(cfg: &TraceConfig, task: BtfPtr, regs: BtfPtr, lock: u64) -> Option<(u32, u64, u64)> {
    let (nr, arg0) = (regs.word(cfg.regs_syscall_nr) as u32, regs.word(cfg.regs_arg0));
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
    let first = file_of_fd(cfg, task, arg0 as u32 as u64).and_then(|file| pipe_of_file(cfg, file));
    if let Some((pipe, ino)) = first
        && let Some(class) = pipe_class(cfg, pipe, lock)
    {
        return Some((class, pipe, ino));
    }
    let second = second.and_then(|arg| pipe_of_arg(cfg, task, regs, arg));
    if let Some((pipe, ino)) = second
        && let Some(class) = pipe_class(cfg, pipe, lock)
    {
        return Some((class, pipe, ino));
    }
    // Another lock contended inside the call: the row of its (first) pipe.
    let (pipe, ino) = first.or(second)?;
    Some((class::OTHER_IN_PIPE_CALL, pipe, ino))
}

/// Where a free entry is in `slot`, else its oldest open wait, which is
/// replaced: with [`OPEN_WAITS`] open at once, an end was missed.
#[inline(always)]
fn entry_for_new_wait(slot: &TaskWaits) -> usize {
    use pipelock_common::OPEN_WAITS;
    let (mut pick, mut oldest) = (0, u64::MAX);
    for (at, wait) in slot.waits.iter().enumerate() {
        if wait.lock == 0 {
            return at;
        }
        if wait.start_ns < oldest {
            (pick, oldest) = (at, wait.start_ns);
        }
    }
    count_drop(Drop::StalePending);
    forget(&slot.waits[pick % OPEN_WAITS]);
    pick
}

/// A begin of the mutex wait `wait` (`flags`): who owns the mutex (read
/// at the first begin that finds an owner), and, from the first begin that
/// sleeps, what the owner is doing (see `probes::holder`).
#[inline(always)]
fn note_owner(cfg: &TraceConfig, wait: &mut Pending, flags: u32) {
    if wait.owner_tid == 0 {
        let Some((task, tid)) = mutex_owner(cfg, wait.lock) else {
            return;
        };
        wait.owner_tid = tid;
        wait.owner_task = task;
        name_task(cfg, task, tid);
    }
    if flags & LCB_F_SPIN == 0 && wait.watched == 0 {
        // SAFETY: no preconditions.
        if let Some(clock) = watch(cfg, wait.owner_task, unsafe { bpf_ktime_get_ns() }) {
            wait.holder_at_start = clock;
            wait.watched = 1;
        }
    }
}

/// A wait whose end will never be seen stops watching its owner.
#[inline(always)]
fn forget(wait: &Pending) {
    if wait.lock != 0 && wait.watched != 0 {
        let _ = unwatch(wait.owner_task, &wait.holder_at_start, 0);
    }
}

/// Whether this thread has not yet recorded `key` (named it, noted its
/// process on it) in this interval; from now on it counts as recorded (the
/// caller records it). Userspace keeps what it drained of both maps.
#[inline(always)]
fn first_recording(slot: &mut TaskWaits, key: LockKey) -> bool {
    let now = interval();
    if slot.recorded_in != now {
        slot.recorded = [LockKey::default(); RECORDED];
        slot.recorded_in = now;
    }
    if slot.recorded.iter().any(|recorded| *recorded == key) {
        return false;
    }
    if let Some(entry) = slot.recorded.get_mut(slot.recorded_next as usize % RECORDED) {
        *entry = key;
    }
    slot.recorded_next = slot.recorded_next.wrapping_add(1);
    true
}

/// `on_task_stack`: whether to check that the event runs in task context
/// (`tp_btf`: its arguments are on the stack it fired on; a classic
/// tracepoint's record is in the trace buffer, no check).
#[inline(always)]
fn on_begin<C: EbpfContext + StackIdContext>(ctx: &C, lock: u64, flags: u32, on_task_stack_check: bool) {
    let cfg = config();
    // The task once: the slot's key, the syscall's fds and the stack check.
    let task = BtfPtr::current_task();
    super::asked_twice::check(ctx, cfg, task, lock, flags);
    let pid_tgid = pid_tgid_of(cfg, task);
    let Some(slot) = TASK_WAITS.get_ptr_mut(pid_tgid as u32 % TASK_SLOTS) else {
        return;
    };
    let Some(mut slot) = Taken::any(slot, pid_tgid) else {
        return;
    };
    if slot.owner() != pid_tgid || slot.task != task.address() {
        // A thread 16 384 ids away, or one that has exited: its waits go.
        if slot.waits.iter().any(|wait| wait.lock != 0) {
            count_drop(Drop::SlotBusy);
            slot.waits.iter().for_each(forget);
        }
        slot.set_owner(pid_tgid);
        *slot = TaskWaits {
            wanted: wanted(cfg, pid_tgid) as u32,
            task: task.address(),
            regs: BtfPtr::user_regs_of(task).address(),
            ..TaskWaits::default()
        };
        if slot.wanted != 0 {
            name_current(cfg, pid_tgid);
        }
    } else {
        for wait in slot.waits.iter_mut() {
            if wait.lock != lock {
                continue;
            }
            // One mutex acquisition can emit several begins (spin, then
            // sleep, then again after each wake-up) but exactly one end:
            // keep the first. Any other lock emits one begin per
            // acquisition, so an open wait found here is one whose end was
            // missed: it restarts.
            if flags & LCB_F_MUTEX != 0 {
                wait.flags_or |= flags;
                wait.flags_and &= flags;
                // The waiter goes to sleep (watch its owner from now), or
                // the first begin found the mutex between two owners (a
                // release to its waiters) and by now it has one.
                if wait.class == class::PIPE_MUTEX && owners_wanted(cfg) {
                    note_owner(cfg, wait, flags);
                }
                return;
            }
            count_drop(Drop::StalePending);
            forget(wait);
            wait.lock = 0;
        }
        // A thread can change its name (exec, prctl).
        if cfg.filter_comm_set != 0 {
            slot.wanted = wanted(cfg, pid_tgid) as u32;
        }
    }
    let slot = &mut *slot;
    if slot.wanted == 0 {
        return;
    }
    let Some((class, pipe, ino)) = classify(cfg, task, user_regs(cfg, slot, task), lock) else {
        return;
    };
    if cfg.class_mask & (1 << class) == 0 {
        return;
    }
    if on_task_stack_check && !on_task_stack(cfg, task, ctx.as_ptr().cast_const()) {
        count_drop(Drop::InInterrupt);
        return;
    }
    let at = entry_for_new_wait(slot);
    let Some(wait) = slot.waits.get_mut(at) else {
        return;
    };
    // Each lock is one row per pipe: a run-queue lock contended in calls on
    // pipes A and B is two rows, and a pipe at a freed pipe's address a new one.
    // SAFETY: no preconditions.
    let start_ns = unsafe { bpf_ktime_get_ns() };
    *wait = Pending {
        lock,
        owner: ino,
        start_ns,
        class,
        flags_or: flags,
        flags_and: flags,
        owner_tid: 0,
        owner_task: 0,
        holder_at_start: [0; STATES],
        watched: 0,
    };
    if class == class::PIPE_MUTEX && owners_wanted(cfg) {
        note_owner(cfg, wait, flags);
    }
    let key = LockKey { lock, owner: ino };
    if first_recording(slot, key) {
        name_lock(&key, || {
            let mut info = LockInfo {
                pipe,
                ino,
                class,
                known: known::NOTHING,
                name: [0; 32],
                detail: 0,
            };
            if class == class::OTHER_IN_PIPE_CALL {
                recognise(cfg, lock, &mut info);
            }
            info
        });
        note_user(key, (pid_tgid >> 32) as u32);
    }
}

#[inline(always)]
fn on_end<C: EbpfContext + StackIdContext>(ctx: &C, lock: u64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(slot) = TASK_WAITS.get_ptr_mut(pid_tgid as u32 % TASK_SLOTS) else {
        return;
    };
    let Some(mut slot) = Taken::own(slot, pid_tgid) else {
        return;
    };
    let slot = &mut *slot;
    let Some(wait) = slot.waits.iter_mut().find(|wait| wait.lock == lock) else {
        return;
    };
    wait.lock = 0;
    // SAFETY: no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let ns = now.saturating_sub(wait.start_ns);
    let key = LockKey {
        lock,
        owner: wait.owner,
    };
    let cfg = config();
    let spin_only = wait.flags_and & LCB_F_SPIN != 0;
    if wait.class == class::PIPE_MUTEX && owners_wanted(cfg) {
        let watched = (wait.watched != 0).then_some((wait.owner_task, &wait.holder_at_start));
        let spun_behind_owner = spin_only && wait.owner_tid != 0;
        record_owner_here(
            key,
            wait.owner_tid,
            ns,
            owner_split(watched, spun_behind_owner, ns, now),
        );
    }
    if cfg.details & (1 << detail::CALLER) != 0
        && let Some((id, weight)) = caller_of_wait(ctx, cfg, ns)
    {
        let _ = record_contended_weighed(key, detail::CALLER, id, weight, ns);
    }
    if cfg.details & (1 << detail::TASK) != 0 {
        let _ = record_contended_wait(key, detail::TASK, pid_tgid as u32, ns);
    }
    // (No `contentions`: the wait histogram counts them.)
    let Some(stats) = stats_to_record(&key, wait.class != class::OTHER_IN_PIPE_CALL) else {
        return;
    };
    with_value!(stats, |stats| {
        if !spin_only {
            stats.add(field!(slept), 1);
        }
        stats.record(field!(wait), ns);
    });
}

/// The stack a wait of `ns` is recorded under, and its weight; None: left
/// out of the sample. Unwound here, once the wait is timed: an unwind at
/// the begin would be timed as part of the wait, or (before the clock is
/// read) spend part of it, so that sampled waits would read shorter than
/// the rest. The caller's frames are the begin's (`contention_end` fires
/// in the same lock function). A long wait always counts, once.
#[inline(always)]
fn caller_of_wait<C: EbpfContext + StackIdContext>(
    ctx: &C,
    cfg: &TraceConfig,
    ns: u64,
) -> Option<(u32, u64)> {
    let flag = if ns >= sampling::LONG_WAIT_NS {
        0
    } else {
        take_stack(cfg)?
    };
    let id = unwound(ctx);
    sampling::weighed(if id == NO_STACK { id } else { id | flag }, cfg.stack_sample)
}

#[btf_tracepoint(function = "contention_begin")]
pub fn pipe_contention_begin_btf(ctx: BtfTracePointContext) -> i32 {
    // contention_begin(void *lock, unsigned int flags)
    let (lock, flags): (u64, u32) = (ctx.arg(0), ctx.arg(1));
    on_begin(&ctx, lock, flags, true);
    0
}

#[btf_tracepoint(function = "contention_end")]
pub fn pipe_contention_end_btf(ctx: BtfTracePointContext) -> i32 {
    // contention_end(void *lock, int ret)
    let lock: u64 = ctx.arg(0);
    on_end(&ctx, lock);
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
        on_begin(&ctx, lock, flags, false);
    }
    0
}

#[tracepoint(category = "lock", name = "contention_end")]
pub fn pipe_contention_end_tp(ctx: TracePointContext) -> u32 {
    // SAFETY: a read inside the tracepoint record.
    if let Ok(lock) = unsafe { ctx.read_at::<u64>(TP_LOCK_ADDR) } {
        on_end(&ctx, lock);
    }
    0
}
