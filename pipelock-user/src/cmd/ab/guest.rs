//! The two kernels `pipelock ab` compares, and what their guests run: this
//! very binary (with its shared libraries) in a busybox initramfs, whose
//! results come back over the serial console as framed, checksummed JSON.
use std::{
    fs,
    path::{Path, PathBuf},
    time::Duration,
};

use pipelock_vm::{
    guest_log,
    image::{self, GuestFile},
    kernels::{PrivateApt, vmlinuz_of_deb},
};

use crate::{Error, model::Hang};

/// The Debian suites a kernel package name is looked up in, in order.
const SUITES: [&str; 2] = ["bookworm", "trixie-backports"];

/// A kernel as the user named it, and the image qemu boots.
#[derive(Clone, Debug)]
pub struct Kernel {
    pub spec: String,
    pub image: PathBuf,
}

fn vm_err(source: pipelock_vm::Error) -> Error {
    Error::Vm { source }
}

/// Where `ab` keeps fetched kernels and its private apt state.
pub fn cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"));
    base.join("pipelock")
}

/// Whether `path` starts like a Linux x86 boot image (`HdrS` at 0x202).
fn is_linux_image(path: &Path) -> bool {
    fs::read(path).is_ok_and(|data| data.get(0x202..0x206) == Some(b"HdrS"))
}

/// A `vmlinuz`/`bzImage` path, a kernel `.deb`, or a Debian package name
/// or glob (`linux-image-6.1.0-*-cloud-amd64-unsigned`), fetched once.
pub fn resolve(spec: &str) -> Result<Kernel, Error> {
    let path = Path::new(spec);
    let image = if path.is_file() && spec.ends_with(".deb") {
        let stem = path
            .file_stem()
            .map_or("kernel".into(), |s| s.to_string_lossy().into_owned());
        let dir = cache_dir().join("kernels").join(stem);
        let image = dir.join("vmlinuz");
        if !image.is_file() {
            let unpacked = dir.join("root");
            let found = vmlinuz_of_deb(path, &unpacked).map_err(vm_err)?;
            fs::rename(&found, &image).map_err(Error::read(image.clone()))?;
            let _ = fs::remove_dir_all(&unpacked);
        }
        image
    } else if path.is_file() {
        path.to_owned()
    } else if spec.contains('/') {
        return Err(Error::Usage(format!("--kernel {spec}: no such file")));
    } else {
        let apt = PrivateApt::new(&cache_dir().join("apt"));
        let kernels = cache_dir().join("kernels");
        let mut last = None;
        let mut found = None;
        for suite in SUITES {
            match apt.kernel_image(suite, spec, &kernels, &SUITES) {
                Ok(image) => {
                    found = Some(image);
                    break;
                }
                Err(err) => last = Some(err),
            }
        }
        match found {
            Some(image) => image,
            None => {
                return Err(Error::Usage(format!(
                    "--kernel {spec}: not a file, and no Debian package of {} matches it{}",
                    SUITES.join(" or "),
                    last.map_or(String::new(), |e| format!(" ({e})"))
                )));
            }
        }
    };
    if !is_linux_image(&image) {
        return Err(Error::Usage(format!(
            "--kernel {spec}: {} is not a Linux kernel image (no x86 boot header)",
            image.display()
        )));
    }
    Ok(Kernel {
        spec: spec.to_owned(),
        image,
    })
}

/// `arg` as one shell word.
fn quote(arg: &str) -> String {
    format!("'{}'", arg.replace('\'', r"'\''"))
}

/// Where the guest's command writes its JSON result.
const RESULT: &str = "/tmp/result.json";

/// The user's subcommand, told to write its JSON result where the guest
/// script reads it (`run` gets `-q` too: nobody watches a bar there).
pub fn guest_command(command: &[String]) -> Vec<String> {
    let mut args: Vec<String> = command.to_vec();
    match args.first().map(String::as_str) {
        Some("run") => args.extend(["--json".into(), RESULT.into(), "-q".into()]),
        _ => {
            let at = args.iter().position(|a| a == "--").unwrap_or(args.len());
            args.splice(at..at, ["--json".to_owned(), RESULT.to_owned()]);
        }
    }
    args
}

