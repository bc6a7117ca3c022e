//! The stats model of `pipelock trace`: per-lock rows merged from the maps,
//! percentiles from log2 histograms, and the report as text, CSV and JSON.
//! Pure functions of the rows, so they are unit-tested with fixed inputs.
use std::collections::BTreeMap;

use pipelock_common::{Histogram, LockStats, class};
use serde::Serialize;

/// Percentiles come from log2 buckets: a reported p50/p99 is the upper edge
/// of the bucket holding that rank (clamped to the maximum), so it is at most
/// 2× the true value and never below it.
pub const PERCENTILE_RESOLUTION: &str = "log2 buckets: p50/p99 are bucket upper bounds (≤ 2× the true value)";

pub fn class_name(class: u32) -> &'static str {
    match class {
        class::PIPE_MUTEX => "pipe-mutex",
        class::PIPE_RD_WAIT => "pipe-rd-wait",
        class::PIPE_WR_WAIT => "pipe-wr-wait",
        class::OTHER_IN_PIPE_CALL => "other-in-pipe-call",
        class::LOCKREF => "lockref",
        _ => "unknown",
    }
}

/// Sums per-CPU histograms (max is the max of maxima).
pub fn merge(into: &mut Histogram, from: &Histogram) {
    into.count += from.count;
    into.total_ns += from.total_ns;
    into.max_ns = into.max_ns.max(from.max_ns);
    for (a, b) in into.buckets.iter_mut().zip(from.buckets.iter()) {
        *a += b;
    }
}

/// Adds one CPU's (or one interval's) statistics of a lock to another's.
pub fn merge_stats(into: &mut LockStats, from: &LockStats) {
    into.acquisitions += from.acquisitions;
    into.contentions += from.contentions;
    into.spin_only += from.spin_only;
    into.dropped += from.dropped;
    merge(&mut into.wait, &from.wait);
    merge(&mut into.hold, &from.hold);
}

/// `--sort`: which figure orders the rows, largest first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
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
            .then(a.lock_addr.cmp(&b.lock_addr))
    });
}

/// The value at quantile `q` (0..=1): upper bound of its bucket, clamped to max.
pub fn percentile(hist: &Histogram, q: f64) -> Option<u64> {
    if hist.count == 0 {
        return None;
    }
    let rank = ((q * hist.count as f64).ceil() as u64).clamp(1, hist.count);
    let mut seen = 0;
    for (bucket, &n) in hist.buckets.iter().enumerate() {
        seen += n;
        if seen >= rank {
            // Bucket 0 holds 0; bucket i holds [2^(i-1), 2^i).
            let upper = if bucket == 0 {
                0
            } else if bucket >= 64 {
                u64::MAX
            } else {
                (1u64 << bucket) - 1
            };
            return Some(upper.min(hist.max_ns));
        }
    }
    Some(hist.max_ns)
}

/// Timings of one kind (wait or hold) of one lock, as reported.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Timing {
    pub count: u64,
    pub total_ns: u64,
    pub avg_ns: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    /// Non-empty log2 buckets as (lower bound ns, count).
    pub buckets: Vec<(u64, u64)>,
}

impl Timing {
    pub fn from_hist(hist: &Histogram) -> Option<Self> {
        (hist.count > 0).then(|| Self {
            count: hist.count,
            total_ns: hist.total_ns,
            avg_ns: hist.total_ns / hist.count,
            p50_ns: percentile(hist, 0.50).unwrap_or(0),
            p99_ns: percentile(hist, 0.99).unwrap_or(0),
            max_ns: hist.max_ns,
            buckets: hist
                .buckets
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(i, n)| (if i == 0 { 0 } else { 1u64 << (i - 1) }, *n))
                .collect(),
        })
    }
}

/// One traced lock.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LockRow {
    pub class: &'static str,
    pub lock_addr: u64,
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
}

/// Per-class totals.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClassTotal {
    pub class: &'static str,
    pub locks: usize,
    pub contentions: u64,
    pub wait_total_ns: u64,
    pub wait_max_ns: u64,
}

