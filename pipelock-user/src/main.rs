use std::process::ExitCode;

use clap::Parser as _;
use pipelock_user::{
    Error,
    attach::{AttachSupport, Support},
    cli::{Cli, Command, ProbeArgs},
    error::one_line,
    inspector::KernelInspector,
    privilege, probe, selftest,
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_level = if cli.ebpf_log { "info" } else { "warn" };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default_level))
        .format_timestamp(None)
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("pipelock: error: {}", one_line(&err));
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), Error> {
    match cli.command {
        Command::Probe(args) => run_probe(&args, cli.ebpf_log),
    }
}

fn run_probe(args: &ProbeArgs, ebpf_log: bool) -> Result<(), Error> {
    if let Some(dir) = &args.kernel_facts {
        let not_tested = || Support::NotTested(format!("facts read from {}", dir.display()));
        let given = AttachSupport {
            fentry: not_tested(),
            kprobe: not_tested(),
            tracepoint: not_tested(),
            tp_btf: not_tested(),
        };
        let report = probe::gather(&KernelInspector::at(dir), probe::Checks::Given(given))?;
        print!("{}", probe::render(&report));
        return Ok(());
    }
    privilege::require()?;
    let report = probe::gather(&KernelInspector::live(), probe::Checks::Live)?;
    print!("{}", probe::render(&report));
    if args.self_test {
        println!();
        print!("{}", selftest::run(args.duration, ebpf_log)?.render());
    }
    Ok(())
}
