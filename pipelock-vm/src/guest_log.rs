//! Reads what a VM printed on its console and decides whether the run passed.
//! Pure, so it is unit-tested on captured guest logs (`pipelock-vm/tests/guest-logs/`).
use std::fmt;

use crate::qemu::Stopped;

/// The line the guest's init prints after the tests, with the run's nonce, so
/// output of an earlier run or a test's own echo cannot pass for it.
pub fn sentinel(nonce: &str) -> String {
    format!("PIPELOCK-VM-RESULT {nonce} rc=")
}

/// Results come back over the serial console: hex chunks of at most this
/// many bytes a line, so a kernel message printed in the middle breaks one
/// chunk (and the checksum says so), not the whole console.
const CHUNK: usize = 2048;

/// FNV-1a, 64 bits: enough to tell a garbled result from a whole one.
pub fn checksum(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The console lines that carry `payload` as result `name` of the run
/// with `nonce`: `PIPELOCK-RESULT nonce name i/n hex`, then
/// `PIPELOCK-RESULT nonce name end len checksum`.
pub fn frame(nonce: &str, name: &str, payload: &[u8]) -> String {
    let chunks: Vec<&[u8]> = payload.chunks(CHUNK).collect();
    let mut out = String::new();
    for (i, chunk) in chunks.iter().enumerate() {
        let hex: String = chunk.iter().map(|b| format!("{b:02x}")).collect();
        out.push_str(&format!(
            "PIPELOCK-RESULT {nonce} {name} {}/{} {hex}\n",
            i + 1,
            chunks.len()
        ));
    }
    out.push_str(&format!(
        "PIPELOCK-RESULT {nonce} {name} end {} {:016x}\n",
        payload.len(),
        checksum(payload)
    ));
    out
}

/// The results of the run with `nonce` in a console log, by name, in
/// order. A result whose chunks are missing or whose checksum is wrong is
/// an error naming it (the console garbled it).
pub fn results(log: &str, nonce: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
    let prefix = format!("PIPELOCK-RESULT {nonce} ");
    let mut open: Vec<(String, Vec<u8>)> = Vec::new();
    let mut done = Vec::new();
    for line in log.lines() {
        let Some(rest) = line.find(&prefix).map(|at| &line[at + prefix.len()..]) else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let (Some(name), Some(what)) = (fields.next(), fields.next()) else {
            return Err(format!("a garbled result line: {line}"));
        };
        let slot = match open.iter().position(|(n, _)| n == name) {
            Some(at) => at,
            None => {
                open.push((name.to_owned(), Vec::new()));
                open.len() - 1
            }
        };
        if what == "end" {
            let (len, sum) = (fields.next(), fields.next());
            let (name, data) = open.remove(slot);
            let whole = len.and_then(|l| l.parse::<usize>().ok()) == Some(data.len())
                && sum.and_then(|s| u64::from_str_radix(s, 16).ok()) == Some(checksum(&data));
            if !whole {
                return Err(format!(
                    "result {name} arrived garbled (length or checksum differ)"
                ));
            }
            done.push((name, data));
            continue;
        }
        let hex = fields.next().unwrap_or("");
        let bytes: Option<Vec<u8>> = (0..hex.len())
            .step_by(2)
            .map(|i| hex.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
            .collect();
        match bytes {
            Some(bytes) => open[slot].1.extend(bytes),
            None => return Err(format!("result {name} arrived garbled (not hex)")),
        }
    }
    if let Some((name, _)) = open.first() {
        return Err(format!(
            "result {name} never finished (the guest stopped while printing it)"
        ));
    }
    Ok(done)
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

/// The tests a run's output says failed, with their reasons: each
/// `test NAME ... FAILED (took): why` line (a guest's, or the host's).
pub fn failed_tests(log: &str) -> Vec<(String, String)> {
    log.lines()
        .filter_map(|line| {
            let (head, why) = line.split_once(" ... FAILED")?;
            let name = head.rsplit_once("test ")?.1.trim();
            let why = why
                .split_once("): ")
                .map_or(why, |(_, w)| w)
                .trim_start_matches(": ");
            Some((name.to_owned(), why.trim().to_owned()))
        })
        .collect()
}

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

/// The tests a log shows finished, counted from their own lines: for a run
/// stopped before the harness's closing line.
fn finished(lines: &[&str]) -> Counts {
    let mut counts = Counts::default();
    for line in lines {
        let Some((head, result)) = line.split_once(" ... ") else {
            continue;
        };
        if !head.contains("test ") {
            continue;
        }
        if result.starts_with("ok") {
            counts.passed += 1;
        } else if result.starts_with("skipped") {
            counts.skipped += 1;
        } else if result.starts_with("FAILED") {
            counts.failed += 1;
        }
    }
    counts
}

/// The harness's last `test NAME ... still running` report, if no test
/// finished after it: the test a stopped run was in.
fn still_running<'a>(lines: &[&'a str]) -> Option<&'a str> {
    lines
        .iter()
        .rev()
        .find(|l| l.contains("test ") && l.contains(" ... "))
        .filter(|l| l.contains(" ... still running"))
        .map(|l| l.trim())
}

