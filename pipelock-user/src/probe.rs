//! `pipelock probe`: what this kernel offers pipelock, and what `auto` picks.
use std::{fmt::Write as _, path::PathBuf};

use crate::{
    Error,
    attach::{AttachSupport, KernelFacts, LockClass, ModeChoice, REPORTED_FUNCTIONS, Support},
    ebpf,
    inspector::KernelInspector,
};

/// Functions the live fentry/kprobe checks attach to: always present and cheap.
const CHECK_TARGETS: &[&str] = &["mutex_unlock", "vfs_read"];

/// One reported kernel function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionRow {
    pub name: &'static str,
    pub in_kallsyms: bool,
    pub in_btf: bool,
    /// How pipelock could hook it: a mode, "notrace", or "-" when absent.
    pub hookable: String,
}

/// Everything `pipelock probe` prints, gathered before anything is printed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeReport {
    pub release: String,
    pub btf: Option<PathBuf>,
    pub tracefs: Option<PathBuf>,
    /// pipelock mounted tracefs because it was missing.
    pub mounted_tracefs: bool,
    pub kprobe_pmu: bool,
    pub contention_tracepoints: bool,
    pub support: AttachSupport,
    pub functions: Vec<FunctionRow>,
    pub classes: Vec<(LockClass, ModeChoice)>,
}

/// How the attach-type checks are done.
pub enum Checks {
    /// Load and attach test programs in the running kernel (needs privileges).
    Live,
    /// Facts come from a captured tree: take these results as given.
    Given(AttachSupport),
}

/// Gathers the report. With [`Checks::Live`] the inspector must be the live one.
pub fn gather(inspector: &KernelInspector, checks: Checks) -> Result<ProbeReport, Error> {
    let mut mounted_tracefs = false;
    if matches!(checks, Checks::Live) && inspector.tracefs().is_none() {
        mounted_tracefs = mount_tracefs();
    }
    let release = inspector.release()?;
    let kallsyms = inspector.kallsyms()?;
    let btf = inspector.has_btf().then(|| inspector.btf()).transpose()?;
    let (category, name) = pipelock_common::CONTENTION_BEGIN_TRACEPOINT;
    let contention_tracepoints =
        inspector.has_tracepoint(category, name) && inspector.has_tracepoint(category, "contention_end");

    let support = match checks {
        Checks::Given(support) => support,
        Checks::Live => {
            let in_btf = |f: &&str| btf.as_ref().is_some_and(|btf| btf.has_function(f));
            let btf_target = CHECK_TARGETS
                .iter()
                .copied()
                .find(|f| kallsyms.has_function(f) && in_btf(f));
            let kprobe_target = CHECK_TARGETS.iter().copied().find(|f| kallsyms.has_function(f));
            ebpf::check_support(inspector, btf_target, kprobe_target)?
        }
    };

    let facts = KernelFacts {
        kallsyms: &kallsyms,
        btf: btf.as_ref(),
        support: &support,
        contention_tracepoints,
    };
    let functions = REPORTED_FUNCTIONS
        .iter()
        .map(|&name| FunctionRow {
            name,
            in_kallsyms: kallsyms.has_function(name),
            in_btf: facts.in_btf(name),
            hookable: facts.hookable(name).to_string(),
        })
        .collect();
    let classes = LockClass::ALL
        .iter()
        .map(|&class| (class, facts.auto_mode(class)))
        .collect();

    Ok(ProbeReport {
        release,
        btf: inspector.has_btf().then(|| inspector.btf_path()),
        tracefs: inspector.tracefs(),
        mounted_tracefs,
        kprobe_pmu: inspector.has_kprobes(),
        contention_tracepoints,
        support,
        functions,
        classes,
    })
}

/// Mounts tracefs at /sys/kernel/tracing; false if that was not possible.
fn mount_tracefs() -> bool {
    let target = c"/sys/kernel/tracing";
    // SAFETY: valid NUL-terminated strings; a failed mount changes nothing.
    let rc = unsafe {
        libc::mount(
            c"tracefs".as_ptr(),
            target.as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        log::warn!("cannot mount tracefs: {}", std::io::Error::last_os_error());
    }
    rc == 0
}

fn yes_no(value: bool) -> &'static str {
    if value { "yes" } else { "no" }
}

/// The report as text: a pure function of the report, so tests can read it.
pub fn render(report: &ProbeReport) -> String {
    let mut out = String::new();
    let path_or = |path: &Option<PathBuf>, missing: &str| {
        path.as_ref()
            .map_or_else(|| missing.to_owned(), |p| format!("yes ({})", p.display()))
    };
    let _ = writeln!(out, "kernel       {}", report.release);
    let _ = writeln!(
        out,
        "BTF          {}",
        path_or(&report.btf, "no: fentry and tp_btf need /sys/kernel/btf/vmlinux")
    );
    let mut tracefs = path_or(&report.tracefs, "no: not mounted");
    if report.mounted_tracefs {
        tracefs.push_str(", mounted by pipelock");
    }
    let _ = writeln!(out, "tracefs      {tracefs}");
    let _ = writeln!(
        out,
        "lock:contention_begin/end tracepoints  {}",
        yes_no(report.contention_tracepoints)
    );
    let _ = writeln!(out, "kprobe PMU   {}", yes_no(report.kprobe_pmu));

    let _ = writeln!(out, "\nprogram types (a test program loaded and attached)");
    let support: [(&str, &Support); 4] = [
        ("tracepoint", &report.support.tracepoint),
        ("tp_btf", &report.support.tp_btf),
        ("fentry", &report.support.fentry),
        ("kprobe", &report.support.kprobe),
    ];
    for (name, support) in support {
        let _ = writeln!(out, "  {name:<11} {support}");
    }

    let _ = writeln!(out, "\nfunctions                      kallsyms  BTF  hook with");
    for row in &report.functions {
        let _ = writeln!(
            out,
            "  {:<28} {:<9} {:<4} {}",
            row.name,
            yes_no(row.in_kallsyms),
            yes_no(row.in_btf),
            row.hookable
        );
    }

    let _ = writeln!(out, "\n--mode auto picks");
    for (class, choice) in &report.classes {
        let _ = writeln!(out, "  {:<11} {choice}", class.name());
    }
    out
}
