//! fentry mode: every acquisition of a pipe's mutex and wait-queue spinlocks,
//! with wait (lock call → acquired) and hold (acquired → unlock) times.
//!
//! A pipe call's entry marks the task as inside one: pipe_read/pipe_write
//! (or anon_pipe_*), whose first mutex_lock names the pipe, and splice, tee
//! and vmsplice, which take the pipe lock outside read/write and whose pipes
//! (two for splice and tee between pipes) are read from their files at
//! entry. The lock and unlock hooks, which fire for every mutex and
//! spinlock in the system, read the thread's slot of an array and compare the
//! lock address with the call's pipes' locks before touching anything
//! else. A call that sleeps drops and retakes the mutex: each lock/unlock
//! pair is its own hold.
//!
//! The mutex has no exit hook: its fast path is one cmpxchg, so an
//! acquisition without `contention_begin` counts as acquired at the lock
//! call (wait 0), and a contended one as acquired at its `contention_end`,
//! which the mutex slow path always emits. An fexit would cost more than
//! that wait. Spinlocks keep theirs: without paravirtual spinlocks their
//! slow path does not always emit the contention tracepoints.
use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, fentry, fexit, kprobe, kretprobe},
    programs::{BtfTracePointContext, FEntryContext, FExitContext, ProbeContext, RetProbeContext},
};
use pipelock_common::{
    LCB_F_SPIN, LockInfo, LockKey, TASK_SLOTS, TaskPipe, TraceConfig, class,
    pipe_lock::{self, COUNT, PIPES, SLOTS},
};

use crate::{
    files::{file_of_fd, pipe_of_file},
    maps::{
        LOCK_INFO, PIPE_FREES, TASK_PIPE, bump, config, count_drop, note_user, pipe_frees, read, record,
        stats_of, wanted,
    },
};

const CLASSES: [u32; COUNT] = [class::PIPE_MUTEX, class::PIPE_RD_WAIT, class::PIPE_WR_WAIT];

#[inline(always)]
fn now() -> u64 {
    // SAFETY: no preconditions.
    unsafe { bpf_ktime_get_ns() }
}

/// `TaskPipe::pipe[0]` inside a read/write whose mutex has not been taken
/// yet (no lock lives at address 1).
const PIPE_PENDING: u64 = 1;

/// The slot of thread `pid_tgid`, whoever holds it.
#[inline(always)]
fn slot_of(pid_tgid: u64) -> Option<&'static mut TaskPipe> {
    let index = (pid_tgid as u32) & (TASK_SLOTS - 1);
    // SAFETY: a slot of the array; only its owner thread writes it (a
    // claim happens while no other thread is inside a call with it).
    TASK_PIPE.get_ptr_mut(index).map(|slot| unsafe { &mut *slot })
}

/// The current thread's state, if it holds its slot.
#[inline(always)]
fn current_state() -> Option<&'static mut TaskPipe> {
    let pid_tgid = bpf_get_current_pid_tgid();
    slot_of(pid_tgid).filter(|state| state.owner == pid_tgid)
}

/// The slot for a traced thread entering a pipe call: its own, or one it
/// claims from a thread that is not inside a pipe call (gone, or between
/// calls). `None` if it is not traced, or its slot is busy.
#[inline(always)]
fn enter_state(pid_tgid: u64) -> Option<&'static mut TaskPipe> {
    let cfg = config();
    let state = slot_of(pid_tgid)?;
    if state.owner == pid_tgid {
        // Its process stays traced while it lives; only a command name can
        // change (exec), so only `-c` is checked again.
        if cfg.filter_comm_set != 0 && !wanted(cfg, pid_tgid) {
            state.owner = 0;
            return None;
        }
        return Some(state);
    }
    if !wanted(cfg, pid_tgid) {
        return None;
    }
    if state.owner != 0 && state.pipe != [0; PIPES] {
        count_drop(pipelock_common::Drop::SlotBusy);
        return None;
    }
    state.owner = pid_tgid;
    state.noted_pipe = 0;
    state.registered = 0;
    Some(state)
}

#[inline(always)]
fn start_call(state: &mut TaskPipe, pipes: [u64; PIPES], inos: [u64; PIPES]) {
    state.pipe = pipes;
    state.ino = inos;
    state.wait_start = [0; SLOTS];
    state.hold_start = [0; SLOTS];
}

