//! `deploy/pipelock.service` against what `pipelock serve` really does:
//! every system call it makes is one the unit's filter allows, and the
//! exposure score `systemd-analyze security` gives the unit is the one the
//! manual states. (No systemd runs here as PID 1, so the unit itself is not
//! started; `serve_runs_with_the_units_capabilities` runs serve with its
//! capabilities.)
use std::{
    collections::BTreeSet,
    process::Stdio,
    time::{Duration, Instant},
};

use super::{
    serve::{free_port, http_get, samples},
    *,
};

fn unit_text() -> Result<String> {
    Ok(fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/pipelock.service"
    ))?)
}

fn has(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// The system calls an allow-list entry stands for: a name, or a group
/// `systemd-analyze syscall-filter` expands (groups nest).
fn expand(entry: &str, into: &mut BTreeSet<String>) -> Result<()> {
    if !entry.starts_with('@') {
        into.insert(entry.to_owned());
        return Ok(());
    }
    let out = run(Command::new("systemd-analyze").args(["syscall-filter", entry]))?;
    ensure!(
        out.status.success(),
        "systemd-analyze syscall-filter {entry}: {}",
        text(&out.stderr)
    );
    for line in text(&out.stdout).lines().skip(1) {
        let item = line.trim();
        if item.is_empty() || item.starts_with('#') {
            continue;
        }
        if item.starts_with('@') {
            expand(item, into)?;
        } else {
            into.insert(item.to_owned());
        }
    }
    Ok(())
}

/// The system call names of an `strace -f -o` log.
fn traced_calls(log: &str) -> BTreeSet<String> {
    log.lines()
        .filter_map(|line| {
            // "1234  name(args) = 0", "1234  name(args <unfinished ...>"
            let call = line.split_once(char::is_whitespace)?.1.trim_start();
            let name: String = call
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            (!name.is_empty() && call[name.len()..].starts_with('(')).then_some(name)
        })
        .collect()
}

/// `pipelock serve`, with TLS and basic auth, traced by strace from start
/// to SIGTERM while it is scraped and pipe-mutex waits are made
/// ([`why::contend`]): each system call it made
/// must be allowed by the unit's `SystemCallFilter=`.
fn the_units_syscall_filter_allows_what_serve_calls() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    for tool in ["strace", "systemd-analyze", "openssl", "curl"] {
        if !has(tool) {
            return Ok(Outcome::Skipped(format!("{tool} is not installed")));
        }
    }
    let unit = unit_text()?;
    let mut allowed = BTreeSet::new();
    for line in unit.lines().filter_map(|l| l.strip_prefix("SystemCallFilter=")) {
        ensure!(!line.starts_with('~'), "the unit's filter is an allow list");
        for entry in line.split_whitespace() {
            expand(entry, &mut allowed)?;
        }
    }
    ensure!(allowed.len() > 50, "the unit allows only {allowed:?}");

    let dir = scratch("unit-syscalls");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    serve_fleet::certificates(&dir)?;
    let hash = bcrypt::hash("pw", 4)?;
    fs::write(
        dir.join("web.yml"),
        format!(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\nbasic_auth_users:\n  p: '{hash}'\n"
        ),
    )?;
    let port = free_port()?;
    let log = dir.join("strace.log");
    let bin = pipelock_path();
    let mut strace = Command::new("strace")
        .args(["-f", "-qq", "-o"])
        .arg(&log)
        .arg(&bin)
        .args([
            "serve",
            "--mode",
            "tracepoint",
            "--interval",
            "0.5",
            "--ebpf-log",
            "--listen",
        ])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--web-config")
        .arg(dir.join("web.yml"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let ca = dir.join("ca.crt");
    let scrape = || -> Result<String> {
        let out = run(Command::new("curl")
            .args(["-sf", "--max-time", "10", "-u", "p:pw", "--cacert"])
            .arg(&ca)
            .arg(format!("https://127.0.0.1:{port}/metrics")))?;
        ensure!(out.status.success(), "curl: {:?}", out.status);
        Ok(text(&out.stdout))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while scrape().is_err() {
        if let Some(status) = strace.try_wait()? {
            bail!("serve under strace exited with {status}");
        }
        ensure!(Instant::now() < deadline, "serve under strace never answered");
        std::thread::sleep(Duration::from_millis(250));
    }
    why::contend(20, 1)?;
    std::thread::sleep(Duration::from_millis(1500));
    let scraped = samples(&scrape()?);
    ensure!(
        scraped
            .keys()
            .any(|k| k.starts_with("pipelock_lock_contentions_total")),
        "no contentions in the scrape"
    );
    // Plain HTTP and no credentials: the refusal paths run too.
    let _ = http_get(port, "/metrics", None);
    let _ = run(Command::new("curl")
        .args(["-s", "--max-time", "5", "--cacert"])
        .arg(&ca)
        .arg(format!("https://127.0.0.1:{port}/metrics")));
    // SIGTERM to pipelock itself (strace's child): the exit path is traced too.
    let children = fs::read_to_string(format!("/proc/{0}/task/{0}/children", strace.id()))?;
    let pid: i32 = children
        .split_whitespace()
        .next()
        .context("strace has no child")?
        .parse()?;
    // SAFETY: a signal to a process this test started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = strace.wait()?;
    ensure!(status.success(), "serve under strace: {status}");
    let calls = traced_calls(&fs::read_to_string(&log)?);
    ensure!(
        calls.contains("bpf") && calls.contains("accept4"),
        "strace saw {calls:?}"
    );
    let denied: Vec<&String> = calls.iter().filter(|c| !allowed.contains(*c)).collect();
    ensure!(
        denied.is_empty(),
        "serve made system calls the unit's SystemCallFilter= denies: {denied:?}"
    );
    let _ = fs::remove_dir_all(&dir);
    println!(
        "  {} distinct system calls made, all among the {} the unit allows",
        calls.len(),
        allowed.len()
    );
    Ok(Outcome::Passed)
}
register!(Host the_units_syscall_filter_allows_what_serve_calls);

/// docs/fleet.md states the unit's `systemd-analyze security` exposure; a
/// change to the unit that moves it must move the manual too.
fn the_units_security_score_is_the_documented_one() -> Result<Outcome> {
    if !has("systemd-analyze") {
        return Ok(Outcome::Skipped("systemd-analyze is not installed".into()));
    }
    // --offline reads the file as it is; it must be named like a unit.
    let dir = scratch("unit-score");
    fs::create_dir_all(&dir)?;
    let unit = dir.join("pipelock.service");
    fs::write(&unit, unit_text()?)?;
    let out = run(Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(&unit))?;
    let report = text(&out.stdout);
    let score = report
        .lines()
        .find_map(|l| l.split_once("Overall exposure level for pipelock.service: "))
        .map(|(_, s)| s.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
        .context("no overall exposure level")?;
    let manual = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/fleet.md"))?;
    ensure!(
        manual.contains(&format!("exposure level {score}")),
        "systemd-analyze security gives the unit {score}; docs/fleet.md says otherwise"
    );
    let _ = fs::remove_dir_all(&dir);
    println!("  systemd-analyze security: {score}, as docs/fleet.md says");
    Ok(Outcome::Passed)
}
register!(Host the_units_security_score_is_the_documented_one);
