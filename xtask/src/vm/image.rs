//! What a guest boots into: static `pipelock` and test binaries, busybox,
//! and an /init script, packed as a newc initramfs.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Stdio,
};

use anyhow::{Context as _, Result, ensure};

use super::Kernel;
use crate::{cpio, guest_log};

/// The host target: static binaries from it run in any guest (no musl target here).
pub const TARGET: &str = "x86_64-unknown-linux-gnu";
pub const BUSYBOX: &str = "/bin/busybox";

/// Whether an ELF64 file runs without a dynamic loader (no PT_INTERP header).
pub fn is_static(path: &Path) -> bool {
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
pub fn build_static(root: &Path, tools: &crate::bootstrap::Tools) -> Result<(PathBuf, PathBuf)> {
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
# Loopback: the exporter's tests scrape it over 127.0.0.1.
ifconfig lo 127.0.0.1 up
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

pub fn write_initramfs(
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
