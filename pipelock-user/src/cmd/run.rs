//! `pipelock run WORKLOAD [--trace]`: a built-in workload, repeated, with its
//! figures; with `--trace`, the lock report of the class it is about.
use crate::{
    Error,
    bpf::Filters,
    cli::WorkloadCommand,
    collect::{Background, DRAIN_PERIOD, Flow, Tracer},
    model::{ClassSet, LockClass},
    render,
    workload::{
        self, Workload, herd::PipeHerd, lockref::LockrefStat, report::Run, stream::PipeStream,
        throughput::PipeThroughput,
    },
};

/// Lock rows `run --trace` prints (as `pipelock trace`'s default --top).
const TRACE_TOP_ROWS: usize = 20;

pub fn run(command: WorkloadCommand, ebpf_log: bool) -> Result<(), Error> {
    // `--trace` records the lock class the workload is about.
    let (workload, common, trace, classes): (Box<dyn Workload>, _, _, _) = match command {
        WorkloadCommand::PipeThroughput { args, common, trace } => {
            (Box::new(PipeThroughput(args)), common, trace, ClassSet::DEFAULT)
        }
        WorkloadCommand::PipeHerd { args, common, trace } => {
            (Box::new(PipeHerd(args)), common, trace, ClassSet::DEFAULT)
        }
        WorkloadCommand::PipeStream { args, common, trace } => {
            (Box::new(PipeStream(args)), common, trace, ClassSet::DEFAULT)
        }
        WorkloadCommand::LockrefStat { args, common, trace } => (
            Box::new(LockrefStat::new(args)?),
            common,
            trace,
            ClassSet::of(&[LockClass::Lockref]),
        ),
    };
    // The workload's processes are this one's children and theirs. The
    // maps are drained each second while it runs, as by `pipelock trace`.
    let collector = if trace.trace {
        let filters = Filters {
            follow_children: true,
            classes,
            ..Filters::default()
        };
        let tracer = Tracer::attach(trace.trace_mode, &filters, ebpf_log)?;
        Some(Background::start_in_parts(
            tracer,
            DRAIN_PERIOD,
            |collector, tracer| collector.drain(tracer).map(|_| Flow::Continue),
            |collector, tracer| {
                let drained = collector.drain(tracer)?;
                collector.total_report(tracer, &drained.fill).map(Some)
            },
        )?)
    } else {
        None
    };
    // Both hooks below use it, one after the other.
    let collector = std::cell::RefCell::new(collector);
    // Each run's own part of the trace, so `compare` has one value per run
    // to judge a percentile by; the trace of all runs goes into the result
    // file too, taken once the runs end.
    let mut after_each = |run: &mut Run| {
        if let Some(collector) = collector.borrow().as_ref() {
            run.trace = Some(collector.end_part()?);
        }
        Ok(())
    };
    let mut traced = None;
    let mut finish = |report: &mut workload::report::Report| {
        if let Some(collector) = collector.borrow_mut().take() {
            let trace = collector.finish()?;
            report.trace.clone_from(&trace);
            traced = trace;
        }
        Ok(())
    };
    let report = workload::run_then(workload.as_ref(), &common, &mut after_each, &mut finish)?;
    print!(
        "{}",
        workload::report::render(&report, &workload.describe_summary(&report))
    );
    if let Some(trace) = traced {
        println!();
        print!("{}", render::render(&trace, TRACE_TOP_ROWS, false));
    }
    if report.interrupted {
        Err(Error::Interrupted)
    } else {
        Ok(())
    }
}
