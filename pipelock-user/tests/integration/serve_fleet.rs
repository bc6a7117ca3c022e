//! `pipelock serve` where anyone on the network reaches it: TLS and basic
//! auth from an exporter-toolkit web configuration, checked with curl and a
//! real Prometheus; clients that misbehave on purpose; capabilities dropped
//! once the programs are attached.
use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    process::Stdio,
    time::{Duration, Instant},
};

use super::{
    serve::{Serve, free_port, http_get, prometheus_query, start_prometheus, start_serve},
    *,
};

/// A CA, a server certificate for 127.0.0.1 and a client certificate it
/// signed, made with openssl in `dir`.
pub(super) fn certificates(dir: &Path) -> Result<()> {
    let sh = |script: &str| -> Result<()> {
        let out = run(Command::new("sh").arg("-ec").arg(script).current_dir(dir))?;
        ensure!(out.status.success(), "openssl: {}", text(&out.stderr));
        Ok(())
    };
    sh("openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=pipelock-test-ca \
        -keyout ca.key -out ca.crt 2>/dev/null
        printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > server.ext
        openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key -out server.csr 2>/dev/null
        openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
          -extfile server.ext -out server.crt 2>/dev/null
        printf 'extendedKeyUsage=clientAuth\\n' > client.ext
        openssl req -newkey rsa:2048 -nodes -subj /CN=prometheus -keyout client.key -out client.csr 2>/dev/null
        openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
          -extfile client.ext -out client.crt 2>/dev/null")
}

/// curl's HTTP status for `url` with `args`, or None where curl got no
/// HTTP answer at all (refused handshake, connection closed).
fn curl(args: &[&str], url: &str) -> Result<Option<u16>> {
    let out = run(Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10"])
        .args(args)
        .arg(url))?;
    let code: u16 = text(&out.stdout).trim().parse().unwrap_or(0);
    Ok((out.status.success() && code != 0).then_some(code))
}

const PASSWORD: &str = "correct horse battery staple";

/// TLS with client certificates and basic auth: curl is answered only with
/// the certificate and the password (401 without or with a wrong password,
/// no answer in plain HTTP or without a client certificate), wrong
/// passwords in a burst do not slow a scraper that knows its own, and
/// Debian's Prometheus scrapes it with `tls_config` and `basic_auth` (a
/// second job with a wrong password is down).
fn serve_speaks_tls_and_basic_auth() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    for tool in ["openssl", "curl"] {
        if Command::new(tool).arg("--version").output().is_err() {
            return Ok(Outcome::Skipped(format!("{tool} is not installed")));
        }
    }
    let dir = scratch("web-config");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    certificates(&dir)?;
    let hash = bcrypt::hash(PASSWORD, 10)?;
    // Relative paths: relative to the file, as in the exporter-toolkit.
    fs::write(
        dir.join("web.yml"),
        format!(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  \
             client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n\
             basic_auth_users:\n  prometheus: '{hash}'\n"
        ),
    )?;
    let port = free_port()?;
    let web = dir.join("web.yml");
    let mut serve = Serve {
        child: pipelock()
            .args(["serve", "--mode", "tracepoint", "--interval", "0.5", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--web-config")
            .arg(&web)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?,
        port,
    };
    let d = dir.display();
    let (ca, cert, key) = (
        format!("{d}/ca.crt"),
        format!("{d}/client.crt"),
        format!("{d}/client.key"),
    );
    let user = format!("prometheus:{PASSWORD}");
    let https = |path: &str| format!("https://127.0.0.1:{port}{path}");
    let full = ["--cacert", &ca, "--cert", &cert, "--key", &key, "-u", &user];
    let deadline = Instant::now() + Duration::from_secs(30);
    // 503 until the first collection is published.
    while curl(&full, &https("/metrics"))? != Some(200) {
        serve.still_running("serve --web-config")?;
        ensure!(Instant::now() < deadline, "serve over TLS never answered");
        std::thread::sleep(Duration::from_millis(200));
    }
    let with_cert = ["--cacert", &ca, "--cert", &cert, "--key", &key];
    let wrong = "prometheus:wrong".to_owned();
    let stranger = format!("grafana:{PASSWORD}");
    let cases: [(&str, Vec<&str>, String, Option<u16>); 6] = [
        (
            "certificate and password",
            full.to_vec(),
            https("/metrics"),
            Some(200),
        ),
        ("no credentials", with_cert.to_vec(), https("/metrics"), Some(401)),
        (
            "a wrong password",
            [&with_cert[..], &["-u", &wrong]].concat(),
            https("/metrics"),
            Some(401),
        ),
        (
            "an unknown user",
            [&with_cert[..], &["-u", &stranger]].concat(),
            https("/metrics"),
            Some(401),
        ),
        (
            "no client certificate",
            vec!["--cacert", &ca, "-u", &user],
            https("/metrics"),
            None,
        ),
        (
            "plain HTTP",
            vec!["-u", &user],
            format!("http://127.0.0.1:{port}/metrics"),
            None,
        ),
    ];
    for (what, args, url, expected) in &cases {
        let got = curl(args, url)?;
        ensure!(
            got == *expected,
            "{what}: curl got {got:?}, expected {expected:?}"
        );
    }
    // A burst of wrong passwords (bcrypt at cost 10 each) beside a scraper
    // whose password passed before: the scraper is not queued behind them.
    let burst: Vec<_> = (0..8)
        .map(|_| {
            let args: Vec<String> = [&with_cert[..], &["-u", &wrong]]
                .concat()
                .iter()
                .map(|s| (*s).to_owned())
                .collect();
            let url = https("/metrics");
            std::thread::spawn(move || {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                curl(&args, &url)
            })
        })
        .collect();
    let started = Instant::now();
    let good = curl(&full, &https("/metrics"))?;
    let took = started.elapsed();
    for refused in burst {
        let got = refused.join().map_err(|_| anyhow::anyhow!("curl thread"))??;
        ensure!(got == Some(401), "wrong password in a burst: {got:?}");
    }
    ensure!(good == Some(200), "the scraper during the burst: {good:?}");
    ensure!(
        took < Duration::from_millis(500),
        "the scraper waited {took:?} behind wrong passwords"
    );

    let prometheus_note = match prometheus_over_tls(&dir, port, &ca, &cert, &key)? {
        Some(note) => note,
        None => "prometheus: skipped (not installed; `cargo xtask test` installs it)".to_owned(),
    };
    println!(
        "  curl: 200 with certificate and password, 401 without or wrong, no answer in plain HTTP \
         or without a client certificate; a scrape beside 8 wrong passwords took {took:?}; {prometheus_note}"
    );
    let _ = fs::remove_dir_all(&dir);
    Ok(Outcome::Passed)
}
register!(Host serve_speaks_tls_and_basic_auth);

/// Debian's Prometheus scraping over TLS with a client certificate and basic
/// auth; None where it is not installed.
fn prometheus_over_tls(dir: &Path, port: u16, ca: &str, cert: &str, key: &str) -> Result<Option<String>> {
    let prometheus = "/usr/bin/prometheus";
    if !Path::new(prometheus).exists() {
        return Ok(None);
    }
    let job = |name: &str, password: &str| {
        format!(
            "  - job_name: {name}\n    scheme: https\n    tls_config:\n      ca_file: {ca}\n      \
             cert_file: {cert}\n      key_file: {key}\n    basic_auth:\n      username: prometheus\n      \
             password: '{password}'\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
        )
    };
    let config = dir.join("prometheus.yml");
    fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n{}{}",
            job("pipelock", PASSWORD),
            job("pipelock-wrong-password", "wrong")
        ),
    )?;
    let server = start_prometheus(prometheus, &config, dir)?;
    let query = |q: &str| prometheus_query(server.port, q).ok().flatten();
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let (up, wrong, info) = (
            query("up{job=\"pipelock\"}"),
            query("up{job=\"pipelock-wrong-password\"}"),
            query("pipelock_info{job=\"pipelock\"}"),
        );
        if up == Some(1.0) && wrong == Some(0.0) && info == Some(1.0) {
            return Ok(Some(
                "prometheus over TLS with basic auth: up 1, pipelock_info scraped; with a wrong password: up 0"
                    .to_owned(),
            ));
        }
        ensure!(
            Instant::now() < deadline,
            "prometheus over TLS: up {up:?}, wrong-password job up {wrong:?}, pipelock_info {info:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Open sockets of a process.
fn sockets(pid: u32) -> Result<usize> {
    Ok(fs::read_dir(format!("/proc/{pid}/fd"))?
        .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count())
}

/// A well-behaved scrape: 200 within a second.
fn scrape_ok(port: u16) -> Result<Duration> {
    let started = Instant::now();
    let (status, _, body) = http_get(port, "/metrics", None)?;
    let took = started.elapsed();
    ensure!(
        status == 200 && body.contains("pipelock_info"),
        "scrape: {status}"
    );
    ensure!(took < Duration::from_secs(1), "scrape took {took:?}");
    Ok(took)
}

/// Whether the server closed `stream` (EOF or reset) within `wait`.
fn closed_by_server(stream: &TcpStream, wait: Duration) -> bool {
    let _ = stream.set_read_timeout(Some(wait));
    let mut stream = stream;
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            // A 408 or 431 before closing is fine: read on to the end.
            Ok(_) => {}
            Err(err) => {
                return !matches!(
                    err.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                );
            }
        }
    }
}

