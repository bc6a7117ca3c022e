//! Why a waiter waited, checked on workloads whose answer is known: a
//! holder that sleeps with the pipe mutex held (a page fault that
//! userfaultfd resolves 50 ms later) and a holder preempted by a real-time
//! task on its CPU. The owner each waiter found, and what that owner was
//! doing, must say so.
use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::Arc,
    time::{Duration, Instant},
};

use pipelock_user::model::{HolderState, LockClass, LockRow, OwnerRow, TraceReport};

use super::*;

const PAGE: usize = 4096;
/// How long the userfaultfd handler leaves the holder in its page fault.
const FAULT_MS: u64 = 50;

// linux/userfaultfd.h: _IOWR(0xAA, nr, struct) for UFFDIO_API (0x3F),
// UFFDIO_REGISTER (0x00) and UFFDIO_COPY (0x03).
const UFFDIO_API: libc::c_ulong = 0xC018_AA3F;
const UFFDIO_REGISTER: libc::c_ulong = 0xC020_AA00;
const UFFDIO_COPY: libc::c_ulong = 0xC028_AA03;
const UFFD_API: u64 = 0xAA;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;

fn thread_id() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

fn pin_to(cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t filled by CPU_SET.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        ensure!(
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) == 0,
            "sched_setaffinity(CPU {cpu}): {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

fn new_pipe() -> Result<(OwnedFd, OwnedFd, u64)> {
    let ([read, write], ino) = pipe_with_inode()?;
    // SAFETY: just created, owned here alone.
    Ok(unsafe { (OwnedFd::from_raw_fd(read), OwnedFd::from_raw_fd(write), ino) })
}

fn write_all(fd: i32, buf: *const u8, len: usize) -> Result<()> {
    // SAFETY: the caller's buffer of `len` bytes (it may fault: that is the point).
    let done = unsafe { libc::write(fd, buf.cast(), len) };
    ensure!(
        done == len as isize,
        "write: {done} of {len}: {}",
        std::io::Error::last_os_error()
    );
    Ok(())
}

/// One anonymous page registered with a new userfaultfd (missing mode).
struct FaultingPage {
    uffd: OwnedFd,
    page: *mut u8,
}

// SAFETY: the page is only touched through syscalls (write, UFFDIO_COPY, madvise).
unsafe impl Send for FaultingPage {}
unsafe impl Sync for FaultingPage {}

impl FaultingPage {
    fn new() -> Result<Self> {
        // SAFETY: plain syscalls; every result is checked.
        unsafe {
            let fd = libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) as i32;
            ensure!(fd >= 0, "userfaultfd: {}", std::io::Error::last_os_error());
            let uffd = OwnedFd::from_raw_fd(fd);
            let mut api = [UFFD_API, 0, 0];
            ensure!(
                libc::ioctl(fd, UFFDIO_API, api.as_mut_ptr()) == 0,
                "UFFDIO_API: {}",
                std::io::Error::last_os_error()
            );
            let page = libc::mmap(
                std::ptr::null_mut(),
                PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            ensure!(
                page != libc::MAP_FAILED,
                "mmap: {}",
                std::io::Error::last_os_error()
            );
            let mut register = [page as u64, PAGE as u64, UFFDIO_REGISTER_MODE_MISSING, 0];
            ensure!(
                libc::ioctl(fd, UFFDIO_REGISTER, register.as_mut_ptr()) == 0,
                "UFFDIO_REGISTER: {}",
                std::io::Error::last_os_error()
            );
            Ok(Self {
                uffd,
                page: page.cast(),
            })
        }
    }

    /// Blocks until something faults on the page.
    fn wait_for_fault(&self) -> Result<()> {
        let mut msg = [0u8; 32];
        // SAFETY: a 32-byte buffer for one `struct uffd_msg`.
        let got = unsafe { libc::read(self.uffd.as_raw_fd(), msg.as_mut_ptr().cast(), msg.len()) };
        ensure!(
            got == 32 && msg[0] == UFFD_EVENT_PAGEFAULT,
            "userfaultfd read {got} bytes, event {:#x}",
            msg[0]
        );
        Ok(())
    }

    /// Fills the page, which wakes the faulting thread.
    fn resolve(&self, source: &[u8; PAGE]) -> Result<()> {
        let mut copy = [self.page as u64, source.as_ptr() as u64, PAGE as u64, 0, 0];
        // SAFETY: UFFDIO_COPY of one page from a live buffer.
        let done = unsafe { libc::ioctl(self.uffd.as_raw_fd(), UFFDIO_COPY, copy.as_mut_ptr()) };
        ensure!(done == 0, "UFFDIO_COPY: {}", std::io::Error::last_os_error());
        Ok(())
    }

    /// Empties the page again, so the next touch faults.
    fn forget(&self) -> Result<()> {
        // SAFETY: our own mapping.
        let done = unsafe { libc::madvise(self.page.cast(), PAGE, libc::MADV_DONTNEED) };
        ensure!(done == 0, "madvise: {}", std::io::Error::last_os_error());
        Ok(())
    }
}

/// What the helper saw of one writer's wait, on its own clock. The wait
/// began before the writer was seen blocked and ended after the fault was
/// resolved, so it is at least the time between the two; it lies inside
/// the writer's `write()`, so it is at most that call's length. Unlike the
/// fault's length, these bounds hold however long a loaded machine keeps
/// the writers, the holder or the handler off a CPU.
#[derive(Debug, Clone, Copy)]
struct WaitBounds {
    at_least_ns: u64,
    at_most_ns: u64,
}

/// One round of a holder test: the holder (told through `go`) faults in
/// `pipe_write` with the mutex held; once the fault is in, two writers
/// start writing to the same pipe (they wait for the mutex); `meanwhile`
/// runs; the fault is resolved; the holder and writers finish and the
/// pipe is drained of their three pages. Returns the writers' wait bounds
/// and the most the holder can have slept in the fault: from `go` to the
/// fault's resolution, on this clock.
fn faulting_round(
    page: &FaultingPage,
    go: &std::sync::mpsc::Sender<i32>,
    done: &std::sync::mpsc::Receiver<Result<()>>,
    (write_fd, read_fd): (i32, i32),
    meanwhile: impl FnOnce() -> Result<()>,
) -> Result<([WaitBounds; 2], u64)> {
    page.forget()?;
    let going = Instant::now();
    go.send(write_fd)?;
    page.wait_for_fault()?;
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let writers: Vec<_> = (0..2)
        .map(|writer| {
            let tid_tx = tid_tx.clone();
            std::thread::spawn(move || -> Result<Duration> {
                tid_tx.send((writer, thread_id()))?;
                let called = Instant::now();
                write_all(write_fd, [b'w'; PAGE].as_ptr(), PAGE)?;
                Ok(called.elapsed())
            })
        })
        .collect();
    // By writer, not by arrival: a writer's bounds pair the moment it was
    // seen blocked with its own call (the second writer to start may be
    // the first to say its id).
    let mut tids = [0; 2];
    for _ in 0..2 {
        let (writer, tid) = tid_rx.recv()?;
        tids[writer] = tid;
    }
    // The known answer (two waits a round, each as long as the fault) holds
    // only once both writers wait: on a busy machine a writer can start
    // after a short fault is over and never wait at all.
    let seen_blocked = [wait_until_blocked(tids[0])?, wait_until_blocked(tids[1])?];
    meanwhile()?;
    let resolving = Instant::now();
    page.resolve(&[b'u'; PAGE])?;
    let slept_at_most = going.elapsed().as_nanos() as u64;
    done.recv()??;
    let mut calls = Vec::with_capacity(2);
    for writer in writers {
        calls.push(
            writer
                .join()
                .map_err(|_| anyhow::anyhow!("a writer panicked"))??,
        );
    }
    let mut drain = vec![0u8; 3 * PAGE];
    let mut left = 3 * PAGE;
    while left > 0 {
        // SAFETY: our pipe and buffer.
        let got = unsafe { libc::read(read_fd, drain.as_mut_ptr().cast(), left) };
        ensure!(got > 0, "read: {}", std::io::Error::last_os_error());
        left -= got as usize;
    }
    let bounds = |i: usize| WaitBounds {
        at_least_ns: resolving.saturating_duration_since(seen_blocked[i]).as_nanos() as u64,
        at_most_ns: calls[i].as_nanos() as u64,
    };
    Ok(([bounds(0), bounds(1)], slept_at_most))
}

/// Waits until thread `tid` of this process sleeps uninterruptibly (state
/// `D`: a writer waiting for the pipe mutex its holder keeps in a fault);
/// returns a moment at which it was seen so.
fn wait_until_blocked(tid: u32) -> Result<Instant> {
    let stat = format!("/proc/self/task/{tid}/stat");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = fs::read_to_string(&stat).with_context(|| format!("cannot read {stat}"))?;
        let seen = Instant::now();
        // `tid (comm) S …`: the state follows the comm's closing parenthesis.
        let state = text
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        if state == Some("D") {
            return Ok(seen);
        }
        ensure!(
            seen < deadline,
            "writer {tid} did not wait for the pipe mutex within 10 s (state {state:?})"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Helper mode: `integration --uffd-holder ROUNDS [--fault-ms MS,…]
/// [--pipes N] FILE` writes "INO TID" (the (first) pipe, the holder
/// thread) to FILE, then ROUNDS
/// times: the holder writes a page into the pipe from a
/// userfaultfd-registered buffer, so `pipe_write` faults with the pipe
/// mutex held; once the fault is in, two writers write to the same pipe
/// (they wait for the mutex); the handler resolves the fault 50 ms (or
/// round i: the i-th of `--fault-ms`, cycled) after it arrived; the pipe is
/// drained. With `--pipes N`, round i uses the i-th of N pipes (cycled):
/// N mutexes contended. At the end FILE gets one more line a writer:
/// "AT_LEAST_NS AT_MOST_NS", the bounds of its wait ([`WaitBounds`]).
pub(super) fn uffd_holder(args: &[String]) -> ! {
    let run = || -> Result<()> {
        let rounds: u32 = args.first().context("ROUNDS")?.parse()?;
        let option = |name: &str| args.iter().position(|a| a == name).map(|at| args.get(at + 1));
        let fault_ms: Vec<u64> = match option("--fault-ms") {
            Some(list) => list
                .context("--fault-ms MS,…")?
                .split(',')
                .map(str::parse)
                .collect::<std::result::Result<_, _>>()?,
            None => vec![FAULT_MS],
        };
        let pipes: usize = match option("--pipes") {
            Some(n) => n.context("--pipes N")?.parse()?,
            None => 1,
        };
        let pipes: Vec<(OwnedFd, OwnedFd, u64)> =
            (0..pipes.max(1)).map(|_| new_pipe()).collect::<Result<_>>()?;
        let page = Arc::new(FaultingPage::new()?);
        let page_addr = page.page as usize;
        // holder → main: its thread id; main → holder: go, on this pipe;
        // holder: done.
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<i32>();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || -> Result<()> {
            tid_tx.send(thread_id())?;
            while let Ok(fd) = go_rx.recv() {
                done_tx.send(write_all(fd, page_addr as *const u8, PAGE))?;
            }
            Ok(())
        });
        let holder_tid = tid_rx.recv()?;
        let file = args.last().context("FILE")?;
        let mut facts = format!("{} {holder_tid}\n", pipes[0].2);
        fs::write(file, &facts)?;
        for round in 0..rounds as usize {
            let (read, write, _) = &pipes[round % pipes.len()];
            let (bounds, _) = faulting_round(
                &page,
                &go_tx,
                &done_rx,
                (write.as_raw_fd(), read.as_raw_fd()),
                || {
                    // The fault came in just now; the holder sleeps in it, the
                    // writers wait for the mutex.
                    std::thread::sleep(Duration::from_millis(fault_ms[round % fault_ms.len()]));
                    Ok(())
                },
            )?;
            for b in bounds {
                facts += &format!("{} {}\n", b.at_least_ns, b.at_most_ns);
            }
        }
        fs::write(file, facts)?;
        drop(go_tx);
        holder
            .join()
            .map_err(|_| anyhow::anyhow!("the holder panicked"))??;
        Ok(())
    };
    std::process::exit(match run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("uffd-holder: {e:#}");
            1
        }
    })
}

/// Contended pipe-mutex waits by construction: the `--uffd-holder`
/// helper, `rounds` times, keeps a pipe's mutex held in a 2 ms page fault
/// while two writers wait for it, over `pipes` pipes in turn. A herd
/// contends only while two of its members run at once, which a machine
/// busy with something else need not allow (its members then pass the
/// token to themselves on one CPU); these waits happen whatever runs beside
/// them. Returns the first pipe's inode and the waits made, two a round
/// (each writer's).
pub(super) fn contend(rounds: u32, pipes: u32) -> Result<(u64, u64)> {
    let facts = scratch("contend.facts");
    let out = run(Command::new(std::env::current_exe()?)
        .args(["--uffd-holder", &rounds.to_string(), "--fault-ms", "2"])
        .args(["--pipes", &pipes.to_string()])
        .arg(&facts))?;
    let written = fs::read_to_string(&facts);
    let _ = fs::remove_file(&facts);
    ensure!(
        out.status.success(),
        "the contending helper: {:?} {}",
        out.status,
        text(&out.stderr)
    );
    let (ino, _) = ino_and_tid(&written?)?;
    Ok((ino, 2 * u64::from(rounds)))
}

/// How long the real-time task keeps the woken holder off its CPU.
const HOG_MS: u64 = 50;

fn become_realtime() -> Result<()> {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: this thread's own policy.
    let set = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    ensure!(set == 0, "SCHED_FIFO: {}", std::io::Error::last_os_error());
    Ok(())
}

/// Helper mode: `integration --preempted-holder ROUNDS FILE` writes "INO
/// TID" (the pipe, the holder) to FILE, then ROUNDS times: the holder,
/// pinned to CPU 0, faults in `pipe_write` with the mutex held (as in
/// `--uffd-holder`); two writers on CPU 1 wait for it; 2 ms later a
/// SCHED_FIFO task pinned to CPU 0 starts spinning for 50 ms, and the fault
/// is resolved: the holder is woken with the mutex held but cannot run
/// until the real-time task lets go of its CPU. That is lock-holder
/// preemption as the waiters see it, made certain: a CPU-bound holder
/// inside `pipe_write` is only preempted at a preemption point, and kernels
/// built with `PREEMPT_NONE` (this project's development host) have almost
/// none there. At the end FILE gets a third line: the most the holder can
/// have slept in its faults, in ns (the rounds' `go` to resolution).
pub(super) fn preempted_holder(args: &[String]) -> ! {
    let run = || -> Result<()> {
        let rounds: u32 = args.first().context("ROUNDS")?.parse()?;
        pin_to(1)?;
        let (read, write, ino) = new_pipe()?;
        let page = Arc::new(FaultingPage::new()?);
        let (fd, page_addr) = (write.as_raw_fd(), page.page as usize);
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<i32>();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || -> Result<()> {
            pin_to(0)?;
            tid_tx.send(thread_id())?;
            while let Ok(fd) = go_rx.recv() {
                done_tx.send(write_all(fd, page_addr as *const u8, PAGE))?;
            }
            Ok(())
        });
        let (hog_tx, hog_rx) = std::sync::mpsc::channel::<()>();
        let (spinning_tx, spinning_rx) = std::sync::mpsc::channel();
        let hog = std::thread::spawn(move || -> Result<()> {
            pin_to(0)?;
            become_realtime()?;
            while hog_rx.recv().is_ok() {
                spinning_tx.send(())?;
                let spin = Instant::now();
                while spin.elapsed() < Duration::from_millis(HOG_MS) {
                    std::hint::spin_loop();
                }
            }
            Ok(())
        });
        let holder_tid = tid_rx.recv()?;
        let file = args.get(1).context("FILE")?;
        fs::write(file, format!("{ino} {holder_tid}\n"))?;
        let mut slept_at_most = 0;
        for _ in 0..rounds {
            let (_, slept) = faulting_round(&page, &go_tx, &done_rx, (fd, read.as_raw_fd()), || {
                std::thread::sleep(Duration::from_millis(2));
                // The real-time task takes CPU 0 before the holder wakes.
                hog_tx.send(())?;
                spinning_rx.recv()?;
                Ok(())
            })?;
            slept_at_most += slept;
        }
        fs::write(file, format!("{ino} {holder_tid}\n{slept_at_most}\n"))?;
        drop((go_tx, hog_tx));
        holder
            .join()
            .map_err(|_| anyhow::anyhow!("the holder panicked"))??;
        hog.join()
            .map_err(|_| anyhow::anyhow!("the real-time task panicked"))??;
        Ok(())
    };
    std::process::exit(match run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("preempted-holder: {e:#}");
            1
        }
    })
}

