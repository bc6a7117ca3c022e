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

impl CallerMargin {
    /// The margins of a part's estimates whose sampled records each stood
    /// for `sample` of them: a record taken with probability 1/w adds
    /// w(w−1)·x² to the variance of an estimated total of x (see
    /// `pipelock_common::sampling`). None when nothing was sampled.
    pub fn of(stats: &DetailStats, sample: u32, hooked: bool) -> Option<Self> {
        if stats.sampled[sampling::RECORDS] == 0 || sample <= 1 {
            return None;
        }
        let w = f64::from(sample);
        let margin = |sum: u64, unit: f64| (Z95 * (w * (w - 1.0) * sum as f64).sqrt() * unit).round() as u64;
        let unit = f64::from(1u32 << sampling::SQUARE_SHIFT);
        Some(Self {
            acquisitions: hooked.then(|| margin(stats.sampled[sampling::RECORDS], 1.0)),
            contentions: margin(stats.sampled[sampling::CONTENDED], 1.0),
            wait_total_ns: margin(stats.sampled[sampling::WAIT_SQUARES], unit),
            hold_total_ns: hooked.then(|| margin(stats.sampled[sampling::HOLD_SQUARES], unit)),
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
/// most wait first. `stack_of` gives an id's symbolized frames.
pub fn callers_of<'a>(
    class: Option<LockClass>,
    parts: impl IntoIterator<Item = (&'a DetailKey, &'a DetailStats)>,
    stack_of: &dyn Fn(u32) -> Option<Vec<String>>,
    depth: usize,
    hooked: bool,
    stack_sample: u32,
) -> Vec<CallerRow> {
    let mut grouped: HashMap<Vec<String>, DetailStats> = HashMap::new();
    for (key, stats) in parts {
        if key.kind != detail::CALLER {
            continue;
        }
        let stack = match (key.id, stack_of(key.id)) {
            (FOLDED, _) => vec!["(other call stacks)".to_owned()],
            (NO_STACK, _) | (_, None) => vec!["(stack lost)".to_owned()],
            (_, Some(frames)) => caller_frames(&frames, depth),
        };
        super::owners::merge_detail(grouped.entry(stack).or_default(), stats);
    }
    let mut rows: Vec<CallerRow> = grouped
        .into_iter()
        .map(|(stack, s)| CallerRow {
            class,
            stack,
            acquisitions: hooked.then_some(s.acquisitions),
            contentions: s.contentions,
            wait_total_ns: s.wait_ns,
            wait_max_ns: s.wait_max_ns,
            hold_total_ns: hooked.then_some(s.hold_ns),
            margin: CallerMargin::of(&s, stack_sample, hooked),
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
mod tests {
    use pipelock_common::LockKey;

    use super::*;

    fn frames(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn tracing_and_locking_frames_are_cut_from_the_top() {
        let stack = frames(&[
            "bpf_prog_6deef7357e7b4530_pipe_contention_begin_btf+0x1a4",
            "bpf_trace_run2+0x8c",
            "__bpf_trace_contention_begin+0x9",
            "__mutex_lock.constprop.0+0x4a2",
            "mutex_lock+0x3a",
            "anon_pipe_write+0x50",
            "vfs_write+0x2a4",
            "ksys_write+0x6d",
            "do_syscall_64+0x82",
        ]);
        assert_eq!(
            caller_frames(&stack, 2),
            ["anon_pipe_write+0x50", "vfs_write+0x2a4"]
        );
        assert_eq!(caller_frames(&stack, 8).len(), 4);
        // A stack of machinery only is shown as it is.
        assert_eq!(caller_frames(&stack[..3], 8).len(), 3);
    }

    #[test]
    fn globs_match_a_frame_or_its_function() {
        let glob = |g: &str| glob::Pattern::new(g).unwrap();
        assert!(frame_matches(&glob("anon_pipe_write"), "anon_pipe_write+0x50"));
        assert!(frame_matches(&glob("*pipe_write*"), "anon_pipe_write+0x50"));
        assert!(frame_matches(
            &glob("anon_pipe_write+0x5?"),
            "anon_pipe_write+0x50"
        ));
        assert!(!frame_matches(&glob("pipe_write"), "anon_pipe_write+0x50"));
    }

    fn part(lock: u64, kind: u32, id: u32, contentions: u64, wait_ns: u64) -> (DetailKey, DetailStats) {
        (
            DetailKey {
                lock: LockKey { lock, owner: 1 },
                kind,
                id,
            },
            DetailStats {
                acquisitions: contentions * 2,
                contentions,
                wait_ns,
                wait_max_ns: wait_ns,
                hold_ns: 5,
                ..DetailStats::default()
            },
        )
    }

    #[test]
    fn stacks_that_differ_below_the_depth_merge_and_lost_ones_are_said() {
        let parts = [
            part(1, detail::CALLER, 7, 2, 100),
            part(1, detail::CALLER, 8, 3, 300),
            part(1, detail::CALLER, NO_STACK, 1, 10),
            part(1, detail::OWNER, 9, 50, 5000),
        ];
        let stack_of = |id: u32| match id {
            7 => Some(frames(&[
                "mutex_lock+0x3a",
                "anon_pipe_write+0x50",
                "vfs_write+0x1",
            ])),
            8 => Some(frames(&[
                "mutex_lock+0x3a",
                "anon_pipe_write+0x50",
                "vfs_writev+0x9",
            ])),
            _ => None,
        };
        let rows = callers_of(
            Some(LockClass::PipeMutex),
            parts.iter().map(|(k, v)| (k, v)),
            &stack_of,
            1,
            true,
            32,
        );
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!(rows[0].stack, ["anon_pipe_write+0x50"]);
        assert_eq!(
            (rows[0].contentions, rows[0].acquisitions, rows[0].wait_total_ns),
            (5, Some(10), 400)
        );
        assert_eq!(rows[1].stack, ["(stack lost)"]);
        let deeper = callers_of(None, parts.iter().map(|(k, v)| (k, v)), &stack_of, 2, false, 32);
        assert_eq!(deeper.len(), 3, "two stacks apart at depth 2: {deeper:?}");
        assert_eq!(
            deeper[0].acquisitions, None,
            "tracepoint mode counts no acquisitions"
        );
        let merged = merge_callers(rows.clone().into_iter().chain(rows));
        assert_eq!(merged[0].contentions, 10);
        assert!(
            merged.iter().all(|r| r.margin.is_none()),
            "no stack was sampled: exact"
        );
    }

    /// A small deterministic generator (xorshift64*), for simulated sampling.
    struct Draws(u64);

    impl Draws {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
    }

    /// The kernel's scheme, simulated: of 3 stacks with known waits, the
    /// first `exact` events and every long wait are recorded as they are,
    /// the rest one in `w` at random with weight w. The stated 95 % margins
    /// must cover the true totals about 95 % of the time.
    #[test]
    fn sampled_estimates_are_covered_by_their_margins() {
        let (w, exact, events, trials) = (32u32, 1024u64, 60_000u64, 400);
        let mut draws = Draws(0x9e37_79b9_7f4a_7c15);
        let mut covered = [[0u32; 2]; 3];
        let mut truth = [[0u64; 2]; 3];
        for _ in 0..trials {
            let mut parts = [DetailStats::default(); 3];
            truth = [[0; 2]; 3];
            for n in 0..events {
                let r = draws.next();
                // Stacks in proportions 6:3:1, waits log-spread from 100 ns
                // to ~50 µs (the longest ones never sampled).
                let stack = match r % 10 {
                    0..=5 => 0,
                    6..=8 => 1,
                    _ => 2,
                };
                let wait = 100u64 << ((r >> 8) % 10);
                truth[stack][0] += 1;
                truth[stack][1] += wait;
                let weight = if n < exact || wait >= sampling::LONG_WAIT_NS {
                    1
                } else if (r >> 32).is_multiple_of(u64::from(w)) {
                    u64::from(w)
                } else {
                    continue;
                };
                let part = &mut parts[stack];
                part.contentions += weight;
                part.wait_ns += weight * wait;
                if weight > 1 {
                    part.sampled[sampling::RECORDS] += 1;
                    part.sampled[sampling::CONTENDED] += 1;
                    part.sampled[sampling::WAIT_SQUARES] += sampling::square(wait);
                }
            }
            for (stack, part) in parts.iter().enumerate() {
                let margin = CallerMargin::of(part, w, false).expect("sampled");
                let [count, wait] = truth[stack];
                covered[stack][0] += u32::from(part.contentions.abs_diff(count) <= margin.contentions);
                covered[stack][1] += u32::from(part.wait_ns.abs_diff(wait) <= margin.wait_total_ns);
            }
        }
        for (stack, [count, wait]) in covered.iter().enumerate() {
            for (what, hits) in [("count", count), ("wait", wait)] {
                let rate = f64::from(*hits) / f64::from(trials);
                assert!(
                    (0.91..=0.99).contains(&rate),
                    "stack {stack} {what}: the 95 % margin covered the truth in {rate:.3} of trials (truth {:?})",
                    truth[stack]
                );
            }
        }
    }

    #[test]
    fn margins_of_merged_rows_add_in_quadrature() {
        let m = |c| CallerMargin {
            contentions: c,
            ..Default::default()
        };
        assert_eq!(CallerMargin::plus(Some(m(3)), Some(m(4))), Some(m(5)));
        assert_eq!(CallerMargin::plus(None, Some(m(4))), Some(m(4)));
        assert_eq!(CallerMargin::plus(None, None), None);
    }

    #[test]
    fn tasks_are_grouped_by_class_and_thread() {
        let parts = [
            part(1, detail::TASK, 11, 2, 100),
            part(2, detail::TASK, 11, 3, 300),
            part(2, detail::CALLER, 11, 3, 300),
            part(1, detail::TASK, 12, 1, 1000),
        ];
        let names: TaskNames = [(11, (10, "writer".to_owned()))].into_iter().collect();
        let rows = tasks_of(
            parts.iter().map(|(k, v)| (Some(LockClass::PipeMutex), k, v)),
            &names,
            false,
        );
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].tid, rows[0].wait_total_ns), (12, 1000));
        assert_eq!(rows[0].label(), "tid 12");
        assert_eq!(
            (rows[1].contentions, rows[1].label()),
            (5, "writer(10/11)".to_owned())
        );
    }
}
