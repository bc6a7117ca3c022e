//! The commands that watch the system as it runs: `top` (a terminal) and
//! `serve` (Prometheus).
use std::time::Duration;

use clap::Args;

use super::{TracingArgs, by_parser};
use crate::{bpf::Filters, model::ByKey, units::parse_seconds, workload::WorkloadName};

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
    /// Export lock names as they are, kernel addresses included. By default
    /// an unnamed lock's address becomes `lock-` and a stable id that does
    /// not reveal it (a kernel address tells a scraper what KASLR hides).
    #[arg(long)]
    pub expose_addresses: bool,
    /// TLS and basic auth from a web configuration file in the format of the
    /// Prometheus exporter-toolkit (`tls_server_config`, `basic_auth_users`
    /// with bcrypt hashes), read and checked before anything is attached.
    #[arg(long, value_name = "FILE")]
    pub web_config: Option<std::path::PathBuf>,
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
    /// What a row is: lock (each lock instance), caller (each call stack,
    /// across locks of a class; implies --callers), task (each thread). `b`
    /// switches between locks and what was recorded.
    #[arg(long, value_name = "KEY", default_value = "lock", value_parser = by_parser())]
    pub by: ByKey,
    /// Run a built-in workload, again each time it ends, while watching.
    #[arg(long, value_enum, value_name = "WORKLOAD", conflicts_with = "command")]
    pub workload: Option<WorkloadName>,
    /// A command to run while watching (its output is discarded).
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

impl TopArgs {
    /// What is recorded: the tracing filters plus what `--by` needs.
    pub fn filters(&self) -> Filters {
        let mut filters = self
            .tracing
            .filters(self.workload.is_some() || !self.command.is_empty());
        filters.callers |= self.by == ByKey::Caller;
        filters.by_task = self.by == ByKey::Task;
        filters
    }
}
