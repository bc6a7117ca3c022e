//! The binary's contract: the embedded object, saved kernel facts, one clear line for bad input, refusal without privileges, result files that read back.
use super::*;

/// The embedded object: every program name pipelock loads by is in it and
/// every program in it is named (`programs::ALL`, the empty arrays), its
/// map, a GPL-compatible licence and BTF.
fn ebpf_object_is_complete() -> Result<Outcome> {
    let object = pipelock_user::bpf::object::OBJECT;
    if object.is_empty() {
        return Ok(Outcome::Skipped(stub_reason()));
    }
    let obj = aya_obj::Object::parse(object).context("aya-obj cannot parse the embedded object")?;
    // Every name pipelock loads a program by is in the object, and every
    // program of the object has its name in `programs`.
    let named: std::collections::BTreeSet<&str> = programs::ALL
        .iter()
        .chain(&programs::EMPTY_FENTRY)
        .chain(&programs::EMPTY_FEXIT)
        .copied()
        .collect();
    let built: std::collections::BTreeSet<&str> = obj.programs.keys().map(String::as_str).collect();
    let missing: Vec<_> = named.difference(&built).collect();
    let unnamed: Vec<_> = built.difference(&named).collect();
    ensure!(
        missing.is_empty() && unnamed.is_empty(),
        "programs named but not in the object: {missing:?}; in the object but not named: {unnamed:?}"
    );
    ensure!(
        named.len() == programs::ALL.len() + 32,
        "a program is named twice"
    );
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
register!(Host ebpf_object_is_complete);

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
        stderr.contains("needs root, or CAP_BPF and CAP_PERFMON")
            && stderr.contains("lacks CAP_BPF and CAP_PERFMON"),
        "stderr: {stderr}"
    );
    Ok(Outcome::Passed)
}
register!(Kernel unprivileged_caller_is_refused);

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
register!(Host fixture_kernels_report_their_facts);

