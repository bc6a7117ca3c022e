//! `pipelock top`'s state: the latest snapshot joined into rows, a short
//! history per lock, and the key-driven view settings. No I/O here: the
//! event loop feeds it samples and keys, the view draws it.
use std::collections::{HashMap, VecDeque};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::groups::{GroupRow, Groupings, join_groups};
use crate::model::{
    AskedTwice, ByKey, CallerRow, CollectorFill, HolderState, LockRow, MapFill, OwnerRow, ProgramStats,
    Refusal, Snapshot, Timing, TraceReport, class_label,
};

/// Owners per row kept for the detail pane.
const OWNERS_KEPT: usize = 3;

/// Intervals of history kept per lock (the detail pane's sparkline).
pub const HISTORY: usize = 120;

/// One collector tick, as the app receives it.
pub struct Sample {
    pub snapshot: Snapshot,
    /// Since the trace started.
    pub elapsed_s: f64,
}

/// One lock as the table shows it: this interval's rates and timings next
/// to the totals since start (or the last reset).
#[derive(Clone, Debug, PartialEq)]
pub struct TopRow {
    pub lock_addr: u64,
    /// With the address, which lock instance this is (see `LockRow::owner`).
    pub owner: u64,
    pub class: &'static str,
    pub name: String,
    pub comms: Vec<String>,
    /// Per second over the last interval (None: not measured in this mode).
    pub acquisitions_per_s: Option<f64>,
    pub contentions_per_s: f64,
    pub wait: Option<Timing>,
    pub hold: Option<Timing>,
    pub total_acquisitions: Option<u64>,
    pub total_contentions: u64,
    pub total_wait: Option<Timing>,
    pub total_hold: Option<Timing>,
    /// Since start: who owned the lock when its waits began, busiest first,
    /// and what the owners were doing meanwhile.
    pub owners: Vec<OwnerRow>,
    pub holder: HolderState,
    /// Since start: its busiest call stack (`--callers`).
    pub top_caller: Option<CallerRow>,
}

/// Table order; `s` cycles through them, largest first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortColumn {
    #[default]
    ContentionsPerS,
    AcquisitionsPerS,
    WaitAvg,
    WaitMax,
    HoldAvg,
    HoldMax,
    TotalWait,
    Name,
}

impl SortColumn {
    const ALL: [Self; 8] = [
        Self::ContentionsPerS,
        Self::AcquisitionsPerS,
        Self::WaitAvg,
        Self::WaitMax,
        Self::HoldAvg,
        Self::HoldMax,
        Self::TotalWait,
        Self::Name,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::ContentionsPerS => "contended/s",
            Self::AcquisitionsPerS => "acquired/s",
            Self::WaitAvg => "wait avg",
            Self::WaitMax => "wait max",
            Self::HoldAvg => "hold avg",
            Self::HoldMax => "hold max",
            Self::TotalWait => "total wait",
            Self::Name => "lock",
        }
    }

    fn next(self) -> Self {
        let at = Self::ALL.iter().position(|c| *c == self).unwrap_or(0);
        Self::ALL[(at + 1) % Self::ALL.len()]
    }

    fn compare(self, a: &TopRow, b: &TopRow) -> std::cmp::Ordering {
        let avg = |t: &Option<Timing>| t.as_ref().map_or(0, |t| t.avg_ns);
        let max = |t: &Option<Timing>| t.as_ref().map_or(0, |t| t.max_ns);
        match self {
            Self::ContentionsPerS => b.contentions_per_s.total_cmp(&a.contentions_per_s),
            Self::AcquisitionsPerS => b
                .acquisitions_per_s
                .unwrap_or(0.0)
                .total_cmp(&a.acquisitions_per_s.unwrap_or(0.0)),
            Self::WaitAvg => avg(&b.wait).cmp(&avg(&a.wait)),
            Self::WaitMax => max(&b.wait).cmp(&max(&a.wait)),
            Self::HoldAvg => avg(&b.hold).cmp(&avg(&a.hold)),
            Self::HoldMax => max(&b.hold).cmp(&max(&a.hold)),
            Self::TotalWait => {
                let total = |r: &TopRow| r.total_wait.as_ref().map_or(0, |t| t.total_ns);
                total(b).cmp(&total(a))
            }
            Self::Name => a.name.cmp(&b.name),
        }
    }

    /// The same orders for call stacks and threads; their rows keep only
    /// totals for wait and hold, so those columns sort by them.
    pub(super) fn compare_groups(self, a: &GroupRow, b: &GroupRow) -> std::cmp::Ordering {
        match self {
            Self::ContentionsPerS => b.contentions_per_s.total_cmp(&a.contentions_per_s),
            Self::AcquisitionsPerS => b
                .acquisitions_per_s
                .unwrap_or(0.0)
                .total_cmp(&a.acquisitions_per_s.unwrap_or(0.0)),
            Self::WaitAvg => b.wait_avg_ns().cmp(&a.wait_avg_ns()),
            Self::WaitMax => b.wait_max_ns.cmp(&a.wait_max_ns),
            Self::HoldAvg | Self::HoldMax => b.hold_total_ns.cmp(&a.hold_total_ns),
            Self::TotalWait => b.wait_total_ns.cmp(&a.wait_total_ns),
            Self::Name => a.label.cmp(&b.label),
        }
    }
}

