//! The stats model: per-lock rows, timings and percentiles, naming,
//! sorting, per-class totals. Plain values built from what the programs
//! recorded; no aya, no clap, no I/O, so all of it is unit-tested.
pub mod callers;
pub mod class;
pub mod naming;
pub mod notes;
pub mod owners;
pub mod report;
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
