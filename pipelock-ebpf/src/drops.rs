//! What the programs could not record, counted per reason (`DROPS`), with
//! a warning in the log the first time a map fills up.
use aya_ebpf::{
    macros::map,
    maps::{Array, PerCpuArray},
};
use pipelock_common::Drop;

use crate::counters::atomic_add;

#[map]
pub(crate) static DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Drop::COUNT, 0);

#[inline(always)]
pub(crate) fn count_drop(reason: Drop) {
    count_only(reason);
    warn_full(reason);
}

/// [`count_drop`] without the log warning, where a program has no room
/// for it: each inlined warning is a byte-copy loop the verifier walks, and
/// `contention_end` (which unwinds call stacks) would pass its limit.
#[inline(always)]
pub(crate) fn count_only(reason: Drop) {
    if let Some(slot) = DROPS.get_ptr_mut(reason as u32) {
        // SAFETY: this CPU's slot (see `counters::Atomic` for why atomic).
        unsafe { atomic_add(slot, 1) };
    }
}

/// Which "map full" warnings have been logged (one slot per [`Drop`]).
#[map]
static WARNED: Array<u32> = Array::with_max_entries(Drop::COUNT, 0);

/// The first time a map fills up, a warning in the log (`--ebpf-log`):
/// the drop counters say how much was lost, this says when it began.
/// Once per run (two CPUs at once may both log it).
#[inline(always)]
fn warn_full(reason: Drop) {
    let message = match reason {
        Drop::StatsFull => "LOCK_STATS is full: new locks are counted as stats_full (raise --max-locks)",
        Drop::DetailFull => "LOCK_DETAILS is full: owners/callers/threads are counted as detail_full",
        Drop::UsersFull => "LOCK_USERS is full: processes on locks are counted as users_full",
        Drop::WatchFull => "WATCHED is full: waits go unsplit, counted as watch_full",
        Drop::FollowFull => "TASK_FILTER is full: children of COMMAND are not followed",
        _ => return,
    };
    let Some(flag) = WARNED.get_ptr_mut(reason as u32) else {
        return;
    };
    // SAFETY: a live map value; a race only logs twice.
    unsafe {
        if *flag != 0 {
            return;
        }
        *flag = 1;
    }
    aya_log_ebpf::warn!(&(), "{}", message);
}
