//! `pipelock overhead`: what tracing costs the workloads it measures.
//!
//! Each workload runs untraced and traced, alternating (A B A B …, so drift
//! on a noisy machine hits both), in every attach mode this kernel allows,
//! and beside them under `perf lock record` when perf is installed. Ratios
//! are traced/untraced throughput (for the herd, untraced/traced time), so
//! 1.0 means free. Traced runs use `--interval 1`, like `pipelock top`. In the
//! hooked modes the same hooks also get programs that do nothing (`--empty-programs`):
//! the cost of the trampolines or kprobes alone, the floor under pipelock's.
//! The ratios are measured without run-time statistics (they add two clock
//! reads to every program run); one more traced run per cell, with them on,
//! gives every program's run count and run time.
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

mod markdown;

use serde::Serialize;

pub use self::markdown::to_markdown;
use crate::{
    Error,
    bpf::AttachMode,
    cli::OverheadArgs,
    model::{ProgramStats, TraceReport},
    output::Outputs,
};

/// Targets of the overhead issue; a row that misses one says so.
pub const TRACEPOINT_TARGET: f64 = 0.97;
pub const FENTRY_TARGET: f64 = 0.85;
pub const BPF_SHARE_TARGET: f64 = 0.10;
pub const COLLECTOR_TARGET: f64 = 0.01;

pub struct Options {
    pub pairs: usize,
    pub seconds: f64,
    pub workloads: Vec<String>,
    pub modes: Vec<AttachMode>,
    /// Tokens the herd passes per run (smaller under emulation).
    pub herd_limit: u64,
}

struct Case {
    name: &'static str,
    args: Vec<String>,
    /// The classes traced: the one the workload is about.
    classes: &'static str,
    /// Rates compare traced/untraced; times (pipe-herd) untraced/traced.
    higher_is_better: bool,
}

fn cases(seconds: f64, herd_limit: u64, stat_target: &Path) -> Vec<Case> {
    let words = |s: &str| s.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
    vec![
        Case {
            name: "pipe-throughput",
            args: words(&format!("pipe-throughput --passes 1 --duration {seconds}")),
            classes: "pipe-mutex,pipe-wait,other",
            higher_is_better: true,
        },
        Case {
            name: "pipe-herd",
            args: words(&format!("pipe-herd -k 6 --limit {herd_limit}")),
            classes: "pipe-mutex,pipe-wait,other",
            higher_is_better: false,
        },
        Case {
            name: "lockref-stat",
            args: words(&format!(
                "lockref-stat --threads 2 --duration {seconds} --path {}",
                stat_target.display()
            )),
            classes: "lockref",
            higher_is_better: true,
        },
    ]
}

/// One (workload, tracer) pair of the table.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub workload: String,
    /// `fentry`, `kprobe`, `tracepoint` or `perf lock record`.
    pub tracer: String,
    pub ratio_median: f64,
    pub ratio_min: f64,
    pub ratio_max: f64,
    /// pipelock's programs, summed over the last traced run.
    pub bpf_runs: Option<u64>,
    pub bpf_ns_per_run: Option<f64>,
    /// BPF run time over the CPU time of the workload's processes.
    pub bpf_share_of_cpu: Option<f64>,
    pub map_memory_bytes: Option<u64>,
    /// The collector's CPU time over the run's wall time (1 s refresh).
    pub collector_cpu_share: Option<f64>,
    pub programs: Vec<ProgramStats>,
    /// Which target this row answers to, and whether it is met.
    pub target: Option<(f64, bool)>,
}

#[derive(Debug, Serialize)]
pub struct Results {
    pub kernel: String,
    pub cpu: String,
    pub cpus: usize,
    /// The kernel's clock source: every timestamp a program takes reads it
    /// (an emulated HPET costs far more than the TSC).
    pub clocksource: String,
    pub pairs: usize,
    pub rows: Vec<Row>,
    /// Measured on an emulated CPU (qemu TCG): absolute CPU costs are
    /// inflated, only ratios compare.
    pub emulated: bool,
    /// Modes or tools that could not be measured here, and why.
    pub skipped: Vec<String>,
}

fn exe() -> Result<PathBuf, Error> {
    std::env::current_exe().map_err(|source| Error::Io {
        what: "finding the pipelock binary",
        source,
    })
}

fn scratch(name: &str) -> PathBuf {
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
        return Err(Error::Usage(format!("{command:?} failed: {last}")));
    }
    Ok(())
}

