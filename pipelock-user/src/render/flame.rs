//! Wait time by kernel call stack: folded stacks (the input of FlameGraph,
//! inferno and speedscope) and a flame graph SVG drawn from them by
//! inferno. One line per lock and stack, frames from the outermost caller
//! in, the lock itself as the leaf, the nanoseconds waited as the count:
//! a lock's lines add up to its wait total in the report.
use std::{collections::BTreeMap, io};

use crate::model::{LockRow, TraceReport, class::class_label};

/// Where a lock's wait is not covered by its call stacks (none were
/// recorded for it): drawn, so the picture's total is the report's.
pub const NO_STACK: &str = "(no call stack)";

/// A name as folded stacks allow it: `;` separates frames and the count
/// follows the last space, so neither may be inside one.
fn folded_name(text: &str) -> String {
    text.chars()
        .map(|c| if c == ';' || c.is_whitespace() { '_' } else { c })
        .collect()
}

/// A call stack's frame as a function: `anon_pipe_read+0x197` and
/// `anon_pipe_read+0x309` are one box, as `perf script`'s folded stacks
/// have them. An address with no symbol stays as it is.
fn frame(text: &str) -> String {
    let function = match text.rsplit_once("+0x") {
        Some((name, offset)) if !name.is_empty() && offset.chars().all(|c| c.is_ascii_hexdigit()) => name,
        _ => text,
    };
    folded_name(function)
}

/// The leaf of a lock's flames: its class and name, `pipe-mutex:pipe:[1234]`.
pub fn leaf(lock: &LockRow) -> String {
    folded_name(&format!("{}:{}", class_label(lock.class), lock.name))
}

/// The report's waits as folded stacks, one `frames count` line each,
/// sorted (equal stacks of different rows merged).
pub fn folded(report: &TraceReport) -> String {
    let mut stacks: BTreeMap<String, u64> = BTreeMap::new();
    for lock in &report.locks {
        let Some(total) = lock.wait.as_ref().map(|w| w.total_ns) else {
            continue;
        };
        let leaf = leaf(lock);
        let mut covered = 0;
        for caller in lock.callers.iter().filter(|c| c.wait_total_ns > 0) {
            let mut path: Vec<String> = caller.stack.iter().rev().map(|f| frame(f)).collect();
            path.push(leaf.clone());
            *stacks.entry(path.join(";")).or_default() += caller.wait_total_ns;
            covered += caller.wait_total_ns;
        }
        if total > covered {
            *stacks.entry(format!("{NO_STACK};{leaf}")).or_default() += total - covered;
        }
    }
    stacks
        .iter()
        .map(|(stack, ns)| format!("{stack} {ns}\n"))
        .collect()
}

/// The folded stacks drawn as a flame graph (SVG, self-contained: its
/// search and zoom are inline script, no network).
pub fn flamegraph(report: &TraceReport) -> io::Result<Vec<u8>> {
    let folded = folded(report);
    if folded.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "no waits were recorded: nothing to draw",
        ));
    }
    let mut options = inferno::flamegraph::Options::default();
    options.title = "Lock wait time by kernel call stack".to_owned();
    options.subtitle = Some(format!(
        "{}, {}, {:.1} s (pipelock)",
        report.kernel, report.mode, report.duration_s
    ));
    options.count_name = "ns waited".to_owned();
    options.name_type = "Frame:".to_owned();
    // Same colours for the same frames in every picture.
    options.hash = true;
    options.deterministic = true;
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut options, folded.lines(), &mut svg)?;
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CallerRow, LockClass, Timing};

    fn lock(name: &str, wait_ns: u64, callers: &[(&[&str], u64)]) -> LockRow {
        let mut row = crate::model::fixtures::sample().locks.remove(0);
        row.class = Some(LockClass::PipeMutex);
        row.name = name.to_owned();
        row.wait = Some(Timing {
            count: 1,
            total_ns: wait_ns,
            avg_ns: wait_ns,
            p50_ns: wait_ns,
            p90_ns: wait_ns,
            p99_ns: wait_ns,
            p999_ns: wait_ns,
            max_ns: wait_ns,
            percentile_error: Some(0.0),
            buckets: Vec::new(),
        });
        row.callers = callers
            .iter()
            .map(|(stack, ns)| CallerRow {
                class: row.class,
                stack: stack.iter().map(|f| (*f).to_owned()).collect(),
                acquisitions: None,
                contentions: 1,
                wait_total_ns: *ns,
                wait_max_ns: *ns,
                hold_total_ns: None,
                margin: None,
            })
            .collect();
        row
    }

    fn report(locks: Vec<LockRow>) -> TraceReport {
        TraceReport {
            locks,
            ..TraceReport::empty()
        }
    }

    #[test]
    fn stacks_read_outermost_first_with_the_lock_as_leaf() {
        let r = report(vec![lock(
            "pipe:[7]",
            1000,
            &[
                (&["anon_pipe_write+0x50", "vfs_write+0x2a4"], 600),
                (&["anon_pipe_read+0x40", "vfs_read+0x1"], 400),
            ],
        )]);
        assert_eq!(
            folded(&r),
            "vfs_read;anon_pipe_read;pipe-mutex:pipe:[7] 400\n\
             vfs_write;anon_pipe_write;pipe-mutex:pipe:[7] 600\n"
        );
    }

    #[test]
    fn every_lock_adds_up_to_its_wait_total() {
        // Stacks cover 700 of 1000 ns; a second lock has none at all.
        let r = report(vec![
            lock("pipe:[7]", 1000, &[(&["a"], 700), (&["b c;d"], 0)]),
            lock("pipe:[8]", 50, &[]),
        ]);
        let text = folded(&r);
        let total: u64 = text
            .lines()
            .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
            .sum();
        assert_eq!(total, 1050, "{text}");
        assert!(
            text.contains("(no call stack);pipe-mutex:pipe:[7] 300\n"),
            "{text}"
        );
        assert!(
            text.contains("(no call stack);pipe-mutex:pipe:[8] 50\n"),
            "{text}"
        );
        assert!(!text.contains("b c"), "a zero-wait stack is not drawn: {text}");
    }

    #[test]
    fn frames_are_functions_without_separators() {
        assert_eq!(frame("a b;c\td"), "a_b_c_d");
        assert_eq!(frame("anon_pipe_read+0x197"), "anon_pipe_read");
        assert_eq!(frame("0xffffffff81234567"), "0xffffffff81234567");
        assert_eq!(frame("odd+0xname"), "odd+0xname");
    }

    #[test]
    fn the_svg_names_each_frame_and_nothing_draws_no_picture() {
        let r = report(vec![lock("pipe:[7]", 1000, &[(&["anon_pipe_write+0x50"], 1000)])]);
        let svg = String::from_utf8(flamegraph(&r).unwrap()).unwrap();
        assert!(svg.starts_with("<?xml") && svg.trim_end().ends_with("</svg>"));
        for text in ["anon_pipe_write", "pipe-mutex:pipe:[7]", "ns waited"] {
            assert!(svg.contains(text), "{text} not in the SVG");
        }
        let err = flamegraph(&report(Vec::new())).unwrap_err();
        assert!(err.to_string().contains("no waits were recorded"), "{err}");
    }
}
