//! `pipelock trace`: attach the pipe lock programs, let the load run, read
//! and merge the maps into a [`TraceReport`].
//!
//! Two modes are implemented: fentry/fexit (every acquisition of a pipe's
//! mutex and wait-queue spinlocks, wait and hold) and the tracepoint mode
//! (wait of contended acquisitions, from `lock:contention_begin/end`), which
//! works on every kernel since 5.19, including ones without kprobes or fentry.
//! The kprobe mode runs the fentry mode's logic from kprobes/kretprobes.
//! `auto` tries fentry, then kprobes, then the tracepoints, saying why.
use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, Instant},
};

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{HashMap as BpfHashMap, PerCpuArray, PerCpuHashMap},
    programs::{BtfTracePoint, TracePoint},
};
use pipelock_common::{
    Drop, LockInfo, LockStats, LockUser, TRACE_CONFIG_GLOBAL, TraceConfig, class, maps, programs,
};

use crate::{
    Error,
    attach::TracepointKind,
    error::one_line,
    inspector::{KernelBtf, KernelInspector},
    lockstats::{self, LockRow, PERCENTILE_RESOLUTION, Timing, TraceReport},
};

/// `--mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    /// fentry if it works here, else the contention tracepoints.
    Auto,
    /// fentry/fexit: every acquisition, wait and hold.
    Fentry,
    /// kprobe/kretprobe: every acquisition, wait and hold (where fentry is refused).
    Kprobe,
    /// lock:contention_begin/end: wait of contended acquisitions only.
    Tracepoint,
}

/// `--class`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ClassArg {
    /// pipe->mutex.
    PipeMutex,
    /// pipe->rd_wait.lock and pipe->wr_wait.lock.
    PipeWait,
    /// Other locks contended inside pipe read/write (scheduler locks of wake-ups).
    Other,
}

impl ClassArg {
    fn mask(self) -> u32 {
        match self {
            Self::PipeMutex => 1 << class::PIPE_MUTEX,
            Self::PipeWait => (1 << class::PIPE_RD_WAIT) | (1 << class::PIPE_WR_WAIT),
            Self::Other => 1 << class::OTHER_IN_PIPE_CALL,
        }
    }
}

/// What to trace.
#[derive(Clone, Debug)]
pub struct Filters {
    pub tgid: Option<u32>,
    pub comm: Option<String>,
    pub classes: Vec<ClassArg>,
}

/// x86-64 syscall numbers (read, write, readv, writev).
#[cfg(target_arch = "x86_64")]
const SYSCALLS: [u32; 4] = [0, 1, 19, 20];

/// Resolves every offset the programs need from the kernel's BTF.
pub fn trace_config(btf: &KernelBtf, filters: &Filters) -> Result<TraceConfig, Error> {
    let off = |t: &str, m: &str| btf.offset_of(t, m);
    let classes = if filters.classes.is_empty() {
        vec![ClassArg::PipeMutex, ClassArg::PipeWait, ClassArg::Other]
    } else {
        filters.classes.clone()
    };
    Ok(TraceConfig {
        kiocb_filp: off("kiocb", "ki_filp")?,
        task_files: off("task_struct", "files")?,
        files_fdt: off("files_struct", "fdt")?,
        fdt_max_fds: off("fdtable", "max_fds")?,
        fdt_fd: off("fdtable", "fd")?,
        file_inode: off("file", "f_inode")?,
        file_private_data: off("file", "private_data")?,
        inode_mode: off("inode", "i_mode")?,
        inode_ino: off("inode", "i_ino")?,
        pipe_rd_wait_lock: off("pipe_inode_info", "rd_wait.lock")?,
        pipe_wr_wait_lock: off("pipe_inode_info", "wr_wait.lock")?,
        regs_syscall_nr: off("pt_regs", "orig_ax")?,
        regs_arg0: off("pt_regs", "di")?,
        nr_read: SYSCALLS[0],
        nr_write: SYSCALLS[1],
        nr_readv: SYSCALLS[2],
        nr_writev: SYSCALLS[3],
        filter_tgid: filters.tgid.unwrap_or(0),
        class_mask: classes.iter().fold(0, |m, c| m | c.mask()),
    })
}

/// The mode a tracer ended up with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attached {
    Fentry,
    /// With the reason fentry was not used, when `auto` fell back.
    Kprobe {
        fallback: Option<String>,
    },
    /// With the reason fentry was not used, when `auto` fell back.
    Tracepoint {
        kind: TracepointKind,
        fallback: Option<String>,
    },
}

