//! The lock classes pipelock reports on: one type for rows, filters, the hook
//! table and the kernel's class ids.
use std::{fmt, str::FromStr};

use pipelock_common::class;
use serde::{Deserialize, Serialize};

/// What a lock is to pipelock: which of a pipe's locks, another lock taken
/// inside a pipe call, or a dentry's lockref.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LockClass {
    /// `pipe->mutex`, taken around every pipe read and write.
    PipeMutex,
    /// `pipe->rd_wait.lock`, the readers' wait-queue spinlock.
    PipeRdWait,
    /// `pipe->wr_wait.lock`, the writers' wait-queue spinlock.
    PipeWrWait,
    /// Another lock contended inside a pipe read/write (the wake-up path's
    /// scheduler locks, mostly).
    OtherInPipeCall,
    /// `dentry->d_lockref`, measured at the callers of the notrace `lockref_*`.
    Lockref,
}

impl LockClass {
    pub const ALL: [Self; 5] = [
        Self::PipeMutex,
        Self::PipeRdWait,
        Self::PipeWrWait,
        Self::OtherInPipeCall,
        Self::Lockref,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::PipeMutex => "pipe-mutex",
            Self::PipeRdWait => "pipe-rd-wait",
            Self::PipeWrWait => "pipe-wr-wait",
            Self::OtherInPipeCall => "other-in-pipe-call",
            Self::Lockref => "lockref",
        }
    }

    /// The id the eBPF programs store in their maps.
    pub fn id(self) -> u32 {
        match self {
            Self::PipeMutex => class::PIPE_MUTEX,
            Self::PipeRdWait => class::PIPE_RD_WAIT,
            Self::PipeWrWait => class::PIPE_WR_WAIT,
            Self::OtherInPipeCall => class::OTHER_IN_PIPE_CALL,
            Self::Lockref => class::LOCKREF,
        }
    }

    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.id() == id)
    }
}

impl fmt::Display for LockClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A row's class as text: `unknown` where the identity was not recorded.
pub fn class_label(class: Option<LockClass>) -> &'static str {
    class.map_or("unknown", LockClass::name)
}

/// A set of lock classes: what `--class` selects, what a hook serves. Its
/// bits are `1 << LockClass::id()`, the mask the eBPF programs test.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ClassSet(u32);

impl ClassSet {
    pub const EMPTY: Self = Self(0);
    /// Both wait-queue spinlocks (`--class pipe-wait`).
    pub const PIPE_WAIT: Self = Self::of(&[LockClass::PipeRdWait, LockClass::PipeWrWait]);
    /// The three locks of a pipe.
    pub const PIPE_LOCKS: Self =
        Self::of(&[LockClass::PipeMutex, LockClass::PipeRdWait, LockClass::PipeWrWait]);
    /// What is traced without `--class`: lockref is opt-in, its hooks fire
    /// on every spin_lock() of the system.
    pub const DEFAULT: Self = Self::PIPE_LOCKS.union(Self::of(&[LockClass::OtherInPipeCall]));

    /// The names `--class` accepts: every class, and the groups.
    pub const NAMES: [&'static str; 8] = [
        "pipe-mutex",
        "pipe-wait",
        "pipe-rd-wait",
        "pipe-wr-wait",
        "other",
        "other-in-pipe-call",
        "lockref",
        "all",
    ];

    pub const fn of(classes: &[LockClass]) -> Self {
        let mut bits = 0;
        let mut i = 0;
        while i < classes.len() {
            bits |= 1 << class_id(classes[i]);
            i += 1;
        }
        Self(bits)
    }

    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    pub const fn intersects(self, other: Self) -> bool {
        self.0 & other.0 != 0
    }

    pub fn contains(self, class: LockClass) -> bool {
        self.0 & (1 << class.id()) != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The mask the eBPF programs read (`TraceConfig::class_mask`).
    pub fn mask(self) -> u32 {
        self.0
    }

    pub fn iter(self) -> impl Iterator<Item = LockClass> {
        LockClass::ALL.into_iter().filter(move |c| self.contains(*c))
    }

    /// `pipe-mutex/pipe-rd-wait`-style, for notes.
    pub fn names(self) -> String {
        self.iter().map(LockClass::name).collect::<Vec<_>>().join("/")
    }
}

/// `LockClass::id` in a const context (the ids are pipelock-common's).
const fn class_id(c: LockClass) -> u32 {
    match c {
        LockClass::PipeMutex => class::PIPE_MUTEX,
        LockClass::PipeRdWait => class::PIPE_RD_WAIT,
        LockClass::PipeWrWait => class::PIPE_WR_WAIT,
        LockClass::OtherInPipeCall => class::OTHER_IN_PIPE_CALL,
        LockClass::Lockref => class::LOCKREF,
    }
}

impl FromIterator<LockClass> for ClassSet {
    fn from_iter<I: IntoIterator<Item = LockClass>>(iter: I) -> Self {
        iter.into_iter()
            .fold(Self::EMPTY, |set, c| set.union(Self::of(&[c])))
    }
}

impl FromStr for ClassSet {
    type Err = String;

    /// A comma-separated list of [`Self::NAMES`].
    fn from_str(text: &str) -> Result<Self, String> {
        text.split(',').try_fold(Self::EMPTY, |set, name| {
            let one = match name.trim() {
                "pipe-wait" => Self::PIPE_WAIT,
                "other" => Self::of(&[LockClass::OtherInPipeCall]),
                "all" => LockClass::ALL.into_iter().collect(),
                name => LockClass::ALL
                    .into_iter()
                    .find(|c| c.name() == name)
                    .map(|c| Self::of(&[c]))
                    .ok_or_else(|| {
                        format!("unknown lock class `{name}` (one of: {})", Self::NAMES.join(", "))
                    })?,
            };
            Ok(set.union(one))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_match_the_kernel_side() {
        for class in LockClass::ALL {
            assert_eq!(LockClass::from_id(class.id()), Some(class));
            assert_eq!(class_id(class), class.id());
        }
        assert_eq!(LockClass::from_id(0), None);
        assert_eq!(LockClass::from_id(99), None);
    }

    #[test]
    fn groups_parse_into_their_classes() {
        let set: ClassSet = "pipe-wait".parse().unwrap();
        assert_eq!(
            set.iter().collect::<Vec<_>>(),
            [LockClass::PipeRdWait, LockClass::PipeWrWait]
        );
        let set: ClassSet = "pipe-mutex,other".parse().unwrap();
        assert_eq!(
            set.iter().collect::<Vec<_>>(),
            [LockClass::PipeMutex, LockClass::OtherInPipeCall]
        );
        assert_eq!("all".parse::<ClassSet>().unwrap().iter().count(), 5);
        assert_eq!(
            ClassSet::DEFAULT.names(),
            "pipe-mutex/pipe-rd-wait/pipe-wr-wait/other-in-pipe-call"
        );
        let err = "pipe-mutex,mutexes".parse::<ClassSet>().unwrap_err();
        assert!(err.contains("`mutexes`") && err.contains("pipe-wait"), "{err}");
        for name in ClassSet::NAMES {
            assert!(!name.parse::<ClassSet>().unwrap().is_empty(), "{name}");
        }
    }

    #[test]
    fn classes_serialize_as_their_names() {
        for class in LockClass::ALL {
            let json = serde_json::to_string(&class).unwrap();
            assert_eq!(json, format!("\"{}\"", class.name()));
            assert_eq!(serde_json::from_str::<LockClass>(&json).unwrap(), class);
        }
    }
}
