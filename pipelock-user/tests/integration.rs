//! pipelock's integration tests: the built binary against the kernel it runs on.
//!
//! They run on the host (`cargo xtask test`) and are meant to run unchanged
//! inside the VM kernels. A test that cannot run here (not root, a stub build)
//! is reported as skipped with its reason, and counted as skipped, never passed.
use std::{
    fs,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use anyhow::{Context as _, Result, bail, ensure};
use pipelock_common::{maps, programs};

enum Outcome {
    Passed,
    Skipped(String),
}

/// Where a test means something: `Kernel` tests exercise the running kernel and
/// also run inside the VMs; `Build` tests check the binary and its fixtures,
/// which are the same everywhere, so the VMs leave them out.
#[derive(PartialEq)]
enum Scope {
    Kernel,
    Build,
}

type Test = (&'static str, Scope, fn() -> Result<Outcome>);

const TESTS: &[Test] = &[
    ("ebpf_object_is_complete", Scope::Build, ebpf_object_is_complete),
    (
        "unknown_subcommand_exits_2",
        Scope::Build,
        unknown_subcommand_exits_2,
    ),
    ("bad_duration_exits_2", Scope::Build, bad_duration_exits_2),
    (
        "fixture_kernels_report_their_facts",
        Scope::Build,
        fixture_kernels_report_their_facts,
    ),
    (
        "unprivileged_caller_is_refused",
        Scope::Kernel,
        unprivileged_caller_is_refused,
    ),
    (
        "probe_agrees_with_the_running_kernel",
        Scope::Kernel,
        probe_agrees_with_the_running_kernel,
    ),
    (
        "expected_program_types_load_and_attach",
        Scope::Kernel,
        expected_program_types_load_and_attach,
    ),
    (
        "self_test_counts_real_contention",
        Scope::Kernel,
        self_test_counts_real_contention,
    ),
    (
        "saved_facts_reproduce_the_live_report",
        Scope::Kernel,
        saved_facts_reproduce_the_live_report,
    ),
];

/// Set by the VM's init (`cargo xtask vm-test`).
fn in_vm() -> bool {
    std::env::var_os("PIPELOCK_IN_VM").is_some()
}

fn main() {
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for (name, scope, test) in TESTS {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        if in_vm() && *scope == Scope::Build {
            continue;
        }
        match test() {
            Ok(Outcome::Passed) => {
                passed += 1;
                println!("test {name} ... ok");
            }
            Ok(Outcome::Skipped(why)) => {
                skipped += 1;
                println!("test {name} ... skipped: {why}");
            }
            Err(err) => {
                failed += 1;
                println!("test {name} ... FAILED: {err:#}");
            }
        }
    }
    println!("integration: {passed} passed, {failed} failed, {skipped} skipped");
    if failed > 0 {
        std::process::exit(1);
    }
}

/// The binary under test; the VM's init points PIPELOCK_BIN at its copy.
fn pipelock() -> Command {
    Command::new(std::env::var_os("PIPELOCK_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_pipelock").into()))
}

fn run(cmd: &mut Command) -> Result<Output> {
    cmd.output().with_context(|| format!("cannot run {cmd:?}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Runs `pipelock ARGS` as root and returns stdout, or the skip reason.
fn run_privileged(args: &[&str]) -> Result<std::result::Result<String, Outcome>> {
    if !is_root() {
        return Ok(Err(Outcome::Skipped("needs root".to_owned())));
    }
    if pipelock_user::ebpf::OBJECT.is_empty() {
        return Ok(Err(Outcome::Skipped(stub_reason())));
    }
    let out = run(pipelock().args(args))?;
    ensure!(
        out.status.success(),
        "pipelock {args:?} exited {}: {}",
        out.status,
        text(&out.stderr).trim()
    );
    Ok(Ok(text(&out.stdout)))
}

fn stub_reason() -> String {
    "built with PIPELOCK_EBPF_STUB=1 (no eBPF object); `cargo xtask test` builds the real one".to_owned()
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kernels")
}

/// The value column of a `name   value` line of `pipelock probe` (columns
/// are at least two spaces apart, so `kprobe` does not match `kprobe PMU`).
fn field<'a>(report: &'a str, name: &str) -> Result<&'a str> {
    report
        .lines()
        .find_map(|line| {
            let rest = line.trim_start().strip_prefix(name)?;
            rest.starts_with("  ").then(|| rest.trim())
        })
        .with_context(|| format!("no `{name}` line in:\n{report}"))
}

fn ebpf_object_is_complete() -> Result<Outcome> {
    let object = pipelock_user::ebpf::OBJECT;
    if object.is_empty() {
        return Ok(Outcome::Skipped(stub_reason()));
    }
    let obj = aya_obj::Object::parse(object).context("aya-obj cannot parse the embedded object")?;
    for program in [
        programs::CONTENTION_BEGIN_COUNT_TP,
        programs::CONTENTION_BEGIN_COUNT_BTF,
        programs::PROBE_FENTRY,
        programs::PROBE_KPROBE,
    ] {
        ensure!(
            obj.programs.contains_key(program),
            "program {program} missing; has {:?}",
            obj.programs.keys()
        );
    }
    ensure!(
        obj.maps.contains_key(maps::CONTENTION_BEGIN_COUNT),
        "map missing; has {:?}",
        obj.maps.keys()
    );
    let license = obj.license.to_str()?;
    ensure!(
        license.contains("GPL"),
        "license {license:?} is not GPL-compatible"
    );
    ensure!(
        obj.btf.is_some(),
        "object carries no BTF (needed for tp_btf/fentry programs)"
    );
    Ok(Outcome::Passed)
}

fn unknown_subcommand_exits_2() -> Result<Outcome> {
    let out = run(pipelock().arg("frobnicate"))?;
    ensure!(out.status.code() == Some(2), "exit {} (want 2)", out.status);
    ensure!(
        text(&out.stderr).contains("unrecognized subcommand"),
        "stderr: {}",
        text(&out.stderr)
    );
    Ok(Outcome::Passed)
}

fn bad_duration_exits_2() -> Result<Outcome> {
    let out = run(pipelock().args(["probe", "--self-test", "--duration", "0"]))?;
    ensure!(out.status.code() == Some(2), "exit {} (want 2)", out.status);
    ensure!(
        text(&out.stderr).contains("greater than 0"),
        "stderr: {}",
        text(&out.stderr)
    );
    Ok(Outcome::Passed)
}

fn unprivileged_caller_is_refused() -> Result<Outcome> {
    let mut cmd = pipelock();
    cmd.arg("probe");
    if is_root() {
        // nobody: no capabilities after the uid change.
        cmd.uid(65534).gid(65534);
    }
    let out = run(&mut cmd)?;
    let stderr = text(&out.stderr);
    ensure!(!out.status.success(), "an unprivileged probe succeeded");
    ensure!(stderr.lines().count() == 1, "want one error line, got:\n{stderr}");
    ensure!(
        stderr.contains("needs root (or CAP_BPF and CAP_PERFMON)"),
        "stderr: {stderr}"
    );
    Ok(Outcome::Passed)
}

/// Text symbols of the running kernel, read independently of pipelock.
fn kallsyms_functions() -> Result<std::collections::HashSet<String>> {
    let text = fs::read_to_string("/proc/kallsyms")?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3 && (f[1] == "t" || f[1] == "T")).then(|| f[2].to_owned())
        })
        .collect())
}