/// The workload's figure and the CPU time its processes used (`getrusage`
/// of the workers: the tracer's own loading is not in it).
fn workload_result(result: &Path) -> Result<(f64, f64), Error> {
    let report = crate::workload::report::load(result)?;
    let run = report
        .runs
        .first()
        .ok_or_else(|| Error::Usage(format!("{}: the workload finished no run", result.display())))?;
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
enum TracedBy {
    Pipelock { mode: AttachMode, empty: bool },
    Perf(PathBuf),
}

impl TracedBy {
    fn label(&self) -> String {
        match self {
            Self::Pipelock { mode, empty: false } => mode.to_string(),
            Self::Pipelock { mode, empty: true } => format!("{mode}, empty programs"),
            Self::Perf(_) => "perf lock record".to_owned(),
        }
    }
}

/// What one traced run cost, from its trace report.
struct Cost {
    programs: Vec<ProgramStats>,
    cpu_s: f64,
    map_memory: Option<u64>,
    collector_share: Option<f64>,
}

/// One run under `pipelock trace`; `bpf_stats` turns the kernel's run-time
/// statistics on (for the cost table, not for a ratio).
fn traced(mode: AttachMode, empty: bool, bpf_stats: bool, case: &Case) -> Result<(f64, Cost), Error> {
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
    wrapper.extend(empty.then(|| "--empty-programs".to_owned()));
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

fn untraced(case: &Case, wrapper: &[String]) -> Result<f64, Error> {
    let result = scratch("result.json");
    run_quietly(&mut workload_command(wrapper, case, &result)?)?;
    let value = workload_result(&result).map(|(value, _)| value);
    let _ = std::fs::remove_file(&result);
    value
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// Whether `mode` attaches here: a tenth of a second of tracing.
fn mode_refusal(mode: AttachMode) -> Result<Option<String>, Error> {
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

fn perf_binary() -> Option<PathBuf> {
    ["/usr/bin/perf", "/usr/local/bin/perf"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// The issue sets the tracepoint target on real hardware (this host) and the
/// fentry one in the VMs, the only place fentry loads here.
fn target(tracer: &TracedBy, workload: &str, emulated: bool) -> Option<f64> {
    let TracedBy::Pipelock { mode, empty: false } = tracer else {
        return None;
    };
    match (mode, workload) {
        (AttachMode::Tracepoint, "pipe-throughput" | "pipe-herd") if !emulated => Some(TRACEPOINT_TARGET),
        (AttachMode::Fentry, "pipe-throughput") => Some(FENTRY_TARGET),
        _ => None,
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// `pipelock overhead`: measure, print the markdown, write the files.
pub fn run_command(args: &OverheadArgs) -> Result<(), Error> {
    let outputs = Outputs::prepare(args.json.as_deref(), None)?;
    let results = run(&Options {
        pairs: usize::from(args.pairs),
        seconds: args.seconds.as_secs_f64(),
        workloads: args.workloads.iter().map(|w| w.subcommand().to_owned()).collect(),
        modes: args.modes.clone(),
        herd_limit: args.herd_limit,
    })?;
    let markdown = to_markdown(&results);
    print!("{markdown}");
    if let Some(path) = &args.markdown {
        let staging = path.with_extension("md.partial");
        std::fs::write(&staging, &markdown)
            .and_then(|()| std::fs::rename(&staging, path))
            .map_err(|source| Error::Output {
                path: path.clone(),
                source,
            })?;
    }
    outputs.write_with(|_| serde_json::to_vec_pretty(&results).map_err(std::io::Error::other))
}

pub fn run(options: &Options) -> Result<Results, Error> {
    crate::kernel::privilege::require()?;
    let cpu = cpu_model();
    // qemu TCG: absolute CPU costs are inflated tens of times.
    let emulated = cpu.contains("QEMU TCG");
    let stat_target = scratch("stat-target");
    std::fs::write(&stat_target, b"").map_err(|source| Error::Io {
        what: "creating the stat() target",
        source,
    })?;
    let mut skipped = Vec::new();
    let mut modes = Vec::new();
    for &mode in &options.modes {
        match mode_refusal(mode)? {
            None => modes.push(mode),
            Some(why) => skipped.push(why),
        }
    }
    let perf = perf_binary();
    if perf.is_none() {
        skipped.push("perf lock record: perf is not installed (Debian: linux-perf)".to_owned());
    }
    let mut rows = Vec::new();
    for case in cases(options.seconds, options.herd_limit, &stat_target) {
        if !options.workloads.is_empty() && !options.workloads.iter().any(|w| w == case.name) {
            continue;
        }
        let ratio = |traced: f64, bare: f64| {
            if case.higher_is_better {
                traced / bare
            } else {
                bare / traced
            }
        };
        let mut tracers = Vec::new();
        for &mode in &modes {
            tracers.push(TracedBy::Pipelock { mode, empty: false });
            if mode.is_hooked() {
                tracers.push(TracedBy::Pipelock { mode, empty: true });
            }
        }
        tracers.extend(perf.clone().map(TracedBy::Perf));
        let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); tracers.len()];
        let mut collector: Vec<Vec<f64>> = vec![Vec::new(); tracers.len()];
        for pair in 0..options.pairs {
            eprintln!(
                "pipelock overhead: {} pair {}/{}",
                case.name,
                pair + 1,
                options.pairs
            );
            for (i, tracer) in tracers.iter().enumerate() {
                let bare = untraced(&case, &[])?;
                let value = match tracer {
                    TracedBy::Perf(perf) => {
                        let data = scratch("perf.data");
                        let wrapper = [
                            perf.display().to_string(),
                            "lock".into(),
                            "record".into(),
                            "-o".into(),
                            data.display().to_string(),
                            "--".into(),
                        ];
                        let value = untraced(&case, &wrapper);
                        let _ = std::fs::remove_file(&data);
                        value?
                    }
                    TracedBy::Pipelock { mode, empty } => {
                        let (value, cost) = traced(*mode, *empty, false, &case)?;
                        collector[i].extend(cost.collector_share);
                        value
                    }
                };
                ratios[i].push(ratio(value, bare));
            }
        }
        for (i, tracer) in tracers.iter().enumerate() {
            let values = &mut ratios[i];
            let (lo, hi) = (
                values.iter().copied().fold(f64::INFINITY, f64::min),
                values.iter().copied().fold(0.0, f64::max),
            );
            let ratio_median = median(values);
            let cost = match tracer {
                TracedBy::Pipelock { mode, empty } => {
                    eprintln!(
                        "pipelock overhead: {} {}: run-time statistics",
                        case.name,
                        tracer.label()
                    );
                    Some(traced(*mode, *empty, true, &case)?.1)
                }
                TracedBy::Perf(_) => None,
            };
            let runs = cost
                .as_ref()
                .map(|c| c.programs.iter().map(|p| p.run_count).sum::<u64>());
            let run_ns = cost
                .as_ref()
                .map(|c| c.programs.iter().map(|p| p.run_time_ns).sum::<u64>());
            let goal = target(tracer, case.name, emulated);
            rows.push(Row {
                workload: case.name.to_owned(),
                tracer: tracer.label(),
                ratio_median,
                ratio_min: lo,
                ratio_max: hi,
                bpf_runs: runs,
                bpf_ns_per_run: runs
                    .zip(run_ns)
                    .and_then(|(r, t)| (r > 0).then(|| t as f64 / r as f64)),
                bpf_share_of_cpu: cost
                    .as_ref()
                    .zip(run_ns)
                    .and_then(|(c, t)| (c.cpu_s > 0.0).then(|| t as f64 / 1e9 / c.cpu_s)),
                map_memory_bytes: cost.as_ref().and_then(|c| c.map_memory),
                collector_cpu_share: (!collector[i].is_empty()).then(|| median(&mut collector[i])),
                programs: cost.map(|c| c.programs).unwrap_or_default(),
                target: goal.map(|g| (g, ratio_median >= g)),
            });
        }
    }
    let _ = std::fs::remove_file(&stat_target);
    Ok(Results {
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_owned(),
        emulated,
        cpu,
        cpus: std::thread::available_parallelism().map_or(1, usize::from),
        clocksource: std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .map_or_else(|_| "unknown".to_owned(), |s| s.trim().to_owned()),
        pairs: options.pairs,
        rows,
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_apply_where_the_issue_sets_them() {
        let tracepoint = TracedBy::Pipelock {
            mode: AttachMode::Tracepoint,
            empty: false,
        };
        let fentry = TracedBy::Pipelock {
            mode: AttachMode::Fentry,
            empty: false,
        };
        let floor = TracedBy::Pipelock {
            mode: AttachMode::Fentry,
            empty: true,
        };
        assert_eq!(target(&tracepoint, "pipe-herd", false), Some(TRACEPOINT_TARGET));
        assert_eq!(target(&tracepoint, "pipe-herd", true), None);
        assert_eq!(target(&fentry, "pipe-throughput", true), Some(FENTRY_TARGET));
        assert_eq!(target(&floor, "pipe-throughput", true), None);
        assert_eq!(
            target(&TracedBy::Perf(PathBuf::new()), "pipe-throughput", false),
            None
        );
        assert_eq!(floor.label(), "fentry, empty programs");
    }

    #[test]
    fn median_of_even_and_odd_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&mut []).is_nan());
    }
}
