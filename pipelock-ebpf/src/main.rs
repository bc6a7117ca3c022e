//! pipelock's kernel-side programs. Built for `bpfel-unknown-none` by
//! `pipelock-user/build.rs` (aya-build) and embedded in the `pipelock` binary.
#![no_std]
#![no_main]
// The BPF target has no atomic read-modify-write in `core::sync::atomic`
// (only loads and stores), but LLVM lowers `atomicrmw add` to BPF's
// `lock … +=`: the intrinsic reaches it.
#![feature(core_intrinsics)]
#![expect(
    internal_features,
    reason = "core_intrinsics, for atomic adds on the BPF target"
)]
// `asm!` on BPF: the kfunc calls (`btf_ptr::BtfPtr::cast`, `preempt`) are
// written as raw instruction bytes.
#![feature(asm_experimental_arch)]

mod btf_ptr;
mod counters;
mod cpu_local;
mod details;
mod drops;
mod files;
mod filter;
mod kernel_memory;
mod maps;
mod preempt;
mod probes;
mod recognise;
mod recorded;
mod task;
mod thread_slot;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any reachable panic, so this is never executed.
    loop {}
}

// GPL-compatible: bpf_probe_read_kernel and the tracing helpers are GPL-only.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
