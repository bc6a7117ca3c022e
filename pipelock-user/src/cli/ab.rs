//! `pipelock ab`: the same command on two kernels under qemu.
use std::{path::PathBuf, time::Duration};

use clap::{
    Args,
    builder::{PossibleValuesParser, TypedValueParser as _},
};
use pipelock_vm::qemu::Accel;

use crate::units::parse_seconds;

/// `--accel`: an accelerator, or None for `auto` (an alias, because clap
/// reads a field spelled `Option<…>` as an optional flag).
pub type RequestedAccel = Option<Accel>;

/// Parses `--accel`: `auto` (None) or one of qemu's accelerators.
fn accel_parser() -> impl clap::builder::TypedValueParser<Value = RequestedAccel> {
    PossibleValuesParser::new(["auto", "kvm", "tcg"]).map(|s| s.parse().ok())
}

/// `--memory 1G`, `--memory 512M` → MiB.
fn parse_memory(text: &str) -> Result<u32, String> {
    let (digits, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let n: u32 = digits
        .parse()
        .map_err(|_| format!("`{text}`: want a size like 1G or 512M"))?;
    let mib = match unit {
        "G" | "g" | "GiB" => n.checked_mul(1024),
        "M" | "m" | "MiB" | "" => Some(n),
        _ => None,
    }
    .filter(|m| (256..=65536).contains(m));
    mib.ok_or_else(|| format!("`{text}`: want 256M to 64G"))
}

fn parse_percent(text: &str) -> Result<f64, String> {
    text.trim_end_matches('%')
        .parse::<f64>()
        .ok()
        .filter(|p| *p > 0.0 && *p <= 1000.0)
        .ok_or_else(|| format!("`{text}`: want a change in percent, like 5"))
}

#[derive(Debug, Args)]
pub struct AbArgs {
    /// A kernel to boot: a vmlinuz/bzImage path, a kernel .deb, or a Debian
    /// package name or glob (fetched once). Give it twice: A, then B.
    #[arg(
        long = "kernel",
        value_name = "KERNEL",
        num_args = 1,
        required_unless_present = "source",
        conflicts_with = "source"
    )]
    pub kernels: Vec<String>,
    /// A kernel source tree to build A and B from (with --patch, or two --rev).
    #[arg(long, value_name = "DIR")]
    pub source: Option<PathBuf>,
    /// B is the --source tree with this patch applied (`patch -p1`); A is the tree as it is.
    #[arg(long, value_name = "FILE", requires = "source", conflicts_with = "revs")]
    pub patch: Option<PathBuf>,
    /// Two commits of a git --source tree: A, then B.
    #[arg(long = "rev", value_name = "REV", num_args = 1, requires = "source")]
    pub revs: Vec<String>,
    /// A kernel configuration fragment merged after pipelock's (both kernels).
    #[arg(long, value_name = "FRAGMENT", requires = "source")]
    pub config: Option<PathBuf>,
    /// Where built kernels and their work trees are kept [default: ~/.cache/pipelock/builds].
    #[arg(long, value_name = "DIR", requires = "source")]
    pub build_cache: Option<PathBuf>,
    /// Parallel compile jobs of a kernel build [default: the CPUs].
    #[arg(long, value_name = "N", requires = "source", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub jobs: Option<u32>,
    /// Runs of the command per kernel (one per boot, A and B alternating).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub runs: u32,
    /// auto: KVM if /dev/kvm answers within 3 s, else TCG (emulated).
    #[arg(long, value_name = "ACCEL", default_value = "auto", value_parser = accel_parser())]
    pub accel: RequestedAccel,
    /// The guest's CPUs.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub cpus: u32,
    /// The guest's memory (256M to 64G).
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = parse_memory)]
    pub memory: u32,
    /// Longest a boot (its run included) may take.
    #[arg(long, value_name = "SECS", default_value = "600", value_parser = parse_seconds)]
    pub timeout: Duration,
    /// Write both kernels' raw runs and the table as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// The change (%) the verdict asks about: if these runs could not detect
    /// it, it says how many runs would.
    #[arg(long, value_name = "PERCENT", default_value_t = crate::model::stats::DEFAULT_DETECT_PERCENT, value_parser = parse_percent)]
    pub detect: f64,
    /// Echo the guests' consoles.
    #[arg(long)]
    pub verbose: bool,
    /// `run WORKLOAD [--trace …]` or `trace … -- CMD` (CMD from the guest's busybox).
    #[arg(last = true, value_name = "SUBCOMMAND", required = true)]
    pub command: Vec<String>,
}
