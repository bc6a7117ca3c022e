//! Booting one kernel under qemu and capturing its console, with a hard
//! timeout, never leaving a qemu process behind.
use std::{
    io::{BufRead as _, BufReader},
    os::unix::process::CommandExt as _,
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use crate::{Result, io};

/// How qemu runs the guest's CPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    /// Single-threaded TCG: multi-threaded TCG oopsed 6.12/6.18 while fentry
    /// programs were attached (text patching racing a vCPU).
    Tcg,
}

impl Accel {
    pub const ALL: [Self; 2] = [Self::Kvm, Self::Tcg];

    pub fn name(self) -> &'static str {
        match self {
            Self::Kvm => "kvm",
            Self::Tcg => "tcg",
        }
    }
}

impl std::str::FromStr for Accel {
    type Err = String;

    fn from_str(name: &str) -> std::result::Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| format!("`{name}`: want kvm or tcg"))
    }
}

/// The guest machine.
#[derive(Clone, Debug)]
pub struct Machine {
    pub accel: Accel,
    pub cpus: u32,
    pub memory_mib: u32,
}

impl Default for Machine {
    fn default() -> Self {
        Self {
            accel: Accel::Tcg,
            cpus: 2,
            memory_mib: 1024,
        }
    }
}

pub struct BootOptions<'a> {
    /// Prefix of the echoed console lines.
    pub name: &'a str,
    pub machine: Machine,
    /// For the whole boot, the guest's work and its power-off.
    pub timeout: Duration,
    /// Echo the console to stderr as it comes, `[name] line`.
    pub echo: bool,
    /// Print the qemu command line first.
    pub verbose: bool,
}

/// What one boot printed, and whether it was stopped by the timeout.
pub struct Boot {
    pub log: String,
    pub timed_out: bool,
    pub took: Duration,
}

/// qemu, killed and reaped when dropped: an error, a panic or a timeout on
/// our side never leaves one running.
struct Guest(Child);

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether KVM answers: `/dev/kvm` opens and creates a VM within
/// `timeout` (on some hosts it exists and hangs; the probe thread is then
/// left behind, blocked, and TCG is used).
pub fn kvm_answers(timeout: Duration) -> bool {
    const KVM_GET_API_VERSION: u64 = 0xAE00;
    const KVM_CREATE_VM: u64 = 0xAE01;
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let answered = (|| {
            let kvm = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/kvm")
                .ok()?;
            let fd = std::os::fd::AsRawFd::as_raw_fd(&kvm);
            // SAFETY: ioctls on a descriptor we own, without pointers.
            let version = unsafe { libc::ioctl(fd, KVM_GET_API_VERSION as _, 0) };
            // SAFETY: as above; the VM descriptor is closed at once.
            let vm = unsafe { libc::ioctl(fd, KVM_CREATE_VM as _, 0) };
            if vm >= 0 {
                // SAFETY: the descriptor KVM_CREATE_VM just returned.
                unsafe { libc::close(vm) };
            }
            Some(version == 12 && vm >= 0)
        })();
        let _ = tx.send(answered.unwrap_or(false));
    });
    rx.recv_timeout(timeout).unwrap_or(false)
}

/// Boots `image` with `initramfs`; returns its console output.
pub fn boot(image: &Path, initramfs: &Path, options: &BootOptions) -> Result<Boot> {
    let mut qemu = Command::new("qemu-system-x86_64");
    match options.machine.accel {
        Accel::Kvm => qemu.args(["-accel", "kvm", "-cpu", "host"]),
        Accel::Tcg => qemu.args(["-accel", "tcg,thread=single", "-cpu", "max"]),
    };
    qemu.arg("-smp")
        .arg(options.machine.cpus.to_string())
        .arg("-m")
        .arg(format!("{}M", options.machine.memory_mib))
        .args(["-nographic", "-no-reboot", "-nodefaults", "-serial", "stdio"])
        .arg("-kernel")
        .arg(image)
        .arg("-initrd")
        .arg(initramfs)
        // loglevel=5 keeps warnings and oopses on the console, not the boot
        // chatter. The TSC as clock source, as on real machines: TCG's TSC
        // follows the host clock, but 6.1 cannot calibrate it against the
        // emulated PIT and falls back to an emulated HPET, whose every read
        // (each timestamp a program takes) costs microseconds.
        .args([
            "-append",
            "console=ttyS0 panic=-1 loglevel=5 clocksource=tsc tsc=reliable",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: async-signal-safe calls only, between fork and exec. If this
    // process dies, even by SIGKILL, qemu goes with it.
    unsafe {
        qemu.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    if options.verbose {
        eprintln!("pipelock-vm: {qemu:?}");
    }
    let started = Instant::now();
    let mut guest = Guest(qemu.spawn().map_err(io(
        "cannot start qemu-system-x86_64 (Debian: apt-get install qemu-system-x86)",
    ))?);
    let (tx, rx) = mpsc::channel();
    for stream in [
        guest
            .0
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        guest
            .0
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
                if options.echo {
                    eprintln!("[{}] {line}", options.name);
                }
                log.push_str(&line);
                log.push('\n');
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                timed_out = true;
                break;
            }
        }
    }
    // Killed if still running (a timeout), reaped either way.
    drop(guest);
    Ok(Boot {
        log,
        timed_out,
        took: started.elapsed(),
    })
}
