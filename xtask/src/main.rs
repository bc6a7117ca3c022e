//! `cargo xtask …`: builds pipelock from nothing but rustup and cargo, runs it,
//! and runs every test layer. See README.md for the two commands that matter.
mod bench;
mod bootstrap;
mod dist;
mod installed;
mod layers;
mod stress;
mod vm;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::layers::{Beside, Layers};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "pipelock's build, bootstrap and test driver")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Bootstrap nightly + rust-src + bpf-linker if needed, then build
    /// target/release/pipelock with its eBPF programs embedded.
    Build,
    /// Build the static binary, then package it under target/dist/: a
    /// tarball and a .deb with the man pages, shell completions, systemd
    /// unit and Grafana dashboard.
    Dist {
        /// Then install the .deb, use it from the installed paths, and
        /// remove it again (as `cargo xtask test` does).
        #[arg(long)]
        check: bool,
    },
    /// Build, then run the main job: the pipe herd of commit 0ddad21d3e99
    /// traced, with its per-lock report (`pipelock run pipe-herd --trace`).
    Run {
        /// Other arguments for pipelock (default: `run pipe-herd --trace`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build, then run every test layer: clippy, unit tests, the integration
    /// tests on this kernel (privileged ones need root), then the same tests
    /// inside the VM kernels of xtask/vm-kernels.txt.
    Test {
        /// Skip the VM tests (they are reported as skipped).
        #[arg(long)]
        no_vm: bool,
    },
    /// Each built-in workload against a C program making the same syscalls,
    /// alternated on this machine; prints pipelock/C ratios (target ≥ 0.95).
    BenchWorkloads {
        /// Alternations per workload (the median ratio is reported).
        #[arg(long, default_value_t = 9)]
        pairs: usize,
        /// Seconds per timed run.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// Only workloads whose name contains this (repeatable).
        #[arg(long = "workload", value_name = "NAME")]
        only: Vec<String>,
    },
    /// Measure pipelock's own cost (`pipelock overhead`) on this host and,
    /// with --vm, in the VM kernels (fentry and kprobe modes); writes
    /// docs/benchmarks.md and docs/benchmarks.json.
    BenchOverhead {
        /// Alternating untraced/traced pairs per cell.
        #[arg(long, default_value_t = 5)]
        pairs: usize,
        /// Seconds per timed run.
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        /// Also measure inside the VM kernels (slow: TCG emulation).
        #[arg(long)]
        vm: bool,
        /// With --vm: only this kernel (repeatable), e.g. `--kernel 6.1`.
        #[arg(long = "kernel", value_name = "NAME")]
        kernels: Vec<String>,
        /// Only these workloads (pipe-throughput, pipe-herd, lockref-stat).
        #[arg(long = "workload", value_name = "NAME", value_delimiter = ',')]
        workloads: Vec<String>,
        /// Only these attach modes (fentry, kprobe, tracepoint; default: all).
        #[arg(long = "mode", value_name = "MODE", value_delimiter = ',')]
        modes: Vec<String>,
    },
    /// Run the integration tests inside each kernel of xtask/vm-kernels.txt
    /// under qemu (TCG), fetching kernels and qemu as needed.
    VmTest(VmArgs),
    /// Run the host and VM integration tests several times with load
    /// beside them, then list every test that failed at least once (logs
    /// and the list under target/stress).
    Stress {
        /// How many times each layer runs.
        #[arg(long, default_value_t = 3)]
        repeat: usize,
        /// Leave the VM layer out.
        #[arg(long)]
        no_vm: bool,
        /// What runs beside the tests: a busy loop per CPU, a pipe herd
        /// in a loop (which tests tracing the whole system also see), or nothing.
        #[arg(long, value_enum, default_value_t = stress::LoadKind::Cpu)]
        load: stress::LoadKind,
        #[command(flatten)]
        vm: VmArgs,
    },
}

