//! A tracing session: attach the programs of one mode (`auto`: fentry, then
//! kprobes, then the contention tracepoints, saying why), read the maps into
//! model rows, tick an interval collector, supervise the traced command.
mod background;
pub mod child;
pub mod interval;
mod rows;

use std::time::{Duration, Instant};

use aya::{Ebpf, EbpfLoader};
use pipelock_common::{TRACE_CONFIG_GLOBAL, detail};

pub use self::{
    background::{Background, Control, Flow},
    child::{own_cpu_seconds, wait_for},
    interval::IntervalCollector,
};

/// How often the kernel's maps are drained where the user sets no interval:
/// the maps then need room for one second's locks, not for every lock a
/// long trace ever saw.
pub const DRAIN_PERIOD: Duration = Duration::from_secs(1);
use crate::{
    Error,
    bpf::{
        self, AttachMode, Filters, HookBodies, TracepointKind,
        log::LogReader,
        maps::{self, Identities},
        memory::MapSizes,
        plan::coverage_notes,
        progstats::{self, StatsGuard},
    },
    error::{one_line, short_reason},
    kernel::{KernelInspector, KernelSymbols, SymbolKind, privilege},
    model::{AskedTwice, LockClass, Refusal, ReportView, TraceReport},
};

fn refusal(mode: AttachMode, err: &Error) -> Refusal {
    Refusal {
        mode: mode.to_string(),
        reason: short_reason(err),
        detail: one_line(err),
    }
}

/// The mode a tracer ended up with, and why a better one was not used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attached {
    pub mode: AttachMode,
    /// tp_btf or the classic tracepoint, in tracepoint mode.
    pub tracepoint: Option<TracepointKind>,
    /// The better modes `auto` tried first, and why each was refused.
    pub refused: Vec<Refusal>,
}

/// Attached programs; dropping it detaches them.
pub struct Tracer {
    ebpf: Ebpf,
    /// The programs' log records, forwarded while the tracer lives.
    _log: Option<LogReader>,
    attached: Attached,
    bodies: HookBodies,
    started: Instant,
    _stats: Option<StatsGuard>,
    /// This process's CPU time when attaching was done: loading (BTF parsing,
    /// verification) is a one-off cost, not the collector's.
    cpu_at_attach: Option<f64>,
    /// What this mode or kernel could not measure, class by class.
    notes: Vec<String>,
    /// kallsyms, read at attach: static locks' names (and call stacks).
    symbols: KernelSymbols,
    /// The scheduler programs that follow waited-for owners are attached:
    /// waits are split by what the owner was doing.
    holder_split: bool,
    /// What a sampled call stack stood for (`TraceConfig::stack_sample`).
    stack_sample: u32,
    /// How reports are cut (`--by`, `--stack-depth`, filters).
    view: ReportView,
    /// Locks the collector keeps one by one (`--track-locks`).
    track_locks: usize,
    /// Threads seen asking for a mutex they own, in the order seen.
    asked_twice: Vec<AskedTwice>,
    asked_seen: std::collections::HashSet<pipelock_common::asked_twice::AskedKey>,
    /// Say each on stderr as it is seen (not under `top`'s screen).
    say_asked_twice: bool,
    /// The kernel's preemption model, where debugfs says: whether fentry
    /// programs can be preempted mid-run.
    preemption: Option<String>,
    /// kprobe mode: the return probes made in tracefs (removed on drop).
    kprobes: bpf::attach::Kprobes,
}

impl Tracer {
    /// Attaches `mode` (None: `auto`) for `filters`.
    /// Filters that match nothing are refused before anything is loaded.
    pub fn attach(mode: Option<AttachMode>, filters: &Filters, ebpf_log: bool) -> Result<Self, Error> {
        Self::attach_bodies(mode, filters, ebpf_log, HookBodies::Pipelock)
    }

