//! `cargo xtask stress`: the host and VM test layers run again and again
//! with load beside them, and every test that failed at least once listed.
//!
//! A test that fails now and then under load costs a submission each time
//! it fires in CI; running the layers several times on a busy machine
//! finds it before CI does. The load (`--load`) is one busy loop per CPU
//! (`cpu`, the default: a machine busy with something else), or a pipe
//! herd run in a loop (`herd`: also other pipes for the tests that trace
//! the whole system to see), or nothing.
use std::{
    collections::BTreeMap,
    fs,
    path::Path,
    process::{Child, Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};
use pipelock_vm::guest_log;

use crate::{INTEGRATION, bootstrap::Tools, cargo_static, static_binary, vm};

pub struct Stress {
    pub rounds: usize,
    /// Leave the VM layer out.
    pub no_vm: bool,
    pub load: LoadKind,
    pub vm: vm::Options,
}

/// Each test that failed, the rounds it failed in and its first reason.
#[derive(Default)]
struct Failures(BTreeMap<String, (Vec<usize>, String)>);

impl Failures {
    fn add(&mut self, round: usize, layer: &str, log: &str) {
        for (name, why) in guest_log::failed_tests(log) {
            let entry = self
                .0
                .entry(format!("{layer}: {name}"))
                .or_insert_with(|| (Vec::new(), why));
            entry.0.push(round);
        }
    }
}

pub fn stress(root: &Path, tools: &Tools, stress: &Stress) -> Result<()> {
    crate::run(&mut cargo_static(root, tools, crate::BUILD)?)?;
    let dir = root.join("target/stress");
    fs::create_dir_all(&dir)?;
    // A shell that started this in the background left SIGINT ignored,
    // and every test's child would inherit that: Ctrl-C tests need it back.
    // SAFETY: resets a signal disposition; no handler is involved.
    unsafe { libc::signal(libc::SIGINT, libc::SIG_DFL) };
    let load = Load::start(stress.load, &static_binary(root))?;
    let mut failures = Failures::default();
    let mut failed_layers = 0;
    let started = Instant::now();
    for round in 1..=stress.rounds {
        let log = dir.join(format!("round-{round}-host.log"));
        eprintln!(
            "xtask: stress round {round} of {}: host ({})",
            stress.rounds,
            log.display()
        );
        let host = cargo_static(
            root,
            tools,
            &[
                INTEGRATION,
                &["--"],
                &stress.vm.tests.iter().map(String::as_str).collect::<Vec<_>>()[..],
            ]
            .concat(),
        )?
        .stdout(fs::File::create(&log)?)
        .stderr(Stdio::inherit())
        .status()?;
        let text = fs::read_to_string(&log).unwrap_or_default();
        failures.add(round, "host", &text);
        failed_layers += usize::from(!host.success());
        if let Some(counts) = text.lines().rev().find(|l| l.starts_with("integration: ")) {
            eprintln!("xtask: stress round {round}: host {counts}");
        }
        if stress.no_vm {
            continue;
        }
        eprintln!("xtask: stress round {round} of {}: VMs", stress.rounds);
        for boot in vm::boot_each(root, tools, &stress.vm, &vm::guest_command(&stress.vm))? {
            let judged = guest_log::judge(&boot.log, &boot.nonce, boot.stopped.as_ref());
            eprintln!("xtask: stress round {round}: {}: {}", boot.kernel, judged.verdict);
            let kept = dir.join(format!("round-{round}-{}.log", boot.kernel));
            fs::write(&kept, &boot.log).with_context(|| format!("cannot write {}", kept.display()))?;
            failures.add(round, &boot.kernel, &boot.log);
            if let guest_log::Verdict::Failed(why) = judged.verdict {
                failed_layers += 1;
                if guest_log::failed_tests(&boot.log).is_empty() {
                    // A guest that died or hung before its tests said so.
                    failures
                        .0
                        .entry(format!("{}: (the guest)", boot.kernel))
                        .or_insert_with(|| (Vec::new(), why))
                        .0
                        .push(round);
                }
            }
        }
    }
    drop(load);
    let summary = summary(&failures, stress.rounds, started.elapsed().as_secs());
    print!("{summary}");
    fs::write(dir.join("summary.txt"), &summary)?;
    if failed_layers > 0 || !failures.0.is_empty() {
        bail!(
            "{} test(s) failed at least once in {} round(s)",
            failures.0.len().max(1),
            stress.rounds
        );
    }
    Ok(())
}

fn summary(failures: &Failures, rounds: usize, seconds: u64) -> String {
    let mut out = format!(
        "stress: {rounds} round(s) in {}m{:02}s; {} test(s) failed at least once\n",
        seconds / 60,
        seconds % 60,
        failures.0.len()
    );
    for (test, (in_rounds, why)) in &failures.0 {
        let rounds_list: Vec<String> = in_rounds.iter().map(usize::to_string).collect();
        out.push_str(&format!(
            "  {test}: failed in round(s) {} of {rounds}; first: {why}\n",
            rounds_list.join(", ")
        ));
    }
    out
}

/// What runs beside the tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LoadKind {
    /// One busy loop per CPU.
    Cpu,
    /// `pipelock run pipe-herd` in a loop.
    Herd,
    None,
}

/// The load, one process group, killed at the end.
struct Load(Child);

impl Load {
    fn start(kind: LoadKind, pipelock: &Path) -> Result<Option<Self>> {
        let work = match kind {
            LoadKind::None => return Ok(None),
            LoadKind::Cpu => {
                let cpus = std::thread::available_parallelism().map_or(1, usize::from);
                format!("for i in $(seq {cpus}); do (while :; do :; done) & done")
            }
            LoadKind::Herd => format!(
                "(while :; do {} run pipe-herd --limit 200000 -q >/dev/null 2>&1; done) &",
                pipelock.display()
            ),
        };
        // The load is a process group of its own (a Ctrl-C meant for the
        // tests does not reach it), so a stress run stopped by a signal,
        // which skips `Drop`, would leave it running: it watches for this
        // process and ends itself once that is gone.
        let script = format!(
            "{work}; while kill -0 {} 2>/dev/null; do sleep 1; done; kill -9 0",
            std::process::id()
        );
        let mut cmd = Command::new("sh");
        cmd.args(["-c", &script])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd.spawn().context("cannot start the load")?;
        eprintln!(
            "xtask: load beside the tests: {kind:?} (process group {})",
            child.id()
        );
        Ok(Some(Self(child)))
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        // SAFETY: signals the process group this started.
        unsafe { libc::kill(-(self.0.id() as libc::pid_t), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}
