//! Makes a machine with rustup able to build pipelock's eBPF programs: a nightly
//! toolchain with rust-src, and a bpf-linker linked against that nightly's own
//! LLVM, built once into target/tools and rebuilt when the nightly's LLVM changes.
use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

const NIGHTLY: &str = "nightly";
/// The bpf-linker release that matches aya 0.14's object format.
const BPF_LINKER_VERSION: &str = "0.13.0";

pub struct Tools {
    /// Holds `bpf-linker`; put it first on PATH for the eBPF build.
    pub bin_dir: PathBuf,
}

pub fn ensure(root: &Path) -> Result<Tools> {
    let rustup = which("rustup").context(
        "rustup is missing: pipelock's eBPF build needs it to reach a nightly toolchain; \
         install it with `curl --proto '=https' -sSf https://sh.rustup.rs | sh`",
    )?;
    ensure_nightly_with_rust_src(&rustup)?;
    let tools_dir = root.join("target/tools");
    let bin_dir = tools_dir.join("bin");
    ensure_bpf_linker(&tools_dir)?;
    Ok(Tools { bin_dir })
}

pub fn which(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("cannot start {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8(out.stdout)?)
}

fn ensure_nightly_with_rust_src(rustup: &Path) -> Result<()> {
    let toolchains = output(Command::new(rustup).args(["toolchain", "list"]))?;
    if !toolchains.lines().any(|l| l.starts_with("nightly-")) {
        eprintln!("xtask: no nightly toolchain; installing one with rustup");
        crate::run(Command::new(rustup).args([
            "toolchain",
            "install",
            NIGHTLY,
            "--profile",
            "minimal",
            "--component",
            "rust-src",
        ]))
        .context("installing nightly failed; fix: `rustup toolchain install nightly --component rust-src`")?;
    }
    let installed =
        output(Command::new(rustup).args(["component", "list", "--installed", "--toolchain", NIGHTLY]))?;
    if !installed.lines().any(|l| l.starts_with("rust-src")) {
        eprintln!("xtask: adding rust-src to the nightly toolchain (needed for -Z build-std=core)");
        crate::run(Command::new(rustup).args(["component", "add", "rust-src", "--toolchain", NIGHTLY]))
            .context("adding rust-src failed; fix: `rustup component add rust-src --toolchain nightly`")?;
    }
    Ok(())
}

/// The nightly's LLVM: major version and the shared library rustc ships.
struct NightlyLlvm {
    major: u32,
    library: PathBuf,
}

fn nightly_llvm() -> Result<NightlyLlvm> {
    let version = output(Command::new("rustc").args([&format!("+{NIGHTLY}"), "-vV"]))?;
    let llvm = version
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .context("`rustc +nightly -vV` printed no LLVM version")?;
    let major = llvm
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .with_context(|| format!("unreadable LLVM version {llvm}"))?;
    let sysroot = output(Command::new("rustc").args([&format!("+{NIGHTLY}"), "--print", "sysroot"]))?;
    let lib_dir = Path::new(sysroot.trim()).join("lib");
    // e.g. libLLVM.so.22.1-rust-1.97.0-nightly: the soname bpf-linker must link to.
    let library = fs::read_dir(&lib_dir)
        .with_context(|| format!("cannot list {}", lib_dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("libLLVM.so.{major}.")) && n.contains("-rust-"))
        })
        .with_context(|| {
            format!(
                "the nightly toolchain ships no libLLVM.so.{major}.* in {}; reinstall it with \
                 `rustup toolchain install nightly --force`",
                lib_dir.display()
            )
        })?;
    Ok(NightlyLlvm { major, library })
}

fn ensure_bpf_linker(tools_dir: &Path) -> Result<()> {
    let llvm = nightly_llvm()?;
    let binary = tools_dir.join("bin/bpf-linker");
    let stamp_path = tools_dir.join("bpf-linker.stamp");
    // Rebuild whenever the version or the LLVM it links against changes.
    let stamp = format!(
        "bpf-linker {BPF_LINKER_VERSION} llvm-{} {}\n",
        llvm.major,
        llvm.library.display()
    );
    if binary.is_file() && fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp) {
        return Ok(());
    }

    // LLVM_PREFIX/lib must hold libLLVM.so and the soname; both point at rustc's copy.
    let prefix = tools_dir.join("llvm");
    let lib = prefix.join("lib");
    fs::create_dir_all(&lib)?;
    let soname = llvm
        .library
        .file_name()
        .context("LLVM library has no file name")?;
    for link in [lib.join("libLLVM.so"), lib.join(soname)] {
        let _ = fs::remove_file(&link);
        symlink(&llvm.library, &link).with_context(|| format!("cannot link {}", link.display()))?;
    }

    eprintln!(
        "xtask: building bpf-linker {BPF_LINKER_VERSION} against the nightly's LLVM {} (once, ~2 min)",
        llvm.major
    );
    crate::run(
        Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--locked",
                "--force",
            ])
            .args([
                "--no-default-features",
                "--features",
                &format!("llvm-{}", llvm.major),
            ])
            .arg("--root")
            .arg(tools_dir)
            .env("LLVM_PREFIX", &prefix),
    )
    .context("building bpf-linker failed")?;
    fs::write(&stamp_path, stamp)?;
    Ok(())
}

fn is_root() -> bool {
    fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
    })
}

/// A Debian package and how to tell it is installed.
pub type Package<'a> = (&'a str, &'a dyn Fn() -> bool);

/// Installs the packages whose check fails (as root; otherwise says how).
pub fn ensure_debian_packages(packages: &[Package<'_>]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .filter(|(_, present)| !present())
        .map(|(name, _)| *name)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!(
            "{} missing: install with `apt-get install {}`",
            missing.join(", "),
            missing.join(" ")
        );
    }
    eprintln!("xtask: installing {}", missing.join(" "));
    crate::run(Command::new("apt-get").arg("update").arg("-qq"))?;
    crate::run(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}
