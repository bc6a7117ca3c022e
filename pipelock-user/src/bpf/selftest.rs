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

use super::{object as ebpf, plan::TracepointKind};
use crate::{Error, error::one_line};

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
}

impl SelfTestReport {
    pub fn render(&self) -> String {
        format!(
            "self-test: {} program on lock:contention_begin, {:.1} s of {} threads on one pipe \
             ({} round trips)\n\
             self-test: contention_begin events counted: {} (per CPU: {})\n\
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
        )
    }
}

/// Attaches the counter, generates pipe contention for `duration`, reads the count.
pub fn run(duration: Duration, ebpf_log: bool) -> Result<SelfTestReport, Error> {
    let mut ebpf = ebpf::load(ebpf_log)?;
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

    let started = Instant::now();
    let round_trips = hammer_one_pipe(duration)?;
    let elapsed = started.elapsed();

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
