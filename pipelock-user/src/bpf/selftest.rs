//! `pipelock probe --self-test`: proves the whole pipeline on this kernel —
//! embedded object → load → attach `lock:contention_begin` → real contention →
//! per-CPU map read — and fails loudly if any step yields nothing.
use std::{
    fs::File,
    io::{Read, Write},
    os::fd::FromRawFd,
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use aya::{
    Btf,
    maps::PerCpuArray,
    programs::{BtfTracePoint, TracePoint},
};
use pipelock_common::{CONTENTION_BEGIN_TRACEPOINT, maps, programs};

use super::{config::Filters, object as ebpf, plan::TracepointKind};
use crate::{Error, error::one_line, kernel::KernelInspector};

/// Threads hammering the shared pipe: more than CPUs on these 2-core machines,
/// so the pipe mutex and wait-queue locks are contended.
const HAMMER_THREADS: usize = 4;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelfTestReport {
    pub program: TracepointKind,
    pub duration: Duration,
    /// Pipe write+read round trips the hammer threads completed.
    pub round_trips: u64,
    /// `lock:contention_begin` events the program counted, all CPUs.
    pub contention_begins: u64,
    /// Per-CPU split of `contention_begins`.
    pub per_cpu: Vec<u64>,
    /// Tracepoint mode's interrupt-context check on events of known
    /// context (Err: not run, and why).
    pub interrupt_check: Result<InterruptCheck, String>,
}

/// How the interrupt-context check judged events whose context is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InterruptCheck {
    pub syscalls_on_task_stack: u64,
    pub syscalls_elsewhere: u64,
    /// Softirqs outside ksoftirqd (interrupt context).
    pub softirqs_on_task_stack: u64,
    pub softirqs_elsewhere: u64,
}

impl InterruptCheck {
    /// Why the check is wrong, if it is: a syscall judged interrupt context
    /// would drop a pipe call's own contention, and a check that never says
    /// interrupt, not even for the softirqs made on purpose, checks nothing.
    /// (Softirqs judged task context are not an error: an interrupt that
    /// arrives in user mode runs on the task's empty kernel stack, and so
    /// does the softirq at its exit; that task is in no syscall then, so
    /// the pipe-call classification never claims its events.)
    pub fn failure(&self) -> Option<String> {
        if self.syscalls_on_task_stack == 0 {
            return Some("no syscall was seen".to_owned());
        }
        if self.syscalls_elsewhere != 0 {
            return Some(format!(
                "{} syscall(s) judged interrupt context",
                self.syscalls_elsewhere
            ));
        }
        if self.softirqs_elsewhere == 0 {
            return Some(format!(
                "none of {} softirq(s) judged interrupt context",
                self.softirqs_on_task_stack
            ));
        }
        None
    }
}

impl SelfTestReport {
    pub fn render(&self) -> String {
        format!(
            "self-test: {} program on lock:contention_begin, {:.1} s of {} threads on one pipe \
             ({} round trips)\n\
             self-test: contention_begin events counted: {} (per CPU: {})\n\
             self-test: interrupt-context check: {}\n\
             self-test: passed\n",
            self.program,
            self.duration.as_secs_f64(),
            HAMMER_THREADS,
            self.round_trips,
            self.contention_begins,
            self.per_cpu
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" "),
            match &self.interrupt_check {
                Ok(check) => format!(
                    "syscalls {} on a task stack, {} not; softirqs (outside ksoftirqd) {} on an \
                     interrupt stack, {} on a task stack (interrupted in user mode)",
                    check.syscalls_on_task_stack,
                    check.syscalls_elsewhere,
                    check.softirqs_elsewhere,
                    check.softirqs_on_task_stack
                ),
                Err(why) => format!("skipped ({why})"),
            },
        )
    }
}

