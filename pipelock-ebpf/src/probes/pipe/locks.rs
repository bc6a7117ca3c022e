//! Timing a call's pipe locks: lock call → acquired (wait) → released
//! (hold), recorded per lock at the release.
use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_task, bpf_ktime_get_ns},
    programs::tracing::StackIdContext,
};
use pipelock_common::{
    LCB_F_SPIN, LockInfo, LockKey, LockStats, TaskPipe, class, detail,
    pipe_lock::{self, COUNT, PIPES, SLOTS},
    sampling,
};

use super::calls::{PIPE_PENDING, adopt_pipe, current_state, which_lock};
use crate::{
    counters::{Adds, MapValue, field, with_value},
    cpu_local::stats_to_record,
    details::{record_part, record_weighed, stack_id},
    maps::{LOCK_INFO, config},
    probes::holder::{
        NO_SPLIT, mutex_owner, name_task, owner_split, owners_wanted, record_owner_here, record_split,
        unwatch, watch,
    },
};

pub(super) const CLASSES: [u32; COUNT] = [class::PIPE_MUTEX, class::PIPE_RD_WAIT, class::PIPE_WR_WAIT];

#[inline(always)]
pub(super) fn now() -> u64 {
    // SAFETY: no preconditions.
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
pub(super) fn class_wanted(index: usize) -> bool {
    config().class_mask & (1 << CLASSES[index % COUNT]) != 0
}

/// mutex_lock entry: acquired now unless a `contention_begin` follows.
#[inline(always)]
pub(super) fn mutex_lock_call<C: EbpfContext + StackIdContext>(ctx: &C, lock: u64) {
    let Some(mut state) = current_state() else {
        return;
    };
    let state = &mut *state;
    let Some(index) = pipe_mutex(state, lock) else {
        return;
    };
    // The stack first: its unwind would otherwise be timed as part of the wait.
    let stack = stack_id(config(), ctx);
    start_mutex_wait(state, index, lock, stack);
}

/// A `contention_begin` of a mutex: if it is the call's pipe mutex and its
/// lock call went unseen, the wait starts here.
///
/// A fentry program preempted mid-run keeps its per-CPU "running" mark
/// until its task runs again, and the kernel skips every run of it on that
/// CPU meanwhile (`recursion_misses`; `crate::preempt` narrows the window
/// but the owed preemption still lands inside it). A skipped
/// `mutex_lock_entry` run would lose its acquisition, with its wait and
/// hold (and, at a call's first mutex, the call's pipe): a contended one
/// is found again here. The begin is a tracepoint, whose program runs with
/// preemption off: the acquisition is timed from its first begin, which
/// misses only the failed fast path before the slow path (nanoseconds),
/// and it has no call stack (its caller rows count it as not sampled).
#[inline(always)]
pub(super) fn mutex_begin_without_call(state: &mut TaskPipe, lock: u64) {
    if state.pipe[0] != PIPE_PENDING
        && which_lock(state, lock).is_none_or(|index| index >= SLOTS || state.wait_start[index] != 0)
    {
        return;
    }
    let Some(index) = pipe_mutex(state, lock) else {
        return;
    };
    start_mutex_wait(state, index, lock, sampling::LEFT_OUT);
}

/// The index of `lock` if it is the traced call's pipe mutex, naming the
/// call's pipe first if this is its first mutex.
#[inline(always)]
fn pipe_mutex(state: &mut TaskPipe, lock: u64) -> Option<usize> {
    let tgid = (aya_ebpf::helpers::bpf_get_current_pid_tgid() >> 32) as u32;
    if state.pipe[0] == PIPE_PENDING && !adopt_pipe(state, lock, tgid) {
        // Not the pipe's mutex after all: leave this call untraced.
        state.pipe[0] = 0;
        return None;
    }
    let index = which_lock(state, lock)?;
    (index < SLOTS && index % COUNT == pipe_lock::MUTEX && class_wanted(index)).then_some(index)
}

/// The wait for pipe mutex `index` starts now; its hold too, unless a
/// `contention_begin` says it waits.
#[inline(always)]
fn start_mutex_wait(state: &mut TaskPipe, index: usize, lock: u64, stack: u32) {
    if index >= SLOTS {
        return;
    }
    state.stack_id[index] = stack;
    let at = now();
    state.wait_start[index] = at;
    state.hold_start[index] = at;
    state.wait_ns[index] = 0;
    state.contended[index] = 0;
    state.flags_and[index] = u32::MAX;
    forget_owner(state, index / COUNT);
    watch_hold(state, index / COUNT, at);
    register(state, index, lock);
}

/// `--hold-states`: this thread starts watching itself as the holder of
/// pipe `pipe`'s mutex (a hold whose release was missed stops first).
#[inline(always)]
fn watch_hold(state: &mut TaskPipe, pipe: usize, at: u64) {
    let cfg = config();
    if pipe >= PIPES || cfg.details & (1 << detail::HOLD) == 0 {
        return;
    }
    // SAFETY: no preconditions; the task is only used as a map key and for probe reads.
    let task = unsafe { bpf_get_current_task() };
    if state.hold_watched & (1 << pipe) != 0 {
        let _ = unwatch(task, &state.hold_at_start[pipe], at);
        state.hold_watched &= !(1 << pipe);
    }
    if let Some(clock) = watch(cfg, task, at) {
        state.hold_at_start[pipe] = clock;
        state.hold_watched |= 1 << pipe;
    }
}

/// A begin (`flags`) of a contended mutex acquisition of the call's pipe
/// `pipe`: who owns the mutex (read again at a later begin if the first
/// found it between two owners), and, from the first begin that sleeps,
/// what the owner is doing (see `probes::holder`).
#[inline(always)]
pub(super) fn mutex_contended(state: &mut TaskPipe, pipe: usize, lock: u64, flags: u32) {
    let cfg = config();
    if pipe >= PIPES || !owners_wanted(cfg) {
        return;
    }
    if state.owner_tid[pipe] == 0 {
        let Some((task, tid)) = mutex_owner(cfg, lock) else {
            return;
        };
        state.owner_tid[pipe] = tid;
        state.owner_task[pipe] = task;
        name_task(cfg, task, tid);
    }
    if flags & LCB_F_SPIN == 0
        && state.owner_watched & (1 << pipe) == 0
        && let Some(clock) = watch(cfg, state.owner_task[pipe], now())
    {
        state.holder_at_start[pipe] = clock;
        state.owner_watched |= 1 << pipe;
    }
}

/// Pipe `pipe`'s mutex wait is over (or will never be seen ending): its
/// owner is forgotten, and no longer watched if it was.
#[inline(always)]
fn forget_owner(state: &mut TaskPipe, pipe: usize) {
    if pipe >= PIPES {
        return;
    }
    if state.owner_watched & (1 << pipe) != 0 {
        let _ = unwatch(state.owner_task[pipe], &state.holder_at_start[pipe], 0);
    }
    clear_owner(state, pipe);
}

/// No owner known for pipe `pipe`'s mutex wait, and none watched.
#[inline(always)]
fn clear_owner(state: &mut TaskPipe, pipe: usize) {
    if pipe < PIPES {
        state.owner_watched &= !(1 << pipe);
        state.owner_task[pipe] = 0;
        state.owner_tid[pipe] = 0;
    }
}

/// A contended mutex acquisition ends: the hold starts now.
#[inline(always)]
pub(super) fn mutex_contention_end(lock: u64) {
    let Some(mut state) = current_state() else {
        return;
    };
    let state = &mut *state;
    let Some(index) = which_lock(state, lock) else {
        return;
    };
    if index >= SLOTS
        || index % COUNT != pipe_lock::MUTEX
        || state.wait_start[index] == 0
        || state.contended[index] == 0
    {
        return;
    }
    let at = now();
    let wait_ns = at - state.wait_start[index];
    state.wait_ns[index] = wait_ns;
    state.wait_start[index] = 0;
    state.hold_start[index] = at;
    let pipe = index / COUNT;
    // The hold starts now, not at the lock call.
    if pipe < PIPES && state.hold_watched & (1 << pipe) != 0 {
        // SAFETY: as in `watch_hold`.
        let task = unsafe { bpf_get_current_task() };
        if let Some(clock) = crate::maps::WATCHED.get_ptr_mut(&task) {
            // SAFETY: a live map value.
            state.hold_at_start[pipe] = unsafe { (*clock).at(at) };
        }
    }
    if pipe < PIPES && owners_wanted(config()) {
        let watched = (state.owner_watched & (1 << pipe) != 0)
            .then_some((state.owner_task[pipe], &state.holder_at_start[pipe]));
        let spun_behind_owner = state.flags_and[index] & LCB_F_SPIN != 0 && state.owner_tid[pipe] != 0;
        let split = owner_split(watched, spun_behind_owner, wait_ns, at);
        let key = LockKey {
            lock,
            owner: state.ino[pipe],
        };
        record_owner_here(key, state.owner_tid[pipe], wait_ns, split);
        clear_owner(state, pipe);
    }
}

#[inline(always)]
pub(super) fn lock_call<C: EbpfContext + StackIdContext>(ctx: &C, lock: u64) {
    let Some(mut state) = current_state() else {
        return;
    };
    let state = &mut *state;
    if let Some(index) = which_lock(state, lock)
        && index < SLOTS
    {
        // As in `mutex_lock_call`: the unwind is not part of the wait.
        state.stack_id[index] = stack_id(config(), ctx);
        state.wait_start[index] = now();
        state.contended[index] = 0;
        state.flags_and[index] = u32::MAX;
    }
}

#[inline(always)]
pub(super) fn acquired(lock: u64) {
    let Some(mut state) = current_state() else {
        return;
    };
    let state = &mut *state;
    if let Some(index) = which_lock(state, lock) {
        acquired_at(state, index, lock);
    }
}

/// kretprobe flavour: a return carries no lock argument, but a task is in at
/// most one spinlock call at a time, so the pending one is it.
#[inline(always)]
pub(super) fn acquired_pending() {
    let Some(mut state) = current_state() else {
        return;
    };
    let state = &mut *state;
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
pub(super) fn acquired_at(state: &mut TaskPipe, index: usize, lock: u64) {
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
pub(super) fn register(state: &mut TaskPipe, index: usize, lock: u64) {
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
                known: 0,
                name: [0; 32],
                detail: 0,
            };
            let _ = LOCK_INFO.insert(&key, &info, BPF_NOEXIST as u64);
        }
        state.registered |= 1 << index;
    }
}

