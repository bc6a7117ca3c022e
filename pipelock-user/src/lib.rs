//! pipelock's userspace. The data path reads top to bottom:
//!
//! ```text
//!   kernel/   what the running kernel offers: kallsyms, BTF, tracefs, program types
//!     ↓
//!   bpf/      the embedded programs, THE hook table, the mode decision,
//!             attaching, reading the maps back
//!     ↓
//!   collect/  a tracing session: attach → ticks that drain the maps → snapshots
//!     ↓
//!   model/    per-lock rows, timings, percentiles, names, totals (plain values)
//!     ↓
//!   render/ · tui/   text tables, CSV, histograms · the live `top` screen
//! ```
//!
//! [`cmd`] has one module per subcommand wiring those layers; [`workload`]
//! holds the built-in load generators, which know nothing of tracing.
//! The model is the base vocabulary: every layer above may use it, and it
//! uses only pipelock-common and the leaves (`error`, `units`, `output`,
//! `interrupt`). The `layering` test checks that dependencies only point
//! down this list, and that no two modules of any crate name each other
//! (through `crate::`, `super::` or `self::` paths).

pub mod bpf;
pub mod cli;
pub mod cmd;
pub mod collect;
pub mod error;
pub mod interrupt;
pub mod kernel;
pub mod model;
pub mod output;
pub mod render;
pub mod tui;
pub mod units;
pub mod workload;

pub use error::Error;

#[cfg(test)]
mod layering;
