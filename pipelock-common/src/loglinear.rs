//! Log-linear buckets for wait and hold times (HdrHistogram's scheme):
//! each power of two split into [`SUB_BUCKETS`] equal parts, so a bucket's
//! midpoint is within [`RELATIVE_ERROR`] of any duration in it, where a
//! log2 bucket's bound is only within 2×. Durations below 16 ns have a
//! bucket each and are exact.
//!
//! [`BUCKETS`] buckets reach 2^36 ns (68.7 s); the last one also takes
//! everything longer, and a percentile that falls there is reported as
//! the longest duration seen, without a bound. Eight parts per octave, not
//! sixteen: with the midpoint reported, eight already give the 6.25 %
//! bound sixteen give with the upper edge, at half the map memory.
//!
//! The bucket is found with a count of leading zeros, a shift and a mask:
//! no loop and no table, so the programs pay for it what they pay for a
//! log2 bucket.

/// log2 of the parts each power of two is split into.
pub const SUB_BUCKET_BITS: u32 = 3;
/// Parts each power of two is split into.
pub const SUB_BUCKETS: u64 = 1 << SUB_BUCKET_BITS;
/// The longest duration with a bucket of its own is `2^TOP_BIT - 1` ns.
pub const TOP_BIT: u32 = 36;
/// Buckets 0..16 hold 0..16 ns one each; then `SUB_BUCKETS` per power of
/// two from 2^4 up to 2^`TOP_BIT`.
pub const BUCKETS: usize = ((TOP_BIT - SUB_BUCKET_BITS + 1) << SUB_BUCKET_BITS) as usize;
/// How far a bucket's midpoint can be from a duration in it, relative to
/// the duration: half a part (1/16 of a power of two) over the smallest
/// duration of the bucket (at least 8 parts).
pub const RELATIVE_ERROR: f64 = 1.0 / (2 * SUB_BUCKETS) as f64;

/// The bucket of a duration in nanoseconds.
#[inline(always)]
pub const fn bucket(ns: u64) -> usize {
    if ns < 2 * SUB_BUCKETS {
        return ns as usize;
    }
    // The highest set bit picks the power of two, the next three bits the part.
    let top = u64::BITS - 1 - ns.leading_zeros();
    let index = (((top - SUB_BUCKET_BITS + 1) as u64) << SUB_BUCKET_BITS)
        + ((ns >> (top - SUB_BUCKET_BITS)) & (SUB_BUCKETS - 1));
    if index as usize >= BUCKETS {
        BUCKETS - 1
    } else {
        index as usize
    }
}

/// The shortest duration bucket `index` holds.
pub const fn lower(index: usize) -> u64 {
    let i = index as u64;
    if i < 2 * SUB_BUCKETS {
        return i;
    }
    let shift = (i >> SUB_BUCKET_BITS) - 1;
    (SUB_BUCKETS + (i & (SUB_BUCKETS - 1))) << shift
}

/// How many nanosecond values bucket `index` holds (the last: its own,
/// though it takes everything longer too).
pub const fn width(index: usize) -> u64 {
    let i = index as u64;
    if i < 2 * SUB_BUCKETS {
        1
    } else {
        1 << ((i >> SUB_BUCKET_BITS) - 1)
    }
}

/// The duration a bucket stands for: the middle of the values it holds.
pub fn midpoint(index: usize) -> f64 {
    lower(index) as f64 + (width(index) - 1) as f64 / 2.0
}

/// A percentile read from buckets.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Percentile {
    /// The estimate, in nanoseconds.
    pub ns: f64,
    /// Its largest relative error against the true percentile of the
    /// recorded durations: 0 where the bucket holds one value,
    /// [`RELATIVE_ERROR`] in general, None beyond the last bucket's range
    /// (`ns` is then the longest duration).
    pub error: Option<f64>,
}

