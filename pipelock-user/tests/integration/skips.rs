//! What the kernel's skipped runs allow an exact count to miss: a count
//! may fall short of its known answer by no more than the skipped runs of
//! its own path's programs (`model::skips`). A pipe call's entry is the
//! exception: skipped, it leaves the whole call untraced, and a call that
//! sleeps takes its mutex again after each wake-up; a test whose calls
//! sleep judges only runs without such skips ([`is_pipe_call_entry`]).
use std::fmt;

pub(super) use pipelock_user::model::skips::is_pipe_call_entry;
use pipelock_user::model::{LockClass, LockRow, ProgramStats, TraceReport, fixtures, skips};

use super::*;

/// A counted path: the programs whose skipped run can lose one of its events.
#[derive(Clone, Copy, Debug)]
pub(super) enum CountedPath {
    /// A pipe mutex's acquisitions and contentions.
    Mutex,
    /// A pipe wait-queue spinlock's acquisitions and contentions.
    Spinlock,
}

impl CountedPath {
    /// Whether a skipped run of `program` can lose an event of this path.
    pub(super) fn has(self, program: &str) -> bool {
        let class = match self {
            Self::Mutex => LockClass::PipeMutex,
            Self::Spinlock => LockClass::PipeRdWait,
        };
        skips::on_path(class, program)
    }
}

/// The skipped runs of a report's programs on one path, per program.
pub(super) struct Skips(Vec<(String, u64)>);

impl Skips {
    pub(super) fn on(report: &TraceReport, path: CountedPath) -> Self {
        Self(
            report
                .programs
                .iter()
                .filter(|p| p.recursion_misses > 0 && path.has(&p.name))
                .map(|p| (p.name.clone(), p.recursion_misses))
                .collect(),
        )
    }

    pub(super) fn total(&self) -> u64 {
        self.0.iter().map(|(_, n)| n).sum()
    }
}

/// `none`, or `mutex_lock_entry 12, pipe_read_exit 3`.
impl fmt::Display for Skips {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        let each: Vec<String> = self.0.iter().map(|(name, n)| format!("{name} {n}")).collect();
        f.write_str(&each.join(", "))
    }
}

/// Checks a pipe-mutex row's exact count: `want` acquisitions, short by
/// no more than the runs the kernel skipped on the mutex's path (a skipped
/// lock call loses its acquisition, and its release is then one without a
/// start: dropped). Gives the count and, where runs were skipped, says so.
pub(super) fn exact_mutex_count(report: &TraceReport, row: &LockRow, want: u64) -> Result<String> {
    let acquisitions = row.acquisitions.context("the row has no acquisitions")?;
    let dropped = row.dropped.context("the row has no dropped count")?;
    let skips = Skips::on(report, CountedPath::Mutex);
    let skipped = skips.total();
    ensure!(
        acquisitions <= want && acquisitions + skipped >= want && dropped <= skipped,
        "pipe mutex acquired {acquisitions} times, {dropped} dropped; want exactly {want}, 0 \
         (runs skipped on the mutex's path: {skips}; trace's notes: {:?})",
        report.notes
    );
    Ok(if skipped > 0 {
        format!("{acquisitions} (runs the kernel skipped on the mutex's path: {skips})")
    } else {
        acquisitions.to_string()
    })
}

/// A count short by more than its path's skipped runs fails, however many
/// runs other paths skipped: a fixture report whose mutex lost 5 of 100
/// acquisitions, with 3 skipped runs on the mutex's path and hundreds on
/// others.
fn an_exact_count_allows_only_its_own_paths_skipped_runs() -> Result<Outcome> {
    let program = |name: &str, runs: u64, misses: u64| ProgramStats {
        name: name.to_owned(),
        run_count: runs,
        run_time_ns: 1,
        recursion_misses: misses,
    };
    let report = |mutex_misses: u64| {
        let mut report = fixtures::sample();
        report.programs = vec![
            program("mutex_lock_entry", 200, mutex_misses),
            program("pipe_write_entry", 50, 0),
            program("spin_lock_irq_entry", 900, 400),
            program("holder_switch", 900, 300),
            program("lockref_get_entry", 9, 100),
        ];
        report.locks[0].acquisitions = Some(95);
        report.locks[0].dropped = Some(0);
        report
    };
    let short = exact_mutex_count(&report(3), &report(3).locks[0], 100);
    let message = format!(
        "{:#}",
        short
            .as_ref()
            .err()
            .context("a loss of 5 with 3 skipped passed")?
    );
    ensure!(
        message.contains("mutex_lock_entry 3") && !message.contains("spin_lock_irq_entry"),
        "the failure does not name the path's skips alone: {message}"
    );
    ensure!(
        exact_mutex_count(&report(5), &report(5).locks[0], 100)?
            == "95 (runs the kernel skipped on the mutex's path: mutex_lock_entry 5)",
        "a loss of 5 with 5 skipped on the path"
    );
    // pipelock's own JSON with the row's `dropped` renamed: read back, the
    // row has no dropped count, and the check fails instead of reading 0.
    let mut json = serde_json::to_value(report(5))?;
    let row = json["locks"][0]
        .as_object_mut()
        .context("the fixture has no lock row")?;
    let dropped = row
        .remove("dropped")
        .context("the fixture row has no `dropped`")?;
    row.insert("drops".to_owned(), dropped);
    let renamed = parse_report(&json.to_string())?;
    ensure!(
        exact_mutex_count(&renamed, &renamed.locks[0], 95).is_err(),
        "a report whose `dropped` was renamed read as none dropped"
    );
    ensure!(
        exact_mutex_count(&report(5), &report(5).locks[0], 95).is_ok(),
        "the same report with `dropped` fails: the renamed check proves nothing"
    );
    Ok(Outcome::Passed)
}
register!(Host an_exact_count_allows_only_its_own_paths_skipped_runs);
