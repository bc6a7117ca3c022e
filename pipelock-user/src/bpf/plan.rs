//! Which attach mode a set of lock classes gets, decided from kernel facts
//! and the hook table alone.
//!
//! The decision is a pure function of [`KernelFacts`], so it is unit-tested
//! against facts captured from real kernels (fixtures) without root or a VM.
//! `pipelock probe` prints it; `trace --mode auto` makes the same choice
//! live, falling back when the kernel refuses at attach time.
use std::{fmt, str::FromStr};

use super::hooks::{self, is_notrace};
use crate::{
    kernel::{AttachSupport, Kallsyms, KernelBtf},
    model::{ClassSet, LockClass},
};

/// How pipelock observes locks, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum AttachMode {
    /// fentry/fexit trampolines: every acquisition, wait and hold.
    Fentry,
    /// kprobe/kretprobe: the same, at a higher cost (where fentry is refused).
    Kprobe,
    /// `lock:contention_begin/end`: wait of contended acquisitions only.
    Tracepoint,
}

impl AttachMode {
    pub const ALL: [Self; 3] = [Self::Fentry, Self::Kprobe, Self::Tracepoint];

    pub fn name(self) -> &'static str {
        match self {
            Self::Fentry => "fentry",
            Self::Kprobe => "kprobe",
            Self::Tracepoint => "tracepoint",
        }
    }

    /// Sees every acquisition (the fentry and kprobe modes).
    pub fn is_hooked(self) -> bool {
        self != Self::Tracepoint
    }
}

impl fmt::Display for AttachMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AttachMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|m| m.name() == text)
            .ok_or_else(|| format!("unknown attach mode `{text}` (fentry, kprobe or tracepoint)"))
    }
}

/// What a class's numbers are in a mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coverage {
    /// Every acquisition: wait and hold.
    WaitAndHold,
    /// Contended acquisitions only, their wait.
    ContendedWait,
    /// Not measured in this mode, and why.
    NotMeasured(&'static str),
}

impl Coverage {
    pub fn of(class: LockClass, mode: AttachMode) -> Self {
        match (class, mode) {
            (LockClass::OtherInPipeCall, AttachMode::Fentry | AttachMode::Kprobe) => {
                Self::NotMeasured("only the tracepoint mode attributes other contended locks to pipe calls")
            }
            (LockClass::Lockref, AttachMode::Tracepoint) => Self::NotMeasured(
                "needs fentry or kprobe on the callers of the notrace lockref_* functions (the tracepoints \
                 cannot tell a dentry's d_lock from other spinlocks)",
            ),
            (_, AttachMode::Tracepoint) => Self::ContendedWait,
            _ => Self::WaitAndHold,
        }
    }

    pub fn is_measured(self) -> bool {
        !matches!(self, Self::NotMeasured(_))
    }
}

impl fmt::Display for Coverage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::WaitAndHold => f.write_str("wait + hold of every acquisition"),
            Self::ContendedWait => {
                f.write_str("wait of contended acquisitions only; hold n/a: needs fentry or kprobe")
            }
            Self::NotMeasured(why) => write!(f, "n/a: {why}"),
        }
    }
}

