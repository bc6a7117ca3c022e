//! What the kernel's skipped runs of pipelock's programs can cost a count.
//!
//! A BPF program that fires while the same program is under way on that
//! CPU is not run, and its `recursion_misses` counts it (a fentry program
//! preempted mid-run makes its CPU skip it until its task runs again). A
//! skipped run can lose one event, but only of the locks whose path that
//! program is on: a class's count can fall short by no more than the
//! skipped runs of its own path's programs, and the others' skips say
//! nothing about it.
use crate::{LockClass, ProgramStats};

/// The pipe calls whose entry and exit name the pipe a lock belongs to.
const PIPE_CALLS: [&str; 5] = ["pipe_read_", "pipe_write_", "splice_", "tee_", "vmsplice_"];

/// Whether a skipped run of `program` (its name in fentry, kprobe `kp_…`
/// or tracepoint mode) can lose an event of `class`: the pipe call that
/// names the pipe (its entry, and its exit, which closes the call), the
/// lock's own hooks, and the contention tracepoints.
pub fn on_path(class: LockClass, program: &str) -> bool {
    let name = program.strip_prefix("kp_").unwrap_or(program);
    let pipe_call = PIPE_CALLS.iter().any(|call| name.starts_with(call));
    let contention = name.starts_with("hooked_contention_") || name.starts_with("pipe_contention_");
    let own = match class {
        LockClass::PipeMutex => name.starts_with("mutex_"),
        LockClass::PipeRdWait | LockClass::PipeWrWait => name.starts_with("spin_"),
        LockClass::OtherInPipeCall => false,
        LockClass::Lockref => return name.starts_with("lockref_") || name.starts_with("dentry_spin_"),
    };
    pipe_call || contention || own
}

/// Whether `program` is a pipe call's entry (fentry or kprobe): a skipped
/// run of it leaves that whole call untraced, every lock it takes, not one.
pub fn is_pipe_call_entry(program: &str) -> bool {
    let name = program.strip_prefix("kp_").unwrap_or(program);
    PIPE_CALLS
        .iter()
        .any(|call| name.strip_prefix(call) == Some("entry"))
}

/// The programs on `class`'s path that the kernel skipped, and how often.
pub fn skipped_on_path(programs: &[ProgramStats], class: LockClass) -> Vec<(&str, u64)> {
    programs
        .iter()
        .filter(|p| p.recursion_misses > 0 && on_path(class, &p.name))
        .map(|p| (p.name.as_str(), p.recursion_misses))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_program_is_on_the_paths_whose_events_it_sees() {
        use LockClass::*;
        for (program, mutex, spin, lockref) in [
            ("mutex_lock_entry", true, false, false),
            ("kp_mutex_unlock_entry", true, false, false),
            ("hooked_contention_end", true, true, false),
            ("pipe_contention_begin_btf", true, true, false),
            ("kp_pipe_read_entry", true, true, false),
            ("kp_splice_call_exit", true, true, false),
            ("spin_unlock_irqrestore_entry", false, true, false),
            ("kp_spin_lock_exit", false, true, false),
            ("holder_switch", false, false, false),
            ("follow_fork", false, false, false),
            ("dentry_spin_lock_entry", false, false, true),
            ("kp_lockref_get_entry", false, false, true),
            ("pipe_free_entry", false, false, false),
        ] {
            assert_eq!(
                (
                    on_path(PipeMutex, program),
                    on_path(PipeRdWait, program) && on_path(PipeWrWait, program),
                    on_path(Lockref, program)
                ),
                (mutex, spin, lockref),
                "{program}"
            );
        }
        assert!(on_path(OtherInPipeCall, "pipe_write_exit") && !on_path(OtherInPipeCall, "mutex_lock_entry"));
        assert!(is_pipe_call_entry("kp_tee_entry") && !is_pipe_call_entry("pipe_read_exit"));
    }

    #[test]
    fn only_the_paths_own_skips_count() {
        let program = |name: &str, misses: u64| ProgramStats {
            name: name.to_owned(),
            run_count: 10,
            run_time_ns: 1,
            recursion_misses: misses,
        };
        let programs = [
            program("mutex_lock_entry", 5),
            program("spin_lock_irq_exit", 400),
            program("pipe_read_entry", 0),
        ];
        assert_eq!(
            skipped_on_path(&programs, LockClass::PipeMutex),
            vec![("mutex_lock_entry", 5)]
        );
        assert_eq!(
            skipped_on_path(&programs, LockClass::PipeRdWait),
            vec![("spin_lock_irq_exit", 400)]
        );
    }
}
