//! Where waits come from: call stacks (`--callers`, `--by caller`) and
//! threads (`--by task`). Every wait of a lock belongs to one of its
//! stacks and one thread, so the parts must add up to the lock; a helper
//! that does a known number of writes and reads must show exactly that many
//! acquisitions from the write and the read path.
use super::*;

/// `--stack-sample`'s default.
const DEFAULT_STACK_SAMPLE: u32 = 32;

fn u(value: &serde_json::Value, field: &str) -> u64 {
    value[field].as_u64().unwrap_or(0)
}

/// Whether a caller row's stack has a frame matching `part` (a piece of a
/// function name: `pipe_write` finds `pipe_write+0x1` and `anon_pipe_write+0x1`).
fn has_frame(caller: &serde_json::Value, part: &str) -> bool {
    caller["stack"].as_array().is_some_and(|frames| {
        frames
            .iter()
            .any(|f| f.as_str().is_some_and(|f| f.contains(part)))
    })
}

/// The rows of every lock add up: the contentions (and acquisitions) of its
/// callers are its own (within the sampling error where stacks were
/// sampled), and per class the threads' are the class's.
fn parts_add_up(report: &serde_json::Value) -> Result<()> {
    let locks = report["locks"].as_array().context("no locks")?;
    ensure!(!locks.is_empty(), "no lock rows");
    let sampled = locks.iter().any(|lock| {
        lock["callers"]
            .as_array()
            .is_some_and(|callers| callers.iter().any(|c| c["margin"].is_object()))
    });
    for lock in locks {
        // A lock all of whose waits were left out of the sample has none.
        let callers = lock["callers"].as_array().map_or(&[][..], Vec::as_slice);
        for field in ["contentions", "acquisitions"] {
            let sum: u64 = callers.iter().map(|c| u(c, field)).sum();
            let count = u(lock, field);
            // Where stacks were sampled (one in the default 32), the callers'
            // sum estimates the lock's exact count with a variance of at
            // most count × 31: allow four standard errors.
            let allowed = if sampled {
                4.0 * (count as f64 * f64::from(DEFAULT_STACK_SAMPLE - 1)).sqrt()
            } else {
                0.0
            };
            ensure!(
                (sum as f64 - count as f64).abs() <= allowed,
                "{}: callers' {field} add up to {sum} (±{allowed:.0}), the lock has {count}",
                lock["name"],
            );
        }
    }
    for total in report["totals"].as_array().context("no totals")? {
        let sum: u64 = report["by_task"]
            .as_array()
            .context("no by_task")?
            .iter()
            .filter(|t| t["class"] == total["class"])
            .map(|t| u(t, "contentions"))
            .sum();
        ensure!(
            sum == u(total, "contentions"),
            "{}: threads' contentions add up to {sum}, the class has {}",
            total["class"],
            u(total, "contentions")
        );
    }
    Ok(())
}

