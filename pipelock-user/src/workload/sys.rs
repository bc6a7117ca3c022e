//! The process plumbing every workload shares: a leader process per run (its
//! own process group, so one kill stops every worker), shared counters the
//! parent can watch, an interval-timer stop flag, CPU affinity, and the
//! perf-stat-like counters of the whole workload.
use std::{
    io::{self, Read as _, Write as _},
    os::fd::{FromRawFd as _, OwnedFd},
    ptr::NonNull,
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::Duration,
};

fn last_error(what: &'static str) -> crate::Error {
    crate::Error::Io {
        what,
        source: io::Error::last_os_error(),
    }
}

/// Counters in memory shared by the parent, the leader and every worker.
pub struct Shared {
    ptr: NonNull<AtomicU64>,
    len: usize,
}

// SAFETY: the memory is only accessed through atomics.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Shared {
    pub fn new(len: usize) -> Result<Self, crate::Error> {
        let bytes = len.max(1) * size_of::<AtomicU64>();
        // SAFETY: an anonymous shared mapping; checked for MAP_FAILED below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(last_error("mmap of shared counters"));
        }
        let ptr = NonNull::new(ptr.cast()).ok_or_else(|| last_error("mmap"))?;
        Ok(Self { ptr, len: len.max(1) })
    }

    pub fn get(&self, index: usize) -> &AtomicU64 {
        assert!(index < self.len, "shared counter {index} out of {}", self.len);
        // SAFETY: in bounds of a live mapping of zero-initialised AtomicU64s.
        unsafe { &*self.ptr.as_ptr().add(index) }
    }

    pub fn reset(&self) {
        (0..self.len).for_each(|i| self.get(i).store(0, Ordering::Relaxed));
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping made in `new`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len * size_of::<AtomicU64>()) };
    }
}

/// Set by SIGALRM (the `--duration` timer), read by the workload loops.
pub static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_alarm(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Arms a one-shot real-time interval timer that sets [`STOP`]. Without
/// SA_RESTART a blocked read/write returns EINTR, so loops see the flag.
pub fn arm_stop_timer(after: Duration) -> Result<(), crate::Error> {
    STOP.store(false, Ordering::Relaxed);
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_alarm as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(libc::SIGALRM, &action, std::ptr::null_mut()) != 0 {
            return Err(last_error("sigaction(SIGALRM)"));
        }
        let timer = libc::itimerval {
            it_interval: libc::timeval {
                tv_sec: 0,
                tv_usec: 0,
            },
            it_value: libc::timeval {
                tv_sec: after.as_secs() as libc::time_t,
                tv_usec: after.subsec_micros() as libc::suseconds_t,
            },
        };
        if libc::setitimer(libc::ITIMER_REAL, &timer, std::ptr::null_mut()) != 0 {
            return Err(last_error("setitimer"));
        }
    }
    Ok(())
}

pub fn stopped() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// Forks a worker that runs `body` and exits with its code. The worker dies
/// with its parent (PR_SET_PDEATHSIG), so nothing is left behind.
pub fn fork_worker(body: impl FnOnce() -> i32) -> Result<libc::pid_t, crate::Error> {
    // SAFETY: the child only runs `body`, which makes plain syscalls, then _exit.
    match unsafe { libc::fork() } {
        -1 => Err(last_error("fork")),
        0 => {
            // SAFETY: prctl/_exit are async-signal-safe.
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                libc::_exit(body());
            }
        }
        pid => Ok(pid),
    }
}

/// Waits for every pid; returns how many exited non-zero or by a signal.
pub fn wait_all(pids: &[libc::pid_t]) -> usize {
    pids.iter()
        .filter(|&&pid| {
            let mut status = 0;
            // SAFETY: waiting for our own child.
            while unsafe { libc::waitpid(pid, &mut status, 0) } == -1 {
                if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                    return true;
                }
            }
            !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0)
        })
        .count()
}

/// A `--cpus` list; a newtype so clap takes `0-3,6` as one value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuList(pub Vec<usize>);

pub fn parse_cpus(text: &str) -> Result<CpuList, String> {
    parse_cpu_list(text).map(CpuList)
}

/// Parses `0-3,6` into CPU numbers.
pub fn parse_cpu_list(text: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in text.split(',') {
        let bad = || format!("`{text}` is not a CPU list like 0-3,6");
        let (lo, hi): (usize, usize) = match part.split_once('-') {
            Some((lo, hi)) => (
                lo.trim().parse().map_err(|_| bad())?,
                hi.trim().parse().map_err(|_| bad())?,
            ),
            None => {
                let cpu = part.trim().parse().map_err(|_| bad())?;
                (cpu, cpu)
            }
        };
        if lo > hi || hi >= libc::CPU_SETSIZE as usize {
            return Err(bad());
        }
        cpus.extend(lo..=hi);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

pub fn set_affinity(cpus: &[usize]) -> Result<(), crate::Error> {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET stays in bounds (checked on parse).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in cpus {
            libc::CPU_SET(cpu, &mut set);
        }
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(last_error("sched_setaffinity (--cpus)"));
        }
    }
    Ok(())
}

