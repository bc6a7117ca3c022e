//! Who may load pipelock's programs: root, or a process holding CAP_BPF and
//! CAP_PERFMON (the split capabilities of Linux 5.8+).
use std::fs;

use crate::Error;

const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// The effective capability set from a `/proc/<pid>/status` text.
pub fn effective_caps(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|line| line.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

pub fn caps_allow_bpf(caps: u64) -> bool {
    let has = |cap: u32| caps & (1 << cap) != 0;
    has(CAP_BPF) && has(CAP_PERFMON)
}

/// Fails with [`Error::NotPrivileged`] unless this process may load tracing programs.
pub fn require() -> Result<(), Error> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return Ok(());
    }
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    match effective_caps(&status) {
        Some(caps) if caps_allow_bpf(caps) => Ok(()),
        _ => Err(Error::NotPrivileged),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_effective_caps() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000000c000000000\n";
        let caps = effective_caps(status).unwrap();
        assert!(caps_allow_bpf(caps));
        assert!(!caps_allow_bpf(1 << CAP_BPF));
        assert_eq!(effective_caps("Name:\tx\n"), None);
    }
}
