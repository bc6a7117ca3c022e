//! pipelock's integration tests: the built binary against the kernel it runs on.
//!
//! They run on the host (`cargo xtask test`) and are meant to run unchanged
//! inside the VM kernels. A test that cannot run here (not root, a stub build)
//! is reported as skipped with its reason, and counted as skipped, never passed.
use std::{
    fs,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use anyhow::{Context as _, Result, bail, ensure};
use pipelock_common::{maps, programs};

enum Outcome {
    Passed,
    Skipped(String),
}

/// Where a test runs: `Kernel` tests exercise what differs between kernels
/// (program types, kallsyms, BTF) and also run inside the VMs; `Host` tests
/// check the binary's contract, fixtures and workloads, which do not depend on
/// the kernel version and would only be slow under emulation.
#[derive(PartialEq)]
enum Scope {
    Kernel,
    Host,
}

#[path = "integration/ab.rs"]
mod ab;
#[path = "integration/ab_source.rs"]
mod ab_source;
#[path = "integration/ab_source_git.rs"]
mod ab_source_git;
#[path = "integration/browser.rs"]
mod browser;
#[path = "integration/callers.rs"]
mod callers;
#[path = "integration/compare.rs"]
mod compare;
#[path = "integration/contract.rs"]
mod contract;
#[path = "integration/deadlock.rs"]
mod deadlock;
#[path = "integration/exact.rs"]
mod exact;
#[path = "integration/flame.rs"]
mod flame;
#[path = "integration/floor.rs"]
mod floor;
#[path = "integration/identity.rs"]
mod identity;
#[path = "integration/lockref.rs"]
mod lockref;
#[path = "integration/memory.rs"]
mod memory;
#[path = "integration/owners.rs"]
mod owners;
#[path = "integration/perf.rs"]
mod perf;
#[path = "integration/perf_callers.rs"]
mod perf_callers;
#[path = "integration/probe.rs"]
mod probe;
#[path = "integration/report.rs"]
mod report;
#[path = "integration/serve.rs"]
mod serve;
#[path = "integration/serve_fleet.rs"]
mod serve_fleet;
#[path = "integration/skips.rs"]
mod skips;
#[path = "integration/soak.rs"]
mod soak;
#[path = "integration/splice.rs"]
mod splice;
#[path = "integration/top.rs"]
mod top;
#[path = "integration/trace.rs"]
mod trace;
#[path = "integration/traced.rs"]
mod traced;
#[path = "integration/unit.rs"]
mod unit;
#[path = "integration/watchdog.rs"]
mod watchdog;
#[path = "integration/why.rs"]
mod why;
#[path = "integration/workloads.rs"]
mod workloads;

/// A test, where it is defined, and where it runs.
struct Test {
    name: &'static str,
    scope: Scope,
    run: fn() -> Result<Outcome>,
    file: &'static str,
    line: u32,
}

/// Every test, gathered from the files that define them: each registers
/// itself beside its definition, so no list is kept by hand.
#[linkme::distributed_slice]
static TESTS: [Test];

/// `register!(Scope name);` after a test function adds it to [`TESTS`].
macro_rules! register {
    ($scope:ident $name:ident) => {
        const _: () = {
            #[linkme::distributed_slice(crate::TESTS)]
            static TEST: crate::Test = crate::Test {
                name: stringify!($name),
                scope: crate::Scope::$scope,
                run: $name,
                file: file!(),
                line: line!(),
            };
        };
    };
}
use register;

/// One test per attach mode, all running the same body (`fn body(mode:
/// &str) -> Result<Outcome>`), each registered under its own name:
///
/// ```text
/// per_mode!(Kernel body {
///     fentry_does_it: "fentry",
///     kprobe_does_it: "kprobe",
/// });
/// ```
macro_rules! per_mode {
    ($scope:ident $body:ident { $($name:ident: $mode:literal),+ $(,)? }) => {
        $(
            fn $name() -> Result<Outcome> {
                $body($mode)
            }
            register!($scope $name);
        )+
    };
}
use per_mode;
use traced::{
    Kind, busiest, check_percentiles, parse_report, pipe_rows, row_of, shown, trace_contended,
    trace_exact_pipe_io, trace_exact_pipe_io_with, trace_helper, trace_into, trace_json, trace_stat_storm,
};

/// Set by the VM's init (`cargo xtask vm-test`).
fn in_vm() -> bool {
    std::env::var_os("PIPELOCK_IN_VM").is_some()
}

/// A new pipe's descriptors (read, write; close-on-exec) and its inode
/// number, as `/proc/PID/fd` and pipelock's rows name it.
fn pipe_with_inode() -> Result<([i32; 2], u64)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors.
    ensure!(
        unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == 0,
        "pipe failed"
    );
    // SAFETY: fstat on a descriptor we own.
    let ino = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        ensure!(libc::fstat(fds[0], &mut st) == 0, "fstat failed");
        st.st_ino
    };
    Ok((fds, ino))
}

