//! pipelock's results as plain values: the per-lock rows, timings and
//! percentiles, owners, callers and threads, naming, sorting, per-class
//! totals, and the repeat-run statistics that compare two sets of runs.
//! Built from what the programs recorded, read back from pipelock's own
//! JSON; no aya, no clap, no tokio, no I/O, so all of it is unit-tested,
//! and the crate boundary keeps it that way.
pub mod callers;
pub mod class;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod naming;
pub mod notes;
pub mod owners;
pub mod report;
pub mod stats;
pub mod timing;
pub mod view;

pub use callers::{ByKey, CallerMargin, CallerRow, TaskRow};
pub use class::{ClassSet, LockClass, class_label};
pub use owners::{HoldState, HolderState, OwnerRow};
pub use report::{
    ClassTotal, LockRow, MapFill, ProgramStats, Refusal, Snapshot, SortKey, TraceReport, sort_rows,
};
pub use timing::{PERCENTILE_RESOLUTION, Timing};
pub use view::{LockMatch, ReportView};