/// Attaches the counter, generates pipe contention for `duration`, reads the count.
pub fn run(duration: Duration, ebpf_log: bool) -> Result<SelfTestReport, Error> {
    // The interrupt check reads task_struct offsets from the configuration.
    let config = KernelInspector::live()
        .btf()
        .and_then(|btf| super::config::trace_config(&btf, &Filters::default()));
    let (mut ebpf, _log) = ebpf::load(config.as_ref().ok(), ebpf_log)?;
    let (category, name) = CONTENTION_BEGIN_TRACEPOINT;

    // tp_btf first, as `auto` would; the classic tracepoint is the fallback.
    let tp_btf = Btf::from_sys_fs().map_err(|e| one_line(&e)).and_then(|btf| {
        let prog: &mut BtfTracePoint =
            ebpf::program_mut(&mut ebpf, programs::CONTENTION_BEGIN_COUNT_BTF).map_err(|e| one_line(&e))?;
        prog.load(name, &btf).map_err(|e| one_line(&e))?;
        prog.attach().map_err(|e| one_line(&e))
    });
    let program = match tp_btf {
        Ok(_) => TracepointKind::TpBtf,
        Err(why) => {
            log::info!("tp_btf unavailable ({why}); using the classic tracepoint");
            let prog: &mut TracePoint = ebpf::program_mut(&mut ebpf, programs::CONTENTION_BEGIN_COUNT_TP)?;
            let program = programs::CONTENTION_BEGIN_COUNT_TP.to_owned();
            prog.load().map_err(|source| Error::Program {
                action: "load",
                program: program.clone(),
                source,
            })?;
            prog.attach(category, name).map_err(|source| Error::Program {
                action: "attach",
                program,
                source,
            })?;
            TracepointKind::Classic
        }
    };

    // tp_btf only: a classic tracepoint's context is its trace record.
    let interrupt_check = match (&program, &config) {
        // Tracepoint mode's own programs hold the same check: one the
        // kernel refuses is a failure, not a skip.
        (TracepointKind::TpBtf, Ok(_)) => match attach_interrupt_check(&mut ebpf) {
            Ok(()) => Ok(()),
            Err(why) => {
                return Err(Error::SelfTest {
                    reason: format!("the interrupt-context check does not load on this kernel: {why}"),
                });
            }
        },
        (TracepointKind::TpBtf, Err(err)) => Err(format!("no kernel offsets: {}", one_line(err))),
        (TracepointKind::Classic, _) => Err("the classic tracepoint's context is not on a stack".to_owned()),
    };

    let started = Instant::now();
    let round_trips = hammer_one_pipe(duration)?;
    let elapsed = started.elapsed();
    let interrupt_check = interrupt_check.and_then(|()| {
        make_softirqs();
        read_interrupt_check(&ebpf)
    });
    if let Ok(check) = &interrupt_check
        && let Some(why) = check.failure()
    {
        return Err(Error::SelfTest {
            reason: format!("the interrupt-context check is wrong on this kernel: {why}"),
        });
    }

    let map = ebpf
        .map(maps::CONTENTION_BEGIN_COUNT)
        .ok_or_else(|| Error::Missing {
            kind: "map",
            name: maps::CONTENTION_BEGIN_COUNT.to_owned(),
        })?;
    let map_err = |source| Error::Map {
        map: maps::CONTENTION_BEGIN_COUNT.to_owned(),
        source,
    };
    let counts: PerCpuArray<_, u64> = PerCpuArray::try_from(map).map_err(map_err)?;
    let per_cpu: Vec<u64> = counts.get(&0, 0).map_err(map_err)?.iter().copied().collect();
    let contention_begins = per_cpu.iter().sum();

    if contention_begins == 0 {
        return Err(Error::SelfTest {
            reason: format!(
                "the {program} program is attached but counted no lock:contention_begin event \
                 in {round_trips} contended pipe round trips"
            ),
        });
    }
    Ok(SelfTestReport {
        program,
        duration: elapsed,
        round_trips,
        contention_begins,
        per_cpu,
        interrupt_check,
    })
}

fn attach_interrupt_check(ebpf: &mut aya::Ebpf) -> Result<(), String> {
    let btf = Btf::from_sys_fs().map_err(|e| one_line(&e))?;
    for (program, tracepoint) in [
        (programs::SELFTEST_SYS_ENTER, "sys_enter"),
        (programs::SELFTEST_SOFTIRQ_ENTRY, "softirq_entry"),
    ] {
        let prog: &mut BtfTracePoint = ebpf::program_mut(ebpf, program).map_err(|e| one_line(&e))?;
        prog.load(tracepoint, &btf).map_err(|e| one_line(&e))?;
        prog.attach().map_err(|e| one_line(&e))?;
    }
    Ok(())
}

/// Loopback UDP: each send raises a NET_RX softirq, run when the sender
/// re-enables bottom halves.
fn make_softirqs() {
    let Ok(socket) = std::net::UdpSocket::bind("127.0.0.1:0") else {
        return;
    };
    let Ok(own) = socket.local_addr() else { return };
    let _ = socket.set_nonblocking(true);
    let mut buf = [0u8; 64];
    for _ in 0..2000 {
        let _ = socket.send_to(&buf, own);
        let _ = socket.recv_from(&mut buf);
    }
}

fn read_interrupt_check(ebpf: &aya::Ebpf) -> Result<InterruptCheck, String> {
    let map = ebpf
        .map(maps::INTERRUPT_CHECK)
        .ok_or_else(|| format!("no {} map", maps::INTERRUPT_CHECK))?;
    let counts: PerCpuArray<_, u64> = PerCpuArray::try_from(map).map_err(|e| one_line(&e))?;
    let slot =
        |i: u32| -> Result<u64, String> { Ok(counts.get(&i, 0).map_err(|e| one_line(&e))?.iter().sum()) };
    Ok(InterruptCheck {
        syscalls_on_task_stack: slot(0)?,
        syscalls_elsewhere: slot(1)?,
        softirqs_on_task_stack: slot(2)?,
        softirqs_elsewhere: slot(3)?,
    })
}

/// Several threads writing and reading 8-byte records on one pipe until `duration`.
fn hammer_one_pipe(duration: Duration) -> Result<u64, Error> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(Error::Io {
            what: "pipe(2)",
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: both descriptors were just created and are owned here alone.
    let (reader, writer) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
    let stop = AtomicBool::new(false);
    let total = thread::scope(|scope| {
        let workers: Vec<_> = (0..HAMMER_THREADS)
            .map(|_| {
                let (mut reader, mut writer, stop) = (&reader, &writer, &stop);
                scope.spawn(move || {
                    let mut buf = [0u8; 8];
                    let mut trips = 0u64;
                    // Each thread writes before it reads, so the pipe never
                    // holds fewer bytes than a blocked reader needs.
                    while !stop.load(Ordering::Relaxed) {
                        if writer.write_all(&buf).is_err() || reader.read_exact(&mut buf).is_err() {
                            break;
                        }
                        trips += 1;
                    }
                    trips
                })
            })
            .collect();
        thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
        workers.into_iter().map(|w| w.join().unwrap_or(0)).sum()
    });
    Ok(total)
}
