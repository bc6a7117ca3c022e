//! pipelock's own programs as the kernel accounts for them: run count and
//! run time (while a `BPF_ENABLE_STATS` descriptor is held) and the
//! `recursion_misses` counter — runs the kernel skipped because another BPF
//! program was already running on that CPU (trampoline recursion guard, and
//! since 6.6 the kprobe/tracepoint `bpf_prog_active` guard too).
//! aya 0.14's `ProgramInfo` keeps `recursion_misses` private, hence the
//! direct `BPF_OBJ_GET_INFO_BY_FD`.
use std::{
    mem::size_of,
    os::fd::{AsFd, AsRawFd, OwnedFd},
};

use aya::Ebpf;
use aya_obj::generated::{bpf_attr, bpf_cmd, bpf_prog_info};

use crate::model::ProgramStats;

/// Run-time statistics stay on while this is held, and only for it: the
/// global `kernel.bpf_stats_enabled` sysctl is left alone.
pub struct StatsGuard {
    _fd: OwnedFd,
}

impl StatsGuard {
    /// None where the kernel refuses (before 5.8): run counts then stay 0.
    pub fn enable() -> Option<Self> {
        aya::sys::enable_stats(aya::sys::Stats::RunTime)
            .ok()
            .map(|fd| Self { _fd: fd })
    }
}

/// Counters of every loaded program of `ebpf`, by name.
pub fn collect(ebpf: &Ebpf) -> Vec<ProgramStats> {
    let mut stats: Vec<ProgramStats> = ebpf
        .programs()
        .filter_map(|(name, program)| {
            let fd = program.fd().ok()?;
            let info = prog_info(fd.as_fd().as_raw_fd())?;
            Some(ProgramStats {
                name: name.to_owned(),
                run_count: info.run_cnt,
                run_time_ns: info.run_time_ns,
                recursion_misses: info.recursion_misses,
            })
        })
        .collect();
    stats.sort_by(|a, b| a.name.cmp(&b.name));
    stats
}

fn prog_info(fd: i32) -> Option<bpf_prog_info> {
    // SAFETY: both are plain C structs for which all-zero is valid.
    let mut info: bpf_prog_info = unsafe { std::mem::zeroed() };
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    attr.info.bpf_fd = fd as u32;
    attr.info.info_len = size_of::<bpf_prog_info>() as u32;
    attr.info.info = std::ptr::addr_of_mut!(info) as u64;
    // SAFETY: attr points at a live, correctly sized info buffer; the kernel
    // writes at most info_len bytes of it.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            bpf_cmd::BPF_OBJ_GET_INFO_BY_FD as libc::c_long,
            std::ptr::addr_of_mut!(attr),
            size_of::<bpf_attr>() as libc::c_long,
        )
    };
    (ret == 0).then_some(info)
}