/// Helper mode for the exact-count tests: `integration --exact-pipe-io N HOW FILE`
/// writes its pipe's inode number to FILE, then does exactly N writes and N
/// reads of 512 bytes on that pipe, from one thread.
fn exact_pipe_io(args: &[String]) -> ! {
    let run = || -> Result<()> {
        let n: u64 = args.first().context("N")?.parse()?;
        let (fds, ino) = pipe_with_inode()?;
        fs::write(args.get(2).context("FILE")?, ino.to_string())?;
        // HOW `nowait`: pwritev2/preadv2 with RWF_NOWAIT (IOCB_NOWAIT in the
        // kernel, the flag io_uring's inline attempts carry); `plain`: write, read.
        let nowait = args.get(1).is_some_and(|a| a == "nowait");
        let mut buf = [0u8; 512];
        for _ in 0..n {
            let iov = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: 512,
            };
            // SAFETY: 512-byte buffer, descriptors we own.
            let (wrote, read) = unsafe {
                if nowait {
                    (
                        libc::pwritev2(fds[1], &iov, 1, -1, libc::RWF_NOWAIT),
                        libc::preadv2(fds[0], &iov, 1, -1, libc::RWF_NOWAIT),
                    )
                } else {
                    (
                        libc::write(fds[1], buf.as_ptr().cast(), 512),
                        libc::read(fds[0], buf.as_mut_ptr().cast(), 512),
                    )
                }
            };
            ensure!(
                wrote == 512 && read == 512,
                "write {wrote}, read {read}: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    };
    std::process::exit(match run() {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("exact-pipe-io: {err:#}");
            1
        }
    })
}

/// Helper mode for the lockref tests: `integration --stat-storm N DIR NAME`
/// creates DIR/NAME, then from DIR stat()s `NAME` exactly N times, from one
/// thread (a relative path: no extra reference on the root is taken).
fn stat_storm(args: &[String]) -> ! {
    let run = || -> Result<()> {
        let n: u64 = args.first().context("N")?.parse()?;
        let dir = Path::new(args.get(1).context("DIR")?);
        let name = args.get(2).context("NAME")?;
        fs::create_dir_all(dir)?;
        fs::write(dir.join(name), b"lockref target\n")?;
        std::env::set_current_dir(dir)?;
        let c_name = std::ffi::CString::new(name.as_str())?;
        for _ in 0..n {
            // SAFETY: a NUL-terminated path and a stat buffer we own.
            let rc = unsafe {
                let mut st: libc::stat = std::mem::zeroed();
                libc::stat(c_name.as_ptr(), &mut st)
            };
            ensure!(rc == 0, "stat failed");
        }
        Ok(())
    };
    std::process::exit(match run() {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("stat-storm: {err:#}");
            1
        }
    })
}

