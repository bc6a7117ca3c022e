//! Pipe locks taken outside read/write: splice, tee, vmsplice, and io_uring
//! reads (inline and on io-wq worker threads). Each helper does a known
//! number of calls, so the hooked modes must count exactly; tracepoint mode
//! must name the pipe of a contended splice-family call.
use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::Duration,
};

use pipelock_user::model::{LockClass, LockRow, TraceReport};

use super::*;

/// A pipe (read end, write end) and its inode number.
fn new_pipe() -> Result<(OwnedFd, OwnedFd, u64)> {
    let ([read, write], ino) = pipe_with_inode()?;
    // SAFETY: just created, owned here alone.
    Ok(unsafe { (OwnedFd::from_raw_fd(read), OwnedFd::from_raw_fd(write), ino) })
}

fn check_len(what: &str, got: isize, want: isize) -> Result<()> {
    ensure!(
        got == want,
        "{what} returned {got}, want {want}: {}",
        std::io::Error::last_os_error()
    );
    Ok(())
}

fn splice(from: i32, offset: Option<&mut i64>, to: i32, flags: u32) -> isize {
    let offset = offset.map_or(std::ptr::null_mut(), |o| o as *mut i64);
    // SAFETY: descriptors we own; the offset, if any, is a live i64.
    unsafe { libc::splice(from, offset, to, std::ptr::null_mut(), 1, flags) }
}

fn vmsplice_one(to: i32, byte: &mut [u8; 1], flags: u32) -> isize {
    let iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: a one-byte buffer that outlives the call (not gifted).
    unsafe { libc::vmsplice(to, &iov, 1, flags) }
}

/// Helper mode: `integration --splice-io N FILE` writes "INO_A INO_B" to
/// FILE, then N times: splice a file's byte into pipe A, tee it from A to
/// B, splice B's byte to /dev/null, vmsplice a byte into A, read A's two
/// bytes. Each call takes its pipes' mutex once (tee takes both): A's is
/// acquired exactly 4N times, B's 2N.
pub(super) fn splice_io(args: &[String]) -> ! {
    let run = || -> Result<()> {
        let n: u64 = args.first().context("N")?.parse()?;
        let (a_read, a_write, ino_a) = new_pipe()?;
        let (b_read, b_write, ino_b) = new_pipe()?;
        let source_path = std::env::temp_dir().join(format!("pipelock-splice-{}", std::process::id()));
        fs::write(&source_path, b"x")?;
        let source = fs::File::open(&source_path)?;
        let _ = fs::remove_file(&source_path);
        let null = fs::OpenOptions::new().write(true).open("/dev/null")?;
        fs::write(args.get(1).context("FILE")?, format!("{ino_a} {ino_b}"))?;
        let mut byte = [b'y'; 1];
        let mut two = [0u8; 2];
        for _ in 0..n {
            let mut offset = 0i64;
            check_len(
                "splice(file → A)",
                splice(source.as_raw_fd(), Some(&mut offset), a_write.as_raw_fd(), 0),
                1,
            )?;
            // SAFETY: our pipes.
            let teed = unsafe { libc::tee(a_read.as_raw_fd(), b_write.as_raw_fd(), 1, 0) };
            check_len("tee(A → B)", teed, 1)?;
            check_len(
                "splice(B → /dev/null)",
                splice(b_read.as_raw_fd(), None, null.as_raw_fd(), 0),
                1,
            )?;
            check_len(
                "vmsplice(→ A)",
                vmsplice_one(a_write.as_raw_fd(), &mut byte, 0),
                1,
            )?;
            // SAFETY: a two-byte buffer; our pipe.
            let read = unsafe { libc::read(a_read.as_raw_fd(), two.as_mut_ptr().cast(), 2) };
            check_len("read(A)", read, 2)?;
        }
        Ok(())
    };
    match run() {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("splice-io: {e:#}");
            std::process::exit(1)
        }
    }
}