/// The pipe-mutex row of pipe `ino` and, in it, owner `tid`.
fn mutex_row_and_owner(report: &TraceReport, ino: u64, tid: u64) -> Result<(LockRow, OwnerRow)> {
    let row = row_of(&pipe_rows(report, ino), LockClass::PipeMutex)
        .with_context(|| format!("no pipe-mutex row for pipe:[{ino}]: {}", shown(&report.locks)))?
        .clone();
    let owner = row
        .owners
        .iter()
        .find(|o| u64::from(o.tid) == tid)
        .with_context(|| format!("holder {tid} is not among the owners: {}", shown(&row.owners)))?
        .clone();
    Ok((row, owner))
}

/// What a holder was doing, as (on a CPU, runnable, sleeping) ns; an error
/// where the split was not measured.
fn split(state: &HolderState) -> Result<[u64; 3]> {
    match (
        state.holder_on_cpu_ns,
        state.holder_runnable_ns,
        state.holder_sleeping_ns,
    ) {
        (Some(on_cpu), Some(runnable), Some(sleeping)) => Ok([on_cpu, runnable, sleeping]),
        _ => bail!("no holder split: {}", shown(state)),
    }
}

/// The places of [`split`]'s runnable and sleeping states (on a CPU is 0).
const RUNNABLE: usize = 1;
const SLEEPING: usize = 2;

