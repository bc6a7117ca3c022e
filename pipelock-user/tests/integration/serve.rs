//! `pipelock serve`, scraped: both exposition formats, the histograms'
//! shape, agreement with a `pipelock trace` of the same herd, a real
//! Prometheus scraping it (where installed), signals and bad addresses.
use std::{
    collections::BTreeMap,
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use pipelock_user::model::{LockClass, TraceReport};

use super::*;

/// A loopback port nothing listens on now.
pub(super) fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// One HTTP/1.1 GET on loopback: (status, content type, body).
pub(super) fn http_get(port: u16, path: &str, accept: Option<&str>) -> Result<(u16, String, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{accept}Connection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").context("no header end")?;
    let status = head.split_whitespace().nth(1).context("no status")?.parse()?;
    let content_type = head
        .lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        })
        .map(|(_, v)| v.trim().to_owned())
        .unwrap_or_default();
    // axum answers with a length, or chunked: a chunked body is decoded.
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        let mut out = String::new();
        let mut rest = body;
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let size = usize::from_str_radix(size.trim(), 16)?;
            if size == 0 {
                break;
            }
            out.push_str(tail.get(..size).context("short chunk")?);
            rest = tail.get(size + 2..).unwrap_or("");
        }
        out
    } else {
        body.to_owned()
    };
    Ok((status, content_type, body))
}

/// A running `pipelock serve`, stopped (SIGKILL) if a test fails midway.
pub(super) struct Serve {
    pub child: Child,
    pub port: u16,
}

