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
    os::fd::{AsFd as _, AsRawFd as _},
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
    lockstats::{self, LockRow, PERCENTILE_RESOLUTION, SortKey, Timing, TraceReport},
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
    /// dentry->d_lockref, at the callers of lockref_* (fentry/kprobe mode).
    Lockref,
}

impl ClassArg {
    fn mask(self) -> u32 {
        match self {
            Self::PipeMutex => 1 << class::PIPE_MUTEX,
            Self::PipeWait => (1 << class::PIPE_RD_WAIT) | (1 << class::PIPE_WR_WAIT),
            Self::Other => 1 << class::OTHER_IN_PIPE_CALL,
            Self::Lockref => 1 << class::LOCKREF,
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
        // lockref is opt-in: its fallback hooks fire on every spin_lock() of
        // the system (see `pipelock overhead`).
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
        path_dentry: off("path", "dentry")?,
        dentry_lockref: off("dentry", "d_lockref.lock")?,
        dentry_name: off("dentry", "d_name.name")?,
        filter_comm_set: u32::from(filters.comm.is_some()),
        filter_comm: comm_bytes(filters.comm.as_deref().unwrap_or(""))?,
    })
}

/// A `-c COMM` as the kernel stores it: at most 15 bytes, NUL-padded (a
/// longer name is cut like the kernel cuts the task's).
fn comm_bytes(comm: &str) -> Result<[u8; 16], Error> {
    if comm.contains('\0') {
        return Err(Error::Usage("-c: a command name cannot contain NUL".to_owned()));
    }
    let mut bytes = [0u8; 16];
    let len = comm.len().min(15);
    bytes[..len].copy_from_slice(&comm.as_bytes()[..len]);
    Ok(bytes)
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

/// What runs on the hooks of a hooked mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookBodies {
    /// pipelock's programs.
    Pipelock,
    /// Programs that return at once: `pipelock overhead` measures with them
    /// what the trampolines or kprobes alone cost, the floor under pipelock.
    Empty,
}

/// Attached programs; dropping it detaches them.
pub struct Tracer {
    ebpf: Ebpf,
    attached: Attached,
    bodies: HookBodies,
    started: Instant,
    _stats: Option<crate::progstats::StatsGuard>,
    /// This process's CPU time when attaching was done: loading (BTF parsing,
    /// verification) is a one-off cost, not the collector's.
    cpu_at_attach: Option<f64>,
    /// What the report must say this mode or kernel could not measure.
    notes: Vec<String>,
}

/// One hooked kernel function and the programs attached to it in each
/// hooked mode. A hook is attached when a selected class needs it; one that
/// is not `required` is skipped, with a note, where the kernel lacks it.
struct HookPrograms {
    hook: crate::attach::Hook,
    /// `1 << class` of each class whose numbers come from this hook.
    classes: u32,
    fentry: &'static str,
    fexit: Option<&'static str>,
    kprobe: &'static str,
    kretprobe: Option<&'static str>,
    required: bool,
}

const PIPE_CLASSES: u32 = (1 << class::PIPE_MUTEX) | (1 << class::PIPE_RD_WAIT) | (1 << class::PIPE_WR_WAIT);
const WAIT_CLASSES: u32 = (1 << class::PIPE_RD_WAIT) | (1 << class::PIPE_WR_WAIT);
const LOCKREF_CLASS: u32 = 1 << class::LOCKREF;

