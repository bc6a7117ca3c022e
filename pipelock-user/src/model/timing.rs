//! Timings from the programs' log2 histograms: merging per-CPU and
//! per-interval values, percentiles, and the [`Timing`] a row reports.
use pipelock_common::{Histogram, LockStats};
use serde::{Deserialize, Serialize};

/// Percentiles come from log2 buckets: a reported p50/p99 is the upper edge
/// of the bucket holding that rank (clamped to the maximum), so it is at most
/// 2× the true value and never below it.
pub const PERCENTILE_RESOLUTION: &str = "log2 buckets: p50/p99 are bucket upper bounds (≤ 2× the true value)";

/// Sums per-CPU histograms (max is the max of maxima).
pub fn merge(into: &mut Histogram, from: &Histogram) {
    into.count += from.count;
    into.total_ns += from.total_ns;
    into.max_ns = into.max_ns.max(from.max_ns);
    for (a, b) in into.buckets.iter_mut().zip(from.buckets.iter()) {
        *a += b;
    }
}

/// Adds one CPU's (or one interval's) statistics of a lock to another's.
pub fn merge_stats(into: &mut LockStats, from: &LockStats) {
    into.contentions += from.contentions;
    into.slept += from.slept;
    into.dropped += from.dropped;
    merge(&mut into.wait, &from.wait);
    merge(&mut into.hold, &from.hold);
}

/// The value at quantile `q` (0..=1): upper bound of its bucket, clamped to max.
pub fn percentile(hist: &Histogram, q: f64) -> Option<u64> {
    if hist.count == 0 {
        return None;
    }
    let rank = ((q * hist.count as f64).ceil() as u64).clamp(1, hist.count);
    let mut seen = 0;
    for (bucket, &n) in hist.buckets.iter().enumerate() {
        seen += n;
        if seen >= rank {
            // Bucket 0 holds 0; bucket i holds [2^(i-1), 2^i).
            let upper = if bucket == 0 {
                0
            } else if bucket >= 64 {
                u64::MAX
            } else {
                (1u64 << bucket) - 1
            };
            return Some(upper.min(hist.max_ns));
        }
    }
    Some(hist.max_ns)
}

/// Timings of one kind (wait or hold) of one lock, as reported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    pub count: u64,
    pub total_ns: u64,
    pub avg_ns: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    /// Non-empty log2 buckets as (lower bound ns, count).
    pub buckets: Vec<(u64, u64)>,
}

impl Timing {
    pub fn from_hist(hist: &Histogram) -> Option<Self> {
        (hist.count > 0).then(|| Self {
            count: hist.count,
            total_ns: hist.total_ns,
            avg_ns: hist.total_ns / hist.count,
            p50_ns: percentile(hist, 0.50).unwrap_or(0),
            p99_ns: percentile(hist, 0.99).unwrap_or(0),
            max_ns: hist.max_ns,
            buckets: hist
                .buckets
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(i, n)| (if i == 0 { 0 } else { 1u64 << (i - 1) }, *n))
                .collect(),
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn hist(values: &[u64]) -> Histogram {
        let mut h = Histogram::EMPTY;
        values.iter().for_each(|v| h.record(*v));
        h
    }

    #[test]
    fn percentiles_are_bucket_upper_bounds_clamped_to_max() {
        // 100 values: 1..=100 ns.
        let values: Vec<u64> = (1..=100).collect();
        let h = hist(&values);
        // p50 = 50 lies in [32, 64) → upper bound 63.
        assert_eq!(percentile(&h, 0.5), Some(63));
        // p99 = 99 lies in [64, 128) → 127, clamped to max 100.
        assert_eq!(percentile(&h, 0.99), Some(100));
        assert_eq!(percentile(&hist(&[0, 0, 5]), 0.5), Some(0));
        assert_eq!(percentile(&Histogram::EMPTY, 0.5), None);
    }

    /// Against the exact quantiles of known samples: never below the true
    /// value, under twice it, never above the maximum.
    #[test]
    fn percentiles_bound_the_true_quantiles() {
        // A deterministic spread over six decades (xorshift).
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let mut values: Vec<u64> = (0..5000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                1 + (x % 1000) * 10u64.pow((x >> 32) as u32 % 6)
            })
            .collect();
        let h = hist(&values);
        values.sort_unstable();
        for q in [0.01, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0] {
            let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
            let truth = values[rank - 1];
            let got = percentile(&h, q).unwrap();
            assert!(
                got >= truth && got < 2 * truth && got <= h.max_ns,
                "q {q}: true {truth}, reported {got}"
            );
        }
        let timing = Timing::from_hist(&h).unwrap();
        assert_eq!(timing.avg_ns, values.iter().sum::<u64>() / 5000);
        assert_eq!(timing.max_ns, *values.last().unwrap());
        assert_eq!(timing.buckets.iter().map(|(_, n)| n).sum::<u64>(), 5000);
    }

    #[test]
    fn per_cpu_histograms_merge() {
        let (a, b) = (hist(&[10, 20]), hist(&[5, 1000]));
        let mut m = Histogram::EMPTY;
        merge(&mut m, &a);
        merge(&mut m, &b);
        assert_eq!(m, hist(&[10, 20, 5, 1000]));
    }
}