impl Serve {
    /// Fails, with its stderr, if `what` (this serve) has exited.
    pub(super) fn still_running(&mut self, what: &str) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            let mut stderr = String::new();
            if let Some(mut pipe) = self.child.stderr.take() {
                let _ = pipe.read_to_string(&mut stderr);
            }
            bail!("{what} exited with {status}: {stderr}");
        }
        Ok(())
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `pipelock serve ARGS` on a free port and waits for `/healthz`
/// to say "ok" (its first collection done).
pub(super) fn start_serve(args: &[&str]) -> Result<Serve> {
    let port = free_port()?;
    let child = pipelock()
        .arg("serve")
        .args(["--listen", &format!("127.0.0.1:{port}"), "--interval", "0.5"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut serve = Serve { child, port };
    let deadline = Instant::now() + Duration::from_secs(if in_vm() { 120 } else { 30 });
    loop {
        serve.still_running("serve")?;
        if let Ok((200, _, body)) = http_get(port, "/healthz", None)
            && body.starts_with("ok")
        {
            return Ok(serve);
        }
        ensure!(Instant::now() < deadline, "serve never became healthy");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `name{labels}` → value, for every sample of a text exposition.
pub(super) fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The buckets of one histogram series (`name`, labels without `le`), by
/// upper bound, `+Inf` last.
fn buckets_of(samples: &BTreeMap<String, f64>, name: &str, labels: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{le=\"");
    let mut out: Vec<(f64, f64)> = samples
        .iter()
        .filter_map(|(series, value)| {
            let rest = series.strip_prefix(&prefix)?;
            let (le, tail) = rest.split_once('"')?;
            (tail == format!(",{labels}}}")).then(|| {
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((le, *value))
            })?
        })
        .collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// Every histogram of the scrape is cumulative, ends in `+Inf`, and its
/// `+Inf` bucket equals its `_count`; a class's wait `_count` is its
/// contentions counter (tracepoint mode) or acquisitions (hooked).
fn histograms_are_well_formed(samples: &BTreeMap<String, f64>, hooked: bool) -> Result<usize> {
    let mut checked = 0;
    for (series, count) in samples.iter().filter(|(s, _)| s.contains("_seconds_count{")) {
        let (name, labels) = series.split_once("_count{").context("series")?;
        let labels = labels.trim_end_matches('}');
        let buckets = buckets_of(samples, name, labels);
        ensure!(!buckets.is_empty(), "{series}: no buckets");
        ensure!(
            buckets.windows(2).all(|w| w[0].1 <= w[1].1),
            "{series}: buckets not cumulative: {buckets:?}"
        );
        let last = buckets.last().context("buckets")?;
        ensure!(
            last.0.is_infinite() && last.1 == *count,
            "{series}: +Inf bucket {last:?}, count {count}"
        );
        if name == "pipelock_lock_wait_seconds" {
            let counter = if hooked { "acquisitions" } else { "contentions" };
            let key = format!("pipelock_lock_{counter}_total{{{labels}}}");
            ensure!(
                samples.get(&key) == Some(count),
                "{series} = {count}, but {key} = {:?}",
                samples.get(&key)
            );
        }
        checked += 1;
    }
    ensure!(checked > 0, "no histogram in the scrape");
    Ok(checked)
}

/// The exporter against a trace of the same herd, in the mode this kernel
/// does best (tracepoint here, fentry in the VMs): both formats, well-formed
/// histograms, the pipe-mutex contentions of the herd equal to the trace's
/// (the exporter is system-wide: within 2 % and a few events).
fn serve_exports_what_a_trace_of_the_same_herd_sees() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    let mode = if in_vm() && mode_refusal("fentry")?.is_none() {
        "fentry"
    } else {
        "tracepoint"
    };
    let serve = start_serve(&["--mode", mode, "--per-lock-top", "100"])?;
    let scrape = || -> Result<BTreeMap<String, f64>> {
        let (status, _, body) = http_get(serve.port, "/metrics", None)?;
        ensure!(status == 200, "/metrics: {status}");
        Ok(samples(&body))
    };
    let limit = if in_vm() { "20000" } else { "200000" };
    let mutex_contentions = |report: &TraceReport| -> u64 {
        report
            .locks
            .iter()
            .filter(|l| l.class == Some(LockClass::PipeMutex))
            .map(|l| l.contentions)
            .sum()
    };
    // A herd contends only while two of its members run at once, which a
    // busy machine need not allow: again (up to 5 times) until it did.
    let mut attempt = 1;
    let (before, report) = loop {
        let before = scrape()?;
        let report = match trace_json(&["--mode", mode], &["run", "pipe-herd", "--limit", limit, "-q"])? {
            Ok(report) => report,
            Err(skip) => return Ok(skip),
        };
        if mutex_contentions(&report) > 0 || attempt == 5 {
            break (before, report);
        }
        println!("  attempt {attempt}: the herd contended no pipe mutex; again");
        attempt += 1;
    };
    // Until two collections in a row add nothing: what the herd did is
    // then in the exporter's totals (a collection takes a while under
    // emulation).
    let key = "pipelock_lock_contentions_total{class=\"pipe_mutex\"}";
    let deadline = Instant::now() + Duration::from_secs(if in_vm() { 60 } else { 10 });
    let mut last = f64::NAN;
    loop {
        std::thread::sleep(Duration::from_millis(1200));
        let now = scrape()?.get(key).copied().unwrap_or(0.0);
        if now == last || Instant::now() > deadline {
            break;
        }
        last = now;
    }
    let (status, om_type, om) = http_get(
        serve.port,
        "/metrics",
        Some("application/openmetrics-text; version=1.0.0"),
    )?;
    ensure!(
        status == 200 && om_type.starts_with("application/openmetrics-text"),
        "{status} {om_type}"
    );
    ensure!(om.ends_with("# EOF\n"), "OpenMetrics ends with # EOF");
    // No kernel address leaves the host unless asked (--expose-addresses).
    ensure!(
        !om.contains("0xffff"),
        "a kernel address in the scrape: {}",
        om.lines().find(|l| l.contains("0xffff")).unwrap_or_default()
    );
    let hidden = om.lines().filter(|l| l.contains("lock=\"lock-")).count();
    let (_, text_type, text) = http_get(serve.port, "/metrics", Some("text/plain"))?;
    ensure!(text_type.starts_with("text/plain; version=0.0.4"), "{text_type}");
    ensure!(
        text.contains("# TYPE pipelock_lock_contentions_total counter") && !text.contains("# EOF"),
        "the Prometheus text format declares counters by their sample name"
    );
    let after = samples(&text);
    // The same series (a collection may fall between the two scrapes and
    // move the values: pipelock's own program counters always move).
    let series = |s: &BTreeMap<String, f64>| s.keys().cloned().collect::<Vec<_>>();
    ensure!(
        series(&samples(&om)) == series(&after),
        "both formats carry the same series"
    );
    let hooked = mode != "tracepoint";
    let histograms = histograms_are_well_formed(&after, hooked)?;
    let served = after.get(key).copied().unwrap_or(0.0) - before.get(key).copied().unwrap_or(0.0);
    let traced = mutex_contentions(&report);
    ensure!(traced > 0, "the trace saw no pipe-mutex contention");
    // Skipped runs are said in the trace's notes, with the cause where
    // the kernel preempts fentry programs (Debian's 6.18: lazy).
    let skipped = *report
        .drops
        .get("recursion_misses")
        .context("no recursion_misses among the drops")?;
    let notes = report.notes.join(" | ");
    ensure!(
        (skipped == 0) != notes.contains(&format!("the kernel skipped {skipped} runs")),
        "{skipped} skipped runs, notes {notes}"
    );
    let preemption = fs::read_to_string("/sys/kernel/debug/sched/preempt").unwrap_or_default();
    if skipped > 0 && mode == "fentry" && (preemption.contains("(lazy)") || preemption.contains("(full)")) {
        ensure!(
            notes.contains("--mode kprobe"),
            "preemption {preemption:?}, notes {notes}"
        );
    }
    // Each side can lose up to one contention for each run of a program on
    // the mutex's path that the kernel skipped (and says so): under
    // emulation a preempted or interrupted run makes hundreds.
    let (served_misses, traced_misses) = mutex_path_misses(&before, &after, &report);
    let slack = (traced as f64 * 0.02).max(20.0) + served_misses + traced_misses;
    ensure!(
        (served - traced as f64).abs() <= slack,
        "pipe-mutex contentions: exporter {served}, trace {traced} (skipped runs on the mutex's path: exporter {served_misses}, trace {traced_misses}); {}",
        where_they_differ(&before, &after, &report)
    );
    println!(
        "  {mode}: {histograms} histograms well formed; pipe-mutex contentions exporter {served}, trace {traced} (skipped runs on the mutex's path: exporter {served_misses}, trace {traced_misses}); no kernel address in the scrape, {hidden} series of unnamed locks under an id"
    );
    if served != traced as f64 {
        println!("  {}", where_they_differ(&before, &after, &report));
    }
    Ok(Outcome::Passed)
}
register!(Kernel serve_exports_what_a_trace_of_the_same_herd_sees);

/// Recursion misses of the programs a pipe-mutex contention goes through: the exporter's during the trace, the trace's.
fn mutex_path_misses(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    report: &TraceReport,
) -> (f64, f64) {
    let on_path = |program: &str| skips::CountedPath::Mutex.has(program);
    let prefix = "pipelock_bpf_recursion_misses_total{program=\"";
    let served = after
        .iter()
        .filter_map(|(key, value)| {
            let program = key.strip_prefix(prefix)?.strip_suffix("\"}")?;
            on_path(program).then(|| value - before.get(key).copied().unwrap_or(0.0))
        })
        .sum();
    let traced = skips::Skips::on(report, skips::CountedPath::Mutex).total() as f64;
    (served, traced)
}

/// For a failure message: the pipe-mutex locks whose contentions the
/// exporter (its per-lock series, less what it had before the trace) and
/// the trace disagree on, largest difference first, and the exporter's
/// dropped events.
fn where_they_differ(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    report: &TraceReport,
) -> String {
    let prefix = "pipelock_top_lock_contentions_total{class=\"pipe_mutex\",lock=\"";
    let mut by_lock: BTreeMap<String, (f64, u64)> = BTreeMap::new();
    for (key, value) in after {
        if let Some(name) = key.strip_prefix(prefix).and_then(|r| r.strip_suffix("\"}")) {
            by_lock.entry(name.to_owned()).or_default().0 = value - before.get(key).copied().unwrap_or(0.0);
        }
    }
    for lock in &report.locks {
        if lock.class == Some(LockClass::PipeMutex) {
            by_lock.entry(lock.name.clone()).or_default().1 += lock.contentions;
        }
    }
    let mut differ: Vec<_> = by_lock
        .into_iter()
        .filter(|(_, (served, traced))| *served != *traced as f64)
        .collect();
    differ.sort_by(|a, b| {
        let gap = |(_, (s, t)): &(String, (f64, u64))| (s - *t as f64).abs();
        gap(b).total_cmp(&gap(a))
    });
    let locks: Vec<String> = differ
        .iter()
        .take(6)
        .map(|(name, (served, traced))| format!("{name} exporter {served} trace {traced}"))
        .collect();
    let dropped: Vec<String> = after
        .iter()
        .filter(|(k, v)| k.starts_with("pipelock_dropped_events") && **v > 0.0)
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    let trace_misses: Vec<String> = report
        .programs
        .iter()
        .filter(|p| p.recursion_misses > 0)
        .map(|p| format!("{} {}", p.name, p.recursion_misses))
        .collect();
    format!(
        "locks that differ: [{}]; exporter dropped: [{}]; trace drops {}; trace's programs that missed runs: [{}]",
        locks.join(", "),
        dropped.join(", "),
        shown(&report.drops),
        trace_misses.join(", ")
    )
}

/// SIGTERM detaches and exits 0 within a second; two signals at once end
/// it at once; a `--listen` in use is one line, exit 1, nothing attached
/// (an address that is not one is in the bad-input table).
fn serve_stops_on_signals_and_refuses_bad_addresses() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    let taken = TcpListener::bind("127.0.0.1:0")?;
    let port = taken.local_addr()?.port();
    let out = run(pipelock().args(["serve", "--listen", &format!("127.0.0.1:{port}")]))?;
    let stderr = text(&out.stderr);
    ensure!(
        out.status.code() == Some(1)
            && stderr.contains("the address is in use")
            && stderr.lines().count() == 1,
        "in use: {:?} {stderr}",
        out.status
    );
    drop(taken);
    let mut serve = start_serve(&["--mode", "tracepoint"])?;
    ensure!(
        pipelock_programs_loaded()? > 0,
        "serve runs, yet no program is loaded"
    );
    let pid = serve.child.id() as i32;
    let asked = Instant::now();
    // SAFETY: a signal to our own child.
    ensure!(unsafe { libc::kill(pid, libc::SIGTERM) } == 0, "kill");
    let status = loop {
        if let Some(status) = serve.child.try_wait()? {
            break status;
        }
        ensure!(
            asked.elapsed() < Duration::from_secs(5),
            "still running 5 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = asked.elapsed();
    ensure!(status.success(), "SIGTERM: {status}");
    ensure!(took < Duration::from_secs(1), "SIGTERM took {took:?}");
    let left = programs_left_after_exit()?;
    ensure!(
        left == 0,
        "{left} pipelock program(s) still loaded after serve exited"
    );
    // Two signals at once: the second one does not wait for a clean exit.
    let serve = start_serve(&["--mode", "tracepoint"])?;
    let pid = serve.child.id() as i32;
    // SAFETY: signals to our own child.
    unsafe {
        libc::kill(pid, libc::SIGINT);
        libc::kill(pid, libc::SIGINT);
    }
    let mut serve = serve;
    let status = serve.child.wait()?;
    ensure!(
        status.success() || status.code() == Some(130),
        "two SIGINTs: {status}"
    );
    println!("  SIGTERM: exit 0 in {took:?}, nothing left loaded; two SIGINTs: {status}");
    Ok(Outcome::Passed)
}
register!(Host serve_stops_on_signals_and_refuses_bad_addresses);

/// Prometheus (`binary`) with `config`, its storage under `dir`, its API on
/// a free loopback port; killed when dropped.
pub(super) fn start_prometheus(binary: &str, config: &Path, dir: &Path) -> Result<Serve> {
    let port = free_port()?;
    Ok(Serve {
        child: Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
        port,
    })
}

/// The first value an instant query gives, from the Prometheus on `port`.
pub(super) fn prometheus_query(port: u16, query: &str) -> Result<Option<f64>> {
    let encoded: String = query
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let (status, _, body) = http_get(port, &format!("/api/v1/query?query={encoded}"), None)?;
    ensure!(status == 200, "query {query}: {status} {body}");
    let response: QueryResponse =
        serde_json::from_str(&body).with_context(|| format!("query {query}: not an answer: {body}"))?;
    ensure!(response.status == "success", "query {query}: {body}");
    response
        .data
        .result
        .first()
        .map(|sample| {
            let (_, value) = &sample.value;
            value
                .parse()
                .with_context(|| format!("query {query}: the value {value:?} is not a number"))
        })
        .transpose()
}

/// What Prometheus's `/api/v1/query` answers to an instant query.
#[derive(serde::Deserialize)]
struct QueryResponse {
    status: String,
    data: QueryData,
}

#[derive(serde::Deserialize)]
struct QueryData {
    result: Vec<QuerySample>,
}

/// One series' sample: its labels, and `[unix time, "value"]`.
#[derive(serde::Deserialize)]
struct QuerySample {
    value: (f64, String),
}

/// Debian's `prometheus` (and `promtool`), where installed.
fn prometheus_binaries() -> Option<(&'static str, &'static str)> {
    let found = |p: &'static str| Path::new(p).exists().then_some(p);
    Some((found("/usr/bin/prometheus")?, found("/usr/bin/promtool")?))
}

/// A real Prometheus (Debian's 2.42) scrapes the exporter every second while
/// pipe-mutex waits are made ([`why::contend`]); its API must give
/// the pipe-mutex contentions the exporter itself reports (at least those
/// made), and `histogram_quantile(0.99, …)` of the wait buckets a
/// value inside the bucket that holds the exporter's own 99th percentile.
/// `promtool check metrics` must accept a scrape.
fn a_real_prometheus_scrapes_the_exporter() -> Result<Outcome> {
    let Some((prometheus, promtool)) = prometheus_binaries() else {
        return Ok(Outcome::Skipped(
            "prometheus is not installed (Debian: prometheus; `cargo xtask test` installs it)".into(),
        ));
    };
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    let serve = start_serve(&["--mode", "tracepoint"])?;
    let (_, _, scrape) = http_get(serve.port, "/metrics", None)?;
    let mut check = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    check
        .stdin
        .take()
        .context("stdin")?
        .write_all(scrape.as_bytes())?;
    let checked = check.wait_with_output()?;
    ensure!(
        checked.status.success(),
        "promtool check metrics: {}{}",
        text(&checked.stdout),
        text(&checked.stderr)
    );
    let dir = scratch("prometheus");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    let config = dir.join("prometheus.yml");
    fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: pipelock\n    \
             static_configs:\n      - targets: ['127.0.0.1:{}']\n",
            serve.port
        ),
    )?;
    let mut server = start_prometheus(prometheus, &config, &dir)?;
    let web = server.port;
    let query = |q: &str| prometheus_query(web, q);
    // Prometheus is up and has scraped the exporter at least once.
    let deadline = Instant::now() + Duration::from_secs(30);
    while query("up{job=\"pipelock\"}").ok().flatten() != Some(1.0) {
        if let Some(status) = server.child.try_wait()? {
            bail!("prometheus exited: {status}");
        }
        ensure!(Instant::now() < deadline, "prometheus never scraped the exporter");
        std::thread::sleep(Duration::from_millis(250));
    }
    let (_, made) = why::contend(50, 1)?;
    // A collection, then a scrape after it.
    std::thread::sleep(Duration::from_millis(3000));
    let ours = samples(&http_get(serve.port, "/metrics", None)?.2);
    let contentions = ours
        .get("pipelock_lock_contentions_total{class=\"pipe_mutex\"}")
        .copied()
        .context("no pipe-mutex contentions in the scrape")?;
    let theirs = query("sum(pipelock_lock_contentions_total{class=\"pipe_mutex\"})")?
        .context("prometheus has no pipe-mutex contentions")?;
    // Both read after the waits were made: only the idle system moves them apart.
    ensure!(
        contentions >= made as f64 && (theirs - contentions).abs() <= (contentions * 0.01).max(50.0),
        "pipe-mutex contentions: prometheus {theirs}, the exporter {contentions}; {made} were made"
    );
    let p99 = query(
        "histogram_quantile(0.99, sum by (le) (rate(pipelock_lock_wait_seconds_bucket{class=\"pipe_mutex\"}[1m])))",
    )?
    .context("no histogram_quantile result")?;
    let buckets = buckets_of(&ours, "pipelock_lock_wait_seconds", "class=\"pipe_mutex\"");
    let total = buckets.last().context("no buckets")?.1;
    let at = buckets
        .iter()
        .position(|(_, cumulative)| *cumulative >= 0.99 * total)
        .context("no p99 bucket")?;
    let (lower, upper) = (at.checked_sub(1).map_or(0.0, |i| buckets[i].0), buckets[at].0);
    ensure!(
        p99 >= lower && p99 <= upper,
        "prometheus p99 {p99} s is outside the exporter's p99 bucket ({lower}, {upper}]"
    );
    let _ = server.child.kill();
    let _ = server.child.wait();
    let _ = fs::remove_dir_all(&dir);
    println!(
        "  promtool check metrics: ok; contentions prometheus {theirs} / exporter {contentions}; \
         p99 {:.2} us in ({:.2}, {:.2}] us",
        p99 * 1e6,
        lower * 1e6,
        upper * 1e6
    );
    Ok(Outcome::Passed)
}
register!(Host a_real_prometheus_scrapes_the_exporter);

/// `deploy/pipelock.service` runs the exporter as an unprivileged user with
/// a few capabilities: run it that way (`setpriv`, as nobody, with exactly
/// the unit's `AmbientCapabilities`) and it must attach, collect the
/// pipe-mutex waits made beside it, and stop cleanly.
fn serve_runs_with_the_units_capabilities() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    let unit = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/pipelock.service"))?;
    let caps: Vec<String> = unit
        .lines()
        .find_map(|l| l.strip_prefix("AmbientCapabilities="))
        .context("the unit sets no AmbientCapabilities")?
        .split_whitespace()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_ascii_lowercase()))
        .collect();
    let caps = caps.join(",");
    let port = free_port()?;
    let mut nobody = match pipelock_as_nobody_with(&caps) {
        Ok(cmd) => cmd,
        Err(skip) => return Ok(skip),
    };
    let child = nobody
        .args(["serve", "--mode", "tracepoint", "--interval", "0.5", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut serve = Serve { child, port };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !http_get(port, "/healthz", None)
        .is_ok_and(|(status, _, body)| status == 200 && body.starts_with("ok"))
    {
        serve.still_running(&format!("serve as nobody with {caps}"))?;
        ensure!(Instant::now() < deadline, "serve as nobody never became healthy");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, made) = why::contend(20, 1)?;
    std::thread::sleep(Duration::from_millis(1500));
    let scraped = samples(&http_get(port, "/metrics", None)?.2);
    let contentions = scraped
        .get("pipelock_lock_contentions_total{class=\"pipe_mutex\"}")
        .copied()
        .unwrap_or(0.0);
    ensure!(
        contentions >= made as f64,
        "serve as nobody exported {contentions} pipe-mutex contentions; {made} were made"
    );
    // SAFETY: a signal to our own child (setpriv execs pipelock in place).
    unsafe { libc::kill(serve.child.id() as i32, libc::SIGTERM) };
    let status = serve.child.wait()?;
    ensure!(status.success(), "SIGTERM: {status}");
    println!("  as nobody with {caps}: {contentions} pipe-mutex contentions exported, exit 0 on SIGTERM");
    Ok(Outcome::Passed)
}
register!(Host serve_runs_with_the_units_capabilities);

/// `--ebpf-log` delivers the programs' own records: a trace whose statistics
/// map holds 16 locks, drained every 30 s, over waits made by construction
/// on the mutexes of 40 pipes ([`why::contend`]'s helper: a herd of churned
/// pipes need not contend on a busy machine), must print the warning the
/// programs log the first time that map is full (and count the drops). `probe --self-test --ebpf-log` must load and pass (it used to
/// fail with EBADF: the logger's map descriptor was closed too early).
fn ebpf_log_delivers_the_programs_warnings() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    let facts = scratch("log-contend");
    let out = run(pipelock()
        .args([
            "--ebpf-log",
            "trace",
            "--max-locks",
            "16",
            "--interval",
            "30",
            "--json",
        ])
        .arg(scratch("log.json"))
        .arg("--")
        .arg(std::env::current_exe()?)
        .args(["--uffd-holder", "40", "--fault-ms", "2", "--pipes", "40"])
        .arg(&facts))?;
    let _ = (fs::remove_file(&facts), fs::remove_file(scratch("log.json")));
    let stderr = text(&out.stderr);
    ensure!(out.status.success(), "trace --ebpf-log: {stderr}");
    ensure!(
        stderr.contains("LOCK_STATS is full"),
        "no warning from the programs in: {stderr}"
    );
    let selftest = run(pipelock().args(["--ebpf-log", "probe", "--self-test"]))?;
    ensure!(
        selftest.status.success(),
        "probe --self-test --ebpf-log: {}",
        text(&selftest.stderr)
    );
    println!(
        "  the programs' warning arrived: {}",
        stderr.lines().find(|l| l.contains("is full")).unwrap_or("")
    );
    Ok(Outcome::Passed)
}
register!(Kernel ebpf_log_delivers_the_programs_warnings);
