//! Command-line interface (clap derive); `main.rs` dispatches on it.
mod ab;
#[cfg(test)]
mod docs_check;
mod watch;

pub use self::{
    ab::AbArgs,
    watch::{ServeArgs, TopArgs},
};
use std::{path::PathBuf, time::Duration};

use clap::{
    Args, Parser, Subcommand,
    builder::{PossibleValuesParser, TypedValueParser as _},
};

use crate::{
    bpf::{AttachMode, Filters},
    model::{ByKey, ClassSet, LockMatch, ReportView, SortKey, view::DEFAULT_STACK_DEPTH},
    units::parse_seconds,
    workload::WorkloadName,
};

/// `--mode`: an attach mode, or None for `auto` (an alias, because clap
/// reads a field spelled `Option<…>` as an optional flag).
pub type RequestedMode = Option<AttachMode>;

/// Parses `--mode`: `auto` or one of the attach modes.
fn mode_parser() -> impl clap::builder::TypedValueParser<Value = RequestedMode> {
    PossibleValuesParser::new(["auto", "fentry", "kprobe", "tracepoint"]).map(|s| s.parse().ok())
}

fn attach_mode_parser() -> impl clap::builder::TypedValueParser<Value = AttachMode> {
    PossibleValuesParser::new(AttachMode::ALL.map(AttachMode::name)).try_map(|s| s.parse::<AttachMode>())
}

fn by_parser() -> impl clap::builder::TypedValueParser<Value = ByKey> {
    PossibleValuesParser::new(ByKey::NAMES).try_map(|s| s.parse::<ByKey>())
}

fn sort_parser() -> impl clap::builder::TypedValueParser<Value = SortKey> {
    PossibleValuesParser::new(SortKey::NAMES).try_map(|s| s.parse::<SortKey>())
}

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
    /// Export the traced locks as Prometheus/OpenMetrics metrics over HTTP
    /// (`/metrics`, `/healthz`), system-wide, until SIGTERM or Ctrl-C.
    Serve(ServeArgs),
    /// Measure what tracing costs: workloads untraced vs traced in each mode
    /// (and under `perf lock record`), alternating, as ratios.
    Overhead(OverheadArgs),
    /// Run a built-in workload (the lock benchmarks of lock-patch threads),
    /// repeat it, and report its figures with perf-stat-like counters.
    Run(RunArgs),
    /// Run the same (traced) command on two kernels under qemu, N times
    /// each, and compare them: workload figures and lock behaviour, with
    /// Welch's t-test marking what changed.
    Ab(AbArgs),
    /// In a guest of `pipelock ab`: print FILE framed for the console.
    #[command(hide = true)]
    AbEmit {
        nonce: String,
        name: String,
        file: PathBuf,
    },
    /// Compare two `pipelock run --json` results: mean ± sd, delta, Welch's
    /// t-test; for results of `run --trace`, also each lock class's wait and
    /// hold mean, p50 and p99, judged across runs with a 95% interval.
    Compare {
        /// The baseline ("before") result file.
        a: PathBuf,
        /// The result to compare ("after").
        b: PathBuf,
    },
    /// Draw a result file of `trace`, `run` or `ab` (`--json`) as one
    /// self-contained HTML page: wait and hold distributions of the
    /// busiest locks, their percentiles, what owners were doing; for `ab`,
    /// both kernels' distributions overlaid and the comparison.
    Report {
        /// The result file (`trace --json`, `run --json`, `ab --json`).
        result: PathBuf,
        /// Where to write the page.
        #[arg(long, value_name = "FILE")]
        html: PathBuf,
        /// Locks drawn (busiest by wait first).
        #[arg(long, value_name = "N", default_value_t = 8)]
        top: usize,
    },
    /// For packagers: write the man pages or shell completions into DIR.
    #[command(hide = true)]
    Generate {
        #[command(subcommand)]
        what: Generated,
    },
}

/// What `pipelock generate` writes.
#[derive(Debug, Subcommand)]
pub enum Generated {
    /// One man page per command (`pipelock.1`, `pipelock-trace.1`, …).
    Man { dir: PathBuf },
    /// bash, zsh and fish completion scripts.
    Completions { dir: PathBuf },
}

