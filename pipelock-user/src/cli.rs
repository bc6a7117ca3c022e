//! Command-line interface (clap derive); `main.rs` dispatches on it.
use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "pipelock",
    version,
    about = "How long Linux pipe locks are waited for and held, and why",
    long_about = "pipelock attaches eBPF programs to the kernel's pipe and lock paths and \
                  reports per-lock wait and hold times. It needs root (or CAP_BPF + CAP_PERFMON)."
)]
pub struct Cli {
    /// Print the eBPF programs' own log messages (aya-log) to stderr.
    #[arg(long, global = true)]
    pub ebpf_log: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Report what this kernel offers pipelock: BTF, tracefs, kprobes, which
    /// program types load, which lock functions exist, and the mode `auto` picks.
    Probe(ProbeArgs),
    /// Trace pipe lock contention: per-lock wait (and, in fentry/kprobe mode,
    /// hold) times, until COMMAND exits, --duration passes, or Ctrl-C.
    Trace(TraceArgs),
    /// A live, full-screen view of the traced locks (like top or bpftop).
    Top(TopArgs),
    /// Measure what tracing costs: workloads untraced vs traced in each mode
    /// (and under `perf lock record`), alternating, as ratios.
    Overhead(OverheadArgs),
    /// Run a built-in workload (the lock benchmarks of lock-patch threads),
    /// repeat it, and report its figures with perf-stat-like counters.
    Run(RunArgs),
    /// Compare two `pipelock run --json` results: mean ± sd, delta, Welch's t-test.
    Compare {
        /// The baseline ("before") result file.
        a: PathBuf,
        /// The result to compare ("after").
        b: PathBuf,
    },
}

/// What `trace` and `top` attach, and to whom (shared by both).
#[derive(Debug, Args)]
pub struct TracingArgs {
    #[arg(long, value_enum, default_value_t = crate::trace::ModeArg::Auto)]
    pub mode: crate::trace::ModeArg,
    /// Only this process (its tasks' contention; filtered in the kernel).
    #[arg(short, long, value_name = "PID")]
    pub pid: Option<u32>,
    /// Only tasks with this command name (comm, as `ps -o comm` shows it; filtered in the kernel).
    #[arg(short, long, value_name = "COMM")]
    pub comm: Option<String>,
    /// Lock classes to record (default: pipe-mutex,pipe-wait,other; lockref is
    /// opt-in, its hooks cost every spin_lock() in the system).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub class: Vec<crate::trace::ClassArg>,
}

impl TracingArgs {
    pub fn filters(&self) -> crate::trace::Filters {
        crate::trace::Filters {
            tgid: self.pid,
            comm: self.comm.clone(),
            classes: self.class.clone(),
        }
    }
}

#[derive(Debug, Args)]
pub struct TraceArgs {
    #[command(flatten)]
    pub tracing: TracingArgs,
    /// Stop after this many seconds (default: when COMMAND exits, or Ctrl-C).
    #[arg(long, value_name = "SECS", value_parser = parse_seconds, allow_negative_numbers = true)]
    pub duration: Option<Duration>,
    /// Show the N locks that lead by --sort (files get all of them).
    #[arg(short = 'n', long, value_name = "N", default_value_t = 20)]
    pub top: usize,
    /// Order of the rows, largest first.
    #[arg(long, value_enum, value_name = "KEY", default_value_t = crate::lockstats::SortKey::WaitTotal)]
    pub sort: crate::lockstats::SortKey,
    /// Print a report every SECS (cumulative; per interval with --reset).
    /// With --csv, every interval appends its rows with a `timestamp` column.
    #[arg(long, value_name = "SECS", value_parser = parse_seconds, allow_negative_numbers = true)]
    pub interval: Option<Duration>,
    /// With --interval: each report covers only its own interval.
    #[arg(long, requires = "interval")]
    pub reset: bool,
    /// Also print each shown lock's wait and hold log2 histograms.
    #[arg(long)]
    pub hist: bool,
    /// Report pipelock's own BPF run time (kernel run-time statistics; they
    /// add two clock reads to every program run while on).
    #[arg(long)]
    pub bpf_stats: bool,
    /// Attach programs that do nothing at the same hooks (fentry/kprobe
    /// modes): what the attach mechanism alone costs (`pipelock overhead`).
    #[arg(long, hide = true)]
    pub empty_programs: bool,
    /// Write one CSV row per lock (times in ns; unmeasured values empty).
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Write the report as JSON, histogram buckets included.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// A command to run while tracing; tracing stops when it exits.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub tracing: TracingArgs,
    /// Refresh every SECS.
    #[arg(long, value_name = "SECS", default_value = "1", value_parser = parse_seconds, allow_negative_numbers = true)]
    pub interval: Duration,
    /// Run a built-in workload, again each time it ends, while watching.
    #[arg(long, value_enum, value_name = "WORKLOAD", conflicts_with = "command")]
    pub workload: Option<TopWorkload>,
    /// A command to run while watching (its output is discarded).
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// The workloads `pipelock top --workload` can loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TopWorkload {
    PipeThroughput,
    PipeHerd,
    PipeStream,
    LockrefStat,
}

impl TopWorkload {
    /// Its `pipelock run` subcommand.
    pub fn subcommand(self) -> &'static str {
        match self {
            Self::PipeThroughput => "pipe-throughput",
            Self::PipeHerd => "pipe-herd",
            Self::PipeStream => "pipe-stream",
            Self::LockrefStat => "lockref-stat",
        }
    }
}

