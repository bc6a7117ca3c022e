//! bcc-style histograms (`value : count |****|`) of wait and hold, one row
//! per power of two as bcc and bpftrace users read them, under the
//! percentiles the finer log-linear buckets give.
use crate::{
    model::{Timing, TraceReport, class_label, timing::error_label},
    units::human_ns,
};

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
                out.push_str(&percentile_line(timing));
                out.push_str(&render_histogram(timing));
            }
        }
    }
    out
}

/// `p50 2.61 us  p90 …  max 41.6 us  (±6.25 %)`.
pub fn percentile_line(timing: &Timing) -> String {
    format!(
        "p50 {}  p90 {}  p99 {}  p99.9 {}  max {}  (percentiles {})\n",
        human_ns(timing.p50_ns),
        human_ns(timing.p90_ns),
        human_ns(timing.p99_ns),
        human_ns(timing.p999_ns),
        human_ns(timing.max_ns),
        error_label(timing.percentile_error)
    )
}

/// bcc-style histogram of one timing, e.g. for `--hist`:
/// `     512 -> 1023     : 5        |****      |`.
pub fn render_histogram(timing: &Timing) -> String {
    render_histogram_width(timing, 40)
}

/// The power-of-two row a log-linear bucket falls in: `[0, 0]`, or
/// `[2^(k-1), 2^k - 1]` for a duration of bit length k. A bucket never
/// straddles two of them.
fn octave(lower: u64) -> (u64, u64) {
    match u64::BITS - lower.leading_zeros() {
        0 => (0, 0),
        k => (1 << (k - 1), (1u64 << (k - 1)).saturating_mul(2) - 1),
    }
}

/// [`render_histogram`] with bars at most `bar_width` stars wide.
pub fn render_histogram_width(timing: &Timing, bar_width: usize) -> String {
    let width = bar_width.max(1) as u64;
    let mut rows: Vec<((u64, u64), u64)> = Vec::new();
    for &(lower, n) in &timing.buckets {
        let row = octave(lower);
        match rows.last_mut() {
            Some((last, count)) if *last == row => *count += n,
            _ => rows.push((row, n)),
        }
    }
    let peak = rows.iter().map(|(_, n)| *n).max().unwrap_or(0).max(1);
    let mut out = format!("{:>20}     : {:<8} distribution\n", "ns", "count");
    for ((low, high), n) in rows {
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
    use crate::model::fixtures::hist;

    #[test]
    fn histogram_rows_are_powers_of_two_and_bars_scale_to_the_fullest() {
        // 600 and 700 ns share the 512..1023 row from different log-linear buckets.
        let timing = Timing::from_hist(&hist(&[0, 600, 700, 800, 900, 5000])).unwrap();
        let text = render_histogram(&timing);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[1].starts_with("         0 -> 0"), "{text}");
        assert!(lines[2].contains("512 -> 1023"), "{text}");
        assert!(lines[2].contains(": 4 "), "{text}");
        assert!(lines[2].contains(&format!("|{}|", "*".repeat(40))), "{text}");
        assert!(lines[3].contains("4096 -> 8191"), "{text}");
        assert!(lines[3].contains(&format!("|{:<40}|", "*".repeat(10))), "{text}");
    }

    #[test]
    fn the_percentile_line_says_its_bound() {
        let timing = Timing::from_hist(&hist(&[1000; 10])).unwrap();
        let line = percentile_line(&timing);
        // 1000 ns is in the bucket 960..1023: its midpoint, 0.8 % off.
        assert!(line.starts_with("p50 992 ns  p90 992 ns"), "{line}");
        assert!(line.ends_with("(percentiles ±6.25 %)\n"), "{line}");
    }
}
