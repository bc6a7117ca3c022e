//! Built-in workloads that reproduce the lock benchmarks kernel developers
//! quote: UnixBench's Pipe Throughput, the pipe herd of commit 0ddad21d3e99,
//! pipebench streaming, and a lockref stat() storm.
//!
//! Each run happens in a *leader* process forked for it: the leader gets its
//! own process group (one kill stops every worker, nothing is left behind),
//! applies `--cpus`, opens inherited perf counters, runs the workload and sends
//! its measurement back as JSON. The parent only watches: progress, Ctrl-C.
pub mod herd;
pub mod lockref;
pub mod report;
pub mod stream;
pub mod sys;
pub mod throughput;

use std::{
    io::Read as _,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};

use self::{
    report::{Counters, Metric, Operations, Report, Run},
    sys::Shared,
};
use crate::Error;

/// A run's details as its workload wrote them; None if they are not of
/// type `T` (another workload's).
pub fn details_of<T: serde::de::DeserializeOwned>(run: &Run) -> Option<T> {
    T::deserialize(&run.details).ok()
}

/// A workload's details as a run records them.
fn details(details: impl Serialize) -> Result<serde_json::Value, Error> {
    serde_json::to_value(details).map_err(|e| Error::Workload {
        reason: format!("the run's details: {e}"),
    })
}

/// What one run of a workload measured, sent from the leader to the parent.
#[derive(Debug, Serialize, Deserialize)]
pub struct Measurement {
    /// The headline figure, in the workload's [`Metric`] unit.
    pub value: f64,
    /// The workloads that count operations say how many this run did.
    pub operations: Option<Operations>,
    /// Workload-specific detail (per-pass rates, per-thread counts…).
    pub details: serde_json::Value,
}

#[derive(Debug, Serialize, Deserialize)]
enum LeaderMessage {
    Done {
        measurement: Measurement,
        counters: Counters,
        elapsed_s: f64,
    },
    Failed {
        error: String,
    },
}

/// How far a run has got, for the progress bar.
pub enum Progress {
    /// Timed workloads: the bar follows the clock.
    Timed(Duration),
    /// Workloads that stop at a count (shared slot 0 holds the current count).
    Counted(u64),
}

/// A workload pipelock can run and repeat.
/// The built-in workloads, by name: the one list `run`'s subcommands,
/// `top --workload` and `overhead --workload` are checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WorkloadName {
    PipeThroughput,
    PipeHerd,
    PipeStream,
    LockrefStat,
}

impl WorkloadName {
    pub const ALL: [Self; 4] = [
        Self::PipeThroughput,
        Self::PipeHerd,
        Self::PipeStream,
        Self::LockrefStat,
    ];

    /// Its name on the command line: the `pipelock run` subcommand.
    pub fn name(self) -> &'static str {
        match self {
            Self::PipeThroughput => "pipe-throughput",
            Self::PipeHerd => "pipe-herd",
            Self::PipeStream => "pipe-stream",
            Self::LockrefStat => "lockref-stat",
        }
    }
}

pub trait Workload {
    fn name(&self) -> &'static str;
    fn metric(&self) -> Metric;
    /// The exact parameters, recorded in the report so results are self-describing.
    fn params(&self) -> serde_json::Map<String, serde_json::Value>;
    /// Shared counters the workload needs (slot 0 is the progress count).
    fn shared_slots(&self) -> usize {
        1
    }
    fn progress(&self) -> Progress;
    /// Runs once, inside the leader process; may fork and spawn threads.
    fn measure(&self, shared: &Shared) -> Result<Measurement, Error>;
    /// Lines printed after each run (workload-specific formats).
    fn describe_run(&self, _run: &Run) -> Vec<String> {
        Vec::new()
    }
    /// Lines printed after all runs.
    fn describe_summary(&self, _report: &Report) -> Vec<String> {
        Vec::new()
    }
    /// Live rate shown beside the progress bar, from the shared counters.
    fn live_status(&self, _shared: &Shared, _elapsed: Duration) -> Option<String> {
        None
    }
}

