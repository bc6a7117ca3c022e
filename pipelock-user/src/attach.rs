//! Which attach mode each lock class gets, decided from kernel facts alone.
//!
//! The decision is a pure function of [`KernelFacts`], so it is unit-tested
//! against facts captured from real kernels (fixtures) without root or a VM.
use std::fmt;

use crate::inspector::{Kallsyms, KernelBtf};

/// How pipelock observes a lock, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum AttachMode {
    /// fentry/fexit trampolines: wait and hold, lowest overhead.
    Fentry,
    /// kprobe/kretprobe: wait and hold, higher overhead.
    Kprobe,
    /// `lock:contention_begin/end`: wait of contended acquisitions only.
    Tracepoint,
}

impl fmt::Display for AttachMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Fentry => "fentry",
            Self::Kprobe => "kprobe",
            Self::Tracepoint => "tracepoint",
        })
    }
}

/// What a live load/attach check of one program type found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Support {
    /// A test program of this type loaded and attached.
    Works,
    /// The kernel refused it; the reason is the kernel's error.
    Refused(String),
    /// Not tried (facts read from a fixture, or a prerequisite is missing).
    NotTested(String),
}

impl Support {
    pub fn works(&self) -> bool {
        matches!(self, Self::Works)
    }
}

impl fmt::Display for Support {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Works => f.write_str("yes"),
            Self::Refused(why) => write!(f, "refused: {why}"),
            Self::NotTested(why) => write!(f, "not tested: {why}"),
        }
    }
}

/// Live results for each program type pipelock can use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachSupport {
    pub fentry: Support,
    pub kprobe: Support,
    pub tracepoint: Support,
    pub tp_btf: Support,
}

impl AttachSupport {
    const FIELDS: [&str; 4] = ["fentry", "kprobe", "tracepoint", "tp_btf"];

    fn fields(&self) -> [&Support; 4] {
        [&self.fentry, &self.kprobe, &self.tracepoint, &self.tp_btf]
    }

    /// `name: outcome` lines, read back by [`Self::from_text`].
    pub fn to_text(&self) -> String {
        Self::FIELDS
            .iter()
            .zip(self.fields())
            .map(|(name, support)| format!("{name}: {support}\n"))
            .collect()
    }

    pub fn from_text(text: &str) -> Option<Self> {
        let support = |field: &str| {
            let line = text
                .lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(": "))?;
            if line == "yes" {
                Some(Support::Works)
            } else if let Some(why) = line.strip_prefix("refused: ") {
                Some(Support::Refused(why.to_owned()))
            } else {
                line.strip_prefix("not tested: ")
                    .map(|why| Support::NotTested(why.to_owned()))
            }
        };
        Some(Self {
            fentry: support("fentry")?,
            kprobe: support("kprobe")?,
            tracepoint: support("tracepoint")?,
            tp_btf: support("tp_btf")?,
        })
    }
}

/// A lock class pipelock reports on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockClass {
    /// `pipe->mutex`, taken around every pipe read and write.
    PipeMutex,
    /// `pipe->rd_wait.lock` and `pipe->wr_wait.lock`, the wait-queue spinlocks.
    PipeWait,
    /// `dentry->d_lockref`, measured at the callers of the notrace `lockref_*`.
    Lockref,
}

impl LockClass {
    pub const ALL: [Self; 3] = [Self::PipeMutex, Self::PipeWait, Self::Lockref];

    pub fn name(self) -> &'static str {
        match self {
            Self::PipeMutex => "pipe-mutex",
            Self::PipeWait => "pipe-wait",
            Self::Lockref => "lockref",
        }
    }

    /// The kernel functions this class needs hooked in fentry/kprobe mode.
    pub fn hooks(self) -> &'static [Hook] {
        match self {
            Self::PipeMutex => &[PIPE_READ, PIPE_WRITE, MUTEX_LOCK, MUTEX_UNLOCK],
            Self::PipeWait => &[
                PIPE_READ,
                PIPE_WRITE,
                SPIN_LOCK_IRQSAVE,
                SPIN_UNLOCK_IRQRESTORE,
                WAKE_UP_SYNC_KEY,
            ],
            Self::Lockref => &[LEGITIMIZE_PATH, DPUT, SPIN_LOCK, SPIN_UNLOCK],
        }
    }
}

/// One kernel function pipelock hooks, by role; the first candidate the kernel
/// has is used, so names are chosen from facts, never from the version number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hook {
    pub role: &'static str,
    pub candidates: &'static [&'static str],
}

