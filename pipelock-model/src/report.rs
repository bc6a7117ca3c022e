//! What a trace reports: one row per lock, per-class totals, and what the
//! tracer itself cost. Plain values (serde for JSON in and out), no I/O.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::format::FormatVersion;

use super::{
    callers::{ByKey, CallerRow, TaskRow},
    class::LockClass,
    owners::{HoldState, HolderState, OwnerRow},
    timing::{PERCENTILE_RESOLUTION, Timing},
};

/// One traced lock.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LockRow {
    /// None when the lock's identity could not be recorded (its map was full).
    pub class: Option<LockClass>,
    pub lock_addr: u64,
    /// Tells apart lock instances that had the same address: the pipe's
    /// inode number (pipe rows, and other locks per pipe), a dentry's name hash.
    pub owner: u64,
    pub pipe_ino: Option<u64>,
    /// `pipe:[ino]`, or for another lock the pipe call it was contended in.
    pub name: String,
    /// `comm(pid)` of each process seen contending it.
    pub comms: Vec<String>,
    /// Attach mode that measured it.
    pub mode: String,
    /// All acquisitions: None in tracepoint mode (only contended ones are seen).
    pub acquisitions: Option<u64>,
    pub contentions: u64,
    /// Contended acquisitions that only spun (never slept).
    pub spin_only: u64,
    /// Events on this lock that were seen but could not be timed (fentry and
    /// kprobe mode; None in tracepoint mode, which sees no release).
    pub dropped: Option<u64>,
    pub wait: Option<Timing>,
    /// None where hold time is not measured (tracepoint mode).
    pub hold: Option<Timing>,
    /// Pipe mutex: every owner its waiters found, most wait caused first.
    #[serde(default)]
    pub owners: Vec<OwnerRow>,
    /// What those owners were doing while waited for (None: not measured).
    #[serde(flatten)]
    pub holder: HolderState,
    /// `--hold-states`: what the holders did while they held it.
    #[serde(flatten)]
    pub holds: HoldState,
    /// `--callers`: the call stacks its acquisitions came from, most wait first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub callers: Vec<CallerRow>,
}

/// Per-class totals.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClassTotal {
    pub class: Option<LockClass>,
    pub locks: usize,
    pub contentions: u64,
    pub wait_total_ns: u64,
    pub wait_max_ns: u64,
}

/// Everything a trace produced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceReport {
    pub format: FormatVersion,
    pub kernel: String,
    /// The attach mode, e.g. "tracepoint (tp_btf)".
    pub mode: String,
    /// The better modes `auto` tried first, and why each was refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<Refusal>,
    pub hold_unavailable_reason: Option<String>,
    pub duration_s: f64,
    pub locks: Vec<LockRow>,
    pub totals: Vec<ClassTotal>,
    /// Events not recorded, by reason (never silently lost).
    pub drops: BTreeMap<String, u64>,
    pub percentile_resolution: String,
    /// What this mode or kernel could not measure, class by class.
    pub notes: Vec<String>,
    /// pipelock's own programs: runs, run time, recursion misses.
    pub programs: Vec<ProgramStats>,
    /// pipelock's maps: entries used, capacity, kernel memory.
    pub maps: Vec<MapFill>,
    /// CPU time pipelock's own process used since attaching (the collector;
    /// not the traced load's, not the one-off loading).
    pub tracer_cpu_s: Option<f64>,
    /// The collector's running total against its bound, and pipelock's own
    /// memory (live traces only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collector: Option<CollectorFill>,
    /// Threads that asked for a mutex they already own, since attach: each
    /// a deadlock in progress.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub asked_twice: Vec<AskedTwice>,
    /// What the text and CSV rows are (`--by`); `locks` is always there.
    #[serde(default)]
    pub by: ByKey,
    /// Call stacks across locks, by class (with `--callers`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_caller: Vec<CallerRow>,
    /// Threads, by class (`--by task`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_task: Vec<TaskRow>,
}

