//! Programs that do nothing: `pipelock probe` loads (and for kprobes, attaches)
//! them to learn which attach types this kernel accepts, before any real work.
use aya_ebpf::{
    macros::{fentry, kprobe},
    programs::{FEntryContext, ProbeContext},
};

#[fentry(function = "mutex_unlock")]
pub fn probe_fentry(_ctx: FEntryContext) -> i32 {
    0
}

#[kprobe]
pub fn probe_kprobe(_ctx: ProbeContext) -> u32 {
    0
}