/// What `trace` and `top` attach, and to whom (shared by both).
#[derive(Debug, Args)]
pub struct TracingArgs {
    /// fentry/fexit (every acquisition, wait and hold), kprobe (the same
    /// where fentry is refused), tracepoint (wait of contended acquisitions
    /// only), or auto: the best that attaches here.
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = mode_parser())]
    pub mode: RequestedMode,
    /// Only these processes (comma-separated or repeated; all their threads;
    /// filtered in the kernel).
    #[arg(short, long = "pid", value_name = "PID", value_delimiter = ',')]
    pub pids: Vec<u32>,
    /// Only these threads.
    #[arg(short, long = "tid", value_name = "TID", value_delimiter = ',')]
    pub tids: Vec<u32>,
    /// System-wide, also while running COMMAND (which is otherwise followed:
    /// only its process tree is recorded, like `perf record -- COMMAND`).
    #[arg(short, long, conflicts_with_all = ["pids", "tids"])]
    pub all: bool,
    /// Only tasks with this command name (comm, as `ps -o comm` shows it; filtered in the kernel).
    #[arg(short, long, value_name = "COMM")]
    pub comm: Option<String>,
    /// Lock classes to record, comma-separated: pipe-mutex, pipe-wait
    /// (= pipe-rd-wait,pipe-wr-wait), other (= other-in-pipe-call), lockref,
    /// all. Default: pipe-mutex,pipe-wait,other; lockref is opt-in, its hooks
    /// cost every spin_lock() in the system.
    #[arg(long, value_name = "CLASSES", value_parser = |s: &str| s.parse::<ClassSet>())]
    pub class: Vec<ClassSet>,
    /// Locks the kernel maps hold between two drains (each second, or each
    /// --interval), like `perf lock contention -M` [default: 4096; 16 to
    /// 262144]. More locks than that in one drain are counted as
    /// `stats_full`; the report header gives the maps' kernel memory.
    #[arg(long, value_name = "N")]
    pub max_locks: Option<u32>,
    /// Locks pipelock keeps one by one across drains; past that, the
    /// longest idle are folded into per-class "retired locks" rows, so a
    /// long trace of a churning system needs the same memory after an hour
    /// as after a minute (`--verbose` shows the fill and pipelock's memory).
    #[arg(long, value_name = "N", default_value_t = crate::model::DEFAULT_TRACKED_LOCKS,
          value_parser = clap::value_parser!(u32).range(16..=1_048_576).map(|n| n as usize))]
    pub track_locks: usize,
    /// Record the kernel call stack of each contended acquisition
    /// (fentry/kprobe: of every acquisition), like `perf lock contention`'s
    /// callers: each lock lists the stacks its waits came from.
    #[arg(long)]
    pub callers: bool,
    /// fentry/kprobe: also split each pipe-mutex hold by what the holder
    /// did while holding it (on a CPU, runnable, sleeping); costs a map
    /// insert and delete per acquisition.
    #[arg(long)]
    pub hold_states: bool,
    /// Distinct call stacks the kernel's stack map holds [default: 4096;
    /// 16 to 262144]. A stack that finds no room is counted as `stack_lost`.
    #[arg(long, value_name = "N")]
    pub stack_map_size: Option<u32>,
    /// Call stacks under heavy contention: past the first 1024 a second on
    /// each CPU, unwind one in N at random and count it N times; sampled
    /// callers' figures carry their 95 % margin [default: 32; 1: unwind
    /// every one, exact, at about ten times the cost]
    #[arg(long, value_name = "N")]
    pub stack_sample: Option<u32>,
}

