//! `pipelock ab`: the same traced workload on two kernels, one command,
//! one comparison table.
//!
//! Each kernel boots first for a preflight (kernel BTF, `pipelock probe`):
//! a kernel pipelock cannot trace is refused before anything is measured.
//! Then the command runs once per boot, boots alternating A B A B… so that
//! drift on the host spreads over both. Each guest is this binary and its
//! libraries in a busybox initramfs; its JSON result comes back framed and
//! checksummed on the serial console.
mod build;
pub mod guest;

use std::{
    path::PathBuf,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use self::guest::Kernel;
pub use self::{
    build::{Kernels, kernels_asked},
    guest::{emit, hang_of},
};
use crate::{
    Error,
    model::{
        AbResult, CommandResult, FormatVersion, FunctionCalls, KernelRuns, PatchedFunction,
        judge::{self, Figures, Names},
    },
    output::Outputs,
    render::judge::table,
};
use pipelock_vm::{
    guest_log,
    qemu::{self, Accel, BootOptions, Machine},
};

pub struct Options {
    pub kernels: Kernels,
    pub runs: u32,
    /// None: KVM if `/dev/kvm` answers within a few seconds, else TCG.
    pub accel: Option<Accel>,
    pub cpus: u32,
    pub memory_mib: u32,
    /// Per boot.
    pub timeout: Duration,
    pub json: Option<PathBuf>,
    pub command: Vec<String>,
    pub verbose: bool,
    /// The change (%) the verdict asks whether these runs could detect.
    pub detect_percent: f64,
}

fn nonce() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{nanos:x}{:x}", std::process::id())
}

/// Why a boot produced no usable result, in one line.
fn boot_failure(log: &str, timed_out: bool, timeout: Duration) -> String {
    const TROUBLE: [&str; 4] = ["Kernel panic", "Oops:", "BUG:", "general protection fault"];
    let trouble = log
        .lines()
        .find(|l| TROUBLE.iter().any(|t| l.contains(t)))
        .map(str::trim);
    match (timed_out, trouble) {
        (true, _) => format!(
            "the guest did not finish within {} s (--timeout)",
            timeout.as_secs()
        ),
        (false, Some(line)) => format!("the kernel died: {line}"),
        (false, None) => {
            // Firmware prints terminal escape sequences: only text counts.
            let readable = |l: &str| -> String {
                let mut out = String::new();
                let mut chars = l.chars();
                while let Some(c) = chars.next() {
                    if c == '\x1b' {
                        // ESC [ parameters… final byte (@ to ~).
                        if chars.next() == Some('[') {
                            for c in chars.by_ref() {
                                if ('@'..='~').contains(&c) {
                                    break;
                                }
                            }
                        }
                    } else if !c.is_control() {
                        out.push(c);
                    }
                }
                out.trim().to_owned()
            };
            let last = log
                .lines()
                .rev()
                .map(readable)
                .find(|l| l.chars().filter(|c| c.is_alphanumeric()).count() >= 3);
            match last {
                Some(line) => format!("the guest stopped without its result; its last line: {line}"),
                None => "the guest stopped without printing anything: not a bootable kernel?".to_owned(),
            }
        }
    }
}

struct Guest<'a> {
    options: &'a Options,
    machine: Machine,
    work: PathBuf,
    timeout: Duration,
}

/// How long the KVM probe's preflight boot may take: a KVM that works
/// boots and powers off in seconds; on some hosts it hangs instead.
const KVM_PROBE: Duration = Duration::from_secs(20);

impl Guest<'_> {
    /// Boots `kernel` running `script`; returns its results by name.
    fn boot(
        &self,
        kernel: &Kernel,
        label: &str,
        script: impl Fn(&str) -> String,
    ) -> Result<Vec<(String, Vec<u8>)>, Error> {
        let nonce = nonce();
        let initramfs = self.work.join(format!("initramfs-{nonce}.cpio"));
        guest::write_image(&initramfs, &nonce, &script(&nonce))?;
        let booted = qemu::boot(
            &kernel.image,
            &initramfs,
            &BootOptions {
                name: label,
                machine: self.machine.clone(),
                timeout: self.timeout,
                // A guest's work prints nothing until its result: only the
                // timeout can tell a hang.
                silence: None,
                echo: self.options.verbose,
                verbose: self.options.verbose,
            },
        );
        let _ = std::fs::remove_file(&initramfs);
        let booted = booted.map_err(|source| Error::Vm { source })?;
        read_console(
            &booted.log,
            &nonce,
            booted.stopped.is_some().then_some(self.timeout),
        )
        .map_err(|reason| Error::Guest {
            kernel: format!("{} ({label})", kernel.spec),
            reason,
        })
    }
}

