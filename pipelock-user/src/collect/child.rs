//! The traced command and pipelock's own CPU time.
use std::time::{Duration, Instant};

use crate::Error;

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
    mut child: Option<std::process::Child>,
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
            if let Some(mut child) = child {
                let _ = child.kill();
                return Ok(child.wait().ok());
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
