//! `pipelock probe`: what this kernel offers pipelock, and what `--mode auto`
//! picks, decided from the same hook table `trace` and `top` attach.
use std::{
    fmt::Write as _,
    fs, io,
    path::{Path, PathBuf},
};

use crate::{
    Error,
    bpf::{
        AttachMode,
        hooks::REPORTED_FUNCTIONS,
        plan::{Coverage, KernelFacts, ModeChoice},
        selftest, support_check,
    },
    cli::ProbeArgs,
    kernel::{AttachSupport, KernelInspector, Support, privilege},
    model::{ClassSet, LockClass},
};

/// What `auto` picks for one set of classes, and what each class gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pick {
    /// How a user asks for the set.
    pub asked: &'static str,
    pub choice: ModeChoice,
    pub classes: Vec<(LockClass, Option<Coverage>)>,
}

/// The class sets `probe` predicts for: what `trace` records by default,
/// and the opt-in lockref class.
const PICKS: [(&str, ClassSet); 2] = [
    ("default classes", ClassSet::DEFAULT),
    ("--class lockref", ClassSet::of(&[LockClass::Lockref])),
];

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
    /// The kernel has the `bpf_rdonly_cast` kfunc (6.2+): the programs
    /// read kernel objects with plain loads instead of probe reads.
    pub rdonly_cast: bool,
    pub support: AttachSupport,
    pub functions: Vec<FunctionRow>,
    pub picks: Vec<Pick>,
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
            support_check::check_support(inspector, btf_target, kprobe_target)?
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
    let picks = PICKS
        .iter()
        .map(|&(asked, classes)| {
            let choice = facts.auto_mode(classes);
            Pick {
                asked,
                classes: classes
                    .iter()
                    .map(|class| {
                        // Where only the tracepoints attach, say what they miss.
                        let mode = match choice {
                            ModeChoice::NeedsHooks => Some(AttachMode::Tracepoint),
                            _ => choice.mode(),
                        };
                        (class, mode.map(|mode| Coverage::of(class, mode)))
                    })
                    .collect(),
                choice,
            }
        })
        .collect();

    Ok(ProbeReport {
        release,
        btf: inspector.has_btf().then(|| inspector.btf_path()),
        tracefs: inspector.tracefs(),
        mounted_tracefs,
        kprobe_pmu: inspector.has_kprobes(),
        contention_tracepoints,
        rdonly_cast: btf.as_ref().is_some_and(|btf| btf.rdonly_cast_id().is_some()),
        support,
        functions,
        picks,
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
        log::warn!("cannot mount tracefs: {}", io::Error::last_os_error());
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
    let _ = writeln!(
        out,
        "bpf_rdonly_cast  {}",
        if report.rdonly_cast {
            "yes: the fd-to-pipe walk and mutex owners are read with plain loads"
        } else {
            "no (a kfunc since 6.2): the fd-to-pipe walk and mutex owners take probe reads (~50 ns each)"
        }
    );

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

    let _ = writeln!(out, "\n--mode auto picks (trace and top attach the same hooks)");
    for pick in &report.picks {
        let _ = writeln!(out, "  {:<22} {}", pick.asked, pick.choice);
        for (class, coverage) in &pick.classes {
            let what = coverage.map_or_else(|| "n/a".to_owned(), |c| c.to_string());
            let _ = writeln!(out, "    {:<20} {what}", class.name());
        }
    }
    out
}

pub fn run(args: &ProbeArgs, ebpf_log: bool) -> Result<(), Error> {
    if let Some(dir) = &args.kernel_facts {
        let inspector = KernelInspector::at(dir);
        let given = inspector.recorded_support()?.unwrap_or_else(|| {
            let not_tested = || Support::NotTested(format!("no checks recorded in {}", dir.display()));
            AttachSupport {
                fentry: not_tested(),
                kprobe: not_tested(),
                tracepoint: not_tested(),
                tp_btf: not_tested(),
            }
        });
        let report = gather(&inspector, Checks::Given(given))?;
        print!("{}", render(&report));
        return Ok(());
    }
    privilege::require()?;
    let inspector = KernelInspector::live();
    let report = gather(&inspector, Checks::Live)?;
    print!("{}", render(&report));
    if let Some(dest) = &args.save_facts {
        save_facts(&inspector, &report.support, dest)?;
        println!("\nkernel facts saved to {}", dest.display());
    }
    if args.self_test {
        println!();
        print!("{}", selftest::run(args.duration, ebpf_log)?.render());
    }
    Ok(())
}

/// Captures into a sibling temporary directory first, so an interrupted or
/// failed capture never leaves a half-written DIR behind.
fn save_facts(inspector: &KernelInspector, support: &AttachSupport, dest: &Path) -> Result<(), Error> {
    if dest.exists() {
        return Err(Error::Io {
            what: "saving kernel facts",
            source: io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} already exists", dest.display()),
            ),
        });
    }
    let mut staging = dest.as_os_str().to_owned();
    staging.push(format!(".partial-{}", std::process::id()));
    let staging = PathBuf::from(staging);
    let result = inspector.capture(&staging, Some(support)).and_then(|()| {
        fs::rename(&staging, dest).map_err(|source| Error::Io {
            what: "renaming the captured facts",
            source,
        })
    });
    if result.is_err() {
        let _ = fs::remove_dir_all(&staging);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::hooks;

    /// What probe predicts for a fixture kernel is, function for function,
    /// what `trace --mode fentry` resolves and attaches there.
    #[test]
    fn probe_predicts_the_functions_trace_attaches() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kernels");
        for kernel in ["debian-6.1.0-57", "debian-6.12.117", "debian-6.18.15"] {
            let inspector = KernelInspector::at(fixtures.join(kernel));
            let support = inspector.recorded_support().unwrap().unwrap();
            let report = gather(&inspector, Checks::Given(support)).unwrap();
            let (kallsyms, btf) = (inspector.kallsyms().unwrap(), inspector.btf().unwrap());
            for (pick, (_, classes)) in report.picks.iter().zip(PICKS) {
                // The predicate `bpf::attach::fentry` resolves with.
                let attached: Vec<&str> =
                    hooks::resolve(classes, |f| kallsyms.has_function(f) && btf.has_function(f))
                        .unwrap()
                        .iter()
                        .filter_map(|r| r.function)
                        .collect();
                assert_eq!(
                    pick.choice,
                    ModeChoice::Hooks {
                        mode: AttachMode::Fentry,
                        functions: attached
                    },
                    "{kernel} {}",
                    pick.asked
                );
            }
            let text = render(&report);
            assert!(
                text.contains("    pipe-rd-wait         wait + hold"),
                "{kernel}: {text}"
            );
            assert!(
                text.contains("    other-in-pipe-call   n/a: only the tracepoint mode"),
                "{kernel}: {text}"
            );
        }
    }
}
