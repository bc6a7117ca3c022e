//! Who made a waiter wait, and what that owner was doing meanwhile.
//!
//! A contended mutex names its owner (`mutex->owner`, flag bits masked off,
//! the source `perf lock contention -o` reads). While at least one waiter
//! waits for it, the owner is *watched*: `sched_switch` and `sched_waking`
//! keep its [`HolderClock`] (time on a CPU, runnable, sleeping). The waiter
//! reads the clock when its wait starts and when it ends; the difference
//! splits its wait by the owner's state. Nobody waiting: the scheduler
//! programs return after one array read.
//!
//! A waiter is watched for only once it sleeps. `__mutex_lock_common`
//! begins with `contention_begin(LCB_F_MUTEX | LCB_F_SPIN)` and an
//! optimistic spin, which `mutex_spin_on_owner` keeps up only while the
//! owner is on a CPU (`owner_on_cpu`, which also asks whether the owner's
//! vCPU was preempted); it emits `contention_begin(LCB_F_MUTEX)` when it
//! queues to sleep. So a wait that only spun is the owner's time on a CPU
//! by the kernel's own rule, and costs no watching (`holder::with_spin`): on a
//! herd of pipe writers nearly every mutex wait is one.
use aya_ebpf::{bindings::BPF_NOEXIST, macros::btf_tracepoint, programs::BtfTracePointContext};
use pipelock_common::{
    DetailStats, Drop, HolderClock, LockKey, TaskName, TraceConfig, detail,
    holder::{self, STATES, with_spin},
};

use crate::btf_ptr::BtfPtr;
use crate::cpu_local::record_contended_wait;
use crate::recorded::first_naming;
use crate::{
    counters::{Adds, MapValue, atomic_add, field, with_value},
    details::record_part,
    drops::count_drop,
    kernel_memory::read,
    maps::{TASK_NAMES, WATCHED, WATCHERS},
};

/// Whether waits are split by owner (the pipe-mutex class is traced).
#[inline(always)]
pub(crate) fn owners_wanted(cfg: &TraceConfig) -> bool {
    cfg.details & (1 << detail::OWNER) != 0
}

/// The task owning the mutex at `lock` and its thread id (plain loads
/// where the kernel has `bpf_rdonly_cast`, else two probe reads).
#[inline(always)]
pub(crate) fn mutex_owner(cfg: &TraceConfig, lock: u64) -> Option<(u64, u32)> {
    let task = mutex_owner_word(cfg, lock)? & !7;
    if task == 0 {
        return None;
    }
    if let Some(task_ptr) = BtfPtr::cast(task, cfg.btf_task) {
        return Some((task, task_ptr.half(cfg.task_pid)));
    }
    Some((task, read::<u32>(task + cfg.task_pid as u64)?))
}

/// A mutex's owner word as it is: the owner's `task_struct` and three flag bits.
#[inline(always)]
pub(crate) fn mutex_owner_word(cfg: &TraceConfig, lock: u64) -> Option<u64> {
    if let Some(mutex) = BtfPtr::cast(lock, cfg.btf_mutex) {
        return Some(mutex.word(cfg.mutex_owner));
    }
    read::<u64>(lock + cfg.mutex_owner as u64)
}

/// Records a thread's process and name once (owner and per-task rows).
#[inline(always)]
pub(crate) fn name_task(cfg: &TraceConfig, task: u64, tid: u32) {
    if !first_naming(tid) {
        return;
    }
    // SAFETY: a lookup only.
    if unsafe { TASK_NAMES.get(&tid) }.is_some() {
        return;
    }
    let name = TaskName {
        tgid: read::<u32>(task + cfg.task_tgid as u64).unwrap_or(0),
        _pad: 0,
        comm: read::<[u8; 16]>(task + cfg.task_comm as u64).unwrap_or([0; 16]),
    };
    let _ = TASK_NAMES.insert(&tid, &name, BPF_NOEXIST as u64);
}

#[inline(always)]
fn add_watcher(delta: u64) {
    if let Some(count) = WATCHERS.get_ptr_mut(0) {
        // SAFETY: the map's one value; every update is atomic.
        unsafe { atomic_add(count, delta) };
    }
}

