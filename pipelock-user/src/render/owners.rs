//! The report's "who made them wait" section: per shown lock with owners,
//! its busiest owners and what they were doing while waited for.
use crate::model::{LockClass, LockRow, OwnerRow, TraceReport};
use crate::units::human_ns;

/// Owners listed under each lock.
const OWNERS_SHOWN: usize = 3;

/// The section for the first `top` rows that have owners ("" if none has).
pub fn render_owners(report: &TraceReport, top: usize) -> String {
    let rows: Vec<&LockRow> = report
        .locks
        .iter()
        .take(top)
        .filter(|r| !r.owners.is_empty() || r.holds.hold_on_cpu_ns.is_some())
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "\nwho held them (a mutex: its owner when the wait began, read as `perf lock contention -o` \
         reads it;\n  a spinlock, fentry/kprobe: its last releaser; and what each owner was doing \
         meanwhile):\n",
    );
    for row in rows {
        let waits: u64 = row.owners.iter().map(|o| o.waits).sum();
        let all: u64 = row.owners.iter().map(|o| o.wait_ns).sum();
        out.push_str(&format!(
            "  {}  {} waits, {} of wait",
            row.name,
            waits,
            human_ns(all)
        ));
        match row.holder.summary() {
            Some(states) => out.push_str(&format!("; owners {states}\n")),
            None => out.push_str("; owners' state n/a\n"),
        }
        if let Some(states) = row.holds.as_holder().summary() {
            out.push_str(&format!("    its holds (--hold-states): the holder {states}\n"));
        }
        // Waits that found no owner are counted apart: they name no one.
        let (unowned, owners): (Vec<&OwnerRow>, Vec<&OwnerRow>) = row.owners.iter().partition(|o| o.tid == 0);
        if let Some(none) = unowned.first() {
            out.push_str(&format!(
                "    {:<28} {:>8} waits  {:>10}  max {:>10}  ({:.0} % of the waits)\n      {}\n",
                none.label(),
                none.waits,
                human_ns(none.wait_ns),
                human_ns(none.wait_max_ns),
                percent(none.waits, waits),
                why_no_owner(row.class)
            ));
        }
        for owner in owners.iter().take(OWNERS_SHOWN) {
            let states = owner
                .holder
                .summary()
                .map_or_else(String::new, |s| format!("  ({s})"));
            out.push_str(&format!(
                "    {:<28} {:>8} waits  {:>10}  max {:>10}{states}\n",
                owner.label(),
                owner.waits,
                human_ns(owner.wait_ns),
                human_ns(owner.wait_max_ns),
            ));
        }
        if owners.len() > OWNERS_SHOWN {
            out.push_str(&format!(
                "    (+{} more owners; all are in --json)\n",
                owners.len() - OWNERS_SHOWN
            ));
        }
    }
    out
}

/// Why a wait names no owner, by the kind of lock.
fn why_no_owner(class: Option<LockClass>) -> &'static str {
    match class {
        Some(LockClass::PipeMutex) => {
            "the mutex had no owner as the wait began: just released, or being handed to a waiter"
        }
        _ => "no release of the lock was seen before the wait, since tracing began",
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{HolderState, OwnerRow, fixtures::sample};

    #[test]
    fn owners_are_listed_under_their_lock_with_what_they_did() {
        let mut report = sample();
        assert_eq!(render_owners(&report, 20), "", "no owners: no section");
        let owner = |tid, waits, wait_ns, sleeping| OwnerRow {
            tid,
            pid: Some(tid),
            comm: Some("writer".to_owned()),
            waits,
            wait_ns,
            wait_max_ns: wait_ns,
            holder: HolderState {
                holder_on_cpu_ns: Some(wait_ns - sleeping),
                holder_runnable_ns: Some(0),
                holder_sleeping_ns: Some(sleeping),
            },
        };
        report.locks[0].owners = vec![
            owner(77, 2, 100_000_000, 95_000_000),
            OwnerRow {
                tid: 0,
                pid: None,
                comm: None,
                holder: HolderState::default(),
                ..owner(0, 1, 25_000_000, 0)
            },
        ];
        report.locks[0].holder = HolderState {
            holder_on_cpu_ns: Some(5_000_000),
            holder_runnable_ns: Some(0),
            holder_sleeping_ns: Some(95_000_000),
        };
        let text = render_owners(&report, 20);
        assert!(
            text.contains(
                "pipe:[4242]  3 waits, 125.00 ms of wait; owners on-CPU 5 % / runnable 0 % / sleeping 95 %"
            ),
            "{text}"
        );
        assert!(text.contains("writer(77)"), "{text}");
        assert!(
            text.contains("(on-CPU 5 % / runnable 0 % / sleeping 95 %)"),
            "{text}"
        );
        let none = text
            .lines()
            .position(|l| l.trim_start().starts_with("(no owner)"))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(
            text.lines()
                .nth(none)
                .unwrap()
                .contains("1 waits    25.00 ms  max   25.00 ms  (33 % of the waits)"),
            "{text}"
        );
        assert!(
            text.lines().nth(none + 1).unwrap().trim()
                == "the mutex had no owner as the wait began: just released, or being handed to a waiter",
            "{text}"
        );
        assert!(
            none < text.lines().position(|l| l.contains("writer(77)")).unwrap(),
            "counted apart, first: {text}"
        );
        assert_eq!(render_owners(&report, 0), "", "--top 0 shows no lock");
    }
}