/// What a key asks of the event loop beyond the app's own state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    None,
    Quit,
    /// Start the running totals afresh (the collector owns them).
    Reset,
    /// Draw the waits so far by call stack into a flame graph file.
    FlameGraph,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Input {
    #[default]
    Normal,
    /// Typing a filter after `/` or `f`.
    Filter,
}

#[derive(Default)]
pub struct App {
    pub kernel: String,
    pub mode: String,
    /// The mode hooks every acquisition (fentry, kprobe), not only the
    /// contended ones: hold times and acquisition counts are measured.
    pub hooked: bool,
    /// The better modes the kernel refused.
    pub refused: Vec<Refusal>,
    pub notes: Vec<String>,
    pub interval_s: f64,
    pub elapsed_s: f64,
    /// Every lock of the latest sample, unsorted and unfiltered.
    pub rows: Vec<TopRow>,
    /// What the table shows, and which groupings were recorded.
    pub by: ByKey,
    pub groupings: Groupings,
    /// The latest sample's call stacks and threads (where recorded).
    pub callers: Vec<GroupRow>,
    pub tasks: Vec<GroupRow>,
    /// Contentions per interval, per lock, oldest first.
    pub history: HashMap<(u64, u64), VecDeque<u64>>,
    pub drops: Vec<(String, u64)>,
    pub fill: Vec<MapFill>,
    /// The running total against `--track-locks`, and pipelock's memory.
    pub collector: Option<CollectorFill>,
    /// Threads that asked for a mutex they hold (deadlocks), since attach.
    pub asked_twice: Vec<AskedTwice>,
    /// pipelock's programs over the last interval: runs per second, ns per run.
    pub bpf_runs_per_s: f64,
    pub bpf_ns_per_run: Option<f64>,
    /// BPF run time as a share of one CPU over the last interval.
    pub bpf_cpu_share: f64,
    previous_programs: Vec<ProgramStats>,
    pub sort: SortColumn,
    pub filter: String,
    pub input: Input,
    /// Index into [`App::visible`].
    pub selected: usize,
    pub detail: bool,
    /// The help with every key is shown (`?`).
    pub help: bool,
    /// The kernel side is shown (`m`): every map's fill, the drops, the
    /// notes and the refused modes' whole errors.
    pub kernel_pane: bool,
    pub paused: bool,
    pub samples: u64,
    /// The running totals of the latest sample (what `F` draws).
    pub total: Option<TraceReport>,
    /// What the last command key did, shown on the key line until the next
    /// key (`F`: the file written, or why none was).
    pub status: Option<String>,
}

impl App {
    pub fn new(kernel: String, mode: String, notes: Vec<String>, interval_s: f64) -> Self {
        Self {
            kernel,
            mode,
            notes,
            interval_s,
            ..Self::default()
        }
    }

    /// What the attach mode measures, and the modes refused before it.
    pub fn with_attach(mut self, hooked: bool, refused: Vec<Refusal>) -> Self {
        self.hooked = hooked;
        self.refused = refused;
        self
    }

