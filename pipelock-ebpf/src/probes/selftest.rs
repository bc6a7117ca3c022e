//! `lock:contention_begin` counters: the first program of the pipeline, used by
//! `pipelock probe --self-test` to prove load → attach → map read end to end,
//! and the check that tells interrupt context from task context.
use aya_ebpf::{
    EbpfContext,
    helpers::bpf_get_current_comm,
    macros::{btf_tracepoint, map, tracepoint},
    maps::PerCpuArray,
    programs::{BtfTracePointContext, TracePointContext},
};
use aya_log_ebpf::error;

use crate::{btf_ptr::BtfPtr, maps::config, task::on_task_stack};

#[map]
static CONTENTION_BEGIN_COUNT: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn count_one<C: EbpfContext>(ctx: &C) -> u32 {
    match CONTENTION_BEGIN_COUNT.get_ptr_mut(0) {
        // SAFETY: a per-CPU slot is only touched by programs on this CPU, and a
        // tracing program is not preempted by another run on the same CPU.
        Some(slot) => unsafe { *slot += 1 },
        // An array lookup of index 0 cannot fail; log if the map were ever resized.
        None => error!(ctx, "CONTENTION_BEGIN_COUNT slot 0 missing"),
    }
    0
}

#[tracepoint(category = "lock", name = "contention_begin")]
pub fn contention_begin_count_tp(ctx: TracePointContext) -> u32 {
    count_one(&ctx)
}

#[btf_tracepoint(function = "contention_begin")]
pub fn contention_begin_count_btf(ctx: BtfTracePointContext) -> i32 {
    count_one(&ctx) as i32
}

/// The interrupt-context check of tracepoint mode (`on_task_stack`) judged
/// on events whose context is known: `[syscalls on a task stack, syscalls
/// not, softirqs outside ksoftirqd on a task stack, softirqs not]`.
#[map]
static INTERRUPT_CHECK: PerCpuArray<u64> = PerCpuArray::with_max_entries(4, 0);

#[inline(always)]
fn judge<C: EbpfContext>(ctx: &C, first_slot: u32) {
    let slot = if on_task_stack(config(), BtfPtr::current_task(), ctx.as_ptr().cast_const()) {
        first_slot
    } else {
        first_slot + 1
    };
    if let Some(count) = INTERRUPT_CHECK.get_ptr_mut(slot) {
        // SAFETY: this CPU's slot; an atomic add, as fentry-era programs
        // may be preempted (see counters::Atomic).
        unsafe { crate::counters::atomic_add(count, 1) };
    }
}

/// Every syscall runs in task context.
#[btf_tracepoint(function = "sys_enter")]
pub fn selftest_sys_enter(ctx: BtfTracePointContext) -> i32 {
    judge(&ctx, 0);
    0
}

/// A softirq runs in interrupt context, on x86-64's interrupt stack, unless
/// ksoftirqd runs it as a task.
#[btf_tracepoint(function = "softirq_entry")]
pub fn selftest_softirq_entry(ctx: BtfTracePointContext) -> i32 {
    if !bpf_get_current_comm().is_ok_and(|comm| comm.starts_with(b"ksoftirqd")) {
        judge(&ctx, 2);
    }
    0
}
