//! The empty programs `pipelock overhead` measures its floor with
//! (`--empty-programs`): in tracepoint mode they must run on the very
//! events pipelock's programs use, and nothing of pipelock's may run beside
//! them, or the floor is not the floor.
use super::*;

fn empty_tracepoint_programs_run_alone() -> Result<Outcome> {
    let limit = if in_vm() { "30000" } else { "100000" };
    let report = match trace_json(
        &["--mode", "tracepoint", "--empty-programs", "--bpf-stats"],
        &["run", "pipe-herd", "-k", "5", "--limit", limit, "-q"],
    )? {
        Ok(report) => report,
        Err(skip) => return Ok(skip),
    };
    let programs = &report.programs;
    let runs = |name: &str| {
        programs
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.run_count)
            .with_context(|| format!("no program {name}: {}", shown(programs)))
    };
    let (begins, ends) = (
        runs(programs::EMPTY_CONTENTION_BEGIN)?,
        runs(programs::EMPTY_CONTENTION_END)?,
    );
    ensure!(
        begins > 0 && ends > 0,
        "a herd of 32 on one pipe, yet the empty programs ran {begins} and {ends} times: {}",
        shown(programs)
    );
    // Following the command's processes is the trace's, not a probe's.
    let others: Vec<&str> = programs
        .iter()
        .filter(|p| p.run_count > 0)
        .map(|p| p.name.as_str())
        .filter(|name| !name.starts_with("empty_") && !name.starts_with("follow_"))
        .collect();
    ensure!(
        others.is_empty(),
        "pipelock's own programs ran beside the empty ones: {others:?}"
    );
    ensure!(
        report.locks.is_empty(),
        "lock rows from empty programs: {}",
        shown(&report.locks)
    );
    println!(
        "  tracepoint, empty programs: {begins} contention_begin and {ends} contention_end runs, nothing else"
    );
    Ok(Outcome::Passed)
}
register!(Kernel empty_tracepoint_programs_run_alone);
