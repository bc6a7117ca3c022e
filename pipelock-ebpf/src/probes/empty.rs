//! Programs that do nothing, for `pipelock overhead`: attached at the very
//! hooks a mode uses, they measure what the attach mechanism itself
//! (trampoline, kprobe breakpoint, or tracepoint dispatch) costs the
//! workload — the floor under what pipelock's own programs add. One
//! fentry/fexit pair per hook, because a trampoline program is verified for
//! one target function; a kprobe program attaches anywhere.
use aya_ebpf::{
    macros::{btf_tracepoint, fentry, fexit, kprobe, kretprobe},
    programs::{BtfTracePointContext, FEntryContext, FExitContext, ProbeContext, RetProbeContext},
};

macro_rules! empty_trampolines {
    ($($entry:ident $exit:ident),* $(,)?) => {$(
        #[fentry]
        pub fn $entry(_ctx: FEntryContext) -> i32 {
            0
        }

        #[fexit]
        pub fn $exit(_ctx: FExitContext) -> i32 {
            0
        }
    )*};
}

// Named as in pipelock_common::programs::EMPTY_FENTRY / EMPTY_FEXIT.
empty_trampolines!(
    empty_fentry_0 empty_fexit_0,
    empty_fentry_1 empty_fexit_1,
    empty_fentry_2 empty_fexit_2,
    empty_fentry_3 empty_fexit_3,
    empty_fentry_4 empty_fexit_4,
    empty_fentry_5 empty_fexit_5,
    empty_fentry_6 empty_fexit_6,
    empty_fentry_7 empty_fexit_7,
    empty_fentry_8 empty_fexit_8,
    empty_fentry_9 empty_fexit_9,
    empty_fentry_10 empty_fexit_10,
    empty_fentry_11 empty_fexit_11,
    empty_fentry_12 empty_fexit_12,
    empty_fentry_13 empty_fexit_13,
    empty_fentry_14 empty_fexit_14,
    empty_fentry_15 empty_fexit_15,
);

#[kprobe]
pub fn empty_kprobe(_ctx: ProbeContext) -> u32 {
    0
}

#[kretprobe]
pub fn empty_kretprobe(_ctx: RetProbeContext) -> u32 {
    0
}

#[btf_tracepoint(function = "contention_begin")]
pub fn empty_contention_begin(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "contention_end")]
pub fn empty_contention_end(_ctx: BtfTracePointContext) -> i32 {
    0
}