pub use super::report::{CounterSource, Counters};

/// Software perf events opened with `inherit`, so every process and thread
/// the leader creates afterwards is counted into them.
pub struct PerfCounters {
    fds: Vec<OwnedFd>,
}

const PERF_TYPE_SOFTWARE: u32 = 1;
/// task-clock, page-faults, context-switches, cpu-migrations.
const SOFTWARE_EVENTS: [u64; 4] = [1, 2, 3, 4];

#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

impl PerfCounters {
    pub fn open() -> Option<Self> {
        const INHERIT: u64 = 1 << 1;
        let mut fds = Vec::new();
        for config in SOFTWARE_EVENTS {
            let attr = PerfEventAttr {
                kind: PERF_TYPE_SOFTWARE,
                size: size_of::<PerfEventAttr>() as u32,
                config,
                flags: INHERIT,
                ..Default::default()
            };
            // SAFETY: a valid attr of the size it declares; pid 0 = this process.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_perf_event_open,
                    &attr,
                    0,
                    -1,
                    -1,
                    libc::c_ulong::from(8u8),
                )
            };
            if fd < 0 {
                log::info!(
                    "perf_event_open: {}; falling back to getrusage",
                    io::Error::last_os_error()
                );
                return None;
            }
            // SAFETY: a new descriptor owned from here on.
            fds.push(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        }
        Some(Self { fds })
    }

    /// Reads the totals; call after every child has been reaped (children's
    /// counts are folded into the inherited events when they exit).
    pub fn read(&self) -> Option<[u64; 4]> {
        let mut values = [0u64; 4];
        for (fd, value) in self.fds.iter().zip(&mut values) {
            let mut file = std::fs::File::from(fd.try_clone().ok()?);
            let mut buf = [0u8; 8];
            file.read_exact(&mut buf).ok()?;
            *value = u64::from_ne_bytes(buf);
        }
        Some(values)
    }
}

fn rusage(who: libc::c_int) -> libc::rusage {
    // SAFETY: getrusage fills the struct it is given.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut usage);
        usage
    }
}

/// Counters of this process, its threads and its reaped children.
pub fn collect_counters(perf: Option<&PerfCounters>) -> Counters {
    let (own, children) = (rusage(libc::RUSAGE_SELF), rusage(libc::RUSAGE_CHILDREN));
    let tv_ms = |tv: libc::timeval| tv.tv_sec as f64 * 1e3 + tv.tv_usec as f64 / 1e3;
    let nvcsw = (own.ru_nvcsw + children.ru_nvcsw) as u64;
    let nivcsw = (own.ru_nivcsw + children.ru_nivcsw) as u64;
    match perf.and_then(PerfCounters::read) {
        Some([task_clock_ns, page_faults, context_switches, cpu_migrations]) => Counters {
            task_clock_ms: task_clock_ns as f64 / 1e6,
            context_switches,
            cpu_migrations,
            page_faults,
            nvcsw,
            nivcsw,
            source: CounterSource::PerfEvent,
        },
        None => Counters {
            task_clock_ms: [own.ru_utime, own.ru_stime, children.ru_utime, children.ru_stime]
                .into_iter()
                .map(tv_ms)
                .sum(),
            context_switches: nvcsw + nivcsw,
            cpu_migrations: 0,
            page_faults: (own.ru_minflt + own.ru_majflt + children.ru_minflt + children.ru_majflt) as u64,
            nvcsw,
            nivcsw,
            source: CounterSource::Getrusage,
        },
    }
}

/// A plain blocking pipe, as the benchmarks' C programs make it: [read, write].
pub fn pipe() -> Result<[i32; 2], crate::Error> {
    let mut fds = [0; 2];
    // SAFETY: pipe fills two descriptors.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(last_error("pipe"));
    }
    Ok(fds)
}

/// A pipe carrying the leader's JSON result to the parent.
pub fn result_pipe() -> Result<(std::fs::File, std::fs::File), crate::Error> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(last_error("pipe2"));
    }
    // SAFETY: fresh descriptors, owned here.
    Ok(unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    })
}

pub fn write_all_or_exit(file: &mut std::fs::File, data: &[u8]) {
    if file.write_all(data).is_err() {
        // SAFETY: leaving the leader without running the parent's destructors.
        unsafe { libc::_exit(3) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse() {
        assert_eq!(parse_cpu_list("0-2,5,1"), Ok(vec![0, 1, 2, 5]));
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("x").is_err());
        assert!(parse_cpu_list("0-99999").is_err());
    }

    #[test]
    fn shared_counters_cross_fork() {
        let shared = Shared::new(2).unwrap();
        let pid = fork_worker(|| {
            shared.get(1).store(42, Ordering::Relaxed);
            0
        })
        .unwrap();
        assert_eq!(wait_all(&[pid]), 0);
        assert_eq!(shared.get(1).load(Ordering::Relaxed), 42);
    }
}
