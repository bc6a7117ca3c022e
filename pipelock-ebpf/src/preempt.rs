//! fentry/fexit programs run with preemption off, where the kernel can.
//!
//! A trampoline only disables migration around its program: on a kernel
//! that preempts kernel code (`full` or `lazy`, Debian's 6.18) a program
//! preempted mid-run keeps its per-CPU "running" mark, and every run of
//! it on that CPU is skipped (`recursion_misses`) until its task runs
//! again, which in a herd of runnable tasks can be milliseconds. Each
//! skipped run of a lock hook can lose an acquisition. With the body
//! between `bpf_preempt_disable` and `bpf_preempt_enable` (6.10+) only the
//! trampoline's few instructions before and after it can be preempted.
//! kprobes and tracepoints already run with preemption off.
//!
//! The calls are written as raw bytes with a mark for their BTF id, as
//! `btf_ptr::BtfPtr::cast` is: userspace writes the kfuncs' ids over the
//! marks, or turns both calls into `r0 = 0` on a kernel without them.
use pipelock_common::{PREEMPT_DISABLE_MARK, PREEMPT_ENABLE_MARK};

/// A kfunc call without arguments, the kfunc named by its mark (r0-r5
/// clobbered). No `nomem`: memory accesses stay on their side of it.
macro_rules! marked_call {
    ($mark:expr) => {
        // SAFETY: a kfunc call of the BPF calling convention; the verifier
        // checks that every path re-enables preemption before exit.
        unsafe {
            core::arch::asm!(
                // code 0x85 (call), src_reg 2 (BPF_PSEUDO_KFUNC_CALL), off 0
                // (the kernel's own BTF), imm the mark.
                ".8byte ({mark} << 32) | 0x2085",
                mark = const $mark,
                lateout("r0") _, lateout("r1") _, lateout("r2") _,
                lateout("r3") _, lateout("r4") _, lateout("r5") _,
                options(nostack),
            )
        }
    };
}

/// Runs `body` with preemption off (see the module).
#[inline(always)]
pub(crate) fn unpreempted<R>(body: impl FnOnce() -> R) -> R {
    marked_call!(PREEMPT_DISABLE_MARK);
    let result = body();
    marked_call!(PREEMPT_ENABLE_MARK);
    result
}
