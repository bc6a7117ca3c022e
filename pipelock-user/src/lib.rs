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
//!   model     (pipelock-model) per-lock rows, timings, percentiles, owners,
//!             callers, names, totals, run statistics (plain values)
//!     ↓
//!   render/ · tui/   text tables, CSV, histograms · the live `top` screen
//! ```
//!
//! [`cmd`] has one module per subcommand wiring those layers; [`workload`]
//! holds the built-in load generators, which know nothing of tracing.
//! The model is the base vocabulary: every layer may use it, and as a crate
//! of its own (re-exported here as [`model`]) it uses only pipelock-common,
//! serde, glob and statrs. The `layering` test checks that the modules of this
//! crate only point down this list, and that no two modules of any crate
//! name each other (through `crate::`, `super::` or `self::` paths).

pub mod bpf;
pub mod cli;
pub mod cmd;
pub mod collect;
pub mod error;
pub mod interrupt;
pub mod kernel;
pub mod output;
pub mod render;
pub mod tui;
pub mod units;
pub mod workload;

pub use error::Error;
/// The results' plain values live in a crate of their own, so that what
/// they may depend on is the compiler's to check.
pub use pipelock_model as model;

#[cfg(test)]
mod layering;