/// Helper mode: `integration --splice-herd SECONDS FILE` writes pipe A's
/// inode number to FILE, then for SECONDS two threads vmsplice bytes into A,
/// two splice them out of A to /dev/null and one tees A into pipe B (and
/// drains B): A's mutex is contended inside splice-family calls only (no
/// thread ever calls read or write on A).
pub(super) fn splice_herd(args: &[String]) -> ! {
    let run = || -> Result<()> {
        let seconds: f64 = args.first().context("SECONDS")?.parse()?;
        let (a_read, a_write, ino_a) = new_pipe()?;
        let (b_read, b_write, _) = new_pipe()?;
        let null = fs::OpenOptions::new().write(true).open("/dev/null")?;
        fs::write(args.get(1).context("FILE")?, ino_a.to_string())?;
        let stop = std::sync::atomic::AtomicBool::new(false);
        let nonblock = libc::SPLICE_F_NONBLOCK;
        let (a_read, a_write, b_read, b_write, null) = (
            a_read.as_raw_fd(),
            a_write.as_raw_fd(),
            b_read.as_raw_fd(),
            b_write.as_raw_fd(),
            null.as_raw_fd(),
        );
        std::thread::scope(|scope| {
            let stop = &stop;
            for _ in 0..2 {
                scope.spawn(move || {
                    let mut byte = [b'z'; 1];
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        vmsplice_one(a_write, &mut byte, nonblock);
                    }
                });
                scope.spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        splice(a_read, None, null, nonblock);
                    }
                });
            }
            scope.spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // SAFETY: our pipes.
                    unsafe { libc::tee(a_read, b_write, 1, nonblock) };
                    splice(b_read, None, null, nonblock);
                }
            });
            std::thread::sleep(Duration::from_secs_f64(seconds));
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        Ok(())
    };
    match run() {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("splice-herd: {e:#}");
            std::process::exit(1)
        }
    }
}

/// Helper mode: `integration --uring-pipe-io N FILE` writes its pipe's inode
/// number to FILE, then N times writes a byte with write(2) and reads it back
/// with an io_uring READ, every other one forced onto an io-wq worker thread
/// (`IOSQE_ASYNC`: an `iou-wrk-PID` thread does the read). Exactly 2N
/// acquisitions of the pipe mutex, in threads of this process.
pub(super) fn uring_pipe_io(args: &[String]) -> ! {
    use io_uring::{IoUring, opcode, squeue, types};
    let run = || -> Result<()> {
        let n: u64 = args.first().context("N")?.parse()?;
        let (read_end, write_end, ino) = new_pipe()?;
        fs::write(args.get(1).context("FILE")?, ino.to_string())?;
        let mut ring = IoUring::new(8).context("io_uring_setup")?;
        let mut byte = [0u8; 1];
        for i in 0..n {
            // SAFETY: a one-byte buffer; our pipe.
            let wrote = unsafe { libc::write(write_end.as_raw_fd(), byte.as_ptr().cast(), 1) };
            check_len("write", wrote, 1)?;
            let mut read = opcode::Read::new(types::Fd(read_end.as_raw_fd()), byte.as_mut_ptr(), 1)
                .offset(u64::MAX)
                .build()
                .user_data(i);
            if i % 2 == 1 {
                read = read.flags(squeue::Flags::ASYNC);
            }
            // SAFETY: `byte` outlives the request, which completes below.
            unsafe { ring.submission().push(&read).context("submission queue full")? };
            ring.submit_and_wait(1).context("io_uring_enter")?;
            let cqe = ring.completion().next().context("no completion")?;
            ensure!(cqe.result() == 1, "io_uring read returned {}", cqe.result());
        }
        Ok(())
    };
    match run() {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("uring-pipe-io: {e:#}");
            std::process::exit(1)
        }
    }
}

/// The pipe-mutex row of pipe `ino`.
fn mutex_row(report: &TraceReport, ino: u64) -> Result<&LockRow> {
    row_of(&pipe_rows(report, ino), LockClass::PipeMutex)
        .with_context(|| format!("no pipe-mutex row for pipe:[{ino}]: {}", shown(report)))
}

per_mode!(Kernel hooks_count_splice_tee_vmsplice {
    fentry_counts_splice_tee_vmsplice: "fentry",
    kprobe_counts_splice_tee_vmsplice: "kprobe",
});