    pub fn attach_bodies(
        mode: Option<AttachMode>,
        filters: &Filters,
        ebpf_log: bool,
        bodies: HookBodies,
    ) -> Result<Self, Error> {
        if bodies == HookBodies::Empty && mode.is_none() {
            return Err(Error::Usage(
                "--empty-programs needs --mode fentry, kprobe or tracepoint".to_owned(),
            ));
        }
        let mut tracer = Self::load_and_attach(mode, filters, ebpf_log, bodies)?;
        // One read of everything now: the first per-CPU map read (aya reads
        // the possible-CPU list) and info calls (aya probes kernel features)
        // cost tens of ms once; that belongs to loading, not to the collector.
        let _ = (
            maps::read_identities(&tracer.ebpf).map(|ids| maps::map_fill(&tracer.ebpf, &ids)),
            progstats::collect(&tracer.ebpf),
            aya::util::nr_cpus(),
        );
        // Measured once the loader's BTF copies are freed, too.
        tracer.cpu_at_attach = own_cpu_seconds();
        Ok(tracer)
    }

    fn load_and_attach(
        mode: Option<AttachMode>,
        filters: &Filters,
        ebpf_log: bool,
        bodies: HookBodies,
    ) -> Result<Self, Error> {
        filters.check()?;
        privilege::require()?;
        let inspector = KernelInspector::live();
        if bpf::object::OBJECT.is_empty() {
            return Err(Error::StubObject);
        }
        let btf = inspector.btf()?;
        let mut config = bpf::config::trace_config(&btf, filters)?;
        let preemption = inspector.preemption();
        let kfuncs = bpf::object::Kfuncs {
            rdonly_cast: btf.rdonly_cast_id(),
            preempt: btf.preempt_ids(),
        };
        config.runs_unpreempted = u32::from(
            kfuncs.preempt.is_some() || crate::model::notes::runs_unpreempted(preemption.as_deref()),
        );
        let sizes = MapSizes::with_stacks(filters.max_locks, filters.stack_map_size)?;
        let object = bpf::object::KernelObject::new(bpf::object::OBJECT, &kfuncs);
        // Each object gets its log reader: it holds the log map's
        // descriptor, which the object's programs need until they are loaded.
        let load = || {
            let mut loader = EbpfLoader::new();
            loader.override_global(TRACE_CONFIG_GLOBAL, &config, true);
            for (map, entries) in sizes.overrides() {
                loader.map_max_entries(map, entries);
            }
            let mut ebpf = loader
                .load(object.bytes())
                .map_err(|source| Error::Load { source })?;
            let log = if ebpf_log {
                LogReader::start(&mut ebpf)
            } else {
                None
            };
            Ok::<_, Error>((ebpf, log))
        };
        let (mut ebpf, mut log) = load()?;
        let classes = filters.classes();
        let attached = |mode, tracepoint, refused| Attached {
            mode,
            tracepoint,
            refused,
        };
        let fentry = |ebpf: &mut Ebpf| bpf::attach::fentry(ebpf, &inspector, &btf, classes, bodies);
        // The kprobe mode's tracefs return probes, kept with the tracer.
        let mut kprobes = bpf::attach::Kprobes::default();
        let mut kprobe = |ebpf: &mut Ebpf| {
            bpf::attach::kprobe(ebpf, &inspector, classes, bodies).map(|(hooked, notes)| {
                kprobes = hooked;
                notes
            })
        };
        let (attached, mut notes) = match mode {
            Some(AttachMode::Tracepoint) => (
                attached(
                    AttachMode::Tracepoint,
                    Some(bpf::attach::contention_tracepoints(&mut ebpf, bodies)?),
                    Vec::new(),
                ),
                Vec::new(),
            ),
            Some(AttachMode::Fentry) => (attached(AttachMode::Fentry, None, Vec::new()), fentry(&mut ebpf)?),
            Some(AttachMode::Kprobe) => (attached(AttachMode::Kprobe, None, Vec::new()), kprobe(&mut ebpf)?),
            // Each failed attempt drops its object, which detaches whatever
            // part of it did attach, and starts from a fresh one.
            None => match fentry(&mut ebpf) {
                Ok(notes) => (attached(AttachMode::Fentry, None, Vec::new()), notes),
                Err(fentry_err) => {
                    let mut refused = vec![refusal(AttachMode::Fentry, &fentry_err)];
                    (ebpf, log) = load()?;
                    match kprobe(&mut ebpf) {
                        Ok(notes) => (attached(AttachMode::Kprobe, None, refused), notes),
                        Err(kprobe_err) => {
                            refused.push(refusal(AttachMode::Kprobe, &kprobe_err));
                            (ebpf, log) = load()?;
                            let kind = bpf::attach::contention_tracepoints(&mut ebpf, bodies)?;
                            (attached(AttachMode::Tracepoint, Some(kind), refused), Vec::new())
                        }
                    }
                }
            },
        };
        notes.extend(coverage_notes(classes, attached.mode));
        if classes.contains(LockClass::Lockref) && attached.mode.is_hooked() {
            notes.push(
                "lockref: `contended` counts calls that took the dentry's d_lock, whether the lockless cmpxchg \
                 loop gave up under contention or the caller takes it by design (dput of a dentry with a \
                 d_delete operation: pipefs, sockfs, unlinked files)"
                    .to_owned(),
            );
        }
        if filters.task_filter_flags() != 0 {
            notes.extend(bpf::attach::task_filter(&mut ebpf, filters)?);
        }
        if filters.hold_states && !attached.mode.is_hooked() {
            notes.push(
                "--hold-states: n/a in tracepoint mode (holds are seen only by fentry or kprobe hooks)"
                    .to_owned(),
            );
        }
        if filters.callers && config.stack_sample > 1 {
            notes.push(format!(
                "callers: each CPU unwinds the first {} call stacks a second, then one in {} at random; where \
                 a caller's stacks were sampled its counts and waits are estimates, given with their 95 % margin \
                 (--stack-sample 1 unwinds every one, at about ten times the cost of a contention_begin)",
                config.stacks_exact, config.stack_sample
            ));
        }
        let holder_split = filters.details() & (1 << detail::OWNER) != 0
            && bodies == HookBodies::Pipelock
            && match bpf::attach::holder_programs(&mut ebpf) {
                Ok(()) => true,
                Err(why) => {
                    notes.push(format!(
                        "pipe-mutex: owners are named, but not what they were doing while waited for: {why}"
                    ));
                    false
                }
            };
        // Without it rows keep their addresses: not worth failing a trace.
        let symbols = inspector.symbols().unwrap_or_default();
        if symbols.is_empty() {
            notes.push(
                "kernel symbols: /proc/kallsyms shows this process no addresses (it lacks CAP_SYSLOG, \
                 or kernel.kptr_restrict is 2): static locks and call stacks stay unnamed"
                    .to_owned(),
            );
        }
        Ok(Self {
            ebpf,
            _log: log,
            attached,
            bodies,
            started: Instant::now(),
            _stats: None,
            cpu_at_attach: None,
            notes,
            symbols,
            holder_split,
            stack_sample: config.stack_sample,
            view: ReportView::default(),
            track_locks: crate::model::DEFAULT_TRACKED_LOCKS,
            asked_twice: Vec::new(),
            asked_seen: std::collections::HashSet::new(),
            say_asked_twice: true,
            preemption,
            kprobes,
        })
    }

