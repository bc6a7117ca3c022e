//! Building the two kernels of `pipelock ab --source`: A, the tree as it
//! is (or a commit of it), and B, A with a patch (or another commit, as
//! the diff between the two). Both share one configuration, and B is
//! built on A's objects, so only what the patch touches is compiled again.
//!
//! The cache (outside any checkout) holds, per build input, a finished
//! `bzImage` and its `.config`, moved into place only once complete:
//! an interrupted or failed build leaves no entry. Beside it, one work
//! tree per base (a hard-linked copy of the source, and the build's
//! objects) is make's own incremental state; a work tree left with a
//! patch applied (a kill at the wrong moment) is thrown away and rebuilt.
pub mod config;
pub mod touched;
pub mod tree;

use std::{
    fs,
    io::{BufRead as _, BufReader, Write as _},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex, mpsc},
    time::{Duration, Instant},
};

use sha2::{Digest as _, Sha256};

use crate::{Error, Result, io};

/// What B is: A with a patch, or another commit of A's git tree.
pub enum Change {
    Patch(PathBuf),
    Revs { a: String, b: String },
}

pub struct Request {
    pub source: PathBuf,
    pub change: Change,
    /// The user's configuration fragment, merged after pipelock's.
    pub config: Option<PathBuf>,
    /// Where finished kernels and work trees are kept.
    pub cache: PathBuf,
    pub jobs: usize,
}

/// One kernel of the pair.
#[derive(Clone, Debug)]
pub struct Kernel {
    pub image: PathBuf,
    /// What it was built from, in the user's words.
    pub label: String,
    /// How long its build took; None when it came from the cache.
    pub built_in: Option<Duration>,
    /// The build's log (kept in the work tree).
    pub log: Option<PathBuf>,
}

/// What a build reports as it goes.
pub enum Event<'a> {
    /// A step begins: "configuring", "building A", …
    Step(&'a str),
    /// A line of make's output.
    Line(&'a str),
}

/// Free space a build needs in the cache's file system: a cold build's
/// objects with their debug info (measured: about 0.6 GiB for a 6.1
/// tinyconfig with pipelock's fragment), a patched rebuild much less.
const COLD_BUILD_BYTES: u64 = 3 << 30;
const REBUILD_BYTES: u64 = 1 << 30;

fn key(parts: &[&[u8]]) -> String {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part);
    }
    tree::hex(&hash.finalize()[..8])
}

fn invalid(why: String) -> Error {
    Error::Invalid(why)
}

