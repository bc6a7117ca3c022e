//! Counts checked against an independent tool: `perf lock record` on the same run.
use pipelock_user::workload::report::Report as RunResult;

use super::*;

/// Cross-check against an independent tool: `perf lock record` and
/// `pipelock trace` watch the same herd; for every pipe lock pipelock reports,
/// its contention count must equal perf's `lock:contention_end` count at that
/// address within 2 %.
fn trace_counts_agree_with_perf_lock() -> Result<Outcome> {
    let Some(perf) = perf_binary() else {
        return Ok(Outcome::Skipped(
            "perf is not installed (Debian: linux-perf)".into(),
        ));
    };
    let data = scratch("perf.data");
    let data_arg = data.to_str().context("non-UTF-8 temp path")?;
    let bin = pipelock_path();
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    // perf's ring can overflow under the herd (it says so: LOST events);
    // such a run is void and measured again. A mismatch is measured again
    // once, and two in a row fail.
    let mut tries = Tries::default();
    for attempt in 1..=3 {
        let json = scratch("perf-trace.json");
        let out = run(pipelock()
            .args(["trace", "--mode", "tracepoint", "--json"])
            .arg(&json)
            .args([
                "--", perf, "lock", "record", "-m", "16384", "-o", data_arg, "--", &bin,
            ])
            .args(["run", "pipe-herd", "-k", "5", "--limit", "100000", "-q"]))?;
        let text_json = fs::read_to_string(&json);
        let _ = fs::remove_file(&json);
        ensure!(
            out.status.success(),
            "trace + perf lock record: {}",
            text(&out.stderr)
        );
        let report = parse_report(&text_json?)?;
        match compare_with_perf(perf, &data, &report) {
            Ok(Ok(compared)) => {
                println!("  compared {compared} pipe lock(s) with perf lock record");
                return Ok(Outcome::Passed);
            }
            outcome => tries.record(attempt, outcome)?,
        }
    }
    Ok(tries.skipped())
}

/// The attempts of a comparison with perf that did not pass.
#[derive(Default)]
struct Tries {
    void: Vec<&'static str>,
    disagreed: Option<String>,
}

impl Tries {
    /// A void run (perf lost events, or saw no contention) or a first
    /// disagreement is noted; a second disagreement fails.
    fn record(
        &mut self,
        attempt: usize,
        outcome: Result<std::result::Result<usize, &'static str>>,
    ) -> Result<()> {
        match outcome {
            Ok(Err(void)) => {
                self.void.push(void);
                println!("  attempt {attempt}: {void}: void, measuring again");
            }
            // A comparison that passed ends the test at its caller.
            Ok(Ok(_)) => {}
            Err(err) if self.disagreed.is_none() => {
                println!("  attempt {attempt} disagreed ({err:#}); measuring again");
                self.disagreed = Some(format!("{err:#}"));
            }
            Err(err) => return Err(err.context("twice in a row")),
        }
        Ok(())
    }

    /// Every attempt void or disagreeing once: nothing was compared.
    fn skipped(&self) -> Outcome {
        Outcome::Skipped(format!(
            "nothing to compare against in {} of 3 runs ({}){}",
            self.void.len(),
            self.void.join("; "),
            self.disagreed
                .as_ref()
                .map_or_else(String::new, |d| format!("; the one compared run disagreed: {d}"))
        ))
    }
}
register!(Host trace_counts_agree_with_perf_lock);

/// `pipelock run … --trace` drains the maps each second like `trace`:
/// over a herd of several seconds (several drains), the report in its
/// result file still has perf's count at every pipe lock.
fn run_trace_counts_agree_with_perf_lock() -> Result<Outcome> {
    let Some(perf) = perf_binary() else {
        return Ok(Outcome::Skipped(
            "perf is not installed (Debian: linux-perf)".into(),
        ));
    };
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    let data = scratch("run-perf.data");
    let mut tries = Tries::default();
    for attempt in 1..=3 {
        let json = scratch("run-trace.json");
        let started = std::time::Instant::now();
        let out = run(Command::new(perf)
            .args(["lock", "record", "-m", "16384", "-o"])
            .arg(&data)
            .arg("--")
            .arg(pipelock_path())
            .args([
                "run",
                "pipe-herd",
                "-k",
                "5",
                "--limit",
                "600000",
                "-q",
                "--trace",
                "--trace-mode",
                "tracepoint",
                "--json",
            ])
            .arg(&json))?;
        let elapsed = started.elapsed();
        let text_json = fs::read_to_string(&json);
        let _ = fs::remove_file(&json);
        ensure!(
            out.status.success(),
            "perf lock record -- pipelock run --trace: {}",
            text(&out.stderr)
        );
        let result: RunResult = serde_json::from_str(&text_json?).context("not a pipelock run result")?;
        let trace = result.trace.as_ref().context("the result file has no trace")?;
        ensure!(
            elapsed.as_secs_f64() > 2.0,
            "the herd took {elapsed:?}: fewer than two drains"
        );
        match compare_with_perf(perf, &data, trace) {
            Ok(Ok(compared)) => {
                println!(
                    "  compared {compared} pipe lock(s) over {:.1} s with perf lock record",
                    elapsed.as_secs_f64()
                );
                return Ok(Outcome::Passed);
            }
            outcome => tries.record(attempt, outcome)?,
        }
    }
    Ok(tries.skipped())
}
register!(Host run_trace_counts_agree_with_perf_lock);