#[derive(clap::Args)]
struct VmArgs {
    /// Only this kernel (repeatable), e.g. `--kernel 6.1` (not 6.12).
    #[arg(long = "kernel", value_name = "NAME")]
    only: Vec<String>,
    /// Limit for one kernel's boot and tests, in seconds.
    #[arg(long, default_value_t = VM_TIMEOUT_SECONDS)]
    timeout: u64,
    /// Use KVM instead of TCG (opt-in: it hangs on some hosts).
    #[arg(long)]
    kvm: bool,
    /// Print the qemu command line and keep the initramfs under target/vm.
    #[arg(long)]
    verbose: bool,
    /// Only the integration tests whose name contains this (repeatable).
    #[arg(long = "test", value_name = "NAME")]
    tests: Vec<String>,
    /// Guests at once (default: one per host CPU; each TCG guest keeps one busy).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    jobs: Option<u16>,
}

impl VmArgs {
    fn options(&self) -> vm::Options {
        vm::Options {
            only: self.only.clone(),
            timeout: std::time::Duration::from_secs(self.timeout),
            silence: Some(TEST_GUEST_SILENCE),
            kvm: self.kvm,
            verbose: self.verbose,
            tests: self.tests.clone(),
            jobs: self.jobs.map_or_else(host_cpus, usize::from),
        }
    }
}

/// The host's CPUs: how many single-threaded TCG guests can run at once
/// without slowing each other.
fn host_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

