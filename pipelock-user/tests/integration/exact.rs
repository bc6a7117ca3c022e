//! Exact counts in the hooked modes (fentry, kprobe): N writes and reads give known acquisitions, herds give every wait-queue lock.
use pipelock_user::model::{LockClass, LockRow, TraceReport};

use super::*;

per_mode!(Kernel hooks_count_every_pipe_mutex_acquisition {
    fentry_counts_every_pipe_mutex_acquisition: "fentry",
    kprobe_counts_every_pipe_mutex_acquisition: "kprobe",
});

per_mode!(Kernel hooks_time_wait_queue_locks_of_a_herd {
    fentry_times_wait_queue_locks_of_a_herd: "fentry",
    kprobe_times_wait_queue_locks_of_a_herd: "kprobe",
});

/// A 64-process herd keeps up to 32 readers asleep in `pipe_read` at once,
/// more than a kretprobe's default instances (10 in a 2-CPU guest, which
/// lost 23 000 of 30 000 returns): pipelock's return probes must see every
/// return, count what they miss, and leave no probe event behind.
fn kprobe_sees_every_return_of_a_sleeping_herd() -> Result<Outcome> {
    if let Some(skip) = hooked_mode_skip("kprobe")? {
        return Ok(skip);
    }
    let report = match trace_json(
        &["--mode", "kprobe", "--bpf-stats"],
        &["run", "pipe-herd", "-k", "6", "--limit", "20000", "-q"],
    )? {
        Ok(report) => report,
        Err(skip) => return Ok(skip),
    };
    let program = |name: &str| {
        report
            .programs
            .iter()
            .find(|p| p.name == name)
            .with_context(|| format!("no program {name}: {}", shown(&report.programs)))
    };
    let (entry, exit) = (program("kp_pipe_read_entry")?, program("kp_pipe_read_exit")?);
    let (entries, returns) = (entry.run_count, exit.run_count);
    // A run the kernel skipped (another kprobe program under way on that
    // CPU) is one side's loss, not the probe's.
    let skipped = entry.recursion_misses + exit.recursion_misses;
    // All return probes' misses, the spinlocks' too, which miss when they
    // fire inside another kprobe's handler (pipelock's own map updates take
    // spinlocks): reported, not zero.
    let missed = *report
        .drops
        .get("kretprobe_missed")
        .context("no kretprobe_missed among the drops")?;
    ensure!(
        entries > 1_000 && entries.abs_diff(returns) <= skipped,
        "{entries} pipe_read calls, {returns} returns seen ({skipped} runs skipped; all return probes \
         missed {missed})"
    );
    let events = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .find_map(|dir| fs::read_to_string(format!("{dir}/kprobe_events")).ok())
        .context("no tracefs kprobe_events")?;
    ensure!(
        !events.contains("pipelock_"),
        "the trace left probe events behind: {events}"
    );
    println!(
        "  kprobe: {entries} pipe_read calls, {returns} returns seen ({skipped} runs skipped); all return \
         probes missed {missed}"
    );
    Ok(Outcome::Passed)
}
register!(Kernel kprobe_sees_every_return_of_a_sleeping_herd);

per_mode!(Kernel hooks_count_nonblocking_pipe_io {
    fentry_counts_nonblocking_pipe_io: "fentry",
    kprobe_counts_nonblocking_pipe_io: "kprobe",
});

per_mode!(Kernel hooks_record_pipe_wait_alone {
    fentry_records_pipe_wait_alone: "fentry",
    kprobe_records_pipe_wait_alone: "kprobe",
});

/// N pwritev2 + N preadv2 with RWF_NOWAIT on one pipe (the non-blocking
/// path io_uring's inline attempts take): the pipe mutex is still acquired
/// exactly 2N times, however the kernel takes it on that path.
fn hooks_count_nonblocking_pipe_io(mode: &str) -> Result<Outcome> {
    if let Some(skip) = hooked_mode_skip(mode)? {
        return Ok(skip);
    }
    if let Some(why) = pipes_refuse_nowait()? {
        return Ok(Outcome::Skipped(why));
    }
    const N: u64 = 500;
    let (report, ino) = trace_exact_pipe_io_with(mode, "pipe-mutex", N, "nowait")?;
    let mutex = row_of(&pipe_rows(&report, ino), LockClass::PipeMutex)
        .with_context(|| format!("no pipe-mutex row for pipe:[{ino}]: {}", shown(&report)))?;
    let count = skips::exact_mutex_count(&report, mutex, 2 * N).context("RWF_NOWAIT")?;
    println!("  pipe:[{ino}]: {count} acquisitions for {N} RWF_NOWAIT writes + reads");
    Ok(Outcome::Passed)
}

