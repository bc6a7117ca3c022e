//! `pipelock top`'s rows by call stack (`--by caller`) and by thread (`--by
//! task`): what the trace report's `by_caller` and `by_task` give, joined
//! interval to totals like the lock rows.
use std::collections::HashMap;

use crate::model::{ByKey, CallerRow, TaskRow, class_label};

/// One call stack (`--by caller`) or thread (`--by task`) as the table
/// shows it: across the locks of its class, like the trace report's rows.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupRow {
    pub class: &'static str,
    /// The stack's frames joined innermost first, or the thread's
    /// `comm(pid/tid)`.
    pub label: String,
    /// A caller row's frames (empty for a thread).
    pub stack: Vec<String>,
    /// Per second over the last interval (None: not measured in this mode).
    pub acquisitions_per_s: Option<f64>,
    pub contentions_per_s: f64,
    pub total_acquisitions: Option<u64>,
    pub total_contentions: u64,
    pub wait_total_ns: u64,
    pub wait_max_ns: u64,
    pub hold_total_ns: Option<u64>,
}

impl GroupRow {
    /// The waits its wait total is over: every acquisition in the hooked
    /// modes, the contended ones in tracepoint mode.
    pub fn wait_avg_ns(&self) -> u64 {
        self.wait_total_ns
            .checked_div(self.total_acquisitions.unwrap_or(self.total_contentions))
            .unwrap_or(0)
    }
}

/// What the table's rows are (`--by`, `b` switches): locks always; call
/// stacks and threads where they are recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Groupings {
    pub callers: bool,
    pub tasks: bool,
}

impl Groupings {
    pub(super) fn next(self, by: ByKey) -> ByKey {
        let order = [ByKey::Lock, ByKey::Caller, ByKey::Task];
        let at = order.iter().position(|k| *k == by).unwrap_or(0);
        (1..=order.len())
            .map(|step| order[(at + step) % order.len()])
            .find(|k| match k {
                ByKey::Lock => true,
                ByKey::Caller => self.callers,
                ByKey::Task => self.tasks,
            })
            .unwrap_or(ByKey::Lock)
    }
}

/// The table's name for a grouping's rows.
pub fn rows_noun(by: ByKey) -> &'static str {
    match by {
        ByKey::Lock => "locks",
        ByKey::Caller => "call stacks",
        ByKey::Task => "threads",
    }
}

impl From<&CallerRow> for GroupRow {
    fn from(row: &CallerRow) -> Self {
        Self {
            class: class_label(row.class),
            label: row.stack.join(" < "),
            stack: row.stack.clone(),
            acquisitions_per_s: None,
            contentions_per_s: 0.0,
            total_acquisitions: row.acquisitions,
            total_contentions: row.contentions,
            wait_total_ns: row.wait_total_ns,
            wait_max_ns: row.wait_max_ns,
            hold_total_ns: row.hold_total_ns,
        }
    }
}

impl From<&TaskRow> for GroupRow {
    fn from(row: &TaskRow) -> Self {
        Self {
            class: class_label(row.class),
            label: row.label(),
            stack: Vec::new(),
            acquisitions_per_s: None,
            contentions_per_s: 0.0,
            total_acquisitions: row.acquisitions,
            total_contentions: row.contentions,
            wait_total_ns: row.wait_total_ns,
            wait_max_ns: row.wait_max_ns,
            hold_total_ns: row.hold_total_ns,
        }
    }
}

/// Call stacks (or threads) of this interval joined with the totals by
/// class and stack (or thread): the interval's counts become the rates.
pub(super) fn join_groups<'a, R: 'a>(interval: &'a [R], total: &'a [R], seconds: f64) -> Vec<GroupRow>
where
    GroupRow: From<&'a R>,
{
    let now: HashMap<(&'static str, String), GroupRow> = interval
        .iter()
        .map(GroupRow::from)
        .map(|r| ((r.class, r.label.clone()), r))
        .collect();
    total
        .iter()
        .map(GroupRow::from)
        .map(|mut t| {
            let i = now.get(&(t.class, t.label.clone()));
            t.contentions_per_s = i.map_or(0, |i| i.total_contentions) as f64 / seconds;
            t.acquisitions_per_s = t
                .total_acquisitions
                .map(|_| i.and_then(|i| i.total_acquisitions).unwrap_or(0) as f64 / seconds);
            t
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crossterm::event::KeyCode;

    use super::*;
    use crate::tui::fixtures::{app_grouped, app_with, key};

    #[test]
    fn call_stacks_and_threads_become_rows_with_rates() {
        let app = app_grouped(ByKey::Caller);
        let rows = app.visible_groups();
        assert_eq!(rows.len(), 2);
        assert_eq!(
            rows[0].label, "anon_pipe_write+0x50 < vfs_write+0x2a4 < ksys_write+0x73",
            "sorted by contended/s now, not by the totals"
        );
        assert_eq!(
            rows[0].contentions_per_s, 4.0,
            "8 contentions over a 2 s interval"
        );
        assert_eq!(rows[0].acquisitions_per_s, Some(12.0));
        assert_eq!(rows[1].total_contentions, 30);
        assert_eq!(rows[1].wait_avg_ns(), 1000, "90 us over 90 acquisitions");
        let mut app = app;
        app.on_key(key(KeyCode::Char('t')));
        assert!(
            app.visible_groups()[0].label.starts_with("anon_pipe_read"),
            "by total wait"
        );
        let tasks = app_grouped(ByKey::Task);
        let rows = tasks.visible_groups();
        assert_eq!(rows[0].label, "herd(4000/4001)");
        assert!(rows[0].stack.is_empty());
    }

    #[test]
    fn b_switches_between_the_recorded_groupings() {
        // Callers recorded, threads not: lock → caller → lock.
        let mut app = app_grouped(ByKey::Lock);
        assert_eq!(app.shown(), 0, "no lock rows in this sample");
        app.on_key(key(KeyCode::Char('b')));
        assert_eq!(app.by, ByKey::Caller);
        assert_eq!(app.shown(), 2);
        app.on_key(key(KeyCode::Char('j')));
        assert_eq!(app.selected, 1);
        assert!(app.selected_row().is_none(), "no lock is selected among stacks");
        assert!(app.selected_group().is_some());
        app.on_key(key(KeyCode::Char('b')));
        assert_eq!(app.by, ByKey::Lock, "threads were not recorded");
        assert_eq!(app.selected, 0);
        // Both recorded: lock → caller → task → lock.
        let mut app = app_grouped(ByKey::Task);
        app.on_key(key(KeyCode::Char('b')));
        assert_eq!(app.by, ByKey::Lock);
        app.on_key(key(KeyCode::Char('b')));
        app.on_key(key(KeyCode::Char('b')));
        assert_eq!(app.by, ByKey::Task);
        // Without either, `b` stays on locks.
        let mut app = app_with(2);
        app.on_key(key(KeyCode::Char('b')));
        assert_eq!(app.by, ByKey::Lock);
        // The filter applies to the stacks' frames.
        let mut app = app_grouped(ByKey::Caller);
        app.on_key(key(KeyCode::Char('/')));
        for c in "pipe_read".chars() {
            app.on_key(key(KeyCode::Char(c)));
        }
        assert_eq!(app.shown(), 1);
    }
}
