//! `pipelock ab --source`: two kernels built from one real tree (Debian's
//! linux-source-6.1, which `cargo xtask test` unpacks and passes in
//! `PIPELOCK_AB_SOURCE`, with a build cache in `PIPELOCK_AB_BUILD_CACHE`),
//! A as it is and B with the patch in test-data that drops
//! `rd_wait.lock` from pipe_read/pipe_write. Nobody here decided the
//! answer: the tree's code takes that lock three times per write+read
//! pair and the patched code once. The two images it built boot again as
//! `--kernel` paths. Then what can go wrong, each one line and no kernel
//! left half-made in the cache.
use std::{
    process::Stdio,
    sync::OnceLock,
    time::{Duration, Instant},
};

use super::*;

pub(super) const PATCH: &str = "test-data/patches/pipe-mutex-instead-of-rd-wait-lock-6.1.patch";

/// Kernel A's image as `--source` built it, for the `--rev` test to find
/// again when it runs in the same process.
pub(super) static PLAIN_TREE_A: OnceLock<String> = OnceLock::new();

pub(super) fn inputs() -> Option<(String, PathBuf)> {
    let source = std::env::var("PIPELOCK_AB_SOURCE").ok()?;
    let cache = std::env::var("PIPELOCK_AB_BUILD_CACHE").ok()?;
    Some((source, PathBuf::from(cache)))
}

pub(super) fn skipped() -> Outcome {
    Outcome::Skipped(
        "no kernel tree given (PIPELOCK_AB_SOURCE and PIPELOCK_AB_BUILD_CACHE; `cargo xtask test` sets them)"
            .into(),
    )
}

pub(super) fn repo_file(path: &str) -> Result<String> {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    ensure!(file.is_file(), "{} missing", file.display());
    Ok(file.to_str().context("path")?.to_owned())
}

