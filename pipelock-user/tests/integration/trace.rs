//! `pipelock trace` on the host's herd and on commands: rows, foreign locks, whose locks, how a trace ends, filters, interval CSV.
use pipelock_user::model::{LockClass, LockRow};

use super::*;

/// A row of one of a pipe's own locks (its mutex or a wait-queue lock).
fn is_pipe_lock(row: &LockRow) -> bool {
    row.class.is_some_and(|c| c.name().starts_with("pipe-"))
}

fn trace_sees_the_herds_pipe_locks() -> Result<Outcome> {
    // Enough tokens that the herd contends its pipe even when the
    // scheduler is unkind: a clean CI run once passed 100 000 of them in
    // 0.17 s without a single contended acquisition.
    let limit = if in_vm() { "30000" } else { "400000" };
    let report = match trace_contended(
        &["--mode", "tracepoint"],
        &["run", "pipe-herd", "-k", "5", "--limit", limit, "-q"],
    )? {
        Ok(report) => report,
        Err(skip) => return Ok(skip),
    };
    let pipe_rows: Vec<&LockRow> = report.locks.iter().filter(|l| is_pipe_lock(l)).collect();
    ensure!(
        !pipe_rows.is_empty(),
        "32 processes on one pipe, yet no pipe lock row: {}",
        shown(&report)
    );
    let contended: u64 = pipe_rows.iter().map(|l| l.contentions).sum();
    ensure!(contended > 0, "pipe rows without contentions");
    let unnamed: Vec<&&LockRow> = pipe_rows
        .iter()
        .filter(|l| l.pipe_ino.is_none_or(|ino| ino == 0))
        .collect();
    ensure!(
        unnamed.is_empty(),
        "pipe rows without a pipe inode: {}",
        shown(&unnamed)
    );
    for row in &pipe_rows {
        ensure!(
            row.hold.is_none() && row.acquisitions.is_none(),
            "tracepoint mode claims hold/acquisitions: {}",
            shown(row)
        );
        ensure!(!row.comms.is_empty(), "no process recorded: {}", shown(row));
        check_percentiles(row, Kind::Wait)?;
    }
    ensure!(report.mode.starts_with("tracepoint"), "mode: {}", report.mode);
    Ok(Outcome::Passed)
}
register!(Kernel trace_sees_the_herds_pipe_locks);

/// The herd's waits outside its pipe's own locks are for the run queues
/// of the wake-up path: its two busiest other-in-pipe-call rows are the
/// run-queue locks of two CPUs, named (the programs check the address
/// against the run queue's pointer to itself), and no row claims a CPU
/// this machine does not have.
fn herds_foreign_locks_are_named() -> Result<Outcome> {
    let limit = if in_vm() { "30000" } else { "300000" };
    let report = match trace_json(
        &["--mode", "tracepoint"],
        &["run", "pipe-herd", "--limit", limit, "-q"],
    )? {
        Ok(report) => report,
        Err(skip) => return Ok(skip),
    };
    let mut others: Vec<(&str, u64, u64)> = report
        .locks
        .iter()
        .filter(|l| l.class == Some(LockClass::OtherInPipeCall))
        .map(|l| {
            let wait = l.wait.as_ref().map_or(0, |w| w.total_ns);
            (l.name.as_str(), wait, l.contentions)
        })
        .collect();
    others.sort_by_key(|(_, wait, _)| std::cmp::Reverse(*wait));
    let cpus = std::thread::available_parallelism()?.get();
    for (name, _, _) in &others {
        if let Some(cpu) = name
            .strip_prefix("rq_lock(cpu ")
            .and_then(|r| r.split(')').next())
        {
            ensure!(cpu.parse::<usize>()? < cpus, "{name}: no such CPU here ({cpus})");
        }
    }
    if cpus < 2 {
        return Ok(Outcome::Skipped("one CPU: one run queue".into()));
    }
    // Under emulation the herd rarely contends a run queue.
    if others.len() < 2 || others[1].2 < 100 {
        if in_vm() {
            return Ok(Outcome::Skipped(format!(
                "too little contention outside the pipe's locks under emulation to judge: {others:?}"
            )));
        }
        bail!("the herd's top other-in-pipe-call rows: {others:?}");
    }
    let top: Vec<&str> = others[..2].iter().map(|(name, _, _)| *name).collect();
    ensure!(
        top.iter().all(|n| n.starts_with("rq_lock(cpu ")) && top[0] != top[1],
        "the two busiest other-in-pipe-call rows are not two CPUs' run-queue locks: {others:?}"
    );
    println!("  busiest other-in-pipe-call rows: {top:?}");
    Ok(Outcome::Passed)
}
register!(Kernel herds_foreign_locks_are_named);

