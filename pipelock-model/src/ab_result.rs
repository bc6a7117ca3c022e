//! What `pipelock ab --json` writes: the command, how the guests ran, each
//! kernel's runs as the guest's pipelock wrote them, and the judge's
//! table. `pipelock report` reads it back for the A/B page.
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{CommandResult, format::FormatVersion, judge::Row};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AbResult {
    pub format: FormatVersion,
    /// The command each boot ran, e.g. `run pipe-throughput --trace`.
    pub command: Vec<String>,
    /// "kvm" or "tcg".
    pub accel: String,
    /// Under TCG: compare ratios and counts, not absolute times.
    pub emulated: bool,
    pub runs_per_kernel: u32,
    /// A, then B.
    pub kernels: [KernelRuns; 2],
    pub table: Vec<Row>,
    /// The functions B's change (`--source` with `--patch` or `--rev`)
    /// makes to A's tree.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patched: Vec<PatchedFunction>,
}

/// A function whose body B's change makes different, found in A's source.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PatchedFunction {
    /// As the patch names it: `fs/pipe.c`.
    pub file: String,
    pub function: String,
    /// Declared inline: its body runs inside its callers.
    pub inline: bool,
    /// Static: only its own file calls it.
    pub is_static: bool,
    /// The functions of its file that call it.
    pub callers: Vec<String>,
    /// New in B.
    pub added: bool,
}

