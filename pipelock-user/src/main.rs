use std::process::ExitCode;

use clap::Parser as _;
use pipelock_user::{Error, cli::Cli, cmd, error::one_line};

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
    match cmd::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        // The report was printed; the conventional exit status for SIGINT.
        Err(Error::Interrupted) => ExitCode::from(130),
        // Distinct from a failed run (1) and bad arguments (2).
        Err(err @ Error::Unsafe { .. }) => {
            eprintln!("pipelock: {}", one_line(&err));
            ExitCode::from(3)
        }
        Err(err) => {
            eprintln!("pipelock: error: {}", one_line(&err));
            ExitCode::FAILURE
        }
    }
}