/// Attached programs; dropping it detaches them.
pub struct Tracer {
    ebpf: Ebpf,
    attached: Attached,
    started: Instant,
    comm_filter: Option<String>,
}

/// One fentry-mode hook: the programs to attach to the function `hook`
/// resolves to here. A hook that is not `required` is skipped where the
/// kernel lacks the function.
struct FentryHook {
    hook: crate::attach::Hook,
    entry: &'static str,
    exit: Option<&'static str>,
    required: bool,
}

const fn hook(
    hook: crate::attach::Hook,
    entry: &'static str,
    exit: Option<&'static str>,
    required: bool,
) -> FentryHook {
    FentryHook {
        hook,
        entry,
        exit,
        required,
    }
}

const FENTRY_HOOKS: [FentryHook; 8] = {
    use crate::attach::{
        Hook, MUTEX_LOCK, MUTEX_UNLOCK, PIPE_READ, PIPE_WRITE, SPIN_LOCK_IRQSAVE, SPIN_UNLOCK_IRQRESTORE,
    };
    use programs::*;
    // 6.1 also takes rd_wait.lock with spin_lock_irq around head/tail updates.
    const SPIN_LOCK_IRQ: Hook = Hook {
        role: "spinlock irq",
        candidates: &["_raw_spin_lock_irq"],
    };
    const SPIN_UNLOCK_IRQ: Hook = Hook {
        role: "spinlock unlock irq",
        candidates: &["_raw_spin_unlock_irq"],
    };
    [
        hook(PIPE_READ, PIPE_READ_ENTRY, Some(PIPE_READ_EXIT), true),
        hook(PIPE_WRITE, PIPE_WRITE_ENTRY, Some(PIPE_WRITE_EXIT), true),
        hook(MUTEX_LOCK, MUTEX_LOCK_ENTRY, Some(MUTEX_LOCK_EXIT), true),
        hook(MUTEX_UNLOCK, MUTEX_UNLOCK_ENTRY, None, true),
        hook(
            SPIN_LOCK_IRQSAVE,
            SPIN_LOCK_IRQSAVE_ENTRY,
            Some(SPIN_LOCK_IRQSAVE_EXIT),
            true,
        ),
        hook(SPIN_UNLOCK_IRQRESTORE, SPIN_UNLOCK_IRQRESTORE_ENTRY, None, true),
        hook(
            SPIN_LOCK_IRQ,
            SPIN_LOCK_IRQ_ENTRY,
            Some(SPIN_LOCK_IRQ_EXIT),
            false,
        ),
        hook(SPIN_UNLOCK_IRQ, SPIN_UNLOCK_IRQ_ENTRY, None, false),
    ]
};

impl Tracer {
    pub fn attach(mode: ModeArg, filters: &Filters, ebpf_log: bool) -> Result<Self, Error> {
        crate::privilege::require()?;
        let inspector = KernelInspector::live();
        if crate::ebpf::OBJECT.is_empty() {
            return Err(Error::StubObject);
        }
        let btf = inspector.btf()?;
        let config = trace_config(&btf, filters)?;
        let mut ebpf = EbpfLoader::new()
            .override_global(TRACE_CONFIG_GLOBAL, &config, true)
            .load(crate::ebpf::OBJECT)
            .map_err(|source| Error::Load { source })?;
        if ebpf_log && let Err(err) = aya_log::EbpfLogger::init(&mut ebpf) {
            log::warn!("eBPF logging unavailable: {}", one_line(&err));
        }
        let load = || {
            EbpfLoader::new()
                .override_global(TRACE_CONFIG_GLOBAL, &config, true)
                .load(crate::ebpf::OBJECT)
                .map_err(|source| Error::Load { source })
        };
        let attached = match mode {
            ModeArg::Tracepoint => Attached::Tracepoint {
                kind: attach_contention(&mut ebpf)?,
                fallback: None,
            },
            ModeArg::Fentry => {
                attach_fentry(&mut ebpf, &inspector, &btf)?;
                Attached::Fentry
            }
            ModeArg::Kprobe => {
                attach_kprobe(&mut ebpf, &inspector)?;
                Attached::Kprobe { fallback: None }
            }
            // Each failed attempt drops its object, which detaches whatever
            // part of it did attach, and starts from a fresh one.
            ModeArg::Auto => match attach_fentry(&mut ebpf, &inspector, &btf) {
                Ok(()) => Attached::Fentry,
                Err(fentry_err) => {
                    let why = format!("fentry: {}", one_line(&fentry_err));
                    ebpf = load()?;
                    match attach_kprobe(&mut ebpf, &inspector) {
                        Ok(()) => Attached::Kprobe { fallback: Some(why) },
                        Err(kprobe_err) => {
                            ebpf = load()?;
                            let kind = attach_contention(&mut ebpf)?;
                            let why = format!("{why}; kprobe: {}", one_line(&kprobe_err));
                            Attached::Tracepoint {
                                kind,
                                fallback: Some(why),
                            }
                        }
                    }
                }
            },
        };
        Ok(Self {
            ebpf,
            attached,
            started: Instant::now(),
            comm_filter: filters.comm.clone(),
        })
    }

