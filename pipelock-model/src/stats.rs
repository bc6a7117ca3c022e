//! Repeat-run statistics: summaries, UnixBench scoring, and Welch's t-test for
//! `pipelock compare`. Pure functions, unit-tested on fixed inputs.
use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, StudentsT};

/// Mean, spread and extremes of per-run values.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub n: usize,
    pub mean: f64,
    pub min: f64,
    pub max: f64,
    /// Sample standard deviation (n − 1); 0 for a single run.
    pub stddev: f64,
}

impl Summary {
    pub fn of(values: &[f64]) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        let n = values.len();
        let mean = values.iter().sum::<f64>() / n as f64;
        let var = if n > 1 {
            values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64
        } else {
            0.0
        };
        Some(Self {
            n,
            mean,
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            stddev: var.sqrt(),
        })
    }

    /// Standard deviation as a percentage of the mean.
    pub fn cv_percent(&self) -> f64 {
        if self.mean == 0.0 {
            0.0
        } else {
            100.0 * self.stddev / self.mean
        }
    }
}

/// UnixBench's score for "lps" tests: drop the lowest third of the samples
/// (floor(n/3)), take the geometric mean of the rest. Returns (score, kept).
pub fn unixbench_score(samples: &[f64]) -> Option<(f64, usize)> {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let kept = &sorted[samples.len() / 3..];
    if kept.is_empty() || kept.iter().any(|v| *v <= 0.0) {
        return None;
    }
    let log_mean = kept.iter().map(|v| v.ln()).sum::<f64>() / kept.len() as f64;
    Some((log_mean.exp(), kept.len()))
}

/// UnixBench's baseline for Pipe Throughput (a SPARCstation 20-61 = 10.0).
pub const PIPE_THROUGHPUT_BASELINE_LPS: f64 = 12440.0;

pub fn unixbench_index(lps: f64, baseline: f64) -> f64 {
    lps / baseline * 10.0
}

/// Welch–Satterthwaite degrees of freedom of two means whose squared
/// standard errors are `va` (of `na` runs) and `vb` (of `nb`).
fn welch_df(va: f64, na: usize, vb: f64, nb: usize) -> f64 {
    (va + vb).powi(2) / (va.powi(2) / (na - 1) as f64 + vb.powi(2) / (nb - 1) as f64)
}

/// Student's t with `df` degrees of freedom (None for a df that is not > 0).
fn students_t(df: f64) -> Option<StudentsT> {
    StudentsT::new(0.0, 1.0, df).ok()
}

/// Welch's unequal-variance t-test: (t, degrees of freedom, two-sided p).
/// None when either side has fewer than two values or both have no variance.
pub fn welch_t_test(a: &[f64], b: &[f64]) -> Option<(f64, f64, f64)> {
    let (sa, sb) = (Summary::of(a)?, Summary::of(b)?);
    if sa.n < 2 || sb.n < 2 {
        return None;
    }
    let (va, vb) = (sa.stddev.powi(2) / sa.n as f64, sb.stddev.powi(2) / sb.n as f64);
    let se2 = va + vb;
    if se2 == 0.0 {
        return None;
    }
    let t = (sa.mean - sb.mean) / se2.sqrt();
    let df = welch_df(va, sa.n, vb, sb.n);
    let p = 2.0 * students_t(df)?.sf(t.abs());
    Some((t, df, p.clamp(0.0, 1.0)))
}

/// Student's t with `df` degrees of freedom: the t > 0 whose two-sided
/// tail probability is `p` (infinite for a df that is not > 0).
pub fn t_quantile(p: f64, df: f64) -> f64 {
    students_t(df).map_or(f64::INFINITY, |t| t.inverse_cdf(1.0 - p / 2.0))
}

/// Power of the detectable-change figure: a change that large is found
/// in four of five such experiments.
pub const POWER: f64 = 0.8;
/// The change (%) a verdict asks about unless told otherwise: if the runs
/// cannot detect it, the verdict says how many runs would.
pub const DEFAULT_DETECT_PERCENT: f64 = 5.0;

/// What two sets of runs can say about the change from A to B, in % of
/// A's mean.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Difference {
    pub change_percent: f64,
    /// Welch's 95 % confidence interval of the change.
    pub ci_low_percent: f64,
    pub ci_high_percent: f64,
    /// The smallest change (either way) a two-sided test at 5 % finds with
    /// 80 % power, given these runs' spread and number.
    pub detectable_percent: f64,
}

