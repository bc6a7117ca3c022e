//! Single runs of a workload: untraced, under `pipelock trace` (their
//! typed reports read back), or under `perf lock record`.
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use super::Case;
use crate::{
    Error,
    bpf::AttachMode,
    model::{ProgramStats, TraceReport},
};

fn exe() -> Result<PathBuf, Error> {
    std::env::current_exe().map_err(|source| Error::Io {
        what: "finding the pipelock binary",
        source,
    })
}

pub(super) fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("pipelock-overhead-{}-{name}", std::process::id()))
}

fn run_quietly(command: &mut Command) -> Result<(), Error> {
    let out = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|source| Error::Io {
            what: "running a benchmark step",
            source,
        })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
        return Err(Error::Workload {
            reason: format!("{command:?} failed: {last}"),
        });
    }
    Ok(())
}

/// The workload's figure and the CPU time its processes used (`getrusage`
/// of the workers: the tracer's own loading is not in it).
fn workload_result(result: &Path) -> Result<(f64, f64), Error> {
    let report = crate::workload::report::load(result)?;
    let run = report.runs.first().ok_or_else(|| Error::Workload {
        reason: format!("{}: the workload finished no run", result.display()),
    })?;
    Ok((run.value, run.counters.task_clock_ms / 1e3))
}

/// `pipelock run CASE --no-counters -q --json F`, optionally wrapped.
fn workload_command(wrapper: &[String], case: &Case, result: &Path) -> Result<Command, Error> {
    let exe = exe()?;
    let mut argv: Vec<String> = wrapper.to_vec();
    argv.push(exe.display().to_string());
    argv.extend(["run".to_owned()]);
    argv.extend(case.args.iter().cloned());
    argv.extend(["--no-counters", "-q", "--json"].map(str::to_owned));
    argv.push(result.display().to_string());
    let mut command = Command::new(&argv[0]);
    command.args(&argv[1..]);
    Ok(command)
}

/// Who traces a run.
#[derive(Clone, Debug)]
pub(super) enum TracedBy {
    Pipelock { mode: AttachMode, programs: Programs },
    Perf(PathBuf),
}

/// Which of pipelock's programs a traced run loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Programs {
    /// What `pipelock trace` loads by default.
    Default,
    /// Programs that return at once on the same hooks: the hooks' own cost.
    Empty,
    /// The default ones recording call stacks (`--callers`, opt-in for its
    /// cost: the kernel unwinds a stack per recorded acquisition).
    WithCallers,
}

impl TracedBy {
    pub(super) fn label(&self) -> String {
        match self {
            Self::Pipelock {
                mode,
                programs: Programs::Default,
            } => mode.to_string(),
            Self::Pipelock {
                mode,
                programs: Programs::Empty,
            } => format!("{mode}, empty programs"),
            Self::Pipelock {
                mode,
                programs: Programs::WithCallers,
            } => format!("{mode}, --callers"),
            Self::Perf(_) => "perf lock record".to_owned(),
        }
    }
}

/// What one traced run cost, from its trace report.
pub(super) struct Cost {
    pub programs: Vec<ProgramStats>,
    pub cpu_s: f64,
    pub map_memory: Option<u64>,
    pub collector_share: Option<f64>,
}

impl Cost {
    /// Program runs, over every program.
    pub fn runs(&self) -> u64 {
        self.programs.iter().map(|p| p.run_count).sum()
    }

    /// BPF run time, over every program.
    pub fn run_ns(&self) -> u64 {
        self.programs.iter().map(|p| p.run_time_ns).sum()
    }

    /// BPF run time per program run (NaN: no runs).
    pub fn ns_per_run(&self) -> f64 {
        self.run_ns() as f64 / self.runs() as f64
    }
}

/// One run under `pipelock trace`; `bpf_stats` turns the kernel's run-time
/// statistics on (for the cost table, not for a ratio).
pub(super) fn traced(
    mode: AttachMode,
    programs: Programs,
    bpf_stats: bool,
    case: &Case,
) -> Result<(f64, Cost), Error> {
    let (result, report_path) = (scratch("result.json"), scratch("trace.json"));
    let mut wrapper: Vec<String> = [
        exe()?.display().to_string(),
        "trace".into(),
        "--mode".into(),
        mode.to_string(),
        "--interval".into(),
        "1".into(),
        "--class".into(),
        case.classes.into(),
        "--json".into(),
        report_path.display().to_string(),
    ]
    .into();
    wrapper.extend(bpf_stats.then(|| "--bpf-stats".to_owned()));
    wrapper.extend(match programs {
        Programs::Default => None,
        Programs::Empty => Some("--empty-programs".to_owned()),
        Programs::WithCallers => Some("--callers".to_owned()),
    });
    wrapper.push("--".into());
    run_quietly(&mut workload_command(&wrapper, case, &result)?)?;
    let measured = workload_result(&result);
    let report = read_trace_report(&report_path);
    let _ = (std::fs::remove_file(&result), std::fs::remove_file(&report_path));
    let ((value, cpu_s), report) = (measured?, report?);
    let collector_share = report
        .tracer_cpu_s
        .filter(|_| report.duration_s > 0.0)
        .map(|cpu| cpu / report.duration_s);
    Ok((
        value,
        Cost {
            map_memory: Some(report.maps.iter().filter_map(|m| m.memlock_bytes).sum()),
            programs: report.programs,
            cpu_s,
            collector_share,
        },
    ))
}

/// A `trace --json` report, as the typed model it was written from.
fn read_trace_report(path: &Path) -> Result<TraceReport, Error> {
    let text = std::fs::read_to_string(path).map_err(Error::read(path))?;
    serde_json::from_str(&text).map_err(|e| Error::Read {
        path: path.to_owned(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not a trace report: {e}"),
        ),
    })
}

pub(super) fn untraced(case: &Case, wrapper: &[String]) -> Result<f64, Error> {
    let result = scratch("result.json");
    run_quietly(&mut workload_command(wrapper, case, &result)?)?;
    let value = workload_result(&result).map(|(value, _)| value);
    let _ = std::fs::remove_file(&result);
    value
}

/// Whether `mode` attaches here: a tenth of a second of tracing.
pub(super) fn mode_refusal(mode: AttachMode) -> Result<Option<String>, Error> {
    let out = Command::new(exe()?)
        .args(["trace", "--mode", mode.name(), "--duration", "0.1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|source| Error::Io {
            what: "probing an attach mode",
            source,
        })?;
    Ok((!out.status.success()).then(|| {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
        format!("{mode}: {}", last.trim_start_matches("pipelock: error: "))
    }))
}

pub(super) fn perf_binary() -> Option<PathBuf> {
    ["/usr/bin/perf", "/usr/local/bin/perf"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}