fn free_bytes(dir: &Path) -> Option<u64> {
    let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs writes into the zeroed struct it is given.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::statvfs(path.as_ptr(), &mut stat) } == 0).then(|| stat.f_bavail * stat.f_frsize)
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// Builds (or finds in the cache) kernels A and B.
pub fn build(
    request: &Request,
    on: &mut dyn FnMut(Event<'_>),
    stop: &dyn Fn() -> bool,
) -> Result<[Kernel; 2]> {
    let source = &request.source;
    if !tree::is_kernel_tree(source) {
        return Err(invalid(format!(
            "--source {}: not a kernel tree (want its top: Makefile, scripts/kconfig/merge_config.sh, arch/x86)",
            source.display()
        )));
    }
    let user_fragment = match &request.config {
        Some(path) => {
            fs::read_to_string(path).map_err(|e| invalid(format!("--config {}: {e}", path.display())))?
        }
        None => String::new(),
    };
    let name = |path: &Path| {
        path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    };
    let source_name = name(source);
    let (base_id, patch, label_a, label_b, base_rev) = match &request.change {
        Change::Patch(path) => {
            let patch = fs::read(path).map_err(|e| invalid(format!("--patch {}: {e}", path.display())))?;
            (
                tree::identity(source)?,
                patch,
                source_name.clone(),
                format!("{source_name} + {}", name(path)),
                None,
            )
        }
        Change::Revs { a, b } => {
            let (ca, cb) = (tree::commit(source, a)?, tree::commit(source, b)?);
            let patch = tree::diff(source, &ca, &cb)?;
            let (base_id, base_rev) = if tree::is_checked_out(source, &ca) {
                (tree::identity(source)?, None)
            } else {
                (ca.clone(), Some(ca))
            };
            (
                base_id,
                patch,
                format!("{source_name} {a}"),
                format!("{source_name} {b}"),
                base_rev,
            )
        }
    };
    let base = key(&[
        b"pipelock kernel build 1",
        base_id.as_bytes(),
        config::FRAGMENT.as_bytes(),
        user_fragment.as_bytes(),
    ]);
    let empty = patch.iter().all(u8::is_ascii_whitespace);
    let changed = if empty {
        base.clone()
    } else {
        key(&[base.as_bytes(), &patch])
    };
    let kernels = request.cache.join("kernels");
    let image = |k: &str| kernels.join(k).join("bzImage");
    let kernel = |k: &str, label: &str| Kernel {
        image: image(k),
        label: label.to_owned(),
        built_in: None,
        log: None,
    };
    let mut a = kernel(&base, &label_a);
    let mut b = kernel(&changed, &label_b);
    if a.image.is_file() && b.image.is_file() {
        return Ok([a, b]);
    }
    // Only a build needs them: cached kernels boot on any machine.
    let missing = tree::missing_packages(base_rev.is_some());
    if !missing.is_empty() {
        return Err(invalid(format!(
            "building a kernel needs tools this machine lacks: apt-get install {}",
            missing.join(" ")
        )));
    }

    fs::create_dir_all(&request.cache).map_err(io(format!("cannot create {}", request.cache.display())))?;
    let work = request.cache.join("work").join(&base);
    let src = work.join("src");
    let out = work.join("out");
    let patched = work.join("patched");
    let cold = !src.is_dir() || patched.exists() || !out.join(".config").is_file();
    let need = if cold { COLD_BUILD_BYTES } else { REBUILD_BYTES };
    if let Some(free) = free_bytes(&request.cache)
        && free < need
    {
        return Err(invalid(format!(
            "too little disk space for a kernel build in {}: {} free, {} needed (--build-cache DIR to build elsewhere)",
            request.cache.display(),
            gib(free),
            gib(need)
        )));
    }
    fs::create_dir_all(&kernels).map_err(io(format!("cannot create {}", kernels.display())))?;
    if !src.is_dir() || patched.exists() {
        on(Event::Step("copying the tree"));
        let _ = fs::remove_dir_all(&work);
        fs::create_dir_all(&work).map_err(io(format!("cannot create {}", work.display())))?;
        let staging = work.join("src.partial");
        match &base_rev {
            None => tree::link_copy(source, &staging)?,
            Some(rev) => tree::export(source, rev, &staging)?,
        }
        if staging.join(".config").exists() {
            // Built in place: kbuild refuses a separate output directory.
            quiet_make(&staging, None, &["mrproper"])?;
        }
        fs::rename(&staging, &src).map_err(io(format!("cannot create {}", src.display())))?;
    }
    let patch_file = work.join("change.patch");
    if !empty {
        fs::write(&patch_file, &patch).map_err(io(format!("cannot write {}", patch_file.display())))?;
        // Before any build: a patch that does not apply costs nothing.
        let what = match &request.change {
            Change::Patch(path) => path.display().to_string(),
            Change::Revs { a, b } => format!("{a}..{b}"),
        };
        tree::check_patch(&src, &patch_file, &what)?;
    }
    if !out.join(".config").is_file() {
        on(Event::Step("configuring"));
        configure(&src, &out, &work, &user_fragment, request.config.as_deref())?;
    }

    let built_a = work.join("built-a");
    if !a.image.is_file() || (!b.image.is_file() && !built_a.exists()) {
        on(Event::Step("building A"));
        let log = work.join("build-A.log");
        let started = Instant::now();
        make_kernel(&src, &out, request.jobs, "A", &log, on, stop)?;
        fs::write(&built_a, b"").map_err(io(format!("cannot write {}", built_a.display())))?;
        if !a.image.is_file() {
            store(&out, &kernels, &base)?;
            a.built_in = Some(started.elapsed());
        }
        a.log = Some(log);
    }
    if !b.image.is_file() {
        on(Event::Step("building B"));
        let log = work.join("build-B.log");
        let started = Instant::now();
        fs::write(&patched, b"").map_err(io(format!("cannot write {}", patched.display())))?;
        let _ = fs::remove_file(&built_a);
        tree::apply(&src, &patch_file, false)?;
        let made = make_kernel(&src, &out, request.jobs, "B", &log, on, stop)
            .and_then(|()| store(&out, &kernels, &changed));
        // Back to A, whatever happened: the patched files get new times,
        // so the next build compiles them again from A's text.
        tree::apply(&src, &patch_file, true)?;
        let _ = fs::remove_file(&patched);
        made?;
        b.built_in = Some(started.elapsed());
        b.log = Some(log);
    }
    Ok([a, b])
}

/// `make` in `src`, quietly; its last line on failure.
fn quiet_make(src: &Path, out: Option<&Path>, args: &[&str]) -> Result<()> {
    let mut cmd = Command::new("make");
    cmd.arg("-C").arg(src);
    if let Some(out) = out {
        cmd.arg(format!("O={}", out.display()));
    }
    crate::run(cmd.args(args).stdout(Stdio::null()))
}

/// tinyconfig, then the fragments merged over it, then checked.
fn configure(src: &Path, out: &Path, work: &Path, user: &str, user_path: Option<&Path>) -> Result<()> {
    let _ = fs::remove_dir_all(out);
    fs::create_dir_all(out).map_err(io(format!("cannot create {}", out.display())))?;
    let ours = work.join("pipelock.config");
    fs::write(&ours, config::FRAGMENT).map_err(io(format!("cannot write {}", ours.display())))?;
    let result = (|| {
        quiet_make(src, Some(out), &["tinyconfig"])?;
        let mut merge = Command::new(src.join("scripts/kconfig/merge_config.sh"));
        merge
            .current_dir(src)
            .arg("-m")
            .arg("-O")
            .arg(out)
            .arg(out.join(".config"))
            .arg(&ours);
        if let Some(path) = user_path {
            merge.arg(path);
        }
        crate::run(merge.stdout(Stdio::null()))?;
        quiet_make(src, Some(out), &["olddefconfig"])?;
        let merged = fs::read_to_string(out.join(".config")).map_err(io("cannot read the merged .config"))?;
        let mut problems: Vec<String> = config::unsatisfied(config::FRAGMENT, &merged)
            .iter()
            .map(|u| format!("pipelock's fragment: {u}"))
            .collect();
        if let Some(path) = user_path {
            problems.extend(
                config::unsatisfied(user, &merged)
                    .iter()
                    .map(|u| format!("--config {}: {u}", path.display())),
            );
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(invalid(format!(
                "the kernel configuration cannot be made: {}",
                problems.join("; ")
            )))
        }
    })();
    if result.is_err() {
        let _ = fs::remove_dir_all(out);
    }
    result
}

/// Moves the finished image and its .config into the cache as `key`.
fn store(out: &Path, kernels: &Path, key: &str) -> Result<()> {
    let partial = kernels.join(format!("{key}.partial"));
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir_all(&partial).map_err(io(format!("cannot create {}", partial.display())))?;
    for (from, to) in [("arch/x86/boot/bzImage", "bzImage"), (".config", "config")] {
        fs::copy(out.join(from), partial.join(to))
            .map_err(io(format!("cannot copy {from} into the cache")))?;
    }
    fs::rename(&partial, kernels.join(key)).map_err(io(format!("cannot store kernel {key}")))
}

/// The compiler's complaint out of a failed build's log: its last
/// `error:` lines, or its last lines.
pub fn build_errors(log: &str) -> String {
    let lines: Vec<&str> = log.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let errors: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.contains("error:") || l.contains("Error "))
        .collect();
    let picked: Vec<&str> = if errors.iter().any(|l| l.contains("error:")) {
        errors.iter().copied().filter(|l| l.contains("error:")).collect()
    } else if errors.is_empty() {
        lines.clone()
    } else {
        errors
    };
    let last = &picked[picked.len().saturating_sub(3)..];
    last.join(" | ")
}

