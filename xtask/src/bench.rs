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

/// Ratios below this miss the workloads issue's bar.
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

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
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
