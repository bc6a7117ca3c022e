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

use crate::Error;

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

/// A measured boot: the command once, its JSON result (or its output, if
/// it failed) framed on the console. A command that stops making progress
/// is not waited for until qemu's timeout: as soon as its pipelock says a
/// thread asked for a mutex it holds, or after `deadline`, the guest asks
/// the kernel for its blocked tasks (sysrq `w`) and sends them back with
/// the `deadlock:` lines (`asked`, `blocked`, `stuck`).
pub fn run_script(nonce: &str, command: &[String], deadline: Duration) -> String {
    run_script_with(
        nonce,
        command,
        deadline,
        "/pipelock",
        "/tmp",
        "/proc/sysrq-trigger",
    )
}

/// [`run_script`] with pipelock at `bin`, scratch files in `tmp` and the
/// sysrq trigger at `sysrq` (the integration test runs it on the host).
pub fn run_script_with(
    nonce: &str,
    command: &[String],
    deadline: Duration,
    bin: &str,
    tmp: &str,
    sysrq: &str,
) -> String {
    let args: Vec<String> = guest_command(command).iter().map(|a| quote(a)).collect();
    let deadline = deadline.as_secs().max(1);
    let asked = ASKED_TWICE;
    format!(
        r#"cd {tmp}
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
  {bin} ab-emit {nonce} asked {tmp}/asked
  {bin} ab-emit {nonce} blocked {tmp}/blocked
  {bin} ab-emit {nonce} stuck {tmp}/stuck
else
  wait $pid
  rc=$?
  if [ $rc = 0 ]; then {bin} ab-emit {nonce} result {RESULT}; else echo "exit $rc" >> {tmp}/output; {bin} ab-emit {nonce} failed {tmp}/output; fi
fi"#,
        args = args.join(" "),
    )
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
}
