//! The report as text: perf-lock-style tables, times scaled ns/us/ms/s.
use super::header;
use crate::{
    model::{AskedTwice, ByKey, CollectorFill, LockRow, MapFill, ProgramStats, TraceReport, class_label},
    units::{human_mib, human_ns},
};

/// The report as text; `top` limits the lock rows (totals count them all),
/// `verbose` adds every map's fill.
pub fn render(report: &TraceReport, top: usize, verbose: bool) -> String {
    let memory = header::kernel_memory(&report.maps).map_or_else(String::new, |m| format!(", maps {m}"));
    let mut out = format!(
        "pipelock trace: kernel {}, {:.1} s, mode {}{memory}\n{}\n",
        report.kernel,
        report.duration_s,
        report.mode,
        header::measured(report.hold_unavailable_reason.is_none())
    );
    if let Some(line) = header::refused(&report.refused) {
        out.push_str(&line);
        out.push('\n');
    }
    // Before any figure: a deadlock makes the rest of the report moot.
    for asked in &report.asked_twice {
        out.push_str(&asked_twice_block(asked));
    }
    for warning in header::map_warnings(&report.maps, &report.drops) {
        out.push_str(&warning);
        out.push('\n');
    }
    for note in &report.notes {
        out.push_str(&header::wrapped("note: ", note));
    }
    if verbose && !report.maps.is_empty() {
        out.push_str(&maps_table(&report.maps));
    }
    if let Some(collector) = report.collector.filter(|_| verbose) {
        out.push_str(&collector_line(&collector));
    }
    if verbose && !report.programs.is_empty() {
        out.push_str(&programs_table(&report.programs));
    }
    out.push('\n');
    match report.by {
        ByKey::Caller => out.push_str(&super::callers::caller_table(report, top)),
        ByKey::Task => out.push_str(&super::callers::task_table(report, top)),
        ByKey::Lock => out.push_str(&lock_table(report, top)),
    }
    out.push_str(&totals_and_drops(report));
    out
}

