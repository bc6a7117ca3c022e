//! Where waits come from: call stacks (`--callers`, `--by caller`) and
//! threads (`--by task`). Every wait of a lock belongs to one of its
//! stacks and one thread, so the parts must add up to the lock; a helper
//! that does a known number of writes and reads must show exactly that many
//! acquisitions from the write and the read path.
use pipelock_user::model::{CallerRow, LockClass, TaskRow, TraceReport};

use super::*;

/// `--stack-sample`'s default.
const DEFAULT_STACK_SAMPLE: u32 = 32;

/// Whether a caller row's stack has a frame matching `part` (a piece of a
/// function name: `pipe_write` finds `pipe_write+0x1` and `anon_pipe_write+0x1`).
fn has_frame(caller: &CallerRow, part: &str) -> bool {
    caller.stack.iter().any(|f| f.contains(part))
}

/// The rows of every lock add up: the contentions (and acquisitions) of its
/// callers are its own (within the sampling error where stacks were
/// sampled), and per class the threads' are the class's.
fn parts_add_up(report: &TraceReport) -> Result<()> {
    ensure!(!report.locks.is_empty(), "no lock rows");
    let sampled = report
        .locks
        .iter()
        .any(|lock| lock.callers.iter().any(|c| c.margin.is_some()));
    for lock in &report.locks {
        // A lock all of whose waits were left out of the sample has none.
        let callers = &lock.callers;
        let acquisitions = match lock.acquisitions {
            Some(count) => {
                let sum = callers
                    .iter()
                    .map(|c| {
                        c.acquisitions
                            .context("a hooked mode's caller row without acquisitions")
                    })
                    .sum::<Result<u64>>()?;
                Some((sum, count))
            }
            None => {
                ensure!(
                    callers.iter().all(|c| c.acquisitions.is_none()),
                    "{}: callers count acquisitions the lock does not: {}",
                    lock.name,
                    shown(callers)
                );
                None
            }
        };
        let contentions = (callers.iter().map(|c| c.contentions).sum(), lock.contentions);
        for (field, figures) in [("contentions", Some(contentions)), ("acquisitions", acquisitions)] {
            let Some((sum, count)) = figures else { continue };
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
                lock.name,
            );
        }
    }
    for total in &report.totals {
        let sum: u64 = report
            .by_task
            .iter()
            .filter(|t| t.class == total.class)
            .map(|t| t.contentions)
            .sum();
        ensure!(
            sum == total.contentions,
            "{:?}: threads' contentions add up to {sum}, the class has {}",
            total.class,
            total.contentions
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
        let mutex =
            row_of(&pipe_rows(&report, ino), LockClass::PipeMutex).context("no row for the helper's pipe")?;
        let callers = &mutex.callers;
        for (path, want) in [("pipe_write", n), ("pipe_read", n)] {
            let from: u64 = callers
                .iter()
                .filter(|c| has_frame(c, path))
                .filter_map(|c| c.acquisitions)
                .sum();
            ensure!(
                from == want,
                "{mode}: {from} acquisitions from {path}, want {want}: {}",
                shown(callers)
            );
        }
        let tasks: Vec<&TaskRow> = report
            .by_task
            .iter()
            .filter(|t| t.class == Some(LockClass::PipeMutex))
            .collect();
        ensure!(
            tasks.len() == 1 && tasks[0].acquisitions == Some(2 * n),
            "{mode}: want one thread with {} acquisitions: {}",
            2 * n,
            shown(&tasks)
        );
        checked.push(format!(
            "{mode}: {n} + {n} acquisitions from the write and read stacks, one thread"
        ));
    }
    if !in_vm() {
        let report = match trace_contended(
            &["--mode", "tracepoint", "--callers", "--by", "task"],
            &["run", "pipe-herd", "--limit", "100000", "-q"],
        )? {
            Ok(report) => report,
            Err(skip) => return Ok(skip),
        };
        parts_add_up(&report)?;
        let mutex = report
            .locks
            .iter()
            .find(|l| l.class == Some(LockClass::PipeMutex))
            .context("no pipe-mutex row")?;
        let from_pipe: u64 = mutex
            .callers
            .iter()
            .filter(|c| has_frame(c, "pipe_read") || has_frame(c, "pipe_write"))
            .map(|c| c.contentions)
            .sum();
        ensure!(
            from_pipe * 10 >= mutex.contentions * 9,
            "{from_pipe} of {} contentions have a pipe read/write frame: {}",
            mutex.contentions,
            shown(&mutex.callers)
        );
        let stack_lost = report
            .drops
            .get("stack_lost")
            .context("no stack_lost among the drops")?;
        checked.push(format!(
            "tracepoint: herd parts add up; {from_pipe} of {} pipe-mutex contentions from pipe read/write (stack_lost {stack_lost})",
            mutex.contentions
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
    let trace = |extra: &[&str]| -> Result<std::result::Result<TraceReport, Outcome>> {
        let mut args = vec!["--mode", "tracepoint"];
        args.extend(extra);
        trace_json(&args, &herd)
    };
    let writes = match trace_contended(&["--mode", "tracepoint", "--caller", "*pipe_write*"], &herd)? {
        Ok(report) => report,
        Err(skip) => return Ok(skip),
    };
    let locks = &writes.locks;
    ensure!(!locks.is_empty(), "no lock was contended from pipe_write");
    for lock in locks {
        for caller in &lock.callers {
            ensure!(
                has_frame(caller, "pipe_write"),
                "{} kept {}",
                lock.name,
                shown(caller)
            );
        }
    }
    let none = trace(&["--caller", "no_such_kernel_function"])?.map_err(|_| anyhow::anyhow!("skipped"))?;
    ensure!(
        none.locks.is_empty(),
        "a glob no frame matches kept {}",
        shown(&none.locks)
    );
    let rq = trace(&["--lock-filter", "rq_lock"])?.map_err(|_| anyhow::anyhow!("skipped"))?;
    let names: Vec<&str> = rq.locks.iter().map(|l| l.name.as_str()).collect();
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