    /// The mode as the report header names it.
    pub fn mode(&self) -> String {
        match self.bodies {
            HookBodies::Empty => format!("{} (empty programs)", self.short_mode()),
            HookBodies::Pipelock => self.short_mode(),
        }
    }

    /// The mode, as each row names it.
    pub fn short_mode(&self) -> String {
        match self.attached.tracepoint {
            Some(kind) => format!("tracepoint ({kind})"),
            None => self.attached.mode.to_string(),
        }
    }

    pub fn attached(&self) -> &Attached {
        &self.attached
    }

    /// Turns on the kernel's run-time statistics of pipelock's programs for
    /// as long as the tracer lives. Off by default: they add two clock reads
    /// to every program run, i.e. to every hooked lock operation.
    pub fn enable_run_stats(&mut self) {
        self._stats = StatsGuard::enable();
        if self._stats.is_none() {
            log::warn!(
                "BPF run-time statistics are off: the kernel refused BPF_ENABLE_STATS \
                 (it needs CAP_SYS_ADMIN and Linux 5.8); programs' run counts and times stay 0"
            );
        }
    }

    /// How the reports are cut from now on.
    pub fn set_view(&mut self, view: ReportView) {
        self.view = view;
    }

    /// Locks the running totals keep one by one before folding the
    /// longest idle into per-class rows.
    pub fn set_track_locks(&mut self, locks: usize) {
        self.track_locks = locks;
    }

