//! A test that runs too long is reported while it runs, then stopped.
//!
//! Nothing else bounds a test: one that waits forever on a child or a socket
//! would hold its guest until the VM's whole-run limit, and that limit only
//! says "timed out". The watchdog says which test, and what its processes
//! and the harness's threads are blocked in, from the kernel's own view
//! (`/proc/PID/wchan` and `/proc/PID/stack`).
use std::{
    fmt::Write as _,
    io::Write as _,
    sync::{
        atomic::{AtomicU32, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use super::*;

/// How long a test may run before it is reported, and before it is failed.
#[derive(Clone, Copy)]
pub struct Limits {
    pub report_every: Duration,
    pub fail_after: Duration,
}

impl Limits {
    /// In a guest the longest test takes about a minute under TCG, on the
    /// host the longest (`ab --source`) about ten beside the VMs; the limits
    /// allow several times that.
    pub fn here(in_vm: bool) -> Self {
        if in_vm {
            Self {
                report_every: Duration::from_secs(120),
                fail_after: Duration::from_secs(600),
            }
        } else {
            Self {
                report_every: Duration::from_secs(300),
                fail_after: Duration::from_secs(2400),
            }
        }
    }
}

/// The run's counts so far, shared with the watchdog, which prints the
/// closing line itself when it stops the run.
pub struct Tally {
    pub passed: AtomicU32,
    pub failed: AtomicU32,
    pub skipped: AtomicU32,
}

impl Tally {
    pub const fn new() -> Self {
        Self {
            passed: AtomicU32::new(0),
            failed: AtomicU32::new(0),
            skipped: AtomicU32::new(0),
        }
    }

    pub fn pass(&self) {
        self.passed.fetch_add(1, Ordering::Relaxed);
    }

    pub fn skip(&self) {
        self.skipped.fetch_add(1, Ordering::Relaxed);
    }

    pub fn fail(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    pub fn any_failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed) > 0
    }

    /// The harness's closing line, which the VM's judge parses.
    pub fn closing_line(&self) -> String {
        format!(
            "integration: {} passed, {} failed, {} skipped",
            self.passed.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
            self.skipped.load(Ordering::Relaxed)
        )
    }
}

/// Runs `test` named `name` under the watchdog: reported every
/// `limits.report_every`, and after `limits.fail_after` failed with its
/// processes killed and the run ended (exit 1), for a hung test cannot be
/// abandoned while it still holds its children and the locks they trace.
pub fn run<T>(name: &'static str, limits: Limits, tally: &'static Tally, test: impl FnOnce() -> T) -> T {
    let (done, finished) = mpsc::channel::<()>();
    let started = Instant::now();
    let harness = std::process::id();
    let watcher = thread::spawn(move || {
        let watcher_tid = gettid();
        loop {
            let left = limits.fail_after.saturating_sub(started.elapsed());
            match finished.recv_timeout(limits.report_every.min(left)) {
                Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            let took = started.elapsed().as_secs_f64();
            let blocked = blocked_in(harness, watcher_tid);
            if started.elapsed() < limits.fail_after {
                println!("test {name} ... still running after {took:.0} s: {blocked}");
                continue;
            }
            println!(
                "test {name} ... FAILED ({took:.1} s): did not finish within {} s (the harness's limit); {blocked}",
                limits.fail_after.as_secs()
            );
            for pid in descendants(harness) {
                // SAFETY: a plain signal to a process of our own tree.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            tally.fail();
            println!("the harness stopped the run at {name}: the tests after it did not run");
            println!("{}", tally.closing_line());
            let _ = std::io::stdout().flush();
            std::process::exit(1);
        }
    });
    let outcome = test();
    let _ = done.send(());
    let _ = watcher.join();
    outcome
}

fn gettid() -> u32 {
    // SAFETY: no arguments, no memory.
    u32::try_from(unsafe { libc::gettid() }).unwrap_or(0)
}

/// What the harness's threads (but the watcher) and its descendant
/// processes are doing: `pid comm state wchan`, the CPU time each has used
/// (a task that runs long without a child may be computing, not waiting),
/// then its kernel stack, innermost first, where readable.
fn blocked_in(harness: u32, watcher_tid: u32) -> String {
    let mut tasks: Vec<(u32, String)> = fs::read_dir(format!("/proc/{harness}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&tid| tid != watcher_tid)
        .map(|tid| (tid, format!("/proc/{harness}/task/{tid}")))
        .collect();
    tasks.extend(
        descendants(harness)
            .into_iter()
            .map(|pid| (pid, format!("/proc/{pid}"))),
    );
    let mut out = String::new();
    for (id, dir) in &tasks {
        let Ok(stat) = fs::read_to_string(format!("{dir}/stat")) else {
            continue;
        };
        let Some((comm, state)) = comm_and_state(&stat) else {
            continue;
        };
        let (user, system) = cpu_seconds(&stat).unwrap_or_default();
        let wchan = fs::read_to_string(format!("{dir}/wchan")).unwrap_or_default();
        let wchan = match wchan.trim() {
            "" | "0" => "-",
            w => w,
        }
        .to_owned();
        let stack: Vec<String> = fs::read_to_string(format!("{dir}/stack"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1).map(str::to_owned))
            .take(6)
            .collect();
        let _ = write!(
            out,
            "\n    {id} {comm} {state} {wchan} (cpu: user {user:.1} s, system {system:.1} s)"
        );
        if !stack.is_empty() {
            let _ = write!(out, ": {}", stack.join(" < "));
        }
    }
    if out.is_empty() {
        "no task of the harness is readable".to_owned()
    } else {
        format!("tasks (id, command, state, waiting in):{out}")
    }
}

/// `comm` and state from a `/proc/PID/stat` line (the command may hold
/// spaces and parentheses: it ends at the last `)`).
fn comm_and_state(stat: &str) -> Option<(String, String)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_owned();
    let state = stat.get(close + 1..)?.split_whitespace().next()?.to_owned();
    Some((comm, state))
}

/// User and system CPU seconds from a `/proc/PID/stat` line (`utime` and
/// `stime`, in clock ticks).
fn cpu_seconds(stat: &str) -> Option<(f64, f64)> {
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace().skip(11);
    // SAFETY: sysconf reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let ticks = |f: Option<&str>| f.and_then(|t| t.parse::<f64>().ok());
    Some((ticks(fields.next())? / hz, ticks(fields.next())? / hz))
}

/// The parent pid from a `/proc/PID/stat` line.
fn parent(stat: &str) -> Option<u32> {
    stat.get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Every process below `root`, parents before children.
fn descendants(root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let ppid = parent(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)?;
            Some((pid, ppid))
        })
        .collect();
    let mut found = vec![root];
    let mut at = 0;
    while at < found.len() {
        let of = found[at];
        found.extend(parents.iter().filter(|&&(_, p)| p == of).map(|&(pid, _)| pid));
        at += 1;
    }
    found.remove(0);
    found
}

/// `integration --watchdog-drill`: one test that waits on a `sleep 60`
/// child, under limits of seconds, for `the_watchdog_reports_then_stops_a_hung_test`.
pub fn drill() -> ! {
    static TALLY: Tally = Tally::new();
    let limits = Limits {
        report_every: Duration::from_secs(1),
        fail_after: Duration::from_secs(3),
    };
    let waited = run("a_test_that_hangs", limits, &TALLY, || {
        Command::new("sleep").arg("60").status()
    });
    println!("the watchdog let the test end: {waited:?}");
    std::process::exit(0)
}

/// The drill's test is reported while it waits, with its child's state,
/// then failed at the limit with the closing line; its child is killed.
fn the_watchdog_reports_then_stops_a_hung_test() -> Result<Outcome> {
    let out = Command::new(std::env::current_exe()?)
        .arg("--watchdog-drill")
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.code() == Some(1),
        "the drill exited {:?}: {text}",
        out.status
    );
    ensure!(
        text.contains("test a_test_that_hangs ... still running after 1 s: tasks"),
        "no report while it ran: {text}"
    );
    let sleep_line = text
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("sleep"))
        .with_context(|| format!("the report does not show the sleeping child: {text}"))?;
    ensure!(
        sleep_line.split_whitespace().nth(2) == Some("S"),
        "the child is not shown asleep: {sleep_line}"
    );
    ensure!(
        text.lines()
            .any(|l| l.starts_with("test a_test_that_hangs ... FAILED (")
                && l.contains(" s): did not finish within 3 s"))
            && text.contains("integration: 0 passed, 1 failed, 0 skipped"),
        "no failure at the limit: {text}"
    );
    let pid: u32 = sleep_line
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .context("no pid")?;
    let deadline = Instant::now() + Duration::from_secs(5);
    // The killed child, orphaned by the drill's exit, is reaped by init.
    while fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains("(sleep)")) {
        ensure!(Instant::now() < deadline, "the hung test's child {pid} lives on");
        thread::sleep(Duration::from_millis(100));
    }
    println!("  {}", sleep_line.trim());
    // The command and the parent from a stat line whose command holds
    // spaces and parentheses.
    let stat = "812 (a (b) c) S 811 812 1 0 -1 4194560 95 0 0 0";
    ensure!(comm_and_state(stat) == Some(("a (b) c".to_owned(), "S".to_owned())));
    ensure!(parent(stat) == Some(811));
    ensure!(cpu_seconds("9 (x) R 1 9 9 0 -1 0 0 0 0 0 250 30 0") == Some((2.5, 0.3)));
    Ok(Outcome::Passed)
}
register!(Host the_watchdog_reports_then_stops_a_hung_test);
