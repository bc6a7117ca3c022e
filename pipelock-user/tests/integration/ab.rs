//! `pipelock ab` between two real kernels (Debian 6.1 and 6.18 from the VM
//! tests' cache, which `cargo xtask test` passes in `PIPELOCK_AB_KERNELS`):
//! the known difference must come out as a significant change, and what can
//! go wrong (a file that is no kernel, a guest that hangs, a command that
//! fails in the guest) is one clear line, exit 1, and no qemu left running.
use std::time::Instant;

use pipelock_user::model::{
    AbResult, LockClass,
    judge::{Figure, Measure, Row, Subject},
};

use super::*;

/// The two kernels (6.1, 6.18), if given.
fn kernels() -> Option<(String, String)> {
    let list = std::env::var("PIPELOCK_AB_KERNELS").ok()?;
    let (a, b) = list.split_once(':')?;
    Some((a.to_owned(), b.to_owned()))
}

/// How many qemu processes carry `tag` in their environment: the ones a
/// `pipelock ab` started with it set (qemu inherits it), whatever else runs
/// qemu meanwhile (`cargo xtask test` boots its VM tests beside these).
fn qemus_tagged(tag: &str) -> Result<usize> {
    let mut count = 0;
    for entry in fs::read_dir("/proc")? {
        let dir = entry?.path();
        if !fs::read_to_string(dir.join("comm")).is_ok_and(|comm| comm.starts_with("qemu-system")) {
            continue;
        }
        // A process that has exited meanwhile has no environment to read.
        let environ = fs::read(dir.join("environ")).unwrap_or_default();
        if environ.split(|b| *b == 0).any(|var| var == tag.as_bytes()) {
            count += 1;
        }
    }
    Ok(count)
}

/// `pipelock ab ARGS`: (exit code, stdout, stderr), checking that none of
/// the qemu processes it started outlives it.
fn ab(args: &[&str]) -> Result<(Option<i32>, String, String)> {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let value = format!("{}-{call}", std::process::id());
    let out = run(pipelock()
        .arg("ab")
        .args(args)
        .env("PIPELOCK_AB_TEST_CALL", &value))?;
    let left = qemus_tagged(&format!("PIPELOCK_AB_TEST_CALL={value}"))?;
    ensure!(left == 0, "{left} qemu process(es) left behind by ab {args:?}");
    Ok((out.status.code(), text(&out.stdout), text(&out.stderr)))
}

/// The error line of a failed `ab` (the last line of stderr).
pub(super) fn error_line(stderr: &str) -> &str {
    stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("pipelock: error:"))
        .unwrap_or("")
}

