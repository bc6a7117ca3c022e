//! `cargo xtask bench-workloads`: each built-in workload against a small C
//! program making the same syscalls (xtask/bench/*.c), run alternately on the
//! same machine, reported as ratios (1.0 = as fast as C; target ≥ 0.95).
//!
//! The target compares like with like: `pipelock run --no-counters` against
//! the uninstrumented C program. The default run (inherited perf counters,
//! which the kernel updates on every context switch) is shown beside it, so
//! the counters' own cost is measured rather than hidden.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, ensure};
use goals::{callers_before_after, host_goals};

mod goals;

/// The bar a built-in workload must reach against its C reference program.
const TARGET: f64 = 0.95;

struct Case {
    name: &'static str,
    c_program: &'static str,
    c_args: Vec<String>,
    pipelock_args: Vec<String>,
    /// Rates compare as pipelock/C; times (pipe-herd) as C/pipelock.
    higher_is_better: bool,
}

fn cases(seconds: f64, scratch: &Path) -> Vec<Case> {
    let s = |v: &str| v.to_owned();
    let secs = format!("{seconds}");
    let file = scratch.join("stat-target").display().to_string();
    vec![
        Case {
            name: "pipe-throughput",
            c_program: "pipe_throughput",
            c_args: vec![secs.clone()],
            pipelock_args: vec![
                s("pipe-throughput"),
                s("--passes"),
                s("1"),
                s("--duration"),
                secs.clone(),
            ],
            higher_is_better: true,
        },
        Case {
            name: "pipe-herd",
            c_program: "pipe_herd",
            c_args: vec![s("6"), s("300000")],
            pipelock_args: vec![s("pipe-herd"), s("-k"), s("6"), s("--limit"), s("300000")],
            higher_is_better: false,
        },
        Case {
            name: "pipe-stream",
            c_program: "pipe_stream",
            c_args: vec![format!("{}", 2u64 << 30), s("819200")],
            pipelock_args: vec![
                s("pipe-stream"),
                s("--bytes"),
                s("2G"),
                s("--bufsize"),
                s("819200"),
            ],
            higher_is_better: true,
        },
        Case {
            name: "lockref-stat",
            c_program: "lockref_stat",
            c_args: vec![s("2"), secs.clone(), file.clone()],
            pipelock_args: vec![
                s("lockref-stat"),
                s("--threads"),
                s("2"),
                s("--duration"),
                secs,
                s("--path"),
                file,
            ],
            higher_is_better: true,
        },
    ]
}

fn compile(root: &Path, out_dir: &Path, name: &str) -> Result<PathBuf> {
    let source = root.join("xtask/bench").join(format!("{name}.c"));
    let binary = out_dir.join(name);
    crate::run(
        Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()))
            .args(["-O2", "-Wall", "-o"])
            .arg(&binary)
            .arg(&source)
            .arg("-lpthread"),
    )?;
    Ok(binary)
}