    pub fn mode(&self) -> String {
        match &self.attached {
            Attached::Fentry => "fentry".to_owned(),
            Attached::Tracepoint { kind, fallback: None } => format!("tracepoint ({kind})"),
            Attached::Kprobe { fallback: None } => "kprobe".to_owned(),
            Attached::Kprobe { fallback: Some(why) } => format!("kprobe ({why})"),
            Attached::Tracepoint {
                kind,
                fallback: Some(why),
            } => format!("tracepoint ({kind}; {why})"),
        }
    }

    /// Reads and merges the maps into a report.
    pub fn report(&self) -> Result<TraceReport, Error> {
        let map_err = |name: &str| {
            let name = name.to_owned();
            move |source| Error::Map { map: name, source }
        };
        let get = |name: &str| {
            self.ebpf.map(name).ok_or_else(|| Error::Missing {
                kind: "map",
                name: name.to_owned(),
            })
        };
        let stats: PerCpuHashMap<_, u64, LockStats> =
            PerCpuHashMap::try_from(get(maps::LOCK_STATS)?).map_err(map_err(maps::LOCK_STATS))?;
        let info: BpfHashMap<_, u64, LockInfo> =
            BpfHashMap::try_from(get(maps::LOCK_INFO)?).map_err(map_err(maps::LOCK_INFO))?;
        let users: BpfHashMap<_, LockUser, [u8; 16]> =
            BpfHashMap::try_from(get(maps::LOCK_USERS)?).map_err(map_err(maps::LOCK_USERS))?;
        let drops: PerCpuArray<_, u64> =
            PerCpuArray::try_from(get(maps::DROPS)?).map_err(map_err(maps::DROPS))?;

        let mut comms: HashMap<u64, Vec<(u32, String)>> = HashMap::new();
        for entry in users.iter() {
            let (user, comm) = entry.map_err(map_err(maps::LOCK_USERS))?;
            let comm = String::from_utf8_lossy(comm.split(|b| *b == 0).next().unwrap_or(&[])).into_owned();
            comms.entry(user.lock).or_default().push((user.tgid, comm));
        }

        let mut rows = Vec::new();
        for entry in stats.iter() {
            let (lock, per_cpu) = entry.map_err(map_err(maps::LOCK_STATS))?;
            let mut merged = LockStats::EMPTY;
            for cpu in per_cpu.iter() {
                merged.acquisitions += cpu.acquisitions;
                merged.contentions += cpu.contentions;
                merged.spin_only += cpu.spin_only;
                lockstats::merge(&mut merged.wait, &cpu.wait);
                lockstats::merge(&mut merged.hold, &cpu.hold);
            }
            let hooked = !matches!(self.attached, Attached::Tracepoint { .. });
            let lock_info = info.get(&lock, 0).ok();
            // fentry mode notes processes once per pipe (at its mutex address);
            // every lock of that pipe shares them.
            let mut users = comms.get(&lock).cloned().unwrap_or_default();
            if let Some(pipe) = lock_info.map(|i| i.pipe).filter(|p| *p != lock) {
                users.extend(comms.get(&pipe).cloned().unwrap_or_default());
            }
            users.sort();
            users.dedup();
            if let Some(wanted) = &self.comm_filter
                && !users.iter().any(|(_, comm)| comm == wanted)
            {
                continue;
            }
            let class = lock_info.map_or(0, |i| i.class);
            let pipe_ino = lock_info.map(|i| i.ino).filter(|ino| *ino != 0);
            let pipe = pipe_ino.map_or_else(|| "pipe:[?]".to_owned(), |ino| format!("pipe:[{ino}]"));
            let name = if class == class::OTHER_IN_PIPE_CALL {
                format!("{lock:#x} in {pipe} call")
            } else {
                pipe
            };
            rows.push(LockRow {
                class: lockstats::class_name(class),
                lock_addr: lock,
                pipe_ino,
                name,
                comms: users.iter().map(|(pid, comm)| format!("{comm}({pid})")).collect(),
                mode: self.mode(),
                acquisitions: hooked.then_some(merged.acquisitions),
                contentions: merged.contentions,
                spin_only: merged.spin_only,
                wait: Timing::from_hist(&merged.wait),
                hold: if hooked {
                    Timing::from_hist(&merged.hold)
                } else {
                    None
                },
            });
        }
        rows.sort_by(|a, b| {
            let total = |r: &LockRow| r.wait.as_ref().map_or(0, |w| w.total_ns);
            total(b).cmp(&total(a)).then(a.lock_addr.cmp(&b.lock_addr))
        });

        let names = [
            "pending_full",
            "stats_full",
            "unmatched_end",
            "nested",
            "users_full",
        ];
        let mut dropped = BTreeMap::new();
        for (reason, name) in Drop::ALL.iter().zip(names) {
            let per_cpu = drops.get(&(*reason as u32), 0).map_err(map_err(maps::DROPS))?;
            dropped.insert(name.to_owned(), per_cpu.iter().sum());
        }
        Ok(TraceReport {
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            mode: self.mode(),
            hold_unavailable_reason: matches!(self.attached, Attached::Tracepoint { .. }).then(|| {
                "the contention tracepoints only see contended acquisitions; hold time needs fentry or kprobe"
                    .to_owned()
            }),
            duration_s: self.started.elapsed().as_secs_f64(),
            totals: TraceReport::totals(&rows),
            locks: rows,
            drops: dropped,
            percentile_resolution: PERCENTILE_RESOLUTION,
        })
    }
}