/// Clients that misbehave on purpose, one kind at a time, while a
/// well-behaved scraper keeps asking: slowloris (a request head one byte a
/// second) dropped after the head timeout, an oversized head refused, a
/// flood of silent connections that cannot lock the scraper out, and a
/// thousand scrapes that leave the RSS where it was.
fn serve_shrugs_off_misbehaving_clients() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    let serve = start_serve(&["--mode", "tracepoint"])?;
    let (port, pid) = (serve.port, serve.child.id());
    for _ in 0..50 {
        scrape_ok(port)?;
    }
    let rss_before = soak::rss_kb(pid)?;

    // Slowloris: 20 heads trickling in, a byte a second.
    let slow: Vec<TcpStream> = (0..20)
        .map(|_| -> Result<TcpStream> {
            let mut s = TcpStream::connect(("127.0.0.1", port))?;
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")?;
            Ok(s)
        })
        .collect::<Result<_>>()?;
    let started = Instant::now();
    let mut worst = Duration::ZERO;
    let mut dropped_after = None;
    while started.elapsed() < Duration::from_secs(12) {
        for mut s in &slow {
            let _ = s.write_all(b"X");
        }
        worst = worst.max(scrape_ok(port)?);
        if dropped_after.is_none() && closed_by_server(&slow[0], Duration::from_millis(10)) {
            dropped_after = Some(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let still_open = slow
        .iter()
        .filter(|s| !closed_by_server(s, Duration::from_millis(50)))
        .count();
    ensure!(
        still_open == 0,
        "{still_open} of 20 slowloris connections still open after 12 s"
    );
    let dropped_after = dropped_after.context("no slowloris connection was dropped")?;

    // A request head larger than the server buffers.
    let mut big = TcpStream::connect(("127.0.0.1", port))?;
    let header = format!(
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Junk: {}\r\n\r\n",
        "a".repeat(256 * 1024)
    );
    let _ = big.write_all(header.as_bytes());
    let mut answer = Vec::new();
    big.set_read_timeout(Some(Duration::from_secs(5)))?;
    let _ = big.read_to_end(&mut answer);
    let answer = text(&answer);
    ensure!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "an oversized head was answered: {}",
        answer.lines().next().unwrap_or("")
    );
    scrape_ok(port)?;

    // 300 silent connections: the scraper still gets through, and the
    // server holds no more than its cap.
    let flood: Vec<TcpStream> = (0..300)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut flood_worst = Duration::ZERO;
    for _ in 0..10 {
        flood_worst = flood_worst.max(scrape_ok(port)?);
    }
    let held = sockets(pid)?;
    ensure!(
        held <= 64 + 8,
        "the server holds {held} sockets under a flood of 300 connections"
    );
    drop(flood);

    // A thousand scrapes more; the RSS stays where it was.
    for _ in 0..1000 {
        scrape_ok(port)?;
    }
    let rss_after = soak::rss_kb(pid)?;
    let growth = rss_after.saturating_sub(rss_before);
    ensure!(
        growth <= 4096 + rss_before / 20,
        "RSS grew from {rss_before} KiB to {rss_after} KiB"
    );
    println!(
        "  slowloris: 20 dropped (the first after {dropped_after:.1?}), scrapes meanwhile ≤ {worst:.1?}; \
         a 256 KiB head refused; 300 silent connections: {held} sockets held, scrapes ≤ {flood_worst:.1?}; \
         RSS {rss_before} → {rss_after} KiB over 1 050 scrapes"
    );
    Ok(Outcome::Passed)
}
register!(Host serve_shrugs_off_misbehaving_clients);

/// The capability sets of every thread of `pid`: (effective, permitted).
pub(super) fn thread_caps(pid: u32) -> Result<Vec<(String, u64, u64)>> {
    let mut out = Vec::new();
    for task in fs::read_dir(format!("/proc/{pid}/task"))? {
        let task = task?;
        let status = fs::read_to_string(task.path().join("status"))?;
        let field = |name: &str| -> Result<u64> {
            let hex = status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .context("no capability line")?;
            Ok(u64::from_str_radix(hex.trim(), 16)?)
        };
        let name = status
            .lines()
            .find_map(|l| l.strip_prefix("Name:"))
            .unwrap_or("")
            .trim()
            .to_owned();
        out.push((name, field("CapEff:")?, field("CapPrm:")?));
    }
    Ok(out)
}

/// Once attached, `serve` (run as root here) holds no capability in any
/// thread, and keeps collecting: the contended waits made beside it reach the scrape.
fn serve_drops_its_capabilities_once_attached() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    let serve = start_serve(&["--mode", "tracepoint", "--ebpf-log"])?;
    let caps = thread_caps(serve.child.id())?;
    let kept: Vec<_> = caps
        .iter()
        .filter(|(_, eff, prm)| *eff != 0 || *prm != 0)
        .collect();
    ensure!(kept.is_empty(), "threads that kept capabilities: {kept:?}");
    let (_, made) = why::contend(20, 1)?;
    std::thread::sleep(Duration::from_millis(1500));
    let scraped = serve::samples(&http_get(serve.port, "/metrics", None)?.2);
    let contentions = scraped
        .get("pipelock_lock_contentions_total{class=\"pipe_mutex\"}")
        .copied()
        .unwrap_or(0.0);
    ensure!(
        contentions >= made as f64,
        "{contentions} pipe-mutex contentions collected after the capabilities were dropped; {made} were made"
    );
    println!(
        "  {} threads, none with a capability; {contentions} pipe-mutex contentions collected after the drop",
        caps.len()
    );
    Ok(Outcome::Passed)
}
register!(Kernel serve_drops_its_capabilities_once_attached);