fn main() -> std::process::ExitCode {
    match task(Cli::parse().command) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn task(task: Task) -> Result<()> {
    let root = workspace_root();
    match task {
        Task::Build => build(&root).map(drop),
        Task::Run { args } => {
            let pipelock = build(&root)?;
            let args = if args.is_empty() {
                ["run", "pipe-herd", "--trace"].map(str::to_owned).to_vec()
            } else {
                args
            };
            run(Command::new(pipelock).args(args))
        }
        Task::Test { no_vm } => test(&root, no_vm),
        Task::Dist { check } => {
            let tools = bootstrap::ensure(&root)?;
            run(&mut cargo_static(&root, &tools, BUILD)?)?;
            let dist = dist::dist(&root, &static_binary(&root))?;
            if check { installed::check(&dist) } else { Ok(()) }
        }
        Task::BenchWorkloads { pairs, seconds, only } => {
            let pipelock = build(&root)?;
            if !bench::bench_workloads(&root, &pipelock, pairs, seconds, &only)? {
                bail!("a workload is below the target ratio");
            }
            Ok(())
        }
        Task::BenchOverhead {
            pairs,
            seconds,
            vm,
            kernels,
            workloads,
            modes,
        } => {
            let pipelock = build(&root)?;
            bootstrap::ensure_debian_packages(&[("linux-perf", &|| bootstrap::which("perf").is_some())])?;
            let tools = bootstrap::ensure(&root)?;
            let bench = bench::OverheadBench {
                pairs,
                seconds,
                workloads,
                modes,
                vm_kernels: vm.then_some(kernels),
            };
            bench::bench_overhead(&root, &pipelock, &tools, &bench)
        }
        Task::Stress {
            repeat,
            no_vm,
            load,
            vm,
        } => {
            let tools = bootstrap::ensure(&root)?;
            let stress = stress::Stress {
                rounds: repeat,
                no_vm,
                load,
                vm: vm.options(),
            };
            stress::stress(&root, &tools, &stress)
        }
        Task::VmTest(args) => {
            let tools = bootstrap::ensure(&root)?;
            vm::vm_test(&root, &tools, &args.options()).map(drop)
        }
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_owned()
}

/// Runs a command to completion, echoing it first; fails on a non-zero exit.
fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: running {cmd:?}");
    let status = cmd.status().with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// A cargo command with bpf-linker on PATH, so pipelock-user's build.rs finds it.
fn cargo(root: &Path, tools: &bootstrap::Tools) -> Result<Command> {
    let mut path = vec![tools.bin_dir.clone()];
    path.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root)
        .env("PATH", std::env::join_paths(path)?)
        .env_remove("PIPELOCK_EBPF_STUB");
    Ok(cmd)
}

/// The host target, named: a `--target` build applies RUSTFLAGS to the
/// target's code only (not to build scripts and proc macros) and lands in
/// target/TARGET. Static binaries from it run in any guest (no musl target here).
pub const TARGET: &str = "x86_64-unknown-linux-gnu";

/// `cargo ARGS` for `cargo xtask test`: static binaries for the host
/// target, the ones the VM guests run, so that one compile serves clippy,
/// the unit tests, the host's integration tests, the guests, the soak and
/// `pipelock ab` (a second flavour cost the run four minutes).
fn cargo_static(root: &Path, tools: &bootstrap::Tools, args: &[&str]) -> Result<Command> {
    let (own, passed) = args.split_at(args.iter().position(|a| *a == "--").unwrap_or(args.len()));
    let mut cmd = cargo(root, tools)?;
    cmd.args(own)
        .args(["--target", TARGET])
        .args(passed)
        .env("RUSTFLAGS", "-C target-feature=+crt-static");
    Ok(cmd)
}

/// The build of pipelock (`cargo xtask build`; `cargo xtask test` and the
/// guests' images in the static flavour), and of the integration tests.
const BUILD: &[&str] = &["build", "--release", "--package", "pipelock-user"];
const INTEGRATION: &[&str] = &["test", "--release", "--test", "integration"];

/// Where `cargo_static(BUILD)` leaves the binary.
fn static_binary(root: &Path) -> PathBuf {
    root.join("target").join(TARGET).join("release/pipelock")
}

fn build(root: &Path) -> Result<PathBuf> {
    let tools = bootstrap::ensure(root)?;
    run(cargo(root, &tools)?.args(BUILD))?;
    Ok(root.join("target/release/pipelock"))
}

fn test(root: &Path, no_vm: bool) -> Result<()> {
    let mut layers = Layers::default();
    let tools = layers.time("build", || {
        let tools = bootstrap::ensure(root)?;
        run(&mut cargo_static(root, &tools, BUILD)?)?;
        Ok(tools)
    })?;
    let tools = &tools;
    // The package a user installs, installed and used from its own paths.
    layers.time("package", || {
        bootstrap::ensure_debian_packages(&[
            ("man-db", &|| bootstrap::which("man").is_some()),
            ("systemd", &|| bootstrap::which("systemd-analyze").is_some()),
        ])?;
        let dist = dist::dist(root, &static_binary(root))?;
        installed::check(&dist)
    })?;
    // Default members only: pipelock-ebpf builds for the BPF target, not the host.
    layers.time("clippy", || {
        run(&mut cargo_static(
            root,
            tools,
            &["clippy", "--release", "--all-targets", "--", "-D", "warnings"],
        )?)
    })?;
    layers.time("unit tests", || {
        run(&mut cargo_static(
            root,
            tools,
            &["test", "--release", "--lib", "--bins"],
        )?)
    })?;
    layers.time("host integration", || {
        // perf: the independent cross-check; tmux: the real terminal of the top view's test.
        // prometheus: the real scraper the exporter is tested against.
        // chromium: the browser the pictures are opened and screenshotted in.
        bootstrap::ensure_debian_packages(&[
            ("linux-perf", &|| bootstrap::which("perf").is_some()),
            ("tmux", &|| bootstrap::which("tmux").is_some()),
            ("prometheus", &|| bootstrap::which("promtool").is_some()),
            ("chromium", &|| bootstrap::which("chromium").is_some()),
            // The exporter's TLS test makes its certificates and scrapes with
            // curl; strace lists the system calls the unit's filter must allow.
            ("openssl", &|| bootstrap::which("openssl").is_some()),
            ("curl", &|| bootstrap::which("curl").is_some()),
            ("strace", &|| bootstrap::which("strace").is_some()),
        ])?;
        // The eBPF object check, the CLI contract and the privileged host tests;
        // prints `integration: N passed, N failed, N skipped`.
        run(&mut cargo_static(root, tools, INTEGRATION)?)
    })?;
    if no_vm {
        println!("vm-test: 0 passed, 0 failed, 1 skipped (skipped: --no-vm)");
        println!(
            "xtask: a 60 s soak of `pipelock serve` instead of the 600 s one that runs beside the VM tests"
        );
        return layers.time("soak", || soak(root, tools, 60)?.finish());
    }
    layers.time("VMs, soak and ab side by side", || vms_soak_and_ab(root, tools))?;
    // `ab --source` after the guests, not beside them: a kernel build
    // takes both CPUs, and the guests beside it ran past their limit.
    layers.time("ab --source", || {
        let source = vm::ensure_kernel_source(root)?;
        run(
            cargo_static(root, tools, &[INTEGRATION, &["--", "ab_source_"]].concat())?
                .env("PIPELOCK_AB_SOURCE", source)
                .env("PIPELOCK_AB_BUILD_CACHE", root.join("target/vm/kernel-builds")),
        )
    })
}

/// The VM tests, with the exporter's soak and `pipelock ab`'s tests beside
/// them, which take less time than they do. The soak's churn has more
/// threads than the guests (one busy thread each), so it keeps its pace;
/// ab's tests judge counts and exit codes, not time.
fn vms_soak_and_ab(root: &Path, tools: &bootstrap::Tools) -> Result<()> {
    let soak = soak(root, tools, SOAK_SECONDS)?;
    // `pipelock ab` between two of the VM tests' kernels, fetched first,
    // with qemu and busybox installed before either starts.
    vm::ensure_host_packages()?;
    let kernels = format!(
        "{}:{}",
        vm::kernel_image(root, "6.1")?.display(),
        vm::kernel_image(root, "6.18")?.display()
    );
    let ab = Beside::start(
        cargo_static(
            root,
            tools,
            &[INTEGRATION, &["--", "ab_shows_", "ab_failures_", "ab_preflight_"]].concat(),
        )?
        .env("PIPELOCK_AB_KERNELS", kernels),
        root.join("target/ab.log"),
        "`pipelock ab`'s tests",
        |_| true,
    )?;
    let vm_args = VmArgs {
        only: Vec::new(),
        timeout: VM_TIMEOUT_SECONDS,
        kvm: false,
        verbose: false,
        tests: Vec::new(),
        jobs: None,
    };
    let results = [
        vm::vm_test(root, tools, &vm_args.options()).map(drop),
        soak.finish(),
        ab.finish(),
    ];
    let failed: Vec<String> = results
        .into_iter()
        .filter_map(|r| r.err().map(|e| format!("{e:#}")))
        .collect();
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    Ok(())
}

/// A kernel's boot and tests take 630–700 s under TCG beside the soak and
/// `ab`'s guests here, and ran past 1200 s on a slower CI machine. A hung
/// guest is caught sooner by its silence (`TEST_GUEST_SILENCE`) and a hung
/// test by the harness's own limit, so this limit only bounds a slow guest.
const VM_TIMEOUT_SECONDS: u64 = 1800;

/// The harness reports a test still running every two minutes in a guest
/// (`watchdog.rs` of the integration tests), so a console silent this long
/// means a stuck guest kernel or harness.
const TEST_GUEST_SILENCE: std::time::Duration = std::time::Duration::from_secs(300);

/// How long `cargo xtask test` runs `pipelock serve` over churning pipes.
const SOAK_SECONDS: u64 = 600;

/// The soak of `pipelock serve` (`integration --soak SECONDS`), started.
fn soak(root: &Path, tools: &bootstrap::Tools, seconds: u64) -> Result<Beside> {
    let seconds = seconds.to_string();
    Beside::start(
        &mut cargo_static(root, tools, &[INTEGRATION, &["--", "--soak", &seconds]].concat())?,
        root.join("target/soak.log"),
        "the soak of pipelock serve",
        |line| line.starts_with("soak:"),
    )
}

#[cfg(test)]
#[path = "readme_tests.rs"]
mod tests;