/// Helper mode for the churn test: `integration --pipe-churn PIPES MESSAGES
/// FILE` makes PIPES pipes one after another, each written by 2 threads
/// (MESSAGES 64-byte messages each) and read by 2 others until it is empty
/// and closed, then closed; FILE gets each pipe's inode number, a line each.
/// Freed pipes hand their addresses to the next ones.
fn pipe_churn(args: &[String]) -> ! {
    let run = || -> Result<()> {
        let pipes: u64 = args.first().context("PIPES")?.parse()?;
        let messages: u64 = args.get(1).context("MESSAGES")?.parse()?;
        let mut inodes = String::new();
        for _ in 0..pipes {
            let (fds, ino) = pipe_with_inode()?;
            inodes.push_str(&format!("{ino}\n"));
            let (read_fd, write_fd) = (fds[0], fds[1]);
            // All four start together: threads started one after another
            // can miss each other on a quiet machine, and a pipe nobody
            // contends has no row in tracepoint mode.
            let start = &std::sync::Barrier::new(4);
            std::thread::scope(|scope| -> Result<()> {
                let readers: Vec<_> = (0..2)
                    .map(|_| {
                        scope.spawn(move || {
                            start.wait();
                            let mut buf = [0u8; 64];
                            // SAFETY: a 64-byte buffer; until EOF (every writer gone).
                            while unsafe { libc::read(read_fd, buf.as_mut_ptr().cast(), 64) } > 0 {}
                        })
                    })
                    .collect();
                let writers: Vec<_> = (0..2)
                    .map(|_| {
                        scope.spawn(move || {
                            start.wait();
                            let buf = [7u8; 64];
                            for _ in 0..messages {
                                // SAFETY: a 64-byte buffer; the pipe stays open until the writers are joined.
                                unsafe { libc::write(write_fd, buf.as_ptr().cast(), 64) };
                            }
                        })
                    })
                    .collect();
                for writer in writers {
                    writer.join().map_err(|_| anyhow::anyhow!("a writer panicked"))?;
                }
                // SAFETY: the last write end: the readers see EOF.
                unsafe { libc::close(write_fd) };
                for reader in readers {
                    reader.join().map_err(|_| anyhow::anyhow!("a reader panicked"))?;
                }
                Ok(())
            })?;
            // SAFETY: our descriptor, no thread uses it any more.
            unsafe { libc::close(read_fd) };
        }
        fs::write(args.get(2).context("FILE")?, inodes)?;
        Ok(())
    };
    std::process::exit(match run() {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("pipe-churn: {err:#}");
            1
        }
    })
}

