//! Reads what a VM printed on its console and decides whether the run passed.
//! Pure, so it is unit-tested on captured guest logs (`xtask/tests/guest-logs/`).
use std::fmt;

/// The line the guest's init prints after the tests, with the run's nonce, so
/// output of an earlier run or a test's own echo cannot pass for it.
pub fn sentinel(nonce: &str) -> String {
    format!("PIPELOCK-VM-RESULT {nonce} rc=")
}

/// Counts from the integration harness's closing line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub passed: u32,
    pub failed: u32,
    pub skipped: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Passed,
    Failed(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Judgement {
    pub verdict: Verdict,
    pub counts: Option<Counts>,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Passed => f.write_str("passed"),
            Self::Failed(why) => write!(f, "FAILED: {why}"),
        }
    }
}

/// Kernel messages that fail a run whatever the tests said.
const KERNEL_TROUBLE: &[&str] = &[
    "Kernel panic",
    "Oops:",
    "BUG:",
    "WARNING: CPU:",
    "general protection fault",
    "Call Trace:",
];

/// `integration: 5 passed, 1 failed, 2 skipped` → counts.
fn parse_counts(line: &str) -> Option<Counts> {
    let rest = line.trim().strip_prefix("integration: ")?;
    let mut counts = Counts::default();
    for part in rest.split(", ") {
        let (number, what) = part.split_once(' ')?;
        let number = number.parse().ok()?;
        match what {
            "passed" => counts.passed = number,
            "failed" => counts.failed = number,
            "skipped" => counts.skipped = number,
            _ => return None,
        }
    }
    Some(counts)
}

pub fn judge(log: &str, nonce: &str, timed_out: Option<u64>) -> Judgement {
    let lines: Vec<&str> = log.lines().map(|l| l.trim_end_matches('\r')).collect();
    let counts = lines.iter().rev().find_map(|l| parse_counts(l));
    let sentinel = sentinel(nonce);
    let rc = lines.iter().find_map(|l| {
        let at = l.find(&sentinel)?;
        l[at + sentinel.len()..].trim().parse::<i32>().ok()
    });
    let trouble = lines
        .iter()
        .find(|l| KERNEL_TROUBLE.iter().any(|t| l.contains(t)))
        .map(|l| l.trim().to_owned());
    let failed_tests: Vec<&str> = lines
        .iter()
        .filter(|l| l.contains(" ... FAILED"))
        .copied()
        .collect();
    // A program the verifier rejected prints its log; name the first line.
    let verifier = lines
        .iter()
        .find(|l| l.contains("Verifier output:") && !l.trim_end().ends_with("Verifier output:"))
        .map(|l| l.trim().to_owned());

    let verdict = if let Some(secs) = timed_out {
        Verdict::Failed(format!(
            "timed out after {secs} s{}",
            trouble.map(|t| format!(" (kernel: {t})")).unwrap_or_default()
        ))
    } else if let Some(trouble) = trouble {
        Verdict::Failed(format!("kernel trouble: {trouble}"))
    } else if let Some(line) = failed_tests.first() {
        let more = failed_tests.len() - 1;
        let more = if more > 0 {
            format!(" (+{more} more)")
        } else {
            String::new()
        };
        Verdict::Failed(format!(
            "{}{more}{}",
            line.trim(),
            verifier.map(|v| format!("; {v}")).unwrap_or_default()
        ))
    } else if rc.is_none() {
        Verdict::Failed(
            "the guest stopped without printing its result line (init crashed or the kernel died)".into(),
        )
    } else if rc != Some(0) {
        Verdict::Failed(format!("the test binary exited with {}", rc.unwrap_or(-1)))
    } else if counts.is_none() {
        Verdict::Failed("no `integration: N passed, N failed` line: the tests did not run".into())
    } else {
        Verdict::Passed
    };
    Judgement { verdict, counts }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn captured(name: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/guest-logs")
            .join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The nonce the captured logs were recorded with.
    const NONCE: &str = "capturednonce";

    #[test]
    fn a_clean_run_passes_with_its_counts() {
        let j = judge(&captured("pass.log"), NONCE, None);
        assert_eq!(j.verdict, Verdict::Passed);
        let counts = j.counts.unwrap();
        assert!(counts.passed > 0);
        assert_eq!(counts.failed, 0);
    }

    #[test]
    fn another_runs_nonce_does_not_count() {
        let j = judge(&captured("pass.log"), "othernonce", None);
        assert!(matches!(j.verdict, Verdict::Failed(why) if why.contains("result line")));
    }

    #[test]
    fn a_failing_attach_is_named() {
        let j = judge(&captured("attach-failure.log"), NONCE, None);
        let Verdict::Failed(why) = j.verdict else {
            panic!("passed")
        };
        assert!(why.contains("FAILED"), "{why}");
        assert!(why.contains("no_such_kernel_function"), "{why}");
        assert_eq!(j.counts.map(|c| c.failed > 0), Some(true));
    }

    #[test]
    fn a_kernel_panic_is_named() {
        // Captured: init exited, so the kernel panicked before any test ran.
        let j = judge(&captured("panic.log"), NONCE, None);
        assert!(
            matches!(&j.verdict, Verdict::Failed(why) if why.contains("Kernel panic - not syncing")),
            "{:?}",
            j.verdict
        );
        assert_eq!(j.counts, None);
    }

    #[test]
    fn kernel_trouble_fails_even_with_green_tests() {
        let panic_line = captured("panic.log")
            .lines()
            .find(|l| l.contains("Kernel panic"))
            .unwrap()
            .to_owned();
        let log = format!("{}\n{panic_line}\n", captured("pass.log"));
        assert!(
            matches!(judge(&log, NONCE, None).verdict, Verdict::Failed(why) if why.contains("kernel trouble"))
        );
    }

    #[test]
    fn a_timeout_fails_and_says_so() {
        // Captured: a run stopped by a 12 s limit in the middle of the tests.
        let j = judge(&captured("timeout.log"), "anynonce", Some(12));
        assert!(
            matches!(&j.verdict, Verdict::Failed(why) if why.starts_with("timed out after 12 s")),
            "{:?}",
            j.verdict
        );
    }

    #[test]
    fn counts_parse_only_the_harness_line() {
        assert_eq!(
            parse_counts("integration: 5 passed, 1 failed, 2 skipped"),
            Some(Counts {
                passed: 5,
                failed: 1,
                skipped: 2
            })
        );
        assert_eq!(parse_counts("integration: lots passed"), None);
        assert_eq!(parse_counts("5 passed, 0 failed"), None);
    }
}
