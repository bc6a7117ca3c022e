//! The report as CSV: one row per lock, times in ns, unmeasured values empty.
use serde::Serialize;

use crate::model::{ByKey, LockClass, TraceReport, class_label};

/// One CSV row; `None` is written as an empty field (not measured ≠ 0).
#[derive(Serialize)]
struct CsvRow<'a> {
    class: &'static str,
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
    wait_p90_ns: Option<u64>,
    wait_p99_ns: Option<u64>,
    wait_p999_ns: Option<u64>,
    wait_max_ns: Option<u64>,
    hold_total_ns: Option<u64>,
    hold_avg_ns: Option<u64>,
    hold_p50_ns: Option<u64>,
    hold_p90_ns: Option<u64>,
    hold_p99_ns: Option<u64>,
    hold_p999_ns: Option<u64>,
    hold_max_ns: Option<u64>,
    dropped: Option<u64>,
    holder_on_cpu_ns: Option<u64>,
    holder_runnable_ns: Option<u64>,
    holder_sleeping_ns: Option<u64>,
    top_owner: Option<String>,
    top_owner_wait_ns: Option<u64>,
    hold_on_cpu_ns: Option<u64>,
    hold_runnable_ns: Option<u64>,
    hold_sleeping_ns: Option<u64>,
    asked_twice: u64,
}

/// The CSV columns, in order (`--interval` files put `timestamp` first).
pub const CSV_COLUMNS: [&str; 33] = [
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
    "wait_p90_ns",
    "wait_p99_ns",
    "wait_p999_ns",
    "wait_max_ns",
    "hold_total_ns",
    "hold_avg_ns",
    "hold_p50_ns",
    "hold_p90_ns",
    "hold_p99_ns",
    "hold_p999_ns",
    "hold_max_ns",
    "dropped",
    "holder_on_cpu_ns",
    "holder_runnable_ns",
    "holder_sleeping_ns",
    "top_owner",
    "top_owner_wait_ns",
    "hold_on_cpu_ns",
    "hold_runnable_ns",
    "hold_sleeping_ns",
    "asked_twice",
];

/// The report as CSV: a header row, then one row per lock.
pub fn to_csv(report: &TraceReport) -> Result<Vec<u8>, csv::Error> {
    csv_block(report, None, true)
}

/// `--by caller` rows: the stack's frames joined by `;` (innermost first),
/// its first frame alone in `caller`.
#[derive(Serialize)]
struct CallerCsvRow<'a> {
    class: &'static str,
    caller: &'a str,
    stack: String,
    acquisitions: Option<u64>,
    contentions: u64,
    wait_total_ns: u64,
    wait_max_ns: u64,
    hold_total_ns: Option<u64>,
}

pub const CALLER_CSV_COLUMNS: [&str; 8] = [
    "class",
    "caller",
    "stack",
    "acquisitions",
    "contentions",
    "wait_total_ns",
    "wait_max_ns",
    "hold_total_ns",
];

/// `--by task` rows.
#[derive(Serialize)]
struct TaskCsvRow<'a> {
    class: &'static str,
    tid: u32,
    pid: Option<u32>,
    comm: Option<&'a str>,
    acquisitions: Option<u64>,
    contentions: u64,
    wait_total_ns: u64,
    wait_max_ns: u64,
    hold_total_ns: Option<u64>,
}

pub const TASK_CSV_COLUMNS: [&str; 9] = [
    "class",
    "tid",
    "pid",
    "comm",
    "acquisitions",
    "contentions",
    "wait_total_ns",
    "wait_max_ns",
    "hold_total_ns",
];