/// Helper mode for the breadth test: `integration --pipe-breadth PIPES FILE`
/// opens PIPES pipes, all alive at once, writes and reads one byte on each,
/// writes their inode numbers to FILE, then closes them all.
fn pipe_breadth(args: &[String]) -> ! {
    let run = || -> Result<()> {
        let pipes: usize = args.first().context("PIPES")?.parse()?;
        let want = (2 * pipes + 64) as libc::rlim_t;
        let limit = libc::rlimit {
            rlim_cur: want,
            rlim_max: want,
        };
        // SAFETY: a plain struct; raising needs root, which the tests have.
        ensure!(
            unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } == 0,
            "cannot raise RLIMIT_NOFILE"
        );
        let mut all = Vec::with_capacity(pipes);
        let mut inodes = String::new();
        for _ in 0..pipes {
            let (fds, ino) = pipe_with_inode()?;
            inodes.push_str(&format!("{ino}\n"));
            all.push(fds);
        }
        let mut byte = [7u8; 1];
        for fds in &all {
            // SAFETY: a one-byte buffer, our descriptors.
            unsafe {
                ensure!(libc::write(fds[1], byte.as_ptr().cast(), 1) == 1, "write failed");
                ensure!(
                    libc::read(fds[0], byte.as_mut_ptr().cast(), 1) == 1,
                    "read failed"
                );
            }
        }
        fs::write(args.get(1).context("FILE")?, inodes)?;
        for fds in all {
            // SAFETY: our descriptors.
            unsafe {
                libc::close(fds[0]);
                libc::close(fds[1]);
            }
        }
        Ok(())
    };
    std::process::exit(match run() {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("pipe-breadth: {err:#}");
            1
        }
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).is_some_and(|a| a == "--exact-pipe-io") {
        exact_pipe_io(&args[2..]);
    }
    if args.get(1).is_some_and(|a| a == "--stat-storm") {
        stat_storm(&args[2..]);
    }
    if args.get(1).is_some_and(|a| a == "--pipe-churn") {
        pipe_churn(&args[2..]);
    }
    if args.get(1).is_some_and(|a| a == "--pipe-breadth") {
        pipe_breadth(&args[2..]);
    }
    if args.get(1).is_some_and(|a| a == "--splice-io") {
        splice::splice_io(&args[2..]);
    }
    if args.get(1).is_some_and(|a| a == "--splice-herd") {
        splice::splice_herd(&args[2..]);
    }
    if args.get(1).is_some_and(|a| a == "--uring-pipe-io") {
        splice::uring_pipe_io(&args[2..]);
    }
    if args.get(1).is_some_and(|a| a == "--soak") {
        soak::soak(&args[2..]);
    }
    if args.get(1).is_some_and(|a| a == "--uffd-holder") {
        why::uffd_holder(&args[2..]);
    }
    if args.get(1).is_some_and(|a| a == "--preempted-holder") {
        why::preempted_holder(&args[2..]);
    }
    if args.get(1).is_some_and(|a| a == "--watchdog-drill") {
        watchdog::drill();
    }
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    static TALLY: watchdog::Tally = watchdog::Tally::new();
    let limits = watchdog::Limits::here(in_vm());
    // The linker's order is not the files' order: run them file by file,
    // each file's in the order written.
    let mut tests: Vec<&Test> = TESTS.iter().collect();
    tests.sort_by_key(|t| (t.file, t.line));
    let selected = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    // A misspelt name would otherwise run nothing and pass.
    if !tests.iter().any(|t| selected(t.name)) {
        println!("integration: no test's name contains any of {filter:?}");
        std::process::exit(2);
    }
    for Test {
        name,
        scope,
        run: test,
        ..
    } in tests
    {
        if !selected(name) {
            continue;
        }
        if in_vm() && *scope == Scope::Host {
            continue;
        }
        let started = std::time::Instant::now();
        let outcome = watchdog::run(name, limits, &TALLY, test);
        // Timings show where CI time goes (TCG guests are ~50x slower).
        let took = format!("{:.1} s", started.elapsed().as_secs_f64());
        match outcome {
            Ok(Outcome::Passed) => {
                TALLY.pass();
                println!("test {name} ... ok ({took})");
            }
            Ok(Outcome::Skipped(why)) => {
                TALLY.skip();
                println!("test {name} ... skipped: {why}");
            }
            Err(err) => {
                TALLY.fail();
                println!("test {name} ... FAILED ({took}): {err:#}");
            }
        }
    }
    println!("{}", TALLY.closing_line());
    if TALLY.any_failed() {
        std::process::exit(1);
    }
}

/// The binary under test; the VM's init points PIPELOCK_BIN at its copy.
fn pipelock() -> Command {
    Command::new(pipelock_path())
}

/// The built `pipelock`'s path (`PIPELOCK_BIN` overrides it).
fn pipelock_path() -> String {
    std::env::var("PIPELOCK_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_pipelock").to_owned())
}

/// `pipelock`, started by `setpriv` as nobody holding only `caps`
/// (`+bpf,+perfmon`: effective, inheritable and ambient); Err with the
/// skip where setpriv is missing.
fn pipelock_as_nobody_with(caps: &str) -> std::result::Result<Command, Outcome> {
    if Command::new("setpriv").arg("--help").output().is_err() {
        return Err(Outcome::Skipped("setpriv is not installed (util-linux)".into()));
    }
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(format!("--inh-caps={caps}"))
        .arg(format!("--ambient-caps={caps}"))
        .arg(pipelock_path());
    Ok(cmd)
}

