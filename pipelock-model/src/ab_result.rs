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

impl PatchedFunction {
    /// The functions whose calls tell whether B's runs reached this one:
    /// itself, and where its body runs if the compiler inlined it.
    pub fn to_count(&self) -> Vec<String> {
        let mut out = vec![self.function.clone()];
        if self.inline || self.is_static {
            out.extend(self.callers.iter().cloned());
        }
        out
    }

    /// Whether `calls` (B's) show its body ran: entered N times, never
    /// entered (nothing in the comparison speaks for it), or entered only
    /// as far as its callers' counts tell.
    pub fn reach(&self, calls: &[FunctionCalls]) -> String {
        let find = |f: &str| calls.iter().find(|c| c.function == f);
        let never = "nothing in this comparison speaks for it";
        match find(&self.function) {
            None => "its calls were not counted".to_owned(),
            Some(FunctionCalls { entered: Some(0), .. }) => format!("never entered in B's runs: {never}"),
            Some(FunctionCalls { entered: Some(n), .. }) => format!("entered {n} times in B's runs"),
            Some(FunctionCalls { not_counted: why, .. }) => {
                let why = why.as_deref().unwrap_or("not counted");
                let callers: Vec<(&str, Option<u64>)> = self
                    .callers
                    .iter()
                    .filter(|_| self.inline || self.is_static)
                    .filter_map(|c| find(c).map(|calls| (c.as_str(), calls.entered)))
                    .collect();
                let counted: Vec<(&str, u64)> =
                    callers.iter().filter_map(|(c, n)| Some((*c, (*n)?))).collect();
                if counted.is_empty() {
                    return format!("not counted: {why}");
                }
                let each: Vec<String> = counted.iter().map(|(c, n)| format!("{c}() {n} times")).collect();
                if counted.iter().all(|(_, n)| *n == 0) {
                    format!(
                        "not counted itself ({why}); where its body runs, {}: never entered in B's runs: {never}",
                        each.join(", ")
                    )
                } else {
                    format!(
                        "not counted itself ({why}); where its body runs, {} in B's runs (whether they took \
                         the changed lines, the counts cannot tell)",
                        each.join(", ")
                    )
                }
            }
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
    /// The calls of the functions B's change makes (and of their callers
    /// in the file), over this kernel's runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub calls: Vec<FunctionCalls>,
}

/// How often a function was entered over a kernel's runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCalls {
    pub function: String,
    /// None where it was not counted.
    pub entered: Option<u64>,
    /// Why not: no probe point (inlined), no kprobe events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_counted: Option<String>,
}

impl FunctionCalls {
    /// Adds one run's count (or why it has none) to `all`.
    pub fn add(all: &mut Vec<Self>, function: &str, run: Result<u64, String>) {
        let at = match all.iter().position(|c| c.function == function) {
            Some(at) => at,
            None => {
                all.push(Self {
                    function: function.to_owned(),
                    entered: Some(0),
                    not_counted: None,
                });
                all.len() - 1
            }
        };
        let calls = &mut all[at];
        match run {
            Ok(n) => calls.entered = calls.entered.map(|e| e + n),
            Err(why) => {
                calls.entered = None;
                calls.not_counted = Some(why);
            }
        }
    }
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

    fn calls(counts: &[(&str, Option<u64>)]) -> Vec<FunctionCalls> {
        let mut all = Vec::new();
        for (function, n) in counts {
            let run = n.ok_or_else(|| "no probe point in this kernel (inlined, or not probeable)".to_owned());
            FunctionCalls::add(&mut all, function, run.clone());
            FunctionCalls::add(&mut all, function, run);
        }
        all
    }

    #[test]
    fn a_patched_function_is_entered_never_or_as_far_as_its_callers_tell() {
        let set_size = function(false, true, &["pipe_fcntl"], false);
        assert_eq!(set_size.to_count(), ["f", "pipe_fcntl"]);
        // Two runs each: the counts add up.
        assert_eq!(
            set_size.reach(&calls(&[("f", Some(3))])),
            "entered 6 times in B's runs"
        );
        assert_eq!(
            set_size.reach(&calls(&[("f", Some(0))])),
            "never entered in B's runs: nothing in this comparison speaks for it"
        );
        let inlined = calls(&[("f", None), ("pipe_fcntl", Some(0))]);
        assert_eq!(
            set_size.reach(&inlined),
            "not counted itself (no probe point in this kernel (inlined, or not probeable)); where its body \
             runs, pipe_fcntl() 0 times: never entered in B's runs: nothing in this comparison speaks for it"
        );
        assert!(
            set_size
                .reach(&calls(&[("f", None), ("pipe_fcntl", Some(5))]))
                .contains("pipe_fcntl() 10 times in B's runs (whether they took the changed lines")
        );
        let pointer = function(false, true, &[], false);
        assert_eq!(pointer.to_count(), ["f"]);
        assert!(
            pointer
                .reach(&calls(&[("f", None)]))
                .starts_with("not counted: no probe point")
        );
        assert_eq!(pointer.reach(&[]), "its calls were not counted");
    }
}