fn number(cmd: &mut Command) -> Result<f64> {
    let out = cmd.output().with_context(|| format!("cannot run {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    text.trim()
        .parse()
        .with_context(|| format!("{cmd:?} printed {text:?}"))
}

fn pipelock_value(pipelock: &Path, args: &[String], json: &Path) -> Result<f64> {
    let out = Command::new(pipelock)
        .arg("run")
        .args(args)
        .arg("--quiet")
        .arg("--json")
        .arg(json)
        .output()?;
    ensure!(
        out.status.success(),
        "pipelock run {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(json)?)?;
    report["runs"][0]["value"]
        .as_f64()
        .context("no value in the result")
}

/// A median of runs that were all made: NaN (printed as such) if none were.
fn median(values: &mut [f64]) -> f64 {
    pipelock_common::summary::median(values).unwrap_or(f64::NAN)
}

pub fn bench_workloads(
    root: &Path,
    pipelock: &Path,
    pairs: usize,
    seconds: f64,
    only: &[String],
) -> Result<bool> {
    let out_dir = root.join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    std::fs::write(out_dir.join("stat-target"), b"")?;
    let json = out_dir.join("result.json");
    println!(
        "| workload | C reference | pipelock --no-counters | ratio (median) | min – max | ≥ {TARGET} \
         | pipelock (perf counters on) | ratio (median) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut all_met = true;
    for case in cases(seconds, &out_dir) {
        if !only.is_empty() && !only.iter().any(|o| case.name.contains(o.as_str())) {
            continue;
        }
        let c_binary = compile(root, &out_dir, case.c_program)?;
        let no_counters: Vec<String> = case
            .pipelock_args
            .iter()
            .cloned()
            .chain(["--no-counters".to_owned()])
            .collect();
        let (mut c_values, mut bare, mut counted) = (Vec::new(), Vec::new(), Vec::new());
        // Alternate the three so drift on a noisy machine hits all of them.
        for _ in 0..pairs {
            c_values.push(number(Command::new(&c_binary).args(&case.c_args))?);
            bare.push(pipelock_value(pipelock, &no_counters, &json)?);
            counted.push(pipelock_value(pipelock, &case.pipelock_args, &json)?);
        }
        let ratio = |p: f64, c: f64| if case.higher_is_better { p / c } else { c / p };
        let mut bare_ratios: Vec<f64> = bare.iter().zip(&c_values).map(|(p, c)| ratio(*p, *c)).collect();
        let mut counted_ratios: Vec<f64> = counted
            .iter()
            .zip(&c_values)
            .map(|(p, c)| ratio(*p, *c))
            .collect();
        let lo = bare_ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = bare_ratios.iter().copied().fold(0.0, f64::max);
        let bare_ratio = median(&mut bare_ratios);
        all_met &= bare_ratio >= TARGET;
        let unit = if case.higher_is_better { "" } else { " s" };
        println!(
            "| {} | {:.1}{unit} | {:.1}{unit} | {bare_ratio:.3} | {lo:.3} – {hi:.3} | {} | {:.1}{unit} | {:.3} |",
            case.name,
            median(&mut c_values),
            median(&mut bare),
            if bare_ratio >= TARGET { "yes" } else { "NO" },
            median(&mut counted),
            median(&mut counted_ratios),
        );
    }
    let _ = std::fs::remove_file(json);
    Ok(all_met)
}

/// Markers around the markdown a guest prints (its console mixes in kernel lines).
const BEGIN: &str = "PIPELOCK-OVERHEAD-BEGIN";
const END: &str = "PIPELOCK-OVERHEAD-END";

pub struct OverheadBench {
    pub pairs: usize,
    pub seconds: f64,
    /// Empty: all of `pipelock overhead`'s workloads.
    pub workloads: Vec<String>,
    /// Empty: every attach mode (those a kernel refuses are listed as such).
    pub modes: Vec<String>,
    /// Some: also inside these VM kernels (empty: all of them).
    pub vm_kernels: Option<Vec<String>>,
}

/// `cargo xtask bench-overhead`: `pipelock overhead` here and, with `vm`, in
/// each VM kernel; the tables go to docs/benchmarks.md (JSON beside it).
pub fn bench_overhead(
    root: &Path,
    pipelock: &Path,
    tools: &crate::bootstrap::Tools,
    bench: &OverheadBench,
) -> Result<()> {
    let OverheadBench { pairs, seconds, .. } = *bench;
    let mut selection = String::new();
    if !bench.workloads.is_empty() {
        selection += &format!(" --workload {}", bench.workloads.join(","));
    }
    let modes = if bench.modes.is_empty() {
        "fentry,kprobe,tracepoint".to_owned()
    } else {
        bench.modes.join(",")
    };
    selection += &format!(" --mode {modes}");
    let out_dir = root.join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    let (host_md, host_json) = (
        out_dir.join("overhead-host.md"),
        out_dir.join("overhead-host.json"),
    );
    crate::run(
        Command::new(pipelock)
            .args([
                "overhead",
                "--pairs",
                &pairs.to_string(),
                "--seconds",
                &seconds.to_string(),
            ])
            .args(selection.split_whitespace())
            .arg("--markdown")
            .arg(&host_md)
            .arg("--json")
            .arg(&host_json),
    )?;
    let mut doc = String::from(
        "# pipelock's overhead\n\nRegenerate with `cargo xtask bench-overhead --vm` (narrower runs go to \
         target/bench/). Each cell alternates an untraced and a traced run of the same workload (A B A B …); the \
         ratio is traced/untraced throughput (for pipe-herd, untraced/traced time), so 1.000 means free. \
         Traced runs refresh every second (`--interval 1`, like `pipelock top`). In the hooked modes \
         (fentry, kprobe), and in tracepoint mode on this host, the same hooks are also measured with \
         programs that return at once (`empty programs`): what the trampolines, kprobes or tracepoint \
         dispatch alone cost, the floor under pipelock's own programs (a herd's ratio moves with how its \
         processes happen to be scheduled, more than with either's cost). The herd is also traced with `--callers`, the opt-in cost a user weighs \
         before turning it on: on this host in tracepoint mode (kernel stacks unwound at `contention_end`: each \
         CPU's first 1 024 a second, then one in 32 and every wait of 10 µs or more), in the VMs in the hooked \
         modes (a stack taken at the lock call, sampled the same way); the default programs \
         include the holder-state ones on `sched_switch` and `sched_waking`. Ratios are measured with the kernel's run-time statistics off; one more traced run \
         per cell and pair, with them on (a scoped `BPF_ENABLE_STATS` descriptor), gives BPF runs and run \
         time; a cell shows the one whose ns per run is the median. \
         The workload's CPU time comes from `getrusage` of its worker processes, map memory from the \
         maps' `memlock`, and the collector's CPU from its own `getrusage`.\n\n## This host\n\n",
    );
    doc.push_str(&std::fs::read_to_string(&host_md)?);
    let host: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&host_json)?)?;
    let goals = host_goals(&host);
    for line in &goals {
        println!("xtask: goal: {line}");
    }
    if !goals.is_empty() {
        doc.push_str("\n### The project's goals on this host\n\n");
        for line in &goals {
            doc.push_str(&format!("- {line}\n"));
        }
    }
    doc.push_str(&callers_before_after(
        host["rows"].as_array().map_or(&[][..], Vec::as_slice),
    ));
    let mut json = serde_json::json!({ "host": host });
    if let Some(only) = &bench.vm_kernels {
        // TCG runs everything ~50x slower: shorter runs, a smaller herd.
        let guest = format!(
            "/pipelock overhead --pairs {pairs} --seconds 1 --herd-limit 20000{selection} \
             --markdown /tmp/overhead.md --json /tmp/overhead.json >/dev/null; rc=$?; echo {BEGIN}; \
             cat /tmp/overhead.md; echo {END}; (exit $rc)"
        );
        let options = crate::vm::Options {
            only: only.clone(),
            timeout: std::time::Duration::from_secs(3600),
            // The benchmark prints nothing until its table.
            silence: None,
            kvm: false,
            verbose: false,
            tests: Vec::new(),
            // One guest at a time: a second would take CPU from the one measuring.
            jobs: 1,
        };
        for boot in crate::vm::boot_each(root, tools, &options, &guest)? {
            let table = boot
                .log
                .split_once(BEGIN)
                .and_then(|(_, rest)| rest.split_once(END))
                .map(|(table, _)| table.trim().to_owned())
                .filter(|t| t.contains("| workload |"));
            let Some(table) = table else {
                anyhow::bail!(
                    "{}: no overhead table in the guest log ({}); see target/vm/{}.log",
                    boot.kernel,
                    boot.stopped
                        .map_or("it powered off".to_owned(), |s| s.to_string()),
                    boot.kernel
                );
            };
            doc.push_str(&format!(
                "\n## VM: {} (qemu TCG, single-threaded: absolute costs are inflated, ratios compare)\n\n{table}\n",
                boot.kernel
            ));
            json[boot.kernel.as_str()] = serde_json::Value::String(table);
        }
    }
    // docs/ keeps only complete runs: a quick partial one must not replace them.
    let complete = bench.workloads.is_empty()
        && bench.modes.is_empty()
        && bench.vm_kernels.as_ref().is_some_and(Vec::is_empty);
    let dir = if complete { root.join("docs") } else { out_dir };
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("benchmarks.md"), doc)?;
    std::fs::write(dir.join("benchmarks.json"), serde_json::to_string_pretty(&json)?)?;
    println!(
        "xtask: wrote {0}/benchmarks.md and {0}/benchmarks.json{1}",
        dir.display(),
        if complete {
            ""
        } else {
            " (a partial run: docs/ keeps the last complete one, from `cargo xtask bench-overhead --vm`)"
        }
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The workloads benchmarked against C are the ones `pipelock run` has
    /// (the list is `WorkloadName` in pipelock-user), each run by its name.
    #[test]
    fn cases_are_the_workloads_pipelock_runs() {
        let source =
            std::fs::read_to_string(crate::workspace_root().join("pipelock-user/src/workload/mod.rs"))
                .unwrap();
        let names_fn = &source[source.find("pub fn name(self)").expect("WorkloadName::name")..];
        let names_fn = &names_fn[..names_fn.find("\n    }\n").unwrap()];
        let listed: Vec<&str> = names_fn.split('"').skip(1).step_by(2).collect();
        let cases = cases(1.0, Path::new("/tmp"));
        assert_eq!(cases.iter().map(|c| c.name).collect::<Vec<_>>(), listed);
        for case in &cases {
            assert_eq!(case.pipelock_args[0], case.name);
        }
    }
}