/// Attaches every fentry/fexit hook to the function its role resolves to on
/// this kernel (kallsyms + BTF), and the contention marker.
fn attach_fentry(ebpf: &mut Ebpf, inspector: &KernelInspector, kernel_btf: &KernelBtf) -> Result<(), Error> {
    let kallsyms = inspector.kallsyms()?;
    let btf = Btf::from_sys_fs().map_err(|source| Error::Load {
        source: source.into(),
    })?;
    let fail = |action, program: &str| {
        let program = program.to_owned();
        move |source| Error::Program {
            action,
            program,
            source,
        }
    };
    for FentryHook {
        hook,
        entry,
        exit,
        required,
    } in FENTRY_HOOKS
    {
        let target = hook
            .candidates
            .iter()
            .copied()
            .find(|f| kallsyms.has_function(f) && kernel_btf.has_function(f));
        let Some(target) = target else {
            if required {
                return Err(Error::Usage(format!(
                    "no traceable {} function ({:?})",
                    hook.role, hook.candidates
                )));
            }
            continue;
        };
        let prog: &mut aya::programs::FEntry = crate::ebpf::program_mut(ebpf, entry)?;
        prog.load(target, &btf).map_err(fail("load", entry))?;
        prog.attach().map_err(fail("attach", entry))?;
        if let Some(exit) = exit {
            let prog: &mut aya::programs::FExit = crate::ebpf::program_mut(ebpf, exit)?;
            prog.load(target, &btf).map_err(fail("load", exit))?;
            prog.attach().map_err(fail("attach", exit))?;
        }
    }
    let prog: &mut BtfTracePoint = crate::ebpf::program_mut(ebpf, programs::HOOKED_CONTENTION_BEGIN)?;
    prog.load("contention_begin", &btf)
        .map_err(fail("load", programs::HOOKED_CONTENTION_BEGIN))?;
    prog.attach()
        .map_err(fail("attach", programs::HOOKED_CONTENTION_BEGIN))?;
    Ok(())
}