/// Rows of one report, of the kind `report.by` says; with `timestamp`,
/// each row starts with it (the `--interval` file format), with `header`,
/// a header row comes first.
pub fn csv_block(report: &TraceReport, timestamp: Option<&str>, header: bool) -> Result<Vec<u8>, csv::Error> {
    let mut writer = csv::WriterBuilder::new()
        .has_headers(false)
        .from_writer(Vec::new());
    if header {
        let columns: &[&str] = match report.by {
            ByKey::Lock => &CSV_COLUMNS,
            ByKey::Caller => &CALLER_CSV_COLUMNS,
            ByKey::Task => &TASK_CSV_COLUMNS,
        };
        writer.write_record(timestamp.map(|_| "timestamp").iter().chain(columns))?;
    }
    let stamp = |writer: &mut csv::Writer<Vec<u8>>| match timestamp {
        Some(timestamp) => writer.write_field(timestamp),
        None => Ok(()),
    };
    match report.by {
        ByKey::Lock => {}
        ByKey::Caller => {
            for row in &report.by_caller {
                stamp(&mut writer)?;
                writer.serialize(CallerCsvRow {
                    class: class_label(row.class),
                    caller: row.stack.first().map_or("", String::as_str),
                    stack: row.stack.join(";"),
                    acquisitions: row.acquisitions,
                    contentions: row.contentions,
                    wait_total_ns: row.wait_total_ns,
                    wait_max_ns: row.wait_max_ns,
                    hold_total_ns: row.hold_total_ns,
                })?;
            }
            return writer.into_inner().map_err(|e| csv::Error::from(e.into_error()));
        }
        ByKey::Task => {
            for row in &report.by_task {
                stamp(&mut writer)?;
                writer.serialize(TaskCsvRow {
                    class: class_label(row.class),
                    tid: row.tid,
                    pid: row.pid,
                    comm: row.comm.as_deref(),
                    acquisitions: row.acquisitions,
                    contentions: row.contentions,
                    wait_total_ns: row.wait_total_ns,
                    wait_max_ns: row.wait_max_ns,
                    hold_total_ns: row.hold_total_ns,
                })?;
            }
            return writer.into_inner().map_err(|e| csv::Error::from(e.into_error()));
        }
    }
    let asked_twice = |lock_addr: u64, name: &str| {
        report
            .asked_twice
            .iter()
            .filter(|asked| asked.lock_addr == lock_addr && asked.lock == name)
            .count() as u64
    };
    for row in &report.locks {
        let (w, h) = (row.wait.as_ref(), row.hold.as_ref());
        stamp(&mut writer)?;
        writer.serialize(CsvRow {
            class: class_label(row.class),
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
            wait_p90_ns: w.map(|t| t.p90_ns),
            wait_p99_ns: w.map(|t| t.p99_ns),
            wait_p999_ns: w.map(|t| t.p999_ns),
            wait_max_ns: w.map(|t| t.max_ns),
            hold_total_ns: h.map(|t| t.total_ns),
            hold_avg_ns: h.map(|t| t.avg_ns),
            hold_p50_ns: h.map(|t| t.p50_ns),
            hold_p90_ns: h.map(|t| t.p90_ns),
            hold_p99_ns: h.map(|t| t.p99_ns),
            hold_p999_ns: h.map(|t| t.p999_ns),
            hold_max_ns: h.map(|t| t.max_ns),
            dropped: row.dropped,
            holder_on_cpu_ns: row.holder.holder_on_cpu_ns,
            holder_runnable_ns: row.holder.holder_runnable_ns,
            holder_sleeping_ns: row.holder.holder_sleeping_ns,
            top_owner: row.owners.first().map(|o| o.label()),
            top_owner_wait_ns: row.owners.first().map(|o| o.wait_ns),
            hold_on_cpu_ns: row.holds.hold_on_cpu_ns,
            hold_runnable_ns: row.holds.hold_runnable_ns,
            hold_sleeping_ns: row.holds.hold_sleeping_ns,
            asked_twice: asked_twice(row.lock_addr, &row.name),
        })?;
    }
    // A mutex asked for by its owner is a wait that never ends: its lock
    // may have no row of figures, and still gets one, figures empty.
    let mut alone: Vec<(u64, &str, Option<LockClass>)> = report
        .asked_twice
        .iter()
        .filter(|asked| {
            !report
                .locks
                .iter()
                .any(|row| row.lock_addr == asked.lock_addr && row.name == asked.lock)
        })
        .map(|asked| (asked.lock_addr, asked.lock.as_str(), asked.class))
        .collect();
    alone.sort_unstable();
    alone.dedup();
    for (lock_addr, name, class) in alone {
        stamp(&mut writer)?;
        writer.serialize(CsvRow {
            class: class_label(class),
            lock_addr: format!("{lock_addr:#x}"),
            pipe_ino: pipe_ino(name),
            name,
            comms: String::new(),
            mode: &report.mode,
            acquisitions: None,
            contentions: 0,
            spin_only: 0,
            wait_total_ns: None,
            wait_avg_ns: None,
            wait_p50_ns: None,
            wait_p90_ns: None,
            wait_p99_ns: None,
            wait_p999_ns: None,
            wait_max_ns: None,
            hold_total_ns: None,
            hold_avg_ns: None,
            hold_p50_ns: None,
            hold_p90_ns: None,
            hold_p99_ns: None,
            hold_p999_ns: None,
            hold_max_ns: None,
            dropped: None,
            holder_on_cpu_ns: None,
            holder_runnable_ns: None,
            holder_sleeping_ns: None,
            top_owner: None,
            top_owner_wait_ns: None,
            hold_on_cpu_ns: None,
            hold_runnable_ns: None,
            hold_sleeping_ns: None,
            asked_twice: asked_twice(lock_addr, name),
        })?;
    }
    writer.into_inner().map_err(|e| csv::Error::from(e.into_error()))
}

