//! A long run of `pipelock serve` over pipes and threads that never stop
//! coming and going: memory and map fill must stay flat. Run by `cargo
//! xtask test` beside the VM tests (`integration --soak SECONDS`), which
//! leave this host's CPUs mostly idle; it prints what it measured.
use std::time::{Duration, Instant};

use super::{serve::*, *};

/// What is measured at the end of the warm-up and at the end.
#[derive(Debug)]
struct Mark {
    at_s: u64,
    rss_kb: u64,
    /// Entries in the maps whose fill is counted at each drain.
    fill: f64,
    scrape_bytes: usize,
}

fn rss_kb(pid: u32) -> Result<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS")
}

fn mark(serve: &Serve, started: Instant) -> Result<Mark> {
    let (_, _, body) = http_get(serve.port, "/metrics", None)?;
    let fill = samples(&body)
        .iter()
        .filter(|(series, _)| series.starts_with("pipelock_map_entries{"))
        .map(|(_, v)| v)
        .sum();
    Ok(Mark {
        at_s: started.elapsed().as_secs(),
        rss_kb: rss_kb(serve.child.id())?,
        fill,
        scrape_bytes: body.len(),
    })
}

/// Helper mode: `integration --soak SECONDS`: `pipelock serve` for SECONDS
/// while 20 short-lived pipes (each 2 writer and 2 reader threads) are made
/// and freed, over and over. After two fifths (at least 30 s, when the
/// totals have reached their bounds) and at the end it reads the exporter's
/// RSS, the maps' fill and the scrape's size; growth beyond 15 % (+2 MB) of
/// RSS, or doubling of fill or scrape, fails.
pub(super) fn soak(args: &[String]) -> ! {
    let run = || -> Result<()> {
        let seconds: u64 = args.first().context("SECONDS")?.parse()?;
        if let Some(Outcome::Skipped(why)) = cannot_load() {
            println!("soak: skipped: {why}");
            return Ok(());
        }
        let serve = start_serve(&[])?;
        let exe = std::env::current_exe()?;
        let churn_file = scratch("soak-churn");
        let started = Instant::now();
        // The exporter's tables reach their bounds after ~140 s of brisk
        // churn (measured): judge from two fifths of the run on.
        let warm_up = Duration::from_secs((seconds * 2 / 5).max(30).min(seconds));
        let (mut warm, mut rounds) = (None, 0u64);
        while started.elapsed() < Duration::from_secs(seconds) {
            let out = run(Command::new(&exe)
                .arg("--pipe-churn")
                .arg("20")
                .arg("200")
                .arg(&churn_file))?;
            ensure!(out.status.success(), "churn: {}", text(&out.stderr));
            rounds += 1;
            if warm.is_none() && started.elapsed() >= warm_up {
                warm = Some(mark(&serve, started)?);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let _ = fs::remove_file(&churn_file);
        let end = mark(&serve, started)?;
        let warm = warm.context("the soak ended before its warm-up")?;
        println!(
            "soak: {seconds} s, {} pipes made and freed; exporter RSS {:.1} MB at {} s, {:.1} MB at {} s; \
             map entries {} → {}; scrape {} → {} bytes",
            rounds * 20,
            warm.rss_kb as f64 / 1024.0,
            warm.at_s,
            end.rss_kb as f64 / 1024.0,
            end.at_s,
            warm.fill,
            end.fill,
            warm.scrape_bytes,
            end.scrape_bytes
        );
        ensure!(
            end.rss_kb <= warm.rss_kb * 115 / 100 + 2048,
            "the exporter's RSS grew: {warm:?} → {end:?}"
        );
        ensure!(
            end.fill <= 2.0 * warm.fill + 64.0,
            "map fill grew: {warm:?} → {end:?}"
        );
        ensure!(
            end.scrape_bytes <= 2 * warm.scrape_bytes,
            "the scrape grew: {warm:?} → {end:?}"
        );
        Ok(())
    };
    std::process::exit(match run() {
        Ok(()) => 0,
        Err(err) => {
            println!("soak: FAILED: {err:#}");
            1
        }
    })
}
