//! kretprobes with room for calls that sleep.
//!
//! A kretprobe follows at most `maxactive` calls of its function at once
//! (the kernel's default: max(10, 2 × CPUs)); a return beyond that runs no
//! program and only bumps the probe's miss count. `pipe_read` sleeps while
//! its pipe is empty: in a 2-CPU guest a 64-process herd lost 16 000 to
//! 23 500 of 30 100 `pipe_read` returns that way (docs/cost.md), and each lost return
//! left its thread marked as inside a pipe call it had left, so the pipe's
//! locks it took next (`close`, `poll`) counted as the call's.
//!
//! The kprobe PMU, which aya attaches through, takes no `maxactive`;
//! tracefs's `kprobe_events` does (`rN:`). So the kprobe mode's return
//! probes are made there and a `BPF_PROG_TYPE_KPROBE` program is attached
//! to the event through `perf_event_open` and `PERF_EVENT_IOC_SET_BPF`, as
//! libbpf's legacy path does. Each is removed again when dropped; a run
//! killed before that leaves its events, which the next run removes
//! (their group names a pid that is gone).
use std::{
    fs::{self, OpenOptions},
    io::Write,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
};

use aya_obj::generated::{
    PERF_EVENT_IOC_ENABLE, PERF_EVENT_IOC_SET_BPF, PERF_FLAG_FD_CLOEXEC, perf_event_attr,
    perf_type_id::PERF_TYPE_TRACEPOINT,
};

/// Return instances per probe: the kernel's ceiling (`KRETPROBE_MAXACTIVE_MAX`),
/// a few hundred KiB per probe; a herd of thousands of threads asleep in
/// one function is what it must cover.
pub const MAX_ACTIVE: u32 = 4096;

/// The tracefs group of this process's probes.
fn group_of(pid: u32) -> String {
    format!("pipelock_{pid}")
}

/// The event name of probe number `n` of this process, on `function`
/// (tracefs takes letters, digits and `_`). The pid is in it too:
/// `kprobe_profile` lists events without their group. The number keeps two
/// tracers of one process (`overhead` makes one after another) apart.
fn event_of(pid: u32, n: u32, function: &str) -> String {
    let function: String = function
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("pipelock_{pid}_{n}_{function}")
}

/// Probes this process has made.
static MADE: AtomicU32 = AtomicU32::new(0);

/// A `kprobe_events` line: `r4096:group/event function`, or `-:group/event`.
fn append(events: &Path, line: &str) -> Result<(), String> {
    OpenOptions::new()
        .append(true)
        .open(events)
        .and_then(|mut file| file.write_all(line.as_bytes()))
        .map_err(|e| format!("{}: {line:?}: {e}", events.display()))
}

/// A probe event made in tracefs, removed when dropped.
struct Event {
    events: PathBuf,
    group: String,
    event: String,
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = append(&self.events, &format!("-:{}/{}\n", self.group, self.event));
    }
}

/// A kretprobe on one function with one program attached; detached and
/// removed when dropped.
pub struct Retprobe {
    // Declared (so dropped) first: the program is detached before the
    // event goes.
    _perf: OwnedFd,
    event: Event,
}

impl Retprobe {
    /// A return probe with `maxactive` instances on `function`, running
    /// `program` (a loaded kprobe program's descriptor). `tracefs` is where
    /// tracefs is mounted.
    pub fn attach(
        tracefs: &Path,
        program: BorrowedFd<'_>,
        function: &str,
        maxactive: u32,
    ) -> Result<Self, String> {
        let pid = std::process::id();
        let event = Event {
            events: tracefs.join("kprobe_events"),
            group: group_of(pid),
            event: event_of(pid, MADE.fetch_add(1, Ordering::Relaxed), function),
        };
        append(
            &event.events,
            &format!("r{maxactive}:{}/{} {function}\n", event.group, event.event),
        )?;
        let id_file = tracefs
            .join("events")
            .join(&event.group)
            .join(&event.event)
            .join("id");
        let id: u64 = fs::read_to_string(&id_file)
            .map_err(|e| format!("{}: {e}", id_file.display()))?
            .trim()
            .parse()
            .map_err(|e| format!("{}: {e}", id_file.display()))?;
        let perf = open_event(id)?;
        // SAFETY: ioctls on a perf event descriptor this function owns, with
        // a program descriptor the caller keeps alive for the call.
        let set = unsafe {
            libc::ioctl(perf.as_raw_fd(), PERF_EVENT_IOC_SET_BPF as _, program.as_raw_fd()) == 0
                && libc::ioctl(perf.as_raw_fd(), PERF_EVENT_IOC_ENABLE as _, 0) == 0
        };
        if !set {
            return Err(format!(
                "attaching to {}/{}: {}",
                event.group,
                event.event,
                std::io::Error::last_os_error()
            ));
        }
        Ok(Self { _perf: perf, event })
    }

