//! The long-running views: `top` (a terminal) and `serve` (Prometheus).
use std::time::Duration;

use clap::Args;

use super::TracingArgs;
use crate::units::parse_seconds;

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub tracing: TracingArgs,
    /// Where to answer scrapes, HOST:PORT.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9435")]
    pub listen: String,
    /// Locks exported one by one (busiest by wait), each with a `lock`
    /// label; the others count only in their class.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub per_lock_top: usize,
    /// How often the kernel maps are drained into the exported totals.
    #[arg(long, value_name = "SECS", default_value = "1", value_parser = parse_seconds, allow_negative_numbers = true)]
    pub interval: Duration,
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