impl PatchedFunction {
    /// `pipe_set_size() in fs/pipe.c (static, called from pipe_fcntl():
    /// its body runs there if the compiler inlined it)`. A static function
    /// its file never calls is called through a pointer (a
    /// `file_operations`): it keeps a symbol of its own.
    pub fn describe(&self) -> String {
        let name = format!("{}() in {}", self.function, self.file);
        let callers: Vec<String> = self.callers.iter().map(|c| format!("{c}()")).collect();
        if self.added {
            format!("{name} (new in B)")
        } else if self.inline && callers.is_empty() {
            format!("{name} (inline: its body runs in its callers)")
        } else if self.inline {
            format!("{name} (inline: its body runs in {})", callers.join(", "))
        } else if self.is_static && !callers.is_empty() {
            format!(
                "{name} (static, called from {}: its body runs there if the compiler inlined it)",
                callers.join(", ")
            )
        } else {
            name
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelRuns {
    /// The kernel as asked for (a version, an image, a source tree).
    pub spec: String,
    pub image: PathBuf,
    /// Its `uname -r`.
    pub release: String,
    /// Each boot's result, as the guest wrote it.
    pub runs: Vec<CommandResult>,
    /// Why this kernel's runs ended early, if they did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hang: Option<Hang>,
}

/// A guest that stopped making progress: a thread asked for a mutex it
/// already held (pipelock's `deadlock:` line), or no result came before
/// the deadline and the kernel had tasks blocked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hang {
    /// The run it happened in (1-based).
    pub run: u32,
    /// Seconds the command had run when the guest gave up on it.
    pub after_s: u64,
    /// pipelock's `deadlock:` lines, as the guest's pipelock printed them.
    pub asked_twice: Vec<String>,
    /// The kernel's list of blocked tasks and their stacks (sysrq `w`).
    pub blocked: String,
}

impl Hang {
    /// Whether this kernel is unsafe, not merely slow: a thread asked for a
    /// lock it holds, or the kernel lists a task blocked for good.
    pub fn is_unsafe(&self) -> bool {
        !self.asked_twice.is_empty() || !self.blocked_tasks().is_empty()
    }

    /// The blocked tasks' header lines (`task:NAME state:D …`).
    pub fn blocked_tasks(&self) -> Vec<&str> {
        self.blocked
            .lines()
            .filter_map(|l| l.split_once("task:").map(|(_, task)| task.trim()))
            .filter(|task| task.contains("state:D"))
            .collect()
    }

    /// One sentence a maintainer can act on, for kernel `side` ("A", "B").
    pub fn verdict(&self, side: &str) -> String {
        if let Some(asked) = self.asked_twice.first().and_then(|l| AskedLine::parse(l)) {
            let mut verdict = match &asked.function {
                Some(function) => format!(
                    "{side} is unsafe: {function}() asks for the mutex of {} that its thread already holds",
                    asked.lock
                ),
                None => format!(
                    "{side} is unsafe: a thread asks for the mutex of {} that it already holds",
                    asked.lock
                ),
            };
            if let Some(caller) = &asked.caller {
                verdict.push_str(&format!(" (called from {caller}())"));
            }
            verdict.push_str(&format!("; task {}, in run {}", asked.task, self.run));
            return verdict;
        }
        let blocked = self.blocked_tasks();
        if blocked.is_empty() {
            format!(
                "{side} did not finish run {} within {} s, and its kernel lists no blocked task: slow, not stuck",
                self.run, self.after_s
            )
        } else {
            format!(
                "{side} is unsafe: run {} stopped making progress after {} s with {} task(s) blocked (first: {})",
                self.run,
                self.after_s,
                blocked.len(),
                blocked[0]
            )
        }
    }
}

/// The parts of pipelock's `deadlock:` line a verdict names.
#[derive(Debug, PartialEq)]
struct AskedLine {
    task: String,
    lock: String,
    /// The function that asked (the innermost frame, offset left out).
    function: Option<String>,
    /// Its caller.
    caller: Option<String>,
}

impl AskedLine {
    /// `…deadlock: TASK asked for the mutex of LOCK (ADDR) that it already
    /// holds[, in SYSCALL()][, at F+0x1 <- G+0x2 <- …]`.
    fn parse(line: &str) -> Option<Self> {
        let (_, rest) = line.split_once("deadlock: ")?;
        let (task, rest) = rest.split_once(" asked for the mutex of ")?;
        let (lock, rest) = rest.split_once(" (")?;
        let frames: Vec<String> = rest
            .split_once(", at ")
            .map(|(_, stack)| {
                stack
                    .split(" <- ")
                    .map(|frame| frame.split('+').next().unwrap_or(frame).trim().to_owned())
                    .collect()
            })
            .unwrap_or_default();
        Some(Self {
            task: task.to_owned(),
            lock: lock.to_owned(),
            function: frames.first().cloned(),
            caller: frames.get(1).cloned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ASKED: &str = "pipelock: deadlock: paths(412/413) asked for the mutex of pipe:[1187] (0xffff888003c4a000) \
        that it already holds, in fcntl(), at pipe_set_size+0x5e <- pipe_fcntl+0x8d <- do_fcntl+0x4c2";

    fn hang(asked: &[&str], blocked: &str) -> Hang {
        Hang {
            run: 1,
            after_s: 12,
            asked_twice: asked.iter().map(|l| (*l).to_owned()).collect(),
            blocked: blocked.to_owned(),
        }
    }

    #[test]
    fn a_thread_asking_twice_names_the_function_and_its_caller() {
        let verdict = hang(&[ASKED], "").verdict("B");
        assert_eq!(
            verdict,
            "B is unsafe: pipe_set_size() asks for the mutex of pipe:[1187] that its thread already holds \
             (called from pipe_fcntl()); task paths(412/413), in run 1"
        );
        assert!(hang(&[ASKED], "").is_unsafe());
    }

    #[test]
    fn a_hang_is_unsafe_only_with_a_task_blocked() {
        let sysrq = "[   40.1] sysrq: Show Blocked State\n\
                     [   40.1] task:paths           state:D stack:0     pid:413   ppid:412    flags:0x00004000\n\
                     [   40.1] Call Trace:\n[   40.1]  <TASK>\n[   40.1]  __schedule+0x2f1/0x8a0\n";
        let stuck = hang(&[], sysrq);
        assert!(stuck.is_unsafe());
        assert_eq!(stuck.blocked_tasks().len(), 1);
        assert!(stuck.verdict("A").starts_with(
            "A is unsafe: run 1 stopped making progress after 12 s with 1 task(s) blocked (first: paths"
        ));
        let slow = hang(&[], "[   40.1] sysrq: Show Blocked State\n");
        assert!(!slow.is_unsafe());
        assert!(slow.verdict("A").contains("slow, not stuck"));
    }

    #[test]
    fn a_line_without_a_stack_still_names_the_lock() {
        let line = "pipelock: deadlock: x(5) asked for the mutex of pipe:[9] (0x1) that it already holds";
        let verdict = hang(&[line], "").verdict("B");
        assert_eq!(
            verdict,
            "B is unsafe: a thread asks for the mutex of pipe:[9] that it already holds; task x(5), in run 1"
        );
    }

    fn function(inline: bool, is_static: bool, callers: &[&str], added: bool) -> PatchedFunction {
        PatchedFunction {
            file: "fs/pipe.c".to_owned(),
            function: "f".to_owned(),
            inline,
            is_static,
            callers: callers.iter().map(|c| (*c).to_owned()).collect(),
            added,
        }
    }

    #[test]
    fn a_patched_function_says_where_its_body_runs() {
        assert_eq!(
            function(false, true, &["pipe_fcntl"], false).describe(),
            "f() in fs/pipe.c (static, called from pipe_fcntl(): its body runs there if the compiler inlined it)"
        );
        assert_eq!(function(false, true, &[], false).describe(), "f() in fs/pipe.c");
        assert_eq!(
            function(true, true, &["a", "b"], false).describe(),
            "f() in fs/pipe.c (inline: its body runs in a(), b())"
        );
        assert_eq!(
            function(true, false, &[], false).describe(),
            "f() in fs/pipe.c (inline: its body runs in its callers)"
        );
        assert_eq!(
            function(false, false, &[], true).describe(),
            "f() in fs/pipe.c (new in B)"
        );
    }
}
