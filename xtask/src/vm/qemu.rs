//! Booting one kernel under qemu and capturing its console, with a hard
//! timeout.
use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::Instant,
};

use anyhow::{Context as _, Result};

use super::Options;

/// Boots one kernel; returns its console output and whether it timed out.
pub fn boot(name: &str, image: &Path, initramfs: &Path, options: &Options) -> Result<(String, bool)> {
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