/// The notes a report carries for the classes `mode` cannot measure.
pub fn coverage_notes(classes: ClassSet, mode: AttachMode) -> Vec<String> {
    classes
        .iter()
        .filter_map(|class| match Coverage::of(class, mode) {
            Coverage::NotMeasured(why) => Some(format!("{class}: n/a in {mode} mode ({why})")),
            _ => None,
        })
        .collect()
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

/// The outcome of `auto` for a set of classes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModeChoice {
    /// Wait and hold, through these functions.
    Hooks {
        mode: AttachMode,
        functions: Vec<&'static str>,
    },
    /// Only the contention tracepoints: wait of contended acquisitions.
    WaitOnly { kind: TracepointKind },
    /// Only the tracepoints work, and they cannot observe these classes.
    NeedsHooks,
    /// Nothing on this kernel can observe the classes.
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
            Self::Hooks { mode, functions } => write!(f, "{mode} via {}", functions.join(", ")),
            Self::WaitOnly { kind } => write!(f, "tracepoint ({kind})"),
            Self::NeedsHooks => f.write_str("n/a: needs fentry or kprobe"),
            Self::Unavailable => {
                f.write_str("unavailable: no fentry, kprobe or lock:contention_* tracepoint")
            }
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

    /// What `--mode auto` picks for `classes`, as `trace` and `top` attach
    /// them: the best hooked mode in which every required hook of the table
    /// resolves and some selected class is measured, else the contention
    /// tracepoints where they measure one, else nothing.
    pub fn auto_mode(&self, classes: ClassSet) -> ModeChoice {
        let measured = |mode| classes.iter().any(|c| Coverage::of(c, mode).is_measured());
        for mode in [AttachMode::Fentry, AttachMode::Kprobe] {
            if !measured(mode) {
                continue;
            }
            let Ok(resolved) = hooks::resolve(classes, |f| self.can_hook(f, mode)) else {
                continue;
            };
            // Optional hooks may be missing, but each class this mode
            // measures needs at least one of its own.
            let served = classes
                .iter()
                .filter(|c| Coverage::of(*c, mode).is_measured())
                .all(|c| {
                    resolved
                        .iter()
                        .any(|r| r.function.is_some() && r.row.classes.contains(c))
                });
            if served {
                return ModeChoice::Hooks {
                    mode,
                    functions: resolved.iter().filter_map(|r| r.function).collect(),
                };
            }
        }
        match self.contention_tracepoint() {
            Some(_) if !measured(AttachMode::Tracepoint) => ModeChoice::NeedsHooks,
            Some(kind) => ModeChoice::WaitOnly { kind },
            None => ModeChoice::Unavailable,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::kernel::{KernelInspector, Support};

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

    const LOCKREF: ClassSet = ClassSet::of(&[LockClass::Lockref]);
    const MUTEX: ClassSet = ClassSet::of(&[LockClass::PipeMutex]);

    /// `auto` on a fixture kernel with given support, for the default classes
    /// and for lockref.
    fn choices(kernel: &str, support: &AttachSupport) -> [ModeChoice; 3] {
        let inspector = fixture(kernel);
        let kallsyms = inspector.kallsyms().unwrap();
        let btf = inspector.btf().unwrap();
        let facts = KernelFacts {
            kallsyms: &kallsyms,
            btf: Some(&btf),
            support,
            contention_tracepoints: inspector.has_tracepoint("lock", "contention_begin"),
        };
        [ClassSet::DEFAULT, LOCKREF, MUTEX].map(|c| facts.auto_mode(c))
    }

    #[test]
    fn host_618_falls_back_to_tp_btf_as_measured() {
        let inspector = fixture("host-6.18.44");
        let recorded = inspector.recorded_support().unwrap().unwrap();
        assert!(matches!(&recorded.fentry, Support::Refused(why) if why.contains("Operation not permitted")));
        assert!(!recorded.kprobe.works());
        let [default, lockref, _] = choices("host-6.18.44", &recorded);
        assert_eq!(
            default,
            ModeChoice::WaitOnly {
                kind: TracepointKind::TpBtf
            }
        );
        assert_eq!(lockref, ModeChoice::NeedsHooks);
    }

    #[test]
    fn host_618_hooks_anon_pipe_functions_when_fentry_works() {
        let [.., mutex] = choices("host-6.18.44", &all(Support::Works));
        assert_eq!(
            mutex,
            ModeChoice::Hooks {
                mode: AttachMode::Fentry,
                functions: vec![
                    "anon_pipe_read",
                    "anon_pipe_write",
                    "mutex_lock",
                    "mutex_unlock",
                    "free_pipe_info"
                ],
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
                picked[2],
                ModeChoice::Hooks {
                    mode: AttachMode::Fentry,
                    functions: vec![read, write, "mutex_lock", "mutex_unlock", "free_pipe_info"],
                },
                "{kernel}"
            );
            let ModeChoice::Hooks { functions, .. } = &picked[0] else {
                panic!("{kernel}: {picked:?}");
            };
            // The spinlock irq pair exists on these kernels too (6.1 uses it).
            assert!(
                functions.contains(&"_raw_spin_lock_irq"),
                "{kernel}: {functions:?}"
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
            choices("host-6.18.44", &support)[0],
            ModeChoice::WaitOnly {
                kind: TracepointKind::Classic
            }
        );

        assert_eq!(
            choices("host-6.18.44", &all(Support::Refused("x".into())))[0],
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
    fn coverage_says_what_each_mode_cannot_measure() {
        let notes = coverage_notes(ClassSet::DEFAULT.union(LOCKREF), AttachMode::Tracepoint);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].starts_with("lockref: n/a in tracepoint mode"),
            "{notes:?}"
        );
        let notes = coverage_notes(ClassSet::DEFAULT, AttachMode::Fentry);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].starts_with("other-in-pipe-call: n/a in fentry mode"),
            "{notes:?}"
        );
        assert!(coverage_notes(ClassSet::PIPE_LOCKS, AttachMode::Kprobe).is_empty());
        assert_eq!("kprobe".parse::<AttachMode>(), Ok(AttachMode::Kprobe));
        assert!("auto".parse::<AttachMode>().is_err());
    }
}
