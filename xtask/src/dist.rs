//! `cargo xtask dist`: what a user installs on a test box. A static
//! `pipelock` (the eBPF object inside it), its man pages and shell
//! completions generated from the clap definitions, the systemd unit and the
//! Grafana dashboard, as a tarball and as a Debian package.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

const VERSION: &str = env!("CARGO_PKG_VERSION");
const ARCH_DEB: &str = "amd64";
const ARCH_TAR: &str = "x86_64-linux";

/// What `dist` made.
pub struct Dist {
    pub deb: PathBuf,
    pub tarball: PathBuf,
}

/// Where each shipped file goes, relative to the package's root (`/usr`).
/// The tarball uses the same tree, so its layout is the installed one.
fn layout(root: &Path, stage: &Path, binary: &Path) -> Result<()> {
    let usr = stage.join("usr");
    copy(binary, &usr.join("bin/pipelock"))?;
    let man1 = usr.join("share/man/man1");
    crate::run(Command::new(binary).args(["generate", "man"]).arg(&man1))?;
    // Debian policy: man pages compressed, without the name and time in the
    // gzip header, so two builds of one tree give the same package.
    crate::run(
        Command::new("gzip")
            .args(["-9", "-n", "-f"])
            .args(read_dir(&man1)?),
    )?;
    let completions = stage.join("completions");
    crate::run(
        Command::new(binary)
            .args(["generate", "completions"])
            .arg(&completions),
    )?;
    for (name, to) in [
        ("pipelock", "share/bash-completion/completions/pipelock"),
        ("_pipelock", "share/zsh/vendor-completions/_pipelock"),
        ("pipelock.fish", "share/fish/vendor_completions.d/pipelock.fish"),
    ] {
        copy(&completions.join(name), &usr.join(to))?;
    }
    fs::remove_dir_all(&completions)?;
    for file in [
        "deploy/pipelock.service",
        "deploy/grafana-dashboard.json",
        "pipelock-vm/kernel.config",
    ] {
        let from = root.join(file);
        copy(
            &from,
            &usr.join("share/pipelock").join(from.file_name().expect("a file")),
        )?;
    }
    let doc = usr.join("share/doc/pipelock");
    copy(&root.join("README.md"), &doc.join("README.md"))?;
    for page in read_dir(&root.join("docs"))?
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
    {
        copy(&page, &doc.join("docs").join(page.file_name().expect("a file")))?;
    }
    fs::write(doc.join("copyright"), COPYRIGHT)?;
    Ok(())
}

const COPYRIGHT: &str = "\
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: pipelock

Files: *
License: MIT OR Apache-2.0
";

/// Builds target/dist/ from a built static binary.
pub fn dist(root: &Path, binary: &Path) -> Result<Dist> {
    check_static(binary)?;
    let out = root.join("target/dist");
    if out.exists() {
        fs::remove_dir_all(&out).with_context(|| format!("cannot clear {}", out.display()))?;
    }
    let name = format!("pipelock-{VERSION}-{ARCH_TAR}");
    let stage = out.join(&name);
    layout(root, &stage, binary)?;

    let tarball = out.join(format!("{name}.tar.gz"));
    crate::run(
        Command::new("tar")
            .args(["--owner=0", "--group=0", "--sort=name", "-czf"])
            .arg(&tarball)
            .arg("-C")
            .arg(&out)
            .arg(&name),
    )?;

    let deb_root = out.join("deb-root");
    copy_tree(&stage, &deb_root)?;
    let debian = deb_root.join("DEBIAN");
    fs::create_dir_all(&debian)?;
    fs::write(debian.join("control"), control(installed_kib(&deb_root)?))?;
    let deb = out.join(format!("pipelock_{VERSION}_{ARCH_DEB}.deb"));
    crate::run(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zxz", "--build"])
            .arg(&deb_root)
            .arg(&deb),
    )?;
    fs::remove_dir_all(&deb_root)?;
    fs::remove_dir_all(&stage)?;
    println!("dist: {}", tarball.display());
    println!("dist: {}", deb.display());
    Ok(Dist { deb, tarball })
}

fn control(installed_kib: u64) -> String {
    format!(
        "Package: pipelock\n\
         Version: {VERSION}\n\
         Architecture: {ARCH_DEB}\n\
         Maintainer: pipelock developers <pipelock@example.invalid>\n\
         Section: devel\n\
         Priority: optional\n\
         Installed-Size: {installed_kib}\n\
         Description: how long Linux pipe locks are waited for and held, and why\n \
         pipelock attaches eBPF programs to the kernel's pipe and lock paths and\n \
         reports per-lock wait and hold times, their owners and callers, live\n \
         (pipelock top), as CSV/JSON, or as Prometheus metrics (pipelock serve).\n \
         The binary is static and carries its eBPF programs.\n"
    )
}

/// A binary that asks for a dynamic loader would not run on a box without
/// the build machine's libraries; `ldd` says which kind this one is.
pub fn check_static(binary: &Path) -> Result<()> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("cannot run ldd")?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !(said.contains("not a dynamic executable") || said.contains("statically linked")) {
        bail!("{} is not static; ldd says: {}", binary.display(), said.trim());
    }
    Ok(())
}

fn installed_kib(dir: &Path) -> Result<u64> {
    let mut bytes = 0;
    for entry in walk(dir)? {
        bytes += entry.metadata()?.len();
    }
    Ok(bytes.div_ceil(1024))
}

fn walk(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in read_dir(dir)? {
        if path.is_dir() {
            files.extend(walk(&path)?);
        } else {
            files.push(path);
        }
    }
    Ok(files)
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    for file in walk(from)? {
        copy(&file, &to.join(file.strip_prefix(from)?))?;
    }
    Ok(())
}

fn read_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut paths = fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()?;
    paths.sort();
    Ok(paths)
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to.parent().expect("a file path"))?;
    fs::copy(from, to).with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))?;
    Ok(())
}
