//! The hook table: every kernel function pipelock hooks in the fentry and
//! kprobe modes, the classes that need it, and its programs in each mode.
//! `pipelock probe`'s predictions and the attaching of `trace`, `top` and
//! `overhead` all read [`HOOKS`] through [`resolve`], so they cannot disagree.
use pipelock_common::programs::*;

use crate::model::{ClassSet, LockClass};

/// One kernel function pipelock hooks, by role; the first candidate the kernel
/// has is used, so names are chosen from facts, never from the version number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hook {
    pub role: &'static str,
    pub candidates: &'static [&'static str],
}

/// A hook and what runs on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HookRow {
    pub hook: Hook,
    /// The classes whose numbers need this hook.
    pub classes: ClassSet,
    /// fentry program, and fexit where the return matters.
    pub fentry: (&'static str, Option<&'static str>),
    /// The same logic as kprobe/kretprobe (one kprobe program may serve
    /// several functions: the irqsave and irq spinlock variants share).
    pub kprobe: (&'static str, Option<&'static str>),
    /// Without it the classes cannot be measured at all; an optional hook
    /// the kernel lacks is skipped with a note in the report.
    pub required: bool,
}

const PIPE: ClassSet = ClassSet::PIPE_LOCKS;
const MUTEX: ClassSet = ClassSet::of(&[LockClass::PipeMutex]);
const WAIT: ClassSet = ClassSet::PIPE_WAIT;
const LOCKREF: ClassSet = ClassSet::of(&[LockClass::Lockref]);

const fn row(
    role: &'static str,
    candidates: &'static [&'static str],
    classes: ClassSet,
    fentry: (&'static str, Option<&'static str>),
    kprobe: (&'static str, Option<&'static str>),
    required: bool,
) -> HookRow {
    HookRow {
        hook: Hook { role, candidates },
        classes,
        fentry,
        kprobe,
        required,
    }
}

