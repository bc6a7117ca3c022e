//! A long run of `pipelock serve` over pipes and threads that never stop
//! coming and going: memory and map fill must stay flat. Run by `cargo
//! xtask test` beside the VM tests (`integration --soak SECONDS`), whose
//! guests keep one host thread busy each; it prints what it measured.
use std::time::{Duration, Instant};

use super::{serve::*, *};

/// One reading of the exporter: its RSS, the maps' fill at the last drain
/// and the scrape's size.
#[derive(Debug, Clone, Copy)]
struct Mark {
    at_s: u64,
    rss_kb: u64,
    /// Entries in the maps whose fill is counted at each drain: what one
    /// collection interval gathered, so it follows the churn's bursts.
    fill: f64,
    scrape_bytes: usize,
}

/// The readings of one stretch of the run: the RSS at its end, the largest
/// fill and scrape seen in it (one reading falls in a busy or a quiet
/// interval by chance; the peak over a stretch does not).
#[derive(Debug, Default)]
struct Stretch {
    marks: usize,
    last: Option<Mark>,
    peak_fill: f64,
    peak_scrape_bytes: usize,
}

impl Stretch {
    fn add(&mut self, mark: Mark) {
        self.marks += 1;
        self.last = Some(mark);
        self.peak_fill = self.peak_fill.max(mark.fill);
        self.peak_scrape_bytes = self.peak_scrape_bytes.max(mark.scrape_bytes);
    }
}

/// Resident memory of a process, in KiB.
pub(super) fn rss_kb(pid: u32) -> Result<u64> {
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

/// The latest warm-up after which RSS growth is judged: brisk churn brings
/// the exporter's tables to their bounds in ~140 s (measured), and what is
/// compared is the warm stretch's last reading, at twice its start.
const WARM_UP_NEEDED: Duration = Duration::from_secs(120);

/// Helper mode: `integration --soak SECONDS`: `pipelock serve` for SECONDS
/// while 20 short-lived pipes (each 2 writer and 2 reader threads) are made
/// and freed, over and over; the exporter is read after every round. The
/// second fifth of the run (from when the totals have reached their bounds)
/// is compared with the last: growth beyond 15 % (+2 MB) of RSS, or a
/// doubling of the peak fill or scrape, fails.
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
        // churn (measured): the warm stretch starts at one fifth and ends at
        // two fifths of the run, the last stretch is the last fifth.
        let fifth = |k: u64| Duration::from_secs((seconds * k / 5).max(15 * k).min(seconds));
        let (mut warm, mut last, mut rounds) = (Stretch::default(), Stretch::default(), 0u64);
        while started.elapsed() < Duration::from_secs(seconds) {
            let out = run(Command::new(&exe)
                .arg("--pipe-churn")
                .arg("20")
                .arg("200")
                .arg(&churn_file))?;
            ensure!(out.status.success(), "churn: {}", text(&out.stderr));
            rounds += 1;
            std::thread::sleep(Duration::from_millis(200));
            let at = started.elapsed();
            if at >= fifth(1) && at < fifth(2) {
                warm.add(mark(&serve, started)?);
            } else if at >= fifth(4) {
                last.add(mark(&serve, started)?);
            }
        }
        let _ = fs::remove_file(&churn_file);
        let (Some(warm_end), Some(end)) = (warm.last, last.last) else {
            bail!(
                "too short a soak: {} readings in its second fifth, {} in its last",
                warm.marks,
                last.marks
            );
        };
        println!(
            "soak: {seconds} s, {} pipes made and freed; exporter RSS {:.1} MB at {} s, {:.1} MB at {} s; \
             peak map entries {} → {}, peak scrape {} → {} bytes ({} and {} readings)",
            rounds * 20,
            warm_end.rss_kb as f64 / 1024.0,
            warm_end.at_s,
            end.rss_kb as f64 / 1024.0,
            end.at_s,
            warm.peak_fill,
            last.peak_fill,
            warm.peak_scrape_bytes,
            last.peak_scrape_bytes,
            warm.marks,
            last.marks,
        );
        // Before the tables are full the RSS grows by design: a soak whose
        // warm stretch starts earlier (`--no-vm`'s 60 s) cannot judge it.
        if fifth(1) >= WARM_UP_NEEDED {
            ensure!(
                end.rss_kb <= warm_end.rss_kb * 115 / 100 + 2048,
                "the exporter's RSS grew: {warm_end:?} → {end:?}"
            );
        } else {
            println!(
                "soak: RSS growth not judged: the exporter's tables take ~140 s to reach their bounds, \
                 and this soak's warm-up ends at {} s (judged from a {} s soak on)",
                fifth(1).as_secs(),
                WARM_UP_NEEDED.as_secs() * 5
            );
        }
        ensure!(
            last.peak_fill <= 2.0 * warm.peak_fill + 64.0,
            "map fill grew: {warm:?} → {last:?}"
        );
        ensure!(
            last.peak_scrape_bytes <= 2 * warm.peak_scrape_bytes,
            "the scrape grew: {warm:?} → {last:?}"
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