impl TracingArgs {
    /// The filters; `runs_a_load` says whether the command starts one (a
    /// COMMAND or a workload), whose process tree is then what is traced.
    pub fn filters(&self, runs_a_load: bool) -> Filters {
        Filters {
            pids: self.pids.clone(),
            tids: self.tids.clone(),
            follow_children: runs_a_load && !self.all && self.pids.is_empty() && self.tids.is_empty(),
            comm: self.comm.clone(),
            classes: self.class.iter().fold(ClassSet::EMPTY, |all, c| all.union(*c)),
            max_locks: self.max_locks,
            callers: self.callers,
            stack_map_size: self.stack_map_size,
            stack_sample: self.stack_sample,
            by_task: false,
            hold_states: self.hold_states,
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
    #[arg(long, value_name = "KEY", default_value = "wait-total", value_parser = sort_parser())]
    pub sort: SortKey,
    /// What a row is: lock (each lock instance), caller (each call stack,
    /// across locks of a class, like `perf lock contention`; implies
    /// --callers), task (each thread, like `perf lock contention -t`).
    #[arg(long, value_name = "KEY", default_value = "lock", value_parser = by_parser())]
    pub by: ByKey,
    /// Frames shown per call stack, from the lock's caller outwards.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_STACK_DEPTH, value_parser = clap::value_parser!(u16).range(1..=24).map(usize::from))]
    pub stack_depth: usize,
    /// Only waits whose call stack has a frame matching GLOB, e.g.
    /// `anon_pipe_write` or `*splice*` (implies --callers).
    #[arg(long, value_name = "GLOB", value_parser = |s: &str| glob::Pattern::new(s).map_err(|e| format!("not a glob: {e}")))]
    pub caller: Option<glob::Pattern>,
    /// Only these locks: addresses (0x…) or parts of their names
    /// (`pipe:[1234]`, `rq_lock`), comma-separated.
    #[arg(long, value_name = "LOCKS", value_delimiter = ',', value_parser = |s: &str| s.parse::<LockMatch>())]
    pub lock_filter: Vec<LockMatch>,
    /// Print a report every SECS (cumulative; per interval with --reset).
    /// With --csv, every interval appends its rows with a `timestamp` column.
    #[arg(long, value_name = "SECS", value_parser = parse_seconds, allow_negative_numbers = true)]
    pub interval: Option<Duration>,
    /// With --interval: each report covers only its own interval.
    #[arg(long, requires = "interval")]
    pub reset: bool,
    /// Also print each shown lock's wait and hold histograms (by powers of two) and percentiles.
    #[arg(long)]
    pub hist: bool,
    /// Also list each of pipelock's kernel maps: entries used, capacity, memory.
    #[arg(short, long)]
    pub verbose: bool,
    /// Report pipelock's own BPF run time (kernel run-time statistics; they
    /// add two clock reads to every program run while on).
    #[arg(long)]
    pub bpf_stats: bool,
    /// Attach programs that do nothing at the same hooks (with an explicit
    /// --mode): what the attach mechanism alone costs (`pipelock overhead`).
    #[arg(long, hide = true)]
    pub empty_programs: bool,
    /// Write one CSV row per lock (times in ns; unmeasured values empty).
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Write the report as JSON, histogram buckets included.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write wait time by kernel call stack as folded stacks (FlameGraph,
    /// inferno, speedscope): frames from the outermost caller in, the lock
    /// as the leaf, ns waited as the count (implies --callers).
    #[arg(long, value_name = "FILE")]
    pub folded: Option<PathBuf>,
    /// Draw the same as a flame graph SVG (implies --callers).
    #[arg(long, value_name = "FILE")]
    pub flamegraph: Option<PathBuf>,
    /// Write a self-contained HTML page: the busiest locks' wait and hold
    /// distributions, percentiles and owners' states (as `pipelock report`).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// A command to run while tracing; tracing stops when it exits.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

impl TraceArgs {
    /// What is recorded: the tracing filters plus what `--by` and
    /// `--caller` need.
    pub fn filters(&self, runs_a_load: bool) -> Filters {
        let mut filters = self.tracing.filters(runs_a_load);
        filters.callers |= self.by == ByKey::Caller
            || self.caller.is_some()
            || self.folded.is_some()
            || self.flamegraph.is_some();
        filters.by_task = self.by == ByKey::Task;
        filters
    }

    /// How the report is cut.
    pub fn view(&self) -> ReportView {
        ReportView {
            by: self.by,
            stack_depth: self.stack_depth,
            caller: self.caller.clone(),
            locks: self.lock_filter.clone(),
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
    pub workloads: Vec<WorkloadName>,
    /// Attach modes to measure; ones this kernel refuses are skipped with the reason.
    #[arg(long = "mode", value_name = "MODES", value_delimiter = ',', default_value = "fentry,kprobe,tracepoint", value_parser = attach_mode_parser())]
    pub modes: Vec<AttachMode>,
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
        #[command(flatten)]
        trace: RunTraceArgs,
    },
    /// The 2^K-process pipe herd of Linux commit 0ddad21d3e99; wall time.
    PipeHerd {
        #[command(flatten)]
        args: crate::workload::herd::Args,
        #[command(flatten)]
        common: crate::workload::CommonArgs,
        #[command(flatten)]
        trace: RunTraceArgs,
    },
    /// pipebench: stream 128 KiB chunks through a pipe and a buffering middle process.
    PipeStream {
        #[command(flatten)]
        args: crate::workload::stream::Args,
        #[command(flatten)]
        common: crate::workload::CommonArgs,
        #[command(flatten)]
        trace: RunTraceArgs,
    },
    /// A stat() storm on one path: dentry lockref contention (`./t`, stat2).
    LockrefStat {
        #[command(flatten)]
        args: crate::workload::lockref::Args,
        #[command(flatten)]
        common: crate::workload::CommonArgs,
        #[command(flatten)]
        trace: RunTraceArgs,
    },
}

/// `pipelock run … --trace`: the workload's lock report after its figures.
#[derive(Debug, Clone, Args)]
pub struct RunTraceArgs {
    /// Trace pipe locks while the workload runs (see `pipelock trace`) and
    /// report them after the workload's figures.
    #[arg(long)]
    pub trace: bool,
    /// Attach mode for --trace (as `pipelock trace --mode`).
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = mode_parser(), requires = "trace")]
    pub trace_mode: RequestedMode,
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

#[cfg(test)]
mod tests;
