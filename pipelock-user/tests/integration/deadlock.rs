//! A thread that asks for a mutex it already holds: named, and never
//! claimed where none did.
use pipelock_user::model::LockClass;

use super::*;

/// A herd's pipe mutex changes hands thousands of times, some of them
/// handed by the releaser to a sleeping waiter (`MUTEX_FLAG_PICKUP`), whose
/// owner word then names the waiter before it has taken the mutex: no
/// contended begin, hand-off or not, may read as a thread asking for its
/// own mutex. In every mode that attaches here; a run whose herd contended
/// nothing checked nothing, and fails. (Under emulation the herd's waiters
/// rarely sleep: the run says how many did.)
fn a_herds_hand_offs_are_no_deadlock() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    let limit = if in_vm() { "50000" } else { "200000" };
    let mut covered = Vec::new();
    for mode in ["fentry", "kprobe", "tracepoint"] {
        if let Some(refusal) = mode_refusal(mode)? {
            println!("  {mode}: not covered here ({refusal})");
            continue;
        }
        let report = match trace_contended(
            &["--mode", mode],
            &["run", "pipe-herd", "-k", "4", "--limit", limit, "-q"],
        )? {
            Ok(report) => report,
            Err(skip) => return Ok(skip),
        };
        let mutex_rows = || {
            report
                .locks
                .iter()
                .filter(|row| row.class == Some(LockClass::PipeMutex))
        };
        let contended: u64 = mutex_rows().map(|row| row.contentions).sum();
        let slept: u64 = mutex_rows().map(|row| row.contentions - row.spin_only).sum();
        ensure!(
            contended > 0,
            "{mode}: the herd never contended a pipe mutex, so no begin was checked: {}",
            shown(&report.locks)
        );
        ensure!(
            report.asked_twice.is_empty(),
            "{mode}: a herd's hand-off read as a deadlock: {}",
            shown(&report.asked_twice)
        );
        println!(
            "  {mode}: {contended} contended pipe-mutex acquisitions ({slept} slept), no thread asked for a \
             mutex it holds"
        );
        covered.push(mode);
    }
    if covered.is_empty() {
        return Ok(Outcome::Skipped("no attach mode works on this kernel".into()));
    }
    Ok(Outcome::Passed)
}
register!(Kernel a_herds_hand_offs_are_no_deadlock);