    pub fn track_locks(&self) -> usize {
        self.track_locks
    }

    /// Whether a thread asking for a mutex it owns is said on stderr as it
    /// is seen (`top` shows it on its screen instead).
    pub fn say_asked_twice(&mut self, say: bool) {
        self.say_asked_twice = say;
    }

    /// Takes in the threads that asked for a mutex they already own since
    /// the last call: each a deadlock in progress, said at once.
    pub(crate) fn take_asked_twice(&mut self) -> Result<(), Error> {
        for (key, event) in maps::read_asked_twice(&self.ebpf)? {
            if !self.asked_seen.insert(key) {
                continue;
            }
            let frames: Vec<String> = maps::read_stack(&self.ebpf, event.stack_id)
                .iter()
                .map(|ip| self.symbols.frame(*ip))
                .collect();
            let row = AskedTwice {
                pid: (key.pid_tgid >> 32) as u32,
                tid: key.pid_tgid as u32,
                comm: crate::model::naming::comm_text(&event.comm),
                lock_addr: key.lock,
                lock: if event.ino != 0 {
                    format!("pipe:[{}]", event.ino)
                } else {
                    self.symbols
                        .name(key.lock, SymbolKind::Data)
                        .unwrap_or_else(|| format!("{:#x}", key.lock))
                },
                class: (event.ino != 0).then_some(LockClass::PipeMutex),
                syscall: crate::kernel::syscall_name(event.syscall),
                stack: crate::model::callers::caller_frames(&frames, crate::model::view::DEFAULT_STACK_DEPTH),
            };
            if self.say_asked_twice {
                eprintln!("pipelock: {}", row.line());
            }
            self.asked_twice.push(row);
        }
        Ok(())
    }

    /// What this mode or kernel could not measure, class by class.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    pub(crate) fn ebpf(&self) -> &Ebpf {
        &self.ebpf
    }

    pub(crate) fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    pub(crate) fn started(&self) -> Instant {
        self.started
    }

    /// The report of `stats`, measured over `duration`.
    pub(crate) fn build_report(
        &self,
        taken: &maps::Taken,
        ids: &Identities,
        duration: Duration,
    ) -> Result<TraceReport, Error> {
        let hooked = self.attached.mode.is_hooked();
        let mode = self.short_mode();
        let rows::Rows {
            locks,
            by_caller,
            by_task,
        } = rows::rows(
            taken,
            &rows::RowContext {
                ids,
                symbols: &self.symbols,
                mode: &mode,
                hooked,
                holder_split: self.holder_split,
                view: &self.view,
                stack_sample: self.stack_sample,
            },
        );
        let mut drops = maps::read_drops(&self.ebpf)?;
        let programs = progstats::collect(&self.ebpf);
        drops.insert(
            "recursion_misses".to_owned(),
            programs.iter().map(|p| p.recursion_misses).sum(),
        );
        drops.insert("kretprobe_missed".to_owned(), self.kprobes.missed());
        // Rows whose identity the kernel's map evicted before it was read.
        drops.insert(
            "identity_unknown".to_owned(),
            locks.iter().filter(|r| r.class.is_none()).count() as u64,
        );
        Ok(TraceReport {
            format: Default::default(),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            mode: self.mode(),
            refused: self.attached.refused.clone(),
            hold_unavailable_reason: (!hooked).then(|| {
                "the contention tracepoints only see contended acquisitions; hold time needs fentry or kprobe"
                    .to_owned()
            }),
            duration_s: duration.as_secs_f64(),
            totals: TraceReport::totals(&locks),
            locks,
            drops,
            percentile_resolution: crate::model::PERCENTILE_RESOLUTION.to_owned(),
            notes: self
                .notes
                .iter()
                .cloned()
                .chain(crate::model::notes::skipped_runs(
                    &programs,
                    self.attached.mode == AttachMode::Fentry,
                    self.preemption.as_deref(),
                ))
                .collect(),
            programs,
            maps: Vec::new(),
            tracer_cpu_s: own_cpu_seconds()
                .zip(self.cpu_at_attach)
                .map(|(now, attached)| now - attached),
            collector: None,
            asked_twice: self.asked_twice.clone(),
            by: self.view.by,
            by_caller,
            by_task,
        })
    }
}
