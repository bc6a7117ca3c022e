//! The lockref class: the calls of a stat() storm counted at the traceable callers.
use pipelock_user::model::LockClass;

use super::*;

per_mode!(Kernel hooks_count_lockref_calls_of_a_stat_storm {
    fentry_counts_lockref_calls_of_a_stat_storm: "fentry",
    kprobe_counts_lockref_calls_of_a_stat_storm: "kprobe",
});

/// N stat() calls of one path: one lockref get (`__legitimize_path`) and one
/// put (`dput`) on that file's dentry per call, so ≈ 2N calls in its row.
fn hooks_count_lockref_calls_of_a_stat_storm(mode: &str) -> Result<Outcome> {
    if let Some(skip) = hooked_mode_skip(mode)? {
        return Ok(skip);
    }
    const N: u64 = 2000;
    let (report, name) = trace_stat_storm(mode, N)?;
    ensure!(report.mode == mode, "mode {}", report.mode);
    let row = report
        .locks
        .iter()
        .find(|r| r.class == Some(LockClass::Lockref) && r.name == format!("dentry:{name}"))
        .with_context(|| format!("no lockref row for dentry:{name}: {}", shown(&report)))?;
    let calls = row.acquisitions.context("no acquisitions")?;
    ensure!(
        (2 * N * 9 / 10..=2 * N * 11 / 10).contains(&calls),
        "{calls} lockref calls for {N} stat()s, want ≈ {}",
        2 * N
    );
    ensure!(
        row.wait.as_ref().map(|w| w.count) == Some(calls),
        "call latency not recorded per call: {}",
        shown(row)
    );
    let fallbacks = row.contentions;
    ensure!(fallbacks <= calls, "more fallbacks than calls: {}", shown(row));
    // No hold timing at all: no fallback took the spinlock.
    let holds = row.hold.as_ref().map_or(0, |h| h.count);
    ensure!(
        holds <= fallbacks,
        "{holds} spinlock holds but only {fallbacks} fallbacks: {}",
        shown(row)
    );
    ensure!(!row.comms.is_empty(), "no process recorded: {}", shown(row));
    println!("  dentry:{name}: {calls} calls for {N} stat()s, {fallbacks} spinlock fallbacks");
    Ok(Outcome::Passed)
}