pub const PIPE_READ: Hook = Hook {
    role: "pipe read entry",
    // 6.18 split the anonymous-pipe path out; FIFOs call into it.
    candidates: &["anon_pipe_read", "pipe_read"],
};
pub const PIPE_WRITE: Hook = Hook {
    role: "pipe write entry",
    candidates: &["anon_pipe_write", "pipe_write"],
};
pub const MUTEX_LOCK: Hook = Hook {
    role: "mutex lock",
    // Lockdep kernels turn mutex_lock() into mutex_lock_nested().
    candidates: &["mutex_lock", "mutex_lock_nested"],
};
pub const MUTEX_UNLOCK: Hook = Hook {
    role: "mutex unlock",
    candidates: &["mutex_unlock"],
};
pub const SPIN_LOCK_IRQSAVE: Hook = Hook {
    role: "spinlock irqsave",
    candidates: &["_raw_spin_lock_irqsave"],
};
pub const SPIN_UNLOCK_IRQRESTORE: Hook = Hook {
    role: "spinlock irqrestore",
    candidates: &["_raw_spin_unlock_irqrestore"],
};
pub const SPIN_LOCK: Hook = Hook {
    role: "spinlock",
    candidates: &["_raw_spin_lock"],
};
pub const SPIN_UNLOCK: Hook = Hook {
    role: "spinlock unlock",
    candidates: &["_raw_spin_unlock"],
};
pub const WAKE_UP_SYNC_KEY: Hook = Hook {
    role: "pipe wake-up",
    candidates: &["__wake_up_sync_key"],
};
pub const LEGITIMIZE_PATH: Hook = Hook {
    role: "lockref get caller",
    candidates: &["__legitimize_path"],
};
pub const DPUT: Hook = Hook {
    role: "lockref put caller",
    candidates: &["dput"],
};

/// Functions `pipelock probe` reports on, in the order it lists them.
pub const REPORTED_FUNCTIONS: &[&str] = &[
    "pipe_read",
    "pipe_write",
    "anon_pipe_read",
    "anon_pipe_write",
    "mutex_lock",
    "mutex_lock_nested",
    "mutex_unlock",
    "_raw_spin_lock",
    "_raw_spin_unlock",
    "_raw_spin_lock_irq",
    "_raw_spin_unlock_irq",
    "_raw_spin_lock_irqsave",
    "_raw_spin_unlock_irqrestore",
    "__wake_up_sync_key",
    "prepare_to_wait_event",
    "finish_wait",
    "__legitimize_path",
    "try_to_unlazy",
    "dput",
    "lockref_get",
    "lockref_get_not_zero",
    "lockref_get_not_dead",
    "lockref_put_return",
    "lockref_put_or_lock",
    "lockref_mark_dead",
];

/// `lib/` is built without ftrace: these exist but neither fentry (EBUSY) nor
/// kprobe (EINVAL) can attach, on every kernel measured.
pub fn is_notrace(function: &str) -> bool {
    function.starts_with("lockref_")
}

/// Everything the mode decision depends on.
pub struct KernelFacts<'a> {
    pub kallsyms: &'a Kallsyms,
    pub btf: Option<&'a KernelBtf>,
    pub support: &'a AttachSupport,
    /// `lock:contention_begin` and `_end` exist in tracefs.
    pub contention_tracepoints: bool,
}

/// How one function can be hooked on this kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hookable {
    /// Best mode that works for it.
    By(AttachMode),
    /// In kallsyms but compiled without ftrace.
    Notrace,
    /// In kallsyms, but neither fentry nor kprobe works on this kernel.
    NoMode,
    /// Not in kallsyms: this kernel does not have it (or inlined it).
    Absent,
}

impl fmt::Display for Hookable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::By(mode) => write!(f, "{mode}"),
            Self::Notrace => f.write_str("no (notrace)"),
            Self::NoMode => f.write_str("no (no fentry/kprobe)"),
            Self::Absent => f.write_str("-"),
        }
    }
}