/// The first boot of a kernel: is it one pipelock can trace? Kernel BTF,
/// and `pipelock probe` working (it loads a program of every type).
pub fn preflight_script(nonce: &str) -> String {
    preflight_script_with(nonce, "/pipelock", "/tmp")
}

/// [`preflight_script`] with pipelock at `bin` and scratch files in `tmp`
/// (the integration test runs it on the host with BTF hidden).
pub fn preflight_script_with(nonce: &str, bin: &str, tmp: &str) -> String {
    format!(
        r#"uname -r > {tmp}/release
{bin} ab-emit {nonce} release {tmp}/release
if [ ! -e /sys/kernel/btf/vmlinux ]; then
  echo "PIPELOCK-AB-REFUSED {nonce} this kernel has no BTF (/sys/kernel/btf/vmlinux; CONFIG_DEBUG_INFO_BTF)"
else
  {bin} probe > {tmp}/probe 2>&1
  rc=$?
  {bin} ab-emit {nonce} probe {tmp}/probe
  [ $rc = 0 ] || echo "PIPELOCK-AB-REFUSED {nonce} pipelock probe failed there (exit $rc)"
fi"#
    )
}

/// Where a measured boot's script finds things: pipelock, scratch space,
/// the sysrq trigger and tracefs (the integration test runs the script on
/// the host with its own).
pub struct GuestPaths<'a> {
    pub bin: &'a str,
    pub tmp: &'a str,
    pub sysrq: &'a str,
    pub tracing: &'a str,
}

impl GuestPaths<'static> {
    pub const GUEST: Self = Self {
        bin: "/pipelock",
        tmp: "/tmp",
        sysrq: "/proc/sysrq-trigger",
        tracing: "/sys/kernel/tracing",
    };
}

/// A measured boot: the command once, its JSON result (or its output, if
/// it failed) framed on the console. A command that stops making progress
/// is not waited for until qemu's timeout: as soon as its pipelock says a
/// thread asked for a mutex it holds, or after `deadline`, the guest asks
/// the kernel for its blocked tasks (sysrq `w`) and sends them back with
/// the `deadlock:` lines (`asked`, `blocked`, `stuck`). The calls of each
/// of `count` (functions) during the command are counted with a kprobe
/// event each and sent back as `probes` (`pipelock_fN NAME` per function probed,
/// `- NAME` per one the kernel has no probe point for, or `none: WHY`)
/// and `profile` (tracefs's `kprobe_profile`: hits per probe).
pub fn run_script(nonce: &str, command: &[String], deadline: Duration, count: &[String]) -> String {
    run_script_with(nonce, command, deadline, count, &GuestPaths::GUEST)
}

/// [`run_script`] with its paths.
pub fn run_script_with(
    nonce: &str,
    command: &[String],
    deadline: Duration,
    count: &[String],
    paths: &GuestPaths,
) -> String {
    let GuestPaths {
        bin,
        tmp,
        sysrq,
        tracing,
    } = paths;
    let args: Vec<String> = guest_command(command).iter().map(|a| quote(a)).collect();
    let deadline = deadline.as_secs().max(1);
    let asked = ASKED_TWICE;
    let functions: Vec<String> = count.iter().map(|f| quote(f)).collect();
    let probes = if count.is_empty() {
        String::new()
    } else {
        format!(
            r#": > {tmp}/probes
if [ -w {tracing}/kprobe_events ]; then
  # A probe counts its hits whether or not its events are recorded.
  echo 0 > {tracing}/tracing_on 2>/dev/null
  i=0
  for f in {functions}; do
    if echo "p:pipelock_calls/pipelock_f$i $f" >> {tracing}/kprobe_events 2>/dev/null && echo 1 > {tracing}/events/pipelock_calls/pipelock_f$i/enable 2>/dev/null; then
      echo "pipelock_f$i $f" >> {tmp}/probes
    else
      echo "- $f" >> {tmp}/probes
    fi
    i=$((i + 1))
  done
else
  echo "none: the kernel has no kprobe events ({tracing}/kprobe_events)" > {tmp}/probes
fi
"#,
            functions = functions.join(" ")
        )
    };
    let counted = if count.is_empty() {
        String::new()
    } else {
        format!(
            r#"cat {tracing}/kprobe_profile > {tmp}/profile 2>/dev/null
{bin} ab-emit {nonce} probes {tmp}/probes
{bin} ab-emit {nonce} profile {tmp}/profile
"#
        )
    };
    format!(
        r#"cd {tmp}
{probes}# Emptied first: the watcher may look before the command's own
# redirection empties it (and find an older run's deadlock line).
: > {tmp}/output
{bin} {args} > {tmp}/output 2>&1 &
pid=$!
waited=0
stuck=""
while kill -0 $pid 2>/dev/null; do
  if grep -q '{asked}' {tmp}/output; then stuck=asked; break; fi
  if [ $waited -ge {deadline} ]; then stuck=deadline; break; fi
  sleep 1
  waited=$((waited + 1))
done
if [ -n "$stuck" ]; then
  grep '{asked}' {tmp}/output > {tmp}/asked
  echo w > {sysrq}
  sleep 1
  dmesg > {tmp}/blocked 2>&1
  echo "$waited" > {tmp}/stuck
  {counted}{bin} ab-emit {nonce} asked {tmp}/asked
  {bin} ab-emit {nonce} blocked {tmp}/blocked
  {bin} ab-emit {nonce} stuck {tmp}/stuck
else
  wait $pid
  rc=$?
  {counted}if [ $rc = 0 ]; then {bin} ab-emit {nonce} result {RESULT}; else echo "exit $rc" >> {tmp}/output; {bin} ab-emit {nonce} failed {tmp}/output; fi
fi"#,
        args = args.join(" "),
    )
}

