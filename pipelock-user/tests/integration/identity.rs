//! Lock identity under churn: freed and reused pipes get their own rows, many pipes at once are named or counted, memory stays flat.
use pipelock_user::model::{LockClass, LockRow};

use super::*;

/// Pipes made and freed one after another, each contended by 2 writers and
/// 2 readers: new pipes land at freed pipes' addresses, and each must still
/// be its own row, named with its own inode. In every mode that attaches
/// here; on a host with perf, the per-address contentions of the tracepoint
/// run must equal `perf lock record`'s on the same run.
fn churned_pipes_each_get_their_own_row() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    const PIPES: usize = 500;
    // Enough messages that each pipe is contended (tracepoint mode sees
    // nothing else) even when the scheduler is unkind.
    let messages = if in_vm() { "100" } else { "1000" };
    let comm = own_comm()?;
    let mut covered = Vec::new();
    // Tracepoint mode runs twice: alone, for the share of pipes with their
    // own row (perf's own tracing changes how often the churn contends:
    // under it 82-92 % of the pipes see any contention at all, perf's count
    // and pipelock's alike), and under `perf lock record`, for the counts.
    let runs = [
        ("fentry", false),
        ("kprobe", false),
        ("tracepoint", false),
        ("tracepoint", true),
    ];
    for (mode, with_perf) in runs {
        if let Some(why) = mode_refusal(mode)? {
            if !with_perf {
                println!("  {mode}: not covered here ({why})");
            }
            continue;
        }
        let (json, inodes) = (
            scratch(&format!("churn-{mode}.json")),
            scratch(&format!("churn-{mode}.ino")),
        );
        let data = scratch("churn-perf.data");
        let perf = perf_binary().filter(|_| with_perf);
        if with_perf && perf.is_none() {
            println!("  {mode}: perf not installed: not compared with perf lock record");
            continue;
        }
        let mut command = trace_into(&json, &["--mode", mode, "-c", &comm]);
        if let Some(perf) = perf {
            command
                .args([perf, "lock", "record", "-m", "16384", "-o"])
                .arg(&data)
                .arg("--");
        }
        let out = run(command
            .arg(std::env::current_exe()?)
            .args(["--pipe-churn", &PIPES.to_string(), messages])
            .arg(&inodes))?;
        let (report, made) = (fs::read_to_string(&json), fs::read_to_string(&inodes));
        let _ = (fs::remove_file(&json), fs::remove_file(&inodes));
        ensure!(out.status.success(), "{mode}: trace: {}", text(&out.stderr));
        let report = parse_report(&report?)?;
        let made: std::collections::BTreeSet<u64> =
            made?.lines().map(str::parse).collect::<Result<_, _>>()?;
        ensure!(
            made.len() == PIPES,
            "{mode}: {} distinct inodes for {PIPES} pipes",
            made.len()
        );
        let rows: Vec<&LockRow> = report
            .locks
            .iter()
            .filter(|r| r.class.is_some_and(|c| c.name().starts_with("pipe-")))
            .collect();
        for row in &rows {
            let ino = row
                .pipe_ino
                .with_context(|| format!("{mode}: no inode: {}", shown(row)))?;
            ensure!(
                made.contains(&ino),
                "{mode}: a row names pipe:[{ino}], not one of the churned pipes: {}",
                shown(row)
            );
        }
        let mutex: Vec<&LockRow> = rows
            .iter()
            .copied()
            .filter(|r| r.class == Some(LockClass::PipeMutex))
            .collect();
        let own: std::collections::BTreeSet<u64> = mutex.iter().filter_map(|r| r.pipe_ino).collect();
        let addresses: std::collections::BTreeSet<u64> = mutex.iter().map(|r| r.lock_addr).collect();
        // The hooked modes see every acquisition, so every pipe has its
        // row. The tracepoint mode sees contended acquisitions only, and how
        // many pipes the churn contends is the machine's doing (a busy or
        // emulated machine contends fewer): there the rows that exist are
        // checked, and under perf their counts against perf's.
        let tracepoint = mode == "tracepoint";
        let want = if tracepoint { 1 } else { PIPES * 9 / 10 };
        ensure!(
            own.len() >= want,
            "{mode}: only {} of {PIPES} pipes have their own pipe-mutex row (want ≥ {want})",
            own.len()
        );
        ensure!(
            own.len() == mutex.len(),
            "{mode}: {} pipe-mutex rows for {} pipes: one pipe split over several rows",
            mutex.len(),
            own.len()
        );
        let mut line = format!(
            "  {mode}: {} of {PIPES} pipes have their own row, at {} addresses",
            own.len(),
            addresses.len()
        );
        if let Some(perf) = perf {
            let compared = compare_with_perf(perf, &data, &report)?
                .map_err(|void| anyhow::anyhow!("{void}: the comparison would be void"))?;
            line.push_str(&format!(
                " (under perf); contentions equal perf lock record's at all {compared} addresses"
            ));
        }
        println!("{line}");
        covered.push(mode);
    }
    ensure!(!covered.is_empty(), "no mode attached");
    Ok(Outcome::Passed)
}
register!(Kernel churned_pipes_each_get_their_own_row);