/// Hooked modes (VMs): 300 writes and 300 reads from one thread take the
/// pipe mutex 600 times: 300 from the write path's stack, 300 from the
/// read path's, all 600 by that thread. Tracepoint mode (here): the herd's
/// contended acquisitions add up by stack and by thread, and the pipe
/// mutex's come from the pipe read/write paths.
fn callers_and_tasks_account_for_every_acquisition() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    let mut checked = Vec::new();
    for mode in ["fentry", "kprobe"] {
        if let Some(why) = mode_refusal(mode)? {
            println!("  {mode}: not checked here ({why})");
            continue;
        }
        let n = 300;
        let (report, ino) = trace_helper(
            &format!("{mode}-callers"),
            &[
                "--mode",
                mode,
                "--class",
                "pipe-mutex",
                "--callers",
                "--by",
                "task",
            ],
            &["--exact-pipe-io", &n.to_string(), "plain"],
        )?;
        let ino: u64 = ino.trim().parse()?;
        parts_add_up(&report)?;
        let mutex = report["locks"]
            .as_array()
            .context("no locks")?
            .iter()
            .find(|l| l["class"] == "pipe-mutex" && l["pipe_ino"] == ino)
            .context("no row for the helper's pipe")?;
        let callers = mutex["callers"].as_array().context("no callers")?;
        for (path, want) in [("pipe_write", n), ("pipe_read", n)] {
            let from: u64 = callers
                .iter()
                .filter(|c| has_frame(c, path))
                .map(|c| u(c, "acquisitions"))
                .sum();
            ensure!(
                from == want,
                "{mode}: {from} acquisitions from {path}, want {want}: {callers:?}"
            );
        }
        let tasks: Vec<&serde_json::Value> = report["by_task"]
            .as_array()
            .context("no by_task")?
            .iter()
            .filter(|t| t["class"] == "pipe-mutex")
            .collect();
        ensure!(
            tasks.len() == 1 && u(tasks[0], "acquisitions") == 2 * n,
            "{mode}: want one thread with {} acquisitions: {tasks:?}",
            2 * n
        );
        checked.push(format!(
            "{mode}: {n} + {n} acquisitions from the write and read stacks, one thread"
        ));
    }
    if !in_vm() {
        let report = match trace_json(
            &["--mode", "tracepoint", "--callers", "--by", "task"],
            &["run", "pipe-herd", "--limit", "100000", "-q"],
        )? {
            Ok(report) => report,
            Err(skip) => return Ok(skip),
        };
        parts_add_up(&report)?;
        let mutex = report["locks"]
            .as_array()
            .context("no locks")?
            .iter()
            .find(|l| l["class"] == "pipe-mutex")
            .context("no pipe-mutex row")?;
        let from_pipe: u64 = mutex["callers"]
            .as_array()
            .context("no callers")?
            .iter()
            .filter(|c| has_frame(c, "pipe_read") || has_frame(c, "pipe_write"))
            .map(|c| u(c, "contentions"))
            .sum();
        ensure!(
            from_pipe * 10 >= u(mutex, "contentions") * 9,
            "{from_pipe} of {} contentions have a pipe read/write frame: {}",
            u(mutex, "contentions"),
            mutex["callers"]
        );
        checked.push(format!(
            "tracepoint: herd parts add up; {from_pipe} of {} pipe-mutex contentions from pipe read/write (stack_lost {})",
            u(mutex, "contentions"),
            report["drops"]["stack_lost"]
        ));
    }
    if checked.is_empty() {
        return Ok(Outcome::Skipped("no mode here to check callers in".into()));
    }
    for line in checked {
        println!("  {line}");
    }
    Ok(Outcome::Passed)
}
register!(Kernel callers_and_tasks_account_for_every_acquisition);

/// `--caller` keeps the locks (and stacks) whose waits came through a
/// matching frame, `--lock-filter` the locks named so; a glob that matches
/// no frame keeps nothing.
fn caller_and_lock_filters_keep_what_they_name() -> Result<Outcome> {
    let herd = ["run", "pipe-herd", "--limit", "50000", "-q"];
    let trace = |extra: &[&str]| -> Result<std::result::Result<serde_json::Value, Outcome>> {
        let mut args = vec!["--mode", "tracepoint"];
        args.extend(extra);
        trace_json(&args, &herd)
    };
    let writes = match trace(&["--caller", "*pipe_write*"])? {
        Ok(report) => report,
        Err(skip) => return Ok(skip),
    };
    let locks = writes["locks"].as_array().context("no locks")?;
    ensure!(!locks.is_empty(), "no lock was contended from pipe_write");
    for lock in locks {
        for caller in lock["callers"].as_array().context("no callers")? {
            ensure!(has_frame(caller, "pipe_write"), "{} kept {caller}", lock["name"]);
        }
    }
    let none = trace(&["--caller", "no_such_kernel_function"])?.map_err(|_| anyhow::anyhow!("skipped"))?;
    ensure!(
        none["locks"].as_array().is_some_and(Vec::is_empty),
        "a glob no frame matches kept {}",
        none["locks"]
    );
    let rq = trace(&["--lock-filter", "rq_lock"])?.map_err(|_| anyhow::anyhow!("skipped"))?;
    let names: Vec<&str> = rq["locks"]
        .as_array()
        .context("no locks")?
        .iter()
        .filter_map(|l| l["name"].as_str())
        .collect();
    ensure!(
        names.iter().all(|n| n.contains("rq_lock")),
        "--lock-filter rq_lock kept {names:?}"
    );
    println!(
        "  --caller *pipe_write*: {} locks; no_such_kernel_function: none; --lock-filter rq_lock: {names:?}",
        locks.len()
    );
    Ok(Outcome::Passed)
}
register!(Host caller_and_lock_filters_keep_what_they_name);