/// The inode number in a pipe lock's name (`pipe:[4242]`).
fn pipe_ino(name: &str) -> Option<u64> {
    name.strip_prefix("pipe:[")?.strip_suffix(']')?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fixtures::sample;

    #[test]
    fn csv_golden_output() {
        let csv = String::from_utf8(to_csv(&sample()).unwrap()).unwrap();
        assert_eq!(
            csv,
            "class,lock_addr,pipe_ino,name,comms,mode,acquisitions,contentions,spin_only,wait_total_ns,\
             wait_avg_ns,wait_p50_ns,wait_p90_ns,wait_p99_ns,wait_p999_ns,wait_max_ns,hold_total_ns,\
             hold_avg_ns,hold_p50_ns,hold_p90_ns,hold_p99_ns,hold_p999_ns,hold_max_ns,dropped,holder_on_cpu_ns,holder_runnable_ns,holder_sleeping_ns,\
             top_owner,top_owner_wait_ns,hold_on_cpu_ns,hold_runnable_ns,hold_sleeping_ns,asked_twice\n\
             pipe-mutex,0xffff888001234000,4242,pipe:[4242],herd(10) herd(11),tracepoint (tp_btf),,3,1,\
             4300,1433,200,3968,3968,3968,4000,,,,,,,,2,,,,,,,,,0\n"
        );
    }

    #[test]
    fn a_mutex_asked_for_twice_is_counted_on_its_row_or_gets_one() {
        use crate::model::{AskedTwice, LockClass};
        let mut report = sample();
        let asked = |lock_addr: u64, lock: &str| AskedTwice {
            pid: 7,
            tid: 8,
            comm: "paths".into(),
            lock_addr,
            lock: lock.into(),
            class: Some(LockClass::PipeMutex),
            syscall: Some("fcntl".into()),
            stack: vec!["pipe_set_size+0x40".into()],
        };
        let row = &report.locks[0];
        let (known, name) = (row.lock_addr, row.name.clone());
        report.asked_twice = vec![asked(known, &name), asked(0xffff888009990000, "pipe:[77]")];
        let csv = String::from_utf8(to_csv(&report).unwrap()).unwrap();
        let mut reader = csv::Reader::from_reader(csv.as_bytes());
        let rows: Vec<std::collections::HashMap<String, String>> =
            reader.deserialize().collect::<Result<_, _>>().unwrap();
        assert_eq!(rows.len(), 2, "{csv}");
        assert_eq!(rows[0]["asked_twice"], "1");
        assert_eq!(rows[0]["contentions"], "3");
        let alone = &rows[1];
        assert_eq!(
            (
                &*alone["name"],
                &*alone["pipe_ino"],
                &*alone["lock_addr"],
                &*alone["asked_twice"]
            ),
            ("pipe:[77]", "77", "0xffff888009990000", "1")
        );
        assert_eq!((&*alone["class"], &*alone["wait_max_ns"]), ("pipe-mutex", ""));
    }

    #[test]
    fn caller_and_task_rows_read_back_under_their_own_header() {
        use crate::model::{CallerRow, TaskRow};
        let mut report = sample();
        report.by = ByKey::Caller;
        report.by_caller = vec![CallerRow {
            class: report.locks[0].class,
            stack: vec!["anon_pipe_write+0x50".into(), "vfs_write+0x2a4".into()],
            acquisitions: Some(4),
            contentions: 2,
            wait_total_ns: 900,
            wait_max_ns: 600,
            hold_total_ns: Some(70),
            margin: None,
        }];
        let csv = to_csv(&report).unwrap();
        let mut reader = csv::Reader::from_reader(csv.as_slice());
        assert_eq!(reader.headers().unwrap(), CALLER_CSV_COLUMNS.as_slice());
        let row = reader.records().next().unwrap().unwrap();
        assert_eq!(&row[1], "anon_pipe_write+0x50");
        assert_eq!(&row[2], "anon_pipe_write+0x50;vfs_write+0x2a4");
        assert_eq!(&row[5], "900");
        report.by = ByKey::Task;
        report.by_task = vec![TaskRow {
            class: report.locks[0].class,
            tid: 11,
            pid: Some(10),
            comm: Some("writer".into()),
            acquisitions: None,
            contentions: 2,
            wait_total_ns: 900,
            wait_max_ns: 600,
            hold_total_ns: None,
        }];
        let csv = csv_block(&report, Some("2026-12-01T00:00:00.000Z"), true).unwrap();
        let mut reader = csv::Reader::from_reader(csv.as_slice());
        assert_eq!(reader.headers().unwrap().len(), TASK_CSV_COLUMNS.len() + 1);
        let row = reader.records().next().unwrap().unwrap();
        assert_eq!(
            (&row[1], &row[2], &row[4], &row[5]),
            ("pipe-mutex", "11", "writer", "")
        );
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
}