fn t_sum(df: f64) -> f64 {
    t_quantile(0.05, df) + t_quantile(2.0 * (1.0 - POWER), df)
}

impl Difference {
    /// None with fewer than two runs a side, no spread, or a zero mean for A.
    pub fn of(a: &Summary, b: &Summary) -> Option<Self> {
        if a.n < 2 || b.n < 2 || a.mean == 0.0 {
            return None;
        }
        let (va, vb) = (a.stddev.powi(2) / a.n as f64, b.stddev.powi(2) / b.n as f64);
        let se = (va + vb).sqrt();
        if se == 0.0 {
            // Constant on both sides (a bucket bound, say): no spread to
            // judge an interval by.
            return None;
        }
        let df = welch_df(va, a.n, vb, b.n);
        let scale = 100.0 / a.mean.abs();
        let change = b.mean - a.mean;
        let half = t_quantile(0.05, df) * se;
        Some(Self {
            change_percent: change * scale,
            ci_low_percent: (change - half) * scale,
            ci_high_percent: (change + half) * scale,
            detectable_percent: t_sum(df) * se * scale,
        })
    }
}

/// The most runs `runs_needed` answers with.
const MOST_RUNS: usize = 10_000;

/// Runs per kernel (the same on both sides) with which a change of
/// `percent` % of A's mean would be detectable, judging the spread by
/// these runs; None beyond 10 000 or without a spread to judge by.
pub fn runs_needed(a: &Summary, b: &Summary, percent: f64) -> Option<usize> {
    let spread = (a.stddev.powi(2) + b.stddev.powi(2)).sqrt();
    let wanted = percent.abs() / 100.0 * a.mean.abs();
    if a.n < 2 || b.n < 2 || wanted == 0.0 {
        return None;
    }
    let detects = |n: usize| t_sum((2 * n - 2) as f64) * spread / (n as f64).sqrt() <= wanted;
    // The detectable change only shrinks as n grows (both the t quantiles
    // and 1/√n fall), so the smallest n is found by halving the range: a
    // dozen quantiles, not one pair per n (which took seconds here and
    // minutes under emulation for a metric no number of runs resolves).
    if !detects(MOST_RUNS) {
        return None;
    }
    let (mut fails, mut holds) = (1, MOST_RUNS);
    while holds - fails > 1 {
        let mid = fails + (holds - fails) / 2;
        if detects(mid) {
            holds = mid;
        } else {
            fails = mid;
        }
    }
    Some(holds)
}