/// (INO, TID) as a helper wrote them.
fn ino_and_tid(facts: &str) -> Result<(u64, u64)> {
    let mut words = facts.split_whitespace().map(str::parse::<u64>);
    Ok((words.next().context("ino")??, words.next().context("tid")??))
}

/// The modes a holder test traces in: tracepoint mode where hooks cannot
/// work (this host), fentry and tracepoint mode in the VMs (kprobe mode
/// shares fentry's contention programs).
fn why_modes() -> Result<std::result::Result<Vec<&'static str>, Outcome>> {
    if let Some(skip) = cannot_load() {
        return Ok(Err(skip));
    }
    if in_vm() {
        return Ok(match mode_refusal("fentry")? {
            Some(why) => Err(Outcome::Skipped(why)),
            None => Ok(vec!["fentry", "tracepoint"]),
        });
    }
    Ok(Ok(vec!["tracepoint"]))
}

/// A holder that sleeps 50 ms in a page fault with the pipe mutex held: the
/// waits on that mutex last about 50 ms, the holder is their owner, and it
/// slept through at least 80 % of them.
fn holder_sleeping_in_a_page_fault_is_seen_sleeping() -> Result<Outcome> {
    match why_modes()? {
        Ok(modes) => modes.into_iter().try_for_each(sleeping_holder_in)?,
        Err(skip) => return Ok(skip),
    }
    Ok(Outcome::Passed)
}
register!(Kernel holder_sleeping_in_a_page_fault_is_seen_sleeping);

