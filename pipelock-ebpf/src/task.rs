//! Facts about the current task that take reads of `task_struct`.
use aya_ebpf::helpers::bpf_get_current_task;
use pipelock_common::TraceConfig;

use crate::{
    btf_ptr::{BtfPtr, with_address},
    kernel_memory::read,
};

/// Whether a `tp_btf` program runs in task context: its arguments (`ctx`)
/// live in `bpf_trace_runN`'s frame, on the stack the event fired on, and
/// x86-64 runs hard and soft interrupts on per-CPU interrupt stacks. (The
/// program's own stack cannot tell: since 6.13 programs may run on a
/// private one.) An interrupt runs on top of whatever task it interrupted:
/// without this check its lock events would count as that task's.
#[inline(always)]
pub(crate) fn on_task_stack<C>(cfg: &TraceConfig, task: BtfPtr, ctx: *const C) -> bool {
    // Unknown (no stack, no scratch word): count it as the task's, as
    // before the check existed.
    let stack = task.word(cfg.task_stack);
    stack == 0
        || with_address(ctx, |ctx_address| {
            ctx_address.wrapping_sub(stack) < cfg.thread_size as u64
        })
        .unwrap_or(true)
}

/// `bpf_get_current_pid_tgid()` for the current `task` (a typed pointer
/// the caller has anyway), in two plain loads: a helper call costs ~20 ns
/// where every kernel return goes through a return thunk (SRSO, retbleed
/// mitigations), and a contention begin made six of them.
#[inline(always)]
pub(crate) fn pid_tgid_of(cfg: &TraceConfig, task: BtfPtr) -> u64 {
    u64::from(task.half(cfg.task_tgid)) << 32 | u64::from(task.half(cfg.task_pid))
}

/// The current process's command name (its thread group leader's): an
/// io_uring worker thread is named `iou-wrk-PID`, a thread `-c` should
/// still count under its process.
#[inline(always)]
pub(crate) fn process_comm(cfg: &TraceConfig) -> Option<[u8; 16]> {
    // SAFETY: as above.
    let task = unsafe { bpf_get_current_task() };
    let leader = read::<u64>(task + cfg.task_group_leader as u64)?;
    read::<[u8; 16]>(leader + cfg.task_comm as u64)
}