fn bad_input_is_one_clear_line() -> Result<Outcome> {
    let cases: &[(&[&str], i32, &str)] = &[
        (&["frobnicate"], 2, "unrecognized subcommand"),
        (&["run", "pipe-herd", "--cpus", "3-1"], 2, "not a CPU list"),
        (&["probe", "--self-test", "--duration", "0"], 2, "greater than 0"),
        (&["trace", "--duration", "-2"], 2, "greater than 0"),
        (&["trace", "--reset"], 2, "--interval"),
        (&["top"], 1, "pipelock top needs a terminal"),
        (
            &["top", "--workload", "pipe-herd", "--", "true"],
            2,
            "cannot be used with",
        ),
        (&["trace", "--sort", "fastest"], 2, "invalid value 'fastest'"),
        (&["trace", "--track-locks", "8"], 2, "16..=1048576"),
        (&["run", "no-such-workload"], 2, "unrecognized subcommand"),
        (
            &["run", "pipe-throughput", "--duration", "0"],
            2,
            "greater than 0",
        ),
        (
            &["run", "pipe-throughput", "--duration", "-1"],
            2,
            "greater than 0",
        ),
        (&["run", "pipe-herd", "--limit", "0"], 2, "--limit"),
        (&["run", "pipe-herd", "-k", "11"], 2, "--forks"),
        (
            &["run", "pipe-herd", "--json", "/nonexistent-dir/x.json"],
            1,
            "cannot write /nonexistent-dir/x.json",
        ),
        (
            &["run", "lockref-stat", "--path", "/nonexistent-path"],
            1,
            "--path /nonexistent-path: no such file",
        ),
        (
            &["compare", "/nonexistent-a.json", "/nonexistent-b.json"],
            1,
            "cannot read /nonexistent-a.json",
        ),
        // Refused before anything is attached: a filter that matches
        // nothing, a file that cannot be written, a COMMAND that cannot run.
        (
            &["trace", "-p", "0", "--duration", "1"],
            1,
            "-p 0: not a process id",
        ),
        (
            &["trace", "-p", "4194303", "--duration", "1"],
            1,
            "-p 4194303: no such process",
        ),
        (
            &["trace", "-t", "4194302", "--duration", "1"],
            1,
            "-t 4194302: no such thread",
        ),
        (
            &["trace", "-c", "", "--duration", "1"],
            1,
            "-c: the command name is empty",
        ),
        (
            &["trace", "-c", "a-very-long-command-name", "--duration", "1"],
            1,
            "use `-c a-very-long-com`",
        ),
        (
            &["trace", "--max-locks", "0", "--duration", "1"],
            1,
            "--max-locks 0: must be between 16 and 262144",
        ),
        (
            &["trace", "--max-locks", "99999999", "--", "true"],
            1,
            "--max-locks 99999999: must be between",
        ),
        (
            &["trace", "--interval", "5", "--duration", "1"],
            1,
            "longer than --duration",
        ),
        (
            &["trace", "--json", "/tmp", "--duration", "1"],
            1,
            "cannot write /tmp",
        ),
        (
            &["trace", "--csv", "/tmp", "--duration", "1"],
            1,
            "cannot write /tmp",
        ),
        (
            &["trace", "--csv", "/tmp", "--interval", "1"],
            1,
            "cannot write /tmp",
        ),
        (
            &["trace", "--", "/no/such/program"],
            1,
            "COMMAND /no/such/program: no such program",
        ),
        (&["trace", "--", "no-such-program-pipelock"], 1, "no such program"),
        (
            &[
                "trace",
                "-p",
                "0",
                "--interval",
                "1",
                "--csv",
                "/tmp/pipelock-bad-input.csv",
            ],
            1,
            "-p 0: not a process id",
        ),
        (&["trace", "-a", "-p", "1"], 2, "cannot be used with"),
        (&["trace", "--stack-depth", "0"], 2, "--stack-depth"),
        (&["trace", "--stack-depth", "99"], 2, "--stack-depth"),
        (&["trace", "--by", "thread"], 2, "invalid value 'thread'"),
        (
            &["serve", "--listen", "nonsense"],
            1,
            "--listen nonsense: not an address",
        ),
        (&["serve", "--listen", "127.0.0.1:99999"], 1, "not an address"),
        (
            &["serve", "--web-config", "/nonexistent/web.yml"],
            1,
            "--web-config /nonexistent/web.yml: cannot read it",
        ),
        (
            &["serve", "--web-config", "/dev/null/x"],
            1,
            "--web-config /dev/null/x: cannot read it",
        ),
        (&["trace", "--caller", "[pipe"], 2, "not a glob"),
        (
            &["trace", "--lock-filter", "0xzz"],
            2,
            "not a hexadecimal address",
        ),
        (
            &[
                "trace",
                "--by",
                "task",
                "--caller",
                "pipe_write",
                "--duration",
                "1",
            ],
            1,
            "--by task rows have none",
        ),
        (
            &["trace", "--callers", "--stack-map-size", "5", "--duration", "1"],
            1,
            "--stack-map-size 5: must be between 16 and 262144",
        ),
    ];
    let refused_csv = Path::new("/tmp/pipelock-bad-input.csv");
    let _ = fs::remove_file(refused_csv);
    for (args, code, message) in cases {
        let out = run(pipelock().args(*args))?;
        let stderr = text(&out.stderr);
        ensure!(
            out.status.code() == Some(*code),
            "{args:?}: exit {} (want {code}); {stderr}",
            out.status
        );
        ensure!(
            stderr.contains(message),
            "{args:?}: stderr lacks `{message}`: {stderr}"
        );
        if *code == 1 {
            ensure!(
                stderr.lines().count() == 1,
                "{args:?}: want one line, got: {stderr}"
            );
        }
        ensure!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    }
    ensure!(
        !refused_csv.exists(),
        "a refused trace left {} behind",
        refused_csv.display()
    );
    Ok(Outcome::Passed)
}
register!(Host bad_input_is_one_clear_line);

fn compare_and_csv_read_back() -> Result<Outcome> {
    let (a, b, csv_path) = (scratch("a.json"), scratch("b.json"), scratch("a.csv"));
    let result = (|| {
        for (json, csv) in [(&a, Some(&csv_path)), (&b, None)] {
            let mut cmd = pipelock();
            cmd.args([
                "run",
                "lockref-stat",
                "--threads",
                "1",
                "--duration",
                "0.2",
                "--runs",
                "3",
                "-q",
                "--json",
            ])
            .arg(json);
            if let Some(csv) = csv {
                cmd.arg("--csv").arg(csv);
            }
            let out = run(&mut cmd)?;
            ensure!(out.status.success(), "{}", text(&out.stderr));
        }
        let out = run(pipelock().arg("compare").arg(&a).arg(&b))?;
        let table = text(&out.stdout);
        ensure!(out.status.success(), "{}", text(&out.stderr));
        ensure!(
            table.contains("p (Welch)")
                && table.contains("rate (ops/s)")
                && table.contains("context-switches"),
            "{table}"
        );

        let mut reader = csv::Reader::from_path(&csv_path)?;
        let headers = reader.headers()?.clone();
        for column in [
            "workload",
            "run",
            "value",
            "task_clock_ms",
            "context_switches",
            "cpu_migrations",
            "nvcsw",
        ] {
            ensure!(
                headers.iter().any(|h| h == column),
                "CSV lacks {column}: {headers:?}"
            );
        }
        let rows: Vec<csv::StringRecord> = reader.records().collect::<Result<_, _>>()?;
        ensure!(rows.len() == 3, "want 3 CSV rows, got {}", rows.len());
        ensure!(rows.iter().all(|r| r.len() == headers.len()), "ragged CSV");
        ensure!(
            rows.iter().all(|r| r[5].parse::<f64>().is_ok_and(|v| v > 0.0)),
            "values are not positive numbers"
        );

        let mismatch = run(pipelock()
            .arg("compare")
            .arg(&a)
            .arg(fixtures().join("../results/pipe-herd.json")))?;
        ensure!(
            !mismatch.status.success() && text(&mismatch.stderr).contains("cannot compare"),
            "{}",
            text(&mismatch.stderr)
        );
        Ok(())
    })();
    for path in [&a, &b, &csv_path] {
        let _ = fs::remove_file(path);
    }
    result.map(|()| Outcome::Passed)
}
register!(Host compare_and_csv_read_back);