/// The trace arguments of a holder test: in the hooked modes the holds are
/// split too (`--hold-states`).
fn holder_trace_args(mode: &str) -> Vec<&str> {
    let mut args = vec!["--mode", mode, "--class", "pipe-mutex"];
    if mode != "tracepoint" {
        args.push("--hold-states");
    }
    args
}

/// In the hooked modes, the pipe-mutex row's holds: the share of them the
/// holders spent in `state` (the holder's long hold dominates the writers'
/// short ones). None in tracepoint mode.
fn hold_share(mode: &str, row: &LockRow, state: usize) -> Result<Option<f64>> {
    if mode == "tracepoint" {
        return Ok(None);
    }
    let holds = split(&row.holds.as_holder()).with_context(|| format!("{mode}: the holds"))?;
    let total: u64 = holds.iter().sum();
    ensure!(total > 0, "{mode}: no hold split: {}", shown(row));
    Ok(Some(holds[state] as f64 / total as f64))
}

fn sleeping_holder_in(mode: &str) -> Result<()> {
    let rounds = 5;
    let (report, facts) = trace_helper(
        "uffd",
        &holder_trace_args(mode),
        &["--uffd-holder", &rounds.to_string()],
    )?;
    let (ino, tid) = ino_and_tid(&facts)?;
    let (row, owner) = mutex_row_and_owner(&report, ino, tid).with_context(|| mode.to_owned())?;
    let waits = owner.waits;
    ensure!(
        waits >= rounds && waits <= 2 * rounds,
        "{waits} waits for the holder, want {rounds}..{} (two writers a round, one of which may find the \
         other owning it): {}",
        2 * rounds,
        shown(&owner)
    );
    // The longest wait lies within the helper's bounds of its writers'
    // waits (each from seeing the writer blocked to resolving the fault,
    // and at most its write call): a loaded host stretches a TCG guest's
    // FAULT_MS fault, and the bounds stretch with it.
    let max = owner.wait_max_ns;
    let bounds = wait_bounds(&facts)?;
    let at_least = bounds.iter().map(|b| b.at_least_ns).max().unwrap_or(0);
    let at_most = bounds.iter().map(|b| b.at_most_ns).max().unwrap_or(0);
    ensure!(
        max >= at_least && max <= at_most && max >= FAULT_MS * 1_000_000,
        "longest wait {max} ns, want {at_least}..{at_most} (the writers' bounds) and ≥ the {FAULT_MS} ms \
         fault: {}",
        shown(&owner)
    );
    let states = split(&owner.holder)?;
    let (sleeping, total) = (states[SLEEPING], states.iter().sum::<u64>());
    ensure!(
        sleeping * 10 >= total * 8 && total > 0,
        "the holder slept {sleeping} of {total} ns of the waits it caused, want ≥ 80 %: {}",
        shown(&owner)
    );
    ensure!(
        split(&row.holder)?[SLEEPING] >= sleeping,
        "the row's sleeping time is at least its owner's: {}",
        shown(&row)
    );
    let holds = hold_share(mode, &row, SLEEPING)?;
    if let Some(share) = holds {
        ensure!(
            share >= 0.8,
            "{mode}: holders slept {:.0} % of their holds, want ≥ 80 %",
            share * 100.0
        );
    }
    println!(
        "  {mode}: {waits} waits for the faulting holder, longest {:.1} ms, holder sleeping {:.0} % of them{}",
        max as f64 / 1e6,
        sleeping as f64 * 100.0 / total as f64,
        holds.map_or(String::new(), |s| format!("; holds {:.0} % sleeping", s * 100.0))
    );
    Ok(())
}