/// Judges a guest's console log: `stopped` says whether the guest was
/// stopped before it powered off, and why.
pub fn judge(log: &str, nonce: &str, stopped: Option<&Stopped>) -> Judgement {
    let lines: Vec<&str> = log.lines().map(|l| l.trim_end_matches('\r')).collect();
    let closing = lines.iter().rev().find_map(|l| parse_counts(l));
    // A stopped run has no closing line: its finished tests still count.
    let counts = closing.or_else(|| stopped.map(|_| finished(&lines)));
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

    let verdict = if let Some(stopped) = stopped {
        let running = still_running(&lines)
            .map(|l| format!("; {}", l.split_once("test ").map_or(l, |(_, t)| t)))
            .unwrap_or_default();
        // Under a silence the dump asked for prints call traces: they are
        // the answer, not another fault.
        let trouble = trouble.filter(|_| matches!(stopped, Stopped::Timeout(_)));
        Verdict::Failed(format!(
            "{stopped}{running}{}",
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
    } else if closing.is_none() {
        Verdict::Failed("no `integration: N passed, N failed` line: the tests did not run".into())
    } else {
        Verdict::Passed
    };
    Judgement { verdict, counts }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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
    fn failed_tests_are_named_with_their_reasons() {
        let log = "[debian-6.18] test fentry_unknown_owners ... FAILED (12.3 s): the kernel shows 1907 waits\n\
                   test a_host_test ... ok (1.0 s)\n\
                   test serve_x ... FAILED (0.1 s): no scrape: refused\n";
        assert_eq!(
            failed_tests(log),
            [
                (
                    "fentry_unknown_owners".to_owned(),
                    "the kernel shows 1907 waits".to_owned()
                ),
                ("serve_x".to_owned(), "no scrape: refused".to_owned())
            ]
        );
    }

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
        let j = judge(
            &captured("timeout.log"),
            "anynonce",
            Some(&Stopped::Timeout(Duration::from_secs(12))),
        );
        assert!(
            matches!(&j.verdict, Verdict::Failed(why) if why.starts_with("timed out after 12 s")),
            "{:?}",
            j.verdict
        );
        assert_eq!(
            j.counts,
            Some(Counts {
                passed: 1,
                failed: 0,
                skipped: 0
            }),
            "the test that finished before the limit"
        );
    }

    #[test]
    fn a_stopped_run_names_the_test_it_was_in() {
        let log = "[    1.0] boot\n\
                   test a ... ok (1.0 s)\n\
                   test b ... skipped: no fentry\n\
                   test c ... FAILED (2.0 s): 3 of 4\n\
                   \x20 c's own note\n\
                   test d ... still running after 120 s: pid 90 pipelock S pipe_read\n";
        let stopped = Stopped::Timeout(Duration::from_secs(1800));
        let j = judge(log, NONCE, Some(&stopped));
        assert_eq!(
            j.verdict,
            Verdict::Failed(
                "timed out after 1800 s; d ... still running after 120 s: pid 90 pipelock S pipe_read".into()
            )
        );
        assert_eq!(
            j.counts,
            Some(Counts {
                passed: 1,
                failed: 1,
                skipped: 1
            })
        );
        // A test that finished after the report is not the one running.
        let later = format!("{log}test d ... ok (130.0 s)\n");
        assert_eq!(
            judge(&later, NONCE, Some(&stopped)).verdict,
            Verdict::Failed("timed out after 1800 s".into())
        );
    }

    #[test]
    fn a_silent_runs_stack_dump_is_its_answer_not_more_trouble() {
        let log = "test a ... ok (1.0 s)\n\
                   [  900.1] sysrq: Show Blocked State\n\
                   [  900.2] Call Trace:\n\
                   [  900.3]  mutex_lock+0x1d/0x30\n";
        let quiet = Stopped::Silent(Duration::from_secs(300));
        let Verdict::Failed(why) = judge(log, NONCE, Some(&quiet)).verdict else {
            panic!("a hung guest passed")
        };
        assert!(why.starts_with("hung: the console was silent for 300 s"), "{why}");
        assert!(!why.contains("(kernel:"), "{why}");
        // Past the time limit, a call trace is trouble worth naming.
        let late = Stopped::Timeout(Duration::from_secs(1800));
        let Verdict::Failed(why) = judge(log, NONCE, Some(&late)).verdict else {
            panic!("a timed-out guest passed")
        };
        assert!(why.ends_with("(kernel: [  900.2] Call Trace:)"), "{why}");
    }

    #[test]
    fn framed_results_come_back_whole_or_are_refused() {
        let payload: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let console = format!(
            "[    1.0] boot\n{}junk\n{}",
            frame("n1", "run-1", &payload),
            frame("n1", "run-2", b"{}")
        );
        let got = results(&console, "n1").unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].0.as_str(), got[0].1.len()), ("run-1", 5000));
        assert_eq!(got[0].1, payload);
        assert_eq!(got[1].1, b"{}");
        assert!(
            results(&console, "other").unwrap().is_empty(),
            "another run's nonce"
        );
        // A kernel message in the middle of a chunk.
        let garbled = console.replacen(
            "PIPELOCK-RESULT n1 run-1 2/3 ",
            "PIPELOCK-RESULT n1 run-1 2/3 0f",
            1,
        );
        assert!(results(&garbled, "n1").unwrap_err().contains("run-1"));
        // A guest that died while printing.
        let cut: String = console.lines().take(3).map(|l| format!("{l}\n")).collect();
        assert!(results(&cut, "n1").unwrap_err().contains("never finished"));
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