/// pipe_read/pipe_write(struct kiocb *iocb, …): the task enters a pipe call.
/// Which pipe is learnt from its first mutex_lock (see `adopt_pipe`): no
/// kernel memory is read here, on every call.
#[inline(always)]
fn enter_pipe_call(kiocb: u64) {
    let Some(state) = enter_state(bpf_get_current_pid_tgid()) else {
        return;
    };
    state.kiocb = kiocb;
    start_call(state, [PIPE_PENDING, 0], [0; PIPES]);
}

/// splice (`do_splice(in, …, out, …)`), tee (`do_tee(in, out, …)`) and
/// vmsplice (one fd): the pipes among the call's files, read now, as these
/// calls take no mutex before their pipe's that could name it.
#[inline(always)]
fn enter_splice_call(cfg: &TraceConfig, files: [u64; PIPES]) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let mut pipes = [0; PIPES];
    let mut inos = [0; PIPES];
    for slot in 0..PIPES {
        if let Some((pipe, ino)) = pipe_of_file(cfg, files[slot]) {
            pipes[slot] = pipe;
            inos[slot] = ino;
        }
    }
    if pipes[0] == pipes[1] {
        // One pipe (or none): the kernel refuses a pipe spliced to itself.
        pipes[1] = 0;
    }
    if pipes == [0; PIPES] {
        return;
    }
    let Some(state) = enter_state(pid_tgid) else {
        return;
    };
    start_call(state, pipes, inos);
    // The read/write cache (`noted_pipe`, `registered`) no longer holds.
    state.noted_pipe = 0;
    state.registered = 0;
    for slot in 0..PIPES {
        if pipes[slot] != 0 {
            note_user(
                LockKey {
                    lock: pipes[slot],
                    owner: inos[slot],
                },
                (pid_tgid >> 32) as u32,
            );
        }
    }
}

/// The first mutex a pipe read or write takes is its pipe's (`&pipe->mutex
/// == pipe`, taken before anything else). A thread's first call on a pipe
/// checks that against `kiocb->ki_filp->private_data`, learns the pipe's
/// inode number and records the process on the pipe; later calls on the
/// same pipe trust it, so those reads of kernel memory happen once per
/// thread and pipe, not per call. Once any pipe has been freed the address
/// may belong to a new pipe, so it is checked again.
#[inline(always)]
fn adopt_pipe(state: &mut TaskPipe, lock: u64, tgid: u32) -> bool {
    let frees = pipe_frees();
    if lock != state.noted_pipe || frees != state.frees_seen {
        let cfg = config();
        let Some(file) = read::<u64>(state.kiocb + cfg.kiocb_filp as u64) else {
            return false;
        };
        if read::<u64>(file + cfg.file_private_data as u64) != Some(lock) {
            return false;
        }
        let ino = read::<u64>(file + cfg.file_inode as u64)
            .and_then(|inode| read::<u64>(inode + cfg.inode_ino as u64))
            .unwrap_or(0);
        if lock != state.noted_pipe || ino != state.noted_ino {
            note_user(LockKey { lock, owner: ino }, tgid);
            state.registered = 0;
        }
        state.noted_pipe = lock;
        state.noted_ino = ino;
        state.frees_seen = frees;
    }
    state.pipe[0] = lock;
    state.ino[0] = state.noted_ino;
    true
}

/// `free_pipe_info(pipe)`: from now on a pipe's address is not its identity.
#[inline(always)]
fn pipe_freed() {
    if let Some(frees) = PIPE_FREES.get_ptr_mut(0) {
        // SAFETY: the map's one slot; an atomic add, as every CPU frees pipes.
        unsafe { crate::maps::atomic_add(frees, 1) };
    }
}

/// A pipe call returns.
#[inline(always)]
fn leave_pipe_call() {
    if let Some(state) = current_state() {
        // Locks compare against `pipe`, so 0 makes every hook ignore the
        // thread until its next pipe call (and frees the slot for a thread
        // sharing it).
        state.pipe = [0; PIPES];
    }
}

/// Which of the call's pipe locks `lock` is, if any: its index in the
/// per-lock arrays (`pipe * COUNT + lock`).
#[inline(always)]
fn which_lock(state: &TaskPipe, lock: u64) -> Option<usize> {
    let cfg = config();
    for slot in 0..PIPES {
        let pipe = state.pipe[slot];
        if pipe <= PIPE_PENDING {
            continue;
        }
        if lock == pipe {
            return Some(slot * COUNT + pipe_lock::MUTEX);
        } else if lock == pipe + cfg.pipe_rd_wait_lock as u64 {
            return Some(slot * COUNT + pipe_lock::RD_WAIT);
        } else if lock == pipe + cfg.pipe_wr_wait_lock as u64 {
            return Some(slot * COUNT + pipe_lock::WR_WAIT);
        }
    }
    None
}

