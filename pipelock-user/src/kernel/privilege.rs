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

/// The capabilities loading needs that `caps` lacks, by name.
pub fn missing_for_bpf(caps: u64) -> Vec<&'static str> {
    [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(|&(cap, _)| caps & (1 << cap) == 0)
        .map(|(_, name)| name)
        .collect()
}

/// Fails with [`Error::NotPrivileged`] unless this process may load tracing programs.
pub fn require() -> Result<(), Error> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return Ok(());
    }
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let missing = missing_for_bpf(effective_caps(&status).unwrap_or(0));
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::NotPrivileged {
            missing: missing.join(" and "),
        })
    }
}

/// Drops every capability of the calling thread (effective, permitted,
/// inheritable, ambient), for good. Capabilities belong to threads: call
/// it before starting the threads that should not hold any, and in each
/// thread started before.
pub fn drop_all() -> Result<(), Error> {
    use caps::CapSet;
    for set in [
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
    ] {
        caps::clear(None, set).map_err(|err| Error::Unsupported {
            reason: format!("cannot drop capabilities ({set:?}): {err}"),
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_effective_caps() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000000c000000000\n";
        let caps = effective_caps(status).unwrap();
        assert_eq!(effective_caps("Name:\tx\n"), None);
        assert_eq!(missing_for_bpf(1 << CAP_BPF), ["CAP_PERFMON"]);
        assert_eq!(missing_for_bpf(0), ["CAP_BPF", "CAP_PERFMON"]);
        assert!(missing_for_bpf(caps).is_empty());
    }
}