/// The calls a measured boot counted: per function of `asked`, how often
/// it was entered, or why it was not counted.
pub fn calls_of(results: &[(String, Vec<u8>)], asked: &[String]) -> Vec<(String, Result<u64, String>)> {
    let text = |name: &str| {
        results
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, data)| String::from_utf8_lossy(data).into_owned())
    };
    let Some(probes) = text("probes") else {
        return Vec::new();
    };
    let profile = text("profile").unwrap_or_default();
    // `  pipelock_f0     123     0`: the probe (its event's name; with
    // its group on some kernels), its hits, its misses.
    let hits = |probe: &str| -> Option<u64> {
        let grouped = format!("pipelock_calls/{probe}");
        profile.lines().find_map(|line| {
            let mut words = line.split_whitespace();
            let name = words.next()?;
            (name == probe || name == grouped)
                .then(|| words.next()?.parse().ok())
                .flatten()
        })
    };
    let mut out = Vec::new();
    for line in probes.lines() {
        if let Some(why) = line.strip_prefix("none: ") {
            return asked.iter().map(|f| (f.clone(), Err(why.to_owned()))).collect();
        }
        match line.split_once(' ') {
            Some(("-", function)) => out.push((
                function.to_owned(),
                Err("no probe point in this kernel (inlined, or not probeable)".to_owned()),
            )),
            Some((probe, function)) => out.push((
                function.to_owned(),
                hits(probe).ok_or_else(|| "its probe's count did not come back".to_owned()),
            )),
            None => {}
        }
    }
    out
}

/// What pipelock prints on stderr the moment a thread asks for a mutex it
/// already holds (see `AskedTwice::line`).
pub const ASKED_TWICE: &str = "pipelock: deadlock: ";

/// The initramfs of one boot: this binary and its libraries, `script`.
pub fn write_image(dest: &Path, nonce: &str, script: &str) -> Result<(), Error> {
    // The running image, even if its file was replaced meanwhile (a
    // rebuild while `ab` runs): the kernel keeps the inode while it runs.
    // Not /proc/self: ldd opens the path from its own process.
    let exe = PathBuf::from(format!("/proc/{}/exe", std::process::id()));
    let files: Vec<GuestFile> = image::binary_with_libraries(&exe, "pipelock").map_err(vm_err)?;
    let init = image::init_script(
        "pipelock-ab",
        "PIPELOCK_IN_VM=1",
        script,
        &guest_log::sentinel(nonce),
    );
    image::write_initramfs(dest, &init, &files).map_err(vm_err)
}

