//! A lock's parts: its figures by owner, caller (call stack) or task, and
//! the names of the threads those rows show.
use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_comm, bpf_get_prandom_u32},
    macros::map,
    maps::PerCpuArray,
    programs::tracing::StackIdContext,
};
use pipelock_common::{
    DetailKey, DetailStats, Drop, LockKey, NO_STACK, TaskName, TraceConfig, detail, sampling,
};

use crate::{
    counters::{Adds, Atomic, MapValue, field},
    drops::count_only,
    maps::{STACKS, TASK_NAMES, detail_of, interval},
};

/// Each CPU's stack unwinds so far in an interval: `[interval, unwinds]`.
#[map]
static STACK_BUDGET: PerCpuArray<[u32; 2]> = PerCpuArray::with_max_entries(1, 0);

/// The current call stack's id in `STACKS` if callers are recorded
/// ([`NO_STACK`] otherwise, or when it could not be stored), flagged
/// [`sampling::SAMPLED`] when taken at random, or [`sampling::LEFT_OUT`].
#[inline(always)]
pub(crate) fn stack_id<C: EbpfContext + StackIdContext>(cfg: &TraceConfig, ctx: &C) -> u32 {
    if cfg.details & (1 << detail::CALLER) == 0 {
        return NO_STACK;
    }
    let flag = match take_stack(cfg) {
        Some(flag) => flag,
        None => return sampling::LEFT_OUT,
    };
    match unwound(ctx) {
        NO_STACK => NO_STACK,
        id => id | flag,
    }
}

/// The current call stack's id in `STACKS` ([`NO_STACK`] when it could not
/// be stored).
#[inline(always)]
pub(crate) fn unwound<C: EbpfContext + StackIdContext>(ctx: &C) -> u32 {
    match ctx.get_stackid(&STACKS, 0) {
        Ok(id) => id as u32,
        Err(_) => {
            // Counted, not logged: the report's drops line names it.
            count_only(Drop::StackLost);
            NO_STACK
        }
    }
}

/// Whether to unwind this stack: `Some(0)` within the CPU's exact budget,
/// `Some(SAMPLED)` drawn at random past it, None left out. Plain adds: a
/// lost update only moves the switch to sampling by one stack.
#[inline(always)]
pub(crate) fn take_stack(cfg: &TraceConfig) -> Option<u32> {
    if cfg.stack_sample <= 1 {
        return Some(0);
    }
    if let Some(budget) = STACK_BUDGET.get_ptr_mut(0) {
        // SAFETY: this CPU's value.
        let budget = unsafe { &mut *budget };
        let now = interval();
        if budget[0] != now {
            *budget = [now, 0];
        }
        if budget[1] < cfg.stacks_exact {
            budget[1] += 1;
            return Some(0);
        }
    }
    // SAFETY: no preconditions.
    let draw = unsafe { bpf_get_prandom_u32() };
    (draw % cfg.stack_sample == 0).then_some(sampling::SAMPLED)
}

/// One acquisition (or contended wait) in a lock's part `kind`/`id`;
/// the part, for what a caller adds.
#[inline(always)]
pub(crate) fn record_part(
    lock: LockKey,
    kind: u32,
    id: u32,
    acquired: bool,
    contended: bool,
    wait_ns: u64,
    hold_ns: u64,
) -> Option<MapValue<DetailStats, Atomic>> {
    record_weighed(lock, kind, id, 1, acquired, contended, wait_ns, hold_ns)
}

/// [`record_part`] of a record that stands for `weight` of them (a sampled
/// call stack: [`sampling`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn record_weighed(
    lock: LockKey,
    kind: u32,
    id: u32,
    weight: u64,
    acquired: bool,
    contended: bool,
    wait_ns: u64,
    hold_ns: u64,
) -> Option<MapValue<DetailStats, Atomic>> {
    let part = detail_of(&DetailKey { lock, kind, id })?;
    add_weighed(&part, weight, acquired, contended, wait_ns, hold_ns);
    Some(part)
}

/// Adds to `part` a record that stands for `weight` of them (a sampled
/// call stack: [`sampling`] keeps the sums a sample's estimate needs).
/// Adds of 0 are left out: an atomic one still takes the shared cache line.
#[inline(always)]
pub(crate) fn add_weighed<A: Adds>(
    part: &MapValue<DetailStats, A>,
    weight: u64,
    acquired: bool,
    contended: bool,
    wait_ns: u64,
    hold_ns: u64,
) {
    if acquired {
        part.add(field!(acquisitions), weight);
    }
    if contended {
        part.add(field!(contentions), weight);
    }
    part.add(field!(wait_ns), wait_ns * weight);
    part.raise(field!(wait_max_ns), wait_ns);
    if hold_ns != 0 {
        part.add(field!(hold_ns), hold_ns * weight);
    }
    if weight > 1 {
        part.add(field!(sampled[sampling::RECORDS]), 1);
        if contended {
            part.add(field!(sampled[sampling::CONTENDED]), 1);
        }
        part.add(field!(sampled[sampling::WAIT_SQUARES]), sampling::square(wait_ns));
        part.add(field!(sampled[sampling::WAIT_SUM]), wait_ns);
        if hold_ns != 0 {
            part.add(field!(sampled[sampling::HOLD_SQUARES]), sampling::square(hold_ns));
            part.add(field!(sampled[sampling::HOLD_SUM]), hold_ns);
        }
    }
}

/// Records the current thread's names (per-task rows), once per slot owner.
#[inline(always)]
pub(crate) fn name_current(cfg: &TraceConfig, pid_tgid: u64) {
    // Waiters are named for `--by task`, and in the hooked modes holders
    // are named as spinlock owners.
    if cfg.details & (1 << detail::TASK | 1 << detail::OWNER) == 0 {
        return;
    }
    let name = TaskName {
        tgid: (pid_tgid >> 32) as u32,
        _pad: 0,
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    };
    let _ = TASK_NAMES.insert(&(pid_tgid as u32), &name, 0);
}
