//! Attaching the programs of one mode: the hook table's fentry/fexit or
//! kprobe/kretprobe programs on the functions they resolve to here, or the
//! contention tracepoints.
use std::{collections::HashSet, os::fd::AsFd, path::PathBuf};

use aya::{
    Btf, Ebpf,
    programs::{BtfTracePoint, FEntry, FExit, KProbe, TracePoint},
};
use pipelock_common::{maps, programs};

use super::{
    config::Filters,
    hooks::{self, HookRow, Resolved},
    object::program_mut,
    plan::TracepointKind,
    retprobe::{self, Retprobe},
};
use crate::{
    Error,
    error::one_line,
    kernel::{KernelBtf, KernelInspector},
    model::ClassSet,
};

/// What runs on the hooks of a hooked mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookBodies {
    /// pipelock's programs.
    Pipelock,
    /// Programs that return at once: `pipelock overhead` measures with them
    /// what the trampolines or kprobes alone cost, the floor under pipelock.
    Empty,
}

/// The contention tracepoints of the hooked modes: which acquisitions were
/// contended, and when a contended pipe mutex acquisition ends.
const CONTENTION_MARKERS: [(&str, &str); 2] = [
    (programs::HOOKED_CONTENTION_BEGIN, "contention_begin"),
    (programs::HOOKED_CONTENTION_END, "contention_end"),
];

fn fail(action: &'static str, program: &str) -> impl FnOnce(aya::programs::ProgramError) -> Error + use<> {
    let program = program.to_owned();
    move |source| Error::Program {
        action,
        program,
        source,
    }
}

/// Attaches every fentry/fexit hook the classes need to the function it
/// resolves to here (kallsyms + BTF), and the contention markers. Returns
/// notes on optional hooks this kernel lacks.
pub fn fentry(
    ebpf: &mut Ebpf,
    inspector: &KernelInspector,
    kernel_btf: &KernelBtf,
    classes: ClassSet,
    bodies: HookBodies,
) -> Result<Vec<String>, Error> {
    let kallsyms = inspector.kallsyms()?;
    let btf = Btf::from_sys_fs().map_err(|source| Error::Load {
        source: source.into(),
    })?;
    let resolved = hooks::resolve(classes, |f| {
        kallsyms.has_function(f) && kernel_btf.has_function(f)
    })
    .map_err(|reason| Error::Unsupported { reason })?;
    let mut notes = hooks::missing_hook_notes(&resolved);
    for &Resolved { index, row, function } in &resolved {
        let Some(target) = function else { continue };
        let (entry, exit) = match bodies {
            HookBodies::Pipelock => row.fentry,
            HookBodies::Empty => (
                programs::EMPTY_FENTRY[index],
                row.fentry.1.map(|_| programs::EMPTY_FEXIT[index]),
            ),
        };
        // The exit first: an entry whose exit failed to attach would leave
        // its thread marked as inside the call.
        let attached = (|| -> Result<(), Error> {
            if let Some(exit) = exit {
                let prog: &mut FExit = program_mut(ebpf, exit)?;
                prog.load(target, &btf).map_err(fail("load", exit))?;
                prog.attach().map_err(fail("attach", exit))?;
            }
            let prog: &mut FEntry = program_mut(ebpf, entry)?;
            prog.load(target, &btf).map_err(fail("load", entry))?;
            prog.attach().map_err(fail("attach", entry))?;
            Ok(())
        })();
        optional_refusal(row, target, attached, &mut notes)?;
    }
    if classes.intersects(ClassSet::PIPE_LOCKS) && bodies == HookBodies::Pipelock {
        for (program, tracepoint) in CONTENTION_MARKERS {
            let prog: &mut BtfTracePoint = program_mut(ebpf, program)?;
            prog.load(tracepoint, &btf).map_err(fail("load", program))?;
            prog.attach().map_err(fail("attach", program))?;
        }
    }
    Ok(notes)
}

/// An optional hook the kernel refuses (a function in kallsyms and BTF can
/// still be notrace) costs its note, not the trace; a required one is an error.
fn optional_refusal(
    row: &HookRow,
    target: &str,
    attached: Result<(), Error>,
    notes: &mut Vec<String>,
) -> Result<(), Error> {
    match attached {
        Err(err) if !row.required => {
            notes.push(format!(
                "{}: {target} ({}) could not be hooked, its acquisitions are missing: {}",
                row.classes.names(),
                row.hook.role,
                one_line(&err)
            ));
            Ok(())
        }
        other => other,
    }
}

/// The kprobe mode's attached hooks: the return probes made in tracefs
/// (see `retprobe`) live as long as this does; aya's links live with the
/// programs.
#[derive(Default)]
pub struct Kprobes {
    pub returns: Vec<Retprobe>,
    /// Where the return probes were made, to read their miss counts.
    pub tracefs: Option<PathBuf>,
}

