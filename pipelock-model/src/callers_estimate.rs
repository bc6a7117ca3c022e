//! Sampled call stacks' estimates: how a lock's caller rows share what
//! its exact figures leave over after their unsampled records, and the
//! 95 % margins of those shares (see docs/why.md, "What stacks cost").
use pipelock_common::{DetailStats, sampling};
use statrs::distribution::{ContinuousCDF, Normal};

use super::CallerMargin;

/// Standard normal quantile of a two-sided 95 % interval (1.959964).
pub(super) fn z95() -> f64 {
    Normal::standard().inverse_cdf(0.975)
}

/// A lock's own figures, which count every event, sampled or not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockTotals {
    /// Every acquisition (hooked modes; 0 in tracepoint mode).
    pub acquisitions: u64,
    pub contentions: u64,
    pub wait_ns: u64,
    pub hold_ns: u64,
}

/// One of a lock's figures as its caller rows share it: `left` is what
/// the rows did not record exactly (the lock's exact figure less the
/// rows' unsampled records), `sampled` the sum of the same figure over
/// the rows' sampled records. A row gets `left` in proportion to its part
/// of `sampled`: a ratio estimator, which makes the rows add up to the
/// lock's own figure, so that no row can claim more than its lock had.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Pool {
    left: u64,
    sampled: u64,
}

impl Pool {
    fn share(&self, sampled: u64) -> f64 {
        if self.sampled == 0 {
            0.0
        } else {
            self.left as f64 * sampled as f64 / self.sampled as f64
        }
    }
}

/// What sampling left a lock's caller rows to estimate, figure by figure
/// (see [`Pool`]), and the scale of one event's share of a total.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Remainder {
    totals: LockTotals,
    acquisitions: Pool,
    contentions: Pool,
    wait_ns: Pool,
    hold_ns: Pool,
    /// The root mean square wait and hold (ns) of the lock's sampled
    /// records (or, where none was sampled, of its events).
    wait_rms_ns: f64,
    hold_rms_ns: f64,
}

/// A part's figures recorded exactly: its totals less what its sampled
/// records counted (`sample` times each).
fn exact_of(stats: &DetailStats, sample: u32) -> [u64; 4] {
    let w = u64::from(sample.max(1));
    let s = &stats.sampled;
    [
        stats.acquisitions.saturating_sub(w * s[sampling::RECORDS]),
        stats.contentions.saturating_sub(w * s[sampling::CONTENDED]),
        stats
            .wait_ns
            .saturating_sub(w.saturating_mul(s[sampling::WAIT_SUM])),
        stats
            .hold_ns
            .saturating_sub(w.saturating_mul(s[sampling::HOLD_SUM])),
    ]
}

/// A part's sampled records, per figure (records standing for
/// acquisitions, contended ones, and their unweighted wait and hold).
fn sampled_of(stats: &DetailStats) -> [u64; 4] {
    let s = &stats.sampled;
    [
        s[sampling::RECORDS],
        s[sampling::CONTENDED],
        s[sampling::WAIT_SUM],
        s[sampling::HOLD_SUM],
    ]
}

impl Remainder {
    /// From a lock's totals and its caller parts.
    pub fn of<'a>(
        totals: &LockTotals,
        parts: impl IntoIterator<Item = &'a DetailStats>,
        sample: u32,
        hooked: bool,
    ) -> Self {
        let (mut exact, mut sampled) = ([0u64; 4], [0u64; 4]);
        let (mut wait_squares, mut hold_squares) = (0u64, 0u64);
        for part in parts {
            for (sum, x) in exact.iter_mut().zip(exact_of(part, sample)) {
                *sum = sum.saturating_add(x);
            }
            for (sum, x) in sampled.iter_mut().zip(sampled_of(part)) {
                *sum = sum.saturating_add(x);
            }
            wait_squares = wait_squares.saturating_add(part.sampled[sampling::WAIT_SQUARES]);
            hold_squares = hold_squares.saturating_add(part.sampled[sampling::HOLD_SQUARES]);
        }
        let records = sampled[0];
        let unit = f64::from(1u32 << sampling::SQUARE_SHIFT);
        // Without a sampled record, the lock's mean stands in; in
        // tracepoint mode a left-out wait is shorter than LONG_WAIT_NS.
        let per = |total: u64, events: u64| total as f64 / events.max(1) as f64;
        let (wait_rms_ns, hold_rms_ns) = if records > 0 {
            (
                (wait_squares as f64 / records as f64).sqrt() * unit,
                (hold_squares as f64 / records as f64).sqrt() * unit,
            )
        } else if hooked {
            (
                per(totals.wait_ns, totals.acquisitions),
                per(totals.hold_ns, totals.acquisitions),
            )
        } else {
            (
                per(totals.wait_ns, totals.contentions).min(sampling::LONG_WAIT_NS as f64),
                0.0,
            )
        };
        let pool = |total: u64, i: usize| Pool {
            left: total.saturating_sub(exact[i]),
            sampled: sampled[i],
        };
        Self {
            totals: *totals,
            acquisitions: if hooked {
                pool(totals.acquisitions, 0)
            } else {
                Pool::default()
            },
            contentions: pool(totals.contentions, 1),
            wait_ns: pool(totals.wait_ns, 2),
            hold_ns: if hooked {
                pool(totals.hold_ns, 3)
            } else {
                Pool::default()
            },
            wait_rms_ns,
            hold_rms_ns,
        }
    }

    /// Whether every event of the lock is in its rows as recorded.
    fn is_exact(&self) -> bool {
        self.acquisitions.left == 0 && self.contentions.left == 0
    }
}

