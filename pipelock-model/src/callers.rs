//! Where waits come from: kernel call stacks (`--callers`, `--by caller`)
//! and the threads that waited (`--by task`), built from a lock's parts.
use std::collections::HashMap;

use pipelock_common::{DetailKey, DetailStats, NO_STACK, detail};
use serde::{Deserialize, Serialize};

use super::{
    class::LockClass,
    owners::{FOLDED, TaskNames},
};

/// What the report's rows are: locks (the default), call stacks across
/// locks (like `perf lock contention`'s default), or threads (`-t`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ByKey {
    #[default]
    Lock,
    Caller,
    Task,
}

impl ByKey {
    pub const NAMES: [&'static str; 3] = ["lock", "caller", "task"];
}

impl std::str::FromStr for ByKey {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "lock" => Ok(Self::Lock),
            "caller" => Ok(Self::Caller),
            "task" => Ok(Self::Task),
            _ => Err(format!("unknown grouping `{text}` (one of: lock, caller, task)")),
        }
    }
}

/// One call stack's share of a lock's (or a class's) acquisitions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallerRow {
    pub class: Option<LockClass>,
    /// Innermost first, from the lock's caller outwards (`anon_pipe_write+0x50`,
    /// `vfs_write+0x2a4`, …); `["(stack lost)"]` when it could not be stored.
    pub stack: Vec<String>,
    /// Every acquisition (hooked modes); None in tracepoint mode.
    pub acquisitions: Option<u64>,
    pub contentions: u64,
    pub wait_total_ns: u64,
    pub wait_max_ns: u64,
    /// None in tracepoint mode.
    pub hold_total_ns: Option<u64>,
    /// Where some of the row's stacks were sampled (`--stack-sample`), its
    /// figures are estimates: these are their 95 % margins (±). None: every
    /// stack was unwound, the figures are exact. (`wait_max_ns` is then the
    /// longest sampled wait.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub margin: Option<CallerMargin>,
}

/// The 95 % margins (±) of a sampled caller row's estimates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallerMargin {
    pub acquisitions: Option<u64>,
    pub contentions: u64,
    pub wait_total_ns: u64,
    pub hold_total_ns: Option<u64>,
}

#[path = "callers_estimate.rs"]
mod estimate;
pub use estimate::{Estimate, LockTotals, Remainder};
#[cfg(test)]
use estimate::{share_margin, z95};

/// One thread's share.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRow {
    pub class: Option<LockClass>,
    pub tid: u32,
    pub pid: Option<u32>,
    pub comm: Option<String>,
    pub acquisitions: Option<u64>,
    pub contentions: u64,
    pub wait_total_ns: u64,
    pub wait_max_ns: u64,
    pub hold_total_ns: Option<u64>,
}

impl TaskRow {
    /// `comm(pid/tid)`, or `tid N` when its name was not recorded.
    pub fn label(&self) -> String {
        if self.tid == FOLDED {
            return "(other threads)".to_owned();
        }
        match (&self.comm, self.pid) {
            (Some(comm), Some(pid)) if pid != self.tid => format!("{comm}({pid}/{})", self.tid),
            (Some(comm), _) => format!("{comm}({})", self.tid),
            (None, _) => format!("tid {}", self.tid),
        }
    }
}

/// Turns kernel frames into the stack a report shows: the tracing and
/// locking frames on top (the program, the tracepoint, `mutex_lock` and
/// its slow path) go, the callers stay, `depth` of them.
pub fn caller_frames(frames: &[String], depth: usize) -> Vec<String> {
    let callers: Vec<String> = frames
        .iter()
        .skip_while(|frame| is_machinery(frame))
        .take(depth)
        .cloned()
        .collect();
    if callers.is_empty() {
        // Nothing but machinery (a too-short stack): show what there is.
        frames.iter().take(depth).cloned().collect()
    } else {
        callers
    }
}

/// Frames of BPF, tracing and the lock implementations themselves: the
/// interesting caller is the first frame below them.
fn is_machinery(frame: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "bpf_",
        "__bpf_",
        "__traceiter_",
        "trace_contention",
        "__trace_",
        "perf_trace",
        "mutex_lock",
        "__mutex_lock",
        "mutex_spin_on_owner",
        "mutex_optimistic_spin",
        "osq_lock",
        "_raw_spin_lock",
        "_raw_spin_unlock",
        "__raw_spin_lock",
        "queued_spin_lock_slowpath",
        "native_queued_spin_lock_slowpath",
        "__pv_queued_spin_lock_slowpath",
        "pv_queued_spin_lock_slowpath",
        "do_raw_spin_lock",
        "__lock_text_start",
        "0x",
    ];
    PREFIXES.iter().any(|prefix| frame.starts_with(prefix))
}

/// Whether `glob` matches a frame, or its function alone (`anon_pipe_write`
/// matches `anon_pipe_write+0x50`).
pub fn frame_matches(glob: &glob::Pattern, frame: &str) -> bool {
    glob.matches(frame) || glob.matches(frame.split('+').next().unwrap_or(frame))
}

