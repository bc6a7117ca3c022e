//! Each CPU's own statistics of the locks and parts it records most
//! (`pipelock_common::{CpuLocalStats, CpuLocalDetails}`), updated with plain adds;
//! what they have no room for goes to the shared maps.
//!
//! Plain adds are safe only from programs that run to their end on their
//! CPU, and that no other writer of the table can interrupt:
//! - tracepoint mode's `contention_end`: tracepoints run with preemption
//!   off, and a run nested in one by an interrupt is skipped (a recursion
//!   miss: a classic tracepoint's `bpf_prog_active`, `tp_btf`'s own guard
//!   since 6.2). On older kernels an interrupt's end would also have to
//!   close a wait its task has open, and waits are not opened in
//!   interrupts (`in_interrupt`).
//! - hooked modes' pipe-mutex `contention_end` (a tracepoint, as above)
//!   and releases: a spinlock's runs with interrupts off; a
//!   mutex's runs with preemption off as a kprobe, but a fentry program
//!   only has migration disabled, so a mutex release uses the local table only
//!   where its body cannot be preempted (`runs_unpreempted`: the kernel
//!   preempts no kernel code, or has the kfuncs of `crate::preempt`).
//!   Interrupts nest no release of a pipe lock: no interrupt takes a pipe's
//!   mutex or wait-queue locks.
use aya_ebpf::{macros::map, maps::PerCpuArray};
use pipelock_common::{
    CPU_LOCAL_LOCKS, CPU_LOCAL_PARTS, CpuLocalDetails, CpuLocalStats, DetailKey, DetailStats, LockKey,
    LockStats,
};

use crate::{
    counters::{EitherValue, MapValue, Plain},
    details::{add_weighed, record_weighed},
    maps::{in_interval_map, interval, stats_of},
};

/// Switched and drained with `LOCK_STATS` (the same `STATS_SLOT` parity).
#[map]
pub(crate) static CPU_LOCAL_A: PerCpuArray<CpuLocalStats> = PerCpuArray::with_max_entries(1, 0);
#[map]
pub(crate) static CPU_LOCAL_B: PerCpuArray<CpuLocalStats> = PerCpuArray::with_max_entries(1, 0);
/// Switched and drained with `LOCK_DETAILS`.
#[map]
pub(crate) static CPU_DETAILS_A: PerCpuArray<CpuLocalDetails> = PerCpuArray::with_max_entries(1, 0);
#[map]
pub(crate) static CPU_DETAILS_B: PerCpuArray<CpuLocalDetails> = PerCpuArray::with_max_entries(1, 0);

/// The statistics of `key` to record a wait or hold in: in this CPU's
/// local table if `cpu_local` (a pipe's own lock, from a program the local
/// table is safe for) and it has room, else in the shared map.
#[inline(always)]
pub(crate) fn stats_to_record(key: &LockKey, cpu_local: bool) -> Option<EitherValue<LockStats>> {
    if cpu_local && let Some(stats) = cpu_local_stats_of(key) {
        return Some(EitherValue::Here(stats));
    }
    Some(EitherValue::Shared(stats_of(key)?))
}

/// This CPU's statistics of `key`: its entry in the local table, taken if free.
/// None once the local table holds other locks.
#[inline(always)]
fn cpu_local_stats_of(key: &LockKey) -> Option<MapValue<LockStats, Plain>> {
    let table = in_interval_map(interval() % 2 != 0, &CPU_LOCAL_A, &CPU_LOCAL_B, |map| {
        map.get_ptr_mut(0)
    })?;
    // SAFETY: this CPU's value; only this program writes it (see above).
    let table = unsafe { &mut *table };
    for at in 0..CPU_LOCAL_LOCKS {
        let entry = table.keys.get_mut(at)?;
        if entry.lock == 0 {
            *entry = *key;
        } else if *entry != *key {
            continue;
        }
        let stats = table.stats.get_mut(at)?;
        // SAFETY: as above: this CPU's own, one program run at a time.
        return Some(unsafe { MapValue::new(stats) });
    }
    None
}

/// This CPU's figures of part `key`: one of its two entries, taken if free.
#[inline(always)]
fn cpu_local_detail_of(key: &DetailKey) -> Option<MapValue<DetailStats, Plain>> {
    let table = in_interval_map(interval() % 2 != 0, &CPU_DETAILS_A, &CPU_DETAILS_B, |map| {
        map.get_ptr_mut(0)
    })?;
    // SAFETY: as in `cpu_local_stats_of`.
    let table = unsafe { &mut *table };
    let set = CpuLocalDetails::sets(key) & (CPU_LOCAL_PARTS - 2);
    for at in [set, set + 1] {
        let entry = table.keys.get_mut(at)?;
        if entry.lock.lock == 0 {
            *entry = *key;
        } else if *entry != *key {
            continue;
        }
        let part = table.stats.get_mut(at)?;
        // SAFETY: as in `cpu_local_stats_of`.
        return Some(unsafe { MapValue::new(part) });
    }
    None
}

/// Tracepoint mode: one contended wait of `ns` in part `kind`/`id` of
/// `lock`, in this CPU's local table if it has room, else in the shared map.
#[inline(always)]
pub(crate) fn record_contended_wait(
    lock: LockKey,
    kind: u32,
    id: u32,
    ns: u64,
) -> Option<EitherValue<DetailStats>> {
    record_contended_weighed(lock, kind, id, 1, ns)
}

/// [`record_contended_wait`] of a wait that stands for `weight` of them (a
/// sampled call stack: `pipelock_common::sampling`).
#[inline(always)]
pub(crate) fn record_contended_weighed(
    lock: LockKey,
    kind: u32,
    id: u32,
    weight: u64,
    ns: u64,
) -> Option<EitherValue<DetailStats>> {
    if let Some(part) = cpu_local_detail_of(&DetailKey { lock, kind, id }) {
        add_weighed(&part, weight, false, true, ns, 0);
        return Some(EitherValue::Here(part));
    }
    Some(EitherValue::Shared(record_weighed(
        lock, kind, id, weight, false, true, ns, 0,
    )?))
}
