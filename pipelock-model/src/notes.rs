//! Notes a report adds from what happened while it traced, beside the
//! ones fixed when attaching (what a mode or kernel cannot measure).
use super::ProgramStats;

/// The runs of pipelock's programs the kernel skipped, if any: how many,
/// each program that lost some (most first), and where fentry programs can be preempted
/// (`full` or `lazy` preemption) why and what avoids it. A trampoline only
/// disables migration, so a run preempted before it ends (with
/// `bpf_preempt_disable`, at the end of its body, where a preemption owed
/// meanwhile happens) makes every run of that program on that CPU skip
/// until its task runs again; kprobes and tracepoints run with preemption
/// off.
pub fn skipped_runs(programs: &[ProgramStats], fentry: bool, preemption: Option<&str>) -> Option<String> {
    let total: u64 = programs.iter().map(|p| p.recursion_misses).sum();
    if total == 0 {
        return None;
    }
    let mut skipping: Vec<&ProgramStats> = programs.iter().filter(|p| p.recursion_misses > 0).collect();
    skipping.sort_by_key(|p| std::cmp::Reverse(p.recursion_misses));
    // Runs are counted only while run-time statistics are on.
    let each: Vec<String> = skipping
        .iter()
        .map(|p| {
            let of = p.run_count + p.recursion_misses;
            if p.run_count > 0 {
                format!(
                    "{} {} of {of} ({:.1} %)",
                    p.name,
                    p.recursion_misses,
                    p.recursion_misses as f64 * 100.0 / of as f64
                )
            } else {
                format!("{} {}", p.name, p.recursion_misses)
            }
        })
        .collect();
    let mut note = format!(
        "the kernel skipped {total} runs of pipelock's programs (recursion_misses: {}); each can lose an event",
        each.join(", ")
    );
    if let Some(model) = preemption.filter(|m| fentry && !runs_unpreempted(Some(m))) {
        note.push_str(&format!(
            "; this kernel's preemption is {model}, and a fentry program preempted mid-run skips every run of it on that CPU until its task runs again: --mode kprobe runs with preemption off"
        ));
    }
    Some(note)
}

/// Whether kernel code runs unpreempted under `model` (`none`,
/// `voluntary`): then a fentry program, which only has migration disabled,
/// still runs to its end once started. An unknown model (no debugfs, a
/// kernel without dynamic preemption) counts as preemptible.
pub fn runs_unpreempted(model: Option<&str>) -> bool {
    matches!(model, Some("none" | "voluntary"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_none_and_voluntary_leave_kernel_code_unpreempted() {
        assert!(runs_unpreempted(Some("voluntary")));
        assert!(runs_unpreempted(Some("none")));
        for model in [Some("full"), Some("lazy"), None] {
            assert!(!runs_unpreempted(model), "{model:?}");
        }
    }

    fn program(name: &str, runs: u64, misses: u64) -> ProgramStats {
        ProgramStats {
            name: name.into(),
            run_count: runs,
            run_time_ns: 0,
            recursion_misses: misses,
        }
    }

    #[test]
    fn no_skipped_run_no_note() {
        assert_eq!(skipped_runs(&[program("a", 10, 0)], true, Some("lazy")), None);
        assert_eq!(skipped_runs(&[], true, Some("lazy")), None);
    }

    #[test]
    fn skipped_runs_name_the_worst_program_and_under_preemption_the_cause() {
        let programs = [
            program("pipe_read_exit", 29_222, 880),
            program("mutex_lock_entry", 49_095, 1784),
        ];
        let lazy = skipped_runs(&programs, true, Some("lazy")).unwrap();
        assert!(
            lazy.starts_with(
                "the kernel skipped 2664 runs of pipelock's programs (recursion_misses: mutex_lock_entry 1784 of \
                 50879 (3.5 %), pipe_read_exit 880 of 30102 (2.9 %))"
            )
                && lazy.contains("preemption is lazy")
                && lazy.contains("--mode kprobe"),
            "{lazy}"
        );
        // kprobes, or a kernel that does not preempt kernel code: no cause to name.
        for (fentry, model) in [(false, Some("lazy")), (true, Some("voluntary")), (true, None)] {
            let note = skipped_runs(&programs, fentry, model).unwrap();
            assert!(!note.contains("preemption"), "{note}");
        }
        let without_stats = skipped_runs(&[program("x", 0, 3)], true, None).unwrap();
        assert!(
            without_stats.contains("recursion_misses: x 3)"),
            "{without_stats}"
        );
    }
}
