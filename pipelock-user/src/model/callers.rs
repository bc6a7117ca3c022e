//! Where waits come from: kernel call stacks (`--callers`, `--by caller`)
//! and the threads that waited (`--by task`), built from a lock's parts.
use std::collections::HashMap;

use pipelock_common::{DetailKey, DetailStats, NO_STACK, detail, sampling};
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

/// Standard normal quantile of a two-sided 95 % interval.
const Z95: f64 = 1.96;

/// A lock's own figures, which count every event, sampled or not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockTotals {
    /// Every acquisition (hooked modes; 0 in tracepoint mode).
    pub acquisitions: u64,
    pub contentions: u64,
    pub wait_ns: u64,
    pub hold_ns: u64,
}

/// One of a lock's figures as its caller rows share it: `left` is what
/// the rows did not record exactly (the lock's exact figure less the
/// rows' unsampled records), `sampled` the sum of the same figure over
/// the rows' sampled records. A row gets `left` in proportion to its part
/// of `sampled`: a ratio estimator, which makes the rows add up to the
/// lock's own figure, so that no row can claim more than its lock had.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Pool {
    left: u64,
    sampled: u64,
}

impl Pool {
    fn share(&self, sampled: u64) -> f64 {
        if self.sampled == 0 {
            0.0
        } else {
            self.left as f64 * sampled as f64 / self.sampled as f64
        }
    }
}

/// What sampling left a lock's caller rows to estimate, figure by figure
/// (see [`Pool`]), and the scale of one event's share of a total.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Remainder {
    totals: LockTotals,
    acquisitions: Pool,
    contentions: Pool,
    wait_ns: Pool,
    hold_ns: Pool,
    /// The root mean square wait and hold (ns) of the lock's sampled
    /// records (or, where none was sampled, of its events).
    wait_rms_ns: f64,
    hold_rms_ns: f64,
}

/// A part's figures recorded exactly: its totals less what its sampled
/// records counted (`sample` times each).
fn exact_of(stats: &DetailStats, sample: u32) -> [u64; 4] {
    let w = u64::from(sample.max(1));
    let s = &stats.sampled;
    [
        stats.acquisitions.saturating_sub(w * s[sampling::RECORDS]),
        stats.contentions.saturating_sub(w * s[sampling::CONTENDED]),
        stats
            .wait_ns
            .saturating_sub(w.saturating_mul(s[sampling::WAIT_SUM])),
        stats
            .hold_ns
            .saturating_sub(w.saturating_mul(s[sampling::HOLD_SUM])),
    ]
}

/// A part's sampled records, per figure (records standing for
/// acquisitions, contended ones, and their unweighted wait and hold).
fn sampled_of(stats: &DetailStats) -> [u64; 4] {
    let s = &stats.sampled;
    [
        s[sampling::RECORDS],
        s[sampling::CONTENDED],
        s[sampling::WAIT_SUM],
        s[sampling::HOLD_SUM],
    ]
}

impl Remainder {
    /// From a lock's totals and its caller parts.
    pub fn of<'a>(
        totals: &LockTotals,
        parts: impl IntoIterator<Item = &'a DetailStats>,
        sample: u32,
        hooked: bool,
    ) -> Self {
        let (mut exact, mut sampled) = ([0u64; 4], [0u64; 4]);
        let (mut wait_squares, mut hold_squares) = (0u64, 0u64);
        for part in parts {
            for (sum, x) in exact.iter_mut().zip(exact_of(part, sample)) {
                *sum = sum.saturating_add(x);
            }
            for (sum, x) in sampled.iter_mut().zip(sampled_of(part)) {
                *sum = sum.saturating_add(x);
            }
            wait_squares = wait_squares.saturating_add(part.sampled[sampling::WAIT_SQUARES]);
            hold_squares = hold_squares.saturating_add(part.sampled[sampling::HOLD_SQUARES]);
        }
        let records = sampled[0];
        let unit = f64::from(1u32 << sampling::SQUARE_SHIFT);
        // Without a sampled record, the lock's mean stands in; in
        // tracepoint mode a left-out wait is shorter than LONG_WAIT_NS.
        let per = |total: u64, events: u64| total as f64 / events.max(1) as f64;
        let (wait_rms_ns, hold_rms_ns) = if records > 0 {
            (
                (wait_squares as f64 / records as f64).sqrt() * unit,
                (hold_squares as f64 / records as f64).sqrt() * unit,
            )
        } else if hooked {
            (
                per(totals.wait_ns, totals.acquisitions),
                per(totals.hold_ns, totals.acquisitions),
            )
        } else {
            (
                per(totals.wait_ns, totals.contentions).min(sampling::LONG_WAIT_NS as f64),
                0.0,
            )
        };
        let pool = |total: u64, i: usize| Pool {
            left: total.saturating_sub(exact[i]),
            sampled: sampled[i],
        };
        Self {
            totals: *totals,
            acquisitions: if hooked {
                pool(totals.acquisitions, 0)
            } else {
                Pool::default()
            },
            contentions: pool(totals.contentions, 1),
            wait_ns: pool(totals.wait_ns, 2),
            hold_ns: if hooked {
                pool(totals.hold_ns, 3)
            } else {
                Pool::default()
            },
            wait_rms_ns,
            hold_rms_ns,
        }
    }

    /// Whether every event of the lock is in its rows as recorded.
    fn is_exact(&self) -> bool {
        self.acquisitions.left == 0 && self.contentions.left == 0
    }
}