/// 10 000 pipes alive at once, each written and read once: in the hooked
/// modes (touching a pipe does not contend it, so the tracepoints see
/// nothing) every row names its own pipe, and what does not fit in the
/// statistics map is counted as `stats_full`, never left out silently.
fn many_pipes_at_once_are_named_or_counted() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    const PIPES: usize = 10_000;
    let mut covered = Vec::new();
    for mode in ["fentry", "kprobe"] {
        if let Some(why) = mode_refusal(mode)? {
            println!("  {mode}: not covered here ({why})");
            continue;
        }
        let (report, made) = trace_helper(
            &format!("{mode}-breadth"),
            &["--mode", mode, "--class", "pipe-mutex"],
            &["--pipe-breadth", &PIPES.to_string()],
        )
        .with_context(|| mode.to_owned())?;
        let made: std::collections::BTreeSet<u64> = made.lines().map(str::parse).collect::<Result<_, _>>()?;
        let mut named = std::collections::BTreeSet::new();
        // The collector keeps at most --track-locks locks: past that it
        // folds the longest-idle ones into one row per class.
        let mut retired = 0;
        for row in &report.locks {
            if row.class != Some(LockClass::PipeMutex) {
                continue;
            }
            if row.pipe_ino.is_none() && row.name.contains("retired locks") {
                retired += 1;
                continue;
            }
            let ino = row
                .pipe_ino
                .with_context(|| format!("{mode}: unnamed row {}", shown(row)))?;
            ensure!(
                made.contains(&ino),
                "{mode}: a row names pipe:[{ino}], none of the helper's: {}",
                shown(row)
            );
            ensure!(named.insert(ino), "{mode}: pipe:[{ino}] has two rows");
        }
        let full = *report.drops.get("stats_full").context("no stats_full")?;
        ensure!(
            named.len() == PIPES || full > 0 || retired > 0,
            "{mode}: {} of {PIPES} pipes have a row and no drop or retired row was counted",
            named.len()
        );
        println!(
            "  {mode}: {} of {PIPES} pipes have their own row; {full} acquisitions counted as stats_full; {retired} retired-locks row",
            named.len()
        );
        covered.push(mode);
    }
    if covered.is_empty() {
        return Ok(Outcome::Skipped(
            "needs fentry or kprobe (touching a pipe does not contend it; the tracepoints see contention only)".into(),
        ));
    }
    Ok(Outcome::Passed)
}
register!(Kernel many_pipes_at_once_are_named_or_counted);