/// The `q` percentile (0 < q ≤ 1) of the durations counted in `buckets`,
/// by nearest rank (the duration ⌈q·n⌉-th in order, as the exact
/// percentile of the same durations is defined here), `max_ns` being the
/// longest of them. None for an empty histogram.
pub fn percentile(buckets: &[u64], max_ns: u64, q: f64) -> Option<Percentile> {
    let count: u64 = buckets.iter().sum();
    if count == 0 {
        return None;
    }
    let wanted = q.clamp(0.0, 1.0) * count as f64;
    let mut rank = wanted as u64;
    if (rank as f64) < wanted {
        rank += 1;
    }
    let rank = rank.clamp(1, count);
    let mut seen = 0;
    let index = buckets
        .iter()
        .position(|&n| {
            seen += n;
            seen >= rank
        })
        .unwrap_or(buckets.len() - 1);
    if index == BUCKETS - 1 && max_ns >= lower(index) + width(index) {
        return Some(Percentile {
            ns: max_ns as f64,
            error: None,
        });
    }
    // Every duration is ≤ max: clamped, the estimate only gets closer.
    let ns = midpoint(index).min(max_ns as f64);
    let error = if width(index) == 1 { 0.0 } else { RELATIVE_ERROR };
    Some(Percentile {
        ns,
        error: Some(error),
    })
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;

    #[test]
    fn buckets_hold_what_their_bounds_say() {
        assert_eq!(BUCKETS, 272);
        assert_eq!(bucket(15), 15);
        assert_eq!(bucket(16), 16);
        assert_eq!(bucket(17), 16);
        assert_eq!(bucket(18), 17);
        assert_eq!(bucket((1 << TOP_BIT) - 1), BUCKETS - 1);
        assert_eq!(bucket(1 << TOP_BIT), BUCKETS - 1);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        let mut previous = 0;
        for index in 0..BUCKETS {
            assert!(
                index == 0 || lower(index) == previous,
                "bucket {index} starts where {} ends",
                index - 1
            );
            previous = lower(index) + width(index);
            for ns in [lower(index), previous - 1] {
                assert_eq!(bucket(ns), index, "{ns} ns");
            }
        }
        assert_eq!(previous, 1 << TOP_BIT);
    }

    #[test]
    fn a_midpoint_is_within_the_bound_of_every_duration_in_its_bucket() {
        let worst = (1..1u64 << 20)
            .chain((20..TOP_BIT).flat_map(|bit| [1u64 << bit, (2u64 << bit) - 1, 3u64 << (bit - 1)]))
            .map(|ns| (midpoint(bucket(ns)) - ns as f64).abs() / ns as f64)
            .fold(0.0, f64::max);
        assert!(worst <= RELATIVE_ERROR, "{worst}");
        // The bound is tight to within a part: the scheme is not looser than said.
        assert!(worst > RELATIVE_ERROR * 0.8, "{worst}");
    }

    /// xorshift64*: known sample sets without a dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
        }
        /// A standard normal, by Box–Muller.
        fn normal(&mut self) -> f64 {
            let (u, v) = (self.next().max(f64::MIN_POSITIVE), self.next());
            (-2.0 * u.ln()).sqrt() * (2.0 * core::f64::consts::PI * v).cos()
        }
    }

    fn exact(sorted: &[u64], q: f64) -> u64 {
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1]
    }

    /// Worst relative error of p50, p90, p99, p99.9 and max against the
    /// exact percentiles of `values`, through `to_buckets`/`estimate`.
    fn worst_error(values: &mut [u64], estimate: impl Fn(&[u64], f64) -> f64) -> f64 {
        values.sort_unstable();
        [0.5, 0.9, 0.99, 0.999, 1.0]
            .iter()
            .map(|&q| {
                let truth = exact(values, q) as f64;
                (estimate(values, q) - truth).abs() / truth
            })
            .fold(0.0, f64::max)
    }

    fn loglinear(values: &[u64], q: f64) -> f64 {
        let mut buckets = [0u64; BUCKETS];
        for &v in values {
            buckets[bucket(v)] += 1;
        }
        let max = *values.iter().max().unwrap();
        let p = percentile(&buckets, max, q).unwrap();
        assert!(p.error.is_some_and(|e| e <= RELATIVE_ERROR));
        p.ns
    }

    /// The log2 histogram's estimate: the bucket's upper bound.
    fn log2(values: &[u64], q: f64) -> f64 {
        // Bucket i holds durations of bit length i: [2^(i-1), 2^i).
        let mut buckets = [0u64; 65];
        for &v in values {
            buckets[(u64::BITS - v.leading_zeros()) as usize] += 1;
        }
        let mut rank = ((q * values.len() as f64).ceil() as u64).max(1);
        let index = buckets
            .iter()
            .position(|&n| {
                let here = rank <= n;
                rank = rank.saturating_sub(n);
                here
            })
            .unwrap();
        ((1u64 << index) - 1) as f64
    }

    fn sample_sets() -> Vec<(&'static str, Vec<u64>)> {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let n = 100_000;
        let uniform = (0..n).map(|_| 1_000 + (rng.next() * 999_000.0) as u64).collect();
        // Median 2.6 µs, σ 1 in log space: an uncontended-to-herd wait spread.
        let lognormal = (0..n)
            .map(|_| (2_600.0 * rng.normal().exp()) as u64 + 1)
            .collect();
        // Mostly ~2 µs spins, 5 % ~50 ms sleeps behind a stalled holder.
        let bimodal = (0..n)
            .map(|_| {
                let centre = if rng.next() < 0.05 { 50_000_000.0 } else { 2_000.0 };
                (centre * (1.0 + 0.1 * rng.normal())).max(1.0) as u64
            })
            .collect();
        std::vec![
            ("uniform", uniform),
            ("log-normal", lognormal),
            ("bimodal", bimodal)
        ]
    }

    #[test]
    fn percentiles_of_known_sets_are_within_the_bound() {
        for (name, mut values) in sample_sets() {
            let worst = worst_error(&mut values, loglinear);
            assert!(worst <= RELATIVE_ERROR, "{name}: {worst}");
            // The same sets through log2 buckets miss by far more: these
            // sets tell a bounded scheme from an unbounded one.
            let old = worst_error(&mut values, log2);
            assert!(old > 0.1, "{name}: log2 {old}");
            std::println!(
                "{name}: worst error {:.2}% (log2 buckets: {:.1}%)",
                worst * 100.0,
                old * 100.0
            );
        }
    }

    #[test]
    fn edges_empty_exact_and_beyond_the_range() {
        assert_eq!(percentile(&[0; BUCKETS], 0, 0.5), None);
        let mut buckets = [0u64; BUCKETS];
        buckets[bucket(7)] = 3;
        assert_eq!(
            percentile(&buckets, 7, 0.99),
            Some(Percentile {
                ns: 7.0,
                error: Some(0.0)
            })
        );
        // One duration of two minutes: beyond the buckets, reported as the max.
        let long = 120_000_000_000;
        buckets[bucket(long)] = 1;
        assert_eq!(
            percentile(&buckets, long, 1.0),
            Some(Percentile {
                ns: long as f64,
                error: None
            })
        );
        assert_eq!(percentile(&buckets, long, 0.5).unwrap().ns, 7.0);
    }

    #[test]
    fn a_50_ms_wait_reads_50_ms() {
        let mut buckets = [0u64; BUCKETS];
        let ns = 50_000_000;
        buckets[bucket(ns)] = 10;
        let p50 = percentile(&buckets, ns, 0.5).unwrap();
        assert!(
            (p50.ns - ns as f64).abs() / ns as f64 <= RELATIVE_ERROR,
            "{p50:?}"
        );
    }
}