/// The fentry hooks' logic on kprobes/kretprobes: a kprobe program can attach
/// to several functions, so the spinlock programs serve irqsave and irq.
fn attach_kprobe(ebpf: &mut Ebpf, inspector: &KernelInspector) -> Result<(), Error> {
    if !inspector.has_kprobes() {
        return Err(Error::Usage(
            "no kprobe PMU (kernel built without CONFIG_KPROBES)".to_owned(),
        ));
    }
    let kallsyms = inspector.kallsyms()?;
    let mut loaded = std::collections::HashSet::new();
    for FentryHook { hook, required, .. } in FENTRY_HOOKS {
        let Some(target) = hook.candidates.iter().copied().find(|f| kallsyms.has_function(f)) else {
            if required {
                return Err(Error::Usage(format!(
                    "no {} function ({:?})",
                    hook.role, hook.candidates
                )));
            }
            continue;
        };
        let (entry, exit) = kprobe_programs(hook.role);
        for program in std::iter::once(entry).chain(exit) {
            let prog: &mut aya::programs::KProbe = crate::ebpf::program_mut(ebpf, program)?;
            let fail = |action| {
                let program = program.to_owned();
                move |source| Error::Program {
                    action,
                    program,
                    source,
                }
            };
            if loaded.insert(program) {
                prog.load().map_err(fail("load"))?;
            }
            prog.attach(target, 0).map_err(fail("attach"))?;
        }
    }
    // Best effort: without it, contended acquisitions are not flagged.
    if let Ok(btf) = Btf::from_sys_fs() {
        let prog: &mut BtfTracePoint = crate::ebpf::program_mut(ebpf, programs::HOOKED_CONTENTION_BEGIN)?;
        if let Err(err) = prog
            .load("contention_begin", &btf)
            .and_then(|()| prog.attach().map(drop))
        {
            log::warn!("contended acquisitions will not be flagged: {}", one_line(&err));
        }
    }
    Ok(())
}

/// The kprobe programs (entry, optional kretprobe) for a hook role.
fn kprobe_programs(role: &str) -> (&'static str, Option<&'static str>) {
    use programs::*;
    match role {
        "pipe read entry" => (KP_PIPE_READ_ENTRY, Some(KP_PIPE_READ_EXIT)),
        "pipe write entry" => (KP_PIPE_WRITE_ENTRY, Some(KP_PIPE_WRITE_EXIT)),
        "mutex lock" => (KP_MUTEX_LOCK_ENTRY, Some(KP_MUTEX_LOCK_EXIT)),
        "mutex unlock" => (KP_MUTEX_UNLOCK_ENTRY, None),
        "spinlock irqsave" | "spinlock irq" => (KP_SPIN_LOCK_ENTRY, Some(KP_SPIN_LOCK_EXIT)),
        _ => (KP_SPIN_UNLOCK_ENTRY, None),
    }
}

/// tp_btf first (typed arguments, cheaper), the classic tracepoint otherwise.
fn attach_contention(ebpf: &mut Ebpf) -> Result<TracepointKind, Error> {
    let tp_btf = Btf::from_sys_fs().map_err(|e| one_line(&e)).and_then(|btf| {
        for (program, event) in [
            (programs::PIPE_CONTENTION_BEGIN_BTF, "contention_begin"),
            (programs::PIPE_CONTENTION_END_BTF, "contention_end"),
        ] {
            let prog: &mut BtfTracePoint =
                crate::ebpf::program_mut(ebpf, program).map_err(|e| one_line(&e))?;
            prog.load(event, &btf).map_err(|e| one_line(&e))?;
            prog.attach().map_err(|e| one_line(&e))?;
        }
        Ok(())
    });
    if let Err(why) = tp_btf {
        log::info!("tp_btf unavailable ({why}); using the classic tracepoints");
        for (program, event) in [
            (programs::PIPE_CONTENTION_BEGIN_TP, "contention_begin"),
            (programs::PIPE_CONTENTION_END_TP, "contention_end"),
        ] {
            let prog: &mut TracePoint = crate::ebpf::program_mut(ebpf, program)?;
            let fail = |action| {
                let program = program.to_owned();
                move |source| Error::Program {
                    action,
                    program,
                    source,
                }
            };
            prog.load().map_err(fail("load"))?;
            prog.attach("lock", event).map_err(fail("attach"))?;
        }
        return Ok(TracepointKind::Classic);
    }
    Ok(TracepointKind::TpBtf)
}

/// Waits until `duration` passes, `child` exits, or Ctrl-C; returns the
/// child's exit status if there was one.
pub fn wait_for(
    duration: Option<Duration>,
    mut child: Option<std::process::Child>,
    interrupted: &std::sync::atomic::AtomicBool,
) -> Result<Option<std::process::ExitStatus>, Error> {
    let started = Instant::now();
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
        std::thread::sleep(Duration::from_millis(50));
    }
}