/// The writers' wait bounds the uffd helper appended to its facts, one
/// line a writer after the first line (INO TID).
fn wait_bounds(facts: &str) -> Result<Vec<WaitBounds>> {
    facts
        .lines()
        .skip(1)
        .map(|line| {
            let mut words = line.split_whitespace().map(str::parse::<u64>);
            let (Some(Ok(at_least_ns)), Some(Ok(at_most_ns)), None) =
                (words.next(), words.next(), words.next())
            else {
                bail!("not a wait's bounds: {line:?}");
            };
            ensure!(at_least_ns <= at_most_ns, "bounds out of order: {line:?}");
            Ok(WaitBounds {
                at_least_ns,
                at_most_ns,
            })
        })
        .collect()
}

/// Waits whose lengths are known read back as their percentiles, within
/// the bound the report states: ten rounds whose holder sleeps 5, 10, 15,
/// 20, 40, 70, 80, 90, 100 and 110 ms in a fault with the pipe mutex held,
/// two writers waiting out each. The helper bounds every wait on its own
/// clock ([`WaitBounds`]); if each wait lies within its bounds, the k-th
/// shortest wait lies between the k-th shortest lower and the k-th
/// shortest upper bound, so the p50 (the 10th of 20) and the p90 (the
/// 18th) must lie there too, widened by the stated error. Log2 buckets
/// would have read the 40 ms round's p50 as 67 ms, the top of
/// 33.5..67.1 ms.
fn known_waits_read_back_as_their_percentiles() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    let faults: [u64; 10] = [5, 10, 15, 20, 40, 70, 80, 90, 100, 110];
    let list = faults.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let (report, facts) = trace_helper(
        "uffd-percentiles",
        &["--mode", "tracepoint", "--class", "pipe-mutex"],
        &["--uffd-holder", "10", "--fault-ms", &list],
    )?;
    let (ino, _) = ino_and_tid(&facts)?;
    let bounds = wait_bounds(&facts)?;
    ensure!(bounds.len() == 20, "{} writers' bounds, want 20", bounds.len());
    let mut at_least: Vec<u64> = bounds.iter().map(|b| b.at_least_ns).collect();
    let mut at_most: Vec<u64> = bounds.iter().map(|b| b.at_most_ns).collect();
    at_least.sort_unstable();
    at_most.sort_unstable();
    let row = row_of(&pipe_rows(&report, ino), LockClass::PipeMutex)
        .with_context(|| format!("no pipe-mutex row for pipe:[{ino}]: {}", shown(&report.locks)))?;
    let wait = row.wait.as_ref().context("no wait timing")?;
    ensure!(
        wait.count == 20,
        "{} waits, want 2 a round: {}",
        wait.count,
        shown(wait)
    );
    let bound = wait
        .percentile_error
        .with_context(|| format!("no error bound: {}", shown(wait)))?;
    ensure!(bound <= 0.0625, "the stated bound {bound} is over 6.25 %");
    let ms = |ns: f64| ns / 1e6;
    let (max, longest) = (wait.max_ns, (at_least[19], at_most[19]));
    ensure!(
        (longest.0..=longest.1).contains(&max),
        "the longest wait {:.2} ms, want {:.2}..{:.2} ms (the longest wait's bounds): {}",
        ms(max as f64),
        ms(longest.0 as f64),
        ms(longest.1 as f64),
        shown(wait)
    );
    for (q, field, got) in [(0.5, "p50_ns", wait.p50_ns), (0.9, "p90_ns", wait.p90_ns)] {
        let rank = (q * 20.0f64).ceil() as usize;
        let low = at_least[rank - 1] as f64 * (1.0 - bound);
        let high = at_most[rank - 1] as f64 * (1.0 + bound);
        let got = got as f64;
        ensure!(
            (low..=high).contains(&got),
            "{field} {:.2} ms, want {:.2}..{:.2} ms (wait {rank} of 20 lies within {:.2}..{:.2} ms; \
             ± {:.2} %): {}",
            ms(got),
            ms(low),
            ms(high),
            ms(at_least[rank - 1] as f64),
            ms(at_most[rank - 1] as f64),
            bound * 100.0,
            shown(wait)
        );
        println!(
            "  {field} {:.2} ms; wait {rank} of 20 lies within {:.2}..{:.2} ms (the {} ms round's fault)",
            ms(got),
            ms(at_least[rank - 1] as f64),
            ms(at_most[rank - 1] as f64),
            faults[(rank - 1) / 2]
        );
    }
    Ok(Outcome::Passed)
}
register!(Kernel known_waits_read_back_as_their_percentiles);

