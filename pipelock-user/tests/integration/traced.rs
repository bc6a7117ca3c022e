//! Running `pipelock trace` and reading its report back as pipelock's own
//! types: a field renamed or gone from the JSON fails to parse, or is a
//! `None` that the check asking for it fails on; it never reads as 0.
use pipelock_user::model::{LockClass, LockRow, Timing, TraceReport};

use super::*;

/// A report read back from pipelock's JSON.
pub(crate) fn parse_report(json: &str) -> Result<TraceReport> {
    serde_json::from_str(json).context("the JSON is not a pipelock trace report")
}

/// A value as JSON, for a failure message.
pub(crate) fn shown<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| format!("(cannot show it: {e})"))
}

/// `pipelock trace TRACE_ARGS --json JSON --`, its command to follow.
pub(crate) fn trace_into(json: &Path, trace_args: &[&str]) -> Command {
    let mut command = pipelock();
    command
        .arg("trace")
        .args(trace_args)
        .arg("--json")
        .arg(json)
        .arg("--");
    command
}

/// `pipelock trace --json F ARGS -- pipelock CMD…` as root; the report.
pub(crate) fn trace_json(
    trace_args: &[&str],
    command: &[&str],
) -> Result<std::result::Result<TraceReport, Outcome>> {
    if let Some(skip) = cannot_load() {
        return Ok(Err(skip));
    }
    let json = scratch("trace.json");
    let out = run(trace_into(&json, trace_args).arg(pipelock_path()).args(command))?;
    let text_json = fs::read_to_string(&json);
    let _ = fs::remove_file(&json);
    ensure!(out.status.success(), "pipelock trace: {}", text(&out.stderr));
    Ok(Ok(parse_report(&text_json?)?))
}

/// [`trace_json`] of a herd (`command`), run again, up to 5 times, until it
/// contended a pipe lock: a herd contends only while two of its members run
/// at once, which a machine busy with something else need not allow. The
/// fifth report is returned whatever it holds, for the test to judge.
pub(crate) fn trace_contended(
    trace_args: &[&str],
    command: &[&str],
) -> Result<std::result::Result<TraceReport, Outcome>> {
    let mut attempt = 1;
    loop {
        let report = match trace_json(trace_args, command)? {
            Ok(report) => report,
            Err(skip) => return Ok(Err(skip)),
        };
        let contended = report
            .locks
            .iter()
            .any(|row| row.class.is_some_and(|c| c.name().starts_with("pipe-")) && row.contentions > 0);
        if contended || attempt == 5 {
            return Ok(Ok(report));
        }
        println!("  attempt {attempt}: the herd contended no pipe lock; again");
        attempt += 1;
    }
}

/// `pipelock trace --mode MODE` around this binary's `--exact-pipe-io N`:
/// the report and the inode of the helper's pipe.
pub(crate) fn trace_exact_pipe_io(mode: &str, classes: &str, n: u64) -> Result<(TraceReport, u64)> {
    trace_exact_pipe_io_with(mode, classes, n, "plain")
}

/// [`trace_exact_pipe_io`], the helper's calls made `how` (`plain`, `nowait`).
pub(crate) fn trace_exact_pipe_io_with(
    mode: &str,
    classes: &str,
    n: u64,
    how: &str,
) -> Result<(TraceReport, u64)> {
    let (report, ino) = trace_helper(
        &format!("{mode}-exact"),
        &["--mode", mode, "--class", classes],
        &["--exact-pipe-io", &n.to_string(), how],
    )?;
    Ok((report, ino.trim().parse()?))
}

/// `pipelock trace TRACE_ARGS --json … -- integration HELPER… FILE`: the
/// report and what the helper wrote to FILE. A helper that failed fails
/// the test.
pub(crate) fn trace_helper(
    name: &str,
    trace_args: &[&str],
    helper: &[&str],
) -> Result<(TraceReport, String)> {
    let (json, facts) = (
        scratch(&format!("{name}.json")),
        scratch(&format!("{name}.facts")),
    );
    let out = run(trace_into(&json, trace_args)
        .arg(std::env::current_exe()?)
        .args(helper)
        .arg(&facts))?;
    let report = fs::read_to_string(&json);
    let facts_text = fs::read_to_string(&facts);
    let _ = (fs::remove_file(&json), fs::remove_file(&facts));
    ensure!(out.status.success(), "trace: {}", text(&out.stderr));
    ensure!(
        !text(&out.stderr).contains("COMMAND exited with"),
        "the helper failed: {}",
        text(&out.stderr)
    );
    Ok((parse_report(&report?)?, facts_text?))
}

