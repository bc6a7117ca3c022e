//! The report as CSV: one row per lock, times in ns, unmeasured values empty.
use serde::Serialize;

use crate::model::{TraceReport, class_label};

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
    wait_p99_ns: Option<u64>,
    wait_max_ns: Option<u64>,
    hold_total_ns: Option<u64>,
    hold_avg_ns: Option<u64>,
    hold_p50_ns: Option<u64>,
    hold_p99_ns: Option<u64>,
    hold_max_ns: Option<u64>,
    dropped: Option<u64>,
    holder_on_cpu_ns: Option<u64>,
    holder_runnable_ns: Option<u64>,
    holder_sleeping_ns: Option<u64>,
    top_owner: Option<String>,
    top_owner_wait_ns: Option<u64>,
}

/// The CSV columns, in order (`--interval` files put `timestamp` first).
pub const CSV_COLUMNS: [&str; 25] = [
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
    "holder_on_cpu_ns",
    "holder_runnable_ns",
    "holder_sleeping_ns",
    "top_owner",
    "top_owner_wait_ns",
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
            wait_p99_ns: w.map(|t| t.p99_ns),
            wait_max_ns: w.map(|t| t.max_ns),
            hold_total_ns: h.map(|t| t.total_ns),
            hold_avg_ns: h.map(|t| t.avg_ns),
            hold_p50_ns: h.map(|t| t.p50_ns),
            hold_p99_ns: h.map(|t| t.p99_ns),
            hold_max_ns: h.map(|t| t.max_ns),
            dropped: row.dropped,
            holder_on_cpu_ns: row.holder.holder_on_cpu_ns,
            holder_runnable_ns: row.holder.holder_runnable_ns,
            holder_sleeping_ns: row.holder.holder_sleeping_ns,
            top_owner: row.owners.first().map(|o| o.label()),
            top_owner_wait_ns: row.owners.first().map(|o| o.wait_ns),
        })?;
    }
    writer.into_inner().map_err(|e| csv::Error::from(e.into_error()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::report::tests::sample;

    #[test]
    fn csv_golden_output() {
        let csv = String::from_utf8(to_csv(&sample()).unwrap()).unwrap();
        assert_eq!(
            csv,
            "class,lock_addr,pipe_ino,name,comms,mode,acquisitions,contentions,spin_only,wait_total_ns,\
             wait_avg_ns,wait_p50_ns,wait_p99_ns,wait_max_ns,hold_total_ns,hold_avg_ns,hold_p50_ns,\
             hold_p99_ns,hold_max_ns,dropped,holder_on_cpu_ns,holder_runnable_ns,holder_sleeping_ns,\
             top_owner,top_owner_wait_ns\n\
             pipe-mutex,0xffff888001234000,4242,pipe:[4242],herd(10) herd(11),tracepoint (tp_btf),,3,1,\
             4300,1433,255,4000,4000,,,,,,2,,,,,\n"
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