impl Kprobes {
    /// Hits the return probes did not run for (out of instances, or nested
    /// in another kprobe's handler).
    pub fn missed(&self) -> u64 {
        let Some(tracefs) = self.tracefs.as_ref().filter(|_| !self.returns.is_empty()) else {
            return 0;
        };
        let profile = std::fs::read_to_string(tracefs.join("kprobe_profile")).unwrap_or_default();
        self.returns
            .iter()
            .filter_map(|probe| probe.missed(&profile))
            .sum()
    }
}

/// The fentry hooks' logic on kprobes/kretprobes; the notes are for the
/// report.
pub fn kprobe(
    ebpf: &mut Ebpf,
    inspector: &KernelInspector,
    classes: ClassSet,
    bodies: HookBodies,
) -> Result<(Kprobes, Vec<String>), Error> {
    if !inspector.has_kprobes() {
        return Err(Error::Unsupported {
            reason: "no kprobe PMU (kernel built without CONFIG_KPROBES)".to_owned(),
        });
    }
    let kallsyms = inspector.kallsyms()?;
    let resolved = hooks::resolve(classes, |f| kallsyms.has_function(f))
        .map_err(|reason| Error::Unsupported { reason })?;
    let mut notes = hooks::missing_hook_notes(&resolved);
    let mut hooked = Kprobes {
        tracefs: inspector
            .tracefs()
            .filter(|dir| dir.join("kprobe_events").is_file()),
        ..Kprobes::default()
    };
    match &hooked.tracefs {
        Some(tracefs) => retprobe::remove_stale(tracefs),
        None => notes.push(
            "no tracefs kprobe_events: return probes have the kernel's default instances (max(10, 2 × CPUs)); \
             a pipe call's return beyond that many threads asleep in it is not seen (its thread's next \
             locks of that pipe count as the call's), and such misses are not counted (mount tracefs at /sys/kernel/tracing)"
                .to_owned()
        ),
    }
    let mut loaded = HashSet::new();
    // Return probes tracefs refused, attached with the default instances.
    let mut refused = Vec::new();
    for &Resolved { row, function, .. } in &resolved {
        let Some(target) = function else { continue };
        let (entry, exit) = match bodies {
            HookBodies::Pipelock => row.kprobe,
            HookBodies::Empty => (
                programs::EMPTY_KPROBE,
                row.kprobe.1.map(|_| programs::EMPTY_KRETPROBE),
            ),
        };
        // The exit first, as in `fentry`.
        let attached = exit
            .into_iter()
            .map(|program| (program, true))
            .chain(std::iter::once((entry, false)))
            .try_for_each(|(program, is_return)| {
                let prog: &mut KProbe = program_mut(ebpf, program)?;
                if loaded.insert(program) {
                    prog.load().map_err(fail("load", program))?;
                }
                if let (Some(tracefs), true) = (&hooked.tracefs, is_return) {
                    let fd = prog.fd().map_err(fail("attach", program))?;
                    match Retprobe::attach(tracefs, fd.as_fd(), target, retprobe::MAX_ACTIVE) {
                        Ok(probe) => {
                            hooked.returns.push(probe);
                            return Ok(());
                        }
                        // What worked before tracefs was asked still does.
                        Err(why) => refused.push(format!("{target} ({why})")),
                    }
                }
                prog.attach(target, 0).map_err(fail("attach", program)).map(drop)
            });
        optional_refusal(row, target, attached, &mut notes)?;
    }
    if !refused.is_empty() {
        notes.push(format!(
            "return probes with the kernel's default instances, tracefs refused ones of {}: {}; returns \
             beyond that many threads asleep in the function are not seen, and kretprobe_missed does not \
             count them",
            retprobe::MAX_ACTIVE,
            refused.join(", ")
        ));
    }
    // Best effort: without it, contended acquisitions are not flagged.
    if classes.intersects(ClassSet::PIPE_LOCKS) && bodies == HookBodies::Pipelock {
        let attached = Btf::from_sys_fs().map_err(|e| one_line(&e)).and_then(|btf| {
            CONTENTION_MARKERS.iter().try_for_each(|(program, tracepoint)| {
                let prog: &mut BtfTracePoint = program_mut(ebpf, program).map_err(|e| one_line(&e))?;
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
    Ok((hooked, notes))
}

/// Fills `TASK_FILTER` and attaches the programs that keep it: a child
/// forked by a followed process is followed, an exited process is
/// forgotten (its pid may be handed out again). Returns notes for the report.
pub fn task_filter(ebpf: &mut Ebpf, filters: &Filters) -> Result<Vec<String>, Error> {
    let map = ebpf.map_mut(maps::TASK_FILTER).ok_or_else(|| Error::Missing {
        kind: "map",
        name: maps::TASK_FILTER.to_owned(),
    })?;
    let mut marks: aya::maps::HashMap<_, u32, u32> =
        aya::maps::HashMap::try_from(map).map_err(|source| Error::Map {
            map: maps::TASK_FILTER.to_owned(),
            source,
        })?;
    for (id, mark) in filters.task_filter_entries() {
        marks.insert(id, mark, 0).map_err(|source| Error::Map {
            map: maps::TASK_FILTER.to_owned(),
            source,
        })?;
    }
    let attached = Btf::from_sys_fs().map_err(|e| one_line(&e)).and_then(|btf| {
        [
            (programs::FOLLOW_FORK, "sched_process_fork"),
            (programs::FOLLOW_EXIT, "sched_process_exit"),
        ]
        .iter()
        .try_for_each(|(program, tracepoint)| {
            let prog: &mut BtfTracePoint = program_mut(ebpf, program).map_err(|e| one_line(&e))?;
            prog.load(tracepoint, &btf)
                .and_then(|()| prog.attach().map(drop))
                .map_err(|e| one_line(&e))
        })
    });
    match attached {
        Ok(()) => Ok(Vec::new()),
        Err(why) if filters.follow_children => Err(Error::Unsupported {
            reason: format!(
                "cannot follow COMMAND's processes ({why}); trace system-wide with -a, or name them with -p"
            ),
        }),
        Err(why) => Ok(vec![format!(
            "an exited -p process is not forgotten ({why}): a new process given its pid would be traced"
        )]),
    }
}

/// The scheduler programs that keep a waited-for owner's state (on a CPU,
/// runnable, sleeping); tp_btf only.
pub fn holder_programs(ebpf: &mut Ebpf) -> Result<(), String> {
    let btf = Btf::from_sys_fs().map_err(|e| one_line(&e))?;
    for (program, event) in [
        (programs::HOLDER_SWITCH, "sched_switch"),
        (programs::HOLDER_WAKING, "sched_waking"),
    ] {
        let prog: &mut BtfTracePoint = program_mut(ebpf, program).map_err(|e| one_line(&e))?;
        prog.load(event, &btf).map_err(|e| one_line(&e))?;
        prog.attach().map_err(|e| one_line(&e))?;
    }
    Ok(())
}

/// tp_btf first (typed arguments, cheaper), the classic tracepoint otherwise.
/// The empty programs are tp_btf only: their floor is measured under the
/// programs pipelock itself prefers.
pub fn contention_tracepoints(ebpf: &mut Ebpf, bodies: HookBodies) -> Result<TracepointKind, Error> {
    let tp_btf_programs = match bodies {
        HookBodies::Pipelock => [
            programs::PIPE_CONTENTION_BEGIN_BTF,
            programs::PIPE_CONTENTION_END_BTF,
        ],
        HookBodies::Empty => [programs::EMPTY_CONTENTION_BEGIN, programs::EMPTY_CONTENTION_END],
    };
    let tp_btf = Btf::from_sys_fs().map_err(|e| one_line(&e)).and_then(|btf| {
        for (program, event) in tp_btf_programs
            .into_iter()
            .zip(["contention_begin", "contention_end"])
        {
            let prog: &mut BtfTracePoint = program_mut(ebpf, program).map_err(|e| one_line(&e))?;
            prog.load(event, &btf).map_err(|e| one_line(&e))?;
            prog.attach().map_err(|e| one_line(&e))?;
        }
        Ok(())
    });
    let Err(why) = tp_btf else {
        return Ok(TracepointKind::TpBtf);
    };
    if bodies == HookBodies::Empty {
        return Err(Error::Unsupported {
            reason: format!("--empty-programs in tracepoint mode needs tp_btf programs: {why}"),
        });
    }
    log::info!("tp_btf unavailable ({why}); using the classic tracepoints");
    for (program, event) in [
        (programs::PIPE_CONTENTION_BEGIN_TP, "contention_begin"),
        (programs::PIPE_CONTENTION_END_TP, "contention_end"),
    ] {
        let prog: &mut TracePoint = program_mut(ebpf, program)?;
        prog.load().map_err(fail("load", program))?;
        prog.attach("lock", event).map_err(fail("attach", program))?;
    }
    Ok(TracepointKind::Classic)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::hooks::HOOKS;

    #[test]
    fn a_refused_optional_hook_is_a_note_a_required_one_an_error() {
        let splice = HOOKS.iter().find(|r| r.hook.role == "splice entry").unwrap();
        let mutex = HOOKS.iter().find(|r| r.hook.role == "mutex lock").unwrap();
        let refused = || {
            Err(Error::Unsupported {
                reason: "EBUSY".to_owned(),
            })
        };
        let mut notes = Vec::new();
        optional_refusal(splice, "do_splice", refused(), &mut notes).unwrap();
        assert_eq!(notes.len(), 1);
        assert!(
            notes[0].contains("do_splice") && notes[0].contains("EBUSY"),
            "{notes:?}"
        );
        assert!(optional_refusal(mutex, "mutex_lock", refused(), &mut notes).is_err());
        assert!(optional_refusal(splice, "do_splice", Ok(()), &mut notes).is_ok());
        assert_eq!(notes.len(), 1);
    }
}