/// A caller part's figures as the report gives them: what it recorded
/// exactly plus its share of what the lock's rows sampled, never more
/// than the lock's own figure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Estimate {
    pub acquisitions: u64,
    pub contentions: u64,
    pub wait_ns: u64,
    pub hold_ns: u64,
}

impl Estimate {
    pub fn of(stats: &DetailStats, sample: u32, rem: &Remainder) -> Self {
        if sample <= 1 {
            return Self {
                acquisitions: stats.acquisitions,
                contentions: stats.contentions,
                wait_ns: stats.wait_ns,
                hold_ns: stats.hold_ns,
            };
        }
        let [a, c, wait, hold] = exact_of(stats, sample);
        let [ra, rc, rw, rh] = sampled_of(stats);
        let t = &rem.totals;
        let est = |exact: u64, pool: &Pool, sampled: u64, total: u64| {
            (exact + pool.share(sampled).round() as u64).min(total.max(exact))
        };
        Self {
            acquisitions: est(a, &rem.acquisitions, ra, t.acquisitions),
            contentions: est(c, &rem.contentions, rc, t.contentions),
            wait_ns: est(wait, &rem.wait_ns, rw, t.wait_ns),
            hold_ns: est(hold, &rem.hold_ns, rh, t.hold_ns),
        }
    }
}

/// The half-width of the two-sided 95 % interval of a share of which `n`
/// of `of` sampled records were seen (Wilson's score interval: for n = 0
/// its upper end is z²/(of + z²), where the plug-in variance would call
/// the share exactly 0), as the larger of its two sides.
fn share_margin(n: u64, of: u64) -> f64 {
    if of == 0 {
        return 1.0;
    }
    let (n, m) = (n as f64, of as f64);
    let p = n / m;
    let z2 = Z95 * Z95;
    let centre = (p + z2 / (2.0 * m)) / (1.0 + z2 / m);
    let half = Z95 / (1.0 + z2 / m) * (p * (1.0 - p) / m + z2 / (4.0 * m * m)).sqrt();
    (p - (centre - half)).max(centre + half - p)
}

impl CallerMargin {
    /// The margins of a part's estimates (see [`Estimate`]). Its records
    /// are a random sample of what the lock left to estimate: its count's
    /// margin is that count times the margin of the part's share of the
    /// records (Wilson's interval); a row none of whose records was
    /// sampled still has one, unless the lock left nothing to estimate.
    /// A total's margin is the count's times the root mean square of the
    /// row's sampled figures, pooled with one record at the lock's, and
    /// never more than the lock left. None when nothing was left to estimate.
    pub fn of(stats: &DetailStats, sample: u32, hooked: bool, rem: &Remainder) -> Option<Self> {
        if sample <= 1 || rem.is_exact() {
            return None;
        }
        let count = |n: u64, pool: &Pool| pool.left as f64 * share_margin(n, pool.sampled);
        let records = stats.sampled[sampling::RECORDS];
        let unit = f64::from(1u32 << sampling::SQUARE_SHIFT);
        let rms = |squares: u64, lock_rms: f64| {
            ((squares as f64 * unit * unit + lock_rms * lock_rms) / (records as f64 + 1.0)).sqrt()
        };
        let contentions = count(stats.sampled[sampling::CONTENDED], &rem.contentions);
        let acquisitions = count(records, &rem.acquisitions);
        // Every record carries a wait: contended ones only in tracepoint
        // mode, every acquisition in the hooked modes.
        let wait_events = if hooked { acquisitions } else { contentions };
        let total = |events: f64, squares: u64, lock_rms: f64, pool: &Pool| {
            (events * rms(squares, lock_rms)).min(pool.left as f64).round() as u64
        };
        Some(Self {
            acquisitions: hooked.then(|| acquisitions.round() as u64),
            contentions: contentions.round() as u64,
            wait_total_ns: total(
                wait_events,
                stats.sampled[sampling::WAIT_SQUARES],
                rem.wait_rms_ns,
                &rem.wait_ns,
            ),
            hold_total_ns: hooked.then(|| {
                total(
                    acquisitions,
                    stats.sampled[sampling::HOLD_SQUARES],
                    rem.hold_rms_ns,
                    &rem.hold_ns,
                )
            }),
        })
    }

    /// The margins of a sum of independent estimates: their variances add.
    fn plus(a: Option<Self>, b: Option<Self>) -> Option<Self> {
        let (a, b) = match (a, b) {
            (None, None) => return None,
            (a, b) => (a.unwrap_or_default(), b.unwrap_or_default()),
        };
        let q = |x: u64, y: u64| ((x as f64).powi(2) + (y as f64).powi(2)).sqrt().round() as u64;
        let qo = |x: Option<u64>, y: Option<u64>| match (x, y) {
            (None, None) => None,
            (x, y) => Some(q(x.unwrap_or(0), y.unwrap_or(0))),
        };
        Some(Self {
            acquisitions: qo(a.acquisitions, b.acquisitions),
            contentions: q(a.contentions, b.contentions),
            wait_total_ns: q(a.wait_total_ns, b.wait_total_ns),
            hold_total_ns: qo(a.hold_total_ns, b.hold_total_ns),
        })
    }
}

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