impl TraceReport {
    /// A report without locks (the header of an interval CSV is made from it).
    pub fn empty() -> Self {
        Self {
            format: FormatVersion,
            kernel: String::new(),
            mode: String::new(),
            refused: Vec::new(),
            hold_unavailable_reason: None,
            duration_s: 0.0,
            locks: Vec::new(),
            totals: Vec::new(),
            drops: BTreeMap::new(),
            percentile_resolution: PERCENTILE_RESOLUTION.to_owned(),
            notes: Vec::new(),
            programs: Vec::new(),
            maps: Vec::new(),
            tracer_cpu_s: None,
            collector: None,
            asked_twice: Vec::new(),
            by: ByKey::Lock,
            by_caller: Vec::new(),
            by_task: Vec::new(),
        }
    }

    pub fn totals(locks: &[LockRow]) -> Vec<ClassTotal> {
        let mut totals: BTreeMap<Option<LockClass>, ClassTotal> = BTreeMap::new();
        for row in locks {
            let t = totals.entry(row.class).or_insert(ClassTotal {
                class: row.class,
                locks: 0,
                contentions: 0,
                wait_total_ns: 0,
                wait_max_ns: 0,
            });
            t.locks += 1;
            t.contentions += row.contentions;
            if let Some(w) = &row.wait {
                t.wait_total_ns += w.total_ns;
                t.wait_max_ns = t.wait_max_ns.max(w.max_ns);
            }
        }
        totals.into_values().collect()
    }
}

/// An attach mode the kernel refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// `fentry` or `kprobe`.
    pub mode: String,
    /// A few words: the errno, or what the kernel lacks (`EPERM`).
    pub reason: String,
    /// The whole error, every cause on one line.
    pub detail: String,
}

/// A thread that asked for a mutex it already owns. It sleeps on it for
/// good (uninterruptibly, for `mutex_lock`), and so does every task that
/// needs that mutex after it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AskedTwice {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub lock_addr: u64,
    /// `pipe:[ino]` where the thread's syscall names the pipe whose mutex
    /// it is, else the kernel symbol the address falls in, else the address.
    pub lock: String,
    /// Set when the lock is a pipe's mutex.
    pub class: Option<LockClass>,
    /// The system call the thread is in (its name where pipelock knows it).
    pub syscall: Option<String>,
    /// Where it asked again, callers only (the locking frames left out),
    /// innermost first; empty when the stack was lost.
    pub stack: Vec<String>,
}

impl AskedTwice {
    /// `comm(pid/tid)`, or `comm(tid)` for a process's main thread.
    pub fn task(&self) -> String {
        if self.pid == self.tid {
            format!("{}({})", self.comm, self.tid)
        } else {
            format!("{}({}/{})", self.comm, self.pid, self.tid)
        }
    }

    /// One line that says it all, for stderr the moment it is seen.
    pub fn line(&self) -> String {
        let mut line = format!(
            "deadlock: {} asked for the mutex of {} ({:#x}) that it already holds",
            self.task(),
            self.lock,
            self.lock_addr
        );
        if let Some(syscall) = &self.syscall {
            line.push_str(&format!(", in {syscall}()"));
        }
        if !self.stack.is_empty() {
            line.push_str(&format!(", at {}", self.stack.join(" <- ")));
        }
        line
    }
}

/// Locks a running total keeps one by one by default (`--track-locks`): a
/// trace of a churning system for hours then needs the memory of this many
/// locks, not of every lock it ever saw.
pub const DEFAULT_TRACKED_LOCKS: usize = 8192;

/// What pipelock keeps in userspace: the locks its running total holds one
/// by one against `--track-locks`, and its resident memory. Past the bound
/// the longest idle locks are folded into per-class rows, so a trace of a
/// churning system needs the same memory after an hour as after a minute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectorFill {
    pub tracked: usize,
    pub max_tracked: usize,
    /// Locks folded into per-class rows so far.
    pub retired: u64,
    /// `VmRSS` of pipelock's process at this drain.
    pub resident_bytes: Option<u64>,
}

/// Entries in one of pipelock's maps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapFill {
    pub name: String,
    /// None for the per-thread LRU maps (full, they evict the oldest thread).
    pub used: Option<usize>,
    pub capacity: u32,
    /// The kernel's accounting of the map's memory (`memlock` in fdinfo).
    pub memlock_bytes: Option<u64>,
}