/// A per-run value with enough digits to compare, not more.
pub fn format_value(value: f64) -> String {
    if value.abs() >= 1000.0 {
        format!("{value:.1}")
    } else if value.abs() >= 1.0 {
        format!("{value:.3}")
    } else {
        format!("{value:.6}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn summary_of_fixed_values() {
        let s = Summary::of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]).unwrap();
        assert_eq!((s.n, s.mean, s.min, s.max), (8, 5.0, 2.0, 9.0));
        assert!(close(s.stddev, 2.138_089_935, 1e-9));
        assert_eq!(Summary::of(&[3.0]).unwrap().stddev, 0.0);
        assert!(Summary::of(&[]).is_none());
    }

    #[test]
    fn unixbench_index_reproduces_published_figure() {
        // 493023.3 lps → index 396.3, as in published UnixBench results.
        let index = unixbench_index(493_023.3, PIPE_THROUGHPUT_BASELINE_LPS);
        assert_eq!(format!("{index:.1}"), "396.3");
    }

    #[test]
    fn unixbench_score_drops_the_lowest_third() {
        // 10 passes: the 3 lowest are dropped, 7 kept.
        let samples = [1.0, 2.0, 3.0, 100.0, 100.0, 100.0, 100.0, 100.0, 100.0, 100.0];
        let (score, kept) = unixbench_score(&samples).unwrap();
        assert_eq!(kept, 7);
        assert!(close(score, 100.0, 1e-9));
        let (score, kept) = unixbench_score(&[1.0, 4.0]).unwrap();
        assert_eq!(kept, 2);
        assert!(close(score, 2.0, 1e-12));
    }

    #[test]
    fn welch_matches_a_reference_computation() {
        // Reference by direct formulas and numerical integration of Student's t
        // density (Simpson, 2e5 steps): t = -2.22551, df = 24.5246, p = 0.035485.
        let a = [19.8, 20.4, 19.6, 17.8, 18.5, 18.9, 18.3, 18.9, 19.5, 22.0];
        let b = [
            28.2, 26.6, 20.1, 23.3, 25.2, 22.1, 17.7, 27.6, 20.6, 13.7, 23.2, 17.5, 20.6, 18.0, 23.9, 21.6,
            24.3, 20.4, 23.9, 13.3,
        ];
        let (t, df, p) = welch_t_test(&a, &b).unwrap();
        assert!(close(t, -2.225_512, 1e-5), "t = {t}");
        assert!(close(df, 24.524_635, 1e-5), "df = {df}");
        assert!(close(p, 0.035_485, 1e-5), "p = {p}");
        let (_, _, p_same) = welch_t_test(&[1.0, 2.0, 3.0], &[1.0, 2.0, 3.0]).unwrap();
        assert!(close(p_same, 1.0, 1e-9));
        assert!(welch_t_test(&[1.0], &[2.0, 3.0]).is_none());
    }

    #[test]
    fn t_quantiles_match_the_tables() {
        // Student's t tables: t(0.975, 4) = 2.776445, t(0.975, 30) = 2.042272,
        // t(0.8, 10) = 0.879058; and t(0.975, 1) = tan(0.475π) = 12.706205.
        assert!((t_quantile(0.05, 4.0) - 2.776_445).abs() < 1e-6);
        assert!((t_quantile(0.05, 30.0) - 2.042_272).abs() < 1e-6);
        assert!((t_quantile(0.4, 10.0) - 0.879_058).abs() < 1e-6);
        assert!((t_quantile(0.05, 1.0) - 12.706_205).abs() < 1e-6);
        assert_eq!(t_quantile(0.05, 0.0), f64::INFINITY);
    }

    #[test]
    fn the_interval_and_the_detectable_change_follow_the_spread() {
        let a = Summary::of(&[100.0, 102.0, 98.0]).unwrap();
        let b = Summary::of(&[110.0, 112.0, 108.0]).unwrap();
        let d = Difference::of(&a, &b).unwrap();
        assert!((d.change_percent - 10.0).abs() < 1e-9);
        // se = sqrt(4/3 + 4/3) = 1.633, df = 4: half width 2.776 × 1.633 = 4.53 %.
        assert!((d.ci_low_percent - 5.47).abs() < 0.01, "{d:?}");
        assert!((d.ci_high_percent - 14.53).abs() < 0.01, "{d:?}");
        // (2.776 + 0.941) × 1.633 = 6.07 %.
        assert!((d.detectable_percent - 6.07).abs() < 0.01, "{d:?}");
        // A 5 % change needs more runs than these 3; a 20 % one fewer.
        let needed = runs_needed(&a, &b, 5.0).unwrap();
        assert!(needed > 3, "{needed}");
        assert_eq!(runs_needed(&a, &b, 20.0), Some(2));
        assert!(Difference::of(&Summary::of(&[1.0]).unwrap(), &b).is_none());
    }

    /// The halving search finds what trying every n in turn finds.
    #[test]
    fn runs_needed_is_the_smallest_n_that_detects_the_change() {
        let first_by_scan = |a: &Summary, b: &Summary, percent: f64| {
            let spread = (a.stddev.powi(2) + b.stddev.powi(2)).sqrt();
            let wanted = percent / 100.0 * a.mean.abs();
            (2..=MOST_RUNS).find(|&n| t_sum((2 * n - 2) as f64) * spread / (n as f64).sqrt() <= wanted)
        };
        let a = Summary::of(&[100.0, 102.0, 98.0]).unwrap();
        for (spread, percent) in [(1.0, 5.0), (3.0, 5.0), (10.0, 2.0), (40.0, 1.0), (2.0, 20.0)] {
            let b = Summary::of(&[110.0, 110.0 + spread, 110.0 - spread]).unwrap();
            assert_eq!(
                runs_needed(&a, &b, percent),
                first_by_scan(&a, &b, percent),
                "spread {spread}, {percent} %"
            );
        }
        // Far past 10 000 runs: no answer.
        let wild = Summary::of(&[1.0, 1000.0, 5.0]).unwrap();
        assert_eq!(runs_needed(&a, &wild, 0.01), None);
        assert_eq!(first_by_scan(&a, &wild, 0.01), None);
    }
}
