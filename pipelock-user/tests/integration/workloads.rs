//! The built-in workloads: their figures, pinning, and what an interrupted run leaves.
use pipelock_user::{
    model::{CounterSource, Run, RunResult},
    workload::{
        herd::HerdDetails, lockref::LockrefDetails, stream::StreamDetails, throughput::ThroughputDetails,
    },
};

use super::*;

fn pipe_throughput_scores_like_unixbench() -> Result<Outcome> {
    let r = run_workload(&[
        "pipe-throughput",
        "--duration",
        "0.2",
        "--passes",
        "6",
        "--runs",
        "2",
    ])?;
    ensure!(r.runs.len() == 2, "want 2 runs, got {}", r.runs.len());
    for run in &r.runs {
        let details: ThroughputDetails = details(run)?;
        let passes = &details.pass_lps;
        ensure!(passes.len() == 6, "want 6 passes");
        ensure!(
            details.samples_kept == 4,
            "6 passes keep 4 samples (lowest third dropped)"
        );
        let mut kept = passes.clone();
        kept.sort_by(f64::total_cmp);
        let geo = (kept[2..].iter().map(|v| v.ln()).sum::<f64>() / 4.0).exp();
        let value = run.value;
        ensure!(
            (value - geo).abs() / geo < 1e-9,
            "score {value} is not the geometric mean {geo} of the kept passes"
        );
        ensure!(value > 1000.0, "implausible {value} lps");
        let index = details.index;
        ensure!((index - value / 12440.0 * 10.0).abs() < 1e-6, "index {index}");
        ensure!(
            run.counters.task_clock_ms > 100.0,
            "task-clock not counted: {:?}",
            run.counters
        );
        let operations = run.operations.as_ref().context("no operations")?;
        ensure!(
            operations.count > 0 && operations.name == "write+read pair",
            "operations: {operations:?}"
        );
    }
    ensure!(!r.system.kernel.is_empty(), "kernel not recorded");
    #[derive(serde::Deserialize)]
    struct Params {
        passes: u32,
    }
    let params: Params = params(&r)?;
    ensure!(params.passes == 6, "params not recorded: {:?}", r.params);
    Ok(Outcome::Passed)
}
register!(Host pipe_throughput_scores_like_unixbench);

fn pipe_herd_reaches_its_limit() -> Result<Outcome> {
    let r = run_workload(&["pipe-herd", "-k", "3", "--limit", "20000"])?;
    let run = r.runs.first().context("no run")?;
    #[derive(serde::Deserialize)]
    struct Params {
        processes: u64,
    }
    let params: Params = params(&r)?;
    ensure!(params.processes == 8, "2^3 processes: {:?}", r.params);
    let last = details::<HerdDetails>(run)?.final_count;
    ensure!(last >= 20000, "the herd stopped at {last}");
    ensure!(
        run.operations.as_ref().is_some_and(|o| o.count == last),
        "a token passed is an operation: {:?}",
        run.operations
    );
    // The herd runs in children, so this also checks that counters include
    // them: the waiting parent alone switches a handful of times and runs
    // well under a millisecond. The herd switches ~1000 times on a quiet
    // machine, but on a busy one more tokens pass per wake-up (16 switches
    // were seen); its 40 000 reads and writes take 4 ms or more of CPU
    // all the same (9 ms on that busy machine).
    let (switches, cpu_ms) = (run.counters.context_switches, run.counters.task_clock_ms);
    ensure!(switches > 100 || cpu_ms >= 4.0, "counters: {:?}", run.counters);
    Ok(Outcome::Passed)
}
register!(Host pipe_herd_reaches_its_limit);

fn pipe_stream_moves_exactly_the_bytes_asked() -> Result<Outcome> {
    for sink in ["dev-null", "pipe"] {
        let r = run_workload(&["pipe-stream", "--bytes", "64M", "--sink", sink])?;
        let bytes = details::<StreamDetails>(r.runs.first().context("no run")?)?.bytes;
        ensure!(
            bytes == 64 << 20,
            "{sink}: moved {bytes} bytes, asked {}",
            64 << 20
        );
    }
    let out = run(pipelock().args(["run", "pipe-stream", "--bytes", "8M", "-q"]))?;
    ensure!(
        text(&out.stdout).contains("Piped 8.00 MB in 00h00m"),
        "no pipebench line:\n{}",
        text(&out.stdout)
    );
    Ok(Outcome::Passed)
}
register!(Host pipe_stream_moves_exactly_the_bytes_asked);