/// Everything a trace produced.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceReport {
    pub kernel: String,
    /// Mode per class, e.g. "tracepoint (tp_btf)".
    pub mode: String,
    pub hold_unavailable_reason: Option<String>,
    pub duration_s: f64,
    pub locks: Vec<LockRow>,
    pub totals: Vec<ClassTotal>,
    /// Events not recorded, by reason (never silently lost).
    pub drops: BTreeMap<String, u64>,
    pub percentile_resolution: &'static str,
    /// What this mode or kernel could not measure, class by class.
    pub notes: Vec<String>,
    /// pipelock's own programs: runs, run time, recursion misses.
    pub programs: Vec<crate::progstats::ProgramStats>,
    /// pipelock's maps: entries used, capacity, kernel memory.
    pub maps: Vec<crate::trace::MapFill>,
    /// CPU time pipelock's own process used since attaching (the collector;
    /// not the traced load's, not the one-off loading).
    pub tracer_cpu_s: Option<f64>,
}

impl TraceReport {
    /// A report without locks (the header of an interval CSV is made from it).
    pub fn empty() -> Self {
        Self {
            kernel: String::new(),
            mode: String::new(),
            hold_unavailable_reason: None,
            duration_s: 0.0,
            locks: Vec::new(),
            totals: Vec::new(),
            drops: BTreeMap::new(),
            percentile_resolution: PERCENTILE_RESOLUTION,
            notes: Vec::new(),
            programs: Vec::new(),
            maps: Vec::new(),
            tracer_cpu_s: None,
        }
    }

