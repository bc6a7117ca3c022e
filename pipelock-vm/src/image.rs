//! What a guest boots into: busybox, the binaries it runs (static, or with
//! the shared libraries they need), and an /init script, packed as an
//! uncompressed newc initramfs.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use crate::{Error, Result, cpio, io};

/// Debian's static busybox (package busybox-static).
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

/// A file of the guest: where it goes (relative to /) and what it holds.
pub struct GuestFile {
    pub path: String,
    pub data: Vec<u8>,
    pub mode: u32,
}

impl GuestFile {
    /// The host file `host` at `path` in the guest.
    pub fn copy(host: &Path, path: &str, mode: u32) -> Result<Self> {
        Ok(Self {
            path: path.trim_start_matches('/').to_owned(),
            data: fs::read(host).map_err(io(format!("cannot read {}", host.display())))?,
            mode,
        })
    }
}

/// The binary `host` at `/name` in the guest: alone if it is static, else
/// with its dynamic loader and every shared library `ldd` names, at the
/// same paths as on this host (guest and host are the same architecture).
pub fn binary_with_libraries(host: &Path, name: &str) -> Result<Vec<GuestFile>> {
    let mut files = vec![GuestFile::copy(host, name, 0o755)?];
    if is_static(host) {
        return Ok(files);
    }
    let out = Command::new("ldd")
        .arg(host)
        .output()
        .map_err(io("cannot run ldd"))?;
    if !out.status.success() {
        return Err(Error::Invalid(format!(
            "{} is dynamically linked and ldd cannot list its libraries",
            host.display()
        )));
    }
    for library in libraries(&String::from_utf8_lossy(&out.stdout)) {
        files.push(GuestFile::copy(&library, &library.to_string_lossy(), 0o755)?);
    }
    Ok(files)
}

/// The absolute paths `ldd` prints: `libc.so.6 => /lib/…/libc.so.6 (0x…)`
/// and the loader `/lib64/ld-linux-x86-64.so.2 (0x…)`; not the vDSO.
fn libraries(ldd: &str) -> Vec<PathBuf> {
    ldd.lines()
        .filter_map(|line| {
            let target = line.split_once("=>").map_or(line, |(_, right)| right);
            let path = target.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// An /init for busybox: mount what tracing needs, bring up loopback,
/// export `env`, run `guest`, print `sentinel` with its exit status, and
/// reboot (qemu's -no-reboot makes that its end).
pub fn init_script(banner: &str, env: &str, guest: &str, sentinel: &str) -> String {
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
# Loopback: tests reach servers in the guest over 127.0.0.1.
ifconfig lo 127.0.0.1 up
export PATH=/bin {env}
echo "{banner}: $(cat /proc/sys/kernel/osrelease), clocksource $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource), preemption $(cat /sys/kernel/debug/sched/preempt 2>/dev/null || echo unknown)"
{guest}
echo "{sentinel}$?"
# qemu runs with -no-reboot: a reboot ends it, with or without ACPI.
reboot -f
"#
    )
}

/// Writes the initramfs: busybox, `files`, and `init` as /init.
pub fn write_initramfs(dest: &Path, init: &str, files: &[GuestFile]) -> Result<()> {
    let busybox = fs::read(BUSYBOX).map_err(io(format!(
        "cannot read {BUSYBOX} (Debian: apt-get install busybox-static)"
    )))?;
    if !is_static(Path::new(BUSYBOX)) {
        return Err(Error::Invalid(format!(
            "{BUSYBOX} is not static (Debian: apt-get install busybox-static)"
        )));
    }
    // Every parent directory, once, before its files.
    let mut dirs: Vec<String> = ["bin", "dev", "proc", "sys", "tmp"].map(str::to_owned).to_vec();
    for file in files {
        let mut parent = Path::new(&file.path).parent();
        let mut chain = Vec::new();
        while let Some(dir) = parent.filter(|d| !d.as_os_str().is_empty()) {
            chain.push(dir.to_string_lossy().into_owned());
            parent = dir.parent();
        }
        for dir in chain.into_iter().rev() {
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
    let mut entries: Vec<cpio::Entry<'_>> = dirs.iter().map(|path| cpio::Entry::Dir { path }).collect();
    entries.push(cpio::Entry::File {
        path: "bin/busybox",
        mode: 0o755,
        data: &busybox,
    });
    entries.push(cpio::Entry::File {
        path: "init",
        mode: 0o755,
        data: init.as_bytes(),
    });
    entries.extend(files.iter().map(|f| cpio::Entry::File {
        path: &f.path,
        mode: f.mode,
        data: &f.data,
    }));
    let write = || -> std::io::Result<()> {
        let mut out = std::io::BufWriter::new(fs::File::create(dest)?);
        cpio::write(&mut out, &entries)?;
        std::io::Write::flush(&mut out)
    };
    write().map_err(io(format!("cannot write {}", dest.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_the_loader_and_the_libraries() {
        let ldd = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                   \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            libraries(ldd),
            [
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
    }

    #[test]
    fn this_test_binary_comes_with_its_libraries() {
        let exe = std::env::current_exe().unwrap();
        let files = binary_with_libraries(&exe, "probe").unwrap();
        assert_eq!(files[0].path, "probe");
        if !is_static(&exe) {
            assert!(files.iter().any(|f| f.path.contains("libc.so")), "no libc");
        }
    }
}