/// Every hook, in attach order. `pipelock_common::programs::EMPTY_FENTRY[i]`
/// is the do-nothing program `overhead` attaches in place of row `i`'s.
pub const HOOKS: [HookRow; 16] = {
    let spin = (KP_SPIN_LOCK_ENTRY, Some(KP_SPIN_LOCK_EXIT));
    let unspin = (KP_SPIN_UNLOCK_ENTRY, None);
    [
        row(
            "pipe read entry",
            // 6.18 split the anonymous-pipe path out; FIFOs call into it.
            &["anon_pipe_read", "pipe_read"],
            PIPE,
            (PIPE_READ_ENTRY, Some(PIPE_READ_EXIT)),
            (KP_PIPE_READ_ENTRY, Some(KP_PIPE_READ_EXIT)),
            true,
        ),
        row(
            "pipe write entry",
            &["anon_pipe_write", "pipe_write"],
            PIPE,
            (PIPE_WRITE_ENTRY, Some(PIPE_WRITE_EXIT)),
            (KP_PIPE_WRITE_ENTRY, Some(KP_PIPE_WRITE_EXIT)),
            true,
        ),
        // Every pipe class needs it: a pipe call's first mutex_lock is how
        // the programs learn which pipe the call is on (see pipe_hooks.rs).
        // No exit hook: a contended acquisition ends at contention_end.
        row(
            "mutex lock",
            // Lockdep kernels turn mutex_lock() into mutex_lock_nested().
            &["mutex_lock", "mutex_lock_nested"],
            PIPE,
            (MUTEX_LOCK_ENTRY, None),
            (KP_MUTEX_LOCK_ENTRY, None),
            true,
        ),
        row(
            "mutex unlock",
            &["mutex_unlock"],
            MUTEX,
            (MUTEX_UNLOCK_ENTRY, None),
            (KP_MUTEX_UNLOCK_ENTRY, None),
            true,
        ),
        // Optional: without it a thread that knew a pipe by its address keeps
        // that pipe's identity when a new pipe takes the freed address.
        row(
            "pipe free",
            &["free_pipe_info"],
            PIPE,
            (PIPE_FREE_ENTRY, None),
            (KP_PIPE_FREE_ENTRY, None),
            false,
        ),
        // Optional: splice, tee and vmsplice lock pipes outside read/write;
        // without these hooks those acquisitions are not seen.
        row(
            "splice entry",
            // Also io_uring's IORING_OP_SPLICE.
            &["do_splice"],
            PIPE,
            (SPLICE_ENTRY, Some(SPLICE_EXIT)),
            (KP_SPLICE_ENTRY, Some(KP_SPLICE_CALL_EXIT)),
            false,
        ),
        row(
            "tee entry",
            &["do_tee"],
            PIPE,
            (TEE_ENTRY, Some(TEE_EXIT)),
            (KP_TEE_ENTRY, Some(KP_SPLICE_CALL_EXIT)),
            false,
        ),
        row(
            "vmsplice entry",
            // The syscall wrapper: vmsplice_to_pipe/_to_user are inlined and
            // the body, `__do_sys_vmsplice`, is notrace (`static inline`).
            &["__x64_sys_vmsplice"],
            PIPE,
            (VMSPLICE_ENTRY, Some(VMSPLICE_EXIT)),
            (KP_VMSPLICE_ENTRY, Some(KP_SPLICE_CALL_EXIT)),
            false,
        ),
        row(
            "spinlock irqsave",
            &["_raw_spin_lock_irqsave"],
            WAIT,
            (SPIN_LOCK_IRQSAVE_ENTRY, Some(SPIN_LOCK_IRQSAVE_EXIT)),
            spin,
            true,
        ),
        row(
            "spinlock irqrestore",
            &["_raw_spin_unlock_irqrestore"],
            WAIT,
            (SPIN_UNLOCK_IRQRESTORE_ENTRY, None),
            unspin,
            true,
        ),
        // 6.1 also takes rd_wait.lock with spin_lock_irq around head/tail updates.
        row(
            "spinlock irq",
            &["_raw_spin_lock_irq"],
            WAIT,
            (SPIN_LOCK_IRQ_ENTRY, Some(SPIN_LOCK_IRQ_EXIT)),
            spin,
            false,
        ),
        row(
            "spinlock unlock irq",
            &["_raw_spin_unlock_irq"],
            WAIT,
            (SPIN_UNLOCK_IRQ_ENTRY, None),
            unspin,
            false,
        ),
        row(
            "lockref get caller",
            &["__legitimize_path"],
            LOCKREF,
            (LOCKREF_GET_ENTRY, Some(LOCKREF_GET_EXIT)),
            (KP_LOCKREF_GET_ENTRY, Some(KP_LOCKREF_EXIT)),
            false,
        ),
        row(
            "lockref put caller",
            &["dput"],
            LOCKREF,
            (LOCKREF_PUT_ENTRY, Some(LOCKREF_PUT_EXIT)),
            (KP_LOCKREF_PUT_ENTRY, Some(KP_LOCKREF_EXIT)),
            false,
        ),
        row(
            "spinlock",
            &["_raw_spin_lock"],
            LOCKREF,
            (DENTRY_SPIN_LOCK_ENTRY, Some(DENTRY_SPIN_LOCK_EXIT)),
            (KP_DENTRY_SPIN_LOCK_ENTRY, Some(KP_DENTRY_SPIN_LOCK_EXIT)),
            false,
        ),
        row(
            "spinlock unlock",
            &["_raw_spin_unlock"],
            LOCKREF,
            (DENTRY_SPIN_UNLOCK_ENTRY, None),
            (KP_DENTRY_SPIN_UNLOCK_ENTRY, None),
            false,
        ),
    ]
};

/// A hook the selected classes need, and the function it resolves to on
/// this kernel (None: the kernel lacks every candidate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// Its row in [`HOOKS`].
    pub index: usize,
    pub row: &'static HookRow,
    pub function: Option<&'static str>,
}

/// The hooks `classes` need, each resolved with `hookable` (whether a
/// function can be hooked in the mode at hand). Fails with a readable reason
/// when a required one cannot be.
pub fn resolve(classes: ClassSet, hookable: impl Fn(&str) -> bool) -> Result<Vec<Resolved>, String> {
    let mut resolved = Vec::new();
    for (index, row) in HOOKS.iter().enumerate() {
        if !row.classes.intersects(classes) {
            continue;
        }
        let function = row.hook.candidates.iter().copied().find(|f| hookable(f));
        if function.is_none() && row.required {
            return Err(format!(
                "no traceable {} function ({})",
                row.hook.role,
                row.hook.candidates.join(", ")
            ));
        }
        resolved.push(Resolved { index, row, function });
    }
    Ok(resolved)
}