/// `--interval 1` over pipes made and freed without pause, measured by what
/// passes rather than by the clock: once the collector has retired four times
/// its bound (`--track-locks`), pipelock's RSS is read until eight times the
/// bound more have gone through. A collector that kept every lock, or leaked
/// the ones it retires, adds some 3 KB a lock: 12 MB over that window.
/// (That the kernel's maps are emptied at each drain is
/// `interval_csv_reads_back_and_adds_up_to_the_run`'s.)
fn churn_keeps_memory_flat() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    const TRACK: u64 = 512;
    // Past the warm-up: the tables have turned over four times, and the
    // allocator has seen a few intervals' worth of drained maps (glibc keeps
    // the largest interval's buffers, so RSS climbs in steps at first).
    const WARM: u64 = 4 * TRACK;
    const WARM_SECS: u64 = 5;
    const WINDOW: u64 = 8 * TRACK;
    const WINDOW_SECS: u64 = 12;
    // Far beyond any churn seen here (~1300 locks/s idle, ~60 under load).
    const LIMIT: std::time::Duration = std::time::Duration::from_secs(400);
    let output = scratch("long.txt");
    let churn = format!(
        "while :; do {} --pipe-churn 300 200 /dev/null || exit 1; done",
        std::env::current_exe()?.display()
    );
    let mut trace = pipelock()
        .args([
            "trace",
            "--mode",
            "tracepoint",
            "--interval",
            "1",
            "--reset",
            "-n",
            "3",
        ])
        // Each interval report then gives the collector's fill.
        .arg("--verbose")
        .args(["--track-locks", &TRACK.to_string()])
        .args(["--", "sh", "-c", &churn])
        .stdout(fs::File::create(&output)?)
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let started = std::time::Instant::now();
    // (seconds, RSS KiB, locks retired by then)
    let mut samples: Vec<(u64, u64, u64)> = Vec::new();
    // The sample the measured window starts at.
    let mut window: Option<usize> = None;
    let outcome = loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
        if trace.try_wait()?.is_some() {
            break Err(anyhow::anyhow!("trace ended before it was interrupted"));
        }
        let text = fs::read_to_string(&output)?;
        let Some(fill) = text.lines().rev().find_map(collector_fill) else {
            continue;
        };
        if let Some(kib) = rss_kib(trace.id()) {
            samples.push((started.elapsed().as_secs(), kib, fill.retired));
        }
        let Some((_, _, retired)) = samples.last().copied() else {
            continue;
        };
        let secs = started.elapsed().as_secs();
        match window {
            None if retired >= WARM && secs >= WARM_SECS => window = Some(samples.len() - 1),
            Some(first) if retired >= samples[first].2 + WINDOW && secs >= samples[first].0 + WINDOW_SECS => {
                break Ok(());
            }
            _ if started.elapsed() > LIMIT => {
                break Err(anyhow::anyhow!(
                    "the churn retired only {retired} locks in {LIMIT:?} (want {} to measure)",
                    WARM + WINDOW
                ));
            }
            _ => {}
        }
    };
    if trace.try_wait()?.is_none() {
        // SAFETY: kill(2) on our child, not yet reaped: Ctrl-C, which still
        // prints the report.
        unsafe { libc::kill(trace.id() as i32, libc::SIGINT) };
    }
    let status = trace.wait()?;
    let text = fs::read_to_string(&output);
    let _ = fs::remove_file(&output);
    outcome?;
    ensure!(
        status.code() == Some(130),
        "trace exited with {status} on Ctrl-C, want 130"
    );
    let text = text?;
    let fills: Vec<CollectorFill> = text.lines().filter_map(collector_fill).collect();
    ensure!(
        fills.iter().all(|f| f.tracked <= TRACK),
        "the collector kept more than --track-locks {TRACK}: {:?}",
        fills.iter().map(|f| f.tracked).max()
    );
    let first = window.context("no window")?;
    let measured = &samples[first..];
    // A leak grows all the time; a one-off step (a larger interval's
    // buffers kept by the allocator) does not: the window's last third
    // must not climb above its first third's peak.
    let third = (measured.len() / 3).max(1);
    let peak = measured[..third].iter().map(|s| s.1).max().context("no RSS")?;
    let (late, late_retired) = measured[measured.len() - third..]
        .iter()
        .map(|s| (s.1, s.2))
        .max()
        .context("no RSS")?;
    let ((t0, rss0, retired0), (t1, rss1, retired1)) = (measured[0], *measured.last().context("no RSS")?);
    println!(
        "  {t0} s to warm up; then {} locks retired in {} s; RSS {rss0} KiB → {rss1} KiB (first third's peak {peak} KiB, last third's {late} KiB)",
        retired1 - retired0,
        t1 - t0,
    );
    ensure!(
        late <= peak + peak / 20 + 2048,
        "RSS grew from {peak} KiB (the window's first third's peak) to {late} KiB while {} locks were retired: {samples:?}",
        late_retired - retired0
    );
    ensure!(
        text.contains("retired locks"),
        "the report after Ctrl-C has no retired-locks row"
    );
    Ok(Outcome::Passed)
}
register!(Host churn_keeps_memory_flat);

/// The collector's line of a `--verbose` report ("pipelock's collector:
/// 509 of 512 locks kept one by one (--track-locks), 733 retired …").
#[derive(Debug, Clone, Copy)]
struct CollectorFill {
    tracked: u64,
    retired: u64,
}

fn collector_fill(line: &str) -> Option<CollectorFill> {
    let words: Vec<&str> = line
        .strip_prefix("pipelock's collector: ")?
        .split_whitespace()
        .collect();
    let retired_at = words.iter().position(|w| *w == "retired")?;
    Some(CollectorFill {
        tracked: words.first()?.parse().ok()?,
        retired: words.get(retired_at.checked_sub(1)?)?.parse().ok()?,
    })
}

/// `VmRSS` of a process, in KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}
