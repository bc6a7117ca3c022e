//! The report as text: perf-lock-style tables, times scaled ns/us/ms/s.
use crate::{
    model::{ByKey, MapFill, TraceReport, class_label},
    units::human_ns,
};

/// The report as text; `top` limits the lock rows (totals count them all).
pub fn render(report: &TraceReport, top: usize) -> String {
    let mut out = format!(
        "pipelock trace: kernel {}, {:.1} s, mode {}\n",
        report.kernel, report.duration_s, report.mode
    );
    if let Some(why) = &report.hold_unavailable_reason {
        out.push_str(&format!("hold times: n/a ({why})\n"));
    }
    for note in &report.notes {
        out.push_str(&format!("note: {note}\n"));
    }
    if !report.maps.is_empty() {
        out.push_str(&maps_line(&report.maps));
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

/// One row per lock, then who held the shown ones and their top stacks.
fn lock_table(report: &TraceReport, top: usize) -> String {
    let mut out = String::new();
    if report.locks.is_empty() {
        out.push_str("no traced lock was seen\n");
    } else {
        let mut table = comfy_table::Table::new();
        table.load_preset(comfy_table::presets::NOTHING).set_header(vec![
            "class",
            "lock",
            "acquired",
            "contended",
            "spin-only",
            "wait total",
            "wait avg",
            "wait p50",
            "wait p99",
            "wait max",
            "hold avg",
            "hold p99",
            "hold max",
            "processes",
        ]);
        let na = || "n/a".to_owned();
        for row in report.locks.iter().take(top) {
            let w = row.wait.as_ref();
            let h = row.hold.as_ref();
            table.add_row(vec![
                class_label(row.class).to_owned(),
                row.name.clone(),
                row.acquisitions.map_or_else(na, |a| a.to_string()),
                row.contentions.to_string(),
                row.spin_only.to_string(),
                w.map_or_else(na, |w| human_ns(w.total_ns)),
                w.map_or_else(na, |w| human_ns(w.avg_ns)),
                w.map_or_else(na, |w| human_ns(w.p50_ns)),
                w.map_or_else(na, |w| human_ns(w.p99_ns)),
                w.map_or_else(na, |w| human_ns(w.max_ns)),
                h.map_or_else(na, |h| human_ns(h.avg_ns)),
                h.map_or_else(na, |h| human_ns(h.p99_ns)),
                h.map_or_else(na, |h| human_ns(h.max_ns)),
                abbreviate(&row.comms, 3),
            ]);
        }
        out.push_str(&table.to_string());
        out.push('\n');
        if report.locks.len() > top {
            out.push_str(&format!(
                "(+{} more locks with less wait; all are in --csv/--json, or raise --top)\n",
                report.locks.len() - top
            ));
        }
        out.push_str(&super::owners::render_owners(report, top));
        out.push_str(&super::callers::top_callers(report, top));
    }
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
        "dropped events: {}\n{}\n",
        if dropped.is_empty() {
            "none".to_owned()
        } else {
            dropped.join(", ")
        },
        report.percentile_resolution
    ));
    out
}

/// `maps: LOCK_STATS_A 12/4096, … (kernel memory 9.1 MiB)`: how full each
/// map was at the last drain (a full map drops events) and what they cost.
fn maps_line(maps: &[MapFill]) -> String {
    let fill: Vec<String> = maps
        .iter()
        .map(|m| match m.used {
            Some(used) => format!("{} {used}/{}", m.name, m.capacity),
            None => format!("{} ?/{}", m.name, m.capacity),
        })
        .collect();
    let memory: u64 = maps.iter().filter_map(|m| m.memlock_bytes).sum();
    format!(
        "maps: {} (kernel memory {:.1} MiB)\n",
        fill.join(", "),
        memory as f64 / 1048576.0
    )
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
    use crate::model::report::tests::sample;

    #[test]
    fn text_says_why_hold_is_missing_and_never_prints_zero_for_it() {
        let text = render(&sample(), 20);
        assert!(
            !render(&sample(), 0).contains("herd(10)"),
            "--top 0 shows no rows"
        );
        assert!(
            text.contains("hold times: n/a (needs fentry or kprobe)"),
            "{text}"
        );
        assert!(text.contains("pipe:[4242]"));
        assert!(text.contains("n/a"));
        assert!(
            text.contains("dropped events: untimed on traced locks 2"),
            "per-lock drops are summed: {text}"
        );
        assert!(text.contains("note: lockref: n/a in tracepoint mode"), "{text}");
    }

    #[test]
    fn the_header_says_how_full_each_map_is_and_what_they_cost() {
        let mut report = sample();
        assert!(!render(&report, 20).contains("maps:"), "no fill read: no line");
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
        let text = render(&report, 20);
        assert!(
            text.contains("maps: LOCK_STATS_A 12/4096, TASK_PIPE ?/16384 (kernel memory 3.5 MiB)\n"),
            "{text}"
        );
    }
}
