//! What `pipelock ab --json` writes: the command, how the guests ran, each
//! kernel's runs as the guest's pipelock wrote them, and the judge's
//! table. `pipelock report` reads it back for the A/B page.
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{CommandResult, format::FormatVersion, judge::Row};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AbResult {
    pub format: FormatVersion,
    /// The command each boot ran, e.g. `run pipe-throughput --trace`.
    pub command: Vec<String>,
    /// "kvm" or "tcg".
    pub accel: String,
    /// Under TCG: compare ratios and counts, not absolute times.
    pub emulated: bool,
    pub runs_per_kernel: u32,
    /// A, then B.
    pub kernels: [KernelRuns; 2],
    pub table: Vec<Row>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelRuns {
    /// The kernel as asked for (a version, an image, a source tree).
    pub spec: String,
    pub image: PathBuf,
    /// Its `uname -r`.
    pub release: String,
    /// Each boot's result, as the guest wrote it.
    pub runs: Vec<CommandResult>,
}
