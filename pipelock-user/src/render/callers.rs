//! Rows by call stack (`--by caller`) and by thread (`--by task`), and the
//! top stack under each lock (`--callers`), as text.
use crate::model::{CallerRow, TaskRow, TraceReport, class_label};
use crate::units::human_ns;

/// Frames of the top stack printed under each lock.
const FRAMES_UNDER_A_LOCK: usize = 4;

fn na() -> String {
    "n/a".to_owned()
}

/// `value`, and where it is a sampled estimate its 95 % margin as a share
/// of it (`12454 ±3.1 %`), or as it is where it exceeds the value (`2 ±117`:
/// a rare row that may have had events left out).
fn estimate(value: u64, margin: Option<u64>, show: impl Fn(u64) -> String) -> String {
    match margin {
        Some(m) if m < value => format!("{} ±{:.1} %", show(value), m as f64 * 100.0 / value as f64),
        Some(m) => format!("{} ±{}", show(value), show(m)),
        None => show(value),
    }
}

fn avg(total: u64, n: u64) -> String {
    total.checked_div(n).map_or_else(na, human_ns)
}

/// `--by caller`: one row per (class, stack), its stack under it.
pub fn caller_table(report: &TraceReport, top: usize) -> String {
    if report.by_caller.is_empty() {
        return "no call stack was recorded\n".to_owned();
    }
    let mut out = String::new();
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::NOTHING).set_header(vec![
        "class",
        "caller",
        "acquired",
        "contended",
        "wait total",
        "wait avg",
        "wait max",
        "hold total",
    ]);
    let count = |n: u64| n.to_string();
    for row in report.by_caller.iter().take(top) {
        let m = row.margin;
        table.add_row(vec![
            class_label(row.class).to_owned(),
            row.stack.join(" < "),
            row.acquisitions
                .map_or_else(na, |a| estimate(a, m.and_then(|m| m.acquisitions), count)),
            estimate(row.contentions, m.map(|m| m.contentions), count),
            estimate(row.wait_total_ns, m.map(|m| m.wait_total_ns), human_ns),
            avg(row.wait_total_ns, wait_count(row)),
            human_ns(row.wait_max_ns),
            row.hold_total_ns
                .map_or_else(na, |h| estimate(h, m.and_then(|m| m.hold_total_ns), human_ns)),
        ]);
    }
    out.push_str(&table.to_string());
    out.push('\n');
    if report.by_caller.iter().take(top).any(|row| row.margin.is_some()) {
        out.push_str(
            "(± : the 95 % margin of a caller of a lock whose stacks were sampled; see --stack-sample)\n",
        );
    }
    if report.by_caller.len() > top {
        out.push_str(&format!(
            "(+{} more call stacks; all are in --csv/--json, or raise --top)\n",
            report.by_caller.len() - top
        ));
    }
    out
}

/// The waits a caller row's wait total is over: every acquisition in the
/// hooked modes, the contended ones in tracepoint mode.
fn wait_count(row: &CallerRow) -> u64 {
    row.acquisitions.unwrap_or(row.contentions)
}

/// `--by task`: one row per (class, thread).
pub fn task_table(report: &TraceReport, top: usize) -> String {
    if report.by_task.is_empty() {
        return "no thread was recorded\n".to_owned();
    }
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::NOTHING).set_header(vec![
        "class",
        "task",
        "acquired",
        "contended",
        "wait total",
        "wait avg",
        "wait max",
        "hold total",
    ]);
    let count = |row: &TaskRow| row.acquisitions.unwrap_or(row.contentions);
    for row in report.by_task.iter().take(top) {
        table.add_row(vec![
            class_label(row.class).to_owned(),
            row.label(),
            row.acquisitions.map_or_else(na, |a| a.to_string()),
            row.contentions.to_string(),
            human_ns(row.wait_total_ns),
            avg(row.wait_total_ns, count(row)),
            human_ns(row.wait_max_ns),
            row.hold_total_ns.map_or_else(na, human_ns),
        ]);
    }
    let mut out = table.to_string();
    out.push('\n');
    if report.by_task.len() > top {
        out.push_str(&format!(
            "(+{} more threads; all are in --csv/--json, or raise --top)\n",
            report.by_task.len() - top
        ));
    }
    out
}