#[derive(Debug, Args)]
pub struct OverheadArgs {
    /// Alternating untraced/traced pairs per workload and tracer.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..))]
    pub pairs: u16,
    /// Length of each timed workload run.
    #[arg(long, value_name = "SECS", default_value = "2", value_parser = parse_seconds, allow_negative_numbers = true)]
    pub seconds: Duration,
    /// Only these workloads (default: pipe-throughput, pipe-herd, lockref-stat).
    #[arg(long = "workload", value_enum, value_delimiter = ',')]
    pub workloads: Vec<TopWorkload>,
    /// Attach modes to measure; ones this kernel refuses are skipped with the reason.
    #[arg(long = "mode", value_enum, value_delimiter = ',', default_values_t = [crate::trace::ModeArg::Fentry, crate::trace::ModeArg::Kprobe, crate::trace::ModeArg::Tracepoint])]
    pub modes: Vec<crate::trace::ModeArg>,
    /// Tokens the pipe herd passes per run.
    #[arg(long, value_name = "N", default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub herd_limit: u64,
    /// Also write the tables as markdown to FILE.
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,
    /// Also write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(subcommand)]
    pub workload: WorkloadCommand,
}

#[derive(Debug, Subcommand)]
pub enum WorkloadCommand {
    /// UnixBench "Pipe Throughput": write+read 512 bytes on one pipe, per second.
    PipeThroughput {
        #[command(flatten)]
        args: crate::workload::throughput::Args,
        #[command(flatten)]
        common: crate::workload::CommonArgs,
    },
    /// The 2^K-process pipe herd of Linux commit 0ddad21d3e99; wall time.
    PipeHerd {
        #[command(flatten)]
        args: crate::workload::herd::Args,
        #[command(flatten)]
        common: crate::workload::CommonArgs,
    },
    /// pipebench: stream 128 KiB chunks through a pipe and a buffering middle process.
    PipeStream {
        #[command(flatten)]
        args: crate::workload::stream::Args,
        #[command(flatten)]
        common: crate::workload::CommonArgs,
    },
    /// A stat() storm on one path: dentry lockref contention (`./t`, stat2).
    LockrefStat {
        #[command(flatten)]
        args: crate::workload::lockref::Args,
        #[command(flatten)]
        common: crate::workload::CommonArgs,
    },
}

#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Also prove the pipeline end to end: attach a counter to
    /// lock:contention_begin, contend a pipe, and report the count.
    #[arg(long)]
    pub self_test: bool,

    /// How long the self-test contends the pipe, in seconds.
    #[arg(long, value_name = "SECS", default_value = "1", value_parser = parse_seconds, allow_negative_numbers = true, requires = "self_test")]
    pub duration: Duration,

    /// Save the kernel facts pipelock reads (filtered kallsyms, BTF, tracepoints,
    /// program-type checks) into the new directory DIR, for --kernel-facts or
    /// as a test fixture.
    #[arg(long, value_name = "DIR", conflicts_with = "kernel_facts")]
    pub save_facts: Option<PathBuf>,

    /// Read kernel facts from a captured tree (proc/, sys/ below DIR) instead of
    /// the running kernel (see --save-facts); nothing is loaded.
    #[arg(long, value_name = "DIR", conflicts_with = "self_test")]
    pub kernel_facts: Option<PathBuf>,
}

/// A positive, finite number of seconds (fractions allowed).
pub fn parse_seconds(text: &str) -> Result<Duration, String> {
    let secs: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    if !secs.is_finite() || secs <= 0.0 || secs > 86_400.0 * 365.0 {
        return Err(format!("`{text}`: seconds must be greater than 0"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    /// Every option of every subcommand parses into its field: clap checks
    /// option types only when a value is read, so this catches mismatches.
    #[test]
    fn every_option_parses() {
        for line in [
            "probe --self-test --duration 0.5 --ebpf-log",
            "probe --save-facts /tmp/x",
            "probe --kernel-facts /tmp/x",
            "trace --mode tracepoint --duration 2 -p 1 -c cat --class pipe-mutex,pipe-wait,other -n 5 \
             --csv a.csv --json a.json -- sleep 1",
            "trace --mode fentry",
            "top --mode tracepoint --interval 0.5 -p 1 -c x --class pipe-mutex --workload pipe-herd",
            "top -- sleep 1",
            "overhead --pairs 2 --seconds 0.5 --workload pipe-herd,lockref-stat --mode tracepoint --markdown a.md \
             --json a.json",
            "trace --interval 0.5 --reset --sort hold-max --hist --bpf-stats --csv a.csv --class lockref",
            "run pipe-throughput --duration 1 --passes 3 --copies 2 --runs 2 --cpus 0-1,3 --json a --csv b \
             -q --no-counters --trace --trace-mode tracepoint",
            "run pipe-herd -k 3 --limit 10 --cpus 0",
            "run pipe-stream --bytes 1G --bufsize 4096 --source /etc/hostname --sink pipe",
            "run pipe-stream --duration 2",
            "run lockref-stat --threads 2 --duration 1 --path /tmp --op fstat --mode same",
            "run lockref-stat --procs 2 --mode separate --op open-close",
            "compare a.json b.json",
        ] {
            let args = std::iter::once("pipelock").chain(line.split_whitespace());
            let cli = Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{line}: {e}"));
            // Touch the parsed value so a type mismatch would have panicked above.
            assert!(!format!("{cli:?}").is_empty());
        }
    }

    #[test]
    fn seconds_must_be_positive() {
        assert_eq!(parse_seconds("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_seconds("0").is_err());
        assert!(parse_seconds("-3").is_err());
        assert!(parse_seconds("nan").is_err());
        assert!(parse_seconds("soon").is_err());
    }
}