/// `--class pipe-wait` alone records the wait-queue locks exactly as with
/// the pipe mutex selected too: the programs learn a call's pipe at its
/// first mutex_lock, so that hook must come with pipe-wait.
fn hooks_record_pipe_wait_alone(mode: &str) -> Result<Outcome> {
    if let Some(skip) = hooked_mode_skip(mode)? {
        return Ok(skip);
    }
    const N: u64 = 500;
    let rd_wait = |report: &TraceReport, ino: u64| -> Result<u64> {
        row_of(&pipe_rows(report, ino), LockClass::PipeRdWait)
            .and_then(|r| r.acquisitions)
            .with_context(|| format!("no pipe-rd-wait row for pipe:[{ino}]: {}", shown(report)))
    };
    let (alone, alone_ino) = trace_exact_pipe_io(mode, "pipe-wait", N)?;
    let (both, both_ino) = trace_exact_pipe_io(mode, "pipe-mutex,pipe-wait", N)?;
    ensure!(
        row_of(&pipe_rows(&alone, alone_ino), LockClass::PipeMutex).is_none(),
        "--class pipe-wait recorded the pipe mutex: {}",
        shown(&alone)
    );
    let (alone_rd, both_rd) = (rd_wait(&alone, alone_ino)?, rd_wait(&both, both_ino)?);
    ensure!(
        alone_rd == both_rd && alone_rd >= N,
        "rd_wait.lock acquisitions: {alone_rd} with --class pipe-wait, {both_rd} with pipe-mutex,pipe-wait \
         (want equal, ≥ {N})"
    );
    println!("  rd_wait.lock: {alone_rd} acquisitions for {N} writes + reads, with and without pipe-mutex");
    Ok(Outcome::Passed)
}

/// One thread, exactly N writes and N reads of 512 bytes on one pipe: the
/// pipe mutex is taken exactly 2N times (once per call: the pipe never fills
/// or empties under a waiting peer, so no call sleeps and retakes it).
fn hooks_count_every_pipe_mutex_acquisition(mode: &str) -> Result<Outcome> {
    if let Some(skip) = hooked_mode_skip(mode)? {
        return Ok(skip);
    }
    const N: u64 = 1000;
    let (report, ino) = trace_exact_pipe_io(mode, "pipe-mutex,pipe-wait", N)?;
    ensure!(report.mode == mode, "mode {}", report.mode);
    let rows = pipe_rows(&report, ino);
    let mutex = row_of(&rows, LockClass::PipeMutex)
        .with_context(|| format!("no pipe-mutex row for pipe:[{ino}]: {}", shown(&report)))?;
    let count = skips::exact_mutex_count(&report, mutex, 2 * N)?;
    ensure!(
        mutex.contentions == 0,
        "one thread contended with itself: {}",
        mutex.contentions
    );
    let hold = mutex.hold.as_ref().context("no hold time")?;
    ensure!(hold.total_ns > 0, "zero hold time");
    // Every write to an empty pipe wakes readers through rd_wait.lock.
    let rd = row_of(&rows, LockClass::PipeRdWait).context("no pipe-rd-wait row")?;
    let rd_acquisitions = rd.acquisitions.context("no acquisitions")?;
    let spin_skips = skips::Skips::on(&report, skips::CountedPath::Spinlock);
    ensure!(
        rd_acquisitions + spin_skips.total() >= N,
        "rd_wait.lock acquired {rd_acquisitions} times, want ≥ {N} (runs skipped on the spinlocks' path: \
         {spin_skips})"
    );
    for row in [mutex, rd] {
        check_percentiles(row, Kind::Hold)?;
    }
    println!("  pipe:[{ino}]: mutex {count} acquisitions, rd_wait.lock {rd_acquisitions}");
    Ok(Outcome::Passed)
}