/// A result file of another format, or one without the field (an older
/// pipelock's, another program's), is refused by `report` and `compare` in
/// one line that says which, with a non-zero exit: never read as zeros.
fn results_of_another_format_are_refused_in_one_line() -> Result<Outcome> {
    let fixture = fs::read_to_string(fixtures().join("../results/pipe-herd.json"))?;
    let mut value: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&fixture)?;
    ensure!(value.contains_key("format"), "the fixture has no format field");
    let mut older = value.clone();
    older.insert("format".into(), 1.into());
    value.remove("format");
    let cases = [
        (
            "format-1.json",
            serde_json::Value::Object(older),
            "result format 1",
        ),
        (
            "no-format.json",
            serde_json::Value::Object(value),
            "no result format field",
        ),
    ];
    for (name, json, want) in cases {
        let path = scratch(name);
        fs::write(&path, serde_json::to_string(&json)?)?;
        let fresh = fixtures().join("../results/pipe-herd.json");
        let page = scratch(&format!("{name}.html"));
        let runs = [
            (
                "report",
                run(pipelock().arg("report").arg(&path).arg("--html").arg(&page))?,
            ),
            ("compare", run(pipelock().arg("compare").arg(&fresh).arg(&path))?),
        ];
        let _ = fs::remove_file(&path);
        ensure!(!page.exists(), "report wrote a page of a refused file");
        for (command, out) in runs {
            let stderr = text(&out.stderr);
            ensure!(
                !out.status.success() && stderr.trim().lines().count() == 1 && stderr.contains(want),
                "{command} on {name}: exit {}, want one line saying {want:?}: {stderr}",
                out.status
            );
            println!("  {command} {name}: {}", stderr.trim());
        }
    }
    Ok(Outcome::Passed)
}
register!(Host results_of_another_format_are_refused_in_one_line);

/// A test function nobody registered would never run: every
/// `fn …() -> Result<Outcome>` in these files, and every test a
/// `per_mode!` block names, is in [`TESTS`].
fn every_test_function_is_registered() -> Result<Outcome> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration");
    let mut unregistered = Vec::new();
    let mut found = 0;
    for entry in fs::read_dir(&dir)? {
        let source = fs::read_to_string(entry?.path())?;
        let mut in_per_mode = false;
        for line in source.lines() {
            if line.starts_with("per_mode!(") {
                in_per_mode = true;
                continue;
            }
            if in_per_mode && line == "});" {
                in_per_mode = false;
                continue;
            }
            let name = if in_per_mode {
                line.trim().split_once(": \"").map(|(name, _)| name)
            } else {
                line.strip_prefix("fn ")
                    .and_then(|rest| rest.strip_suffix("() -> Result<Outcome> {"))
            };
            let Some(name) = name else {
                continue;
            };
            found += 1;
            if !TESTS.iter().any(|t| t.name == name) {
                unregistered.push(name.to_owned());
            }
        }
    }
    ensure!(unregistered.is_empty(), "not registered: {unregistered:?}");
    ensure!(
        found == TESTS.len(),
        "{found} test functions, {} registered",
        TESTS.len()
    );
    Ok(Outcome::Passed)
}
register!(Host every_test_function_is_registered);

/// A test name that matches nothing fails the harness (exit 2, one line)
/// instead of passing with nothing run.
fn a_name_no_test_has_is_an_error() -> Result<Outcome> {
    let out = Command::new(std::env::current_exe()?)
        .arg("zz_no_test_is_named_this")
        .output()?;
    let text = text(&out.stdout);
    ensure!(
        out.status.code() == Some(2)
            && text.trim() == "integration: no test's name contains any of [\"zz_no_test_is_named_this\"]",
        "exit {:?}: {text}",
        out.status
    );
    Ok(Outcome::Passed)
}
register!(Host a_name_no_test_has_is_an_error);