/// N rounds of splice(file → A), tee(A → B), splice(B → /dev/null),
/// vmsplice(→ A), read(A): A's mutex acquired exactly 4N times, B's 2N.
fn hooks_count_splice_tee_vmsplice(mode: &str) -> Result<Outcome> {
    if let Some(skip) = hooked_mode_skip(mode)? {
        return Ok(skip);
    }
    const N: u64 = 300;
    let (report, facts) = trace_helper(
        &format!("{mode}-splice"),
        &["--mode", mode, "--class", "pipe-mutex"],
        &["--splice-io", &N.to_string()],
    )?;
    let inos: Vec<u64> = facts
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let [a, b] = inos[..] else {
        bail!("helper facts: {facts}")
    };
    // No two threads here share a per-thread slot (counted if they did).
    ensure!(
        report.drops.get("slot_busy") == Some(&0),
        "drops: {}",
        shown(&report.drops)
    );
    for (ino, want, calls) in [
        (a, 4 * N, "splice in + tee + vmsplice + read"),
        (b, 2 * N, "tee + splice out"),
    ] {
        let count = skips::exact_mutex_count(&report, mutex_row(&report, ino)?, want)
            .with_context(|| format!("pipe:[{ino}] ({calls}, {N} each)"))?;
        println!("  pipe:[{ino}]: {count} acquisitions for {N} × ({calls})");
    }
    Ok(Outcome::Passed)
}

per_mode!(Kernel hooks_count_io_uring_pipe_reads {
    fentry_counts_io_uring_pipe_reads: "fentry",
    kprobe_counts_io_uring_pipe_reads: "kprobe",
});

/// This binary's command name as the kernel holds it (15 bytes at most).
fn own_comm() -> Result<String> {
    Ok(fs::read_to_string("/proc/self/comm")?.trim_end().to_owned())
}

/// N writes + N io_uring reads, half of them on io-wq workers (`iou-wrk-*`
/// threads): 2N acquisitions, also with `-c` naming the process, which
/// the worker threads are not named after.
fn hooks_count_io_uring_pipe_reads(mode: &str) -> Result<Outcome> {
    if let Some(skip) = hooked_mode_skip(mode)? {
        return Ok(skip);
    }
    if io_uring::IoUring::new(2).is_err() {
        return Ok(Outcome::Skipped(format!(
            "io_uring is disabled here ({})",
            std::io::Error::last_os_error()
        )));
    }
    const N: u64 = 300;
    let comm = own_comm()?;
    let (report, facts) = trace_helper(
        &format!("{mode}-uring"),
        &["--mode", mode, "--class", "pipe-mutex", "-c", &comm],
        &["--uring-pipe-io", &N.to_string()],
    )?;
    let ino: u64 = facts.trim().parse()?;
    let count = skips::exact_mutex_count(&report, mutex_row(&report, ino)?, 2 * N)
        .with_context(|| format!("io_uring, N writes + N reads, -c {comm}"))?;
    println!(
        "  pipe:[{ino}]: {count} acquisitions for {N} writes + {N} io_uring reads (half on io-wq workers), -c {comm}"
    );
    Ok(Outcome::Passed)
}

/// Tracepoint mode names the pipe of contention inside splice, tee and
/// vmsplice from their fd arguments: a herd that never calls read or write
/// on its pipe still gets that pipe's mutex row.
fn tracepoint_names_the_pipe_of_splice_calls() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    let (report, facts) = trace_helper(
        "tracepoint-splice-herd",
        &["--mode", "tracepoint"],
        &["--splice-herd", "2"],
    )?;
    let ino: u64 = facts.trim().parse()?;
    let row = mutex_row(&report, ino)?;
    let contended = row.contentions;
    ensure!(
        contended > 0,
        "pipe:[{ino}]: no contention recorded: {}",
        shown(row)
    );
    println!("  pipe:[{ino}]: {contended} contended acquisitions inside splice/tee/vmsplice calls");
    Ok(Outcome::Passed)
}
register!(Host tracepoint_names_the_pipe_of_splice_calls);
