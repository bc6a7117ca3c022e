//! How counters and histograms inside map values are updated: atomic adds
//! where every CPU writes the value, plain adds on a CPU's own.
use pipelock_common::{Histogram, loglinear};

/// `*at += value`, atomically (BPF's `lock *(u64 *)(r + 0) += v`).
///
/// # Safety
/// `at` points at a live, 8-byte aligned map value.
#[inline(always)]
pub(crate) unsafe fn atomic_add(at: *mut u64, value: u64) {
    // SAFETY: as the caller promises.
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(at, value)
    };
}

/// `*at += 1` on a 4-byte histogram bucket, atomically (BPF's
/// `lock *(u32 *)(r + 0) += 1`).
///
/// # Safety
/// `at` points at a live, 4-byte aligned map value.
#[inline(always)]
unsafe fn atomic_inc32(at: *mut u32) {
    // SAFETY: as the caller promises.
    unsafe {
        core::intrinsics::atomic_xadd::<u32, u32, { core::intrinsics::AtomicOrdering::Relaxed }>(at, 1)
    };
}

/// `*counter += value` on a statistics value, which every CPU updates (and,
/// as fentry programs run with only migration disabled, several tasks on
/// one CPU too): a plain read-modify-write would lose updates, an atomic
/// add (BPF's `lock +=`) cannot.
#[inline(always)]
pub(crate) fn bump(counter: &mut u64, value: u64) {
    // SAFETY: a live, aligned map value.
    unsafe { atomic_add(counter, value) };
}

/// How a value is updated: atomic adds on a map value every CPU writes,
/// or plain ones on this CPU's own (tracepoint mode's CPU-local tables, see
/// `crate::cpu_local`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Update {
    Shared,
    Here,
}

/// Adds `value` to a counter updated as `how` says.
#[inline(always)]
pub(crate) fn add(counter: &mut u64, value: u64, how: Update) {
    if how == Update::Here {
        *counter += value;
    } else {
        bump(counter, value);
    }
}

/// `index`, with what the compiler knows of its range forgotten. A bucket
/// index comes from a count of leading zeros, which BPF spells as bit
/// tricks the verifier cannot bound; the compiler can, and would drop the
/// bounds check the verifier needs before the index becomes an offset
/// into the map value.
#[inline(always)]
fn forget_range(mut index: usize) -> usize {
    // SAFETY: a register moved onto itself.
    unsafe {
        core::arch::asm!("{0} = {0}", inout(reg) index, options(pure, nomem, nostack, preserves_flags))
    };
    index
}

/// Adds one duration to a histogram every CPU updates.
#[inline(always)]
pub(crate) fn record(hist: &mut Histogram, ns: u64) {
    record_as(hist, ns, Update::Shared);
}

/// Adds one duration to a histogram updated as `how` says. The maximum is
/// a plain compare and store (BPF has no atomic max before
/// compare-and-exchange, which needs a newer BPF ISA): two updates at once
/// can lose a maximum, never a count.
#[inline(always)]
pub(crate) fn record_as(hist: &mut Histogram, ns: u64, how: Update) {
    // No `count`: it is the sum of the buckets, which userspace takes (one
    // add less per recorded duration).
    add(&mut hist.total_ns, ns, how);
    if ns > hist.max_ns {
        hist.max_ns = ns;
    }
    if let Some(slot) = hist.buckets.get_mut(forget_range(loglinear::bucket(ns))) {
        if how == Update::Here {
            *slot += 1;
        } else {
            // SAFETY: a live, aligned map value.
            unsafe { atomic_inc32(slot) };
        }
    }
}
