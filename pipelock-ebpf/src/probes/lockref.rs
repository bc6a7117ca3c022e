//! Lockref class (fentry and kprobe modes): `dentry->d_lockref`.
//!
//! The `lockref_*` functions are notrace on every kernel, so they are
//! measured at their traceable callers: `__legitimize_path` (get) and `dput`
//! (put). Each call is one acquisition; its latency is the wait (an upper
//! bound on the lockref operation: the caller does a little more). A call
//! that takes the dentry's own spinlock (`d_lock` is `d_lockref.lock`) fell
//! back from the lockless cmpxchg loop: that is a contention, and the time
//! the spinlock is held is the hold. The cmpxchg retry count is invisible.
use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel_str_bytes},
    macros::{fentry, fexit, kprobe, kretprobe},
    programs::{FEntryContext, FExitContext, ProbeContext, RetProbeContext},
};
use pipelock_common::{Drop, LockInfo, LockKey, TaskLockref, class};

use crate::{
    counters::field,
    drops::count_drop,
    filter::wanted,
    kernel_memory::read,
    maps::{LOCK_INFO, TASK_LOCKREF, config, stats_of},
    preempt::unpreempted,
    recorded::note_user,
};

#[inline(always)]
fn now() -> u64 {
    // SAFETY: no preconditions.
    unsafe { bpf_ktime_get_ns() }
}

/// Entry of a caller working on `dentry`'s lockref.
#[inline(always)]
fn enter(dentry: u64) {
    if dentry == 0 {
        return;
    }
    let cfg = config();
    let pid_tgid = bpf_get_current_pid_tgid();
    if !wanted(cfg, pid_tgid) {
        return;
    }
    let tid = pid_tgid as u32;
    let fresh = TaskLockref {
        lockref: dentry + cfg.dentry_lockref as u64,
        dentry,
        // The name's hash tells a dentry from the one that had its address
        // before it (the name itself is read once per lock, below).
        owner: read::<u64>(dentry + cfg.dentry_hash as u64).unwrap_or(0),
        start: now(),
        depth: 1,
        ..TaskLockref::default()
    };
    if let Some(state) = TASK_LOCKREF.get_ptr_mut(tid) {
        // SAFETY: this task's own entry; no other task writes it.
        let state = unsafe { &mut *state };
        if state.depth > 0 {
            state.depth += 1;
        } else {
            *state = fresh;
        }
        return;
    }
    if TASK_LOCKREF.insert(tid, fresh, 0).is_err() {
        count_drop(Drop::PendingFull);
    }
}

/// Return of a caller: the outermost one records the call.
#[inline(always)]
fn leave() {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let Some(state) = TASK_LOCKREF.get_ptr_mut(tid) else {
        return;
    };
    // SAFETY: as in enter.
    let state = unsafe { &mut *state };
    if state.depth == 0 {
        return;
    }
    state.depth -= 1;
    if state.depth > 0 {
        return;
    }
    let done = *state;
    let key = LockKey {
        lock: done.lockref,
        owner: done.owner,
    };
    let Some(stats) = stats_of(&key) else {
        return;
    };
    // The acquisition is its wait's record (`LockStats::acquisitions`).
    if done.fell_back != 0 {
        stats.add(field!(contentions), 1);
    }
    if done.hold_start != 0 || done.spin_start != 0 {
        // The spinlock outlived the call: its hold cannot be timed here.
        stats.add(field!(dropped), 1);
    }
    stats.record(field!(wait), now().saturating_sub(done.start));
    // SAFETY: a lookup only; the name is read once per lock.
    if unsafe { LOCK_INFO.get(&key) }.is_none() {
        let mut info = LockInfo {
            pipe: done.dentry,
            ino: 0,
            class: class::LOCKREF,
            known: 0,
            name: [0; 32],
            detail: 0,
        };
        if let Some(name) = read::<u64>(done.dentry + config().dentry_name as u64) {
            // SAFETY: the helper bounds the copy to the buffer and fails cleanly.
            let _ = unsafe { bpf_probe_read_kernel_str_bytes(name as *const u8, &mut info.name) };
        }
        let _ = LOCK_INFO.insert(&key, &info, BPF_NOEXIST as u64);
    }
    note_user(key, (pid_tgid >> 32) as u32);
}