impl KernelFacts<'_> {
    pub fn in_btf(&self, function: &str) -> bool {
        self.btf.is_some_and(|btf| btf.has_function(function))
    }

    /// Whether `mode` can hook `function` here.
    pub fn can_hook(&self, function: &str, mode: AttachMode) -> bool {
        if is_notrace(function) || !self.kallsyms.has_function(function) {
            return false;
        }
        match mode {
            AttachMode::Fentry => self.support.fentry.works() && self.in_btf(function),
            AttachMode::Kprobe => self.support.kprobe.works(),
            AttachMode::Tracepoint => false,
        }
    }

    pub fn hookable(&self, function: &str) -> Hookable {
        if !self.kallsyms.has_function(function) {
            Hookable::Absent
        } else if is_notrace(function) {
            Hookable::Notrace
        } else if self.can_hook(function, AttachMode::Fentry) {
            Hookable::By(AttachMode::Fentry)
        } else if self.can_hook(function, AttachMode::Kprobe) {
            Hookable::By(AttachMode::Kprobe)
        } else {
            Hookable::NoMode
        }
    }

    /// The function a hook resolves to in `mode`: its first candidate that can be hooked.
    pub fn resolve(&self, hook: Hook, mode: AttachMode) -> Option<&'static str> {
        hook.candidates.iter().copied().find(|f| self.can_hook(f, mode))
    }

    /// The contention tracepoint flavour that works: tp_btf is preferred (typed
    /// arguments, cheaper), the classic tracepoint is the floor.
    pub fn contention_tracepoint(&self) -> Option<TracepointKind> {
        if !self.contention_tracepoints {
            None
        } else if self.support.tp_btf.works() {
            Some(TracepointKind::TpBtf)
        } else if self.support.tracepoint.works() {
            Some(TracepointKind::Classic)
        } else {
            None
        }
    }

    /// What `--mode auto` picks for a class: the best mode in which every hook
    /// of the class resolves, else the contention tracepoints, else nothing.
    pub fn auto_mode(&self, class: LockClass) -> ModeChoice {
        for mode in [AttachMode::Fentry, AttachMode::Kprobe] {
            let resolved: Option<Vec<&'static str>> = class
                .hooks()
                .iter()
                .map(|hook| self.resolve(*hook, mode))
                .collect();
            if let Some(functions) = resolved {
                return ModeChoice::Hooks { mode, functions };
            }
        }
        match self.contention_tracepoint() {
            // A contended d_lock looks like any other spinlock to the
            // tracepoints: without hooks nothing ties it to a dentry.
            Some(_) if class == LockClass::Lockref => ModeChoice::NeedsHooks,
            Some(kind) => ModeChoice::WaitOnly { kind },
            None => ModeChoice::Unavailable,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TracepointKind {
    TpBtf,
    Classic,
}

impl fmt::Display for TracepointKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::TpBtf => "tp_btf",
            Self::Classic => "classic tracepoint",
        })
    }
}

/// The outcome of `auto` for one lock class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModeChoice {
    /// Wait and hold, through these functions.
    Hooks {
        mode: AttachMode,
        functions: Vec<&'static str>,
    },
    /// Only the contention tracepoints: wait of contended acquisitions.
    WaitOnly { kind: TracepointKind },
    /// Only the tracepoints work, and they cannot observe this class.
    NeedsHooks,
    /// Nothing on this kernel can observe the class.
    Unavailable,
}

impl ModeChoice {
    pub fn mode(&self) -> Option<AttachMode> {
        match self {
            Self::Hooks { mode, .. } => Some(*mode),
            Self::WaitOnly { .. } => Some(AttachMode::Tracepoint),
            Self::NeedsHooks | Self::Unavailable => None,
        }
    }
}

