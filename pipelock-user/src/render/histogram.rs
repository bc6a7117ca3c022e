//! bcc-style log2 histograms (`value : count |****|`) of wait and hold.
use crate::model::{Timing, TraceReport, class_label};

/// `--hist`: the wait and hold histograms of the first `top` rows.
pub fn render_histograms(report: &TraceReport, top: usize) -> String {
    let mut out = String::new();
    for row in report.locks.iter().take(top) {
        for (kind, timing) in [("wait", &row.wait), ("hold", &row.hold)] {
            if let Some(timing) = timing {
                out.push_str(&format!(
                    "\n{} {} {kind} ({} samples)\n",
                    class_label(row.class),
                    row.name,
                    timing.count
                ));
                out.push_str(&render_histogram(timing));
            }
        }
    }
    out
}

/// bcc-style log2 histogram of one timing, e.g. for `--hist`:
/// `     512 -> 1023     : 5        |****      |`.
pub fn render_histogram(timing: &Timing) -> String {
    render_histogram_width(timing, 40)
}

/// [`render_histogram`] with bars at most `bar_width` stars wide.
pub fn render_histogram_width(timing: &Timing, bar_width: usize) -> String {
    let width = bar_width.max(1) as u64;
    let peak = timing.buckets.iter().map(|(_, n)| *n).max().unwrap_or(0).max(1);
    let mut out = format!("{:>20}     : {:<8} distribution\n", "ns", "count");
    for &(low, n) in &timing.buckets {
        let high = if low == 0 { 0 } else { low.saturating_mul(2) - 1 };
        let stars = (n * width).div_ceil(peak) as usize;
        out.push_str(&format!(
            "{:>10} -> {:<10}: {:<8} |{:<width$}|\n",
            low,
            high,
            n,
            "*".repeat(stars),
            width = width as usize
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::timing::tests::hist;

    #[test]
    fn histogram_bars_scale_to_the_fullest_bucket() {
        let timing = Timing::from_hist(&hist(&[0, 600, 700, 800, 900, 5000])).unwrap();
        let text = render_histogram(&timing);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[1].starts_with("         0 -> 0"), "{text}");
        assert!(lines[2].contains("512 -> 1023"), "{text}");
        assert!(lines[2].contains(&format!("|{}|", "*".repeat(40))), "{text}");
        assert!(lines[3].contains("4096 -> 8191"), "{text}");
        assert!(lines[3].contains(&format!("|{:<40}|", "*".repeat(10))), "{text}");
    }
}
