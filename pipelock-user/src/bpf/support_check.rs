//! The live checks of which program types this kernel accepts: a tiny
//! program of each type is loaded and attached, then detached.
use aya::{
    Btf,
    programs::{BtfTracePoint, FEntry, KProbe, ProgramError, TracePoint},
};
use pipelock_common::{CONTENTION_BEGIN_TRACEPOINT, programs};

use super::object::{load, program_mut};
use crate::{
    Error,
    error::one_line,
    kernel::{AttachSupport, KernelInspector, Support},
};

/// `target` names what the program was attached to, so a refusal says where.
fn outcome(target: &str, result: Result<(), ProgramError>) -> Support {
    match result {
        Ok(()) => Support::Works,
        Err(err) => Support::Refused(format!("{target}: {}", one_line(&err))),
    }
}

/// Loads and attaches one test program of each type, then detaches them all.
///
/// `btf_target` (in BTF and kallsyms) and `kprobe_target` (in kallsyms) are
/// the functions the fentry and kprobe test programs attach to.
pub fn check_support(
    inspector: &KernelInspector,
    btf_target: Option<&str>,
    kprobe_target: Option<&str>,
) -> Result<AttachSupport, Error> {
    let (mut ebpf, _) = load(None, false)?;
    let kernel_btf = if inspector.has_btf() {
        Some(Btf::from_sys_fs().map_err(|err| Support::Refused(one_line(&err))))
    } else {
        None
    };
    let no_btf = || Support::NotTested("no kernel BTF".to_owned());
    let (category, name) = CONTENTION_BEGIN_TRACEPOINT;

    let tracepoint = if inspector.has_tracepoint(category, name) {
        let prog: &mut TracePoint = program_mut(&mut ebpf, programs::CONTENTION_BEGIN_COUNT_TP)?;
        let result = prog.load().and_then(|()| prog.attach(category, name).map(drop));
        outcome(&format!("{category}:{name}"), result)
    } else {
        Support::NotTested(format!("tracefs has no {category}:{name}"))
    };

    let tp_btf = match &kernel_btf {
        Some(Ok(btf)) => {
            let prog: &mut BtfTracePoint = program_mut(&mut ebpf, programs::CONTENTION_BEGIN_COUNT_BTF)?;
            outcome(name, prog.load(name, btf).and_then(|()| prog.attach().map(drop)))
        }
        Some(Err(refused)) => refused.clone(),
        None => no_btf(),
    };

    let fentry = match (&kernel_btf, btf_target) {
        (Some(Ok(btf)), Some(target)) => {
            let prog: &mut FEntry = program_mut(&mut ebpf, programs::PROBE_FENTRY)?;
            outcome(
                target,
                prog.load(target, btf).and_then(|()| prog.attach().map(drop)),
            )
        }
        (Some(Err(refused)), _) => refused.clone(),
        (Some(Ok(_)), None) => Support::NotTested("no target function in BTF".to_owned()),
        (None, _) => no_btf(),
    };

    let kprobe = match kprobe_target {
        _ if !inspector.has_kprobes() => {
            Support::Refused("no kprobe PMU (kernel built without CONFIG_KPROBES)".to_owned())
        }
        Some(target) => {
            let prog: &mut KProbe = program_mut(&mut ebpf, programs::PROBE_KPROBE)?;
            outcome(
                target,
                prog.load().and_then(|()| prog.attach(target, 0).map(drop)),
            )
        }
        None => Support::NotTested("no target function in kallsyms".to_owned()),
    };

    // Dropping `ebpf` detaches and unloads every program loaded above.
    drop(ebpf);
    Ok(AttachSupport {
        fentry,
        kprobe,
        tracepoint,
        tp_btf,
    })
}