/// `pipelock ab-emit NONCE NAME FILE` (in the guest): FILE framed on stdout.
pub fn emit(nonce: &str, name: &str, file: &Path) -> Result<(), Error> {
    let data = fs::read(file).map_err(Error::read(file.to_owned()))?;
    print!("{}", guest_log::frame(nonce, name, &data));
    Ok(())
}

/// How long a guest's command may run before the guest gives up on it and
/// reports its blocked tasks: well before qemu's `--timeout` (boot and the
/// report must still fit), at least a minute.
pub fn stuck_deadline(timeout: Duration) -> Duration {
    (timeout.saturating_sub(Duration::from_secs(60)) * 3 / 4).max(Duration::from_secs(60))
}

/// The hang a guest reported, if its command stopped making progress.
pub fn hang_of(results: &[(String, Vec<u8>)], run: u32) -> Option<Hang> {
    let text = |name: &str| {
        results
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, data)| String::from_utf8_lossy(data).into_owned())
    };
    let after_s = text("stuck")?.trim().parse().unwrap_or(0);
    Some(Hang {
        run,
        after_s,
        asked_twice: text("asked")
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(ASKED_TWICE))
            .map(str::to_owned)
            .collect(),
        blocked: blocked_report(&text("blocked").unwrap_or_default()).join("\n"),
    })
}

/// The kernel log's last blocked-task report (sysrq `w`), from its
/// header on; the boot messages before it are left out.
fn blocked_report(log: &str) -> Vec<&str> {
    let lines: Vec<&str> = log.lines().collect();
    let from = lines
        .iter()
        .rposition(|l| l.contains("Show Blocked State"))
        .unwrap_or(lines.len());
    lines[from..].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &[&str]) -> Vec<String> {
        s.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn the_command_is_told_where_its_result_goes() {
        assert_eq!(
            guest_command(&words(&["run", "pipe-throughput", "--trace"])),
            words(&["run", "pipe-throughput", "--trace", "--json", RESULT, "-q"])
        );
        assert_eq!(
            guest_command(&words(&["trace", "--mode", "fentry", "--", "cat", "/x"])),
            words(&["trace", "--mode", "fentry", "--json", RESULT, "--", "cat", "/x"])
        );
        assert_eq!(
            guest_command(&words(&["trace", "--duration", "1"])),
            words(&["trace", "--duration", "1", "--json", RESULT])
        );
        assert_eq!(quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn only_a_linux_boot_image_is_a_kernel() {
        let dir = std::env::temp_dir().join(format!("pipelock-ab-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let mut image = vec![0u8; 0x300];
        image[0x202..0x206].copy_from_slice(b"HdrS");
        fs::write(dir.join("bzImage"), &image).unwrap();
        fs::write(dir.join("junk"), b"not a kernel").unwrap();
        assert!(resolve(dir.join("bzImage").to_str().unwrap()).is_ok());
        let err = resolve(dir.join("junk").to_str().unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a Linux kernel image"), "{err}");
        let err = resolve("/no/such/kernel").unwrap_err().to_string();
        assert!(err.contains("no such file"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_stuck_guest_is_read_as_its_hang() {
        let frame = |name: &str, text: &str| (name.to_owned(), text.as_bytes().to_vec());
        let log = "[    0.0] Linux version 6.1\n[   40.1] sysrq: Show Blocked State\n\
                   [   40.1] task:paths state:D stack:0 pid:413\n";
        let results = [
            frame(
                "asked",
                "pipelock: deadlock: paths(412/413) asked for the mutex of pipe:[9] (0x1) that it already holds\n",
            ),
            frame("blocked", log),
            frame("stuck", "3\n"),
        ];
        let hang = hang_of(&results, 2).unwrap();
        assert_eq!((hang.run, hang.after_s, hang.asked_twice.len()), (2, 3, 1));
        assert!(
            hang.blocked.starts_with("[   40.1] sysrq: Show Blocked State"),
            "{}",
            hang.blocked
        );
        assert!(!hang.blocked.contains("Linux version"));
        assert!(
            hang_of(&results[..2], 2).is_none(),
            "no `stuck`: the command ended"
        );
        assert_eq!(stuck_deadline(Duration::from_secs(600)), Duration::from_secs(405));
        assert_eq!(stuck_deadline(Duration::from_secs(45)), Duration::from_secs(60));
    }
}