fn lockref_stat_counts_every_worker() -> Result<Outcome> {
    let cases: [(&[&str], usize); 3] = [
        (&["lockref-stat", "--threads", "2", "--duration", "0.3"], 2),
        (
            &[
                "lockref-stat",
                "--procs",
                "2",
                "--duration",
                "0.3",
                "--mode",
                "separate",
                "--op",
                "open-close",
            ],
            2,
        ),
        (
            &[
                "lockref-stat",
                "--threads",
                "1",
                "--duration",
                "0.2",
                "--path",
                "/proc/self/status",
                "--op",
                "access",
            ],
            1,
        ),
    ];
    for (args, expected_workers) in cases {
        let r = run_workload(args)?;
        let details: LockrefDetails = details(r.runs.first().context("no run")?)?;
        let per_worker = &details.per_worker;
        ensure!(
            per_worker.iter().all(|&c| c > 0),
            "{args:?}: a worker did nothing: {per_worker:?}"
        );
        ensure!(
            per_worker.iter().sum::<u64>() == details.total,
            "total mismatch: {details:?}"
        );
        ensure!(
            per_worker.len() == expected_workers,
            "{args:?}: {} workers",
            per_worker.len()
        );
    }
    Ok(Outcome::Passed)
}
register!(Host lockref_stat_counts_every_worker);

fn interrupted_herd_leaves_no_process_and_a_report() -> Result<Outcome> {
    // A limit no run reaches, unique so only this test's processes match.
    let limit = format!("{}", 900_000_000 + std::process::id());
    let json = scratch("interrupted.json");
    let child = pipelock()
        .args([
            "run",
            "pipe-herd",
            "-k",
            "4",
            "--limit",
            &limit,
            "--runs",
            "3",
            "-q",
            "--json",
        ])
        .arg(&json)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while processes_with(&limit).len() < 17 {
        ensure!(
            std::time::Instant::now() < deadline,
            "the herd of 16 never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // SAFETY: signalling our own child, as Ctrl-C would.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output()?;
    std::thread::sleep(std::time::Duration::from_millis(200));
    let left = processes_with(&limit);
    let report = fs::read_to_string(&json);
    let _ = fs::remove_file(&json);
    ensure!(
        left.is_empty(),
        "{} workload processes survived Ctrl-C: {left:?}",
        left.len()
    );
    ensure!(out.status.code() == Some(130), "exit {} (want 130)", out.status);
    ensure!(
        text(&out.stdout).contains("interrupted: 0 run(s) finished"),
        "no report: {}",
        text(&out.stdout)
    );
    let report: RunResult = serde_json::from_str(&report.context("no JSON written on Ctrl-C")?)?;
    ensure!(report.interrupted, "JSON does not say interrupted");
    Ok(Outcome::Passed)
}
register!(Host interrupted_herd_leaves_no_process_and_a_report);

/// `--cpus 0`: every thread runs on CPU 0, so none migrates, and the report
/// records the pinning.
fn cpus_pin_every_worker() -> Result<Outcome> {
    let r = run_workload(&["pipe-herd", "-k", "2", "--limit", "5000", "--cpus", "0"])?;
    ensure!(
        r.system.cpus_pinned.as_deref() == Some(&[0][..]),
        "pinning not recorded: {:?}",
        r.system
    );
    let counters = &r.runs.first().context("no run")?.counters;
    if counters.source == CounterSource::PerfEvent {
        ensure!(
            counters.cpu_migrations == 0,
            "pinned to one CPU, yet migrations: {counters:?}"
        );
    }
    ensure!(
        counters.context_switches > 0,
        "4 processes on one CPU never switched"
    );
    Ok(Outcome::Passed)
}
register!(Host cpus_pin_every_worker);

/// A run's details as its workload's type; a missing or renamed field fails.
fn details<T: serde::de::DeserializeOwned>(run: &Run) -> Result<T> {
    T::deserialize(&run.details).with_context(|| format!("the run's details: {}", run.details))
}

/// The result's parameters as `T`; a missing or renamed one fails.
fn params<T: serde::de::DeserializeOwned>(result: &RunResult) -> Result<T> {
    T::deserialize(serde_json::Value::Object(result.params.clone()))
        .with_context(|| format!("the parameters: {:?}", result.params))
}

/// Runs `pipelock run ARGS --json F -q` and returns the parsed result file.
pub(crate) fn run_workload(args: &[&str]) -> Result<RunResult> {
    let json = scratch(&format!("{}.json", args[0]));
    let out = run(pipelock()
        .arg("run")
        .args(args)
        .arg("--json")
        .arg(&json)
        .arg("--quiet"))?;
    let result = fs::read_to_string(&json);
    let _ = fs::remove_file(&json);
    ensure!(
        out.status.success(),
        "pipelock run {args:?}: {}",
        text(&out.stderr)
    );
    Ok(serde_json::from_str(&result?)?)
}