/// Without a capability loading needs, pipelock says which one is missing,
/// in one line, before loading anything.
fn a_missing_capability_is_named() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    let mut nobody = match pipelock_as_nobody_with("+bpf") {
        Ok(cmd) => cmd,
        Err(skip) => return Ok(skip),
    };
    let out = run(nobody.args(["trace", "--mode", "tracepoint", "--", "true"]))?;
    let stderr = text(&out.stderr);
    ensure!(
        !out.status.success() && stderr.trim().lines().count() == 1 && stderr.contains("lacks CAP_PERFMON"),
        "with CAP_BPF only: {:?} {stderr}",
        out.status
    );
    println!("  with CAP_BPF only: {}", stderr.trim());
    Ok(Outcome::Passed)
}
register!(Host a_missing_capability_is_named);

/// `trace` as nobody with CAP_BPF and CAP_PERFMON only: it attaches and
/// counts the pipe-mutex waits made beside it (by root: the helper that
/// makes them needs userfaultfd), and says what it could not do without
/// the other capabilities (kallsyms without CAP_SYSLOG, run-time
/// statistics without CAP_SYS_ADMIN).
fn trace_runs_with_cap_bpf_and_cap_perfmon_alone() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    let mut nobody = match pipelock_as_nobody_with("+bpf,+perfmon") {
        Ok(cmd) => cmd,
        Err(skip) => return Ok(skip),
    };
    // Where nobody may write.
    let json = std::env::temp_dir().join(format!("pipelock-it-{}-nobody.json", std::process::id()));
    let _ = fs::remove_file(&json);
    let mut child = nobody
        .args(["trace", "--mode", "tracepoint", "--bpf-stats", "--all", "--json"])
        .arg(&json)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    // stderr, read until pipelock says it is tracing, then to its end.
    let (attached_tx, attached_rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().context("no stderr")?;
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(std::io::Result::ok) {
            if line.contains("Ctrl-C to stop") {
                let _ = attached_tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let attached = attached_rx.recv_timeout(Duration::from_secs(60)).is_ok();
    let made = if attached { Some(why::contend(20, 1)) } else { None };
    // SAFETY: a signal to our own child (setpriv execs pipelock in place).
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait()?;
    let stderr = reader
        .join()
        .map_err(|_| anyhow::anyhow!("the stderr reader panicked"))?;
    ensure!(attached, "trace as nobody never said it was tracing: {stderr}");
    let (ino, made) = made.context("no waits made")??;
    ensure!(
        status.code() == Some(130),
        "trace as nobody, stopped by Ctrl-C: {status:?}, want 130 {stderr}"
    );
    let report = parse_report(&fs::read_to_string(&json)?)?;
    let _ = fs::remove_file(&json);
    let notes = report.notes.join(" | ");
    ensure!(
        notes.contains("lacks CAP_SYSLOG"),
        "no note of the missing CAP_SYSLOG: {notes:.2000}"
    );
    ensure!(
        stderr.contains("needs CAP_SYS_ADMIN"),
        "no word of the run-time statistics: {stderr}"
    );
    let pipe = format!("pipe:[{ino}]");
    let contended: u64 = report
        .locks
        .iter()
        .filter(|row| {
            row.class == Some(pipelock_user::model::LockClass::PipeMutex) && row.pipe_ino == Some(ino)
        })
        .map(|row| row.contentions)
        .sum();
    ensure!(
        contended >= made,
        "as nobody: {contended} contended waits on the mutex of {pipe}, {made} were made: {notes:.2000}"
    );
    println!(
        "  as nobody with CAP_BPF and CAP_PERFMON: {contended} contended waits on the mutex of {pipe} \
         ({made} made); CAP_SYSLOG and CAP_SYS_ADMIN named where missing"
    );
    Ok(Outcome::Passed)
}
register!(Host trace_runs_with_cap_bpf_and_cap_perfmon_alone);