/// Options every workload takes.
#[derive(Debug, Clone, clap::Args)]
pub struct CommonArgs {
    /// Repeat the workload N times and report mean, min, max, stddev.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub runs: u32,
    /// Pin the workload to these CPUs, e.g. 0-1 or 0,2.
    #[arg(long, value_name = "LIST", value_parser = sys::parse_cpus)]
    pub cpus: Option<sys::CpuList>,
    /// Write the results as JSON (for `pipelock compare`).
    #[arg(long, value_name = "FILE")]
    pub json: Option<std::path::PathBuf>,
    /// Write one CSV row per run.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<std::path::PathBuf>,
    /// Skip the perf counters (task-clock, context-switches, cpu-migrations,
    /// page-faults): inherited perf events add a little cost to every context
    /// switch. nvcsw/nivcsw (getrusage) are still reported.
    #[arg(long)]
    pub no_counters: bool,
    /// No progress bar (it is also off when stdout is not a terminal).
    #[arg(long, short)]
    pub quiet: bool,
}

fn restore_default_signals() {
    // SAFETY: resetting dispositions in the freshly forked leader. Workers
    // must see EPIPE, not die of SIGPIPE, as Rust programs and the C
    // references do (the parent lets SIGPIPE end it quietly, see main).
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

fn progress_bar(workload: &dyn Workload, runs: u32, quiet: bool) -> ProgressBar {
    let per_run = match workload.progress() {
        Progress::Timed(duration) => duration.as_millis() as u64,
        Progress::Counted(limit) => limit,
    };
    let bar = ProgressBar::with_draw_target(
        Some(per_run * u64::from(runs)),
        if quiet {
            ProgressDrawTarget::hidden()
        } else {
            ProgressDrawTarget::stderr()
        },
    );
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {percent:>3}% {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar
}

/// Runs the workload `--runs` times and builds the report. On Ctrl-C the
/// current run is killed and the report holds the runs that finished.
pub fn run(workload: &dyn Workload, common: &CommonArgs) -> Result<Report, Error> {
    run_then(workload, common, &mut |_| Ok(()), &mut |_| Ok(()))
}

/// [`run`], with `after_each` completing each run as it ends and `finish`
/// the report before its files are written (`--trace` adds each run's lock
/// figures and the whole trace there).
pub fn run_then(
    workload: &dyn Workload,
    common: &CommonArgs,
    after_each: &mut dyn FnMut(&mut Run) -> Result<(), Error>,
    finish: &mut dyn FnMut(&mut Report) -> Result<(), Error>,
) -> Result<Report, Error> {
    let outputs = crate::output::Outputs::prepare(common.json.as_deref(), common.csv.as_deref())?;
    // The bar is drawn on stderr, and only when a person is watching stdout.
    let quiet = common.quiet
        || !std::io::IsTerminal::is_terminal(&std::io::stdout())
        || !std::io::IsTerminal::is_terminal(&std::io::stderr());
    let shared = Shared::new(workload.shared_slots())?;
    let mut report = report::new(workload, common);
    crate::interrupt::catch();
    let bar = progress_bar(workload, common.runs, quiet);

    for index in 0..common.runs {
        bar.set_prefix(format!("run {}/{}", index + 1, common.runs));
        shared.reset();
        match run_once(workload, common, &shared, &bar, index)? {
            Some(mut run) => {
                after_each(&mut run)?;
                for line in workload.describe_run(&run) {
                    bar.suspend(|| println!("{line}"));
                }
                report.runs.push(run);
            }
            None => {
                report.interrupted = true;
                break;
            }
        }
    }
    bar.finish_and_clear();
    report.finish();
    finish(&mut report)?;
    outputs.write_with(|format| match format {
        crate::output::Format::Json => serde_json::to_vec_pretty(&report).map_err(std::io::Error::other),
        crate::output::Format::Csv => report::to_csv(&report).map_err(std::io::Error::other),
        // Not asked for above: a run's results have no call stacks.
        crate::output::Format::Folded | crate::output::Format::FlameGraph | crate::output::Format::Html => {
            Err(std::io::Error::other("not a format of run results"))
        }
    })?;
    Ok(report)
}

/// One run in a fresh leader process; `None` if interrupted.
fn run_once(
    workload: &dyn Workload,
    common: &CommonArgs,
    shared: &Shared,
    bar: &ProgressBar,
    index: u32,
) -> Result<Option<Run>, Error> {
    let (mut from_leader, mut to_parent) = sys::result_pipe()?;
    let started = Instant::now();
    // SAFETY: the leader runs the workload and leaves with _exit, never
    // returning into the parent's code.
    let leader = unsafe { libc::fork() };
    if leader == -1 {
        return Err(Error::Io {
            what: "fork",
            source: std::io::Error::last_os_error(),
        });
    }
    if leader == 0 {
        drop(from_leader);
        restore_default_signals();
        // SAFETY: plain syscalls in the child.
        unsafe {
            libc::setpgid(0, 0);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        }
        let message = lead(workload, common, shared);
        let code = i32::from(matches!(message, LeaderMessage::Failed { .. }));
        let json = serde_json::to_vec(&message).unwrap_or_default();
        sys::write_all_or_exit(&mut to_parent, &json);
        drop(to_parent);
        // SAFETY: end the leader without unwinding into the parent's frames.
        unsafe { libc::_exit(code) };
    }
    drop(to_parent);
    // Both sides set the group, so a kill right after fork cannot miss it.
    // SAFETY: plain syscall on our child.
    unsafe { libc::setpgid(leader, leader) };

    let base = u64::from(index)
        * match workload.progress() {
            Progress::Timed(d) => d.as_millis() as u64,
            Progress::Counted(limit) => limit,
        };
    let mut status = 0;
    loop {
        // SAFETY: polling our own child.
        let done = unsafe { libc::waitpid(leader, &mut status, libc::WNOHANG) };
        if done == leader && !crate::interrupt::interrupted() {
            break;
        }
        if crate::interrupt::interrupted() {
            // SAFETY: kill the whole workload group, then reap the leader.
            unsafe {
                libc::kill(-leader, libc::SIGKILL);
                if done != leader {
                    libc::kill(leader, libc::SIGKILL);
                    libc::waitpid(leader, &mut status, 0);
                }
            }
            return Ok(None);
        }
        let elapsed = started.elapsed();
        let position = match workload.progress() {
            Progress::Timed(d) => elapsed.min(d).as_millis() as u64,
            Progress::Counted(limit) => shared.get(0).load(Ordering::Relaxed).min(limit),
        };
        bar.set_position(base + position);
        if let Some(status) = workload.live_status(shared, elapsed) {
            bar.set_message(status);
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    let mut json = Vec::new();
    from_leader.read_to_end(&mut json).map_err(|source| Error::Io {
        what: "reading the workload's result",
        source,
    })?;
    match serde_json::from_slice(&json) {
        Ok(LeaderMessage::Done {
            measurement,
            counters,
            elapsed_s,
        }) => Ok(Some(Run {
            run: index + 1,
            value: measurement.value,
            elapsed_s,
            counters,
            operations: measurement.operations,
            details: measurement.details,
            trace: None,
        })),
        Ok(LeaderMessage::Failed { error }) => Err(Error::Workload { reason: error }),
        Err(_) if libc::WIFSIGNALED(status) => Err(Error::Workload {
            reason: format!("the workload was killed by signal {}", libc::WTERMSIG(status)),
        }),
        Err(_) => Err(Error::Workload {
            reason: "the workload's leader process died without a result".into(),
        }),
    }
}

fn lead(workload: &dyn Workload, common: &CommonArgs, shared: &Shared) -> LeaderMessage {
    if let Some(cpus) = &common.cpus
        && let Err(err) = sys::set_affinity(&cpus.0)
    {
        return LeaderMessage::Failed {
            error: crate::error::one_line(&err),
        };
    }
    // Orphaned herd members are re-parented here, so the leader can reap them.
    // SAFETY: plain prctl.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) };
    let perf = if common.no_counters {
        None
    } else {
        sys::PerfCounters::open()
    };
    let started = Instant::now();
    match workload.measure(shared) {
        Ok(measurement) => {
            reap_descendants();
            LeaderMessage::Done {
                measurement,
                counters: sys::collect_counters(perf.as_ref()),
                elapsed_s: started.elapsed().as_secs_f64(),
            }
        }
        Err(err) => LeaderMessage::Failed {
            error: crate::error::one_line(&err),
        },
    }
}

/// Waits for every remaining descendant (the leader is their subreaper).
pub fn reap_descendants() {
    let mut status = 0;
    // SAFETY: waiting for any child until none is left.
    while unsafe { libc::waitpid(-1, &mut status, 0) } > 0 {}
}