/// Records an acquisition with its release (one lookup of the statistics
/// per lock/unlock pair instead of two; the wait's record counts it,
/// `LockStats::acquisitions`); the releaser before this one.
#[inline(always)]
fn record_release<A: Adds>(
    stats: &MapValue<LockStats, A>,
    owner: u64,
    contended: bool,
    slept: bool,
    wait: u64,
    hold: u64,
) -> u64 {
    // A spinlock's contended acquirer waited for whoever released it last
    // (a plain store: a race can name the other of two releasers).
    let previous = stats.load(field!(last_holder));
    stats.store(field!(last_holder), owner & 0xffff_ffff);
    if contended {
        stats.add(field!(contentions), 1);
        if slept {
            stats.add(field!(slept), 1);
        }
    }
    stats.record(field!(wait), wait);
    stats.record(field!(hold), hold);
    previous
}

#[inline(always)]
pub(super) fn released(lock: u64) {
    let Some(mut state) = current_state() else {
        return;
    };
    let owner = state.owner();
    let state = &mut *state;
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
    let cfg = config();
    // This CPU's local table takes plain adds from programs that run to their end:
    // a spinlock's release runs with interrupts off, a mutex's only where
    // the kernel preempts no kernel code (see `crate::cpu_local`).
    let unpreempted = index % COUNT != pipe_lock::MUTEX || cfg.runs_unpreempted != 0;
    let Some(stats) = stats_to_record(&key, unpreempted) else {
        return;
    };
    if start == 0 {
        // Released without an acquisition this call saw (taken before the
        // call was entered, or its lock call's return was missed).
        with_value!(stats, |stats| stats.add(field!(dropped), 1));
        return;
    }
    let contended = state.contended[index] != 0;
    let slept = contended && state.flags_and[index] & LCB_F_SPIN == 0;
    let at = now();
    let (wait, hold) = (state.wait_ns[index], at - start);
    let previous = with_value!(stats, |stats| record_release(
        &stats, owner, contended, slept, wait, hold
    ));
    if contended && index % COUNT != pipe_lock::MUTEX && owners_wanted(cfg) {
        // The shared rows: the local table's set hash would do arithmetic on the
        // lock, which the verifier refuses for a hook's typed pointer.
        record_split(key, detail::OWNER, previous as u32, wait, NO_SPLIT);
    }
    let pipe = index / COUNT;
    if index % COUNT == pipe_lock::MUTEX && pipe < PIPES && state.hold_watched & (1 << pipe) != 0 {
        state.hold_watched &= !(1 << pipe);
        // SAFETY: as in `watch_hold`.
        let task = unsafe { bpf_get_current_task() };
        let split = unwatch(task, &state.hold_at_start[pipe], at);
        record_split(key, detail::HOLD, 0, hold, split);
    }
    if cfg.details & (1 << detail::CALLER) != 0
        && let Some((id, weight)) = sampling::weighed(state.stack_id[index], cfg.stack_sample)
    {
        let _ = record_weighed(key, detail::CALLER, id, weight, true, contended, wait, hold);
    }
    if cfg.details & (1 << detail::TASK) != 0 {
        let _ = record_part(key, detail::TASK, owner as u32, true, contended, wait, hold);
    }
}
