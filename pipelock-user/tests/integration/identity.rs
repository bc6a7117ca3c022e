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
                .context("perf lost events (its ring overflowed): the comparison would be void")?;
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
        // The collector keeps at most MAX_TRACKED_LOCKS locks: past that it
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

/// A minute of `--interval 1` over pipes made and freed without pause: the
/// kernel's maps are drained each second and the collector keeps a bounded
/// number of locks, so map fill and pipelock's RSS stay flat.
fn a_minute_of_churn_keeps_memory_flat() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    // Long enough that the second half starts well after the collector's
    // tables reach their bounds on this churn (~30 s here).
    const SECONDS: u64 = 80;
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
            // Each interval report then lists every map's fill.
            "--verbose",
        ])
        .args(["--duration", &SECONDS.to_string(), "--", "sh", "-c", &churn])
        .stdout(fs::File::create(&output)?)
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let mut rss = Vec::new();
    let started = std::time::Instant::now();
    while trace.try_wait()?.is_none() {
        std::thread::sleep(std::time::Duration::from_secs(1));
        if let Some(kib) = rss_kib(trace.id()) {
            rss.push((started.elapsed().as_secs(), kib));
        }
    }
    let status = trace.wait()?;
    let text = fs::read_to_string(&output);
    let _ = fs::remove_file(&output);
    ensure!(status.success(), "trace exited with {status}");
    let fills: Vec<u64> = text?.lines().filter_map(stats_fill).collect();
    ensure!(
        fills.len() as u64 >= SECONDS - 2,
        "{} interval reports with a LOCK_STATS_A row in their maps table, want ≥ {}",
        fills.len(),
        SECONDS - 2
    );
    // The collector's tables grow until they hold the most locks it tracks
    // one by one (on this churn within the first half): from then on, flat.
    // Samples after the duration are the whole-run report being built, not
    // the churn (one was 5 MB above the rest).
    let settled: Vec<(u64, u64)> = rss
        .iter()
        .copied()
        .filter(|(t, _)| (SECONDS / 2..SECONDS).contains(t))
        .collect();
    let ((from, first), (to, last)) = (
        *settled.first().context("no RSS sample")?,
        *settled.last().context("no RSS")?,
    );
    let peak_fill = fills.iter().copied().max().unwrap_or(0);
    println!(
        "  {} intervals; LOCK_STATS fill per drain {}..{} (first {}, last {}); RSS {} KiB at 10 s, {first} KiB at \
         {} s, {last} KiB at {} s",
        fills.len(),
        fills.iter().min().unwrap_or(&0),
        peak_fill,
        fills[0],
        fills[fills.len() - 1],
        rss.iter().find(|(t, _)| *t >= 10).map_or(0, |(_, kib)| *kib),
        from,
        to
    );
    ensure!(
        last <= first + first / 20 + 1024,
        "RSS grew from {first} KiB to {last} KiB over the second half: {rss:?}"
    );
    // Flat: a drain of the second half takes what one of the first half
    // took (the map is drained each second; a full map would be counted in
    // `stats_full`, never silent). Medians, not peaks: a drain that comes
    // late (the collector kept off the CPU a moment) catches a longer span
    // of the same churn, and one such drain is no growth.
    let half = fills.len() / 2;
    let median = |part: &[u64]| {
        let mut part = part.to_vec();
        part.sort_unstable();
        part.get(part.len() / 2).copied().unwrap_or(0)
    };
    let (early, late) = (median(&fills[..half]), median(&fills[half..]));
    ensure!(
        late <= early + early / 5 + 64,
        "LOCK_STATS fill grew: {early} per drain (median) in the first half, {late} in the second: {fills:?}"
    );
    Ok(Outcome::Passed)
}
register!(Host a_minute_of_churn_keeps_memory_flat);

/// Entries used of `LOCK_STATS_A`, from its row of the `--verbose` maps
/// table ("LOCK_STATS_A  123  8192  9.3 MiB").
fn stats_fill(line: &str) -> Option<u64> {
    let mut cells = line.split_whitespace();
    (cells.next()? == "LOCK_STATS_A").then_some(())?;
    cells.next()?.parse().ok()
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