fn run(cmd: &mut Command) -> Result<Output> {
    cmd.output().with_context(|| format!("cannot run {cmd:?}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Why a test that loads eBPF programs cannot run here, if it cannot.
fn cannot_load() -> Option<Outcome> {
    if !is_root() {
        Some(Outcome::Skipped("needs root".to_owned()))
    } else if pipelock_user::bpf::object::OBJECT.is_empty() {
        Some(Outcome::Skipped(stub_reason()))
    } else {
        None
    }
}

fn stub_reason() -> String {
    "built with PIPELOCK_EBPF_STUB=1 (no eBPF object); `cargo xtask test` builds the real one".to_owned()
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kernels")
}

/// The value column of a `name   value` line of `pipelock probe` (columns
/// are at least two spaces apart, so `kprobe` does not match `kprobe PMU`).
fn field<'a>(report: &'a str, name: &str) -> Result<&'a str> {
    report
        .lines()
        .find_map(|line| {
            let rest = line.trim_start().strip_prefix(name)?;
            rest.starts_with("  ").then(|| rest.trim())
        })
        .with_context(|| format!("no `{name}` line in:\n{report}"))
}

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("pipelock-it-{}-{name}", std::process::id()))
}

/// Processes whose command line holds `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).replace('\0', " ").contains(marker))
        })
        .collect()
}

/// Why a test of hooked mode `mode` cannot run here, if it cannot.
fn hooked_mode_skip(mode: &str) -> Result<Option<Outcome>> {
    if let Some(skip) = cannot_load() {
        return Ok(Some(skip));
    }
    Ok(mode_refusal(mode)?.map(Outcome::Skipped))
}

/// The installed perf binary, if any.
fn perf_binary() -> Option<&'static str> {
    ["/usr/bin/perf", "/usr/local/bin/perf"]
        .into_iter()
        .find(|p| Path::new(p).exists())
}

/// Compares the contentions of the report's pipe-lock rows, summed per
/// address (a reused address has several rows), with the `contention_end`
/// events `perf lock record` wrote to `data` at that address from inside a
/// pipe read or write (its call chains say where: the tracepoint mode, by
/// design, attributes no other path, e.g. the pipe mutex taken at close).
/// 2 % slack, as events inside another BPF program are skipped. Returns how
/// many addresses were compared; removes `data`.
/// Whether perf lost events: such a run is void (perf's own ring
/// overflowed, its counts are short).
fn perf_lost(perf: &str, data: &Path) -> Result<bool> {
    let stats = run(Command::new(perf).args(["report", "--stats", "-i"]).arg(data))?;
    let stats = text(&stats.stdout);
    Ok(stats
        .lines()
        .any(|l| l.trim_start().starts_with("LOST") && !l.trim_end().ends_with(" 0")))
}

/// The pipe locks compared; Err(why) where the comparison would be void:
/// perf lost events, or it saw no contention in pipe read/write at all
/// (the herd never had two members at a pipe at once, which a machine
/// busy with something else need not allow: nothing to compare).
fn compare_with_perf(
    perf: &str,
    data: &Path,
    report: &pipelock_user::model::TraceReport,
) -> Result<std::result::Result<usize, &'static str>> {
    if perf_lost(perf, data)? {
        let _ = fs::remove_file(data);
        return Ok(Err("perf lost events (its ring overflowed)"));
    }
    let data_arg = data.to_str().context("non-UTF-8 temp path")?;
    let script = run(Command::new(perf).args(["script", "-i", data_arg, "-F", "event,trace,ip,sym"]))?;
    let _ = fs::remove_file(data);
    ensure!(script.status.success(), "perf script: {}", text(&script.stderr));
    let mut perf_ends: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    let (mut elsewhere, mut records) = (0, 0);
    let script = text(&script.stdout);
    for record in script.split("\n\n") {
        let mut lines = record.lines();
        let Some(rest) = lines
            .next()
            .and_then(|l| l.trim().strip_prefix("lock:contention_end:"))
        else {
            continue;
        };
        let Some(addr) = rest
            .split_whitespace()
            .next()
            .and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok())
        else {
            continue;
        };
        records += 1;
        let in_pipe_io = lines.any(|frame| {
            frame
                .split_whitespace()
                .nth(1)
                .is_some_and(|sym| PIPE_IO_FUNCTIONS.contains(&sym))
        });
        if in_pipe_io {
            *perf_ends.entry(addr).or_default() += 1;
        } else {
            elsewhere += 1;
        }
    }
    if perf_ends.is_empty() {
        return Ok(Err("perf saw no contention in pipe read/write"));
    }
    let mut ours: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
    for row in &report.locks {
        if !row.class.is_some_and(|c| c.name().starts_with("pipe-")) {
            continue;
        }
        *ours.entry(row.lock_addr).or_default() += row.contentions;
    }
    for (addr, ours) in &ours {
        let theirs = perf_ends.get(addr).copied().unwrap_or(0);
        let tolerance = (theirs as f64 * 0.02).ceil() as u64;
        ensure!(
            ours.abs_diff(theirs) <= tolerance.max(1),
            "{addr:#x}: pipelock {ours} vs perf {theirs} contention_end events"
        );
    }
    if ours.is_empty() {
        // Contention only at other locks inside pipe calls (the scheduler's):
        // void if pipelock has a row for each address perf saw.
        let named: std::collections::BTreeSet<u64> = report.locks.iter().map(|r| r.lock_addr).collect();
        let unseen: Vec<String> = perf_ends
            .keys()
            .filter(|addr| !named.contains(addr))
            .map(|addr| format!("{addr:#x}"))
            .collect();
        ensure!(
            unseen.is_empty(),
            "no pipe lock to compare, and perf saw contention in pipe read/write at {unseen:?}, which \
             pipelock has no row for: {}",
            shown(report)
        );
        return Ok(Err(
            "no pipe lock contended (perf saw only the other locks pipelock reports)",
        ));
    }
    println!("  perf: {elsewhere} of {records} contention_end events outside pipe read/write, not compared");
    Ok(Ok(ours.len()))
}

