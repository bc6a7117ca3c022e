//! `cargo xtask vm-test`: the integration tests inside real distro kernels.
//!
//! For each kernel of `xtask/vm-kernels.txt`: fetch it (cached under
//! target/vm), pack an initramfs with busybox, a static `pipelock` and the
//! static integration-test binary, boot it under qemu TCG, echo the console,
//! and judge the run from the console output (see `guest_log`).
use std::{
    fs,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result, bail, ensure};

use crate::{
    cpio,
    guest_log::{self, Counts, Verdict},
};

/// The host target: static binaries from it run in any guest (no musl target here).
const TARGET: &str = "x86_64-unknown-linux-gnu";
const BUSYBOX: &str = "/bin/busybox";

pub struct Options {
    /// Only kernels whose name contains one of these.
    pub only: Vec<String>,
    /// Per-kernel limit for boot + tests.
    pub timeout: Duration,
    /// Use KVM (opt-in: /dev/kvm hangs on the machines this was written on).
    pub kvm: bool,
    /// Keep the initramfs and print the qemu command, for debugging by hand.
    pub verbose: bool,
}

#[derive(Debug)]
pub struct Kernel {
    pub name: String,
    pub source: Source,
    pub expected_program_types: String,
}

#[derive(Debug)]
pub enum Source {
    Apt { suite: String, glob: String },
    File(PathBuf),
}

/// Parses `vm-kernels.txt`: `NAME SOURCE EXPECTED` per line, `#` comments.
pub fn parse_kernel_list(text: &str) -> Result<Vec<Kernel>> {
    let mut kernels = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [name, source, expected] = fields[..] else {
            bail!(
                "vm-kernels.txt:{}: want `NAME SOURCE EXPECTED-PROGRAM-TYPES`, got `{line}`",
                number + 1
            );
        };
        let source = if let Some(path) = source.strip_prefix("file:") {
            Source::File(PathBuf::from(path))
        } else if let Some(rest) = source.strip_prefix("apt:") {
            let (suite, glob) = rest
                .split_once(':')
                .with_context(|| format!("vm-kernels.txt:{}: want apt:SUITE:GLOB", number + 1))?;
            Source::Apt {
                suite: suite.to_owned(),
                glob: glob.to_owned(),
            }
        } else {
            bail!(
                "vm-kernels.txt:{}: source must start with apt: or file:",
                number + 1
            );
        };
        for kind in expected.split(',') {
            ensure!(
                ["tracepoint", "tp_btf", "fentry", "kprobe"].contains(&kind),
                "vm-kernels.txt:{}: unknown program type `{kind}`",
                number + 1
            );
        }
        kernels.push(Kernel {
            name: name.to_owned(),
            source,
            expected_program_types: expected.to_owned(),
        });
    }
    Ok(kernels)
}

/// `*` matches any run of characters; everything else matches itself.
/// `--kernel 6.1` picks debian-6.1, not debian-6.12: a selector matches a
/// whole name or a whole `-`-separated tail of it (`6.1`, `debian-6.1`).
pub fn selects(name: &str, selector: &str) -> bool {
    name == selector
        || name
            .strip_suffix(selector)
            .is_some_and(|head| head.ends_with('-'))
}

pub fn glob_match(glob: &str, text: &str) -> bool {
    match glob.split_once('*') {
        None => glob == text,
        Some((prefix, rest)) => {
            let Some(text) = text.strip_prefix(prefix) else {
                return false;
            };
            (0..=text.len()).any(|skip| text.is_char_boundary(skip) && glob_match(rest, &text[skip..]))
        }
    }
}

/// Orders `6.1.0-9` before `6.1.0-57`: digit runs compare as numbers.
pub fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn chunks(s: &str) -> Vec<(u64, String)> {
        let mut out = Vec::new();
        let mut rest = s;
        while !rest.is_empty() {
            let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            if digits > 0 {
                out.push((rest[..digits].parse().unwrap_or(u64::MAX), String::new()));
                rest = &rest[digits..];
            } else {
                let text = rest.len() - rest.trim_start_matches(|c: char| !c.is_ascii_digit()).len();
                out.push((0, rest[..text].to_owned()));
                rest = &rest[text..];
            }
        }
        out
    }
    chunks(a).cmp(&chunks(b))
}

/// One kernel's boot: its name, console log, whether it timed out, and the
/// nonce of its result sentinel.
pub struct Boot {
    pub kernel: String,
    pub log: String,
    pub timed_out: bool,
    pub nonce: String,
}

