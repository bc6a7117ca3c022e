//! Booting one kernel under qemu and capturing its console, with a hard
//! timeout and a watch for a silent (hung) guest, never leaving a qemu
//! process behind.
use std::{
    fmt,
    io::{BufRead as _, BufReader, Write as _},
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
    /// A guest whose console stays silent this long is taken for hung: its
    /// kernel is asked over the serial console (sysrq) for the stacks of its
    /// CPUs and blocked tasks, which land in the log, and it is stopped.
    /// `None` for guests that may work quietly for long.
    pub silence: Option<Duration>,
    /// Echo the console to stderr as it comes, `[name] line`.
    pub echo: bool,
    /// Print the qemu command line first.
    pub verbose: bool,
}

/// What one boot printed, and whether it was stopped before its end.
pub struct Boot {
    pub log: String,
    pub stopped: Option<Stopped>,
    pub took: Duration,
}

/// Why a guest was stopped before it powered off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// It ran past `BootOptions::timeout`.
    Timeout(Duration),
    /// Its console was silent for `BootOptions::silence`.
    Silent(Duration),
}

impl fmt::Display for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout(limit) => write!(f, "timed out after {} s", limit.as_secs()),
            Self::Silent(quiet) => write!(
                f,
                "hung: the console was silent for {} s (the kernel's stacks of its CPUs and blocked tasks, asked for with sysrq, end the log)",
                quiet.as_secs()
            ),
        }
    }
}

/// How long a silent guest's kernel gets to print the stacks it was asked
/// for: under TCG a dump of a few dozen tasks takes seconds. The dump is
/// taken for done when the console is quiet for `DUMP_QUIET`.
const DUMP_GRACE: Duration = Duration::from_secs(30);
const DUMP_QUIET: Duration = Duration::from_secs(10);

/// Serial break, then the sysrq key: qemu's `mon:stdio` turns Ctrl-A b into
/// a break on the guest's serial line, which the kernel's 8250 driver reads
/// as "the next character is a sysrq command". `w` dumps blocked tasks, `l`
/// every CPU's backtrace.
const SYSRQ_DUMPS: [u8; 2] = [b'w', b'l'];
const SERIAL_BREAK: &[u8] = b"\x01b";

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
    watch(qemu_command(image, initramfs, options), options)
}

/// The qemu command line for one boot.
fn qemu_command(image: &Path, initramfs: &Path, options: &BootOptions) -> Command {
    let mut qemu = Command::new("qemu-system-x86_64");
    match options.machine.accel {
        Accel::Kvm => qemu.args(["-accel", "kvm", "-cpu", "host"]),
        Accel::Tcg => qemu.args(["-accel", "tcg,thread=single", "-cpu", "max"]),
    };
    qemu.arg("-smp")
        .arg(options.machine.cpus.to_string())
        .arg("-m")
        .arg(format!("{}M", options.machine.memory_mib))
        .args(["-nographic", "-no-reboot", "-nodefaults", "-serial"])
        // The monitor on stdio too only where sysrq may be sent: the serial
        // break is a monitor key.
        .arg(if options.silence.is_some() {
            "mon:stdio"
        } else {
            "stdio"
        })
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
            "console=ttyS0 panic=-1 loglevel=5 clocksource=tsc tsc=reliable sysrq_always_enabled",
        ])
        .stdin(if options.silence.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    qemu
}

/// Runs a guest's `qemu` and reads its console to the end, the timeout or a
/// silence.
fn watch(mut qemu: Command, options: &BootOptions) -> Result<Boot> {
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
    let mut stopped = None;
    // After a silence: the time left for the kernel's dump.
    let mut dumping: Option<Instant> = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let wait = match (dumping, options.silence) {
            (Some(until), _) => left
                .min(DUMP_QUIET)
                .min(until.saturating_duration_since(Instant::now())),
            (None, Some(quiet)) => left.min(quiet),
            (None, None) => left,
        };
        match rx.recv_timeout(wait) {
            Ok(line) => {
                if options.echo {
                    eprintln!("[{}] {line}", options.name);
                }
                log.push_str(&line);
                log.push('\n');
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if dumping.is_some() {
                    break;
                }
                if Instant::now() >= deadline {
                    stopped.get_or_insert(Stopped::Timeout(options.timeout));
                    break;
                }
                if let (Some(quiet), None) = (options.silence, dumping) {
                    stopped = Some(Stopped::Silent(quiet));
                    dumping = Some(Instant::now() + DUMP_GRACE);
                    if let Some(stdin) = guest.0.stdin.as_mut() {
                        for key in SYSRQ_DUMPS {
                            // The break must reach the guest before its key,
                            // and the dump start before the next break.
                            for bytes in [SERIAL_BREAK, &[key]] {
                                let _ = stdin.write_all(bytes).and_then(|()| stdin.flush());
                                thread::sleep(Duration::from_millis(500));
                            }
                        }
                    }
                }
            }
        }
    }
    // Killed if still running (a timeout), reaped either way.
    drop(guest);
    Ok(Boot {
        log,
        stopped,
        took: started.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(timeout: u64, silence: Option<u64>) -> BootOptions<'static> {
        BootOptions {
            name: "fake",
            machine: Machine::default(),
            timeout: Duration::from_secs(timeout),
            silence: silence.map(Duration::from_secs),
            echo: false,
            verbose: false,
        }
    }

    /// A stand-in for qemu: `script` under sh, its stdin and outputs piped
    /// as `qemu_command` pipes them.
    fn fake_guest(script: &str, silence: bool) -> Command {
        let mut sh = Command::new("sh");
        sh.args(["-c", script])
            .stdin(if silence { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        sh
    }

    #[test]
    fn a_silent_guest_is_asked_for_its_stacks_then_stopped() {
        // The guest goes quiet, then prints what reached its serial line
        // (the monitor's break keys and the sysrq commands), then hangs.
        let script = "echo booted; head -c 6 | od -An -tx1; echo dumped; exec sleep 60";
        let boot = watch(fake_guest(script, true), &options(120, Some(1))).unwrap();
        assert_eq!(boot.stopped, Some(Stopped::Silent(Duration::from_secs(1))));
        let lines: Vec<&str> = boot.log.lines().map(str::trim).collect();
        assert_eq!(lines, ["booted", "01 62 77 01 62 6c", "dumped"], "{}", boot.log);
        assert!(boot.took < Duration::from_secs(60), "{:?}", boot.took);
        assert!(
            Stopped::Silent(Duration::from_secs(300))
                .to_string()
                .starts_with("hung: the console was silent for 300 s")
        );
    }

    #[test]
    fn a_guest_past_its_timeout_is_stopped() {
        let boot = watch(fake_guest("echo booted; exec sleep 60", false), &options(1, None)).unwrap();
        assert_eq!(boot.stopped, Some(Stopped::Timeout(Duration::from_secs(1))));
        assert_eq!(boot.log, "booted\n");
    }

    #[test]
    fn a_guest_that_ends_is_not_stopped() {
        let boot = watch(
            fake_guest("echo booted; sleep 1; echo done", true),
            &options(60, Some(5)),
        )
        .unwrap();
        assert_eq!(boot.stopped, None);
        assert_eq!(boot.log, "booted\ndone\n");
    }
}
