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
    let programs = report["programs"].as_array().context("no programs array")?;
    let runs = |name: &str| {
        programs
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["run_count"].as_u64())
            .unwrap_or(0)
    };
    let (begins, ends) = (
        runs(programs::EMPTY_CONTENTION_BEGIN),
        runs(programs::EMPTY_CONTENTION_END),
    );
    ensure!(
        begins > 0 && ends > 0,
        "a herd of 32 on one pipe, yet the empty programs ran {begins} and {ends} times: {programs:?}"
    );
    // Following the command's processes is the trace's, not a probe's.
    let others: Vec<&str> = programs
        .iter()
        .filter(|p| p["run_count"].as_u64().unwrap_or(0) > 0)
        .filter_map(|p| p["name"].as_str())
        .filter(|name| !name.starts_with("empty_") && !name.starts_with("follow_"))
        .collect();
    ensure!(
        others.is_empty(),
        "pipelock's own programs ran beside the empty ones: {others:?}"
    );
    ensure!(
        report["locks"].as_array().is_some_and(Vec::is_empty),
        "lock rows from empty programs: {}",
        report["locks"]
    );
    println!(
        "  tracepoint, empty programs: {begins} contention_begin and {ends} contention_end runs, nothing else"
    );
    Ok(Outcome::Passed)
}
register!(Kernel empty_tracepoint_programs_run_alone);
