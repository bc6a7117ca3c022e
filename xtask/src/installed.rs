//! The package as a user gets it: `dpkg -i` the .deb that `dist` made, use
//! pipelock from the installed paths only (the binary, its man pages, its
//! completions, the unit), run it where no toolchain or library exists, and
//! remove the package again.
use std::{path::Path, process::Command};

use anyhow::{Context as _, Result, bail};

/// Installs, checks and removes the package; prints one line per check and
/// `package: N passed, N failed[, N skipped]`.
pub fn check(dist: &crate::dist::Dist) -> Result<()> {
    let tarball = tarball_holds_the_tree(&dist.tarball);
    if Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", "pipelock"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("installed"))
    {
        println!("package: skipped: a pipelock package is already installed here; not replacing it");
        println!("package: 0 passed, 0 failed, 1 skipped");
        return Ok(());
    }
    crate::run(Command::new("dpkg").arg("-i").arg(&dist.deb))?;
    let results: Vec<(&str, Result<()>)> = CHECKS.iter().map(|(name, check)| (*name, check())).collect();
    let removed = crate::run(Command::new("dpkg").args(["-r", "pipelock"]));
    let gone = if Path::new("/usr/bin/pipelock").exists() {
        Err(anyhow::anyhow!("/usr/bin/pipelock is still there after dpkg -r"))
    } else {
        removed
    };
    let mut failed = 0;
    let last = [
        ("the tarball holds the installed tree", tarball),
        ("dpkg -r removes it", gone),
    ];
    for (name, result) in results.iter().chain(last.iter()) {
        match result {
            Ok(()) => println!("package: {name}: ok"),
            Err(err) => {
                failed += 1;
                println!("package: {name}: FAILED: {err:#}");
            }
        }
    }
    println!(
        "package: {} passed, {failed} failed",
        CHECKS.len() + last.len() - failed
    );
    if failed > 0 {
        bail!("{failed} package check(s) failed");
    }
    Ok(())
}

fn tarball_holds_the_tree(tarball: &Path) -> Result<()> {
    let listed = stdout_of(Command::new("tar").arg("-tzf").arg(tarball))?;
    for wanted in [
        "usr/bin/pipelock",
        "usr/share/man/man1/pipelock-trace.1.gz",
        "usr/share/bash-completion/completions/pipelock",
        "usr/share/pipelock/pipelock.service",
        "usr/share/pipelock/kernel.config",
    ] {
        if !listed.lines().any(|l| l.ends_with(wanted)) {
            bail!("{} lacks {wanted}", tarball.display());
        }
    }
    Ok(())
}

type Check = fn() -> Result<()>;

const CHECKS: &[(&str, Check)] = &[
    ("pipelock --version", version),
    ("pipelock probe", probe),
    ("man pipelock-trace", man_page),
    ("bash completion of `pipelock tr<TAB>`", bash_completion),
    ("systemd-analyze verify of the unit", unit),
    ("runs in a chroot holding nothing but the binary", bare_chroot),
];

/// Runs CMD with the PATH a user's shell has: nothing from the build.
fn installed(program: &str) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("HOME", "/root")
        .env("LANG", "C.UTF-8");
    cmd
}

fn stdout_of(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("cannot start {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn version() -> Result<()> {
    let said = stdout_of(installed("pipelock").arg("--version"))?;
    if said.trim() != format!("pipelock {}", env!("CARGO_PKG_VERSION")) {
        bail!("it said {said:?}");
    }
    Ok(())
}

fn probe() -> Result<()> {
    let said = stdout_of(installed("/usr/bin/pipelock").arg("probe"))?;
    if !said.contains("--mode auto picks") {
        bail!("no mode decision in its output:\n{said}");
    }
    Ok(())
}

fn man_page() -> Result<()> {
    let path = stdout_of(installed("man").args(["-w", "pipelock-trace"]))?;
    if path.trim() != "/usr/share/man/man1/pipelock-trace.1.gz" {
        bail!("man -w found {path:?}");
    }
    let page = stdout_of(
        installed("man")
            .args(["-P", "cat", "pipelock-trace"])
            .env("MANWIDTH", "100"),
    )?;
    let page = strip_overstrike(&page);
    for wanted in ["pipelock-trace", "--max-locks", "--callers"] {
        if !page.contains(wanted) {
            bail!("the rendered page lacks {wanted}:\n{page}");
        }
    }
    Ok(())
}

/// man formats bold and underline as `c\bc` and `_\bc` for a pager; the words
/// are what is checked.
fn strip_overstrike(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '\u{8}' {
            out.pop();
        } else {
            out.push(c);
        }
    }
    out
}

fn bash_completion() -> Result<()> {
    let script = "source /usr/share/bash-completion/completions/pipelock; \
                  COMP_WORDS=(pipelock tr); COMP_CWORD=1; COMP_LINE='pipelock tr'; COMP_POINT=11; \
                  _pipelock pipelock tr pipelock; printf '%s\\n' \"${COMPREPLY[@]}\"";
    let said = stdout_of(installed("bash").args(["-c", script]))?;
    if said.lines().map(str::trim).collect::<Vec<_>>() != ["trace"] {
        bail!("completed `pipelock tr` to {said:?}");
    }
    Ok(())
}

fn unit() -> Result<()> {
    let out = installed("systemd-analyze")
        .args(["verify", "/usr/share/pipelock/pipelock.service"])
        .output()
        .context("cannot run systemd-analyze")?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // verify reports problems of the unit on its output even where it exits
    // 0; what is said of other units on this machine is not the package's.
    let ours: Vec<&str> = said.lines().filter(|l| l.contains("pipelock")).collect();
    if !out.status.success() || !ours.is_empty() {
        bail!("{}", said.trim());
    }
    Ok(())
}

/// The binary alone in an empty root, with the kernel's /proc and /sys (and
/// tracefs beneath it) bound in: no libraries, no toolchain, no PATH.
fn bare_chroot() -> Result<()> {
    let root = std::env::temp_dir().join(format!("pipelock-bare-{}", std::process::id()));
    std::fs::create_dir_all(&root)?;
    let result = (|| {
        for dir in ["proc", "sys", "dev"] {
            std::fs::create_dir_all(root.join(dir))?;
            crate::run(
                Command::new("mount")
                    .arg("--rbind")
                    .arg(format!("/{dir}"))
                    .arg(root.join(dir)),
            )?;
        }
        std::fs::copy("/usr/bin/pipelock", root.join("pipelock"))?;
        let said = stdout_of(installed("chroot").arg(&root).args(["/pipelock", "probe"]))?;
        if !said.contains("--mode auto picks") {
            bail!("no mode decision in its output:\n{said}");
        }
        Ok(())
    })();
    // Never a recursive removal: a bind mount left behind would take the
    // host's /sys or /dev with it. What cannot be unmounted stays.
    for dir in ["proc", "sys", "dev"] {
        let _ = Command::new("umount").arg("-R").arg(root.join(dir)).status();
        let _ = std::fs::remove_dir(root.join(dir));
    }
    let _ = std::fs::remove_file(root.join("pipelock"));
    let _ = std::fs::remove_dir(&root);
    result
}
