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

#[derive(Debug, Args)]
pub struct AbArgs {
    /// A kernel to boot: a vmlinuz/bzImage path, a kernel .deb, or a Debian
    /// package name or glob (fetched once). Give it twice: A, then B.
    #[arg(long = "kernel", value_name = "KERNEL", required = true, num_args = 1)]
    pub kernels: Vec<String>,
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
    /// Echo the guests' consoles.
    #[arg(long)]
    pub verbose: bool,
    /// `run WORKLOAD [--trace …]` or `trace … -- CMD` (CMD from the guest's busybox).
    #[arg(last = true, value_name = "SUBCOMMAND", required = true)]
    pub command: Vec<String>,
}