    pub fn totals(locks: &[LockRow]) -> Vec<ClassTotal> {
        let mut totals: BTreeMap<&'static str, ClassTotal> = BTreeMap::new();
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

/// `1.23 ms`-style durations, as perf lock contention prints them.
pub fn human_ns(ns: u64) -> String {
    let ns_f = ns as f64;
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.2} us", ns_f / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2} ms", ns_f / 1e6)
    } else {
        format!("{:.2} s", ns_f / 1e9)
    }
}

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
    out.push('\n');
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
                row.class.to_owned(),
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
    }
    out.push_str("\nper class:\n");
    for t in &report.totals {
        out.push_str(&format!(
            "  {:<20} {:>4} lock(s)  {:>10} contended  wait total {}  max {}\n",
            t.class,
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

fn abbreviate(items: &[String], keep: usize) -> String {
    if items.len() <= keep {
        items.join(" ")
    } else {
        format!("{} (+{} more)", items[..keep].join(" "), items.len() - keep)
    }
}

/// One CSV row; `None` is written as an empty field (not measured ≠ 0).
#[derive(Serialize)]
struct CsvRow<'a> {
    class: &'a str,
    lock_addr: String,
    pipe_ino: Option<u64>,
    name: &'a str,
    comms: String,
    mode: &'a str,
    acquisitions: Option<u64>,
    contentions: u64,
    spin_only: u64,
    wait_total_ns: Option<u64>,
    wait_avg_ns: Option<u64>,
    wait_p50_ns: Option<u64>,
    wait_p99_ns: Option<u64>,
    wait_max_ns: Option<u64>,
    hold_total_ns: Option<u64>,
    hold_avg_ns: Option<u64>,
    hold_p50_ns: Option<u64>,
    hold_p99_ns: Option<u64>,
    hold_max_ns: Option<u64>,
    dropped: Option<u64>,
}

/// The CSV columns, in order (`--interval` files put `timestamp` first).
pub const CSV_COLUMNS: [&str; 20] = [
    "class",
    "lock_addr",
    "pipe_ino",
    "name",
    "comms",
    "mode",
    "acquisitions",
    "contentions",
    "spin_only",
    "wait_total_ns",
    "wait_avg_ns",
    "wait_p50_ns",
    "wait_p99_ns",
    "wait_max_ns",
    "hold_total_ns",
    "hold_avg_ns",
    "hold_p50_ns",
    "hold_p99_ns",
    "hold_max_ns",
    "dropped",
];

/// The report as CSV: a header row, then one row per lock.
pub fn to_csv(report: &TraceReport) -> Result<Vec<u8>, csv::Error> {
    csv_block(report, None, true)
}

/// Rows of one report; with `timestamp`, each row starts with it (the
/// `--interval` file format), with `header`, a header row comes first.
pub fn csv_block(report: &TraceReport, timestamp: Option<&str>, header: bool) -> Result<Vec<u8>, csv::Error> {
    let mut writer = csv::WriterBuilder::new()
        .has_headers(false)
        .from_writer(Vec::new());
    if header {
        let columns = timestamp.map(|_| "timestamp").into_iter().chain(CSV_COLUMNS);
        writer.write_record(columns)?;
    }
    for row in &report.locks {
        let (w, h) = (row.wait.as_ref(), row.hold.as_ref());
        if let Some(timestamp) = timestamp {
            writer.write_field(timestamp)?;
        }
        writer.serialize(CsvRow {
            class: row.class,
            lock_addr: format!("{:#x}", row.lock_addr),
            pipe_ino: row.pipe_ino,
            name: &row.name,
            comms: row.comms.join(" "),
            mode: &row.mode,
            acquisitions: row.acquisitions,
            contentions: row.contentions,
            spin_only: row.spin_only,
            wait_total_ns: w.map(|t| t.total_ns),
            wait_avg_ns: w.map(|t| t.avg_ns),
            wait_p50_ns: w.map(|t| t.p50_ns),
            wait_p99_ns: w.map(|t| t.p99_ns),
            wait_max_ns: w.map(|t| t.max_ns),
            hold_total_ns: h.map(|t| t.total_ns),
            hold_avg_ns: h.map(|t| t.avg_ns),
            hold_p50_ns: h.map(|t| t.p50_ns),
            hold_p99_ns: h.map(|t| t.p99_ns),
            hold_max_ns: h.map(|t| t.max_ns),
            dropped: row.dropped,
        })?;
    }
    writer.into_inner().map_err(|e| csv::Error::from(e.into_error()))
}

/// `--hist`: the wait and hold histograms of the first `top` rows.
pub fn render_histograms(report: &TraceReport, top: usize) -> String {
    let mut out = String::new();
    for row in report.locks.iter().take(top) {
        for (kind, timing) in [("wait", &row.wait), ("hold", &row.hold)] {
            if let Some(timing) = timing {
                out.push_str(&format!(
                    "\n{} {} {kind} ({} samples)\n",
                    row.class, row.name, timing.count
                ));
                out.push_str(&render_histogram(timing));
            }
        }
    }
    out
}

/// bcc-style log2 histogram of one timing, e.g. for `--hist`:
/// `     512 -> 1023     : 5        |****      |`.
pub fn render_histogram(timing: &Timing) -> String {
    render_histogram_width(timing, 40)
}

/// [`render_histogram`] with bars at most `bar_width` stars wide.
pub fn render_histogram_width(timing: &Timing, bar_width: usize) -> String {
    let width = bar_width.max(1) as u64;
    let peak = timing.buckets.iter().map(|(_, n)| *n).max().unwrap_or(0).max(1);
    let mut out = format!("{:>20}     : {:<8} distribution\n", "ns", "count");
    for &(low, n) in &timing.buckets {
        let high = if low == 0 { 0 } else { low.saturating_mul(2) - 1 };
        let stars = (n * width).div_ceil(peak) as usize;
        out.push_str(&format!(
            "{:>10} -> {:<10}: {:<8} |{:<width$}|\n",
            low,
            high,
            n,
            "*".repeat(stars),
            width = width as usize
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(values: &[u64]) -> Histogram {
        let mut h = Histogram::EMPTY;
        values.iter().for_each(|v| h.record(*v));
        h
    }

    #[test]
    fn percentiles_are_bucket_upper_bounds_clamped_to_max() {
        // 100 values: 1..=100 ns.
        let values: Vec<u64> = (1..=100).collect();
        let h = hist(&values);
        // p50 = 50 lies in [32, 64) → upper bound 63.
        assert_eq!(percentile(&h, 0.5), Some(63));
        // p99 = 99 lies in [64, 128) → 127, clamped to max 100.
        assert_eq!(percentile(&h, 0.99), Some(100));
        assert_eq!(percentile(&hist(&[0, 0, 5]), 0.5), Some(0));
        assert_eq!(percentile(&Histogram::EMPTY, 0.5), None);
        // Never below the true value, at most 2x above it.
        for v in [1u64, 3, 1000, 123_456, 9_999_999] {
            let p = percentile(&hist(&[v]), 0.5).unwrap();
            assert!(p >= v && p < 2 * v.max(1) + 1, "{v} → {p}");
        }
    }

    #[test]
    fn per_cpu_histograms_merge() {
        let (a, b) = (hist(&[10, 20]), hist(&[5, 1000]));
        let mut m = Histogram::EMPTY;
        merge(&mut m, &a);
        merge(&mut m, &b);
        assert_eq!(m, hist(&[10, 20, 5, 1000]));
    }

    fn sample() -> TraceReport {
        let rows = vec![LockRow {
            class: "pipe-mutex",
            lock_addr: 0xffff_8880_0123_4000,
            pipe_ino: Some(4242),
            name: "pipe:[4242]".into(),
            comms: vec!["herd(10)".into(), "herd(11)".into()],
            mode: "tracepoint (tp_btf)".into(),
            acquisitions: None,
            contentions: 3,
            spin_only: 1,
            dropped: Some(2),
            wait: Timing::from_hist(&hist(&[100, 200, 4000])),
            hold: None,
        }];
        TraceReport {
            kernel: "6.18.44".into(),
            mode: "tracepoint (tp_btf)".into(),
            hold_unavailable_reason: Some("needs fentry or kprobe".into()),
            duration_s: 1.0,
            totals: TraceReport::totals(&rows),
            locks: rows,
            drops: BTreeMap::from([("nested".to_owned(), 0)]),
            percentile_resolution: PERCENTILE_RESOLUTION,
            notes: vec!["lockref: n/a in tracepoint mode".into()],
            programs: Vec::new(),
            maps: Vec::new(),
            tracer_cpu_s: None,
        }
    }

    #[test]
    fn csv_golden_output() {
        let csv = String::from_utf8(to_csv(&sample()).unwrap()).unwrap();
        assert_eq!(
            csv,
            "class,lock_addr,pipe_ino,name,comms,mode,acquisitions,contentions,spin_only,wait_total_ns,\
             wait_avg_ns,wait_p50_ns,wait_p99_ns,wait_max_ns,hold_total_ns,hold_avg_ns,hold_p50_ns,\
             hold_p99_ns,hold_max_ns,dropped\n\
             pipe-mutex,0xffff888001234000,4242,pipe:[4242],herd(10) herd(11),tracepoint (tp_btf),,3,1,\
             4300,1433,255,4000,4000,,,,,,2\n"
        );
    }

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
    fn interval_csv_blocks_share_one_header_and_read_back_as_a_table() {
        let (report, mut empty) = (sample(), sample());
        empty.locks.clear();
        let mut file = csv_block(&report, Some("2026-11-30T12:00:01.000Z"), true).unwrap();
        file.extend(csv_block(&empty, Some("2026-11-30T12:00:02.000Z"), false).unwrap());
        file.extend(csv_block(&report, Some("2026-11-30T12:00:03.000Z"), false).unwrap());
        let mut reader = csv::Reader::from_reader(file.as_slice());
        let headers = reader.headers().unwrap().clone();
        assert_eq!(headers.len(), CSV_COLUMNS.len() + 1);
        assert_eq!(&headers[0], "timestamp");
        let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.unwrap()).collect();
        assert_eq!(
            rows.len(),
            2,
            "one row per lock per interval, none for an empty one"
        );
        assert_eq!(&rows[1][0], "2026-11-30T12:00:03.000Z");
        assert_eq!(&rows[1][1], "pipe-mutex");
        assert!(rows.iter().all(|r| r.len() == headers.len()));
        // Without a timestamp, the plain format (one header, no timestamp).
        let plain = String::from_utf8(to_csv(&empty).unwrap()).unwrap();
        assert_eq!(plain.trim_end(), CSV_COLUMNS.join(","));
    }

    #[test]
    fn histogram_bars_scale_to_the_fullest_bucket() {
        let timing = Timing::from_hist(&hist(&[0, 600, 700, 800, 900, 5000])).unwrap();
        let text = render_histogram(&timing);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[1].starts_with("         0 -> 0"), "{text}");
        assert!(lines[2].contains("512 -> 1023"), "{text}");
        assert!(lines[2].contains(&format!("|{}|", "*".repeat(40))), "{text}");
        assert!(lines[3].contains("4096 -> 8191"), "{text}");
        assert!(lines[3].contains(&format!("|{:<40}|", "*".repeat(10))), "{text}");
    }

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
            serde_json::json!([[64, 1], [128, 1], [2048, 1]])
        );
        assert!(json["locks"][0]["hold"].is_null());
        assert_eq!(json["totals"][0]["contentions"], 3);
    }
}