pub fn vm_test(root: &Path, tools: &crate::bootstrap::Tools, options: &Options) -> Result<Counts> {
    let mut total = Counts::default();
    let mut failures = Vec::new();
    for boot in boot_each(root, tools, options, "/integration")? {
        let judgement = guest_log::judge(
            &boot.log,
            &boot.nonce,
            boot.timed_out.then_some(options.timeout.as_secs()),
        );
        let counts = judgement.counts.unwrap_or_default();
        eprintln!(
            "vm-test: {}: {} ({} passed, {} failed, {} skipped; log {})",
            boot.kernel,
            judgement.verdict,
            counts.passed,
            counts.failed,
            counts.skipped,
            root.join(format!("target/vm/{}.log", boot.kernel)).display()
        );
        total.passed += counts.passed;
        total.skipped += counts.skipped;
        total.failed += counts.failed;
        if let Verdict::Failed(why) = judgement.verdict {
            // A boot that died before the tests counts as one failure.
            if counts.failed == 0 {
                total.failed += 1;
            }
            failures.push(format!("{}: {why}", boot.kernel));
        }
    }
    println!(
        "vm-test: {} passed, {} failed, {} skipped",
        total.passed, total.failed, total.skipped
    );
    if !failures.is_empty() {
        bail!("vm-test failed on {}", failures.join("; "));
    }
    Ok(total)
}

/// Boots each selected kernel with `guest` as the command its /init runs
/// (with /pipelock and /integration beside it); the logs are kept under
/// target/vm.
pub fn boot_each(
    root: &Path,
    tools: &crate::bootstrap::Tools,
    options: &Options,
    guest: &str,
) -> Result<Vec<Boot>> {
    let list = root.join("xtask/vm-kernels.txt");
    let kernels = parse_kernel_list(&fs::read_to_string(&list).with_context(|| list.display().to_string())?)?;
    // One private package list for every suite the kernel list names.
    let mut suites: Vec<&str> = kernels
        .iter()
        .filter_map(|k| match &k.source {
            Source::Apt { suite, .. } => Some(suite.as_str()),
            Source::File(_) => None,
        })
        .collect();
    suites.sort_unstable();
    suites.dedup();

    let selected: Vec<&Kernel> = kernels
        .iter()
        .filter(|k| options.only.is_empty() || options.only.iter().any(|o| selects(&k.name, o)))
        .collect();
    ensure!(
        !selected.is_empty(),
        "no kernel of {} matches {:?}",
        list.display(),
        options.only
    );

    ensure_host_packages()?;
    let (pipelock, integration) = build_static(root, tools)?;
    let vm_dir = root.join("target/vm");
    let apt = PrivateApt::new(&vm_dir.join("apt"));

    let mut boots = Vec::new();
    for kernel in selected {
        let image = match &kernel.source {
            Source::File(path) => path.clone(),
            Source::Apt { suite, glob } => apt.kernel_image(suite, glob, &vm_dir.join("kernels"), &suites)?,
        };
        let nonce = nonce();
        let initramfs = vm_dir.join(format!("initramfs-{}.cpio", kernel.name));
        write_initramfs(&initramfs, &pipelock, &integration, kernel, &nonce, guest)?;
        let (log, timed_out) = boot(&kernel.name, &image, &initramfs, options)?;
        fs::write(vm_dir.join(format!("{}.log", kernel.name)), &log)?;
        if !options.verbose {
            let _ = fs::remove_file(&initramfs);
        }
        boots.push(Boot {
            kernel: kernel.name.clone(),
            log,
            timed_out,
            nonce,
        });
    }
    Ok(boots)
}

fn nonce() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{:x}{:x}", nanos, std::process::id())
}

/// qemu and a static busybox come from Debian's packages.
fn ensure_host_packages() -> Result<()> {
    crate::bootstrap::ensure_debian_packages(&[
        ("qemu-system-x86", &|| {
            crate::bootstrap::which("qemu-system-x86_64").is_some()
        }),
        ("busybox-static", &|| {
            Path::new(BUSYBOX).is_file() && is_static(Path::new(BUSYBOX))
        }),
    ])
}