/// A holder woken with the mutex held while a SCHED_FIFO task keeps its
/// CPU for 50 ms: the writers' waits for it (and, hooked, its holds) are
/// mostly spent with the holder runnable, about 50 ms a round.
fn holder_preempted_by_a_realtime_task_is_seen_runnable() -> Result<Outcome> {
    if std::thread::available_parallelism()?.get() < 2 {
        return Ok(Outcome::Skipped(
            "needs 2 CPUs (the holder's and the writers')".into(),
        ));
    }
    match why_modes()? {
        Ok(modes) => modes.into_iter().try_for_each(preempted_holder_in)?,
        Err(skip) => return Ok(skip),
    }
    Ok(Outcome::Passed)
}
register!(Kernel holder_preempted_by_a_realtime_task_is_seen_runnable);

fn preempted_holder_in(mode: &str) -> Result<()> {
    let rounds: u32 = 5;
    let (report, facts) = trace_helper(
        "preempted",
        &holder_trace_args(mode),
        &["--preempted-holder", &rounds.to_string()],
    )?;
    let (ino, tid) = ino_and_tid(&facts)?;
    let slept_at_most: u64 = facts
        .split_whitespace()
        .nth(2)
        .context("the helper wrote no bound of the holder's sleep")?
        .parse()?;
    let (row, owner) = mutex_row_and_owner(&report, ino, tid)?;
    // The known answer: each round the holder is woken while the real-time
    // task keeps its CPU for HOG_MS, so it waits runnable, the mutex held,
    // for about HOG_MS (less the moment the fault takes to be resolved):
    // at least four fifths of ROUNDS × HOG_MS. Its sleep in the fault
    // before that varies with the machine's load (a loaded host stretches
    // a TCG guest's), but lies within what the helper's clock saw from
    // setting the holder going to resolving its fault, summed over the
    // rounds.
    let expected = u64::from(rounds) * HOG_MS * 1_000_000 * 8 / 10;
    let holds = hold_share(mode, &row, RUNNABLE)?;
    if holds.is_some() {
        let [on_cpu, runnable, sleeping] = split(&row.holds.as_holder())?;
        ensure!(
            runnable >= expected && runnable > on_cpu && sleeping <= slept_at_most,
            "{mode}: the holds were {:.1} ms runnable, {:.1} ms on a CPU, {:.1} ms sleeping; want runnable ≥ \
             {:.1} ms and more than on a CPU, sleeping ≤ {:.1} ms",
            runnable as f64 / 1e6,
            on_cpu as f64 / 1e6,
            sleeping as f64 / 1e6,
            expected as f64 / 1e6,
            slept_at_most as f64 / 1e6
        );
    }
    let [on_cpu, runnable, sleeping] = split(&owner.holder)?;
    let total = on_cpu + runnable + sleeping;
    // Two writers wait at once: each sees the holder's sleep.
    ensure!(
        runnable >= expected && runnable > on_cpu && sleeping <= 2 * slept_at_most,
        "the waits the holder caused: {:.1} ms with it runnable, {:.1} ms on a CPU, {:.1} ms sleeping; want \
         runnable ≥ {:.1} ms and more than on a CPU, sleeping ≤ {:.1} ms (two writers' share of its sleep): {}",
        runnable as f64 / 1e6,
        on_cpu as f64 / 1e6,
        sleeping as f64 / 1e6,
        expected as f64 / 1e6,
        2.0 * slept_at_most as f64 / 1e6,
        shown(&owner)
    );
    println!(
        "  {mode}: {} waits for the preempted holder, {:.1} ms in all, holder runnable {:.0} % of it{}",
        owner.waits,
        total as f64 / 1e6,
        runnable as f64 * 100.0 / total as f64,
        holds.map_or(String::new(), |s| format!("; holds {:.0} % runnable", s * 100.0))
    );
    Ok(())
}
