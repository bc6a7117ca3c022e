//! A pipe call's state: the thread's slot, entering and leaving a call,
//! and which of the call's pipes' locks an address is.
use aya_ebpf::helpers::bpf_get_current_pid_tgid;
use pipelock_common::{
    LockKey, TASK_SLOTS, TaskPipe, ThreadSlot, TraceConfig,
    pipe_lock::{self, COUNT, PIPES, SLOTS},
};

use crate::{
    btf_ptr::BtfPtr,
    drops::count_drop,
    files::{file_at, file_of_fd, pipe_of_file},
    filter::wanted,
    kernel_memory::read,
    maps::{PIPE_FREES, TASK_PIPE, config, pipe_frees},
    recorded::note_user,
    thread_slot::Taken,
};

/// `TaskPipe::pipe[0]` inside a read/write whose mutex has not been taken
/// yet (no lock lives at address 1).
pub(super) const PIPE_PENDING: u64 = 1;

/// The slot of thread `pid_tgid`, whoever it is for.
#[inline(always)]
fn slot_of(pid_tgid: u64) -> Option<*mut ThreadSlot<TaskPipe>> {
    TASK_PIPE.get_ptr_mut((pid_tgid as u32) & (TASK_SLOTS - 1))
}

/// The current thread's state, taken, if the slot is for it.
#[inline(always)]
pub(super) fn current_state() -> Option<Taken<TaskPipe>> {
    let pid_tgid = bpf_get_current_pid_tgid();
    Taken::own(slot_of(pid_tgid)?, pid_tgid)
}

/// The slot for a traced thread entering a pipe call: its own, or one it
/// claims from a thread that is not inside a pipe call (gone, or between
/// calls). `None` if it is not traced, or its slot is busy.
#[inline(always)]
pub(super) fn enter_state(pid_tgid: u64) -> Option<Taken<TaskPipe>> {
    let cfg = config();
    let slot = slot_of(pid_tgid)?;
    // Pipe calls of threads not traced take nothing.
    if Taken::owner_hint(slot) != pid_tgid && !wanted(cfg, pid_tgid) {
        return None;
    }
    let mut state = Taken::any(slot, pid_tgid)?;
    if state.owner() == pid_tgid {
        // Its process stays traced while it lives; only a command name can
        // change (exec), so only `-c` is checked again.
        if cfg.filter_comm_set != 0 && !wanted(cfg, pid_tgid) {
            state.set_owner(0);
            return None;
        }
        return Some(state);
    }
    if !wanted(cfg, pid_tgid) {
        return None;
    }
    if state.owner() != 0 && state.pipe != [0; PIPES] {
        count_drop(pipelock_common::Drop::SlotBusy);
        return None;
    }
    state.set_owner(pid_tgid);
    state.noted_pipe = 0;
    state.registered = 0;
    crate::details::name_current(cfg, pid_tgid);
    Some(state)
}

#[inline(always)]
pub(super) fn start_call(state: &mut TaskPipe, pipes: [u64; PIPES], inos: [u64; PIPES]) {
    state.pipe = pipes;
    state.ino = inos;
    state.wait_start = [0; SLOTS];
    state.hold_start = [0; SLOTS];
}

/// pipe_read/pipe_write(struct kiocb *iocb, …): the task enters a pipe call.
/// Which pipe is learnt from its first mutex_lock (see `adopt_pipe`): no
/// kernel memory is read here, on every call.
#[inline(always)]
pub(super) fn enter_pipe_call(kiocb: u64) {
    let Some(mut state) = enter_state(bpf_get_current_pid_tgid()) else {
        return;
    };
    state.kiocb = kiocb;
    start_call(&mut state, [PIPE_PENDING, 0], [0; PIPES]);
}

/// splice (`do_splice(in, …, out, …)`), tee (`do_tee(in, out, …)`) and
/// vmsplice (one fd): the pipes among the call's files, read now, as these
/// calls take no mutex before their pipe's that could name it.
#[inline(always)]
pub(super) fn enter_splice_call(cfg: &TraceConfig, files: [u64; PIPES]) {
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
    let Some(mut state) = enter_state(pid_tgid) else {
        return;
    };
    start_call(&mut state, pipes, inos);
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
/// checks that against `kiocb->ki_filp->private_data` (a FIFO's), learns the pipe's
/// inode number and records the process on the pipe; later calls on the
/// same pipe trust it, so those reads of kernel memory happen once per
/// thread and pipe, not per call. Once any pipe has been freed the address
/// may belong to a new pipe, so it is checked again.
#[inline(always)]
pub(super) fn adopt_pipe(state: &mut TaskPipe, lock: u64, tgid: u32) -> bool {
    let frees = pipe_frees();
    if lock != state.noted_pipe || frees != state.frees_seen {
        let cfg = config();
        let Some((pipe, ino)) =
            file_at(cfg, state.kiocb + cfg.kiocb_filp as u64).and_then(|file| pipe_of_file(cfg, file))
        else {
            return false;
        };
        if pipe != lock {
            return false;
        }
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
pub(super) fn pipe_freed() {
    if let Some(frees) = PIPE_FREES.get_ptr_mut(0) {
        // SAFETY: the map's one slot; an atomic add, as every CPU frees pipes.
        unsafe { crate::counters::atomic_add(frees, 1) };
    }
}

/// A pipe call returns.
#[inline(always)]
pub(super) fn leave_pipe_call() {
    if let Some(mut state) = current_state() {
        // Locks compare against `pipe`, so 0 makes every hook ignore the
        // thread until its next pipe call (and frees the slot for a thread
        // sharing it).
        state.pipe = [0; PIPES];
    }
}

/// Which of the call's pipe locks `lock` is, if any: its index in the
/// per-lock arrays (`pipe * COUNT + lock`).
#[inline(always)]
pub(super) fn which_lock(state: &TaskPipe, lock: u64) -> Option<usize> {
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

/// `__x64_sys_vmsplice(const struct pt_regs *regs)`: its one pipe, by the
/// fd in the first syscall argument. (The syscall body `__do_sys_vmsplice`
/// is `static inline`, so notrace, where the compiler kept it out of line.)
#[inline(always)]
pub(super) fn enter_vmsplice(regs: u64) {
    let cfg = config();
    if let Some(fd) = read::<u64>(regs + cfg.regs_arg0 as u64)
        && let Some(file) = file_of_fd(cfg, BtfPtr::current_task(), fd as u32 as u64)
    {
        enter_splice_call(cfg, [file, 0]);
    }
}