/// A lock's (or class's) caller rows: parts of kind `CALLER` grouped by
/// their shown stack (ids whose stacks differ only below `depth` merge),
/// most wait first. `stack_of` gives an id's symbolized frames; `totals`
/// are the lock's own, for what sampling left out of its rows.
pub fn callers_of<'a>(
    class: Option<LockClass>,
    parts: impl IntoIterator<Item = (&'a DetailKey, &'a DetailStats)>,
    stack_of: &dyn Fn(u32) -> Option<Vec<String>>,
    depth: usize,
    hooked: bool,
    stack_sample: u32,
    totals: &LockTotals,
) -> Vec<CallerRow> {
    let parts: Vec<_> = parts
        .into_iter()
        .filter(|(key, _)| key.kind == detail::CALLER)
        .collect();
    let remainder = Remainder::of(totals, parts.iter().map(|(_, s)| *s), stack_sample, hooked);
    let mut grouped: HashMap<Vec<String>, DetailStats> = HashMap::new();
    for (key, stats) in parts {
        let stack = match (key.id, stack_of(key.id)) {
            (FOLDED, _) => vec!["(other call stacks)".to_owned()],
            (NO_STACK, _) | (_, None) => vec!["(stack lost)".to_owned()],
            (_, Some(frames)) => caller_frames(&frames, depth),
        };
        super::owners::merge_detail(grouped.entry(stack).or_default(), stats);
    }
    let mut rows: Vec<CallerRow> = grouped
        .into_iter()
        .map(|(stack, s)| {
            let estimate = Estimate::of(&s, stack_sample, &remainder);
            CallerRow {
                class,
                stack,
                acquisitions: hooked.then_some(estimate.acquisitions),
                contentions: estimate.contentions,
                wait_total_ns: estimate.wait_ns,
                wait_max_ns: s.wait_max_ns,
                hold_total_ns: hooked.then_some(estimate.hold_ns),
                margin: CallerMargin::of(&s, stack_sample, hooked, &remainder),
            }
        })
        .collect();
    sort_callers(&mut rows);
    rows
}

/// Most wait first (then most acquisitions, then the stack: a stable order).
pub fn sort_callers(rows: &mut [CallerRow]) {
    rows.sort_by(|a, b| {
        (b.wait_total_ns, b.acquisitions)
            .cmp(&(a.wait_total_ns, a.acquisitions))
            .then_with(|| a.stack.cmp(&b.stack))
    });
}

/// Caller rows of many locks merged by (class, stack): `--by caller`.
pub fn merge_callers(rows: impl IntoIterator<Item = CallerRow>) -> Vec<CallerRow> {
    let mut merged: HashMap<(Option<LockClass>, Vec<String>), CallerRow> = HashMap::new();
    for row in rows {
        match merged.entry((row.class, row.stack.clone())) {
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(row);
            }
            std::collections::hash_map::Entry::Occupied(mut slot) => {
                let into = slot.get_mut();
                into.acquisitions = add(into.acquisitions, row.acquisitions);
                into.contentions += row.contentions;
                into.wait_total_ns += row.wait_total_ns;
                into.wait_max_ns = into.wait_max_ns.max(row.wait_max_ns);
                into.hold_total_ns = add(into.hold_total_ns, row.hold_total_ns);
                into.margin = CallerMargin::plus(into.margin, row.margin);
            }
        }
    }
    let mut rows: Vec<CallerRow> = merged.into_values().collect();
    sort_callers(&mut rows);
    rows
}

fn add(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (None, None) => None,
        _ => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    }
}

/// Task rows by (class, thread): `--by task`, most wait first.
pub fn tasks_of<'a>(
    parts: impl IntoIterator<Item = (Option<LockClass>, &'a DetailKey, &'a DetailStats)>,
    names: &TaskNames,
    hooked: bool,
) -> Vec<TaskRow> {
    let mut grouped: HashMap<(Option<LockClass>, u32), DetailStats> = HashMap::new();
    for (class, key, stats) in parts {
        if key.kind == detail::TASK {
            super::owners::merge_detail(grouped.entry((class, key.id)).or_default(), stats);
        }
    }
    let mut rows: Vec<TaskRow> = grouped
        .into_iter()
        .map(|((class, tid), s)| {
            let name = names.get(&tid);
            TaskRow {
                class,
                tid,
                pid: name.map(|(pid, _)| *pid),
                comm: name.map(|(_, comm)| comm.clone()),
                acquisitions: hooked.then_some(s.acquisitions),
                contentions: s.contentions,
                wait_total_ns: s.wait_ns,
                wait_max_ns: s.wait_max_ns,
                hold_total_ns: hooked.then_some(s.hold_ns),
            }
        })
        .collect();
    rows.sort_by(|a, b| {
        (b.wait_total_ns, b.acquisitions)
            .cmp(&(a.wait_total_ns, a.acquisitions))
            .then((a.class, a.tid).cmp(&(b.class, b.tid)))
    });
    rows
}

#[cfg(test)]
#[path = "callers_tests.rs"]
mod tests;
