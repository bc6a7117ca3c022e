//! `pipelock run WORKLOAD [--trace]`: a built-in workload, repeated, with its
//! figures; with `--trace`, the lock report of the class it is about.
use std::fs;

use crate::{
    Error,
    bpf::Filters,
    cli::WorkloadCommand,
    collect::Tracer,
    model::{ClassSet, LockClass},
    render,
    workload::{
        self, Workload, herd::PipeHerd, lockref::LockrefStat, stream::PipeStream, throughput::PipeThroughput,
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
    // The workload's processes are all named like this binary.
    let tracer = if trace.trace {
        let filters = Filters {
            tgid: None,
            comm: Some(own_comm()),
            classes,
        };
        Some(Tracer::attach(trace.trace_mode, &filters, ebpf_log)?)
    } else {
        None
    };
    let report = workload::run(workload.as_ref(), &common)?;
    print!("{}", report.render(&workload.describe_summary(&report)));
    if let Some(tracer) = tracer {
        println!();
        print!("{}", render::render(&tracer.report()?, TRACE_TOP_ROWS));
    }
    if report.interrupted {
        Err(Error::Interrupted)
    } else {
        Ok(())
    }
}

/// This process's comm (the kernel's 15-byte task name).
fn own_comm() -> String {
    fs::read_to_string("/proc/self/comm")
        .map(|c| c.trim().to_owned())
        .unwrap_or_else(|_| "pipelock".into())
}