/// One more waiter watches `task`: its clock at `now` (None: not watched,
/// the map is full).
#[inline(always)]
pub(crate) fn watch(cfg: &TraceConfig, task: u64, now: u64) -> Option<[u64; STATES]> {
    let found = WATCHED.get_ptr_mut(&task).or_else(|| {
        // What it is doing now; from here on the scheduler programs say.
        let (on_cpu, state) = match BtfPtr::cast(task, cfg.btf_task) {
            Some(typed) => (typed.half(cfg.task_on_cpu), typed.half(cfg.task_state)),
            None => (
                read::<u32>(task + cfg.task_on_cpu as u64).unwrap_or(0),
                read::<u32>(task + cfg.task_state as u64).unwrap_or(0),
            ),
        };
        let clock = HolderClock {
            waiters: 0,
            state: if on_cpu != 0 {
                holder::ON_CPU
            } else if state == 0 {
                holder::RUNNABLE
            } else {
                holder::SLEEPING
            } as u32,
            _pad: 0,
            since_ns: now,
            total_ns: [0; STATES],
        };
        // Another CPU may insert it meanwhile: then that one is used.
        let _ = WATCHED.insert(&task, &clock, BPF_NOEXIST as u64);
        WATCHED.get_ptr_mut(&task)
    });
    let Some(clock) = found else {
        count_drop(Drop::WatchFull);
        return None;
    };
    add_watcher(1);
    // SAFETY: a live map value other CPUs update too: its count only
    // atomically, the clock read as a copy.
    unsafe {
        atomic_add(&raw mut (*clock).waiters, 1);
        Some(clock.read_volatile().at(now))
    }
}

/// A split of a wait or hold by what the watched task did: ns per state.
/// All zeros is "no split" (nothing is added for it). An array, never an
/// `Option` of one: LLVM reads a `None`'s payload as an undefined spill
/// slot, and verifiers before the uninitialised-stack fix (Debian's
/// 6.1.172) refuse a read beyond the stack written so far.
pub(crate) type Split = [u64; STATES];

/// No split: the owner was not watched.
pub(crate) const NO_SPLIT: Split = [0; STATES];

/// A waiter stops watching `task`: the owner's time in each state since
/// the waiter's `start` ([`NO_SPLIT`]: the entry went).
#[inline(always)]
pub(crate) fn unwatch(task: u64, start: &[u64; STATES], now: u64) -> Split {
    unwatched(task, start, now).1
}

/// [`unwatch`], and whether the entry was still there.
#[inline(always)]
fn unwatched(task: u64, start: &[u64; STATES], now: u64) -> (bool, Split) {
    let Some(clock) = WATCHED.get_ptr_mut(&task) else {
        return (false, NO_SPLIT);
    };
    add_watcher(u64::MAX);
    // SAFETY: a live map value (see `watch`).
    let (times, last) = unsafe {
        atomic_add(&raw mut (*clock).waiters, u64::MAX);
        let copy = clock.read_volatile();
        (copy.at(now), copy.waiters == 0)
    };
    // Two waiters ending at once may both see 0: the second remove fails.
    if last {
        let _ = WATCHED.remove(&task);
    }
    let mut since = NO_SPLIT;
    for state in 0..STATES {
        since[state] = times[state].saturating_sub(start[state]);
    }
    (true, since)
}

/// The split of a contended mutex wait of `ns` as it ends at `now`: the
/// watched owner's clock since the waiter slept, plus its spin; a wait
/// that only spun behind a known owner (`spun_behind_owner`), its spin;
/// otherwise (no owner read, or one slept with nobody watched: `WATCHED`
/// full), no split.
#[inline(always)]
pub(crate) fn owner_split(
    watched: Option<(u64, &[u64; STATES])>,
    spun_behind_owner: bool,
    ns: u64,
    now: u64,
) -> Split {
    match watched {
        Some((task, start)) => match unwatched(task, start, now) {
            (true, since_sleep) => with_spin(since_sleep, ns),
            (false, _) => NO_SPLIT,
        },
        None if spun_behind_owner => with_spin(NO_SPLIT, ns),
        None => NO_SPLIT,
    }
}