fn probe_agrees_with_the_running_kernel() -> Result<Outcome> {
    let report = match run_privileged(&["probe"])? {
        Ok(report) => report,
        Err(skip) => return Ok(skip),
    };
    let release = fs::read_to_string("/proc/sys/kernel/osrelease")?;
    ensure!(field(&report, "kernel")? == release.trim(), "kernel line wrong");

    let kprobe_pmu = Path::new("/sys/bus/event_source/devices/kprobe/type").exists();
    ensure!(
        field(&report, "kprobe PMU")? == if kprobe_pmu { "yes" } else { "no" },
        "kprobe PMU line wrong"
    );
    if !kprobe_pmu {
        ensure!(
            field(&report, "kprobe")?.starts_with("refused"),
            "kprobes claimed without a kprobe PMU"
        );
    }
    let has_tracepoint = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .any(|d| Path::new(d).join("events/lock/contention_begin/id").exists());
    if has_tracepoint {
        ensure!(
            field(&report, "tracepoint")? == "yes",
            "classic tracepoint did not load and attach"
        );
    }

    let functions = kallsyms_functions()?;
    let mut rows = 0;
    for line in report.lines().skip_while(|l| !l.starts_with("functions")).skip(1) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() < 3 {
            break;
        }
        let want = if functions.contains(cols[0]) { "yes" } else { "no" };
        ensure!(
            cols[1] == want,
            "{}: kallsyms column {} but /proc/kallsyms says {want}",
            cols[0],
            cols[1]
        );
        if cols[0].starts_with("lockref_") && cols[1] == "yes" {
            ensure!(line.contains("notrace"), "{} offered as hookable", cols[0]);
        }
        rows += 1;
    }
    ensure!(rows >= 20, "only {rows} function rows");
    for class in ["pipe-mutex", "pipe-wait", "lockref"] {
        let choice = field(&report, class)?;
        ensure!(!choice.starts_with("unavailable"), "{class}: {choice}");
    }
    Ok(Outcome::Passed)
}