/// A guest's console, read: its results by name, or why there are none (a
/// refusal of the preflight, a guest that did not finish or died, a
/// command that failed). `timed_out`: the limit it was stopped at.
pub fn read_console(
    log: &str,
    nonce: &str,
    timed_out: Option<Duration>,
) -> Result<Vec<(String, Vec<u8>)>, String> {
    if let Some(line) = log.lines().find_map(|l| {
        l.split_once(&format!("PIPELOCK-AB-REFUSED {nonce} "))
            .map(|(_, why)| why.trim())
    }) {
        return Err(format!("refused: {line}"));
    }
    if !log.contains(&guest_log::sentinel(nonce)) {
        return Err(boot_failure(
            log,
            timed_out.is_some(),
            timed_out.unwrap_or_default(),
        ));
    }
    let results = guest_log::results(log, nonce)?;
    if let Some((_, output)) = results.iter().find(|(name, _)| name == "failed") {
        let output = String::from_utf8_lossy(output);
        let last = output
            .lines()
            .rev()
            .find(|l| l.contains("error") && !l.trim().is_empty())
            .or_else(|| output.lines().rev().find(|l| !l.trim().is_empty()))
            .unwrap_or("");
        return Err(format!("the command failed in the guest: {}", last.trim()));
    }
    Ok(results)
}