const HOOKS: [HookPrograms; 12] = {
    use crate::attach::{
        DPUT, Hook, LEGITIMIZE_PATH, MUTEX_LOCK, MUTEX_UNLOCK, PIPE_READ, PIPE_WRITE, SPIN_LOCK,
        SPIN_LOCK_IRQSAVE, SPIN_UNLOCK, SPIN_UNLOCK_IRQRESTORE,
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
    const fn hook(
        hook: Hook,
        classes: u32,
        (fentry, fexit): (&'static str, Option<&'static str>),
        (kprobe, kretprobe): (&'static str, Option<&'static str>),
        required: bool,
    ) -> HookPrograms {
        HookPrograms {
            hook,
            classes,
            fentry,
            fexit,
            kprobe,
            kretprobe,
            required,
        }
    }
    let read = (KP_PIPE_READ_ENTRY, Some(KP_PIPE_READ_EXIT));
    let write = (KP_PIPE_WRITE_ENTRY, Some(KP_PIPE_WRITE_EXIT));
    // A kprobe program attaches to several functions: irqsave and irq share.
    let spin = (KP_SPIN_LOCK_ENTRY, Some(KP_SPIN_LOCK_EXIT));
    let unspin = (KP_SPIN_UNLOCK_ENTRY, None);
    [
        hook(
            PIPE_READ,
            PIPE_CLASSES,
            (PIPE_READ_ENTRY, Some(PIPE_READ_EXIT)),
            read,
            true,
        ),
        hook(
            PIPE_WRITE,
            PIPE_CLASSES,
            (PIPE_WRITE_ENTRY, Some(PIPE_WRITE_EXIT)),
            write,
            true,
        ),
        hook(
            MUTEX_LOCK,
            1 << class::PIPE_MUTEX,
            // No exit hook: see pipe_hooks.rs (contention_end ends a wait).
            (MUTEX_LOCK_ENTRY, None),
            (KP_MUTEX_LOCK_ENTRY, None),
            true,
        ),
        hook(
            MUTEX_UNLOCK,
            1 << class::PIPE_MUTEX,
            (MUTEX_UNLOCK_ENTRY, None),
            (KP_MUTEX_UNLOCK_ENTRY, None),
            true,
        ),
        hook(
            SPIN_LOCK_IRQSAVE,
            WAIT_CLASSES,
            (SPIN_LOCK_IRQSAVE_ENTRY, Some(SPIN_LOCK_IRQSAVE_EXIT)),
            spin,
            true,
        ),
        hook(
            SPIN_UNLOCK_IRQRESTORE,
            WAIT_CLASSES,
            (SPIN_UNLOCK_IRQRESTORE_ENTRY, None),
            unspin,
            true,
        ),
        hook(
            SPIN_LOCK_IRQ,
            WAIT_CLASSES,
            (SPIN_LOCK_IRQ_ENTRY, Some(SPIN_LOCK_IRQ_EXIT)),
            spin,
            false,
        ),
        hook(
            SPIN_UNLOCK_IRQ,
            WAIT_CLASSES,
            (SPIN_UNLOCK_IRQ_ENTRY, None),
            unspin,
            false,
        ),
        hook(
            LEGITIMIZE_PATH,
            LOCKREF_CLASS,
            (LOCKREF_GET_ENTRY, Some(LOCKREF_GET_EXIT)),
            (KP_LOCKREF_GET_ENTRY, Some(KP_LOCKREF_EXIT)),
            false,
        ),
        hook(
            DPUT,
            LOCKREF_CLASS,
            (LOCKREF_PUT_ENTRY, Some(LOCKREF_PUT_EXIT)),
            (KP_LOCKREF_PUT_ENTRY, Some(KP_LOCKREF_EXIT)),
            false,
        ),
        hook(
            SPIN_LOCK,
            LOCKREF_CLASS,
            (DENTRY_SPIN_LOCK_ENTRY, Some(DENTRY_SPIN_LOCK_EXIT)),
            (KP_DENTRY_SPIN_LOCK_ENTRY, Some(KP_DENTRY_SPIN_LOCK_EXIT)),
            false,
        ),
        hook(
            SPIN_UNLOCK,
            LOCKREF_CLASS,
            (DENTRY_SPIN_UNLOCK_ENTRY, None),
            (KP_DENTRY_SPIN_UNLOCK_ENTRY, None),
            false,
        ),
    ]
};

/// The hooks the selected classes need, each with the function it resolves
/// to here (None: not on this kernel). Fails if a required one is missing.
fn resolve_hooks(
    class_mask: u32,
    traceable: impl Fn(&str) -> bool,
) -> Result<Vec<(&'static HookPrograms, Option<&'static str>)>, Error> {
    let mut resolved = Vec::new();
    for programs in HOOKS.iter().filter(|h| h.classes & class_mask != 0) {
        let target = programs.hook.candidates.iter().copied().find(|f| traceable(f));
        if target.is_none() && programs.required {
            return Err(Error::Usage(format!(
                "no traceable {} function ({:?})",
                programs.hook.role, programs.hook.candidates
            )));
        }
        resolved.push((programs, target));
    }
    Ok(resolved)
}

/// Notes for the report on classes a hooked mode could not fully cover.
fn missing_hook_notes(resolved: &[(&HookPrograms, Option<&str>)]) -> Vec<String> {
    resolved
        .iter()
        .filter(|(_, target)| target.is_none())
        .map(|(p, _)| {
            format!(
                "{}: no traceable {} function ({}) on this kernel; its numbers are missing",
                class_list(p.classes),
                p.hook.role,
                p.hook.candidates.join(", ")
            )
        })
        .collect()
}

fn class_list(mask: u32) -> String {
    (0..32)
        .filter(|c| mask & (1 << c) != 0)
        .map(lockstats::class_name)
        .collect::<Vec<_>>()
        .join("/")
}

impl Tracer {
    pub fn attach(mode: ModeArg, filters: &Filters, ebpf_log: bool) -> Result<Self, Error> {
        Self::attach_bodies(mode, filters, ebpf_log, HookBodies::Pipelock)
    }

    pub fn attach_bodies(
        mode: ModeArg,
        filters: &Filters,
        ebpf_log: bool,
        bodies: HookBodies,
    ) -> Result<Self, Error> {
        if bodies == HookBodies::Empty && !matches!(mode, ModeArg::Fentry | ModeArg::Kprobe) {
            return Err(Error::Usage(
                "--empty-programs needs --mode fentry or --mode kprobe".to_owned(),
            ));
        }
        let mut tracer = Self::load_and_attach(mode, filters, ebpf_log, bodies)?;
        // One read of everything now: the first per-CPU map read (aya reads
        // the possible-CPU list) and info calls (aya probes kernel features)
        // cost tens of ms once; that belongs to loading, not to the collector.
        let _ = (
            tracer.read_identities().map(|ids| tracer.map_fill(&ids)),
            crate::progstats::collect(&tracer.ebpf),
            aya::util::nr_cpus(),
        );
        // Measured once the loader's BTF copies are freed, too.
        tracer.cpu_at_attach = own_cpu_seconds();
        Ok(tracer)
    }

    fn load_and_attach(
        mode: ModeArg,
        filters: &Filters,
        ebpf_log: bool,
        bodies: HookBodies,
    ) -> Result<Self, Error> {
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
        let mask = config.class_mask;
        let (attached, mut notes) = match mode {
            ModeArg::Tracepoint => (
                Attached::Tracepoint {
                    kind: attach_contention(&mut ebpf)?,
                    fallback: None,
                },
                Vec::new(),
            ),
            ModeArg::Fentry => (
                Attached::Fentry,
                attach_fentry(&mut ebpf, &inspector, &btf, mask, bodies)?,
            ),
            ModeArg::Kprobe => (
                Attached::Kprobe { fallback: None },
                attach_kprobe(&mut ebpf, &inspector, mask, bodies)?,
            ),
            // Each failed attempt drops its object, which detaches whatever
            // part of it did attach, and starts from a fresh one.
            ModeArg::Auto => match attach_fentry(&mut ebpf, &inspector, &btf, mask, bodies) {
                Ok(notes) => (Attached::Fentry, notes),
                Err(fentry_err) => {
                    let why = format!("fentry: {}", one_line(&fentry_err));
                    ebpf = load()?;
                    match attach_kprobe(&mut ebpf, &inspector, mask, bodies) {
                        Ok(notes) => (Attached::Kprobe { fallback: Some(why) }, notes),
                        Err(kprobe_err) => {
                            ebpf = load()?;
                            let kind = attach_contention(&mut ebpf)?;
                            let why = format!("{why}; kprobe: {}", one_line(&kprobe_err));
                            (
                                Attached::Tracepoint {
                                    kind,
                                    fallback: Some(why),
                                },
                                Vec::new(),
                            )
                        }
                    }
                }
            },
        };
        let hooked = !matches!(attached, Attached::Tracepoint { .. });
        if !hooked && mask & LOCKREF_CLASS != 0 {
            notes.push(
                "lockref: n/a in tracepoint mode (needs fentry or kprobe on the callers of the notrace lockref_* \
                 functions)"
                    .to_owned(),
            );
        }
        if hooked && mask & (1 << class::OTHER_IN_PIPE_CALL) != 0 {
            notes.push(
                "other-in-pipe-call: only the tracepoint mode attributes other contended locks to pipe calls"
                    .to_owned(),
            );
        }
        Ok(Self {
            ebpf,
            attached,
            bodies,
            started: Instant::now(),
            _stats: None,
            cpu_at_attach: None,
            notes,
        })
    }

    pub fn mode(&self) -> String {
        if self.bodies == HookBodies::Empty {
            return format!("{} (empty programs)", self.short_mode());
        }
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

    /// Turns on the kernel's run-time statistics of pipelock's programs for
    /// as long as the tracer lives. Off by default: they add two clock reads
    /// to every program run, i.e. to every hooked lock operation.
    pub fn enable_run_stats(&mut self) {
        self._stats = crate::progstats::StatsGuard::enable();
    }

    /// What this mode or kernel could not measure, class by class.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// The mode without the reasons for a fallback (the per-row `mode`).
    pub fn short_mode(&self) -> String {
        match &self.attached {
            Attached::Fentry => "fentry".to_owned(),
            Attached::Kprobe { .. } => "kprobe".to_owned(),
            Attached::Tracepoint { kind, .. } => format!("tracepoint ({kind})"),
        }
    }

    /// Reads and merges the maps into a report of everything since attach.
    pub fn report(&self) -> Result<TraceReport, Error> {
        let stats = self.read_stats()?;
        let ids = self.read_identities()?;
        let mut report = self.build_report(&stats, &ids, self.started.elapsed())?;
        report.maps = self.map_fill(&ids);
        Ok(report)
    }

    /// Every traced lock's statistics, the CPUs merged.
    fn read_stats(&self) -> Result<HashMap<u64, LockStats>, Error> {
        let map = self.map(maps::LOCK_STATS)?;
        let stats: PerCpuHashMap<_, u64, LockStats> =
            PerCpuHashMap::try_from(map).map_err(map_err(maps::LOCK_STATS))?;
        let mut merged = HashMap::new();
        for entry in stats.iter() {
            let (lock, per_cpu) = entry.map_err(map_err(maps::LOCK_STATS))?;
            let total = merged.entry(lock).or_insert(LockStats::EMPTY);
            for cpu in per_cpu.iter() {
                lockstats::merge_stats(total, cpu);
            }
        }
        Ok(merged)
    }

    /// Reads the statistics and removes what was read from the kernel, so
    /// the next read holds only what happened since (klockstat's `-i`). An
    /// event landing on a lock between its read and its removal is lost: a
    /// window of microseconds per lock.
    fn take_stats(&mut self) -> Result<HashMap<u64, LockStats>, Error> {
        let stats = self.read_stats()?;
        let map = self
            .ebpf
            .map_mut(maps::LOCK_STATS)
            .ok_or_else(|| Error::Missing {
                kind: "map",
                name: maps::LOCK_STATS.to_owned(),
            })?;
        let mut live: PerCpuHashMap<_, u64, LockStats> =
            PerCpuHashMap::try_from(map).map_err(map_err(maps::LOCK_STATS))?;
        for lock in stats.keys() {
            // Already gone is fine: nothing else removes entries.
            let _ = live.remove(lock);
        }
        Ok(stats)
    }

    /// How full each of pipelock's maps is: a full map drops events.
    fn map_fill(&self, ids: &Identities) -> Vec<MapFill> {
        use aya::maps::Map;
        use pipelock_common::Pending;
        // Counting keys costs a syscall per entry: the identity maps were
        // just read, so only the small per-tick maps are walked here. The
        // per-thread LRU maps evict old threads instead of dropping events,
        // so their fill is not counted.
        let count = |name: &str| -> Option<usize> {
            let map = self.ebpf.map(name)?;
            match name {
                maps::LOCK_STATS => Some(
                    PerCpuHashMap::<_, u64, LockStats>::try_from(map)
                        .ok()?
                        .keys()
                        .count(),
                ),
                maps::PENDING => Some(BpfHashMap::<_, u32, Pending>::try_from(map).ok()?.keys().count()),
                maps::LOCK_INFO => Some(ids.info.len()),
                maps::LOCK_USERS => Some(ids.comms.values().map(Vec::len).sum()),
                _ => None,
            }
        };
        [
            maps::LOCK_STATS,
            maps::LOCK_INFO,
            maps::LOCK_USERS,
            maps::PENDING,
            maps::TASK_PIPE,
            maps::TASK_LOCKREF,
        ]
        .into_iter()
        .filter_map(|name| {
            let (Map::HashMap(data) | Map::LruHashMap(data) | Map::PerCpuHashMap(data)) =
                self.ebpf.map(name)?
            else {
                return None;
            };
            Some(MapFill {
                name,
                used: count(name),
                capacity: data.info().ok()?.max_entries(),
                memlock_bytes: memlock(data.fd().as_fd().as_raw_fd()),
            })
        })
        .collect()
    }

    fn map(&self, name: &str) -> Result<&aya::maps::Map, Error> {
        self.ebpf.map(name).ok_or_else(|| Error::Missing {
            kind: "map",
            name: name.to_owned(),
        })
    }

    /// What each lock is and who was seen on it (read once per report or tick:
    /// the process map can hold thousands of entries, two syscalls each).
    fn read_identities(&self) -> Result<Identities, Error> {
        let info: BpfHashMap<_, u64, LockInfo> =
            BpfHashMap::try_from(self.map(maps::LOCK_INFO)?).map_err(map_err(maps::LOCK_INFO))?;
        let users: BpfHashMap<_, LockUser, [u8; 16]> =
            BpfHashMap::try_from(self.map(maps::LOCK_USERS)?).map_err(map_err(maps::LOCK_USERS))?;
        let mut ids = Identities::default();
        for entry in info.iter() {
            let (lock, lock_info) = entry.map_err(map_err(maps::LOCK_INFO))?;
            ids.info.insert(lock, lock_info);
        }
        for entry in users.iter() {
            let (user, comm) = entry.map_err(map_err(maps::LOCK_USERS))?;
            let comm = String::from_utf8_lossy(comm.split(|b| *b == 0).next().unwrap_or(&[])).into_owned();
            ids.comms.entry(user.lock).or_default().push((user.tgid, comm));
        }
        Ok(ids)
    }

    /// The report of `stats`, measured over `duration`.
    fn build_report(
        &self,
        stats: &HashMap<u64, LockStats>,
        ids: &Identities,
        duration: Duration,
    ) -> Result<TraceReport, Error> {
        let drops: PerCpuArray<_, u64> =
            PerCpuArray::try_from(self.map(maps::DROPS)?).map_err(map_err(maps::DROPS))?;
        let comms = &ids.comms;

        let hooked = !matches!(self.attached, Attached::Tracepoint { .. });
        let mut rows = Vec::new();
        for (&lock, merged) in stats {
            let lock_info = ids.info.get(&lock).copied();
            // fentry mode notes processes once per pipe (at its mutex address);
            // every lock of that pipe shares them.
            let mut users = comms.get(&lock).cloned().unwrap_or_default();
            if let Some(pipe) = lock_info.map(|i| i.pipe).filter(|p| *p != lock) {
                users.extend(comms.get(&pipe).cloned().unwrap_or_default());
            }
            users.sort();
            users.dedup();
            let class = lock_info.map_or(0, |i| i.class);
            let pipe_ino = lock_info
                .filter(|i| i.class != class::LOCKREF)
                .map(|i| i.ino)
                .filter(|ino| *ino != 0);
            let pipe = pipe_ino.map_or_else(|| "pipe:[?]".to_owned(), |ino| format!("pipe:[{ino}]"));
            let name = match class {
                class::OTHER_IN_PIPE_CALL => format!("{lock:#x} in {pipe} call"),
                class::LOCKREF => {
                    let name = lock_info.map(|i| i.name).unwrap_or_default();
                    let name = String::from_utf8_lossy(name.split(|b| *b == 0).next().unwrap_or(&[]));
                    if name.is_empty() {
                        "dentry:?".to_owned()
                    } else {
                        format!("dentry:{name}")
                    }
                }
                _ => pipe,
            };
            rows.push(LockRow {
                class: lockstats::class_name(class),
                lock_addr: lock,
                pipe_ino,
                name,
                comms: users.iter().map(|(pid, comm)| format!("{comm}({pid})")).collect(),
                mode: self.short_mode(),
                acquisitions: hooked.then_some(merged.acquisitions),
                contentions: merged.contentions,
                spin_only: merged.spin_only,
                dropped: hooked.then_some(merged.dropped),
                wait: Timing::from_hist(&merged.wait),
                hold: if hooked {
                    Timing::from_hist(&merged.hold)
                } else {
                    None
                },
            });
        }
        lockstats::sort_rows(&mut rows, SortKey::WaitTotal);

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
        let programs = crate::progstats::collect(&self.ebpf);
        dropped.insert(
            "recursion_misses".to_owned(),
            programs.iter().map(|p| p.recursion_misses).sum(),
        );
        Ok(TraceReport {
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            mode: self.mode(),
            hold_unavailable_reason: (!hooked).then(|| {
                "the contention tracepoints only see contended acquisitions; hold time needs fentry or kprobe"
                    .to_owned()
            }),
            duration_s: duration.as_secs_f64(),
            totals: TraceReport::totals(&rows),
            locks: rows,
            drops: dropped,
            percentile_resolution: PERCENTILE_RESOLUTION,
            notes: self.notes.clone(),
            programs,
            maps: Vec::new(),
            tracer_cpu_s: own_cpu_seconds()
                .zip(self.cpu_at_attach)
                .map(|(now, attached)| now - attached),
        })
    }
}

fn map_err(name: &str) -> impl FnOnce(aya::maps::MapError) -> Error + use<> {
    let name = name.to_owned();
    move |source| Error::Map { map: name, source }
}

/// `LOCK_INFO` and `LOCK_USERS`, read into memory.
#[derive(Default)]
struct Identities {
    info: HashMap<u64, LockInfo>,
    comms: HashMap<u64, Vec<(u32, String)>>,
}

/// Entries in one of pipelock's maps.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MapFill {
    pub name: &'static str,
    /// None for the per-thread LRU maps (full, they evict; nothing is lost).
    pub used: Option<usize>,
    pub capacity: u32,
    /// The kernel's accounting of the map's memory (`memlock` in fdinfo).
    pub memlock_bytes: Option<u64>,
}

/// `memlock:` of one of this process's BPF map descriptors.
fn memlock(fd: i32) -> Option<u64> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("memlock:"))
        .and_then(|v| v.trim().parse().ok())
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