/// Each program type this kernel should accept must load and attach. The VM
/// kernels list theirs in xtask/vm-kernels.txt; elsewhere the expectations are
/// what the kernel independently shows (a kprobe PMU, the tracepoint in tracefs).
fn expected_program_types_load_and_attach() -> Result<Outcome> {
    let report = match run_privileged(&["probe"])? {
        Ok(report) => report,
        Err(skip) => return Ok(skip),
    };
    let expected: Vec<String> = match std::env::var("PIPELOCK_EXPECT_PROGRAM_TYPES") {
        Ok(list) => list.split(',').map(str::to_owned).collect(),
        Err(_) => {
            let mut derived = Vec::new();
            if Path::new("/sys/bus/event_source/devices/kprobe/type").exists() {
                derived.push("kprobe".to_owned());
            }
            if Path::new("/sys/kernel/tracing/events/lock/contention_begin/id").exists() {
                derived.push("tracepoint".to_owned());
            }
            derived
        }
    };
    if expected.is_empty() {
        return Ok(Outcome::Skipped(
            "no program type is known to be expected on this kernel".into(),
        ));
    }
    for kind in &expected {
        let support = field(&report, kind)?;
        ensure!(
            support == "yes",
            "{kind} should load and attach here, but: {support}"
        );
    }
    println!("  checked: {}", expected.join(", "));
    Ok(Outcome::Passed)
}

fn self_test_counts_real_contention() -> Result<Outcome> {
    let report = match run_privileged(&["probe", "--self-test", "--duration", "1"])? {
        Ok(report) => report,
        Err(skip) => return Ok(skip),
    };
    let count: u64 = report
        .lines()
        .find_map(|l| l.strip_prefix("self-test: contention_begin events counted: "))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no count in:\n{report}"))?;
    ensure!(count > 0, "self-test counted no contention");
    ensure!(report.contains("self-test: passed"), "no pass line");
    Ok(Outcome::Passed)
}

fn saved_facts_reproduce_the_live_report() -> Result<Outcome> {
    let dir = std::env::temp_dir().join(format!("pipelock-facts-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let dir_arg = dir.to_str().context("temp dir is not UTF-8")?;
    let live = match run_privileged(&["probe", "--save-facts", dir_arg])? {
        Ok(report) => report,
        Err(skip) => return Ok(skip),
    };
    let result = (|| {
        let out = run(pipelock().args(["probe", "--kernel-facts", dir_arg]))?;
        ensure!(out.status.success(), "replay failed: {}", text(&out.stderr));
        let replay = text(&out.stdout);
        // Everything but the paths and the save notice must be identical.
        let strip = |report: &str| -> Vec<String> {
            report
                .lines()
                .filter(|l| {
                    !l.starts_with("BTF") && !l.starts_with("tracefs") && !l.starts_with("kernel facts saved")
                })
                .map(|l| l.trim_end().to_owned())
                .filter(|l| !l.is_empty())
                .collect()
        };
        ensure!(
            strip(&live) == strip(&replay),
            "replayed report differs:\n{live}\n---\n{replay}"
        );

        // A second save to the same place must refuse and leave it untouched.
        let again = run(pipelock().args(["probe", "--save-facts", dir_arg]))?;
        ensure!(
            !again.status.success(),
            "saving over an existing directory succeeded"
        );
        ensure!(
            text(&again.stderr).contains("already exists"),
            "stderr: {}",
            text(&again.stderr)
        );
        Ok(())
    })();
    let _ = fs::remove_dir_all(&dir);
    result.map(|()| Outcome::Passed)
}

fn fixture_kernels_report_their_facts() -> Result<Outcome> {
    let mut seen = 0;
    for entry in fs::read_dir(fixtures())? {
        let dir = entry?.path();
        let out = run(pipelock().arg("probe").arg("--kernel-facts").arg(&dir))?;
        ensure!(out.status.success(), "{}: {}", dir.display(), text(&out.stderr));
        let report = text(&out.stdout);
        let release = fs::read_to_string(dir.join("proc/sys/kernel/osrelease"))?;
        ensure!(
            field(&report, "kernel")? == release.trim(),
            "{}: wrong kernel line",
            dir.display()
        );
        // The pipe entry points moved in 6.18; the report must follow kallsyms.
        let (major, minor) = {
            let mut parts = release
                .split(['.', '-', '+'])
                .map(|p| p.parse::<u32>().unwrap_or(0));
            (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
        };
        let (present, absent) = if (major, minor) >= (6, 18) {
            ("anon_pipe_read", "pipe_read")
        } else {
            ("pipe_read", "anon_pipe_read")
        };
        let row = |name: &str| {
            report
                .lines()
                .find(|l| l.split_whitespace().next() == Some(name))
                .map(str::to_owned)
        };
        let present_row = row(present).with_context(|| format!("no {present} row"))?;
        ensure!(
            present_row.split_whitespace().nth(1) == Some("yes"),
            "{}: {present_row}",
            dir.display()
        );
        let absent_row = row(absent).with_context(|| format!("no {absent} row"))?;
        ensure!(
            absent_row.split_whitespace().nth(1) == Some("no"),
            "{}: {absent_row}",
            dir.display()
        );
        seen += 1;
    }
    if seen < 4 {
        bail!("only {seen} fixture kernels in {}", fixtures().display());
    }
    Ok(Outcome::Passed)
}
