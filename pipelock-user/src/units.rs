//! Units in and out: seconds on the command line, durations in reports;
//! shared by the tracing commands, the views and the workloads (which must
//! not depend on each other).
use std::time::Duration;

/// `1.23 ms`-style durations, as perf lock contention prints them.
pub fn human_ns(ns: u64) -> String {
    let ns_f = ns as f64;
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.2} us", ns_f / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2} ms", ns_f / 1e6)
    } else {
        format!("{:.2} s", ns_f / 1e9)
    }
}

/// A positive, finite number of seconds (fractions allowed).
pub fn parse_seconds(text: &str) -> Result<Duration, String> {
    let secs: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    if !secs.is_finite() || secs <= 0.0 || secs > 86_400.0 * 365.0 {
        return Err(format!("`{text}`: seconds must be greater than 0"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A rate per second in a narrow column: `8596`, `25k`.
pub fn human_rate(per_s: f64) -> String {
    if per_s >= 10_000.0 {
        format!("{:.0}k", per_s / 1000.0)
    } else {
        format!("{per_s:.0}")
    }
}

/// Bytes as MiB with one decimal, `9.1 MiB` (kernel map memory).
pub fn human_mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / 1048576.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_must_be_positive() {
        assert_eq!(parse_seconds("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_seconds("0").is_err());
        assert!(parse_seconds("-3").is_err());
        assert!(parse_seconds("nan").is_err());
        assert!(parse_seconds("soon").is_err());
    }
}