fn trace_of_an_unshared_pipe_has_no_pipe_rows() -> Result<Outcome> {
    // One thread writing and reading its own pipe never waits for anyone. The
    // pipe is told apart by its inode, so other pipelock runs on the machine
    // (a CI job beside this one) cannot make the test pass or fail.
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    let (report, ino) = trace_exact_pipe_io("tracepoint", "pipe-mutex,pipe-wait,other", 200_000)?;
    // Scheduler locks may still be contended by its calls now and then
    // (other-in-pipe-call rows); the pipe's own locks must not be.
    let rows: Vec<_> = pipe_rows(&report, ino)
        .into_iter()
        .filter(|r| is_pipe_lock(r))
        .collect();
    ensure!(
        rows.is_empty(),
        "pipe:[{ino}], used by one thread only, showed contention: {rows:?}"
    );
    Ok(Outcome::Passed)
}
register!(Kernel trace_of_an_unshared_pipe_has_no_pipe_rows);

/// `trace -- COMMAND` records COMMAND's process tree only (here a shell and
/// the churn helper it starts), not a churn that runs beside it.
fn trace_follows_only_the_commands_process_tree() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    let (inside, outside, json) = (
        scratch("tree-in.ino"),
        scratch("tree-out.ino"),
        scratch("tree.json"),
    );
    let helper = std::env::current_exe()?;
    let (pipes_in, pipes_out) = if in_vm() { ("100", "400") } else { ("300", "3000") };
    let mut beside = Command::new(&helper)
        .args(["--pipe-churn", pipes_out, "300"])
        .arg(&outside)
        .spawn()?;
    let script = format!(
        "{} --pipe-churn {pipes_in} 300 {}",
        helper.display(),
        inside.display()
    );
    let out = run(pipelock()
        .arg("trace")
        .arg("--json")
        .arg(&json)
        .args(["--", "sh", "-c", &script]));
    let beside_status = beside.wait()?;
    let (report, made_in, made_out) = (
        fs::read_to_string(&json),
        fs::read_to_string(&inside),
        fs::read_to_string(&outside),
    );
    for path in [&json, &inside, &outside] {
        let _ = fs::remove_file(path);
    }
    let out = out?;
    ensure!(out.status.success(), "trace: {}", text(&out.stderr));
    ensure!(beside_status.success(), "the churn beside the trace failed");
    let report = parse_report(&report?)?;
    let inodes = |text: String| -> Result<std::collections::BTreeSet<u64>> {
        Ok(text.lines().map(str::parse).collect::<Result<_, _>>()?)
    };
    let (made_in, made_out) = (inodes(made_in?)?, inodes(made_out?)?);
    let mut seen_in = 0;
    for row in &report.locks {
        let Some(ino) = row.pipe_ino else {
            continue;
        };
        ensure!(
            !made_out.contains(&ino),
            "a pipe of the process beside COMMAND was traced: {}",
            shown(row)
        );
        seen_in += usize::from(made_in.contains(&ino));
    }
    ensure!(
        seen_in > 0,
        "none of COMMAND's pipes was traced: {}",
        shown(&report)
    );
    println!(
        "  {} rows of COMMAND's {pipes_in} pipes, none of the {pipes_out} beside it ({})",
        seen_in, report.mode
    );
    Ok(Outcome::Passed)
}
register!(Kernel trace_follows_only_the_commands_process_tree);

