//! The lines a user reads first, shared by the report and `top`: what the
//! attach mode measures, which better modes the kernel refused and why (in
//! a few words; `pipelock probe` and the JSON have the whole error), and
//! one memory figure with a warning only when a map came close to full.
//! Each fits [`WIDTH`] columns.
use std::collections::BTreeMap;

use crate::{
    model::{MapFill, Refusal},
    units::human_mib,
};

/// The narrowest terminal the first lines are written for.
pub const WIDTH: usize = 100;

/// A map at least this full (used/capacity) is worth a warning: a full map
/// drops new entries.
const NEAR_FULL: f64 = 0.9;

/// What the attach mode can see, in the user's words.
pub fn measured(hooked: bool) -> &'static str {
    if hooked {
        "measures every acquisition of the traced locks: counts, waits and hold times"
    } else {
        "measures contended acquisitions only: their waits; no hold times or acquisition counts"
    }
}

/// `refused here: fentry (EPERM), kprobe (no kprobes in this kernel); …`,
/// the reasons shortened until the line fits [`WIDTH`].
pub fn refused(refused: &[Refusal]) -> Option<String> {
    if refused.is_empty() {
        return None;
    }
    const HEAD: &str = "refused here: ";
    const TAIL: &str = "; details: pipelock probe";
    let line = |budget: usize| {
        let modes: Vec<String> = refused
            .iter()
            .map(|r| format!("{} ({})", r.mode, crate::error::shorten(&r.reason, budget)))
            .collect();
        format!("{HEAD}{}{TAIL}", modes.join(", "))
    };
    let full = line(usize::MAX);
    if full.chars().count() <= WIDTH {
        return Some(full);
    }
    let fixed: usize = HEAD.len()
        + TAIL.len()
        + refused.iter().map(|r| r.mode.len() + 3).sum::<usize>()
        + 2 * (refused.len() - 1);
    let budget = (WIDTH.saturating_sub(fixed) / refused.len()).max(8);
    Some(line(budget))
}

/// The kernel memory of pipelock's maps, `9.1 MiB` (None: not read).
pub fn kernel_memory(maps: &[MapFill]) -> Option<String> {
    let known: Vec<u64> = maps.iter().filter_map(|m| m.memlock_bytes).collect();
    (!known.is_empty()).then(|| human_mib(known.iter().sum()))
}

/// One warning per map that came within 10 % of full, and one for the
/// events a full map dropped; nothing when the maps had room.
pub fn map_warnings(maps: &[MapFill], drops: &BTreeMap<String, u64>) -> Vec<String> {
    let mut warnings: Vec<String> = maps
        .iter()
        .filter_map(|m| {
            let used = m.used?;
            (m.capacity > 0 && used as f64 >= NEAR_FULL * f64::from(m.capacity)).then(|| {
                format!(
                    "warning: map {} held {used} of {} entries (a full map drops events)",
                    m.name, m.capacity
                )
            })
        })
        .collect();
    let full: Vec<String> = drops
        .iter()
        .filter(|(reason, n)| **n > 0 && (reason.ends_with("_full") || *reason == "stack_lost"))
        .map(|(reason, n)| format!("{reason} {n}"))
        .collect();
    if !full.is_empty() {
        warnings.push(format!(
            "warning: full maps dropped events: {}",
            crate::error::shorten(&full.join(", "), WIDTH - 34)
        ));
    }
    warnings
}

/// `prefix` then `text`, wrapped at [`WIDTH`], later lines indented.
pub fn wrapped(prefix: &str, text: &str) -> String {
    let indent = " ".repeat(prefix.len().min(8));
    let options = textwrap::Options::new(WIDTH)
        .initial_indent(prefix)
        .subsequent_indent(&indent)
        .break_words(false);
    let mut out = textwrap::fill(text, options);
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(mode: &str, reason: &str) -> Refusal {
        Refusal {
            mode: mode.into(),
            reason: reason.into(),
            detail: format!("{mode}: {reason}, in full"),
        }
    }

    #[test]
    fn refusals_fit_the_width_however_long_their_reasons() {
        let short = [
            refusal("fentry", "EPERM"),
            refusal("kprobe", "no kprobes in this kernel"),
        ];
        assert_eq!(
            refused(&short).unwrap(),
            "refused here: fentry (EPERM), kprobe (no kprobes in this kernel); details: pipelock probe"
        );
        let long = [
            refusal("fentry", &"the verifier said no to this program ".repeat(3)),
            refusal("kprobe", &"none of the hooks resolved in kallsyms ".repeat(3)),
        ];
        let line = refused(&long).unwrap();
        assert!(
            line.chars().count() <= WIDTH,
            "{} columns: {line}",
            line.chars().count()
        );
        assert!(line.ends_with("; details: pipelock probe"), "{line}");
        assert_eq!(refused(&[]), None);
    }

    #[test]
    fn only_a_nearly_full_map_or_a_full_maps_drop_is_a_warning() {
        let map = |name: &str, used, capacity| MapFill {
            name: name.into(),
            used,
            capacity,
            memlock_bytes: Some(1 << 20),
        };
        let maps = [
            map("LOCK_STATS_A", Some(3700), 4096),
            map("LOCK_STATS_B", Some(12), 4096),
            map("TASK_PIPE", None, 16384),
        ];
        let drops = BTreeMap::from([
            ("stats_full".to_owned(), 5),
            ("stale_pending".to_owned(), 9),
            ("users_full".to_owned(), 0),
        ]);
        assert_eq!(
            map_warnings(&maps, &drops),
            [
                "warning: map LOCK_STATS_A held 3700 of 4096 entries (a full map drops events)",
                "warning: full maps dropped events: stats_full 5",
            ]
        );
        assert!(map_warnings(&maps[1..], &BTreeMap::new()).is_empty());
        assert_eq!(kernel_memory(&maps).as_deref(), Some("3.0 MiB"));
        assert_eq!(kernel_memory(&[]), None);
    }

    #[test]
    fn long_notes_wrap_within_the_width() {
        let text = wrapped(
            "note: ",
            &"pipe-mutex: owners are named, but not what they were doing ".repeat(4),
        );
        assert!(text.lines().count() > 1, "{text}");
        assert!(text.lines().all(|l| l.chars().count() <= WIDTH), "{text}");
        assert!(text.lines().skip(1).all(|l| l.starts_with("      ")), "{text}");
    }
}
