//! `pipelock ab --source DIR --rev A --rev B`: the rd_wait change as two
//! commits of a git repository made from the same tree, built from the
//! commits and compared.
use std::time::Instant;

use super::{
    ab_source::{
        PATCH, PLAIN_TREE_A, ab_ok, ab_with, build_lines, cached, images, inputs, rd_wait_3_to_1, repo_file,
        skipped,
    },
    *,
};

fn git(repo: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args([
            "-c",
            "user.name=pipelock test",
            "-c",
            "user.email=test@pipelock.invalid",
        ])
        .args(args)
        // Fixed dates: the same tree and patch give the same commits, so a
        // second run finds their kernels in the cache.
        .env("GIT_AUTHOR_DATE", "2023-01-07T00:00:00Z")
        .env("GIT_COMMITTER_DATE", "2023-01-07T00:00:00Z")
        .output()?;
    ensure!(
        out.status.success(),
        "git {}: {}",
        args.join(" "),
        text(&out.stderr).trim()
    );
    Ok(text(&out.stdout).trim().to_owned())
}

/// A git repository of the tree beside the build cache: `base` is the
/// tree, `patched` the test-data patch on it, HEAD at `base`. The files
/// are hard links into the tree; git here writes only its index and
/// objects, never a file of the tree.
fn git_tree(source: &str, cache: &Path) -> Result<PathBuf> {
    let repo = cache.with_file_name("linux-source-6.1-git");
    if repo.join(".git").is_dir() && git(&repo, &["rev-parse", "--verify", "--quiet", "patched"]).is_ok() {
        return Ok(repo);
    }
    let _ = fs::remove_dir_all(&repo);
    let copied = Command::new("cp").arg("-al").arg(source).arg(&repo).status()?;
    ensure!(copied.success(), "cp -al {source} {}", repo.display());
    git(&repo, &["init", "-q"])?;
    // Debian's tree ignores everything at its top (its packaging's rule).
    git(&repo, &["add", "-f", "."])?;
    git(&repo, &["commit", "-q", "-m", "linux-source-6.1"])?;
    git(&repo, &["tag", "base"])?;
    git(&repo, &["apply", "--cached", &repo_file(PATCH)?])?;
    git(
        &repo,
        &[
            "commit",
            "-q",
            "-m",
            "pipe: use the pipe mutex instead of rd_wait.lock",
        ],
    )?;
    git(&repo, &["tag", "patched"])?;
    git(&repo, &["reset", "-q", "base"])?;
    Ok(repo)
}

/// `--rev base --rev patched` on a git tree holding the same change as two
/// commits: `base` is checked out and clean, so kernel A is the work
/// tree's, the very kernel `--source` built of the same files; B is
/// `git diff base patched` on A's objects; rd_wait.lock 3 → 1 again, and
/// the repository's HEAD and status as they were; the same revs again
/// build nothing. (Unpacking a commit that is not checked out is the
/// unit test of `tree::export`.)
fn ab_source_revs_of_a_git_tree_show_rd_wait_3_to_1() -> Result<Outcome> {
    let Some((source, cache)) = inputs() else {
        return Ok(skipped());
    };
    let started = Instant::now();
    let repo = git_tree(&source, &cache)?;
    let made = started.elapsed();
    let head = git(&repo, &["rev-parse", "HEAD"])?;
    let status = git(&repo, &["status", "--porcelain", "--untracked-files=no"])?;
    let cache_arg = cache.to_str().context("path")?;
    let repo_arg = repo.to_str().context("path")?;
    let revs = [
        "--source",
        repo_arg,
        "--rev",
        "base",
        "--rev",
        "patched",
        "--build-cache",
        cache_arg,
    ];
    let started = Instant::now();
    let (stdout, stderr) = ab_ok(&revs, "2")?;
    let rd = rd_wait_3_to_1(&stdout)?;
    ensure!(
        stdout.contains("linux-source-6.1-git base") && stdout.contains("linux-source-6.1-git patched"),
        "the kernels are not named by their revs:\n{stdout}"
    );
    ensure!(
        git(&repo, &["rev-parse", "HEAD"])? == head
            && git(&repo, &["status", "--porcelain", "--untracked-files=no"])? == status,
        "ab moved HEAD or changed files of the repository"
    );
    println!(
        "  repository made in {:.0} s; 2 runs each, {:.0} s: {}",
        made.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        build_lines(&stderr)
    );
    println!("  {}", rd.join(" "));
    let [image_a, _] = images(&stderr)?;
    match PLAIN_TREE_A.get() {
        Some(plain) => {
            ensure!(
                *plain == image_a,
                "commit base, checked out, is not the --source tree's kernel: {image_a}, not {plain}"
            );
            println!("  A is the kernel --source built of the same files: {image_a}");
        }
        None => {
            println!("  not checked: A is the --source tree's kernel (its test did not run in this process)")
        }
    }

    // The same revs again: both kernels from the cache, nothing built.
    let (stdout, stderr) = ab_ok(&revs, "2")?;
    ensure!(
        !stderr.contains("building") && stderr.matches("from the cache").count() == 2,
        "the same revs were built again:\n{stderr}"
    );
    rd_wait_3_to_1(&stdout)?;
    println!("  the same revs again: both kernels from the cache");

    // A rev that is not a commit: one line naming it, nothing built.
    let before = cached(&cache);
    let (code, _, stderr) = ab_with(
        &[
            "--source",
            repo_arg,
            "--rev",
            "base",
            "--rev",
            "no-such-rev",
            "--build-cache",
            cache_arg,
        ],
        "1",
    )?;
    let line = ab::error_line(&stderr).to_owned();
    ensure!(
        code == Some(1) && line.contains("--rev no-such-rev: not a commit"),
        "an unknown rev: {code:?}: {line}"
    );
    ensure!(cached(&cache) == before, "the cache changed");
    println!("  {line}");
    Ok(Outcome::Passed)
}
register!(Host ab_source_revs_of_a_git_tree_show_rd_wait_3_to_1);
