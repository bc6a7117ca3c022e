//! Call stacks checked against an independent tool: `perf lock record`
//! keeps each contention's kernel call chain; pipelock's callers (sampled
//! under the herd's contention) must name the same top callers, with
//! counts within 2 % or within their stated margin.
use std::collections::HashMap;

use super::*;

/// Frames shown per caller on both sides.
const DEPTH: usize = 3;
/// Callers compared, pipelock's busiest first.
const TOP: usize = 5;

/// perf's `contention_end` records per lock address, each as its kernel
/// frames (`anon_pipe_write+0x53`, …), innermost first.
fn perf_chains(perf: &str, data: &Path) -> Result<HashMap<u64, Vec<Vec<String>>>> {
    let script = run(Command::new(perf)
        .args(["script", "-F", "event,trace,ip,sym,symoff", "-i"])
        .arg(data))?;
    ensure!(script.status.success(), "perf script: {}", text(&script.stderr));
    let mut chains: HashMap<u64, Vec<Vec<String>>> = HashMap::new();
    for record in text(&script.stdout).split("\n\n") {
        let mut lines = record.lines();
        let Some(addr) = lines
            .next()
            .and_then(|l| l.trim().strip_prefix("lock:contention_end:"))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok())
        else {
            continue;
        };
        let frames = lines
            .filter_map(|line| {
                let mut words = line.split_whitespace();
                let ip = words.next()?;
                // Kernel frames only: user frames follow them.
                ip.starts_with("ffffffff")
                    .then(|| words.next().map(str::to_owned))?
            })
            .collect();
        chains.entry(addr).or_default().push(frames);
    }
    Ok(chains)
}

/// How many of `chains` pass through `stack` (its frames in a row).
fn through(chains: &[Vec<String>], stack: &[String]) -> u64 {
    chains
        .iter()
        .filter(|frames| frames.windows(stack.len()).any(|w| w == stack))
        .count() as u64
}

fn callers_agree_with_perf_lock_call_chains() -> Result<Outcome> {
    let Some(perf) = perf_binary() else {
        return Ok(Outcome::Skipped(
            "perf is not installed (Debian: linux-perf)".into(),
        ));
    };
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    let data = scratch("callers-perf.data");
    let json = scratch("callers-perf.json");
    let bin = pipelock_path();
    let mut void = 0;
    for attempt in 1..=3 {
        let out = run(pipelock()
            .args(["trace", "--mode", "tracepoint", "--callers", "--stack-depth"])
            .arg(DEPTH.to_string())
            .arg("--json")
            .arg(&json)
            .args(["--", perf, "lock", "record", "-m", "16384", "-o"])
            .arg(&data)
            .args([
                "--",
                &bin,
                "run",
                "pipe-herd",
                "-k",
                "5",
                "--limit",
                "400000",
                "-q",
            ]))?;
        let report = fs::read_to_string(&json);
        let _ = fs::remove_file(&json);
        ensure!(
            out.status.success(),
            "trace + perf lock record: {}",
            text(&out.stderr)
        );
        if perf_lost(perf, &data)? {
            println!("  attempt {attempt}: perf lost events; the run is void");
            void += 1;
            continue;
        }
        let report = parse_report(&report?)?;
        let chains = perf_chains(perf, &data)?;
        let _ = fs::remove_file(&data);
        // (lock, stack) → (pipelock's count, its margin)
        let mut ours: Vec<(u64, Vec<String>, u64, u64)> = Vec::new();
        let mut sampled = false;
        for lock in &report.locks {
            for caller in &lock.callers {
                sampled |= caller.margin.is_some();
                ours.push((
                    lock.lock_addr,
                    caller.stack.clone(),
                    caller.contentions,
                    caller.margin.map_or(0, |m| m.contentions),
                ));
            }
        }
        ours.sort_by_key(|o| std::cmp::Reverse(o.2));
        ensure!(ours.len() >= TOP, "fewer than {TOP} callers: {ours:?}");
        let mut theirs: Vec<(u64, &Vec<String>, u64)> = ours
            .iter()
            .map(|(addr, stack, ..)| {
                (
                    *addr,
                    stack,
                    through(chains.get(addr).map_or(&[][..], Vec::as_slice), stack),
                )
            })
            .collect();
        theirs.sort_by_key(|t| std::cmp::Reverse(t.2));
        for (rank, (addr, stack, count, margin)) in ours.iter().take(TOP).enumerate() {
            let perf_count = through(chains.get(addr).map_or(&[][..], Vec::as_slice), stack);
            // Twice the 95 % margin: about four standard errors.
            let allowed = (perf_count as f64 * 0.02).max(2.0 * *margin as f64).max(1.0);
            ensure!(
                (*count as f64 - perf_count as f64).abs() <= allowed,
                "{addr:#x} {}: pipelock {count} (±{margin}) vs perf {perf_count}",
                stack.join(" < ")
            );
            // Ranks may swap where counts are within the margins; the
            // busiest three must be among perf's busiest five.
            if rank < 3 {
                ensure!(
                    theirs.iter().take(TOP).any(|(a, s, _)| a == addr && *s == stack),
                    "{addr:#x} {} is pipelock's #{} but not in perf's top {TOP}: {theirs:?}",
                    stack.join(" < "),
                    rank + 1
                );
            }
            println!(
                "  #{} {}: pipelock {count} ±{margin}, perf {perf_count}",
                rank + 1,
                stack.join(" < ")
            );
        }
        println!(
            "  stacks {}",
            if sampled {
                "sampled (the herd's contention is heavy)"
            } else {
                "all unwound"
            }
        );
        return Ok(Outcome::Passed);
    }
    let _ = fs::remove_file(&data);
    Ok(Outcome::Skipped(format!(
        "perf lost events in all {void} runs, even with a 64 MiB ring: nothing to compare"
    )))
}
register!(Host callers_agree_with_perf_lock_call_chains);