/// A lock table column: its header and its cell of a row.
type LockColumn = (&'static str, fn(&LockRow) -> String);

fn na() -> String {
    "n/a".to_owned()
}

const LOCK_COLUMNS: [LockColumn; 14] = [
    ("class", |r| class_label(r.class).to_owned()),
    ("lock", |r| r.name.clone()),
    ("acquired", |r| r.acquisitions.map_or_else(na, |a| a.to_string())),
    ("contended", |r| r.contentions.to_string()),
    ("spin-only", |r| r.spin_only.to_string()),
    ("wait total", |r| {
        r.wait.as_ref().map_or_else(na, |w| human_ns(w.total_ns))
    }),
    ("wait avg", |r| {
        r.wait.as_ref().map_or_else(na, |w| human_ns(w.avg_ns))
    }),
    ("wait p50", |r| {
        r.wait.as_ref().map_or_else(na, |w| human_ns(w.p50_ns))
    }),
    ("wait p99", |r| {
        r.wait.as_ref().map_or_else(na, |w| human_ns(w.p99_ns))
    }),
    ("wait max", |r| {
        r.wait.as_ref().map_or_else(na, |w| human_ns(w.max_ns))
    }),
    ("hold avg", |r| {
        r.hold.as_ref().map_or_else(na, |h| human_ns(h.avg_ns))
    }),
    ("hold p99", |r| {
        r.hold.as_ref().map_or_else(na, |h| human_ns(h.p99_ns))
    }),
    ("hold max", |r| {
        r.hold.as_ref().map_or_else(na, |h| human_ns(h.max_ns))
    }),
    ("processes", |r| abbreviate(&r.comms, 3)),
];

/// One row per lock, then who held the shown ones and their top stacks.
/// A column no shown row has a value for is left out, and said so once.
fn lock_table(report: &TraceReport, top: usize) -> String {
    let mut out = String::new();
    if report.locks.is_empty() {
        out.push_str("no traced lock was seen\n");
        return out;
    }
    let shown: Vec<&LockRow> = report.locks.iter().take(top).collect();
    let unmeasured = |header: &str| {
        (header == "acquired" && shown.iter().all(|r| r.acquisitions.is_none()))
            || (header.starts_with("hold") && shown.iter().all(|r| r.hold.is_none()))
            || (header.starts_with("wait ") && shown.iter().all(|r| r.wait.is_none()))
    };
    let columns: Vec<&LockColumn> = LOCK_COLUMNS.iter().filter(|(h, _)| !unmeasured(h)).collect();
    let mut table = comfy_table::Table::new();
    table
        .load_preset(comfy_table::presets::NOTHING)
        .set_header(columns.iter().map(|(header, _)| *header));
    for row in &shown {
        table.add_row(columns.iter().map(|(_, cell)| cell(row)));
    }
    out.push_str(&table.to_string());
    out.push('\n');
    if report.locks.len() > top {
        out.push_str(&format!(
            "(+{} more locks with less wait; all are in --csv/--json, or raise --top)\n",
            report.locks.len() - top
        ));
    }
    // Said where the percentiles are read.
    out.push_str(&report.percentile_resolution);
    out.push('\n');
    let left_out: Vec<&str> = [
        ("acquired", "acquired"),
        ("hold avg", "hold"),
        ("wait avg", "wait"),
    ]
    .into_iter()
    .filter(|(header, _)| unmeasured(header))
    .map(|(_, what)| what)
    .collect();
    if !left_out.is_empty() && !shown.is_empty() {
        let plural = if left_out.len() > 1 { "s" } else { "" };
        out.push_str(&format!(
            "(left out: the {} column{plural}, which {} mode does not measure)\n",
            left_out.join(" and "),
            report.mode
        ));
    }
    out.push_str(&super::owners::render_owners(report, top));
    out.push_str(&super::callers::top_callers(report, top));
    out
}

/// Per-class totals, pipelock's own cost and what was not recorded.
fn totals_and_drops(report: &TraceReport) -> String {
    let mut out = String::from("\nper class:\n");
    for t in &report.totals {
        out.push_str(&format!(
            "  {:<20} {:>4} lock(s)  {:>10} contended  wait total {}  max {}\n",
            class_label(t.class),
            t.locks,
            t.contentions,
            human_ns(t.wait_total_ns),
            human_ns(t.wait_max_ns)
        ));
    }
    let mut dropped: Vec<String> = report
        .drops
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    let untimed: u64 = report.locks.iter().filter_map(|r| r.dropped).sum();
    if untimed > 0 {
        dropped.push(format!("untimed on traced locks {untimed} (per lock in --csv)"));
    }
    let (runs, run_ns) = report
        .programs
        .iter()
        .fold((0, 0), |(r, t), p| (r + p.run_count, t + p.run_time_ns));
    if let Some(per_run) = run_ns.checked_div(runs) {
        out.push_str(&format!(
            "pipelock's programs: {runs} runs, {} in total, {} per run\n",
            human_ns(run_ns),
            human_ns(per_run)
        ));
    }
    out.push_str(&format!(
        "dropped events: {}\n",
        if dropped.is_empty() {
            "none".to_owned()
        } else {
            dropped.join(", ")
        }
    ));
    // The lock table says it under itself.
    if report.by != ByKey::Lock {
        out.push_str(&report.percentile_resolution);
        out.push('\n');
    }
    out
}

/// `--verbose`: every map, how full it was at the last drain (a full map
/// drops events; "not counted": an LRU map, which evicts instead, or the stack map) and its memory.
fn maps_table(maps: &[MapFill]) -> String {
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::NOTHING).set_header([
        "map",
        "entries used",
        "capacity",
        "kernel memory",
    ]);
    for m in maps {
        table.add_row([
            m.name.clone(),
            m.used.map_or_else(|| "not counted".to_owned(), |u| u.to_string()),
            m.capacity.to_string(),
            m.memlock_bytes.map_or_else(na, human_mib),
        ]);
    }
    format!("kernel maps at the last drain:\n{table}\n")
}

