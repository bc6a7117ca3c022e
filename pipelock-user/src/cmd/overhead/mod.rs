//! `pipelock overhead`: what tracing costs the workloads it measures.
//!
//! Each workload runs untraced and traced, alternating (A B A B …, so drift
//! on a noisy machine hits both), in every attach mode this kernel allows,
//! and beside them under `perf lock record` when perf is installed. Ratios
//! are traced/untraced throughput (for the herd, untraced/traced time), so
//! 1.0 means free. Traced runs use `--interval 1`, like `pipelock top`. In the
//! hooked modes (and tracepoint mode on real hardware) the same hooks also get
//! programs that do nothing (`--empty-programs`): the cost of the trampolines,
//! kprobes or tracepoint dispatch alone, the floor under pipelock's.
//! The ratios are measured without run-time statistics (they add two clock
//! reads to every program run); one more traced run per cell and pair, with
//! them on, gives every program's run count and run time. Those runs
//! alternate too, and the cell reports the one whose cost per run is the
//! median: a ratio of pipelock's cost to the empty programs' taken from
//! one run each swung by 2x on an emulated machine whose speed drifts.
mod markdown;
mod runs;

use std::path::Path;

use pipelock_common::summary::median;
use serde::Serialize;

pub use self::markdown::to_markdown;
use self::runs::{Cost, Programs, TracedBy, mode_refusal, perf_binary, scratch, traced, untraced};
use crate::{
    Error, bpf::AttachMode, cli::OverheadArgs, model::ProgramStats, output::Outputs, workload::WorkloadName,
};

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
            name: WorkloadName::PipeThroughput.name(),
            args: words(&format!("pipe-throughput --passes 1 --duration {seconds}")),
            classes: "pipe-mutex,pipe-wait,other",
            higher_is_better: true,
        },
        Case {
            name: WorkloadName::PipeHerd.name(),
            args: words(&format!("pipe-herd -k 6 --limit {herd_limit}")),
            classes: "pipe-mutex,pipe-wait,other",
            higher_is_better: false,
        },
        Case {
            name: WorkloadName::LockrefStat.name(),
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

/// The run whose BPF cost per run is the median (the lower of the middle
/// two): one real run, so its per-program table adds up to its figures.
fn median_cost(mut costs: Vec<Cost>) -> Option<Cost> {
    costs.sort_by(|a, b| a.ns_per_run().total_cmp(&b.ns_per_run()));
    let middle = costs.len().checked_sub(1)? / 2;
    Some(costs.swap_remove(middle))
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
        workloads: args.workloads.iter().map(|w| w.name().to_owned()).collect(),
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
            tracers.push(TracedBy::Pipelock {
                mode,
                programs: Programs::Default,
            });
            // Tracepoint mode's floor on real hardware only: in the VMs
            // fentry is the mode users get, and the run is long already.
            if mode.is_hooked() || !emulated {
                tracers.push(TracedBy::Pipelock {
                    mode,
                    programs: Programs::Empty,
                });
            }
            // The stacks' cost on the herd, the figure a user weighs before
            // turning `--callers` on: in every hooked mode (stacks taken per
            // acquisition) and, on real hardware, in tracepoint mode.
            if case.name == "pipe-herd" && (mode.is_hooked() || !emulated) {
                tracers.push(TracedBy::Pipelock {
                    mode,
                    programs: Programs::WithCallers,
                });
            }
        }
        tracers.extend(perf.clone().map(TracedBy::Perf));
        let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); tracers.len()];
        let mut collector: Vec<Vec<f64>> = vec![Vec::new(); tracers.len()];
        let mut costs: Vec<Vec<Cost>> = tracers.iter().map(|_| Vec::new()).collect();
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
                    TracedBy::Pipelock { mode, programs } => {
                        let (value, cost) = traced(*mode, *programs, false, &case)?;
                        collector[i].extend(cost.collector_share);
                        value
                    }
                };
                ratios[i].push(ratio(value, bare));
            }
            // Back to back, so the empty programs' run meets the same
            // machine as pipelock's.
            for (i, tracer) in tracers.iter().enumerate() {
                if let TracedBy::Pipelock { mode, programs } = tracer {
                    eprintln!(
                        "pipelock overhead: {} {}: run-time statistics",
                        case.name,
                        tracer.label()
                    );
                    costs[i].push(traced(*mode, *programs, true, &case)?.1);
                }
            }
        }
        for (i, tracer) in tracers.iter().enumerate() {
            let values = &mut ratios[i];
            let (lo, hi) = (
                values.iter().copied().fold(f64::INFINITY, f64::min),
                values.iter().copied().fold(0.0, f64::max),
            );
            // One ratio per pair, and pairs ≥ 1.
            let ratio_median = median(values).unwrap_or(f64::NAN);
            let cost = median_cost(std::mem::take(&mut costs[i]));
            let runs = cost.as_ref().map(Cost::runs);
            let run_ns = cost.as_ref().map(Cost::run_ns);
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
                collector_cpu_share: median(&mut collector[i]),
                programs: cost.map(|c| c.programs).unwrap_or_default(),
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
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn tracers_are_labelled_by_mode_and_programs() {
        let floor = TracedBy::Pipelock {
            mode: AttachMode::Fentry,
            programs: Programs::Empty,
        };
        let callers = TracedBy::Pipelock {
            mode: AttachMode::Tracepoint,
            programs: Programs::WithCallers,
        };
        assert_eq!(TracedBy::Perf(PathBuf::new()).label(), "perf lock record");
        assert_eq!(floor.label(), "fentry, empty programs");
        assert_eq!(callers.label(), "tracepoint, --callers");
    }

    #[test]
    fn the_reported_cost_is_the_run_of_median_cost_per_run() {
        let run = |runs: u64, ns: u64| Cost {
            programs: vec![ProgramStats {
                name: format!("p{ns}"),
                run_count: runs,
                run_time_ns: ns * runs,
                recursion_misses: 0,
            }],
            cpu_s: 1.0,
            map_memory: None,
            collector_share: None,
        };
        let picked = median_cost(vec![run(10, 900), run(1000, 300), run(5, 400)]).unwrap();
        assert_eq!(picked.programs[0].name, "p400");
        let picked = median_cost(vec![run(1, 500), run(1, 200)]).unwrap();
        assert_eq!(picked.programs[0].name, "p200");
        assert!(median_cost(Vec::new()).is_none());
    }
}