#[inline(always)]
fn class_wanted(index: usize) -> bool {
    config().class_mask & (1 << CLASSES[index % COUNT]) != 0
}

/// mutex_lock entry: acquired now unless a `contention_begin` follows.
#[inline(always)]
fn mutex_lock_call(lock: u64) {
    let Some(state) = current_state() else {
        return;
    };
    let pid_tgid = state.owner;
    if state.pipe[0] == PIPE_PENDING && !adopt_pipe(state, lock, (pid_tgid >> 32) as u32) {
        // Not the pipe's mutex after all: leave this call untraced.
        state.pipe[0] = 0;
        return;
    }
    let Some(index) = which_lock(state, lock) else {
        return;
    };
    if index >= SLOTS || index % COUNT != pipe_lock::MUTEX || !class_wanted(index) {
        return;
    }
    let at = now();
    state.wait_start[index] = at;
    state.hold_start[index] = at;
    state.wait_ns[index] = 0;
    state.contended[index] = 0;
    state.flags_and[index] = u32::MAX;
    register(state, index, lock);
}

/// A contended mutex acquisition ends: the hold starts now.
#[inline(always)]
fn mutex_contention_end(lock: u64) {
    let Some(state) = current_state() else {
        return;
    };
    let Some(index) = which_lock(state, lock) else {
        return;
    };
    if index >= SLOTS || index % COUNT != pipe_lock::MUTEX || state.wait_start[index] == 0 || state.contended[index] == 0
    {
        return;
    }
    let at = now();
    state.wait_ns[index] = at - state.wait_start[index];
    state.wait_start[index] = 0;
    state.hold_start[index] = at;
}

#[inline(always)]
fn lock_call(lock: u64) {
    let Some(state) = current_state() else {
        return;
    };
    if let Some(index) = which_lock(state, lock)
        && index < SLOTS
    {
        state.wait_start[index] = now();
        state.contended[index] = 0;
        state.flags_and[index] = u32::MAX;
    }
}

#[inline(always)]
fn acquired(lock: u64) {
    let Some(state) = current_state() else {
        return;
    };
    if let Some(index) = which_lock(state, lock) {
        acquired_at(state, index, lock);
    }
}

/// kretprobe flavour: a return carries no lock argument, but a task is in at
/// most one spinlock call at a time, so the pending one is it.
#[inline(always)]
fn acquired_pending() {
    let Some(state) = current_state() else {
        return;
    };
    let cfg = config();
    for slot in 0..PIPES {
        for (lock, offset) in [
            (pipe_lock::RD_WAIT, cfg.pipe_rd_wait_lock),
            (pipe_lock::WR_WAIT, cfg.pipe_wr_wait_lock),
        ] {
            let index = slot * COUNT + lock;
            if state.wait_start[index] != 0 {
                let address = state.pipe[slot] + offset as u64;
                acquired_at(state, index, address);
                return;
            }
        }
    }
}

#[inline(always)]
fn acquired_at(state: &mut TaskPipe, index: usize, lock: u64) {
    if index >= SLOTS {
        return;
    }
    let start = state.wait_start[index];
    if start == 0 || !class_wanted(index) {
        return;
    }
    let at = now();
    state.wait_start[index] = 0;
    state.hold_start[index] = at;
    state.wait_ns[index] = at - start;
    register(state, index, lock);
}

/// Names the lock in LOCK_INFO, once per thread and pipe (a failed insert
/// costs a bucket lock).
#[inline(always)]
fn register(state: &mut TaskPipe, index: usize, lock: u64) {
    if state.registered & (1 << index) == 0 {
        let slot = index / COUNT;
        let key = LockKey {
            lock,
            owner: state.ino[slot],
        };
        // SAFETY: a lookup only.
        if unsafe { LOCK_INFO.get(&key) }.is_none() {
            let info = LockInfo {
                pipe: state.pipe[slot],
                ino: state.ino[slot],
                class: CLASSES[index % COUNT],
                _pad: 0,
                name: [0; 32],
            };
            let _ = LOCK_INFO.insert(&key, &info, BPF_NOEXIST as u64);
        }
        state.registered |= 1 << index;
    }
}