/// A caller part's figures as the report gives them: what it recorded
/// exactly plus its share of what the lock's rows sampled, never more
/// than the lock's own figure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Estimate {
    pub acquisitions: u64,
    pub contentions: u64,
    pub wait_ns: u64,
    pub hold_ns: u64,
}

impl Estimate {
    pub fn of(stats: &DetailStats, sample: u32, rem: &Remainder) -> Self {
        if sample <= 1 {
            return Self {
                acquisitions: stats.acquisitions,
                contentions: stats.contentions,
                wait_ns: stats.wait_ns,
                hold_ns: stats.hold_ns,
            };
        }
        let [a, c, wait, hold] = exact_of(stats, sample);
        let [ra, rc, rw, rh] = sampled_of(stats);
        let t = &rem.totals;
        let est = |exact: u64, pool: &Pool, sampled: u64, total: u64| {
            (exact + pool.share(sampled).round() as u64).min(total.max(exact))
        };
        Self {
            acquisitions: est(a, &rem.acquisitions, ra, t.acquisitions),
            contentions: est(c, &rem.contentions, rc, t.contentions),
            wait_ns: est(wait, &rem.wait_ns, rw, t.wait_ns),
            hold_ns: est(hold, &rem.hold_ns, rh, t.hold_ns),
        }
    }
}

/// The half-width of the two-sided 95 % interval of a share of which `n`
/// of `of` sampled records were seen (Wilson's score interval: for n = 0
/// its upper end is z²/(of + z²), where the plug-in variance would call
/// the share exactly 0), as the larger of its two sides.
pub(super) fn share_margin(n: u64, of: u64) -> f64 {
    if of == 0 {
        return 1.0;
    }
    let (n, m) = (n as f64, of as f64);
    let p = n / m;
    let z = z95();
    let z2 = z * z;
    let centre = (p + z2 / (2.0 * m)) / (1.0 + z2 / m);
    let half = z / (1.0 + z2 / m) * (p * (1.0 - p) / m + z2 / (4.0 * m * m)).sqrt();
    (p - (centre - half)).max(centre + half - p)
}

impl CallerMargin {
    /// The margins of a part's estimates (see [`Estimate`]). Its records
    /// are a random sample of what the lock left to estimate: its count's
    /// margin is that count times the margin of the part's share of the
    /// records (Wilson's interval); a row none of whose records was
    /// sampled still has one, unless the lock left nothing to estimate.
    /// A total's margin is the count's times the root mean square of the
    /// row's sampled figures, pooled with one record at the lock's, and
    /// never more than the lock left. None when nothing was left to estimate.
    pub fn of(stats: &DetailStats, sample: u32, hooked: bool, rem: &Remainder) -> Option<Self> {
        if sample <= 1 || rem.is_exact() {
            return None;
        }
        let count = |n: u64, pool: &Pool| pool.left as f64 * share_margin(n, pool.sampled);
        let records = stats.sampled[sampling::RECORDS];
        let unit = f64::from(1u32 << sampling::SQUARE_SHIFT);
        let rms = |squares: u64, lock_rms: f64| {
            ((squares as f64 * unit * unit + lock_rms * lock_rms) / (records as f64 + 1.0)).sqrt()
        };
        let contentions = count(stats.sampled[sampling::CONTENDED], &rem.contentions);
        let acquisitions = count(records, &rem.acquisitions);
        // Every record carries a wait: contended ones only in tracepoint
        // mode, every acquisition in the hooked modes.
        let wait_events = if hooked { acquisitions } else { contentions };
        let total = |events: f64, squares: u64, lock_rms: f64, pool: &Pool| {
            (events * rms(squares, lock_rms)).min(pool.left as f64).round() as u64
        };
        Some(Self {
            acquisitions: hooked.then(|| acquisitions.round() as u64),
            contentions: contentions.round() as u64,
            wait_total_ns: total(
                wait_events,
                stats.sampled[sampling::WAIT_SQUARES],
                rem.wait_rms_ns,
                &rem.wait_ns,
            ),
            hold_total_ns: hooked.then(|| {
                total(
                    acquisitions,
                    stats.sampled[sampling::HOLD_SQUARES],
                    rem.hold_rms_ns,
                    &rem.hold_ns,
                )
            }),
        })
    }

    /// The margins of a sum of independent estimates: their variances add.
    pub(super) fn plus(a: Option<Self>, b: Option<Self>) -> Option<Self> {
        let (a, b) = match (a, b) {
            (None, None) => return None,
            (a, b) => (a.unwrap_or_default(), b.unwrap_or_default()),
        };
        let q = |x: u64, y: u64| ((x as f64).powi(2) + (y as f64).powi(2)).sqrt().round() as u64;
        let qo = |x: Option<u64>, y: Option<u64>| match (x, y) {
            (None, None) => None,
            (x, y) => Some(q(x.unwrap_or(0), y.unwrap_or(0))),
        };
        Some(Self {
            acquisitions: qo(a.acquisitions, b.acquisitions),
            contentions: q(a.contentions, b.contentions),
            wait_total_ns: q(a.wait_total_ns, b.wait_total_ns),
            hold_total_ns: qo(a.hold_total_ns, b.hold_total_ns),
        })
    }
}