    /// A new tick from the collector. While paused the view stays as it was.
    pub fn on_sample(&mut self, sample: Sample) {
        if self.paused {
            return;
        }
        let Snapshot {
            interval,
            total,
            fill,
        } = sample.snapshot;
        self.samples += 1;
        self.elapsed_s = sample.elapsed_s;
        let seconds = interval.duration_s.max(1e-9);
        self.account_programs(&total.programs, seconds);
        self.drops = total
            .drops
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .filter(|(_, v)| *v > 0)
            .collect();
        self.fill = fill;
        self.collector = total.collector;
        self.asked_twice = total.asked_twice.clone();
        self.rows = join_rows(&interval, &total, seconds);
        if self.groupings.callers {
            self.callers = join_groups(&interval.by_caller, &total.by_caller, seconds);
        }
        if self.groupings.tasks {
            self.tasks = join_groups(&interval.by_task, &total.by_task, seconds);
        }
        for row in &self.rows {
            let contended = interval
                .locks
                .iter()
                .find(|r| (r.lock_addr, r.owner) == (row.lock_addr, row.owner))
                .map_or(0, |r| r.contentions);
            let history = self.history.entry((row.lock_addr, row.owner)).or_default();
            history.push_back(contended);
            if history.len() > HISTORY {
                history.pop_front();
            }
        }
        self.selected = self.selected.min(self.shown().saturating_sub(1));
        self.total = Some(total);
    }

    /// Rows by `by`, recorded as `groupings` allow (`--by` asks for them).
    pub fn with_grouping(mut self, by: ByKey, groupings: Groupings) -> Self {
        self.groupings = groupings;
        self.by = by;
        self
    }

    /// How many rows the table shows now.
    pub fn shown(&self) -> usize {
        match self.by {
            ByKey::Lock => self.visible().len(),
            ByKey::Caller | ByKey::Task => self.visible_groups().len(),
        }
    }

    /// Call stacks or threads as the table shows them: filtered, sorted.
    pub fn visible_groups(&self) -> Vec<&GroupRow> {
        let needle = self.filter.to_lowercase();
        let rows = match self.by {
            ByKey::Lock => &[][..],
            ByKey::Caller => &self.callers[..],
            ByKey::Task => &self.tasks[..],
        };
        let mut rows: Vec<&GroupRow> = rows
            .iter()
            .filter(|r| {
                needle.is_empty() || r.class.contains(&needle) || r.label.to_lowercase().contains(&needle)
            })
            .collect();
        rows.sort_by(|a, b| {
            self.sort
                .compare_groups(a, b)
                .then_with(|| (a.class, &a.label).cmp(&(b.class, &b.label)))
        });
        rows
    }

    pub fn selected_group(&self) -> Option<&GroupRow> {
        self.visible_groups().get(self.selected).copied()
    }

    fn account_programs(&mut self, programs: &[ProgramStats], seconds: f64) {
        let sum = |list: &[ProgramStats]| {
            list.iter()
                .fold((0u64, 0u64), |(r, t), p| (r + p.run_count, t + p.run_time_ns))
        };
        let (runs, ns) = sum(programs);
        let (old_runs, old_ns) = sum(&self.previous_programs);
        let (runs, ns) = (runs.saturating_sub(old_runs), ns.saturating_sub(old_ns));
        self.bpf_runs_per_s = runs as f64 / seconds;
        self.bpf_ns_per_run = (runs > 0).then(|| ns as f64 / runs as f64);
        self.bpf_cpu_share = ns as f64 / 1e9 / seconds;
        self.previous_programs = programs.to_vec();
    }

    /// The rows the table shows: filtered, then sorted.
    pub fn visible(&self) -> Vec<&TopRow> {
        let needle = self.filter.to_lowercase();
        let mut rows: Vec<&TopRow> = self
            .rows
            .iter()
            .filter(|r| {
                needle.is_empty()
                    || r.class.contains(&needle)
                    || r.name.to_lowercase().contains(&needle)
                    || r.comms.iter().any(|c| c.to_lowercase().contains(&needle))
            })
            .collect();
        rows.sort_by(|a, b| {
            self.sort
                .compare(a, b)
                .then((a.lock_addr, a.owner).cmp(&(b.lock_addr, b.owner)))
        });
        rows
    }

    /// The selected lock (the table shows locks).
    pub fn selected_row(&self) -> Option<&TopRow> {
        if self.by != ByKey::Lock {
            return None;
        }
        self.visible().get(self.selected).copied()
    }

    /// Whether a row is selected, whatever the rows are.
    pub fn has_selection(&self) -> bool {
        self.selected < self.shown()
    }