/// When `--duration` ends, everything COMMAND started ends with it; Ctrl-C
/// does the same, still prints the report, and exits 130.
fn trace_ends_its_commands_process_group() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    for (marker, interrupt) in [("31.25", false), ("31.75", true)] {
        let script = format!("sleep {marker} & sleep {marker}; true");
        let mut child = pipelock()
            .args(["trace", "--mode", "tracepoint"])
            .args(if interrupt {
                &[][..]
            } else {
                &["--duration", "1"][..]
            })
            .args(["--", "sh", "-c", &script])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        if interrupt {
            std::thread::sleep(std::time::Duration::from_millis(1500));
            // COMMAND's own sleeps: pipelock's command line names them too.
            let sleeping = processes_with(&format!("sleep {marker}")).into_iter().any(|pid| {
                fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
            });
            if !sleeping {
                // Still attaching (a busy machine): Ctrl-C then must stop it
                // all the same, before COMMAND starts.
                println!("  Ctrl-C came while pipelock was still attaching");
            }
            // SAFETY: kill(2) on our child.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        }
        let status = child.wait()?;
        let mut stdout = String::new();
        std::io::Read::read_to_string(child.stdout.as_mut().context("stdout")?, &mut stdout)?;
        let want = if interrupt { 130 } else { 0 };
        ensure!(status.code() == Some(want), "exit {status}, want {want}");
        ensure!(stdout.contains("pipelock trace:"), "no report: {stdout}");
        // Its processes may take a moment to be reaped by init.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !processes_with(&format!("sleep {marker}")).is_empty() {
            ensure!(
                std::time::Instant::now() < deadline,
                "COMMAND's background process outlived the trace (interrupted: {interrupt})"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    Ok(Outcome::Passed)
}
register!(Host trace_ends_its_commands_process_group);

fn tracepoint_mode_says_lockref_is_unavailable() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    let (report, _) = trace_stat_storm("tracepoint", 10)?;
    ensure!(
        report.notes.iter().any(|n| n.starts_with("lockref: n/a")),
        "tracepoint mode does not say lockref is unavailable: {:?}",
        report.notes
    );
    ensure!(
        !report.locks.iter().any(|r| r.class == Some(LockClass::Lockref)),
        "tracepoint mode invented lockref rows: {}",
        shown(&report)
    );
    Ok(Outcome::Passed)
}
register!(Kernel tracepoint_mode_says_lockref_is_unavailable);

/// `-c COMM` filters in the kernel: a herd traced with a comm nobody has
/// yields no rows, and with the herd's own comm only its processes.
fn comm_filter_keeps_only_that_command() -> Result<Outcome> {
    let limit = if in_vm() { "20000" } else { "50000" };
    let herd = ["run", "pipe-herd", "-k", "5", "--limit", limit, "-q"];
    let report = match trace_json(&["--mode", "tracepoint", "-c", "no-such-comm"], &herd)? {
        Ok(report) => report,
        Err(skip) => return Ok(skip),
    };
    ensure!(
        report.locks.is_empty(),
        "-c no-such-comm still recorded: {}",
        shown(&report.locks)
    );
    // Tracepoint mode sees contended waits only, and under emulation a
    // herd may contend a handful of times or none (9 in a typical 6.18
    // guest run): a run that recorded nothing is tried again.
    let mut attempts = 0;
    let report = loop {
        attempts += 1;
        let report = match trace_json(&["--mode", "tracepoint", "-c", "pipelock"], &herd)? {
            Ok(report) => report,
            Err(skip) => return Ok(skip),
        };
        if !report.locks.is_empty() || attempts == 5 {
            break report;
        }
    };
    let rows = &report.locks;
    ensure!(
        !rows.is_empty(),
        "-c pipelock recorded nothing of its own herd in {attempts} runs: {}",
        shown(&report)
    );
    let contended: u64 = rows.iter().map(|r| r.contentions).sum();
    println!(
        "  -c pipelock: {} rows, {contended} contended waits (run {attempts})",
        rows.len()
    );
    for row in rows {
        ensure!(
            row.comms.iter().all(|c| c.starts_with("pipelock(")),
            "a process other than pipelock on a -c pipelock row: {}",
            shown(row)
        );
    }
    Ok(Outcome::Passed)
}
register!(Kernel comm_filter_keeps_only_that_command);

/// `--interval --reset --csv`: a file that loads as one table (one header,
/// a timestamp column, equal row lengths), several intervals, and per-lock
/// interval figures that add up exactly to the whole run's (`--json`).
fn interval_csv_reads_back_and_adds_up_to_the_run() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    let (csv_path, json_path) = (scratch("interval.csv"), scratch("interval.json"));
    let facts = scratch("interval.facts");
    // Waits made by construction over 40 rounds of at least 2 ms each:
    // several intervals see some, on a busy machine too.
    let out = run(pipelock()
        .args([
            "trace",
            "--mode",
            "tracepoint",
            "--interval",
            "0.05",
            "--reset",
            "--csv",
        ])
        .arg(&csv_path)
        .arg("--json")
        .arg(&json_path)
        .arg("--")
        .arg(std::env::current_exe()?)
        .args(["--uffd-holder", "40", "--fault-ms", "2", "--pipes", "4"])
        .arg(&facts))?;
    let (csv_text, json_text) = (fs::read(&csv_path), fs::read_to_string(&json_path));
    let _ = (
        fs::remove_file(&csv_path),
        fs::remove_file(&json_path),
        fs::remove_file(&facts),
    );
    ensure!(out.status.success(), "trace --interval: {}", text(&out.stderr));
    ensure!(
        text(&out.stdout).contains("--- whole run ---"),
        "no whole-run report after the intervals"
    );
    let csv_text = csv_text?;
    let mut reader = csv::Reader::from_reader(csv_text.as_slice());
    let headers = reader.headers()?.clone();
    ensure!(&headers[0] == "timestamp", "first column {:?}", &headers[0]);
    let column = |name: &str| headers.iter().position(|h| h == name).context(name.to_owned());
    let (addr_col, name_col, contended_col) = (column("lock_addr")?, column("name")?, column("contentions")?);
    let mut stamps = std::collections::BTreeSet::new();
    // A lock instance is its address and its name (the pipe it belongs to, or
    // whose call contended it): one address can carry several.
    let mut per_lock: std::collections::HashMap<(String, String), u64> = std::collections::HashMap::new();
    for record in reader.records() {
        let record = record?;
        ensure!(record.len() == headers.len(), "ragged row: {record:?}");
        stamps.insert(record[0].to_owned());
        *per_lock
            .entry((record[addr_col].to_owned(), record[name_col].to_owned()))
            .or_default() += record[contended_col].parse::<u64>()?;
    }
    ensure!(stamps.len() >= 2, "want several intervals, got {stamps:?}");
    let report = parse_report(&json_text?)?;
    let locks = &report.locks;
    ensure!(!locks.is_empty(), "the whole run saw no lock");
    for lock in locks {
        let addr = format!("{:#x}", lock.lock_addr);
        let name = lock.name.clone();
        let total = lock.contentions;
        let summed = per_lock.get(&(addr.clone(), name.clone()));
        ensure!(
            summed == Some(&total),
            "{addr} {name}: intervals add up to {summed:?}, the whole run says {total}"
        );
    }
    println!("  {} intervals, {} locks", stamps.len(), locks.len());
    Ok(Outcome::Passed)
}
register!(Kernel interval_csv_reads_back_and_adds_up_to_the_run);

