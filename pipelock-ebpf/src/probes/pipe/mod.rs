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

/// One fentry program: its arguments read, its body run with preemption
/// off where the kernel allows (see `crate::preempt`).
macro_rules! fentry_hook {
    ($name:ident, $ctx:ident, ($($arg:ident = $n:literal),*), $body:expr) => {
        #[fentry]
        pub fn $name($ctx: FEntryContext) -> i32 {
            $(let $arg: u64 = $ctx.arg($n);)*
            unpreempted(|| {
                $body;
            });
            0
        }
    };
}

/// The kprobe twin of [`fentry_hook`]: the same arguments from the
/// registers (nothing is done without them), the same body.
macro_rules! kprobe_hook {
    ($name:ident, $ctx:ident, ($($arg:ident = $n:literal),*), $body:expr) => {
        #[kprobe]
        pub fn $name($ctx: ProbeContext) -> u32 {
            $(let Some($arg) = $ctx.arg::<u64>($n) else {
                return 0;
            };)*
            $body;
            0
        }
    };
}

/// The hooks of one entry in both hooked modes, from one body: an fentry
/// program per kernel function (a trampoline program is verified for one
/// function) and one kprobe program, which attaches to all of them.
macro_rules! entry_hooks {
    ([$($fentry:ident),+] $kprobe:ident, |$ctx:ident| $args:tt => $body:expr) => {
        $(fentry_hook!($fentry, $ctx, $args, $body);)+
        kprobe_hook!($kprobe, $ctx, $args, $body);
    };
}

/// The hooks of one return in both hooked modes: an fexit program per
/// function, one kretprobe for all (kretprobes carry no arguments).
macro_rules! exit_hooks {
    ([$($fexit:ident),+] $kretprobe:ident => $body:expr) => {
        $(
            #[fexit]
            pub fn $fexit(_ctx: FExitContext) -> i32 {
                unpreempted(|| {
                    $body;
                });
                0
            }
        )+
        #[kretprobe]
        pub fn $kretprobe(_ctx: RetProbeContext) -> u32 {
            $body;
            0
        }
    };
}

// The pipe calls: read/write name their pipe by the kiocb's file; splice,
// tee and vmsplice by their files (two for splice and tee between pipes).
entry_hooks!([pipe_read_entry] kp_pipe_read_entry, |ctx| (kiocb = 0) => enter_pipe_call(kiocb));
entry_hooks!([pipe_write_entry] kp_pipe_write_entry, |ctx| (kiocb = 0) => enter_pipe_call(kiocb));
exit_hooks!([pipe_read_exit] kp_pipe_read_exit => leave_pipe_call());
exit_hooks!([pipe_write_exit] kp_pipe_write_exit => leave_pipe_call());
// do_splice(struct file *in, loff_t *off_in, struct file *out, …)
entry_hooks!([splice_entry] kp_splice_entry, |ctx| (input = 0, output = 2) =>
    enter_splice_call(config(), [input, output]));
// do_tee(struct file *in, struct file *out, …)
entry_hooks!([tee_entry] kp_tee_entry, |ctx| (input = 0, output = 1) =>
    enter_splice_call(config(), [input, output]));
entry_hooks!([vmsplice_entry] kp_vmsplice_entry, |ctx| (regs = 0) => enter_vmsplice(regs));
exit_hooks!([splice_exit, tee_exit, vmsplice_exit] kp_splice_call_exit => leave_pipe_call());
entry_hooks!([pipe_free_entry] kp_pipe_free_entry, |_ctx| () => pipe_freed());

// The locks: every mutex and spinlock of the system passes here, and is
// compared with the current call's pipe locks first.
entry_hooks!([mutex_lock_entry] kp_mutex_lock_entry, |ctx| (lock = 0) => mutex_lock_call(&ctx, lock));
entry_hooks!([mutex_unlock_entry] kp_mutex_unlock_entry, |ctx| (lock = 0) => released(lock));
entry_hooks!([spin_lock_irqsave_entry, spin_lock_irq_entry] kp_spin_lock_entry, |ctx| (lock = 0) =>
    lock_call(&ctx, lock));
entry_hooks!(
    [spin_unlock_irqrestore_entry, spin_unlock_irq_entry] kp_spin_unlock_entry,
    |ctx| (lock = 0) => released(lock)
);

// A spinlock's acquisition ends at its lock call's return: fexit reads
// the lock from the arguments, a kretprobe has none (`acquired_pending`).

#[fexit]
pub fn spin_lock_irqsave_exit(ctx: FExitContext) -> i32 {
    unpreempted(|| {
        acquired(ctx.arg(0));
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

#[kretprobe]
pub fn kp_spin_lock_exit(_ctx: RetProbeContext) -> u32 {
    acquired_pending();
    0
}

/// Marks the task's pending acquisition of one of its pipe's locks as
/// contended (the slow path emits this; the fast path does not).
#[btf_tracepoint(function = "contention_begin")]
pub fn hooked_contention_begin(ctx: BtfTracePointContext) -> i32 {
    let (lock, flags): (u64, u32) = (ctx.arg(0), ctx.arg(1));
    // Spinlocks carry no owner: their begins need not look up the task.
    if flags & LCB_F_MUTEX != 0 {
        crate::probes::asked_twice::check(
            &ctx,
            config(),
            crate::btf_ptr::BtfPtr::current_task(),
            lock,
            flags,
        );
    }
    let Some(mut state) = current_state() else {
        return 0;
    };
    let state = &mut *state;
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
