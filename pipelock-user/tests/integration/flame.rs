//! `trace --folded` and `--flamegraph`: wait time by call stack. With
//! every stack unwound (`--stack-sample 1`) the folded lines of each lock
//! add up to that lock's wait total in the same run's JSON report, to the
//! nanosecond; the SVG is drawn from them and shows in a real browser.
use std::collections::BTreeMap;

use pipelock_user::model::LockRow;

use super::*;

/// A lock's leaf as the folded output writes it: `class:name`, with `;`
/// and whitespace (the format's separators) made `_`.
fn leaf(lock: &LockRow) -> String {
    format!("{}:{}", lock.class.map_or("unknown", |c| c.name()), lock.name)
        .chars()
        .map(|c| if c == ';' || c.is_whitespace() { '_' } else { c })
        .collect()
}

fn folded_and_flamegraph_add_up_to_the_reports_waits() -> Result<Outcome> {
    let folded = scratch("waits.folded");
    let svg = scratch("waits.svg");
    let report = match trace_contended(
        &[
            "--mode",
            "tracepoint",
            "--stack-sample",
            "1",
            "--folded",
            folded.to_str().context("path")?,
            "--flamegraph",
            svg.to_str().context("path")?,
        ],
        &["run", "pipe-herd", "--limit", "100000", "-q"],
    )? {
        Ok(report) => report,
        Err(skip) => return Ok(skip),
    };
    let text = fs::read_to_string(&folded)?;
    let drawn = fs::read_to_string(&svg)?;
    let _ = fs::remove_file(&folded);
    let mut by_leaf: BTreeMap<String, u64> = BTreeMap::new();
    let mut from_pipe_calls = 0;
    for line in text.lines() {
        let (stack, count) = line
            .rsplit_once(' ')
            .with_context(|| format!("no count: {line}"))?;
        let ns: u64 = count.parse().with_context(|| format!("count of {line}"))?;
        let frames: Vec<&str> = stack.split(';').collect();
        *by_leaf.entry(frames[frames.len() - 1].to_owned()).or_default() += ns;
        if frames
            .iter()
            .any(|f| f.contains("pipe_read") || f.contains("pipe_write"))
        {
            from_pipe_calls += ns;
        }
    }
    let mut want: BTreeMap<String, u64> = BTreeMap::new();
    for lock in &report.locks {
        if let Some(wait) = &lock.wait {
            *want.entry(leaf(lock)).or_default() += wait.total_ns;
        }
    }
    ensure!(!want.is_empty(), "the herd's trace recorded no waits");
    ensure!(
        by_leaf == want,
        "folded totals by lock differ from the report's:\n{by_leaf:?}\n{want:?}"
    );
    let total: u64 = want.values().sum();
    ensure!(
        from_pipe_calls * 2 >= total,
        "{from_pipe_calls} of {total} ns waited under pipe_read/pipe_write frames:\n{text}"
    );
    ensure!(
        drawn.starts_with("<?xml") && drawn.trim_end().ends_with("</svg>"),
        "not an SVG"
    );
    let mutex = want
        .keys()
        .find(|k| k.starts_with("pipe-mutex:"))
        .context("no pipe-mutex lock")?;
    ensure!(drawn.contains(mutex.as_str()), "{mutex} not drawn in the SVG");
    let shot = browser::screenshot(&svg, &browser::pictures().join("flamegraph.png"), 1200, 400);
    let _ = fs::remove_file(&svg);
    match shot? {
        Some(shot) => {
            ensure!(
                shot.console.is_empty(),
                "the flame graph's script failed in the browser:\n{}",
                shot.console.join("\n")
            );
            // Its boxes are warm colours; an empty or broken picture has none.
            ensure!(
                shot.warm_share >= 0.10,
                "{:.1} % of the screenshot in flame colours: {}",
                100.0 * shot.warm_share,
                shot.png.display()
            );
            println!(
                "  in Chromium: no console errors, {:.0} % of the screenshot in flame colours ({})",
                100.0 * shot.warm_share,
                shot.png.display()
            );
        }
        None => {
            return Ok(Outcome::Skipped(format!(
                "the folded totals agree ({total} ns), but no chromium opened the SVG (cargo xtask test installs it)"
            )));
        }
    }
    println!(
        "  {} stacks, {} locks, {total} ns in both; {} ns under pipe read/write; SVG {} KiB",
        text.lines().count(),
        want.len(),
        from_pipe_calls,
        drawn.len() / 1024
    );
    Ok(Outcome::Passed)
}
register!(Host folded_and_flamegraph_add_up_to_the_reports_waits);