/// One loaded program's kernel-side counters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgramStats {
    pub name: String,
    pub run_count: u64,
    pub run_time_ns: u64,
    pub recursion_misses: u64,
}

impl ProgramStats {
    /// Run time per run (NaN: no runs).
    pub fn ns_per_run(&self) -> f64 {
        self.run_time_ns as f64 / self.run_count as f64
    }
}

/// One collector tick: the interval just ended and everything since attach.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    pub interval: TraceReport,
    pub total: TraceReport,
    pub fill: Vec<MapFill>,
}

/// `--sort`: which figure orders the rows, largest first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortKey {
    Acquisitions,
    Contentions,
    #[default]
    WaitTotal,
    WaitMax,
    HoldTotal,
    HoldMax,
}

impl SortKey {
    /// The row's figure for this key (unmeasured counts as 0).
    pub fn value(self, row: &LockRow) -> u64 {
        let (w, h) = (row.wait.as_ref(), row.hold.as_ref());
        match self {
            Self::Acquisitions => row.acquisitions.unwrap_or(0),
            Self::Contentions => row.contentions,
            Self::WaitTotal => w.map_or(0, |t| t.total_ns),
            Self::WaitMax => w.map_or(0, |t| t.max_ns),
            Self::HoldTotal => h.map_or(0, |t| t.total_ns),
            Self::HoldMax => h.map_or(0, |t| t.max_ns),
        }
    }
}

/// Largest first; ties by address, so the order is stable between runs.
pub fn sort_rows(rows: &mut [LockRow], key: SortKey) {
    rows.sort_by(|a, b| {
        key.value(b)
            .cmp(&key.value(a))
            .then((a.lock_addr, a.owner).cmp(&(b.lock_addr, b.owner)))
    });
}

impl SortKey {
    /// The names `--sort` accepts, in the order of [`Self::ALL`].
    pub const NAMES: [&'static str; 6] = [
        "acquisitions",
        "contentions",
        "wait-total",
        "wait-max",
        "hold-total",
        "hold-max",
    ];
    pub const ALL: [Self; 6] = [
        Self::Acquisitions,
        Self::Contentions,
        Self::WaitTotal,
        Self::WaitMax,
        Self::HoldTotal,
        Self::HoldMax,
    ];
}

impl std::str::FromStr for SortKey {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        Self::NAMES
            .iter()
            .position(|n| *n == text)
            .map(|i| Self::ALL[i])
            .ok_or_else(|| format!("unknown sort key `{text}` (one of: {})", Self::NAMES.join(", ")))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::fixtures::{hist, sample};

    #[test]
    fn rows_sort_by_any_key_largest_first() {
        let mut a = sample().locks.remove(0);
        let mut b = a.clone();
        a.lock_addr = 1;
        b.lock_addr = 2;
        b.contentions = 100;
        a.wait = Timing::from_hist(&hist(&[1_000_000]));
        let mut rows = vec![a, b];
        sort_rows(&mut rows, SortKey::Contentions);
        assert_eq!(rows[0].lock_addr, 2);
        sort_rows(&mut rows, SortKey::WaitMax);
        assert_eq!(rows[0].lock_addr, 1);
        sort_rows(&mut rows, SortKey::HoldMax);
        assert_eq!(
            rows[0].lock_addr, 1,
            "equal (unmeasured) values fall back to address order"
        );
    }

    #[test]
    fn json_carries_buckets() {
        let json = serde_json::to_value(sample()).unwrap();
        assert_eq!(
            json["locks"][0]["wait"]["buckets"],
            // 100, 200 and 4000 ns: the log-linear buckets' lower bounds.
            serde_json::json!([[96, 1], [192, 1], [3840, 1]])
        );
        assert!(json["locks"][0]["hold"].is_null());
        assert_eq!(json["totals"][0]["contentions"], 3);
    }

    #[test]
    fn reports_read_back_from_their_json() {
        let report = sample();
        let json = serde_json::to_vec(&report).unwrap();
        let back: TraceReport = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, report);
        assert_eq!("hold-max".parse::<SortKey>(), Ok(SortKey::HoldMax));
        assert!("longest".parse::<SortKey>().unwrap_err().contains("wait-total"));
    }
}