/// The known difference: pipe-throughput traced with fentry on 6.1 and 6.18.
/// `rd_wait.lock` is taken about 3 times per write+read pair on 6.1 (the
/// `spin_lock_irq` around each head/tail update, and the wake-up) and once
/// on 6.18; the pipe mutex twice on both.
fn ab_shows_the_rd_wait_change_between_6_1_and_6_18() -> Result<Outcome> {
    let Some((k61, k618)) = kernels() else {
        return Ok(Outcome::Skipped(
            "no kernels given (PIPELOCK_AB_KERNELS=A:B; `cargo xtask test` sets it after the VM tests)"
                .into(),
        ));
    };
    let json = scratch("ab.json");
    let started = Instant::now();
    let (code, stdout, stderr) = ab(&[
        "--kernel",
        &k61,
        "--kernel",
        &k618,
        "--runs",
        "3",
        "--accel",
        "tcg",
        "--json",
        json.to_str().context("path")?,
        "--",
        "run",
        "pipe-throughput",
        "--trace",
        "--trace-mode",
        "fentry",
        "--duration",
        "1",
        "--passes",
        "1",
    ])?;
    ensure!(code == Some(0), "ab: {code:?}: {}", error_line(&stderr));
    let read = || -> Result<(AbResult, String)> {
        let report: AbResult =
            serde_json::from_str(&fs::read_to_string(&json)?).context("not an ab result")?;
        let page = ab_page_shows_both_kernels(&json, &report)?;
        Ok((report, page))
    };
    let read = read();
    let _ = fs::remove_file(&json);
    let (report, page) = read?;
    let row = |class: LockClass| -> Result<&Row> {
        let figure = Figure {
            subject: Subject::Class(class),
            measure: Measure::AcquisitionsPerOperation,
        };
        report
            .table
            .iter()
            .find(|r| r.figure == figure)
            .with_context(|| format!("no {figure:?} row: {stdout}"))
    };
    let rd = row(LockClass::PipeRdWait)?;
    ensure!(
        rd.metric == "pipe-rd-wait acquisitions per write+read pair",
        "named {:?}",
        rd.metric
    );
    let (a, b) = (rd.a.mean, rd.b.mean);
    ensure!(
        (2.8..=3.2).contains(&a) && (0.9..=1.1).contains(&b) && rd.significant,
        "rd_wait.lock per pair: 6.1 {a}, 6.18 {b}, significant {}",
        rd.significant
    );
    let mutex = row(LockClass::PipeMutex)?;
    let (ma, mb) = (mutex.a.mean, mutex.b.mean);
    ensure!(
        (1.9..=2.1).contains(&ma) && (1.9..=2.1).contains(&mb),
        "pipe mutex per pair: 6.1 {ma}, 6.18 {mb}"
    );
    ensure!(report.kernels[0].runs.len() == 3, "3 raw runs of A");
    ensure!(stdout.contains("%change"), "no table printed: {stdout}");
    println!("  report --html: {page}");
    println!(
        "  rd_wait.lock per pair {a:.2} → {b:.2} (significant), pipe mutex {ma:.2} → {mb:.2}, in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(Outcome::Passed)
}
register!(Host ab_shows_the_rd_wait_change_between_6_1_and_6_18);

/// `pipelock report --html` of an `ab` result: each row of the table with
/// the JSON's means, both kernels' bars on screen in Chromium.
fn ab_page_shows_both_kernels(json: &Path, report: &AbResult) -> Result<String> {
    let page = scratch("ab.html");
    let drawn = run(pipelock().arg("report").arg(json).arg("--html").arg(&page))?;
    ensure!(drawn.status.success(), "report: {}", text(&drawn.stderr));
    let html = fs::read_to_string(&page)?;
    let rows = &report.table;
    for row in rows {
        let metric = &row.metric;
        let at = html
            .find(&format!("data-metric=\"{metric}\""))
            .with_context(|| format!("no {metric} row on the page"))?;
        let cells = &html[at..];
        for (side, want) in [("a", row.a.mean), ("b", row.b.mean)] {
            let shown: f64 = cells
                .split(&format!("data-field=\"{side}\" data-value=\""))
                .nth(1)
                .and_then(|v| v.split('"').next())
                .context("no value")?
                .parse()?;
            ensure!(
                shown == want,
                "{metric}: the page shows {side} = {shown}, the JSON {want}"
            );
        }
    }
    let shot = report::rendered(&page, "report-ab.png", &[report::BAR_A, report::BAR_B]);
    let _ = fs::remove_file(&page);
    Ok(match shot? {
        Some(line) => format!("{} rows as in the JSON; {line}", rows.len()),
        None => format!(
            "{} rows as in the JSON; no chromium to open it (skipped)",
            rows.len()
        ),
    })
}

/// Each failure is one line and exit 1, with no qemu left: a file that is
/// not a kernel, a truncated kernel that cannot boot, a command that fails
/// in the guest, a command that never finishes (the guest's deadline).
fn ab_failures_are_one_line_and_leave_no_qemu() -> Result<Outcome> {
    let Some((k61, k618)) = kernels() else {
        return Ok(Outcome::Skipped(
            "no kernels given (PIPELOCK_AB_KERNELS=A:B; `cargo xtask test` sets it after the VM tests)"
                .into(),
        ));
    };
    let junk = scratch("ab-junk");
    fs::write(&junk, b"not a kernel at all")?;
    let truncated = scratch("ab-truncated");
    let image = fs::read(&k61)?;
    fs::write(&truncated, &image[..image.len() / 8])?;
    let junk = junk.to_str().context("path")?.to_owned();
    let truncated = truncated.to_str().context("path")?.to_owned();
    let cases: [(&[&str], &str); 4] = [
        (
            &[
                "--kernel",
                &junk,
                "--kernel",
                &k618,
                "--",
                "run",
                "pipe-throughput",
            ],
            "is not a Linux kernel image",
        ),
        (
            &[
                "--kernel",
                &truncated,
                "--kernel",
                &k618,
                "--accel",
                "tcg",
                "--timeout",
                "60",
                "--",
                "run",
                "pipe-throughput",
            ],
            "(A preflight): the guest stopped",
        ),
        (
            &[
                "--kernel",
                &k61,
                "--kernel",
                &k618,
                "--accel",
                "tcg",
                "--runs",
                "1",
                "--",
                "run",
                "no-such-workload",
            ],
            "the command failed in the guest: error: unrecognized subcommand",
        ),
        (
            &[
                "--kernel",
                &k61,
                "--kernel",
                &k618,
                "--accel",
                "tcg",
                "--runs",
                "1",
                // The guest gives up at its deadline, (150 - 60) × 3/4 s,
                // asks the kernel for its blocked tasks and finds none.
                "--timeout",
                "150",
                "--",
                "trace",
                "--mode",
                "tracepoint",
                "--",
                "sleep",
                "100000",
            ],
            "(A run 1/1): the command did not finish within 67 s (the guest's deadline, from --timeout); the kernel \
             lists no blocked task",
        ),
    ];
    let mut seen = Vec::new();
    for (args, want) in cases {
        let (code, _, stderr) = ab(args)?;
        let line = error_line(&stderr);
        ensure!(
            code == Some(1) && line.contains(want),
            "ab {args:?}: exit {code:?}, want 1 and `{want}`: {stderr}"
        );
        seen.push(line.to_owned());
    }
    let _ = (fs::remove_file(&junk), fs::remove_file(&truncated));
    for line in seen {
        println!("  {line}");
    }
    println!(
        "  (a kernel without BTF is refused by the preflight's check; no such kernel is at hand to boot)"
    );
    Ok(Outcome::Passed)
}
register!(Host ab_failures_are_one_line_and_leave_no_qemu);

/// The preflight a kernel without BTF meets, run here: the same script the
/// guest runs, in a private mount namespace where `/sys/kernel/btf` is an
/// empty tmpfs, read by the same code `ab` reads a guest's console with.
/// It must refuse the kernel, naming BTF; with BTF visible it must pass.
/// (No kernel without BTF is at hand to boot: Debian's all have it.)
fn ab_preflight_refuses_a_kernel_without_btf() -> Result<Outcome> {
    use pipelock_user::cmd::ab::{guest::preflight_script_with, read_console};
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    if Command::new("unshare").arg("--help").output().is_err() {
        return Ok(Outcome::Skipped("unshare is not installed (util-linux)".into()));
    }
    let bin = pipelock_path();
    let tmp = scratch("preflight");
    fs::create_dir_all(&tmp)?;
    let nonce = "preflighttest";
    let script = preflight_script_with(nonce, &bin, tmp.to_str().context("path")?);
    let sentinel = format!("echo PIPELOCK-VM-RESULT {nonce} rc=$?");
    let console = |hide_btf: bool| -> Result<String> {
        let hide = if hide_btf {
            "mount -t tmpfs tmpfs /sys/kernel/btf && "
        } else {
            ""
        };
        let out = run(Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(format!("{hide}{script}\n{sentinel}")))?;
        ensure!(out.status.success(), "unshare: {}", text(&out.stderr));
        Ok(text(&out.stdout))
    };
    let refused = read_console(&console(true)?, nonce, None).map(|r| r.len());
    let why = match refused {
        Err(why) => why,
        Ok(n) => bail!("a kernel without BTF passed the preflight ({n} results)"),
    };
    ensure!(why.contains("refused: this kernel has no BTF"), "{why}");
    let passed = read_console(&console(false)?, nonce, None).map_err(|e| anyhow::anyhow!(e))?;
    ensure!(
        passed.iter().any(|(name, _)| name == "probe") && passed.iter().any(|(name, _)| name == "release"),
        "the preflight with BTF gave {:?}",
        passed.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    let _ = fs::remove_dir_all(&tmp);
    println!("  BTF hidden: {why}; BTF visible: passes (release and probe results)");
    Ok(Outcome::Passed)
}
register!(Host ab_preflight_refuses_a_kernel_without_btf);

/// The measured boot's watcher, run on the host as a guest runs it (the
/// sysrq trigger a scratch file): a command whose pipelock says a thread
/// asked for a mutex it holds, and which never ends, is not waited for.
/// Its `deadlock:` line, the kernel log and how long it ran come back at
/// once, and `ab` reads them as an unsafe verdict naming the function and
/// its caller. A command that prints nothing is given up on at the
/// deadline, with no `deadlock:` line to show.
fn ab_guest_stops_waiting_on_a_thread_that_asked_twice() -> Result<Outcome> {
    use pipelock_user::cmd::ab::{
        guest::{GuestPaths, run_script_with},
        hang_of, read_console,
    };
    use std::os::unix::fs::PermissionsExt as _;
    const LINE: &str = "pipelock: deadlock: paths(5/6) asked for the mutex of pipe:[9] (0x1) that it already \
                        holds, in fcntl(), at pipe_set_size+0x5e <- pipe_fcntl+0x8d <- do_fcntl+0x4c2";
    // Longer than either case may take: a watcher that waited for the
    // command would show it.
    const NEVER_ENDS: u64 = 20;
    let bin = pipelock_path();
    let tmp = scratch("stuck");
    fs::create_dir_all(&tmp)?;
    let dir = tmp.to_str().context("path")?.to_owned();
    let sysrq = tmp.join("sysrq-trigger");
    // The console's results by name, and how long the watcher took.
    type Watched = (Vec<(String, Vec<u8>)>, f64);
    let watch = |says: &str, deadline: u64| -> Result<Watched> {
        let fake = tmp.join("pipelock");
        fs::write(
            &fake,
            format!(
                "#!/bin/sh\nif [ \"$1\" = ab-emit ]; then exec {bin} \"$@\"; fi\n{says}\nexec sleep {NEVER_ENDS}\n"
            ),
        )?;
        fs::set_permissions(&fake, fs::Permissions::from_mode(0o755))?;
        let nonce = "stucktest";
        let script = run_script_with(
            nonce,
            &["run".to_owned(), "pipe-herd".to_owned()],
            std::time::Duration::from_secs(deadline),
            &[],
            &GuestPaths {
                bin: fake.to_str().context("path")?,
                tmp: &dir,
                sysrq: sysrq.to_str().context("path")?,
                tracing: &dir,
            },
        );
        let started = Instant::now();
        let out = run(Command::new("sh")
            .arg("-c")
            .arg(format!("{script}\necho PIPELOCK-VM-RESULT {nonce} rc=$?")))?;
        let took = started.elapsed().as_secs_f64();
        let results = read_console(&text(&out.stdout), nonce, None).map_err(|e| anyhow::anyhow!(e))?;
        Ok((results, took))
    };
    let (results, took) = watch(&format!("echo '{LINE}' >&2"), 600)?;
    ensure!(
        took < NEVER_ENDS as f64 / 2.0,
        "the watcher took {took:.1} s to see the deadlock line"
    );
    let hang = hang_of(&results, 1).context("no hang came back from a command that asked twice")?;
    ensure!(hang.asked_twice == [LINE], "asked twice: {:?}", hang.asked_twice);
    ensure!(
        fs::read_to_string(&sysrq)?.trim() == "w",
        "sysrq was not asked for the blocked tasks"
    );
    let verdict = hang.verdict("B");
    ensure!(
        verdict.starts_with(
            "B is unsafe: pipe_set_size() asks for the mutex of pipe:[9] that its thread already holds \
             (called from pipe_fcntl())"
        ),
        "{verdict}"
    );
    let (results, took) = watch("true", 2)?;
    let slow = hang_of(&results, 1).context("no hang came back from a command past its deadline")?;
    ensure!(
        slow.asked_twice.is_empty() && slow.after_s >= 2 && took < NEVER_ENDS as f64 / 2.0,
        "past the deadline: {slow:?} after {took:.1} s"
    );
    let _ = fs::remove_dir_all(&tmp);
    println!("  deadlock line seen after {took:.1} s: {verdict}");
    Ok(Outcome::Passed)
}
register!(Host ab_guest_stops_waiting_on_a_thread_that_asked_twice);

/// The guest script counts the calls of the functions asked with a kprobe
/// event each, run on the host against a stand-in tracefs: a function the
/// kernel takes a probe for gets its `kprobe_profile` hits, one it refuses
/// is said to have no probe point, and a kernel without kprobe events
/// says so for all.
fn ab_guest_counts_the_calls_of_the_changed_functions() -> Result<Outcome> {
    use pipelock_user::cmd::ab::{
        guest::{GuestPaths, calls_of, run_script_with},
        read_console,
    };
    use std::os::unix::fs::PermissionsExt as _;
    let bin = pipelock_path();
    let tmp = scratch("calls");
    let tracing = tmp.join("tracing");
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(tracing.join("events/pipelock_calls/pipelock_f0"))?;
    fs::write(tracing.join("events/pipelock_calls/pipelock_f0/enable"), "")?;
    fs::write(tracing.join("kprobe_events"), "")?;
    fs::write(
        tracing.join("kprobe_profile"),
        "  pipelock_f0                                       42               0\n",
    )?;
    // A pipelock whose command writes an empty result at once.
    let fake = tmp.join("pipelock");
    fs::write(
        &fake,
        format!(
            "#!/bin/sh\nif [ \"$1\" = ab-emit ]; then exec {bin} \"$@\"; fi\n\
             while [ $# -gt 0 ]; do if [ \"$1\" = --json ]; then echo '{{}}' > \"$2\"; fi; shift; done\n"
        ),
    )?;
    fs::set_permissions(&fake, fs::Permissions::from_mode(0o755))?;
    let asked = ["pipe_read".to_owned(), "pipe_set_size".to_owned()];
    let counted = |tracing: &Path| -> Result<Vec<(String, std::result::Result<u64, String>)>> {
        let nonce = "callstest";
        let script = run_script_with(
            nonce,
            &["run".to_owned(), "pipe-herd".to_owned()],
            std::time::Duration::from_secs(60),
            &asked,
            &GuestPaths {
                bin: fake.to_str().context("path")?,
                tmp: tmp.to_str().context("path")?,
                sysrq: "/dev/null",
                tracing: tracing.to_str().context("path")?,
            },
        );
        let out = run(Command::new("sh")
            .arg("-c")
            .arg(format!("{script}\necho PIPELOCK-VM-RESULT {nonce} rc=$?")))?;
        let results = read_console(&text(&out.stdout), nonce, None).map_err(|e| anyhow::anyhow!(e))?;
        Ok(calls_of(&results, &asked))
    };
    let calls = counted(&tracing)?;
    ensure!(
        calls.len() == 2
            && calls[0] == ("pipe_read".to_owned(), Ok(42))
            && calls[1].0 == "pipe_set_size"
            && calls[1]
                .1
                .as_ref()
                .is_err_and(|why| why.starts_with("no probe point")),
        "{calls:?}"
    );
    ensure!(
        fs::read_to_string(tracing.join("kprobe_events"))?
            == "p:pipelock_calls/pipelock_f0 pipe_read\np:pipelock_calls/pipelock_f1 pipe_set_size\n",
        "the probes asked of the kernel"
    );
    let none = counted(&tmp.join("no-tracefs"))?;
    ensure!(
        none.len() == 2
            && none
                .iter()
                .all(|(_, c)| c.as_ref().is_err_and(|why| why.contains("no kprobe events"))),
        "{none:?}"
    );
    let _ = fs::remove_dir_all(&tmp);
    println!("  pipe_read entered 42 times (its probe's hits), pipe_set_size without a probe point");
    Ok(Outcome::Passed)
}
register!(Host ab_guest_counts_the_calls_of_the_changed_functions);