    /// Hits the probe did not run for (no free instance, or it fired
    /// inside another kprobe's handler), from tracefs's `kprobe_profile`
    /// (its text, read once for all the probes).
    pub fn missed(&self, profile: &str) -> Option<u64> {
        profile_misses(profile, &self.event.event)
    }
}

/// The miss count of `event` in a `kprobe_profile` (`name hits misses` a line).
fn profile_misses(profile: &str, event: &str) -> Option<u64> {
    profile.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        (fields.next()? == event).then(|| fields.nth(1)?.parse().ok())?
    })
}

/// A perf event on tracepoint (here: probe event) `id`, all processes; a
/// BPF program attached to it runs on every CPU.
fn open_event(id: u64) -> Result<OwnedFd, String> {
    // SAFETY: a plain C struct for which all-zero is valid.
    let mut attr: perf_event_attr = unsafe { std::mem::zeroed() };
    attr.type_ = PERF_TYPE_TRACEPOINT as u32;
    attr.size = size_of::<perf_event_attr>() as u32;
    attr.config = id;
    // SAFETY: attr is a live, correctly sized attribute; the kernel reads it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            std::ptr::addr_of!(attr),
            -1 as libc::pid_t,
            0 as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd < 0 {
        return Err(format!("perf_event_open: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: a descriptor the kernel just handed over, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Removes the probe events of earlier runs whose process is gone (killed
/// before it could remove them). Best effort.
pub fn remove_stale(tracefs: &Path) {
    let events = tracefs.join("kprobe_events");
    let Ok(text) = fs::read_to_string(&events) else {
        return;
    };
    for (group, event) in stale_events(&text, |pid| Path::new("/proc").join(pid.to_string()).exists()) {
        let _ = append(&events, &format!("-:{group}/{event}\n"));
    }
}

/// `(group, event)` of the `kprobe_events` lines made by a pipelock whose
/// pid `alive` says is gone.
fn stale_events(kprobe_events: &str, alive: impl Fn(u32) -> bool) -> Vec<(String, String)> {
    kprobe_events
        .lines()
        .filter_map(|line| {
            let (_, rest) = line.split_once(':')?;
            let name = rest.split_whitespace().next()?;
            let (group, event) = name.split_once('/')?;
            let pid: u32 = group.strip_prefix("pipelock_")?.parse().ok()?;
            (!alive(pid)).then(|| (group.to_owned(), event.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_tracefs_safe_and_carry_the_pid() {
        assert_eq!(group_of(42), "pipelock_42");
        assert_eq!(event_of(42, 0, "pipe_read"), "pipelock_42_0_pipe_read");
        assert_eq!(event_of(7, 3, "foo.isra.0"), "pipelock_7_3_foo_isra_0");
    }

    #[test]
    fn misses_are_read_from_the_profile() {
        let profile = "  pipelock_42_pipe_read                                   30103              0\n  \
                       pipelock_42_anon_pipe_read                              12292          17811\n";
        assert_eq!(profile_misses(profile, "pipelock_42_anon_pipe_read"), Some(17811));
        assert_eq!(profile_misses(profile, "pipelock_42_pipe_read"), Some(0));
        assert_eq!(profile_misses(profile, "pipelock_4_pipe_read"), None);
    }

    #[test]
    fn only_dead_pipelocks_events_are_stale() {
        let events = "r4096:pipelock_10/pipelock_10_pipe_read pipe_read\n\
                      r4096:pipelock_11/pipelock_11_pipe_read pipe_read\n\
                      p:kprobes/mine do_sys_open\n\
                      r:pipelock_x/odd pipe_read\n";
        assert_eq!(
            stale_events(events, |pid| pid == 11),
            [("pipelock_10".to_owned(), "pipelock_10_pipe_read".to_owned())]
        );
    }
}
