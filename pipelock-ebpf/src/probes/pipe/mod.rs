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
//! that wait. A begin whose lock call went unseen (its run skipped) starts
//! the wait itself (see `locks::mutex_begin_without_call`). Spinlocks keep
//! theirs: without paravirtual spinlocks their slow path does not always
//! emit the contention tracepoints.
mod calls;
mod locks;

use aya_ebpf::{
    macros::{btf_tracepoint, fentry, fexit, kprobe, kretprobe},
    programs::{BtfTracePointContext, FEntryContext, FExitContext, ProbeContext, RetProbeContext},
};
use pipelock_common::{
    LCB_F_MUTEX,
    pipe_lock::{self, COUNT, SLOTS},
};

use self::{
    calls::{
        current_state, enter_pipe_call, enter_splice_call, enter_vmsplice, leave_pipe_call, pipe_freed,
        which_lock,
    },
    locks::{
        acquired, acquired_pending, lock_call, mutex_begin_without_call, mutex_contended,
        mutex_contention_end, mutex_lock_call, released,
    },
};
use crate::{maps::config, preempt::unpreempted};

#[fentry]
pub fn pipe_read_entry(ctx: FEntryContext) -> i32 {
    unpreempted(|| {
        enter_pipe_call(ctx.arg(0));
    });
    0
}

#[fexit]
pub fn pipe_read_exit(_ctx: FExitContext) -> i32 {
    unpreempted(|| {
        leave_pipe_call();
    });
    0
}

#[fentry]
pub fn pipe_write_entry(ctx: FEntryContext) -> i32 {
    unpreempted(|| {
        enter_pipe_call(ctx.arg(0));
    });
    0
}

#[fexit]
pub fn pipe_write_exit(_ctx: FExitContext) -> i32 {
    unpreempted(|| {
        leave_pipe_call();
    });
    0
}

#[fentry]
pub fn mutex_lock_entry(ctx: FEntryContext) -> i32 {
    unpreempted(|| {
        mutex_lock_call(&ctx, ctx.arg(0));
    });
    0
}

#[fentry]
pub fn mutex_unlock_entry(ctx: FEntryContext) -> i32 {
    unpreempted(|| {
        released(ctx.arg(0));
    });
    0
}

#[fentry]
pub fn pipe_free_entry(_ctx: FEntryContext) -> i32 {
    unpreempted(|| {
        pipe_freed();
    });
    0
}

#[fentry]
pub fn spin_lock_irqsave_entry(ctx: FEntryContext) -> i32 {
    unpreempted(|| {
        lock_call(&ctx, ctx.arg(0));
    });
    0
}

#[fexit]
pub fn spin_lock_irqsave_exit(ctx: FExitContext) -> i32 {
    unpreempted(|| {
        acquired(ctx.arg(0));
    });
    0
}

#[fentry]
pub fn spin_unlock_irqrestore_entry(ctx: FEntryContext) -> i32 {
    unpreempted(|| {
        released(ctx.arg(0));
    });
    0
}

#[fentry]
pub fn spin_lock_irq_entry(ctx: FEntryContext) -> i32 {
    unpreempted(|| {
        lock_call(&ctx, ctx.arg(0));
    });
    0
}

#[fexit]
pub fn spin_lock_irq_exit(ctx: FExitContext) -> i32 {
    unpreempted(|| {
        acquired(ctx.arg(0));
    });
    0
}

#[fentry]
pub fn spin_unlock_irq_entry(ctx: FEntryContext) -> i32 {
    unpreempted(|| {
        released(ctx.arg(0));
    });
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
    if flags & LCB_F_MUTEX != 0 {
        mutex_begin_without_call(state, lock);
    }
    if let Some(index) = which_lock(state, lock)
        && index < SLOTS
        && state.wait_start[index] != 0
    {
        state.contended[index] = 1;
        state.flags_and[index] &= flags;
        if index % COUNT == pipe_lock::MUTEX {
            mutex_contended(state, index / COUNT, lock, flags);
        }
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
    unpreempted(|| {
        // do_splice(struct file *in, loff_t *off_in, struct file *out, …)
        enter_splice_call(config(), [ctx.arg(0), ctx.arg(2)]);
    });
    0
}

#[fexit]
pub fn splice_exit(_ctx: FExitContext) -> i32 {
    unpreempted(|| {
        leave_pipe_call();
    });
    0
}

#[fentry]
pub fn tee_entry(ctx: FEntryContext) -> i32 {
    unpreempted(|| {
        // do_tee(struct file *in, struct file *out, …)
        enter_splice_call(config(), [ctx.arg(0), ctx.arg(1)]);
    });
    0
}

#[fexit]
pub fn tee_exit(_ctx: FExitContext) -> i32 {
    unpreempted(|| {
        leave_pipe_call();
    });
    0
}

#[fentry]
pub fn vmsplice_entry(ctx: FEntryContext) -> i32 {
    unpreempted(|| {
        enter_vmsplice(ctx.arg(0));
    });
    0
}

#[fexit]
pub fn vmsplice_exit(_ctx: FExitContext) -> i32 {
    unpreempted(|| {
        leave_pipe_call();
    });
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
        mutex_lock_call(&ctx, lock);
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
        lock_call(&ctx, lock);
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