/// `pipelock trace --mode MODE --class lockref` around this binary's
/// `--stat-storm N`: the report and the name of the file stat()ed.
pub(crate) fn trace_stat_storm(mode: &str, n: u64) -> Result<(TraceReport, String)> {
    let json = scratch(&format!("{mode}-stat.json"));
    let dir = scratch(&format!("{mode}-stat.d"));
    let name = format!("lockref-{}-{mode}", std::process::id());
    let out = run(pipelock()
        .args(["trace", "--mode", mode, "--class", "lockref", "--json"])
        .arg(&json)
        .arg("--")
        .arg(std::env::current_exe()?)
        .args(["--stat-storm", &n.to_string()])
        .arg(&dir)
        .arg(&name))?;
    let report = fs::read_to_string(&json);
    let _ = (fs::remove_file(&json), fs::remove_dir_all(&dir));
    ensure!(out.status.success(), "trace: {}", text(&out.stderr));
    Ok((parse_report(&report?)?, name))
}

/// The rows of pipe `ino`.
pub(crate) fn pipe_rows(report: &TraceReport, ino: u64) -> Vec<&LockRow> {
    report.locks.iter().filter(|l| l.pipe_ino == Some(ino)).collect()
}

/// The row of class `class` among `rows`.
pub(crate) fn row_of<'a>(rows: &[&'a LockRow], class: LockClass) -> Option<&'a LockRow> {
    rows.iter().copied().find(|r| r.class == Some(class))
}

/// The busiest row (most acquisitions) of class `class`.
pub(crate) fn busiest(report: &TraceReport, class: LockClass) -> Option<&LockRow> {
    report
        .locks
        .iter()
        .filter(|l| l.class == Some(class))
        .max_by_key(|l| (l.acquisitions, l.contentions))
}

/// Which of a row's timings a check reads.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    Wait,
    Hold,
}

impl Kind {
    pub(crate) fn of(self, row: &LockRow) -> Option<&Timing> {
        match self {
            Self::Wait => row.wait.as_ref(),
            Self::Hold => row.hold.as_ref(),
        }
    }
}

/// A row's reported count and percentiles of `kind` against its own
/// log-linear buckets, recomputed here: the counts add up, and each
/// percentile is the midpoint of the bucket its rank falls in (clamped to
/// the maximum), as the manual states.
pub(crate) fn check_percentiles(row: &LockRow, kind: Kind) -> Result<()> {
    use pipelock_common::loglinear;
    let timing = kind
        .of(row)
        .with_context(|| format!("no {kind:?} timing: {}", shown(row)))?;
    let mut buckets = vec![0u64; loglinear::BUCKETS];
    for &(lower, n) in &timing.buckets {
        ensure!(
            loglinear::lower(loglinear::bucket(lower)) == lower,
            "{kind:?} bucket {lower} is not a bucket's lower bound: {}",
            shown(row)
        );
        buckets[loglinear::bucket(lower)] += n;
    }
    ensure!(
        buckets.iter().sum::<u64>() == timing.count,
        "{kind:?} buckets do not add up to its count: {}",
        shown(row)
    );
    for (q, name, reported) in [
        (0.5, "p50", timing.p50_ns),
        (0.9, "p90", timing.p90_ns),
        (0.99, "p99", timing.p99_ns),
        (0.999, "p99.9", timing.p999_ns),
    ] {
        let want = loglinear::percentile(&buckets, timing.max_ns, q)
            .map(|p| p.ns.round() as u64)
            .context("no percentile")?;
        ensure!(
            reported == want,
            "{kind:?} {name} {reported} is not the bucket's midpoint {want}: {}",
            shown(row)
        );
    }
    Ok(())
}
