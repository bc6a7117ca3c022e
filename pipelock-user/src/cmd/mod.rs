//! One module per subcommand, each wiring the layers below: kernel facts,
//! programs, collection, model, views.
pub mod ab;
pub mod compare;
pub mod generate;
pub mod overhead;
pub mod probe;
pub mod report;
pub mod run;
pub mod serve;
pub mod top;
pub mod trace;

use crate::{
    Error,
    cli::{Cli, Command},
    render::metrics::Addresses,
};

/// Runs the parsed command line.
pub fn run(cli: Cli) -> Result<(), Error> {
    match cli.command {
        Command::Probe(args) => probe::run(&args, cli.ebpf_log),
        Command::Trace(args) => trace::run(&args, cli.ebpf_log),
        Command::Overhead(args) => overhead::run_command(&args),
        Command::Top(args) => top::run(top::Options {
            mode: args.tracing.mode,
            interval: args.interval,
            filters: args.filters(),
            track_locks: args.tracing.track_locks,
            by: args.by,
            load: match (args.workload, args.command.is_empty()) {
                (Some(workload), _) => top::Load::Workload(workload.name().to_owned()),
                (None, false) => top::Load::Command(args.command),
                (None, true) => top::Load::None,
            },
            ebpf_log: cli.ebpf_log,
        }),
        Command::Serve(args) => serve::run(serve::Options {
            listen: args.listen,
            mode: args.tracing.mode,
            filters: args.tracing.filters(false),
            track_locks: args.tracing.track_locks,
            per_lock_top: args.per_lock_top,
            addresses: if args.expose_addresses {
                Addresses::Exposed
            } else {
                Addresses::hidden()
            },
            interval: args.interval,
            ebpf_log: cli.ebpf_log,
            web_config: args.web_config,
        }),
        Command::Run(args) => run::run(args.workload, cli.ebpf_log),
        Command::Ab(args) => ab::run(ab::Options {
            kernels: ab::kernels_asked(&args)?,
            runs: args.runs,
            accel: args.accel,
            cpus: args.cpus,
            memory_mib: args.memory,
            timeout: args.timeout,
            json: args.json,
            command: args.command,
            verbose: args.verbose,
            detect_percent: args.detect,
        }),
        Command::AbEmit { nonce, name, file } => ab::emit(&nonce, &name, &file),
        Command::Generate { what } => generate::run(&what),
        Command::Report { result, html, top } => report::run(&result, &html, top),
        Command::Compare { a, b } => {
            print!("{}", compare::compare(&a, &b)?);
            Ok(())
        }
    }
}