/// Under the lock table: each shown lock's top call stack (`--callers`).
pub fn top_callers(report: &TraceReport, top: usize) -> String {
    let shown: Vec<_> = report
        .locks
        .iter()
        .take(top)
        .filter_map(|row| Some((row, row.callers.first()?)))
        .collect();
    if shown.is_empty() {
        return String::new();
    }
    let mut out = String::from("\ntop call stack of each lock (--by caller for all of them):\n");
    for (row, caller) in shown {
        let about = if caller.margin.is_some() { "≈" } else { "" };
        let share = match caller.acquisitions {
            Some(a) => format!("{about}{a} acquisitions, {} contended", caller.contentions),
            None => format!("{about}{} contended", caller.contentions),
        };
        out.push_str(&format!(
            "  {}  {share}, wait {} ({} stacks)\n",
            row.name,
            human_ns(caller.wait_total_ns),
            row.callers.len()
        ));
        for frame in caller.stack.iter().take(FRAMES_UNDER_A_LOCK) {
            out.push_str(&format!("      {frame}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ByKey, LockClass, fixtures::sample};

    fn caller(stack: &[&str], contentions: u64, wait: u64) -> CallerRow {
        CallerRow {
            class: Some(LockClass::PipeMutex),
            stack: stack.iter().map(|s| (*s).to_owned()).collect(),
            acquisitions: None,
            contentions,
            wait_total_ns: wait,
            wait_max_ns: wait,
            hold_total_ns: None,
            margin: None,
        }
    }

    #[test]
    fn callers_show_as_rows_and_under_their_lock() {
        let mut report = sample();
        assert_eq!(top_callers(&report, 20), "");
        assert!(caller_table(&report, 20).contains("no call stack"));
        let stacks = vec![
            caller(&["anon_pipe_write+0x50", "vfs_write+0x2a4"], 3, 4000),
            caller(&["anon_pipe_read+0x77"], 1, 100),
        ];
        report.locks[0].callers = stacks.clone();
        report.by_caller = stacks;
        report.by = ByKey::Caller;
        let under = top_callers(&report, 20);
        assert!(
            under.contains("pipe:[4242]  3 contended, wait 4.00 us (2 stacks)"),
            "{under}"
        );
        assert!(under.contains("      vfs_write+0x2a4\n"), "{under}");
        let table = caller_table(&report, 1);
        assert!(
            table.contains("anon_pipe_write+0x50 < vfs_write+0x2a4"),
            "{table}"
        );
        assert!(table.contains("1.33 us"), "average over contended waits: {table}");
        assert!(table.contains("(+1 more call stacks"), "{table}");
        assert!(!table.contains('±'), "exact rows carry no margin: {table}");
    }

    #[test]
    fn sampled_callers_show_their_margins() {
        let mut report = sample();
        let mut row = caller(&["anon_pipe_write+0x50"], 1000, 4_000_000);
        row.margin = Some(crate::model::CallerMargin {
            contentions: 31,
            wait_total_ns: 200_000,
            ..Default::default()
        });
        report.locks[0].callers = vec![row.clone()];
        report.by_caller = vec![row];
        let table = caller_table(&report, 20);
        assert!(table.contains("1000 ±3.1 %"), "{table}");
        assert!(table.contains("4.00 ms ±5.0 %"), "{table}");
        assert!(table.contains("95 % margin"), "{table}");
        let mut rare = caller(&["anon_pipe_read+0x66"], 2, 20_000);
        rare.margin = Some(crate::model::CallerMargin {
            contentions: 117,
            wait_total_ns: 1_170_000,
            ..Default::default()
        });
        report.by_caller.push(rare);
        let table = caller_table(&report, 20);
        assert!(
            table.contains("2 ±117 "),
            "a margin past the value is shown as it is: {table}"
        );
        assert!(table.contains("20.00 us ±1.17 ms"), "{table}");
        assert!(top_callers(&report, 20).contains("≈1000 contended"));
    }

    #[test]
    fn tasks_show_as_rows() {
        let mut report = sample();
        assert!(task_table(&report, 20).contains("no thread"));
        report.by_task = vec![TaskRow {
            class: Some(LockClass::PipeMutex),
            tid: 11,
            pid: Some(10),
            comm: Some("writer".into()),
            acquisitions: Some(4),
            contentions: 2,
            wait_total_ns: 800,
            wait_max_ns: 500,
            hold_total_ns: Some(40),
        }];
        let table = task_table(&report, 20);
        assert!(table.contains("writer(10/11)"), "{table}");
        assert!(
            table.contains("200 ns"),
            "average over every acquisition: {table}"
        );
    }
}