/// A thread that asked for a mutex it owns: what, where, and what follows.
fn asked_twice_block(asked: &AskedTwice) -> String {
    let mut out = format!(
        "DEADLOCK: {} asked for the mutex of {} ({:#x}) that it already holds{}; it sleeps on it for good, and so \
         will every task that needs it\n",
        asked.task(),
        asked.lock,
        asked.lock_addr,
        asked
            .syscall
            .as_ref()
            .map_or_else(String::new, |s| format!(", in {s}()"))
    );
    if asked.stack.is_empty() {
        out.push_str("  (its call stack was lost)\n");
    }
    for frame in &asked.stack {
        out.push_str(&format!("  {frame}\n"));
    }
    out
}

/// `--verbose`: the userspace running total against `--track-locks`, and
/// pipelock's own resident memory.
fn collector_line(c: &CollectorFill) -> String {
    format!(
        "pipelock's collector: {} of {} locks kept one by one (--track-locks), {} retired into per-class rows; \
         resident memory {}\n",
        c.tracked,
        c.max_tracked,
        c.retired,
        c.resident_bytes.map_or_else(na, human_mib)
    )
}

/// `--verbose`: every program, how often it ran and how often the kernel
/// skipped it (each skipped run can lose an event), busiest first.
fn programs_table(programs: &[ProgramStats]) -> String {
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::NOTHING).set_header([
        "program",
        "runs",
        "skipped by the kernel",
        "ns/run",
    ]);
    let mut programs: Vec<&ProgramStats> = programs.iter().collect();
    programs.sort_by_key(|p| std::cmp::Reverse((p.recursion_misses, p.run_count)));
    for p in programs {
        let per_run = p.ns_per_run();
        table.add_row([
            p.name.clone(),
            p.run_count.to_string(),
            p.recursion_misses.to_string(),
            if per_run.is_finite() {
                format!("{per_run:.0}")
            } else {
                na()
            },
        ]);
    }
    format!("pipelock's programs (runs counted while the kernel's BPF statistics are on):\n{table}\n")
}