#[inline(always)]
fn released(lock: u64) {
    let Some(state) = current_state() else {
        return;
    };
    let Some(index) = which_lock(state, lock) else {
        return;
    };
    if index >= SLOTS {
        return;
    }
    let start = state.hold_start[index];
    state.hold_start[index] = 0;
    state.wait_start[index] = 0;
    let key = LockKey {
        lock,
        owner: state.ino[index / COUNT],
    };
    let Some(stats) = stats_of(&key) else { return };
    // SAFETY: a live map value; every update of it is atomic.
    let stats = unsafe { &mut *stats };
    if start == 0 {
        // Released without an acquisition this call saw (taken before the
        // call was entered, or its lock call's return was missed).
        bump(&mut stats.dropped, 1);
        return;
    }
    // The acquisition is counted with its release: one lookup of the
    // statistics per lock/unlock pair instead of two.
    bump(&mut stats.acquisitions, 1);
    if state.contended[index] != 0 {
        bump(&mut stats.contentions, 1);
        if state.flags_and[index] & LCB_F_SPIN != 0 {
            bump(&mut stats.spin_only, 1);
        }
    }
    record(&mut stats.wait, state.wait_ns[index]);
    record(&mut stats.hold, now() - start);
}

/// `__x64_sys_vmsplice(const struct pt_regs *regs)`: its one pipe, by the
/// fd in the first syscall argument. (The syscall body `__do_sys_vmsplice`
/// is `static inline`, so notrace, where the compiler kept it out of line.)
#[inline(always)]
fn enter_vmsplice(regs: u64) {
    let cfg = config();
    if let Some(fd) = read::<u64>(regs + cfg.regs_arg0 as u64)
        && let Some(file) = file_of_fd(cfg, fd as u32 as u64)
    {
        enter_splice_call(cfg, [file, 0]);
    }
}

#[fentry]
pub fn pipe_read_entry(ctx: FEntryContext) -> i32 {
    enter_pipe_call(ctx.arg(0));
    0
}

#[fexit]
pub fn pipe_read_exit(_ctx: FExitContext) -> i32 {
    leave_pipe_call();
    0
}

#[fentry]
pub fn pipe_write_entry(ctx: FEntryContext) -> i32 {
    enter_pipe_call(ctx.arg(0));
    0
}

#[fexit]
pub fn pipe_write_exit(_ctx: FExitContext) -> i32 {
    leave_pipe_call();
    0
}

#[fentry]
pub fn mutex_lock_entry(ctx: FEntryContext) -> i32 {
    mutex_lock_call(ctx.arg(0));
    0
}

#[fentry]
pub fn mutex_unlock_entry(ctx: FEntryContext) -> i32 {
    released(ctx.arg(0));
    0
}

#[fentry]
pub fn pipe_free_entry(_ctx: FEntryContext) -> i32 {
    pipe_freed();
    0
}

#[fentry]
pub fn spin_lock_irqsave_entry(ctx: FEntryContext) -> i32 {
    lock_call(ctx.arg(0));
    0
}

#[fexit]
pub fn spin_lock_irqsave_exit(ctx: FExitContext) -> i32 {
    acquired(ctx.arg(0));
    0
}

#[fentry]
pub fn spin_unlock_irqrestore_entry(ctx: FEntryContext) -> i32 {
    released(ctx.arg(0));
    0
}

#[fentry]
pub fn spin_lock_irq_entry(ctx: FEntryContext) -> i32 {
    lock_call(ctx.arg(0));
    0
}

#[fexit]
pub fn spin_lock_irq_exit(ctx: FExitContext) -> i32 {
    acquired(ctx.arg(0));
    0
}

#[fentry]
pub fn spin_unlock_irq_entry(ctx: FEntryContext) -> i32 {
    released(ctx.arg(0));
    0
}

/// Marks the task's pending acquisition of one of its pipe's locks as
/// contended (the slow path emits this; the fast path does not).
#[btf_tracepoint(function = "contention_begin")]
pub fn hooked_contention_begin(ctx: BtfTracePointContext) -> i32 {
    let (lock, flags): (u64, u32) = (ctx.arg(0), ctx.arg(1));
    let Some(state) = current_state() else {
        return 0;
    };
    if let Some(index) = which_lock(state, lock)
        && index < SLOTS
        && state.wait_start[index] != 0
    {
        state.contended[index] = 1;
        state.flags_and[index] &= flags;
    }
    0
}