/// Notes for the report on classes a hooked mode could not fully cover.
pub fn missing_hook_notes(resolved: &[Resolved]) -> Vec<String> {
    resolved
        .iter()
        .filter(|r| r.function.is_none())
        .map(|r| {
            format!(
                "{}: no traceable {} function ({}) on this kernel; its numbers are missing",
                r.row.classes.names(),
                r.row.hook.role,
                r.row.hook.candidates.join(", ")
            )
        })
        .collect()
}

/// Functions `pipelock probe` reports on, in the order it lists them: every
/// hook candidate, and the neighbours a kernel developer asks about.
pub const REPORTED_FUNCTIONS: &[&str] = &[
    "pipe_read",
    "pipe_write",
    "anon_pipe_read",
    "anon_pipe_write",
    "mutex_lock",
    "mutex_lock_nested",
    "mutex_unlock",
    "free_pipe_info",
    "do_splice",
    "do_tee",
    "__x64_sys_vmsplice",
    "pipe_lock",
    "pipe_double_lock",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_reports_every_function_a_hook_can_resolve_to() {
        for row in &HOOKS {
            for f in row.hook.candidates {
                assert!(REPORTED_FUNCTIONS.contains(f), "{f} is hooked but not reported");
                assert!(!is_notrace(f), "{f} cannot be hooked");
            }
        }
    }

    #[test]
    fn every_hook_has_its_do_nothing_twin_and_every_class_a_hook() {
        assert_eq!(HOOKS.len(), EMPTY_FENTRY.len());
        assert_eq!(HOOKS.len(), EMPTY_FEXIT.len());
        for class in [
            LockClass::PipeMutex,
            LockClass::PipeRdWait,
            LockClass::PipeWrWait,
            LockClass::Lockref,
        ] {
            assert!(HOOKS.iter().any(|h| h.classes.contains(class)), "{class}");
        }
    }

    /// `--class pipe-wait` alone must still hook the pipe call's first
    /// mutex_lock: that is where the programs learn the call's pipe.
    #[test]
    fn pipe_wait_alone_learns_the_pipe_from_mutex_lock() {
        let roles = |classes: ClassSet| -> Vec<&str> {
            resolve(classes, |_| true)
                .unwrap()
                .iter()
                .map(|r| r.row.hook.role)
                .collect()
        };
        let wait = roles(ClassSet::PIPE_WAIT);
        assert!(wait.contains(&"mutex lock"), "{wait:?}");
        assert!(wait.contains(&"pipe read entry") && wait.contains(&"spinlock irqsave"));
        assert!(
            !wait.contains(&"mutex unlock"),
            "pipe-wait does not time the mutex"
        );
        let mutex = roles(ClassSet::of(&[LockClass::PipeMutex]));
        assert!(!mutex.contains(&"spinlock irqsave"), "{mutex:?}");
        assert!(roles(ClassSet::of(&[LockClass::OtherInPipeCall])).is_empty());
    }

    #[test]
    fn a_missing_required_hook_is_an_error_an_optional_one_a_note() {
        let err = resolve(ClassSet::PIPE_LOCKS, |f| f != "mutex_unlock").unwrap_err();
        assert!(
            err.contains("mutex unlock") && err.contains("mutex_unlock"),
            "{err}"
        );
        let resolved = resolve(ClassSet::PIPE_WAIT, |f| f != "_raw_spin_lock_irq").unwrap();
        let notes = missing_hook_notes(&resolved);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].starts_with("pipe-rd-wait/pipe-wr-wait: no traceable spinlock irq"),
            "{notes:?}"
        );
        // The first candidate the kernel has wins.
        let read = resolve(ClassSet::PIPE_LOCKS, |f| f != "anon_pipe_read").unwrap();
        assert_eq!(read[0].function, Some("pipe_read"));
    }
}