/// The report's first three lines as a new user sees them (`auto`): each
/// within 100 columns, the mode, what it measures, the modes refused.
fn trace_first_lines_fit_100_columns() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    let fentry_refused = mode_refusal("fentry")?.is_some();
    let hooked = !fentry_refused || mode_refusal("kprobe")?.is_none();
    let bin = pipelock_path();
    let out = run(pipelock().args(["trace", "--"]).arg(&bin).args([
        "run",
        "pipe-herd",
        "-k",
        "2",
        "--limit",
        "5000",
        "-q",
    ]))?;
    ensure!(out.status.success(), "pipelock trace: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("pipelock trace: kernel "))
        .take(3)
        .collect();
    ensure!(lines.len() == 3, "no report header:\n{stdout}");
    for line in &lines {
        ensure!(
            line.chars().count() <= 100,
            "{} columns: {line:?}",
            line.chars().count()
        );
    }
    let measured = pipelock_user::render::header::measured(hooked);
    ensure!(
        lines[1] == measured,
        "the second line is {:?}, want {measured:?}",
        lines[1]
    );
    if fentry_refused {
        ensure!(
            lines[2].starts_with("refused here: fentry (") && lines[2].ends_with("; details: pipelock probe"),
            "the third line: {:?}",
            lines[2]
        );
    }
    ensure!(
        !stdout.contains("os error") && !stdout.contains("LOCK_STATS"),
        "loader errors or map names in the report:\n{stdout}"
    );
    println!("  {}", lines.join("\n  "));
    Ok(Outcome::Passed)
}
register!(Kernel trace_first_lines_fit_100_columns);
