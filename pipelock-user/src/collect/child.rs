//! The traced command and pipelock's own CPU time.
use std::{
    os::unix::{fs::PermissionsExt as _, process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use crate::Error;

/// Where COMMAND's program is, found as `execvp` would: checked before
/// anything is attached, so a typo costs no trace.
pub fn find_program(program: &str) -> Result<PathBuf, Error> {
    let runnable = |path: &Path| {
        path.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let found = if program.contains('/') {
        Some(PathBuf::from(program)).filter(|p| runnable(p))
    } else {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(program))
                .find(|p| runnable(p))
        })
    };
    found.ok_or_else(|| Error::Usage(format!("COMMAND {program}: no such program (or not executable)")))
}

/// Starts COMMAND (`argv`, its program found at `program`) in a process
/// group of its own, so that ending the trace ends everything it started.
/// `argv[0]` stays as typed, as `execvp` leaves it.
pub fn spawn_command(program: &Path, argv: &[String]) -> Result<Child, Error> {
    Command::new(program)
        .arg0(argv.first().map_or("", String::as_str))
        .args(argv.iter().skip(1))
        .process_group(0)
        .spawn()
        .map_err(|source| Error::Io {
            what: "starting COMMAND",
            source,
        })
}

/// Ends COMMAND's whole process group: SIGTERM, then SIGKILL for what is
/// left after a grace period. Returns COMMAND's exit status.
pub fn stop_command(mut child: Child) -> Option<std::process::ExitStatus> {
    let group = child.id() as libc::pid_t;
    // SAFETY: kill(2) on the process group COMMAND leads.
    unsafe { libc::kill(-group, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut status = None;
    while Instant::now() < deadline {
        if status.is_none() {
            status = child.try_wait().ok().flatten();
        }
        // The group is gone when no member is left to signal.
        // SAFETY: signal 0 only checks for existence.
        if status.is_some() && unsafe { libc::kill(-group, 0) } != 0 {
            return status;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: as above.
    unsafe { libc::kill(-group, libc::SIGKILL) };
    status.or_else(|| child.wait().ok())
}

/// CPU time this process (the collector: pipelock itself, not the traced
/// load) has used, all threads. getrusage rather than /proc/self/stat:
/// the latter counts in 10 ms ticks, too coarse for a 1 % budget.
pub fn own_cpu_seconds() -> Option<f64> {
    // SAFETY: getrusage fills the struct we own.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        (libc::getrusage(libc::RUSAGE_SELF, &mut usage) == 0).then_some(usage)
    }?;
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Some(secs(usage.ru_utime) + secs(usage.ru_stime))
}

/// Waits until `duration` passes, `child` exits, or Ctrl-C, calling
/// `on_tick` every `interval`; returns the child's exit status if there was one.
pub fn wait_for(
    duration: Option<Duration>,
    mut child: Option<Child>,
    interrupted: &std::sync::atomic::AtomicBool,
    interval: Option<Duration>,
    mut on_tick: impl FnMut() -> Result<(), Error>,
) -> Result<Option<std::process::ExitStatus>, Error> {
    let started = Instant::now();
    let mut next_tick = interval.map(|i| started + i);
    loop {
        if let Some(child) = child.as_mut()
            && let Some(status) = child.try_wait().map_err(|source| Error::Io {
                what: "waiting for COMMAND",
                source,
            })?
        {
            return Ok(Some(status));
        }
        if interrupted.load(std::sync::atomic::Ordering::Relaxed)
            || duration.is_some_and(|d| started.elapsed() >= d)
        {
            if let Some(child) = child {
                return Ok(stop_command(child));
            }
            return Ok(None);
        }
        if let (Some(tick), Some(interval)) = (next_tick, interval)
            && Instant::now() >= tick
        {
            on_tick()?;
            // Ticks stay on the grid even when one report ran late.
            next_tick =
                Some(tick + interval * ((tick.elapsed().as_nanos() / interval.as_nanos()) as u32 + 1));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