/// `--interval`: each tick takes what the kernel gathered since the last one
/// and keeps the running total in userspace, so both the interval's figures
/// (max included) and the whole run's are exact.
pub struct IntervalCollector {
    total: HashMap<u64, LockStats>,
    last: Instant,
    /// When the running total starts (attach, or the last reset).
    since: Instant,
}

/// One tick: the interval just ended and everything since attach.
pub struct Snapshot {
    pub interval: TraceReport,
    pub total: TraceReport,
    pub fill: Vec<MapFill>,
}

impl IntervalCollector {
    pub fn new(tracer: &Tracer) -> Self {
        Self {
            total: HashMap::new(),
            last: tracer.started,
            since: tracer.started,
        }
    }

    /// Starts the running total afresh (`r` in `pipelock top`).
    pub fn reset(&mut self) {
        self.total.clear();
        self.since = Instant::now();
    }

    pub fn tick(&mut self, tracer: &mut Tracer) -> Result<Snapshot, Error> {
        // Before the statistics are taken: that is when the maps are fullest.
        let ids = tracer.read_identities()?;
        let fill = tracer.map_fill(&ids);
        let fresh = tracer.take_stats()?;
        let interval = self.last.elapsed();
        self.last = Instant::now();
        for (lock, stats) in &fresh {
            lockstats::merge_stats(self.total.entry(*lock).or_insert(LockStats::EMPTY), stats);
        }
        let mut total = tracer.build_report(&self.total, &ids, self.since.elapsed())?;
        total.maps = fill.clone();
        Ok(Snapshot {
            interval: tracer.build_report(&fresh, &ids, interval)?,
            total,
            fill,
        })
    }
}