/// `spin_lock` inside a caller, on the caller's own dentry lock.
#[inline(always)]
fn spin_call(lock: u64) {
    let Some(state) = TASK_LOCKREF.get_ptr_mut(bpf_get_current_pid_tgid() as u32) else {
        return;
    };
    // SAFETY: as in enter.
    let state = unsafe { &mut *state };
    if state.depth > 0 && lock == state.lockref {
        state.spin_start = now();
    }
}

/// The spinlock was acquired. kretprobes carry no argument, but a task is in
/// at most one `spin_lock` call at a time, so a pending one is this one.
#[inline(always)]
fn spin_acquired() {
    let Some(state) = TASK_LOCKREF.get_ptr_mut(bpf_get_current_pid_tgid() as u32) else {
        return;
    };
    // SAFETY: as in enter.
    let state = unsafe { &mut *state };
    if state.depth > 0 && state.spin_start != 0 {
        state.spin_start = 0;
        state.fell_back = 1;
        state.hold_start = now();
    }
}

#[inline(always)]
fn spin_released(lock: u64) {
    let Some(state) = TASK_LOCKREF.get_ptr_mut(bpf_get_current_pid_tgid() as u32) else {
        return;
    };
    // SAFETY: as in enter.
    let state = unsafe { &mut *state };
    if state.depth == 0 || lock != state.lockref || state.hold_start == 0 {
        return;
    }
    let held = now().saturating_sub(state.hold_start);
    state.hold_start = 0;
    let key = LockKey {
        lock,
        owner: state.owner,
    };
    if let Some(stats) = stats_of(&key) {
        stats.record(field!(hold), held);
    }
}

/// `__legitimize_path(struct path *path, …)`: the dentry is `path->dentry`.
#[inline(always)]
fn enter_legitimize(path: u64) {
    if let Some(dentry) = read::<u64>(path + config().path_dentry as u64) {
        enter(dentry);
    }
}

#[fentry]
pub fn lockref_get_entry(ctx: FEntryContext) -> i32 {
    unpreempted(|| {
        enter_legitimize(ctx.arg(0));
    });
    0
}

#[fexit]
pub fn lockref_get_exit(_ctx: FExitContext) -> i32 {
    unpreempted(|| {
        leave();
    });
    0
}

#[fentry]
pub fn lockref_put_entry(ctx: FEntryContext) -> i32 {
    unpreempted(|| {
        enter(ctx.arg(0));
    });
    0
}

#[fexit]
pub fn lockref_put_exit(_ctx: FExitContext) -> i32 {
    unpreempted(|| {
        leave();
    });
    0
}

#[fentry]
pub fn dentry_spin_lock_entry(ctx: FEntryContext) -> i32 {
    unpreempted(|| {
        spin_call(ctx.arg(0));
    });
    0
}

#[fexit]
pub fn dentry_spin_lock_exit(_ctx: FExitContext) -> i32 {
    unpreempted(|| {
        spin_acquired();
    });
    0
}

#[fentry]
pub fn dentry_spin_unlock_entry(ctx: FEntryContext) -> i32 {
    unpreempted(|| {
        spin_released(ctx.arg(0));
    });
    0
}

#[kprobe]
pub fn kp_lockref_get_entry(ctx: ProbeContext) -> u32 {
    if let Some(path) = ctx.arg::<u64>(0) {
        enter_legitimize(path);
    }
    0
}

#[kprobe]
pub fn kp_lockref_put_entry(ctx: ProbeContext) -> u32 {
    if let Some(dentry) = ctx.arg::<u64>(0) {
        enter(dentry);
    }
    0
}

#[kretprobe]
pub fn kp_lockref_exit(_ctx: RetProbeContext) -> u32 {
    leave();
    0
}

#[kprobe]
pub fn kp_dentry_spin_lock_entry(ctx: ProbeContext) -> u32 {
    if let Some(lock) = ctx.arg::<u64>(0) {
        spin_call(lock);
    }
    0
}

#[kretprobe]
pub fn kp_dentry_spin_lock_exit(_ctx: RetProbeContext) -> u32 {
    spin_acquired();
    0
}

#[kprobe]
pub fn kp_dentry_spin_unlock_entry(ctx: ProbeContext) -> u32 {
    if let Some(lock) = ctx.arg::<u64>(0) {
        spin_released(lock);
    }
    0
}