    pub fn on_key(&mut self, key: KeyEvent) -> Action {
        if key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL) {
            return Action::Quit;
        }
        if self.input == Input::Filter {
            match key.code {
                KeyCode::Enter => self.input = Input::Normal,
                KeyCode::Esc => {
                    self.filter.clear();
                    self.input = Input::Normal;
                }
                KeyCode::Backspace => {
                    self.filter.pop();
                }
                KeyCode::Char(c) => self.filter.push(c),
                _ => {}
            }
            self.selected = 0;
            return Action::None;
        }
        let last = self.shown().saturating_sub(1);
        self.status = None;
        match key.code {
            KeyCode::Char('q') => return Action::Quit,
            KeyCode::Char('?') => {
                self.help = !self.help;
                self.kernel_pane = false;
            }
            KeyCode::Char('m') => {
                self.kernel_pane = !self.kernel_pane;
                self.help = false;
            }
            KeyCode::Esc if self.help => self.help = false,
            KeyCode::Esc if self.kernel_pane => self.kernel_pane = false,
            KeyCode::Esc if self.detail => self.detail = false,
            KeyCode::Esc => return Action::Quit,
            KeyCode::Down | KeyCode::Char('j') => self.selected = (self.selected + 1).min(last),
            KeyCode::Up | KeyCode::Char('k') => self.selected = self.selected.saturating_sub(1),
            KeyCode::Home | KeyCode::Char('g') => self.selected = 0,
            KeyCode::End | KeyCode::Char('G') => self.selected = last,
            KeyCode::Enter => self.detail = !self.detail,
            KeyCode::Char('s') => self.sort = self.sort.next(),
            KeyCode::Char('c') => self.sort = SortColumn::ContentionsPerS,
            KeyCode::Char('a') => self.sort = SortColumn::AcquisitionsPerS,
            KeyCode::Char('w') => self.sort = SortColumn::WaitMax,
            KeyCode::Char('h') => self.sort = SortColumn::HoldMax,
            KeyCode::Char('t') => self.sort = SortColumn::TotalWait,
            KeyCode::Char('/') | KeyCode::Char('f') => {
                self.input = Input::Filter;
                self.filter.clear();
            }
            KeyCode::Char('p') | KeyCode::Char(' ') => self.paused = !self.paused,
            KeyCode::Char('b') => {
                self.by = self.groupings.next(self.by);
                self.selected = 0;
            }
            KeyCode::Char('F') if !self.groupings.callers => {
                self.status = Some("no call stacks recorded: start top with --callers for F".to_owned());
            }
            KeyCode::Char('F') => return Action::FlameGraph,
            KeyCode::Char('r') => {
                self.history.clear();
                self.rows.clear();
                self.callers.clear();
                self.tasks.clear();
                self.selected = 0;
                return Action::Reset;
            }
            _ => {}
        }
        Action::None
    }
}

/// This interval's rows joined with the totals, by lock address. A lock seen
/// before but idle now keeps its row, with zero rates.
fn join_rows(interval: &TraceReport, total: &TraceReport, seconds: f64) -> Vec<TopRow> {
    let now: HashMap<(u64, u64), &LockRow> = interval
        .locks
        .iter()
        .map(|r| ((r.lock_addr, r.owner), r))
        .collect();
    total
        .locks
        .iter()
        .map(|t| {
            let i = now.get(&(t.lock_addr, t.owner));
            TopRow {
                lock_addr: t.lock_addr,
                owner: t.owner,
                class: class_label(t.class),
                name: t.name.clone(),
                comms: t.comms.clone(),
                acquisitions_per_s: t
                    .acquisitions
                    .map(|_| i.and_then(|i| i.acquisitions).unwrap_or(0) as f64 / seconds),
                contentions_per_s: i.map_or(0, |i| i.contentions) as f64 / seconds,
                wait: i.and_then(|i| i.wait.clone()),
                hold: i.and_then(|i| i.hold.clone()),
                total_acquisitions: t.acquisitions,
                total_contentions: t.contentions,
                total_wait: t.wait.clone(),
                total_hold: t.hold.clone(),
                owners: t.owners.iter().take(OWNERS_KEPT).cloned().collect(),
                holder: t.holder,
                top_caller: t.callers.first().cloned(),
            }
        })
        .collect()
}

#[cfg(test)]
#[path = "app_tests.rs"]
mod tests;