/// Whether an ELF64 file runs without a dynamic loader (no PT_INTERP header).
fn is_static(path: &Path) -> bool {
    const PT_INTERP: u32 = 3;
    let Ok(elf) = fs::read(path) else { return false };
    let read = |at: usize, len: usize| {
        elf.get(at..at + len)
            .map(|b| b.iter().rev().fold(0u64, |v, &x| v << 8 | u64::from(x)))
    };
    if elf.get(..5) != Some(b"\x7fELF\x02") {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (read(0x20, 8), read(0x36, 2), read(0x38, 2)) else {
        return false;
    };
    (0..phnum)
        .all(|i| read((phoff + i * phentsize) as usize, 4).is_some_and(|kind| kind != u64::from(PT_INTERP)))
}

/// Builds `pipelock` and the integration-test binary, statically linked.
fn build_static(root: &Path, tools: &crate::bootstrap::Tools) -> Result<(PathBuf, PathBuf)> {
    let static_flags = "-C target-feature=+crt-static";
    crate::run(
        crate::cargo(root, tools)?
            .args([
                "build",
                "--release",
                "--package",
                "pipelock-user",
                "--bin",
                "pipelock",
                "--target",
                TARGET,
            ])
            .env("RUSTFLAGS", static_flags),
    )?;
    let out = crate::cargo(root, tools)?
        .args([
            "test",
            "--release",
            "--package",
            "pipelock-user",
            "--test",
            "integration",
            "--no-run",
        ])
        .args(["--target", TARGET, "--message-format=json-render-diagnostics"])
        .env("RUSTFLAGS", static_flags)
        .stderr(Stdio::inherit())
        .output()?;
    ensure!(
        out.status.success(),
        "building the static integration tests failed"
    );
    let integration = String::from_utf8(out.stdout)?
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|msg| msg["reason"] == "compiler-artifact" && msg["target"]["name"] == "integration")
        .find_map(|msg| msg["executable"].as_str().map(PathBuf::from))
        .context("cargo reported no integration-test executable")?;
    let pipelock = root.join("target").join(TARGET).join("release/pipelock");
    for binary in [&pipelock, &integration] {
        ensure!(is_static(binary), "{} is not statically linked", binary.display());
    }
    Ok((pipelock, integration))
}

/// The guest's /init: mount what pipelock needs, run `guest` (the tests),
/// print the result line with the nonce, power off.
fn init_script(kernel: &Kernel, nonce: &str, guest: &str) -> String {
    format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts
mount -t devpts devpts /dev/pts
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
mount -t bpf bpf /sys/fs/bpf
mount -t tmpfs tmp /tmp
export PIPELOCK_BIN=/pipelock PIPELOCK_IN_VM=1 PIPELOCK_EXPECT_PROGRAM_TYPES={expected} PATH=/bin
echo "pipelock-vm: {name}: $(cat /proc/sys/kernel/osrelease), clocksource $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
{guest}
echo "{sentinel}$?"
poweroff -f
"#,
        expected = kernel.expected_program_types,
        name = kernel.name,
        sentinel = guest_log::sentinel(nonce),
    )
}

fn write_initramfs(
    dest: &Path,
    pipelock: &Path,
    integration: &Path,
    kernel: &Kernel,
    nonce: &str,
    guest: &str,
) -> Result<()> {
    let busybox = fs::read(BUSYBOX)?;
    let pipelock = fs::read(pipelock)?;
    let integration = fs::read(integration)?;
    let init = init_script(kernel, nonce, guest);
    let dirs = ["bin", "dev", "proc", "sys", "tmp"];
    let mut entries: Vec<cpio::Entry<'_>> = dirs.iter().map(|path| cpio::Entry::Dir { path }).collect();
    entries.extend([
        cpio::Entry::File {
            path: "bin/busybox",
            mode: 0o755,
            data: &busybox,
        },
        cpio::Entry::File {
            path: "init",
            mode: 0o755,
            data: init.as_bytes(),
        },
        cpio::Entry::File {
            path: "pipelock",
            mode: 0o755,
            data: &pipelock,
        },
        cpio::Entry::File {
            path: "integration",
            mode: 0o755,
            data: &integration,
        },
    ]);
    let mut out = std::io::BufWriter::new(fs::File::create(dest)?);
    cpio::write(&mut out, &entries)?;
    std::io::Write::flush(&mut out)?;
    Ok(())
}

