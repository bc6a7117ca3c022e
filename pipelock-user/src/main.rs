use std::{
    fs,
    io::{self, Write as _},
    path::{Path, PathBuf},
    process::ExitCode,
};

use clap::Parser as _;
use pipelock_user::{
    Error,
    attach::{AttachSupport, Support},
    cli::{Cli, Command, ProbeArgs, TraceArgs, WorkloadCommand},
    compare,
    error::one_line,
    inspector::KernelInspector,
    interrupt, lockstats, privilege, probe, selftest,
    trace::{self, Filters, Tracer},
    workload::{
        self, Workload,
        herd::PipeHerd,
        lockref::LockrefStat,
        report::{Format, Outputs},
        stream::PipeStream,
        throughput::PipeThroughput,
    },
};

fn main() -> ExitCode {
    // `pipelock … | head` must end quietly like other Unix tools, not panic
    // in println!; probes are detached by the kernel when the process dies.
    // SAFETY: restoring the default disposition before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    let default_level = if cli.ebpf_log { "info" } else { "warn" };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default_level))
        .format_timestamp(None)
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        // The report was printed; the conventional exit status for SIGINT.
        Err(Error::Interrupted) => ExitCode::from(130),
        Err(err) => {
            eprintln!("pipelock: error: {}", one_line(&err));
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), Error> {
    match cli.command {
        Command::Probe(args) => run_probe(&args, cli.ebpf_log),
        Command::Trace(args) => run_trace(&args, cli.ebpf_log),
        Command::Overhead(args) => run_overhead(&args),
        Command::Top(args) => pipelock_user::top::run(pipelock_user::top::Options {
            mode: args.tracing.mode,
            interval: args.interval,
            filters: args.tracing.filters(),
            load: match (args.workload, args.command.is_empty()) {
                (Some(workload), _) => pipelock_user::top::Load::Workload(workload.subcommand().to_owned()),
                (None, false) => pipelock_user::top::Load::Command(args.command),
                (None, true) => pipelock_user::top::Load::None,
            },
            ebpf_log: cli.ebpf_log,
        }),
        Command::Run(args) => run_workload(args.workload, cli.ebpf_log),
        Command::Compare { a, b } => {
            print!("{}", compare::compare(&a, &b)?);
            Ok(())
        }
    }
}

fn run_trace(args: &TraceArgs, ebpf_log: bool) -> Result<(), Error> {
    // An interval trace appends to its CSV as it goes; a plain one writes
    // its files once, atomically, at the end.
    let mut interval_csv = match (&args.csv, args.interval) {
        (Some(path), Some(_)) => Some(IntervalCsv::create(path)?),
        _ => None,
    };
    let outputs = Outputs::prepare(
        args.json.as_deref(),
        args.csv.as_deref().filter(|_| interval_csv.is_none()),
    )?;
    let bodies = if args.empty_programs {
        trace::HookBodies::Empty
    } else {
        trace::HookBodies::Pipelock
    };
    let mut tracer = Tracer::attach_bodies(args.tracing.mode, &args.tracing.filters(), ebpf_log, bodies)?;
    if args.bpf_stats {
        tracer.enable_run_stats();
    }
    interrupt::catch();
    let child = match args.command.split_first() {
        Some((program, rest)) => Some(std::process::Command::new(program).args(rest).spawn().map_err(
            |source| Error::Io {
                what: "starting COMMAND",
                source,
            },
        )?),
        None => None,
    };
    eprintln!("pipelock: tracing with {} (Ctrl-C to stop)", tracer.mode());
    let show = |report: &mut lockstats::TraceReport| {
        lockstats::sort_rows(&mut report.locks, args.sort);
        print!("{}", lockstats::render(report, args.top));
        if args.hist {
            print!("{}", lockstats::render_histograms(report, args.top));
        }
    };
    let mut collector = trace::IntervalCollector::new(&tracer);
    let mut tick = |tracer: &mut Tracer, last: bool| -> Result<lockstats::TraceReport, Error> {
        let snapshot = collector.tick(tracer)?;
        let mut shown = if args.reset {
            snapshot.interval
        } else {
            snapshot.total.clone()
        };
        let timestamp = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
        if let Some(csv) = interval_csv.as_mut() {
            csv.append(&shown, &timestamp)?;
        }
        // The last tick of a cumulative trace is the final report itself.
        if !last || args.reset {
            println!("--- {timestamp} ({:.1} s) ---", shown.duration_s);
            show(&mut shown);
            println!();
        }
        Ok(snapshot.total)
    };
    let (status, mut report) = if args.interval.is_some() {
        let status = {
            let tracer = &mut tracer;
            trace::wait_for(args.duration, child, interrupt::flag(), args.interval, || {
                tick(&mut *tracer, false).map(drop)
            })?
        };
        let total = tick(&mut tracer, true)?;
        (status, total)
    } else {
        let status = trace::wait_for(args.duration, child, interrupt::flag(), None, || Ok(()))?;
        (status, tracer.report()?)
    };
    drop(tracer);
    if args.reset {
        println!("--- whole run ---");
    }
    show(&mut report);
    outputs.write_with(|format| match format {
        Format::Json => serde_json::to_vec_pretty(&report).map_err(io::Error::other),
        Format::Csv => lockstats::to_csv(&report).map_err(io::Error::other),
    })?;
    if let Some(status) = status
        && !status.success()
    {
        eprintln!("pipelock: COMMAND exited with {status}");
    }
    Ok(())
}

/// The `--interval` CSV: created with its header at start, then one block of
/// rows per interval, each appended with a single write so that a killed
/// trace leaves whole rows only.
struct IntervalCsv {
    path: PathBuf,
    file: fs::File,
}

impl IntervalCsv {
    fn create(path: &Path) -> Result<Self, Error> {
        let fail = |source| Error::Output {
            path: path.to_owned(),
            source,
        };
        let header = lockstats::csv_block(&lockstats::TraceReport::empty(), Some(""), true)
            .map_err(|e| fail(io::Error::other(e)))?;
        let mut file = fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(path)
            .map_err(fail)?;
        file.write_all(&header).map_err(fail)?;
        Ok(Self {
            path: path.to_owned(),
            file,
        })
    }

    fn append(&mut self, report: &lockstats::TraceReport, timestamp: &str) -> Result<(), Error> {
        let fail = |source| Error::Output {
            path: self.path.clone(),
            source,
        };
        let block =
            lockstats::csv_block(report, Some(timestamp), false).map_err(|e| fail(io::Error::other(e)))?;
        self.file.write_all(&block).map_err(fail)?;
        self.file.sync_data().map_err(fail)
    }
}

fn run_overhead(args: &pipelock_user::cli::OverheadArgs) -> Result<(), Error> {
    use pipelock_user::overhead;
    let outputs = Outputs::prepare(args.json.as_deref(), None)?;
    let mode_name = |m: &trace::ModeArg| match m {
        trace::ModeArg::Auto => "auto",
        trace::ModeArg::Fentry => "fentry",
        trace::ModeArg::Kprobe => "kprobe",
        trace::ModeArg::Tracepoint => "tracepoint",
    };
    let results = overhead::run(&overhead::Options {
        pairs: usize::from(args.pairs),
        seconds: args.seconds.as_secs_f64(),
        workloads: args.workloads.iter().map(|w| w.subcommand().to_owned()).collect(),
        modes: args.modes.iter().map(|m| mode_name(m).to_owned()).collect(),
        herd_limit: args.herd_limit,
    })?;
    let markdown = overhead::to_markdown(&results);
    print!("{markdown}");
    if let Some(path) = &args.markdown {
        let staging = path.with_extension("md.partial");
        fs::write(&staging, &markdown)
            .and_then(|()| fs::rename(&staging, path))
            .map_err(|source| Error::Output {
                path: path.clone(),
                source,
            })?;
    }
    outputs.write_with(|_| serde_json::to_vec_pretty(&results).map_err(io::Error::other))
}

fn run_workload(command: WorkloadCommand, ebpf_log: bool) -> Result<(), Error> {
    // `--trace` records the lock class the workload is about.
    let (workload, common, classes): (Box<dyn Workload>, _, _) = match command {
        WorkloadCommand::PipeThroughput { args, common } => {
            (Box::new(PipeThroughput(args)), common, Vec::new())
        }
        WorkloadCommand::PipeHerd { args, common } => (Box::new(PipeHerd(args)), common, Vec::new()),
        WorkloadCommand::PipeStream { args, common } => (Box::new(PipeStream(args)), common, Vec::new()),
        WorkloadCommand::LockrefStat { args, common } => (
            Box::new(LockrefStat::new(args)?),
            common,
            vec![trace::ClassArg::Lockref],
        ),
    };
    // The workload's processes are all named like this binary.
    let tracer = if common.trace {
        let filters = Filters {
            tgid: None,
            comm: Some(own_comm()),
            classes,
        };
        Some(Tracer::attach(common.trace_mode, &filters, ebpf_log)?)
    } else {
        None
    };
    let report = workload::run(workload.as_ref(), &common)?;
    print!("{}", report.render(&workload.describe_summary(&report)));
    if let Some(tracer) = tracer {
        println!();
        print!("{}", lockstats::render(&tracer.report()?, TRACE_TOP_ROWS));
    }
    if report.interrupted {
        Err(Error::Interrupted)
    } else {
        Ok(())
    }
}

fn run_probe(args: &ProbeArgs, ebpf_log: bool) -> Result<(), Error> {
    if let Some(dir) = &args.kernel_facts {
        let inspector = KernelInspector::at(dir);
        let given = inspector.recorded_support()?.unwrap_or_else(|| {
            let not_tested = || Support::NotTested(format!("no checks recorded in {}", dir.display()));
            AttachSupport {
                fentry: not_tested(),
                kprobe: not_tested(),
                tracepoint: not_tested(),
                tp_btf: not_tested(),
            }
        });
        let report = probe::gather(&inspector, probe::Checks::Given(given))?;
        print!("{}", probe::render(&report));
        return Ok(());
    }
    privilege::require()?;
    let inspector = KernelInspector::live();
    let report = probe::gather(&inspector, probe::Checks::Live)?;
    print!("{}", probe::render(&report));
    if let Some(dest) = &args.save_facts {
        save_facts(&inspector, &report.support, dest)?;
        println!("\nkernel facts saved to {}", dest.display());
    }
    if args.self_test {
        println!();
        print!("{}", selftest::run(args.duration, ebpf_log)?.render());
    }
    Ok(())
}

/// Lock rows `run --trace` prints (as `pipelock trace`'s default --top).
const TRACE_TOP_ROWS: usize = 20;

/// This process's comm (the kernel's 15-byte task name).
fn own_comm() -> String {
    fs::read_to_string("/proc/self/comm")
        .map(|c| c.trim().to_owned())
        .unwrap_or_else(|_| "pipelock".into())
}

/// Captures into a sibling temporary directory first, so an interrupted or
/// failed capture never leaves a half-written DIR behind.
fn save_facts(inspector: &KernelInspector, support: &AttachSupport, dest: &Path) -> Result<(), Error> {
    if dest.exists() {
        return Err(Error::Io {
            what: "saving kernel facts",
            source: io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} already exists", dest.display()),
            ),
        });
    }
    let mut staging = dest.as_os_str().to_owned();
    staging.push(format!(".partial-{}", std::process::id()));
    let staging = PathBuf::from(staging);
    let result = inspector.capture(&staging, Some(support)).and_then(|()| {
        fs::rename(&staging, dest).map_err(|source| Error::Io {
            what: "renaming the captured facts",
            source,
        })
    });
    if result.is_err() {
        let _ = fs::remove_dir_all(&staging);
    }
    result
}