/// One wait (or hold) of `ns` in part `kind`/`id` of `lock`, with what the
/// watched task did meanwhile.
#[inline(always)]
pub(crate) fn record_split(lock: LockKey, kind: u32, id: u32, ns: u64, split: Split) {
    // A hold is an acquisition and its hold time; anything else a contended wait.
    let part = if kind == detail::HOLD {
        record_part(lock, kind, id, true, false, 0, ns)
    } else {
        record_part(lock, kind, id, false, true, ns, 0)
    };
    if let Some(part) = part {
        add_split(&part, ns, split);
    }
}

/// Adds one contended wait of `ns` to `lock`'s row of owner `tid`, with
/// the owner's state split (clamped to the wait: the clock's parts are read
/// without a lock), in this CPU's local table where it has room: only from the
/// programs `crate::cpu_local` names.
#[inline(always)]
pub(crate) fn record_owner_here(lock: LockKey, tid: u32, ns: u64, split: Split) {
    if let Some(part) = record_contended_wait(lock, detail::OWNER, tid, ns) {
        with_value!(part, |part| add_split(&part, ns, split));
    }
}

/// Adds the watched task's states over `ns` to `part`.
#[inline(always)]
fn add_split<A: Adds>(part: &MapValue<DetailStats, A>, ns: u64, split: Split) {
    let mut left = ns;
    for state in 0..STATES {
        let share = if split[state] < left { split[state] } else { left };
        left -= share;
        // A spin-only wait has one share, no split none: an atomic add of
        // 0 still takes the shared cache line.
        if share != 0 {
            part.add(field!(holder_ns[state]), share);
        }
    }
}

#[inline(always)]
fn enter(clock: *mut HolderClock, state: usize, now: u64) {
    // SAFETY: a live map value. Only the task's own switches and its
    // wake-up write its clock, one after the other; waiters on other CPUs
    // read it as a copy and add to `waiters` atomically, so no reference
    // to it is made.
    unsafe {
        let was = (&raw const (*clock).state).read_volatile() as usize;
        if was == state {
            return;
        }
        let since = (&raw const (*clock).since_ns).read_volatile();
        if was < STATES {
            let total = (&raw mut (*clock).total_ns).cast::<u64>().add(was);
            total.write_volatile(total.read_volatile() + now.saturating_sub(since));
        }
        (&raw mut (*clock).state).write_volatile(state as u32);
        (&raw mut (*clock).since_ns).write_volatile(now);
    }
}

#[inline(always)]
fn anyone_watching() -> bool {
    WATCHERS.get(0).copied().unwrap_or(0) != 0
}

#[inline(always)]
fn now() -> u64 {
    // SAFETY: no preconditions.
    unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() }
}

/// sched_switch(bool preempt, struct task_struct *prev, struct task_struct
/// *next, unsigned int prev_state): a preempted task, or one that switched
/// out still `TASK_RUNNING`, is runnable; any other state is a sleep.
#[btf_tracepoint(function = "sched_switch")]
pub fn holder_switch(ctx: BtfTracePointContext) -> i32 {
    if !anyone_watching() {
        return 0;
    }
    let (preempt, prev, next, prev_state): (u64, u64, u64, u64) =
        (ctx.arg(0), ctx.arg(1), ctx.arg(2), ctx.arg(3));
    // Each lookup on its own: the verifier refuses the `or` of two map
    // pointers that a shared "neither found" test compiles to.
    if let Some(clock) = WATCHED.get_ptr_mut(&prev) {
        let runnable = preempt & 0xff != 0 || prev_state as u32 == 0;
        let state = if runnable {
            holder::RUNNABLE
        } else {
            holder::SLEEPING
        };
        enter(clock, state, now());
    }
    if let Some(clock) = WATCHED.get_ptr_mut(&next) {
        enter(clock, holder::ON_CPU, now());
    }
    0
}

/// sched_waking(struct task_struct *p): a sleeping owner is runnable again.
#[btf_tracepoint(function = "sched_waking")]
pub fn holder_waking(ctx: BtfTracePointContext) -> i32 {
    if !anyone_watching() {
        return 0;
    }
    let task: u64 = ctx.arg(0);
    if let Some(clock) = WATCHED.get_ptr_mut(&task) {
        // SAFETY: a live map value (see `enter`).
        if unsafe { (&raw const (*clock).state).read_volatile() } as usize == holder::SLEEPING {
            enter(clock, holder::RUNNABLE, now());
        }
    }
    0
}
