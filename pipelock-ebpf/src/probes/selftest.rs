//! `lock:contention_begin` counters: the first program of the pipeline, used by
//! `pipelock probe --self-test` to prove load → attach → map read end to end.
use aya_ebpf::{
    EbpfContext,
    macros::{btf_tracepoint, map, tracepoint},
    maps::PerCpuArray,
    programs::{BtfTracePointContext, TracePointContext},
};
use aya_log_ebpf::error;

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