fn hooks_time_wait_queue_locks_of_a_herd(mode: &str) -> Result<Outcome> {
    if let Some(skip) = hooked_mode_skip(mode)? {
        return Ok(skip);
    }
    let report = match trace_json(
        &["--mode", mode],
        &["run", "pipe-herd", "-k", "3", "--limit", "20000", "-q"],
    )? {
        Ok(report) => report,
        Err(skip) => return Ok(skip),
    };
    let mutex = busiest(&report, LockClass::PipeMutex).context("no pipe-mutex row")?;
    let rd = busiest(&report, LockClass::PipeRdWait).context("no pipe-rd-wait row")?;
    ensure!(
        mutex.pipe_ino == rd.pipe_ino,
        "mutex and rd_wait rows name different pipes"
    );
    let acquisitions = |row: &LockRow| {
        row.acquisitions
            .context("a hooked mode's row without acquisitions")
    };
    let (mutex_acquisitions, rd_acquisitions) = (acquisitions(mutex)?, acquisitions(rd)?);
    // 8 processes pass 20000 tokens: at least one read and one write each.
    ensure!(
        mutex_acquisitions >= 40_000,
        "mutex acquisitions {mutex_acquisitions}"
    );
    for row in [mutex, rd] {
        ensure!(
            row.hold.as_ref().is_some_and(|h| h.count > 0),
            "no hold time: {}",
            shown(row)
        );
        check_percentiles(row, Kind::Wait)?;
        check_percentiles(row, Kind::Hold)?;
    }
    // The mutex has no exit hook: its contended waits end at contention_end,
    // its uncontended ones read 0. So contention must show as wait time.
    let contended = mutex.contentions;
    let wait = mutex.wait.as_ref().context("no wait timing")?;
    // (lower bound ns, count) pairs; bound 0 is the bucket of 0 ns.
    let nonzero_waits: u64 = wait
        .buckets
        .iter()
        .filter(|(lower, _)| *lower != 0)
        .map(|(_, n)| n)
        .sum();
    ensure!(
        contended > 0,
        "a herd of 8 never contended the pipe mutex: {}",
        shown(mutex)
    );
    // 1 % slack: a contention_end that fires inside another BPF program is
    // skipped by the kernel (recursion protection).
    ensure!(
        nonzero_waits * 100 >= contended * 99,
        "{contended} contended mutex acquisitions but only {nonzero_waits} timed waits: {}",
        shown(mutex)
    );
    // Every contended wait is some owner's: the mutex's from its owner
    // field, a spinlock's from its last releaser. Exactly, but for runs the
    // kernel says it skipped on that lock's path (`recursion_misses`: under
    // 6.18's lazy preemption a fentry program preempted mid-run makes its CPU
    // skip it until it resumes), each of which can lose an acquisition whose
    // owner row was kept.
    let mut owners_line = String::new();
    for (row, path) in [
        (mutex, skips::CountedPath::Mutex),
        (rd, skips::CountedPath::Spinlock),
    ] {
        let skips = skips::Skips::on(&report, path);
        let skipped = skips.total();
        let contended = row.contentions;
        let class = row.class.map_or("(unknown class)", |c| c.name());
        let owned: u64 = row.owners.iter().map(|o| o.waits).sum();
        ensure!(
            owned.abs_diff(contended) <= skipped,
            "{contended} contended acquisitions of {class} but {owned} waits among its owners \
             (runs skipped on its path: {skips}): {}",
            shown(&row.owners)
        );
        owners_line.push_str(&if contended == 0 {
            format!("; {class} never contended here: its owners not exercised")
        } else if owned == contended {
            format!("; {class} owners cover its {contended} waits")
        } else {
            format!(
                "; {class} owners cover {owned} of its {contended} waits (runs skipped on its path: {skips})"
            )
        });
    }
    println!(
        "  herd: mutex {mutex_acquisitions} acquisitions ({contended} contended, {nonzero_waits} waits > 0 ns), \
         rd_wait.lock {rd_acquisitions} acquisitions{owners_line}"
    );
    Ok(Outcome::Passed)
}

/// Why this kernel's pipes refuse RWF_NOWAIT, if they do (pipes accept it
/// since they got FMODE_NOWAIT, in 6.4).
fn pipes_refuse_nowait() -> Result<Option<String>> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors, which are closed below.
    ensure!(
        unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == 0,
        "pipe failed"
    );
    let mut byte = [0u8; 1];
    let iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: a one-byte buffer; our descriptors.
    let wrote = unsafe { libc::pwritev2(fds[1], &iov, 1, -1, libc::RWF_NOWAIT) };
    let err = std::io::Error::last_os_error();
    // SAFETY: our descriptors.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    Ok((wrote != 1).then(|| format!("this kernel's pipes refuse RWF_NOWAIT ({err})")))
}