impl fmt::Display for ModeChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Hooks { mode, functions } => {
                write!(f, "{mode}: wait + hold via {}", functions.join(", "))
            }
            Self::WaitOnly { kind } => write!(
                f,
                "tracepoint ({kind}): wait of contended acquisitions only; hold n/a: needs fentry or kprobe"
            ),
            Self::NeedsHooks => f.write_str(
                "n/a: needs fentry or kprobe (the tracepoints cannot tell a dentry's d_lock from other spinlocks)",
            ),
            Self::Unavailable => {
                f.write_str("unavailable: no fentry, kprobe or lock:contention_* tracepoint")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::inspector::KernelInspector;

    fn fixture(name: &str) -> KernelInspector {
        KernelInspector::at(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/kernels")
                .join(name),
        )
    }

    fn all(support: Support) -> AttachSupport {
        AttachSupport {
            fentry: support.clone(),
            kprobe: support.clone(),
            tracepoint: support.clone(),
            tp_btf: support,
        }
    }

    /// Mode choices for every class on a fixture kernel, with given support.
    fn choices(kernel: &str, support: &AttachSupport) -> Vec<ModeChoice> {
        let inspector = fixture(kernel);
        let kallsyms = inspector.kallsyms().unwrap();
        let btf = inspector.btf().unwrap();
        let facts = KernelFacts {
            kallsyms: &kallsyms,
            btf: Some(&btf),
            support,
            contention_tracepoints: inspector.has_tracepoint("lock", "contention_begin"),
        };
        LockClass::ALL.iter().map(|&c| facts.auto_mode(c)).collect()
    }

    #[test]
    fn host_618_falls_back_to_tp_btf_as_measured() {
        let inspector = fixture("host-6.18.44");
        let recorded = inspector.recorded_support().unwrap().unwrap();
        assert!(matches!(&recorded.fentry, Support::Refused(why) if why.contains("Operation not permitted")));
        assert!(!recorded.kprobe.works());
        for (class, choice) in LockClass::ALL.iter().zip(choices("host-6.18.44", &recorded)) {
            let want = if *class == LockClass::Lockref {
                ModeChoice::NeedsHooks
            } else {
                ModeChoice::WaitOnly {
                    kind: TracepointKind::TpBtf,
                }
            };
            assert_eq!(choice, want, "{class:?}");
        }
    }

    #[test]
    fn host_618_hooks_anon_pipe_functions_when_fentry_works() {
        let picked = choices("host-6.18.44", &all(Support::Works));
        assert_eq!(
            picked[0],
            ModeChoice::Hooks {
                mode: AttachMode::Fentry,
                functions: vec!["anon_pipe_read", "anon_pipe_write", "mutex_lock", "mutex_unlock"],
            }
        );
    }

    #[test]
    fn debian_kernels_pick_fentry_with_their_own_pipe_entry_points() {
        for (kernel, read, write) in [
            ("debian-6.1.0-57", "pipe_read", "pipe_write"),
            ("debian-6.12.117", "pipe_read", "pipe_write"),
            ("debian-6.18.15", "anon_pipe_read", "anon_pipe_write"),
        ] {
            let recorded = fixture(kernel).recorded_support().unwrap().unwrap();
            assert_eq!(recorded, all(Support::Works), "{kernel}: measured in the VM");
            let picked = choices(kernel, &recorded);
            assert_eq!(
                picked[0],
                ModeChoice::Hooks {
                    mode: AttachMode::Fentry,
                    functions: vec![read, write, "mutex_lock", "mutex_unlock"],
                },
                "{kernel}"
            );
            assert!(
                picked.iter().all(|c| c.mode() == Some(AttachMode::Fentry)),
                "{kernel}: {picked:?}"
            );

            // Without fentry the same hooks go to kprobes.
            let mut no_fentry = recorded.clone();
            no_fentry.fentry = Support::Refused("EPERM".into());
            let picked = choices(kernel, &no_fentry);
            assert!(
                picked.iter().all(|c| c.mode() == Some(AttachMode::Kprobe)),
                "{kernel}: {picked:?}"
            );
        }
    }

    #[test]
    fn kprobe_is_next_and_classic_tracepoint_is_the_floor() {
        let mut support = all(Support::Refused("EPERM".into()));
        support.kprobe = Support::Works;
        assert_eq!(
            choices("host-6.18.44", &support)[0].mode(),
            Some(AttachMode::Kprobe)
        );

        let mut support = all(Support::Refused("EPERM".into()));
        support.tracepoint = Support::Works;
        assert_eq!(
            choices("host-6.18.44", &support)[1],
            ModeChoice::WaitOnly {
                kind: TracepointKind::Classic
            }
        );

        assert_eq!(
            choices("host-6.18.44", &all(Support::Refused("x".into())))[2],
            ModeChoice::Unavailable
        );
    }

    #[test]
    fn lockref_functions_are_never_hookable() {
        let inspector = fixture("host-6.18.44");
        let kallsyms = inspector.kallsyms().unwrap();
        let btf = inspector.btf().unwrap();
        let support = all(Support::Works);
        let facts = KernelFacts {
            kallsyms: &kallsyms,
            btf: Some(&btf),
            support: &support,
            contention_tracepoints: true,
        };
        assert!(kallsyms.has_function("lockref_get_not_dead"));
        assert_eq!(facts.hookable("lockref_get_not_dead"), Hookable::Notrace);
        assert_eq!(facts.hookable("pipe_read"), Hookable::Absent);
        assert_eq!(facts.hookable("dput"), Hookable::By(AttachMode::Fentry));
    }

    #[test]
    fn support_round_trips_through_text() {
        let support = AttachSupport {
            fentry: Support::Refused("the BPF_PROG_LOAD syscall returned EPERM".into()),
            kprobe: Support::NotTested("no target".into()),
            tracepoint: Support::Works,
            tp_btf: Support::Works,
        };
        assert_eq!(AttachSupport::from_text(&support.to_text()), Some(support));
        assert_eq!(AttachSupport::from_text("fentry: yes\n"), None);
    }
}