/// Boots one kernel; returns its console output and whether it timed out.
fn boot(name: &str, image: &Path, initramfs: &Path, options: &Options) -> Result<(String, bool)> {
    let mut qemu = Command::new("qemu-system-x86_64");
    if options.kvm {
        qemu.args(["-accel", "kvm", "-cpu", "host"]);
    } else {
        // Single-threaded TCG: multi-threaded TCG oopsed 6.12/6.18 while fentry
        // programs were attached (text patching racing a vCPU).
        qemu.args(["-accel", "tcg,thread=single", "-cpu", "max"]);
    }
    qemu.args([
        "-smp",
        "2",
        "-m",
        "1G",
        "-nographic",
        "-no-reboot",
        "-nodefaults",
        "-serial",
        "stdio",
    ])
    .arg("-kernel")
    .arg(image)
    .arg("-initrd")
    .arg(initramfs)
    // loglevel=5 keeps warnings and oopses on the console, not the boot chatter.
    // The TSC as clock source, as on real machines: TCG's TSC follows the
    // host clock, but 6.1 cannot calibrate it against the emulated PIT and
    // falls back to an emulated HPET, whose every read (each timestamp a
    // program takes) costs microseconds.
    .args([
        "-append",
        "console=ttyS0 panic=-1 loglevel=5 clocksource=tsc tsc=reliable",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    if options.verbose {
        eprintln!("xtask: {qemu:?}");
    }
    let started = Instant::now();
    let mut child = qemu.spawn().context("cannot start qemu-system-x86_64")?;
    let (tx, rx) = mpsc::channel();
    for stream in [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let tx = tx.clone();
        thread::spawn(move || {
            for line in BufReader::new(stream).split(b'\n').map_while(Result::ok) {
                if tx
                    .send(String::from_utf8_lossy(&line).trim_end_matches('\r').to_owned())
                    .is_err()
                {
                    break;
                }
            }
        });
    }
    drop(tx);
    let mut log = String::new();
    let deadline = started + options.timeout;
    let mut timed_out = false;
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => {
                eprintln!("[{name}] {line}");
                log.push_str(&line);
                log.push('\n');
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                timed_out = true;
                let _ = child.kill();
                break;
            }
        }
    }
    let status = child.wait()?;
    eprintln!(
        "xtask: {name}: qemu exited ({status}) after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok((log, timed_out))
}

/// apt with its own sources list and state directory: the system's apt
/// configuration is neither read nor changed.
struct PrivateApt {
    dir: PathBuf,
}

impl PrivateApt {
    fn new(dir: &Path) -> Self {
        Self { dir: dir.to_owned() }
    }

    fn options(&self) -> Vec<String> {
        let d = self.dir.display();
        vec![
            format!("-oDir::Etc::SourceList={d}/sources.list"),
            "-oDir::Etc::SourceParts=/dev/null".to_owned(),
            format!("-oDir::State={d}/state"),
            format!("-oDir::State::status={d}/state/status"),
            format!("-oDir::Cache={d}/cache"),
            // Downloads land in our folder, which the _apt sandbox user cannot write.
            "-oAPT::Sandbox::User=root".to_owned(),
        ]
    }

    /// (Re)reads the package lists at most once a day. A release name (`bookworm`)
    /// brings its -updates and -security suites, where kernel updates land.
    fn update(&self, suites: &[&str]) -> Result<()> {
        let mut sources = String::new();
        for suite in suites {
            let mut all = vec![(*suite).to_owned()];
            if !suite.contains('-') {
                all.extend([format!("{suite}-updates"), format!("{suite}-security")]);
            }
            for suite in all {
                let archive = if suite.ends_with("-security") {
                    "debian-security"
                } else {
                    "debian"
                };
                sources.push_str(&format!(
                    "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
                     http://deb.debian.org/{archive} {suite} main\n"
                ));
            }
        }
        let sources_path = self.dir.join("sources.list");
        let stamp = self.dir.join("state/updated");
        let fresh = fs::read_to_string(&sources_path).is_ok_and(|s| s == sources)
            && fs::metadata(&stamp)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|age| age < Duration::from_secs(86_400)));
        if fresh {
            return Ok(());
        }
        fs::create_dir_all(self.dir.join("state/lists/partial"))?;
        fs::create_dir_all(self.dir.join("cache/archives/partial"))?;
        fs::write(&sources_path, sources)?;
        fs::write(self.dir.join("state/status"), "")?;
        crate::run(
            Command::new("apt-get")
                .args(self.options())
                .args(["update", "-qq"]),
        )?;
        fs::write(stamp, "")?;
        Ok(())
    }

    fn output(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("apt-cache")
            .args(self.options())
            .args(args)
            .output()?;
        ensure!(
            out.status.success(),
            "apt-cache {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(String::from_utf8(out.stdout)?)
    }

    /// The vmlinuz of the newest package matching `glob` in `suite`, cached by version.
    fn kernel_image(&self, suite: &str, glob: &str, cache: &Path, all_suites: &[&str]) -> Result<PathBuf> {
        self.update(all_suites)?;
        ensure!(
            all_suites.contains(&suite),
            "suite {suite} is not among the sources"
        );
        let prefix = glob.split('*').next().unwrap_or(glob);
        let package = self
            .output(&["pkgnames", prefix])?
            .lines()
            .filter(|name| glob_match(glob, name))
            .max_by(|a, b| natural_cmp(a, b))
            .map(str::to_owned)
            .with_context(|| format!("no Debian package matches {glob} in {suite}"))?;
        let version = self
            .output(&["show", "--no-all-versions", &package])?
            .lines()
            .find_map(|l| l.strip_prefix("Version: ").map(str::to_owned))
            .with_context(|| format!("apt-cache shows no version of {package}"))?;
        let dir = cache.join(format!("{package}_{version}"));
        let image = dir.join("vmlinuz");
        if image.is_file() {
            return Ok(image);
        }
        eprintln!("xtask: fetching {package} {version}");
        let staging = cache.join(format!(".download-{}", std::process::id()));
        fs::create_dir_all(&staging)?;
        crate::run(
            Command::new("apt-get")
                .args(self.options())
                .args(["download", "-qq"])
                .arg(format!("{package}={version}"))
                .current_dir(&staging),
        )?;
        let deb = fs::read_dir(&staging)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|e| e == "deb"))
            .context("apt-get download left no .deb")?;
        let unpacked = staging.join("root");
        crate::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked))?;
        let vmlinuz = fs::read_dir(unpacked.join("boot"))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("vmlinuz-"))
            })
            .with_context(|| format!("{} holds no boot/vmlinuz-*", deb.display()))?;
        fs::create_dir_all(&dir)?;
        fs::rename(&vmlinuz, &image)?;
        fs::remove_dir_all(&staging)?;
        Ok(image)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_kernel_list_parses() {
        let text = include_str!("../vm-kernels.txt");
        let kernels = parse_kernel_list(text).unwrap();
        assert!(kernels.len() >= 3);
        assert!(kernels.iter().any(|k| k.name == "debian-6.18"));
    }

    #[test]
    fn bad_kernel_lines_are_named() {
        let err = parse_kernel_list("x apt:bookworm:linux-* tracepoint,bogus\n").unwrap_err();
        assert!(err.to_string().contains("vm-kernels.txt:1"), "{err}");
        assert!(parse_kernel_list("x ftp:foo tracepoint\n").is_err());
        assert!(parse_kernel_list("x\n").is_err());
        let k = parse_kernel_list("mine file:/boot/vmlinuz tp_btf # comment\n").unwrap();
        assert!(matches!(&k[0].source, Source::File(p) if p == Path::new("/boot/vmlinuz")));
    }

    #[test]
    fn a_kernel_selector_matches_whole_version_parts() {
        assert!(selects("debian-6.1", "6.1"));
        assert!(selects("debian-6.1", "debian-6.1"));
        assert!(!selects("debian-6.12", "6.1"));
        assert!(!selects("debian-6.18", "6.1"));
        assert!(selects("debian-6.18", "6.18"));
        assert!(!selects("debian-6.18", "18"));
    }

    #[test]
    fn globs_and_versions_pick_the_newest_kernel() {
        let glob = "linux-image-6.1.0-*-cloud-amd64-unsigned";
        assert!(glob_match(glob, "linux-image-6.1.0-57-cloud-amd64-unsigned"));
        assert!(!glob_match(glob, "linux-image-6.1.0-57-cloud-amd64-unsigned-dbg"));
        assert!(!glob_match(glob, "linux-image-6.12.1-cloud-amd64"));
        let names = [
            "linux-image-6.1.0-9-cloud",
            "linux-image-6.1.0-57-cloud",
            "linux-image-6.1.0-10-cloud",
        ];
        assert_eq!(
            names.iter().max_by(|a, b| natural_cmp(a, b)),
            Some(&"linux-image-6.1.0-57-cloud")
        );
        assert_eq!(natural_cmp("6.12.117", "6.12.99"), std::cmp::Ordering::Greater);
    }
}