/// The kernel's pipe read/write entry points, all versions.
const PIPE_IO_FUNCTIONS: [&str; 6] = [
    "pipe_read",
    "pipe_write",
    "anon_pipe_read",
    "anon_pipe_write",
    "fifo_pipe_read",
    "fifo_pipe_write",
];

/// Whether `pipelock probe` says `mode` (fentry, kprobe) works here; why not.
fn mode_refusal(mode: &str) -> Result<Option<String>> {
    let out = run(pipelock().arg("probe"))?;
    ensure!(out.status.success(), "probe: {}", text(&out.stderr));
    let report = text(&out.stdout);
    let support = field(&report, mode)?;
    Ok((support != "yes").then(|| format!("{mode} does not work on this kernel ({support})")))
}

/// The comm the kernel gives this test binary's processes (15 bytes of its name).
fn own_comm() -> Result<String> {
    let exe = std::env::current_exe()?;
    let name = exe
        .file_name()
        .context("no file name")?
        .to_string_lossy()
        .into_owned();
    Ok(name.chars().take(15).collect())
}

/// pipelock's programs still loaded once it exited: the kernel frees a
/// program after its last descriptor closes, through RCU, so give it time.
fn programs_left_after_exit() -> Result<usize> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let left = pipelock_programs_loaded()?;
        if left == 0 || std::time::Instant::now() >= deadline {
            return Ok(left);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Loaded BPF programs whose (15-byte) kernel name is one of pipelock's
/// tracing programs (tracepoint, fentry and kprobe modes).
fn pipelock_programs_loaded() -> Result<usize> {
    let ours: Vec<&str> = [
        programs::PIPE_CONTENTION_BEGIN_BTF,
        programs::PIPE_CONTENTION_END_BTF,
        programs::PIPE_CONTENTION_BEGIN_TP,
        programs::PIPE_CONTENTION_END_TP,
        programs::PIPE_READ_ENTRY,
        programs::MUTEX_LOCK_ENTRY,
        programs::KP_PIPE_READ_ENTRY,
        programs::KP_MUTEX_LOCK_ENTRY,
        programs::HOOKED_CONTENTION_BEGIN,
    ]
    .iter()
    .map(|name| &name[..name.len().min(15)])
    .collect();
    let mut count = 0;
    for program in aya::programs::loaded_programs() {
        let program = program?;
        if program.name_as_str().is_some_and(|name| ours.contains(&name)) {
            count += 1;
        }
    }
    Ok(count)
}