/// The contention tracepoints of the hooked modes: which acquisitions were
/// contended, and when a contended pipe mutex acquisition ends.
const CONTENTION_MARKERS: [(&str, &str); 2] = [
    (programs::HOOKED_CONTENTION_BEGIN, "contention_begin"),
    (programs::HOOKED_CONTENTION_END, "contention_end"),
];

/// Attaches every fentry/fexit hook the selected classes need to the
/// function its role resolves to on this kernel (kallsyms + BTF), and the
/// contention marker. Returns notes on hooks this kernel lacks.
fn attach_fentry(
    ebpf: &mut Ebpf,
    inspector: &KernelInspector,
    kernel_btf: &KernelBtf,
    class_mask: u32,
    bodies: HookBodies,
) -> Result<Vec<String>, Error> {
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
    let resolved = resolve_hooks(class_mask, |f| {
        kallsyms.has_function(f) && kernel_btf.has_function(f)
    })?;
    for (programs, target) in &resolved {
        let Some(target) = target else { continue };
        let (entry, exit) = match bodies {
            HookBodies::Pipelock => (programs.fentry, programs.fexit),
            HookBodies::Empty => {
                let i = HOOKS.iter().position(|h| std::ptr::eq(h, *programs)).unwrap_or(0);
                (
                    programs::EMPTY_FENTRY[i],
                    programs.fexit.map(|_| programs::EMPTY_FEXIT[i]),
                )
            }
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
    if class_mask & PIPE_CLASSES != 0 && bodies == HookBodies::Pipelock {
        for (program, tracepoint) in CONTENTION_MARKERS {
            let prog: &mut BtfTracePoint = crate::ebpf::program_mut(ebpf, program)?;
            prog.load(tracepoint, &btf).map_err(fail("load", program))?;
            prog.attach().map_err(fail("attach", program))?;
        }
    }
    Ok(missing_hook_notes(&resolved))
}

/// The fentry hooks' logic on kprobes/kretprobes.
fn attach_kprobe(
    ebpf: &mut Ebpf,
    inspector: &KernelInspector,
    class_mask: u32,
    bodies: HookBodies,
) -> Result<Vec<String>, Error> {
    if !inspector.has_kprobes() {
        return Err(Error::Usage(
            "no kprobe PMU (kernel built without CONFIG_KPROBES)".to_owned(),
        ));
    }
    let kallsyms = inspector.kallsyms()?;
    let resolved = resolve_hooks(class_mask, |f| kallsyms.has_function(f))?;
    let mut loaded = std::collections::HashSet::new();
    for (programs, target) in &resolved {
        let Some(target) = target else { continue };
        let (entry, exit) = match bodies {
            HookBodies::Pipelock => (programs.kprobe, programs.kretprobe),
            HookBodies::Empty => (
                programs::EMPTY_KPROBE,
                programs.kretprobe.map(|_| programs::EMPTY_KRETPROBE),
            ),
        };
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
            prog.attach(*target, 0).map_err(fail("attach"))?;
        }
    }
    let mut notes = missing_hook_notes(&resolved);
    // Best effort: without it, contended acquisitions are not flagged.
    if class_mask & PIPE_CLASSES != 0 && bodies == HookBodies::Pipelock {
        let attached = Btf::from_sys_fs().map_err(|e| one_line(&e)).and_then(|btf| {
            CONTENTION_MARKERS.iter().try_for_each(|(program, tracepoint)| {
                let prog: &mut BtfTracePoint =
                    crate::ebpf::program_mut(ebpf, program).map_err(|e| one_line(&e))?;
                prog.load(tracepoint, &btf)
                    .and_then(|()| prog.attach().map(drop))
                    .map_err(|e| one_line(&e))
            })
        });
        if let Err(err) = attached {
            notes.push(format!(
                "contended pipe lock acquisitions are not flagged, and pipe mutex waits read 0: {err}"
            ));
        }
    }
    Ok(notes)
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