/// Where a contended pipe mutex acquisition of the task ends (spinlocks:
/// their exit hooks say it).
#[btf_tracepoint(function = "contention_end")]
pub fn hooked_contention_end(ctx: BtfTracePointContext) -> i32 {
    mutex_contention_end(ctx.arg(0));
    0
}

#[fentry]
pub fn splice_entry(ctx: FEntryContext) -> i32 {
    // do_splice(struct file *in, loff_t *off_in, struct file *out, …)
    enter_splice_call(config(), [ctx.arg(0), ctx.arg(2)]);
    0
}

#[fexit]
pub fn splice_exit(_ctx: FExitContext) -> i32 {
    leave_pipe_call();
    0
}

#[fentry]
pub fn tee_entry(ctx: FEntryContext) -> i32 {
    // do_tee(struct file *in, struct file *out, …)
    enter_splice_call(config(), [ctx.arg(0), ctx.arg(1)]);
    0
}

#[fexit]
pub fn tee_exit(_ctx: FExitContext) -> i32 {
    leave_pipe_call();
    0
}

#[fentry]
pub fn vmsplice_entry(ctx: FEntryContext) -> i32 {
    enter_vmsplice(ctx.arg(0));
    0
}

#[fexit]
pub fn vmsplice_exit(_ctx: FExitContext) -> i32 {
    leave_pipe_call();
    0
}

// kprobe mode: the same hooks where fentry is unavailable. kretprobes carry
// no arguments, hence `acquired_pending`.

#[kprobe]
pub fn kp_pipe_read_entry(ctx: ProbeContext) -> u32 {
    if let Some(kiocb) = ctx.arg::<u64>(0) {
        enter_pipe_call(kiocb);
    }
    0
}

#[kretprobe]
pub fn kp_pipe_read_exit(_ctx: RetProbeContext) -> u32 {
    leave_pipe_call();
    0
}

#[kprobe]
pub fn kp_pipe_write_entry(ctx: ProbeContext) -> u32 {
    if let Some(kiocb) = ctx.arg::<u64>(0) {
        enter_pipe_call(kiocb);
    }
    0
}

#[kretprobe]
pub fn kp_pipe_write_exit(_ctx: RetProbeContext) -> u32 {
    leave_pipe_call();
    0
}

#[kprobe]
pub fn kp_mutex_lock_entry(ctx: ProbeContext) -> u32 {
    if let Some(lock) = ctx.arg::<u64>(0) {
        mutex_lock_call(lock);
    }
    0
}

#[kprobe]
pub fn kp_mutex_unlock_entry(ctx: ProbeContext) -> u32 {
    if let Some(lock) = ctx.arg::<u64>(0) {
        released(lock);
    }
    0
}

#[kprobe]
pub fn kp_pipe_free_entry(_ctx: ProbeContext) -> u32 {
    pipe_freed();
    0
}

#[kprobe]
pub fn kp_spin_lock_entry(ctx: ProbeContext) -> u32 {
    if let Some(lock) = ctx.arg::<u64>(0) {
        lock_call(lock);
    }
    0
}

#[kretprobe]
pub fn kp_spin_lock_exit(_ctx: RetProbeContext) -> u32 {
    acquired_pending();
    0
}

#[kprobe]
pub fn kp_spin_unlock_entry(ctx: ProbeContext) -> u32 {
    if let Some(lock) = ctx.arg::<u64>(0) {
        released(lock);
    }
    0
}

#[kprobe]
pub fn kp_splice_entry(ctx: ProbeContext) -> u32 {
    if let (Some(input), Some(output)) = (ctx.arg::<u64>(0), ctx.arg::<u64>(2)) {
        enter_splice_call(config(), [input, output]);
    }
    0
}

#[kprobe]
pub fn kp_tee_entry(ctx: ProbeContext) -> u32 {
    if let (Some(input), Some(output)) = (ctx.arg::<u64>(0), ctx.arg::<u64>(1)) {
        enter_splice_call(config(), [input, output]);
    }
    0
}

#[kprobe]
pub fn kp_vmsplice_entry(ctx: ProbeContext) -> u32 {
    if let Some(regs) = ctx.arg::<u64>(0) {
        enter_vmsplice(regs);
    }
    0
}

/// The return of splice, tee and vmsplice.
#[kretprobe]
pub fn kp_splice_call_exit(_ctx: RetProbeContext) -> u32 {
    leave_pipe_call();
    0
}