pub fn run(options: Options) -> Result<(), Error> {
    match options.command.first().map(String::as_str) {
        Some("run" | "trace") => {}
        _ => {
            return Err(Error::Usage(
                "ab -- SUBCOMMAND: `run WORKLOAD …` or `trace … -- CMD` (CMD from the guest's busybox)"
                    .to_owned(),
            ));
        }
    }
    if options.runs == 0 {
        return Err(Error::Usage("--runs must be at least 1".to_owned()));
    }
    // Files that cannot be written fail before anything boots.
    let outputs = Outputs::prepare(options.json.as_deref(), None)?;
    let kernels = match &options.kernels {
        Kernels::Given(specs) => match &specs[..] {
            [a, b] => [guest::resolve(a)?, guest::resolve(b)?],
            _ => {
                return Err(Error::Usage(
                    "--kernel: give exactly two kernels, A and B".to_owned(),
                ));
            }
        },
        Kernels::Built(request) => build::build_both(request)?,
    };
    let patched = match &options.kernels {
        Kernels::Built(request) => build::patched(request),
        Kernels::Given(_) => Vec::new(),
    };
    let mut count: Vec<String> = Vec::new();
    for function in patched.iter().flat_map(PatchedFunction::to_count) {
        if !count.contains(&function) {
            count.push(function);
        }
    }
    let (a_spec, b_spec) = (&kernels[0].spec, &kernels[1].spec);
    let work = std::env::temp_dir().join(format!("pipelock-ab-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(Error::read(work.clone()))?;
    let mut guest = Guest {
        options: &options,
        machine: Machine {
            accel: options.accel.unwrap_or(Accel::Tcg),
            cpus: options.cpus,
            memory_mib: options.memory_mib,
        },
        work: work.clone(),
        timeout: options.timeout,
    };
    // auto: KVM if it creates a VM and boots kernel A's preflight in
    // seconds (it exists and hangs on some hosts), else TCG.
    let mut preflight_a = None;
    if options.accel.is_none() && qemu::kvm_answers(Duration::from_secs(3)) {
        guest.machine.accel = Accel::Kvm;
        guest.timeout = KVM_PROBE.min(options.timeout);
        match guest.boot(&kernels[0], "A preflight, KVM probe", guest::preflight_script) {
            Ok(results) => preflight_a = Some(results),
            Err(why) => {
                eprintln!("pipelock ab: KVM does not boot kernel A here ({why}); using TCG");
                guest.machine.accel = Accel::Tcg;
            }
        }
        guest.timeout = options.timeout;
    }
    let accel = guest.machine.accel;
    let emulated = accel == Accel::Tcg;
    eprintln!(
        "pipelock ab: {} vs {}, {} run(s) each, accel {}{}",
        a_spec,
        b_spec,
        options.runs,
        accel.name(),
        if emulated {
            " (emulated: compare ratios and counts, not absolute times)"
        } else {
            ""
        }
    );
    let deadline = guest::stuck_deadline(options.timeout);
    let measured = (|| -> Result<[KernelRuns; 2], Error> {
        let mut sides = Vec::with_capacity(2);
        for (kernel, side) in kernels.iter().zip(["A", "B"]) {
            eprintln!("pipelock ab: {side}: preflight of {}", kernel.image.display());
            let results = match (side, preflight_a.take()) {
                ("A", Some(done)) => done,
                _ => guest.boot(kernel, &format!("{side} preflight"), guest::preflight_script)?,
            };
            let release = results
                .iter()
                .find(|(name, _)| name == "release")
                .map(|(_, r)| String::from_utf8_lossy(r).trim().to_owned())
                .unwrap_or_default();
            sides.push(KernelRuns {
                spec: kernel.spec.clone(),
                image: kernel.image.clone(),
                release,
                runs: Vec::new(),
                hang: None,
                calls: Vec::new(),
            });
        }
        for run in 1..=options.runs {
            for (at, kernel) in kernels.iter().enumerate() {
                if sides[at].hang.is_some() {
                    // A kernel that hung once is not booted again.
                    continue;
                }
                let label = format!("{} run {run}/{}", ["A", "B"][at], options.runs);
                eprintln!("pipelock ab: {label} on {}", sides[at].release);
                let results = guest.boot(kernel, &label, |nonce| {
                    guest::run_script(nonce, &options.command, deadline, &count)
                })?;
                for (function, calls) in guest::calls_of(&results, &count) {
                    FunctionCalls::add(&mut sides[at].calls, &function, calls);
                }
                let failed = |reason: String| Error::Guest {
                    kernel: format!("{} ({label})", kernel.spec),
                    reason,
                };
                if let Some(hang) = hang_of(&results, run) {
                    if !hang.is_unsafe() {
                        // Slow, not stuck: a failed run, as at --timeout.
                        return Err(failed(format!(
                            "the command did not finish within {} s (the guest's deadline, from --timeout); \
                             the kernel lists no blocked task",
                            hang.after_s
                        )));
                    }
                    eprintln!("pipelock ab: {}", hang.verdict(["A", "B"][at]));
                    sides[at].hang = Some(hang);
                    continue;
                }
                let (_, json) = results
                    .iter()
                    .find(|(name, _)| name == "result")
                    .ok_or_else(|| failed("no result came back".to_owned()))?;
                let json =
                    std::str::from_utf8(json).map_err(|e| failed(format!("its result is not text: {e}")))?;
                let result = CommandResult::from_json(json)
                    .map_err(|why| failed(format!("its result cannot be read: {why}")))?;
                sides[at].runs.push(result);
            }
        }
        let mut sides = sides.into_iter();
        // One side was pushed per kernel, and there are two.
        match (sides.next(), sides.next()) {
            (Some(a), Some(b)) => Ok([a, b]),
            _ => unreachable!("two kernels give two sides"),
        }
    })();
    let _ = std::fs::remove_dir_all(&work);
    let [a, b] = measured?;
    let figures = |side: &KernelRuns| -> Result<Vec<Figures>, Error> {
        side.runs
            .iter()
            .map(|run| {
                judge::figures(run).map_err(|reason| Error::Guest {
                    kernel: side.spec.clone(),
                    reason,
                })
            })
            .collect()
    };
    let names = a.runs.first().map(Names::of).unwrap_or_default();
    // A side with no finished run has nothing to compare.
    let rows = if a.runs.is_empty() || b.runs.is_empty() {
        Vec::new()
    } else {
        judge::compare(&figures(&a)?, &figures(&b)?, &names, options.detect_percent)
    };
    println!(
        "pipelock ab: {} — {} run(s) per kernel, accel {}{}",
        options.command.join(" "),
        options.runs,
        accel.name(),
        if emulated {
            " (emulated: compare ratios and counts, not absolute times)"
        } else {
            ""
        }
    );
    println!("A: {} ({})\nB: {} ({})", a.release, a.spec, b.release, b.spec);
    for function in &patched {
        println!("B changes {}: {}", function.describe(), function.reach(&b.calls));
    }
    println!();
    if rows.is_empty() {
        for (side, runs) in [("A", &a), ("B", &b)] {
            if runs.runs.is_empty() {
                println!("{side}: no run finished: nothing to compare");
            }
        }
    } else {
        print!("{}", table(&a.release, &b.release, &rows, options.detect_percent));
    }
    let mut unsafe_sides = Vec::new();
    for (side, runs) in [("A", &a), ("B", &b)] {
        if let Some(hang) = &runs.hang {
            println!("\n{}", hang.verdict(side));
            for line in &hang.asked_twice {
                println!("  {}", line.trim());
            }
            // `hang_of` kept only the blocked-task report.
            for line in hang.blocked.lines() {
                println!("  {line}");
            }
            unsafe_sides.push(side);
        }
    }
    let report = AbResult {
        format: FormatVersion,
        command: options.command.clone(),
        accel: accel.name().to_owned(),
        emulated,
        runs_per_kernel: options.runs,
        kernels: [a, b],
        table: rows,
        patched,
    };
    outputs.write_with(|_| serde_json::to_vec_pretty(&report).map_err(std::io::Error::other))?;
    if unsafe_sides.is_empty() {
        Ok(())
    } else {
        Err(Error::Unsafe {
            kernels: unsafe_sides.join(" and "),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_boot_that_gave_nothing_says_why_in_words() {
        let timeout = Duration::from_secs(9);
        assert!(boot_failure("x\n", true, timeout).contains("within 9 s"));
        assert!(
            boot_failure("[ 1.0] Kernel panic - not syncing: VFS\n", false, timeout).contains("Kernel panic")
        );
        let firmware = "SeaBIOS (version 1.16)\nProbing EDD (edd=off to disable)... ok\u{1b}[?7l\u{1b}[2J\n";
        assert_eq!(
            boot_failure(firmware, false, timeout),
            "the guest stopped without its result; its last line: Probing EDD (edd=off to disable)... ok"
        );
        assert!(boot_failure("\u{1b}[2J\n\n", false, timeout).contains("not a bootable kernel"));
    }
}
