//! Timings from the programs' log-linear histograms: merging per-CPU and
//! per-interval values, percentiles with their error bound, and the
//! [`Timing`] a row reports.
use pipelock_common::{BucketCount, Histogram, LockStats, loglinear};
use serde::{Deserialize, Serialize};

/// How far a reported percentile can be from the true one, said once per
/// report where the percentiles are read.
pub const PERCENTILE_RESOLUTION: &str =
    "log-linear buckets: p50/p90/p99/p99.9 within ±6.25 % of the true value (exact below 16 ns)";

/// Adds one CPU's (or one interval's) histogram to a running one, widening
/// the maps' `u32` buckets (max is the max of maxima).
pub fn merge<C: BucketCount>(into: &mut Histogram<u64>, from: &Histogram<C>) {
    into.count += from.count;
    into.total_ns += from.total_ns;
    into.max_ns = into.max_ns.max(from.max_ns);
    for (a, &b) in into.buckets.iter_mut().zip(from.buckets.iter()) {
        *a += b.into();
    }
}

/// Adds one CPU's (or one interval's) statistics of a lock to another's.
pub fn merge_stats<C: BucketCount>(into: &mut LockStats<u64>, from: &LockStats<C>) {
    into.contentions += from.contentions;
    into.slept += from.slept;
    into.dropped += from.dropped;
    merge(&mut into.wait, &from.wait);
    merge(&mut into.hold, &from.hold);
}

/// The percentiles a [`Timing`] reports, as (quantile, JSON/CSV name).
pub const PERCENTILES: [(f64, &str); 4] = [(0.50, "p50"), (0.90, "p90"), (0.99, "p99"), (0.999, "p99.9")];

/// Timings of one kind (wait or hold) of one lock, as reported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    pub count: u64,
    pub total_ns: u64,
    pub avg_ns: u64,
    pub p50_ns: u64,
    #[serde(default)]
    pub p90_ns: u64,
    pub p99_ns: u64,
    #[serde(default)]
    pub p999_ns: u64,
    pub max_ns: u64,
    /// The largest relative error of the percentiles above against the
    /// true ones (0.0625, or 0 where all fall in exact buckets); None when
    /// one lies beyond the buckets' range (68.7 s) and is the maximum.
    #[serde(default)]
    pub percentile_error: Option<f64>,
    /// Non-empty log-linear buckets as (lower bound ns, count); a bucket
    /// ends where the next of the scheme begins ([`loglinear::lower`]).
    pub buckets: Vec<(u64, u64)>,
}

impl Timing {
    pub fn from_hist(hist: &Histogram<u64>) -> Option<Self> {
        if hist.count == 0 {
            return None;
        }
        let at = |q| loglinear::percentile(&hist.buckets, hist.max_ns, q);
        let [p50, p90, p99, p999] = PERCENTILES.map(|(q, _)| at(q));
        let error = [p50, p90, p99, p999]
            .iter()
            .try_fold(0.0f64, |worst, p| Some(worst.max(p.and_then(|p| p.error)?)));
        let ns = |p: Option<loglinear::Percentile>| p.map_or(0, |p| p.ns.round() as u64);
        Some(Self {
            count: hist.count,
            total_ns: hist.total_ns,
            avg_ns: hist.total_ns / hist.count,
            p50_ns: ns(p50),
            p90_ns: ns(p90),
            p99_ns: ns(p99),
            p999_ns: ns(p999),
            max_ns: hist.max_ns,
            percentile_error: error,
            buckets: hist
                .buckets
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(i, n)| (loglinear::lower(i), *n))
                .collect(),
        })
    }

    /// The histogram the buckets stand for (totals and maximum as
    /// reported): how reports read back from JSON are merged.
    pub fn to_hist(&self) -> Histogram<u64> {
        let mut hist = Histogram::EMPTY;
        for &(lower, n) in &self.buckets {
            hist.buckets[loglinear::bucket(lower)] += n;
        }
        hist.count = self.count;
        hist.total_ns = self.total_ns;
        hist.max_ns = self.max_ns;
        hist
    }
}

/// The bound a percentile shown alone carries, e.g. "±6.25 %".
pub fn error_label(error: Option<f64>) -> String {
    match error {
        Some(0.0) => "exact".to_owned(),
        Some(e) => format!("±{:.2} %", e * 100.0),
        None => "beyond 68.7 s: the maximum".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use pipelock_common::loglinear::RELATIVE_ERROR;

    use super::*;
    use crate::fixtures::hist;

    /// Against the exact quantiles of known samples: each percentile
    /// within the stated bound, never above the maximum.
    #[test]
    fn percentiles_are_within_their_bound_of_the_true_quantiles() {
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
        let timing = Timing::from_hist(&h).unwrap();
        let reported = [timing.p50_ns, timing.p90_ns, timing.p99_ns, timing.p999_ns];
        for ((q, name), got) in PERCENTILES.iter().zip(reported) {
            let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
            let truth = values[rank - 1] as f64;
            // Rounding to whole ns adds at most half of one.
            let error = (got as f64 - truth).abs() - 0.5;
            assert!(
                error <= RELATIVE_ERROR * truth && got <= h.max_ns,
                "{name}: true {truth}, reported {got}"
            );
        }
        assert_eq!(timing.percentile_error, Some(RELATIVE_ERROR));
        assert_eq!(timing.avg_ns, values.iter().sum::<u64>() / 5000);
        assert_eq!(timing.max_ns, *values.last().unwrap());
        assert_eq!(timing.buckets.iter().map(|(_, n)| n).sum::<u64>(), 5000);
        assert_eq!(timing.to_hist(), h);
    }

    #[test]
    fn short_waits_are_exact_and_long_ones_unbounded() {
        let short = Timing::from_hist(&hist(&[3, 5, 7, 9])).unwrap();
        assert_eq!((short.p50_ns, short.p99_ns), (5, 9));
        assert_eq!(short.percentile_error, Some(0.0));
        let long = Timing::from_hist(&hist(&[100, 120_000_000_000])).unwrap();
        assert_eq!(long.p99_ns, 120_000_000_000);
        assert_eq!(long.percentile_error, None);
        assert_eq!(error_label(long.percentile_error), "beyond 68.7 s: the maximum");
        assert_eq!(error_label(Some(RELATIVE_ERROR)), "±6.25 %");
    }

    #[test]
    fn per_cpu_histograms_merge_and_widen() {
        let mut narrow = Histogram::<u32>::EMPTY;
        narrow.buckets[loglinear::bucket(1000)] = u32::MAX;
        narrow.max_ns = 1000;
        let mut m = Histogram::EMPTY;
        merge(&mut m, &narrow);
        merge(&mut m, &narrow);
        assert_eq!(m.buckets[loglinear::bucket(1000)], 2 * u64::from(u32::MAX));
        let (a, b) = (hist(&[10, 20]), hist(&[5, 1000]));
        let mut m = Histogram::EMPTY;
        merge(&mut m, &a);
        merge(&mut m, &b);
        assert_eq!(m, hist(&[10, 20, 5, 1000]));
    }
}
