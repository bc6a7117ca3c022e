//! `pipelock report --html` and `trace --html`: the page opened in headless
//! Chromium must render (no console errors, its charts on screen), and each
//! figure it shows must be the JSON's.
use pipelock_user::{
    model::{LockRow, Timing},
    workload::report::Report as RunResult,
};

use super::{browser::near, *};

/// Kernel A's bars (blue at 55 % over white) and B's (orange).
pub(super) const BAR_A: [u8; 3] = [132, 180, 214];
pub(super) const BAR_B: [u8; 3] = [255, 185, 122];

/// Every `data-field`/`data-value` of a page's lock sections, with the
/// index of the JSON lock row the section draws.
fn lock_values(html: &str) -> Result<Vec<(usize, String, u64)>> {
    let mut out = Vec::new();
    for section in html.split("<section class=\"lock\" data-row=\"").skip(1) {
        let row: usize = section[..section.find('"').context("row")?].parse()?;
        for cell in section.split("data-field=\"").skip(1) {
            let field = &cell[..cell.find('"').context("field")?];
            let value = cell.split("data-value=\"").nth(1).context("value")?;
            out.push((
                row,
                field.to_owned(),
                value[..value.find('"').context("value")?].parse()?,
            ));
        }
    }
    Ok(out)
}

/// The figure a page's `data-field` names, read from the lock row: a field
/// the page shows that this does not know fails, so a figure is never
/// left unchecked.
fn figure(lock: &LockRow, field: &str) -> Result<Option<u64>> {
    let timing = |timing: &Option<Timing>, name: &str| -> Result<Option<u64>> {
        let Some(t) = timing else { return Ok(None) };
        Ok(Some(match name {
            "count" => t.count,
            "avg_ns" => t.avg_ns,
            "p50_ns" => t.p50_ns,
            "p90_ns" => t.p90_ns,
            "p99_ns" => t.p99_ns,
            "p999_ns" => t.p999_ns,
            "max_ns" => t.max_ns,
            other => bail!("the page shows a timing figure this check does not know: {other}"),
        }))
    };
    Ok(match field.split_once('.') {
        Some(("wait", name)) => timing(&lock.wait, name)?,
        Some(("hold", name)) => timing(&lock.hold, name)?,
        Some(_) => bail!("the page shows a figure this check does not know: {field}"),
        None => match field {
            "contentions" => Some(lock.contentions),
            "acquisitions" => lock.acquisitions,
            "holder_on_cpu_ns" => lock.holder.holder_on_cpu_ns,
            "holder_runnable_ns" => lock.holder.holder_runnable_ns,
            "holder_sleeping_ns" => lock.holder.holder_sleeping_ns,
            other => bail!("the page shows a figure this check does not know: {other}"),
        },
    })
}

/// Each value the page shows of the report's locks equals the report's.
fn check_values(html: &str, locks: &[LockRow]) -> Result<usize> {
    let found = lock_values(html)?;
    ensure!(!found.is_empty(), "the page shows no figure");
    for (row, field, value) in &found {
        let lock = locks
            .get(*row)
            .with_context(|| format!("the page draws lock {row}, the report has {}", locks.len()))?;
        let want = figure(lock, field)?;
        ensure!(
            want == Some(*value),
            "the page shows {field} = {value} for lock {row}, the report {want:?}: {}",
            shown(lock)
        );
    }
    Ok(found.len())
}

/// Screenshots `page` into the manual's pictures as `name`; None without
/// chromium. Fails on console errors and on a page without bars.
pub(super) fn rendered(page: &Path, name: &str, colours: &[[u8; 3]]) -> Result<Option<String>> {
    let Some(shot) = browser::screenshot(page, &browser::pictures().join(name), 1200, 1600)? else {
        return Ok(None);
    };
    ensure!(
        shot.console.is_empty(),
        "the page's console in the browser:\n{}",
        shot.console.join("\n")
    );
    let mut shares = Vec::new();
    for &colour in colours {
        let share = shot.share(near(colour, 14));
        ensure!(
            share >= 0.002,
            "{:.2} % of the screenshot in the bars' colour {colour:?}: {}",
            100.0 * share,
            shot.png.display()
        );
        shares.push(format!("{:.1} %", 100.0 * share));
    }
    let blank = shot.share(near([255, 255, 255], 2));
    ensure!(blank < 0.98, "a blank page: {}", shot.png.display());
    Ok(Some(format!(
        "no console errors, bars {} of the screenshot ({})",
        shares.join(" and "),
        shot.png.display()
    )))
}

/// A traced herd's `run --json` result drawn by `pipelock report` (the
/// herd run again, up to 5 times, until it contended: a herd contends only
/// while two of its members run at once, which a machine busy with
/// something else need not allow), and a trace of waits made by
/// construction ([`why::contend`]'s helper) drawn by `trace --html`
/// directly.
fn report_pages_render_and_show_the_jsons_figures() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    let (json, page, direct) = (
        scratch("report-run.json"),
        scratch("report-run.html"),
        scratch("report-trace.html"),
    );
    let mut result: Option<RunResult> = None;
    for attempt in 1..=5 {
        let out = run(pipelock()
            .args(["run", "pipe-herd", "--limit", "100000", "-q", "--trace", "--json"])
            .arg(&json))?;
        ensure!(out.status.success(), "run: {}", text(&out.stderr));
        let read: RunResult =
            serde_json::from_str(&fs::read_to_string(&json)?).context("not a pipelock run result")?;
        if read.trace.as_ref().is_some_and(|t| !t.locks.is_empty()) {
            result = Some(read);
            break;
        }
        println!("  attempt {attempt}: the herd contended no lock; again");
    }
    let result = result.context("the herd contended no lock in 5 attempts")?;
    let drawn = run(pipelock().arg("report").arg(&json).arg("--html").arg(&page))?;
    ensure!(drawn.status.success(), "report: {}", text(&drawn.stderr));
    let html = fs::read_to_string(&page)?;
    let trace = result.trace.as_ref().context("the run result has no trace")?;
    let checked = check_values(&html, &trace.locks)?;
    ensure!(html.contains("pipe-herd"), "the page does not name its workload");
    let (trace, _) = trace_helper(
        "report-holder",
        &["--html", direct.to_str().context("non-UTF-8 temp path")?],
        &["--uffd-holder", "10", "--fault-ms", "2"],
    )?;
    let direct_checked = check_values(&fs::read_to_string(&direct)?, &trace.locks)?;
    let shot = rendered(&page, "report.png", &[BAR_A]);
    let _ = (
        fs::remove_file(&json),
        fs::remove_file(&page),
        fs::remove_file(&direct),
    );
    match shot? {
        Some(line) => {
            println!("  {checked} figures as in the run's JSON, {direct_checked} as in trace's; {line}")
        }
        None => {
            return Ok(Outcome::Skipped(format!(
                "{checked} figures agree with the JSON, but no chromium opened the page (cargo xtask test installs it)"
            )));
        }
    }
    Ok(Outcome::Passed)
}
register!(Host report_pages_render_and_show_the_jsons_figures);