fn abbreviate(items: &[String], keep: usize) -> String {
    if items.len() <= keep {
        items.join(" ")
    } else {
        format!("{} (+{} more)", items[..keep].join(" "), items.len() - keep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Refusal, fixtures::sample};

    #[test]
    fn text_says_what_the_mode_measures_and_never_prints_zero_for_it() {
        let text = render(&sample(), 20, false);
        assert!(
            !render(&sample(), 0, false).contains("herd(10)"),
            "--top 0 shows no rows"
        );
        assert!(text.contains(header::measured(false)), "{text}");
        assert!(text.contains("pipe:[4242]"));
        let table: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.is_empty())
            .skip(1)
            .take(2)
            .collect();
        assert!(table[0].contains("contended"), "{text}");
        assert!(
            !table.concat().contains("n/a") && !table[0].contains("hold") && !table[0].contains("acquired"),
            "no column of n/a only: {text}"
        );
        assert!(
            text.contains(
                "(left out: the acquired and hold columns, which tracepoint (tp_btf) mode does not measure)"
            ),
            "{text}"
        );
        assert!(
            text.contains("dropped events: untimed on traced locks 2"),
            "per-lock drops are summed: {text}"
        );
        assert!(text.contains("note: lockref: n/a in tracepoint mode"), "{text}");
    }

    #[test]
    fn a_column_some_row_measured_stays_with_n_a_where_another_did_not() {
        let mut report = sample();
        let mut hooked = report.locks[0].clone();
        hooked.acquisitions = Some(7);
        hooked.hold = hooked.wait.clone();
        report.locks.push(hooked);
        let text = render(&report, 20, false);
        assert!(text.contains("acquired") && text.contains("hold avg"), "{text}");
        assert!(text.contains("n/a") && !text.contains("left out"), "{text}");
    }

    #[test]
    fn the_first_three_lines_fit_100_columns_in_the_users_words() {
        let mut report = sample();
        report.kernel = "6.12.57+deb13-cloud-amd64".into();
        report.duration_s = 3600.0;
        report.refused = vec![
            Refusal {
                mode: "fentry".into(),
                reason: "EPERM".into(),
                detail: "cannot load eBPF program pipe_read_exit: the BPF_PROG_LOAD syscall returned \
                         Operation not permitted (os error 1)"
                    .into(),
            },
            Refusal {
                mode: "kprobe".into(),
                reason: "no kprobes in this kernel".into(),
                detail: "no kprobe PMU (kernel built without CONFIG_KPROBES)".into(),
            },
        ];
        report.maps = vec![MapFill {
            name: "LOCK_STATS_A".into(),
            used: Some(12),
            capacity: 4096,
            memlock_bytes: Some(9 << 20),
        }];
        let text = render(&report, 20, false);
        let first: Vec<&str> = text.lines().take(3).collect();
        assert_eq!(
            first,
            [
                "pipelock trace: kernel 6.12.57+deb13-cloud-amd64, 3600.0 s, mode tracepoint (tp_btf), maps 9.0 MiB",
                header::measured(false),
                "refused here: fentry (EPERM), kprobe (no kprobes in this kernel); details: pipelock probe",
            ]
        );
        assert!(
            text.lines()
                .take_while(|l| !l.is_empty())
                .all(|l| l.chars().count() <= header::WIDTH),
            "{text}"
        );
        assert!(!text.contains("os error"), "the detail stays in JSON: {text}");
    }

    #[test]
    fn maps_are_one_figure_and_every_map_only_with_verbose() {
        let mut report = sample();
        assert!(
            !render(&report, 20, true).contains("maps"),
            "no fill read: no figure"
        );
        report.maps = vec![
            MapFill {
                name: "LOCK_STATS_A".into(),
                used: Some(12),
                capacity: 4096,
                memlock_bytes: Some(3 << 20),
            },
            MapFill {
                name: "TASK_PIPE".into(),
                used: None,
                capacity: 16384,
                memlock_bytes: Some(1 << 19),
            },
        ];
        let text = render(&report, 20, false);
        assert!(text.lines().next().unwrap().ends_with(", maps 3.5 MiB"), "{text}");
        assert!(
            !text.contains("LOCK_STATS_A") && !text.contains("warning"),
            "{text}"
        );
        let verbose = render(&report, 20, true);
        assert!(verbose.contains("kernel maps at the last drain:"), "{verbose}");
        assert!(
            verbose.lines().any(|l| l
                .split_whitespace()
                .eq(["LOCK_STATS_A", "12", "4096", "3.0", "MiB"])),
            "{verbose}"
        );
        assert!(verbose.contains("not counted"), "{verbose}");
        assert!(
            !verbose.contains("pipelock's programs"),
            "no program counted: no table"
        );
        report.programs = vec![
            ProgramStats {
                name: "pipe_read_exit".into(),
                run_count: 29_222,
                run_time_ns: 2_922_200,
                recursion_misses: 0,
            },
            ProgramStats {
                name: "mutex_lock_entry".into(),
                run_count: 49_095,
                run_time_ns: 9_819_000,
                recursion_misses: 1784,
            },
        ];
        let verbose = render(&report, 20, true);
        let rows: Vec<Vec<&str>> = verbose
            .lines()
            .skip_while(|l| !l.starts_with("pipelock's programs"))
            .skip(2)
            .take(2)
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows,
            [
                ["mutex_lock_entry", "49095", "1784", "200"],
                ["pipe_read_exit", "29222", "0", "100"]
            ],
            "{verbose}"
        );
        report.maps[0].used = Some(4000);
        assert!(
            render(&report, 20, false).contains("warning: map LOCK_STATS_A held 4000 of 4096 entries"),
            "a nearly full map is a warning without --verbose"
        );
    }
}