/// The kernels in a build cache: finished entries and anything partial.
pub(super) fn cached(cache: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(cache.join("kernels"))
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// `pipelock ab` with the kernels given by `choice` (`--source … --patch
/// …`, `--kernel … --kernel …`), running the traced pipe-throughput.
pub(super) fn ab_with(choice: &[&str], runs: &str) -> Result<(Option<i32>, String, String)> {
    let out = run(pipelock().arg("ab").args(choice).args([
        "--runs",
        runs,
        "--accel",
        "tcg",
        "--",
        "run",
        "pipe-throughput",
        "--trace",
        "--trace-mode",
        "fentry",
        "--duration",
        "1",
        "--passes",
        "1",
    ]))?;
    Ok((out.status.code(), text(&out.stdout), text(&out.stderr)))
}

/// `ab_with` that must succeed: its stdout and stderr.
pub(super) fn ab_ok(choice: &[&str], runs: &str) -> Result<(String, String)> {
    let (code, stdout, stderr) = ab_with(choice, runs)?;
    ensure!(
        code == Some(0),
        "ab {}: {code:?}: {}\n{stderr}",
        choice.join(" "),
        ab::error_line(&stderr)
    );
    Ok((stdout, stderr))
}

/// `ab`'s lines on how each kernel was had: built (in how long) or cached.
pub(super) fn build_lines(stderr: &str) -> String {
    stderr
        .lines()
        .filter(|l| l.contains(" built in ") || l.contains("from the cache"))
        .collect::<Vec<_>>()
        .join("; ")
}

fn ab_source(source: &str, cache: &Path, patch: &str, runs: &str) -> Result<(Option<i32>, String, String)> {
    let cache = cache.to_str().context("path")?;
    ab_with(
        &["--source", source, "--patch", patch, "--build-cache", cache],
        runs,
    )
}

/// Checks the rd_wait.lock row goes 3 → 1 (exact, marked) and the pipe
/// mutex's stays at 2 (exact, unmarked); returns the rd_wait row. A side
/// whose runs fell short by what the kernel skipped on the lock's path is
/// exact with a `†` and a line under the table naming those runs.
pub(super) fn rd_wait_3_to_1(stdout: &str) -> Result<Vec<String>> {
    let rd_metric = "pipe-rd-wait acquisitions per write+read pair";
    let mutex_metric = "pipe-mutex acquisitions per write+read pair";
    let rd = table_row(stdout, rd_metric)?;
    let mutex = table_row(stdout, mutex_metric)?;
    let exact = |row: &[String], metric: &str| -> Result<bool> {
        let daggers = row.iter().filter(|c| c.as_str() == "exact†").count();
        if daggers > 0 {
            let note = stdout
                .lines()
                .find(|l| l.starts_with(&format!("† {metric}: ")))
                .with_context(|| format!("{metric} is exact† with no line saying why:\n{stdout}"))?;
            println!("  {note}");
        }
        Ok(row.get(1).is_some_and(|c| c.starts_with("exact"))
            && row.iter().filter(|c| c.starts_with("exact")).count() == 3)
    };
    ensure!(
        rd[0] == "3.00" && exact(&rd, rd_metric)? && rd[3] == "*" && rd[5] == "1.00",
        "rd_wait.lock per pair, want 3.00 exact → 1.00 marked: {rd:?}\n{stdout}"
    );
    ensure!(
        mutex[0] == "2.00"
            && exact(&mutex, mutex_metric)?
            && !mutex.contains(&"*".to_owned())
            && mutex[4] == "2.00",
        "pipe mutex per pair, want 2.00 and 2.00 unmarked: {mutex:?}\n{stdout}"
    );
    Ok(rd)
}

/// The images of A and B, from `ab`'s "built in …: IMAGE (log: …)" or
/// "from the cache: IMAGE" lines.
pub(super) fn images(stderr: &str) -> Result<[String; 2]> {
    let image = |side: &str| -> Result<String> {
        let line = stderr
            .lines()
            .find(|l| l.starts_with(&format!("pipelock ab: {side} (")))
            .with_context(|| format!("no line for kernel {side} in:\n{stderr}"))?;
        let after = line
            .split_once(" from the cache: ")
            .or_else(|| line.split_once(": ").and_then(|(_, rest)| rest.split_once(": ")))
            .with_context(|| format!("no image in {line}"))?
            .1;
        Ok(after.split(" (log: ").next().unwrap_or(after).to_owned())
    };
    Ok([image("A")?, image("B")?])
}

/// The table's line for `metric`: its cells split on runs of spaces.
fn table_row(stdout: &str, metric: &str) -> Result<Vec<String>> {
    let line = stdout
        .lines()
        .find(|l| l.trim_end().ends_with(metric))
        .with_context(|| format!("no `{metric}` row in:\n{stdout}"))?;
    Ok(line
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
        .collect())
}

/// The seed thread's change, built and compared: `rd_wait.lock` 3 → 1 per
/// pair (exact, marked), the pipe mutex 2 and 2; then with an empty patch
/// (A from the cache, B the same kernel): no lock count marked.
fn ab_source_builds_the_patch_and_shows_rd_wait_3_to_1() -> Result<Outcome> {
    let Some((source, cache)) = inputs() else {
        return Ok(skipped());
    };
    let started = Instant::now();
    let (code, stdout, stderr) = ab_source(&source, &cache, &repo_file(PATCH)?, "3")?;
    ensure!(
        code == Some(0),
        "ab --source: {code:?}: {}\n{stderr}",
        ab::error_line(&stderr)
    );
    let rd = rd_wait_3_to_1(&stdout)?;
    ensure!(
        stdout.contains("pipe-throughput throughput (lps): ") && stdout.contains("95% CI"),
        "no verdict on the workload's figure:\n{stdout}"
    );
    // The patch changes the bodies of pipe_read() and pipe_write(), both
    // called through the pipe's file_operations, which every write+read
    // pair of the workload enters: counted by a kprobe each in B.
    let changes: Vec<&str> = stdout.lines().filter(|l| l.starts_with("B changes ")).collect();
    let entered = |function: &str| -> Option<u64> {
        changes
            .iter()
            .find_map(|l| l.strip_prefix(&format!("B changes {function}() in fs/pipe.c: entered ")))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
    };
    ensure!(
        changes.len() == 2
            && entered("pipe_read").is_some_and(|n| n > 1000)
            && entered("pipe_write").is_some_and(|n| n > 1000),
        "the functions the patch changes, and their calls in B: {changes:?}\n{stdout}"
    );
    println!("  {}", changes.join("; "));
    println!(
        "  3 runs each, {:.0} s: {}",
        started.elapsed().as_secs_f64(),
        build_lines(&stderr)
    );
    println!("  {}", rd.join(" "));

    // The same two images as `--kernel` paths: a bzImage built from a
    // tree, no modules and no Debian initramfs pieces, boots as it is.
    let [image_a, image_b] = images(&stderr)?;
    for image in [&image_a, &image_b] {
        ensure!(Path::new(image).is_file(), "{image} is not a file:\n{stderr}");
    }
    let _ = PLAIN_TREE_A.set(image_a.clone());
    // Two runs: a lone run that skipped on a count's path is a lower bound.
    let (stdout, _) = ab_ok(&["--kernel", &image_a, "--kernel", &image_b], "2")?;
    rd_wait_3_to_1(&stdout)?;
    println!("  the built images as --kernel paths: rd_wait.lock 3.00 → 1.00 again");

    let empty = scratch("empty.patch");
    fs::write(&empty, "")?;
    let started = Instant::now();
    let (code, stdout, stderr) = ab_source(&source, &cache, empty.to_str().context("path")?, "2")?;
    let _ = fs::remove_file(&empty);
    ensure!(
        code == Some(0),
        "ab with an empty patch: {code:?}: {}",
        ab::error_line(&stderr)
    );
    ensure!(
        stderr
            .lines()
            .any(|l| l.starts_with("pipelock ab: A (") && l.contains("from the cache")),
        "A was built again instead of taken from the cache:\n{stderr}"
    );
    ensure!(
        !stderr.contains("building A"),
        "a cached A was rebuilt:\n{stderr}"
    );
    for metric in [
        "pipe-rd-wait acquisitions per write+read pair",
        "pipe-mutex acquisitions per write+read pair",
    ] {
        let row = table_row(&stdout, metric)?;
        ensure!(
            !row.contains(&"*".to_owned()),
            "{metric} marked as changed by an empty patch: {row:?}"
        );
    }
    println!(
        "  empty patch: no lock change, A from the cache, {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(Outcome::Passed)
}
register!(Host ab_source_builds_the_patch_and_shows_rd_wait_3_to_1);

/// A patch that does not apply and one that does not compile: one line
/// naming the file (and hunk, or the compiler's error and the log), exit
/// 1, and the cache holding what it held before. A is cached by then.
fn ab_source_bad_patches_are_one_line_and_cache_nothing() -> Result<Outcome> {
    let Some((source, cache)) = inputs() else {
        return Ok(skipped());
    };
    let before = cached(&cache);
    let stale = scratch("stale.patch");
    fs::write(
        &stale,
        "--- a/fs/pipe.c\n+++ b/fs/pipe.c\n@@ -322,3 +322,3 @@\n this line is not in fs/pipe.c\n-nor this one\n+but this\n",
    )?;
    let (code, _, stderr) = ab_source(&source, &cache, stale.to_str().context("path")?, "1")?;
    let line = ab::error_line(&stderr).to_owned();
    ensure!(
        code == Some(1) && line.contains("does not apply") && line.contains("fs/pipe.c: hunk #1"),
        "a patch that does not apply: {code:?}: {line}\n{stderr}"
    );
    ensure!(
        cached(&cache) == before,
        "cache changed: {:?} → {:?}",
        before,
        cached(&cache)
    );
    println!("  {line}");

    let broken = scratch("broken.patch");
    let original = fs::read_to_string(Path::new(&source).join("fs/pipe.c"))?;
    // One line of junk between two of the tree's own lines.
    let context: Vec<&str> = original.lines().skip(99).take(2).collect();
    fs::write(
        &broken,
        format!(
            "--- a/fs/pipe.c\n+++ b/fs/pipe.c\n@@ -100,2 +100,3 @@\n {}\n+this is not C;\n {}\n",
            context[0], context[1]
        ),
    )?;
    let (code, _, stderr) = ab_source(&source, &cache, broken.to_str().context("path")?, "1")?;
    let line = ab::error_line(&stderr).to_owned();
    ensure!(
        code == Some(1)
            && line.contains("kernel B does not build")
            && line.contains("fs/pipe.c")
            && line.contains("error:")
            && line.contains("build log: "),
        "a patch that does not compile: {code:?}: {line}\n{stderr}"
    );
    ensure!(
        cached(&cache) == before,
        "cache changed: {:?} → {:?}",
        before,
        cached(&cache)
    );
    let again = fs::read_to_string(Path::new(&source).join("fs/pipe.c"))?;
    ensure!(again == original, "the user's tree was written to");
    println!("  {line}");
    let _ = fs::remove_file(&stale);
    let _ = fs::remove_file(&broken);
    Ok(Outcome::Passed)
}
register!(Host ab_source_bad_patches_are_one_line_and_cache_nothing);

/// A missing build tool (pahole, from dwarves) and a cache on a file
/// system with too little space: one line naming the package or the
/// space, before anything is built.
fn ab_source_missing_tools_and_space_are_named() -> Result<Outcome> {
    let Some((source, _)) = inputs() else {
        return Ok(skipped());
    };
    let patch = repo_file(PATCH)?;
    // A PATH with every tool a build needs but pahole.
    let bin = scratch("ab-bin");
    fs::create_dir_all(&bin)?;
    for tool in [
        "make", "gcc", "bc", "bison", "flex", "patch", "perl", "cp", "tar", "git",
    ] {
        if let Some(found) = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
        {
            let _ = std::os::unix::fs::symlink(found, bin.join(tool));
        }
    }
    // An empty cache of its own: kernels already built (by another test,
    // or an earlier run into the default cache) need no tool.
    let empty = scratch("ab-empty-cache");
    let _ = fs::remove_dir_all(&empty);
    let out = run(pipelock()
        .args([
            "ab",
            "--source",
            &source,
            "--patch",
            &patch,
            "--build-cache",
            empty.to_str().context("path")?,
            "--",
            "run",
            "pipe-throughput",
        ])
        .env("PATH", &bin))?;
    ensure!(cached(&empty).is_empty(), "the cache got {:?}", cached(&empty));
    let _ = fs::remove_dir_all(&empty);
    let line = ab::error_line(&text(&out.stderr)).to_owned();
    ensure!(
        out.status.code() == Some(1) && line.contains("apt-get install dwarves"),
        "without pahole: {:?}: {line}",
        out.status.code()
    );
    println!("  {line}");
    let _ = fs::remove_dir_all(&bin);

    let small = scratch("ab-small-cache");
    fs::create_dir_all(&small)?;
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64m", "tmpfs"])
        .arg(&small)
        .status()?
        .success();
    ensure!(mounted, "cannot mount a small tmpfs at {}", small.display());
    let out = run(pipelock().args([
        "ab",
        "--source",
        &source,
        "--patch",
        &patch,
        "--build-cache",
        small.to_str().context("path")?,
        "--",
        "run",
        "pipe-throughput",
    ]));
    let leftovers: Vec<_> = fs::read_dir(&small)?
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .collect();
    let _ = Command::new("umount").arg(&small).status();
    let out = out?;
    let line = ab::error_line(&text(&out.stderr)).to_owned();
    ensure!(
        out.status.code() == Some(1) && line.contains("too little disk space") && line.contains("free"),
        "a 64 MiB cache: {:?}: {line}",
        out.status.code()
    );
    ensure!(leftovers.is_empty(), "the full cache got {leftovers:?}");
    println!("  {line}");
    let _ = fs::remove_dir_all(&small);
    Ok(Outcome::Passed)
}
register!(Host ab_source_missing_tools_and_space_are_named);

/// Ctrl-C during a cold build: make and its compilers stop, pipelock says
/// so and exits 130, and the cache has no kernel, finished or partial.
fn ab_source_ctrl_c_during_a_build_caches_nothing() -> Result<Outcome> {
    let Some((source, _)) = inputs() else {
        return Ok(skipped());
    };
    let cache = scratch("ab-interrupted-cache");
    let _ = fs::remove_dir_all(&cache);
    let stderr_file = scratch("ab-interrupted.err");
    let mut child = pipelock()
        .args([
            "ab",
            "--source",
            &source,
            "--patch",
            &repo_file(PATCH)?,
            "--build-cache",
        ])
        .arg(&cache)
        .args(["--", "run", "pipe-throughput"])
        .stdout(Stdio::null())
        .stderr(fs::File::create(&stderr_file)?)
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(300);
    while !fs::read_to_string(&stderr_file)?.contains("building A") {
        ensure!(
            Instant::now() < deadline,
            "no build started: {}",
            fs::read_to_string(&stderr_file)?
        );
        ensure!(
            child.try_wait()?.is_none(),
            "ab ended early: {}",
            fs::read_to_string(&stderr_file)?
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(15));
    // SAFETY: signals the child this test started.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let status = child.wait()?;
    let stderr = fs::read_to_string(&stderr_file)?;
    ensure!(status.code() == Some(130), "after Ctrl-C: {status}\n{stderr}");
    ensure!(
        stderr.contains("interrupted during a kernel build"),
        "no word of it:\n{stderr}"
    );
    ensure!(cached(&cache).is_empty(), "the cache kept {:?}", cached(&cache));
    // No compiler of that build outlives it.
    std::thread::sleep(Duration::from_secs(1));
    let mut left = 0;
    for entry in fs::read_dir("/proc")?.filter_map(Result::ok) {
        if fs::read(entry.path().join("cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(cache.to_string_lossy().as_ref()))
        {
            left += 1;
        }
    }
    ensure!(left == 0, "{left} process(es) of the build still run");
    let _ = fs::remove_dir_all(&cache);
    let _ = fs::remove_file(&stderr_file);
    println!("  stopped within the build, exit 130, nothing cached");
    Ok(Outcome::Passed)
}
register!(Host ab_source_ctrl_c_during_a_build_caches_nothing);