/// `make bzImage`, its output in `log` and passed to `on` line by line;
/// stopped (make and its compilers) when `stop` says so.
fn make_kernel(
    src: &Path,
    out: &Path,
    jobs: usize,
    side: &str,
    log: &Path,
    on: &mut dyn FnMut(Event<'_>),
    stop: &dyn Fn() -> bool,
) -> Result<()> {
    let file = Arc::new(Mutex::new(
        fs::File::create(log).map_err(io(format!("cannot create {}", log.display())))?,
    ));
    let mut child = Command::new("make")
        .arg("-C")
        .arg(src)
        .arg(format!("O={}", out.display()))
        .arg(format!("-j{jobs}"))
        .arg("bzImage")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group: a stop ends make and every compiler it started.
        .process_group(0)
        .spawn()
        .map_err(io("cannot start make"))?;
    let (send, lines) = mpsc::channel::<String>();
    let mut readers = Vec::new();
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
        let (send, file) = (send.clone(), Arc::clone(&file));
        readers.push(std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(std::result::Result::ok) {
                if let Ok(mut f) = file.lock() {
                    let _ = writeln!(f, "{line}");
                }
                let _ = send.send(line);
            }
        }));
    }
    drop(send);
    let mut stopped = false;
    let status = loop {
        match lines.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => on(Event::Line(&line)),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                break child.wait().map_err(io("make"))?;
            }
        }
        if !stopped && stop() {
            stopped = true;
            // SAFETY: signals the process group make leads.
            unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGTERM) };
        }
    };
    for reader in readers {
        let _ = reader.join();
    }
    if stopped {
        return Err(Error::Interrupted);
    }
    if !status.success() {
        let text = fs::read_to_string(log).unwrap_or_default();
        return Err(Error::BuildFailed {
            side: side.to_owned(),
            errors: build_errors(&text),
            log: log.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_build_says_what_the_compiler_said() {
        let log = "  CC      fs/open.o\n  CC      fs/pipe.o\n\
                   /src/fs/pipe.c:325:5: error: expected ';' before 'tail'\n\
                   make[3]: *** [scripts/Makefile.build:250: fs/pipe.o] Error 1\n\
                   make[2]: *** [scripts/Makefile.build:500: fs] Error 2\n";
        assert_eq!(
            build_errors(log),
            "/src/fs/pipe.c:325:5: error: expected ';' before 'tail'"
        );
        assert_eq!(build_errors("a\nb\nc\nd\n"), "b | c | d");
    }

    #[test]
    fn keys_differ_with_any_input() {
        assert_ne!(key(&[b"ab", b"c"]), key(&[b"a", b"bc"]));
        assert_eq!(key(&[b"x"]).len(), 16);
    }
}
