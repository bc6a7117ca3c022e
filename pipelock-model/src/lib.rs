//! pipelock's results as plain values: the per-lock rows, timings and
//! percentiles, owners, callers and threads, naming, sorting, per-class
//! totals, and the repeat-run statistics that compare two sets of runs.
//! Built from what the programs recorded, read back from pipelock's own
//! JSON; no aya, no clap, no tokio, no I/O, so all of it is unit-tested,
//! and the crate boundary keeps it that way.
pub mod ab_result;
pub mod callers;
pub mod class;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod format;
pub mod judge;
pub mod naming;
pub mod notes;
pub mod owners;
pub mod report;
pub mod run_result;
pub mod skips;
pub mod stats;
pub mod timing;
pub mod view;

pub use ab_result::{AbResult, FunctionCalls, Hang, KernelRuns, PatchedFunction};
pub use callers::{ByKey, CallerMargin, CallerRow, TaskRow};
pub use class::{ClassSet, LockClass, class_label};
pub use format::{FORMAT, FormatVersion};
pub use owners::{HoldState, HolderState, OwnerRow};
pub use report::{
    AskedTwice, ClassTotal, CollectorFill, DEFAULT_TRACKED_LOCKS, LockRow, MapFill, ProgramStats, Refusal,
    Snapshot, SortKey, TraceReport, sort_rows,
};
pub use run_result::{CommandResult, CounterSource, Counters, Metric, Operations, Run, RunResult, System};
pub use timing::{PERCENTILE_RESOLUTION, Timing};
pub use view::{LockMatch, ReportView};
