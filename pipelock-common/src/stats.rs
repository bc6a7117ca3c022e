//! Per-lock statistics as the programs keep them and userspace reads them:
//! counters and log-linear histograms of wait and hold times
//! ([`crate::loglinear`]).
use crate::loglinear;

/// What a histogram bucket counts in: `u32` in the maps, where userspace
/// drains every value within seconds (a bucket would need 4 × 10⁹ waits of
/// one lock in one drain to wrap), at half the map memory of `u64`;
/// `u64` in userspace, where a run's totals accumulate for months.
pub trait BucketCount: Copy + Into<u64> {
    const ZERO: Self;
}

impl BucketCount for u32 {
    const ZERO: Self = 0;
}

impl BucketCount for u64 {
    const ZERO: Self = 0;
}

/// Per-lock statistics (one value for all CPUs, updated with atomic adds),
/// with the maps' `u32` buckets unless said otherwise.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockStats<C = u32> {
    /// Acquisitions that went to the slow path (a `contention_begin` was
    /// seen), counted by the hooked modes. Tracepoint mode leaves it 0: all
    /// it records are contended waits, so the wait histogram's count is
    /// this, and an atomic add per event is saved ([`LockStats::contended`]).
    pub contentions: u64,
    /// Of those, the ones that went to sleep (a begin without
    /// `LCB_F_SPIN`). The exception is counted, not the rule: a spinlock
    /// never sleeps and most pipe-mutex waits only spin, so this add is
    /// rarely made; "spin only" is the rest ([`LockStats::spin_only`]).
    pub slept: u64,
    /// Events on this lock that were seen but could not be timed (a release
    /// or end without its acquisition, a hold still open when its call returned).
    pub dropped: u64,
    /// Lock call to acquisition, in ns: every acquisition in fentry/kprobe
    /// mode, contended ones (begin → end) in tracepoint mode.
    pub wait: Histogram<C>,
    /// Acquisition to release, in ns (fentry/kprobe mode only).
    pub hold: Histogram<C>,
    /// Hooked modes: the thread that released the lock last. A spinlock
    /// has no owner field; its contended acquirer waited for this thread.
    /// Not a figure: userspace neither sums nor shows it.
    pub last_holder: u64,
}

impl<C: BucketCount> LockStats<C> {
    pub const EMPTY: Self = Self {
        contentions: 0,
        slept: 0,
        dropped: 0,
        last_holder: 0,
        wait: Histogram::EMPTY,
        hold: Histogram::EMPTY,
    };

    /// Every acquisition, in the hooked modes: each is recorded with its
    /// wait (~0 when uncontended), so the wait histogram counts them and
    /// the programs need no counter of their own. None in tracepoint mode,
    /// which sees contended acquisitions only.
    pub fn acquisitions(&self, hooked: bool) -> Option<u64> {
        hooked.then_some(self.wait.count)
    }

    /// Contended acquisitions: counted in the hooked modes, and in
    /// tracepoint mode the waits it recorded (each is one). The wait's
    /// `count` must have been taken from its buckets.
    pub fn contended(&self, hooked: bool) -> u64 {
        if hooked { self.contentions } else { self.wait.count }
    }

    /// Contended acquisitions that only spun.
    pub fn spin_only(&self, hooked: bool) -> u64 {
        self.contended(hooked).saturating_sub(self.slept)
    }
}

/// Aggregated timings of one kind (wait or hold) of one lock.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Histogram<C = u32> {
    /// Number of recorded durations. The programs leave it 0: userspace
    /// sets it to the sum of the buckets when it reads a map
    /// ([`Histogram::count_buckets`]).
    pub count: u64,
    /// Sum of recorded durations, in nanoseconds.
    pub total_ns: u64,
    /// Longest recorded duration, in nanoseconds.
    pub max_ns: u64,
    /// Per-bucket counts; see [`loglinear::bucket`].
    pub buckets: [C; loglinear::BUCKETS],
}

impl<C: BucketCount> Histogram<C> {
    pub const EMPTY: Self = Self {
        count: 0,
        total_ns: 0,
        max_ns: 0,
        buckets: [C::ZERO; loglinear::BUCKETS],
    };

    /// `count` from the buckets (each recorded duration is in exactly one).
    pub fn count_buckets(&mut self) {
        self.count = self.buckets.iter().map(|&n| n.into()).sum();
    }
}

impl Histogram<u64> {
    /// Records one duration (not atomic: for userspace merges and tests).
    pub fn record(&mut self, value_ns: u64) {
        self.count += 1;
        self.total_ns += value_ns;
        self.max_ns = self.max_ns.max(value_ns);
        self.buckets[loglinear::bucket(value_ns)] += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waits(buckets: &[(usize, u32)]) -> Histogram {
        let mut hist = Histogram::EMPTY;
        for &(bucket, n) in buckets {
            hist.buckets[bucket] = n;
        }
        hist.count_buckets();
        hist
    }

    #[test]
    fn tracepoint_mode_contentions_are_its_waits() {
        let stats = LockStats {
            slept: 2,
            wait: waits(&[(10, 5), (20, 3)]),
            ..LockStats::EMPTY
        };
        assert_eq!(stats.contended(false), 8);
        assert_eq!(stats.spin_only(false), 6);
    }

    #[test]
    fn hooked_modes_count_contentions_apart_from_their_waits() {
        // Every acquisition has a wait there, contended or not.
        let stats = LockStats {
            contentions: 7,
            slept: 1,
            wait: waits(&[(3, 93), (12, 7)]),
            ..LockStats::EMPTY
        };
        assert_eq!(stats.acquisitions(true), Some(100));
        assert_eq!(stats.acquisitions(false), None);
        assert_eq!(stats.contended(true), 7);
        assert_eq!(stats.spin_only(true), 6);
    }

    #[test]
    fn record_tracks_count_total_max_and_bucket() {
        let mut h = Histogram::<u64>::EMPTY;
        for v in [0, 5, 5, 1000] {
            h.record(v);
        }
        assert_eq!(h.count, 4);
        assert_eq!(h.total_ns, 1010);
        assert_eq!(h.max_ns, 1000);
        assert_eq!(h.buckets[0], 1);
        assert_eq!(h.buckets[5], 2);
        assert_eq!(h.buckets[loglinear::bucket(1000)], 1);
        assert_eq!(h.buckets.iter().sum::<u64>(), h.count);
    }
}
