//! `pipelock trace`: attach, let the load run (or COMMAND), print the
//! per-lock report; `--interval` prints and appends a CSV block per tick.
use std::{
    fs,
    io::{self, Write as _},
    path::{Path, PathBuf},
};

use crate::{
    Error,
    bpf::HookBodies,
    cli::TraceArgs,
    collect::{
        DRAIN_PERIOD, IntervalCollector, Tracer,
        child::{find_program, spawn_command},
        wait_for,
    },
    interrupt,
    model::{TraceReport, sort_rows},
    output::{Format, Outputs},
    render,
};

pub fn run(args: &TraceArgs, ebpf_log: bool) -> Result<(), Error> {
    if let (Some(interval), Some(duration)) = (args.interval, args.duration)
        && interval > duration
    {
        return Err(Error::Usage(format!(
            "--interval {} s is longer than --duration {} s: no interval would end",
            interval.as_secs_f64(),
            duration.as_secs_f64()
        )));
    }
    let program = args.command.first().map(|p| find_program(p)).transpose()?;
    if args.by == crate::model::ByKey::Task && args.caller.is_some() {
        return Err(Error::Usage(
            "--caller filters call stacks; --by task rows have none (use --by lock or --by caller)"
                .to_owned(),
        ));
    }
    let filters = args.filters(program.is_some());
    // Before any file is created: a filter that matches nothing is refused.
    filters.check()?;
    // An interval trace appends to its CSV as it goes; a plain one writes
    // its files once, atomically, at the end.
    let mut interval_csv = match (&args.csv, args.interval) {
        (Some(path), Some(_)) => Some(IntervalCsv::create(path, args.by)?),
        _ => None,
    };
    let outputs = Outputs::prepare_all(&[
        (args.json.as_deref(), Format::Json),
        (
            args.csv.as_deref().filter(|_| interval_csv.is_none()),
            Format::Csv,
        ),
        (args.folded.as_deref(), Format::Folded),
        (args.flamegraph.as_deref(), Format::FlameGraph),
        (args.html.as_deref(), Format::Html),
    ])?;
    let bodies = if args.empty_programs {
        HookBodies::Empty
    } else {
        HookBodies::Pipelock
    };
    // Before attaching, which can take seconds on a busy machine: a Ctrl-C
    // meanwhile still detaches, reports and exits 130, and never starts
    // COMMAND.
    interrupt::catch();
    let mut tracer = Tracer::attach_bodies(args.tracing.mode, &filters, ebpf_log, bodies)?;
    tracer.set_view(args.view());
    tracer.set_track_locks(args.tracing.track_locks);
    if args.bpf_stats {
        tracer.enable_run_stats();
    }
    let child = program
        .filter(|_| !interrupt::interrupted())
        .map(|program| spawn_command(&program, &args.command))
        .transpose()?;
    eprintln!("pipelock: tracing in {} mode (Ctrl-C to stop)", tracer.mode());
    let show = |report: &mut TraceReport| {
        sort_rows(&mut report.locks, args.sort);
        print!("{}", render::render(report, args.top, args.verbose));
        if args.hist {
            print!("{}", render::render_histograms(report, args.top));
        }
    };
    // Every trace drains the kernel's maps each second (or each --interval)
    // into userspace totals: a long trace on a busy system then needs map
    // room for one interval's locks, not for every lock it ever saw.
    let period = args.interval.unwrap_or(DRAIN_PERIOD);
    let mut collector = IntervalCollector::new(&tracer);
    // Reports are built only when shown: a trace without --interval
    // drains every second but makes its one report at the end.
    let mut tick = |tracer: &mut Tracer, last: bool| -> Result<Option<TraceReport>, Error> {
        let drained = collector.drain(tracer)?;
        if args.interval.is_none() {
            return last
                .then(|| collector.total_report(tracer, &drained.fill))
                .transpose();
        }
        let mut shown = if args.reset {
            collector.interval_report(tracer, &drained)?
        } else {
            collector.total_report(tracer, &drained.fill)?
        };
        let timestamp = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
        if let Some(csv) = interval_csv.as_mut() {
            csv.append(&shown, &timestamp)?;
        }
        // The last tick of a cumulative trace is the final report itself.
        if last && !args.reset {
            return Ok(Some(shown));
        }
        println!("--- {timestamp} ({:.1} s) ---", shown.duration_s);
        show(&mut shown);
        println!();
        match last {
            true => collector.total_report(tracer, &drained.fill).map(Some),
            false => Ok(None),
        }
    };
    let status = {
        let tracer = &mut tracer;
        wait_for(args.duration, child, interrupt::flag(), Some(period), || {
            tick(&mut *tracer, false).map(drop)
        })?
    };
    // The last tick always makes the whole run's report.
    let mut report = match tick(&mut tracer, true)? {
        Some(report) => report,
        None => collector.total_report(&tracer, &[])?,
    };
    drop(tracer);
    if args.reset {
        println!("--- whole run ---");
    }
    show(&mut report);
    outputs.write_with(|format| match format {
        Format::Json => serde_json::to_vec_pretty(&report).map_err(io::Error::other),
        Format::Csv => render::to_csv(&report).map_err(io::Error::other),
        Format::Folded => Ok(render::flame::folded(&report).into_bytes()),
        Format::FlameGraph => render::flame::flamegraph(&report),
        Format::Html => Ok(render::html::render_html(
            &render::html::Page::Trace {
                report: &report,
                workload: None,
            },
            args.top,
        )
        .into_bytes()),
    })?;
    if interrupt::interrupted() {
        // The report is out; the conventional status for SIGINT.
        return Err(Error::Interrupted);
    }
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
    fn create(path: &Path, by: crate::model::ByKey) -> Result<Self, Error> {
        let fail = |source| Error::Output {
            path: path.to_owned(),
            source,
        };
        let header = render::csv_block(
            &TraceReport {
                by,
                ..TraceReport::empty()
            },
            Some(""),
            true,
        )
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

    fn append(&mut self, report: &TraceReport, timestamp: &str) -> Result<(), Error> {
        let fail = |source| Error::Output {
            path: self.path.clone(),
            source,
        };
        let block =
            render::csv_block(report, Some(timestamp), false).map_err(|e| fail(io::Error::other(e)))?;
        self.file.write_all(&block).map_err(fail)?;
        self.file.sync_data().map_err(fail)
    }
}
