//! `pipelock probe` against the running kernel: facts, program types, the self-test, saved facts.
use super::*;

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
    // Kfuncs are kernel functions: kallsyms lists the cast where BTF does.
    let has_cast = kallsyms_functions()?.contains("bpf_rdonly_cast");
    let cast = field(&report, "bpf_rdonly_cast")?;
    ensure!(
        cast.starts_with(if has_cast { "yes" } else { "no" }),
        "bpf_rdonly_cast line wrong (kallsyms {}): {cast}",
        if has_cast { "has it" } else { "has not" }
    );
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
    // The pick for the default classes, then what each class gets in it.
    let default = field(&report, "default classes")?;
    ensure!(!default.starts_with("unavailable"), "default classes: {default}");
    for class in [
        "pipe-mutex",
        "pipe-rd-wait",
        "pipe-wr-wait",
        "other-in-pipe-call",
        "lockref",
    ] {
        let coverage = field(&report, class)?;
        ensure!(
            coverage.starts_with("wait") || coverage.starts_with("n/a"),
            "{class}: {coverage}"
        );
    }
    Ok(Outcome::Passed)
}
register!(Kernel probe_agrees_with_the_running_kernel);

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
register!(Kernel expected_program_types_load_and_attach);

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
    // Tracepoint mode's interrupt check, judged on events of known context:
    // the numbers in "syscalls A on a task stack, B not; softirqs (outside
    // ksoftirqd) C on an interrupt stack, D not".
    let line = report
        .lines()
        .find_map(|l| l.strip_prefix("self-test: interrupt-context check: "))
        .with_context(|| format!("no interrupt-check line in:\n{report}"))?;
    // The self-test fails when a tp_btf kernel refuses the check; it says
    // "skipped" only where there is nothing to check (no tp_btf, no
    // offsets), and so does this test, once the count above has passed.
    if let Some(why) = line.strip_prefix("skipped") {
        return Ok(Outcome::Skipped(format!(
            "contention counted ({count}), interrupt-context check {why}"
        )));
    }
    let numbers: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    // (Softirqs on a task stack are not checked: an interrupt that arrives
    // in user mode runs on the task's empty kernel stack, and so does the
    // softirq at its exit; the task is in no syscall then, so no lock event
    // of it is classified as a pipe call's.)
    let [syscalls, syscalls_elsewhere, softirqs, ..] = numbers[..] else {
        bail!("interrupt check: {line}")
    };
    ensure!(
        syscalls > 0 && syscalls_elsewhere == 0 && softirqs > 0,
        "interrupt check: {line}"
    );
    println!("  interrupt-context check: {line}");
    Ok(Outcome::Passed)
}
register!(Kernel self_test_counts_real_contention);

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
register!(Kernel saved_facts_reproduce_the_live_report);

/// Runs `pipelock ARGS` as root and returns stdout, or the skip reason.
fn run_privileged(args: &[&str]) -> Result<std::result::Result<String, Outcome>> {
    if let Some(skip) = cannot_load() {
        return Ok(Err(skip));
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
