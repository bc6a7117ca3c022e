//! The kernel tree a build starts from: what identifies it (for the
//! cache), the tools building it needs, and the patches applied to it.
use std::{
    fs,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use sha2::{Digest as _, Sha256};

use crate::{Error, Result, io};

/// The tools a kernel build runs, each with the Debian package that has
/// it. Headers are looked for where Debian installs them.
const TOOLS: [(&str, &str); 8] = [
    ("make", "make"),
    ("gcc", "gcc"),
    ("bc", "bc"),
    ("bison", "bison"),
    ("flex", "flex"),
    ("pahole", "dwarves"),
    ("patch", "patch"),
    ("perl", "perl"),
];
const HEADERS: [(&str, &str); 2] = [
    ("/usr/include/libelf.h", "libelf-dev"),
    ("/usr/include/openssl/opensslv.h", "libssl-dev"),
];

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path)
            .any(|dir| fs::metadata(dir.join(tool)).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0))
    })
}

/// The Debian packages of the build tools this machine lacks (git too when
/// `git` is needed), in the order they are checked.
pub fn missing_packages(git: bool) -> Vec<&'static str> {
    let mut missing: Vec<&str> = TOOLS
        .iter()
        .chain(git.then_some(&("git", "git")))
        .filter(|(tool, _)| !on_path(tool))
        .map(|(_, package)| *package)
        .collect();
    missing.extend(
        HEADERS
            .iter()
            .filter(|(header, _)| !Path::new(header).is_file())
            .map(|(_, package)| *package),
    );
    missing
}

/// Whether `dir` looks like the top of a kernel tree.
pub fn is_kernel_tree(dir: &Path) -> bool {
    dir.join("Makefile").is_file()
        && dir.join("scripts/kconfig/merge_config.sh").is_file()
        && dir.join("arch/x86").is_dir()
}

/// What identifies a tree as it is on disk: every file's path, size and
/// modification time (not its bytes: a kernel tree is a gigabyte), `.git`
/// left out. Editing any file, or unpacking another version, changes it.
pub fn identity(dir: &Path) -> Result<String> {
    let mut entries = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(rel) = pending.pop() {
        let here = dir.join(&rel);
        let listing = fs::read_dir(&here).map_err(io(format!("cannot read {}", here.display())))?;
        for entry in listing {
            let entry = entry.map_err(io(format!("cannot read {}", here.display())))?;
            let name = entry.file_name();
            if rel.as_os_str().is_empty() && name == ".git" {
                continue;
            }
            let path = rel.join(&name);
            let meta = entry
                .metadata()
                .map_err(io(format!("cannot stat {}", dir.join(&path).display())))?;
            if meta.is_dir() {
                pending.push(path);
            } else {
                entries.push((path, meta.len(), meta.mtime(), meta.mtime_nsec()));
            }
        }
    }
    entries.sort_unstable();
    let mut hash = Sha256::new();
    for (path, len, secs, nanos) in &entries {
        hash.update(path.as_os_str().as_encoded_bytes());
        hash.update(format!("\0{len} {secs}.{nanos}\n").as_bytes());
    }
    Ok(hex(&hash.finalize()))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The full commit id `rev` names in the git tree `dir`.
pub fn commit(dir: &Path, rev: &str) -> Result<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["rev-parse", "--verify", "--quiet"])
        .arg(format!("{rev}^{{commit}}"))
        .output()
        .map_err(io("cannot run git (apt-get install git)"))?;
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || id.is_empty() {
        return Err(Error::Invalid(format!(
            "--rev {rev}: not a commit of the git tree {}",
            dir.display()
        )));
    }
    Ok(id)
}

/// Whether commit `id` is what the work tree of `dir` holds: HEAD is `id`
/// and no file differs from it or is new. Such a tree can be built as it
/// is, under the tree's own identity, so a commit and the same files
/// given as `--source DIR` share their kernels in the cache.
pub fn is_checked_out(dir: &Path, id: &str) -> bool {
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    git(&["rev-parse", "--verify", "--quiet", "HEAD"]).is_some_and(|head| head == id)
        && git(&["status", "--porcelain", "--untracked-files=all"]).is_some_and(|s| s.is_empty())
}

/// The changes from commit `a` to commit `b`, as a patch.
pub fn diff(dir: &Path, a: &str, b: &str) -> Result<Vec<u8>> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        // Full blob ids: the abbreviated ones grow with the repository,
        // and the patch is part of the cache key. Fixed prefixes and no
        // renames: what `patch -p1` reads, whatever the user's git config.
        .args([
            "diff",
            "--no-color",
            "--no-ext-diff",
            "--full-index",
            "--no-renames",
            "--src-prefix=a/",
            "--dst-prefix=b/",
            a,
            b,
        ])
        .output()
        .map_err(io("cannot run git (apt-get install git)"))?;
    if !out.status.success() {
        return Err(Error::Command {
            command: format!("git diff {a} {b}"),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(out.stdout)
}

/// Unpacks commit `rev` of the git tree `dir` into `dest`.
pub fn export(dir: &Path, rev: &str, dest: &Path) -> Result<()> {
    fs::create_dir_all(dest).map_err(io(format!("cannot create {}", dest.display())))?;
    let mut archive = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["archive", "--format=tar", rev])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(io("cannot run git archive"))?;
    let stdout = archive
        .stdout
        .take()
        .ok_or_else(|| Error::Invalid("git archive: no output".into()))?;
    let untar = Command::new("tar")
        .arg("-x")
        .arg("-C")
        .arg(dest)
        .stdin(stdout)
        .status()
        .map_err(io("cannot run tar"))?;
    let archived = archive.wait().map_err(io("git archive"))?;
    if !archived.success() || !untar.success() {
        return Err(Error::Command {
            command: format!("git archive {rev} | tar -x"),
            detail: format!("git {archived}, tar {untar}"),
        });
    }
    Ok(())
}

/// A copy of `dir` at `dest` that costs no space: hard links, which a
/// patch applied to the copy breaks (GNU patch writes a new file), so the
/// user's tree is never written to. Falls back to a real copy across
/// file systems.
pub fn link_copy(dir: &Path, dest: &Path) -> Result<()> {
    let copy = |flags: &str| {
        Command::new("cp")
            .arg(flags)
            .arg(dir)
            .arg(dest)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !copy("-al") {
        let _ = fs::remove_dir_all(dest);
        if !copy("-a") {
            return Err(Error::Invalid(format!(
                "cannot copy {} to {}",
                dir.display(),
                dest.display()
            )));
        }
    }
    // Kernel version strings say `-dirty` of a tree with .git and changes.
    let _ = fs::remove_dir_all(dest.join(".git"));
    Ok(())
}

/// Why `patch` would not apply to `dir`, in one line: the file and hunk
/// that fail. `name` is the patch as the user named it.
pub fn check_patch(dir: &Path, patch: &Path, name: &str) -> Result<()> {
    let out = Command::new("patch")
        .args(["-p1", "--dry-run", "-f", "-d"])
        .arg(dir)
        .arg("-i")
        .arg(patch)
        .output()
        .map_err(io("cannot run patch"))?;
    if out.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Err(Error::Invalid(format!(
        "--patch {name} does not apply: {}",
        patch_failure(&text)
    )))
}

/// GNU patch's complaints, summed up: `fs/pipe.c: hunk #2 (at line 511)`.
pub fn patch_failure(output: &str) -> String {
    let mut file = String::new();
    let mut failures = Vec::new();
    for line in output.lines() {
        if let Some(f) = line
            .strip_prefix("checking file ")
            .or_else(|| line.strip_prefix("patching file "))
        {
            file = f.trim().to_owned();
        } else if let Some(rest) = line.strip_prefix("Hunk #") {
            if let Some((number, at)) = rest.split_once(" FAILED at ") {
                failures.push(format!(
                    "{file}: hunk #{number} (at line {}) does not match",
                    at.trim_end_matches('.')
                ));
            }
        } else if line.starts_with("can't find file to patch") {
            let named = output
                .lines()
                .filter_map(|l| l.strip_prefix("|+++ ").or_else(|| l.strip_prefix("|--- ")))
                .map(|f| f.split_whitespace().next().unwrap_or(f))
                .map(|f| f.split_once('/').map_or(f, |(_, rest)| rest))
                .next_back()
                .unwrap_or("a file");
            failures.push(format!("{named}: no such file in the tree"));
        } else if line.contains("Only garbage was found") {
            failures.push("it is not a patch (no diff hunks in it)".to_owned());
        }
    }
    if failures.is_empty() {
        output
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("patch failed")
            .trim()
            .to_owned()
    } else {
        failures.join("; ")
    }
}

/// Applies (or, `reverse`, takes back) `patch` in `dir`.
pub fn apply(dir: &Path, patch: &Path, reverse: bool) -> Result<()> {
    let mut cmd = Command::new("patch");
    cmd.args(["-p1", "-f", "-s", "--no-backup-if-mismatch", "-d"])
        .arg(dir);
    if reverse {
        cmd.arg("-R");
    }
    crate::run(cmd.arg("-i").arg(patch))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_hunk_is_named_with_its_file() {
        let out = "checking file fs/pipe.c\nHunk #1 succeeded at 322.\nHunk #2 FAILED at 511.\n1 out of 2 hunks FAILED\n";
        assert_eq!(
            patch_failure(out),
            "fs/pipe.c: hunk #2 (at line 511) does not match"
        );
        let missing = "can't find file to patch at input line 3\nThe text leading up to this was:\n\
                       --------------------------\n|--- a/fs/nope.c\n|+++ b/fs/nope.c\n\
                       --------------------------\nNo file to patch.  Skipping patch.\n1 out of 1 hunk ignored\n";
        assert_eq!(patch_failure(missing), "fs/nope.c: no such file in the tree");
        assert_eq!(
            patch_failure("patch: **** Only garbage was found in the patch input.\n"),
            "it is not a patch (no diff hunks in it)"
        );
    }

    #[test]
    fn a_trees_identity_follows_its_files() {
        let dir = std::env::temp_dir().join(format!("pipelock-tree-{}", std::process::id()));
        fs::create_dir_all(dir.join("fs")).unwrap();
        fs::write(dir.join("fs/pipe.c"), "a").unwrap();
        let first = identity(&dir).unwrap();
        assert_eq!(identity(&dir).unwrap(), first);
        fs::write(dir.join("fs/pipe.c"), "ab").unwrap();
        assert_ne!(identity(&dir).unwrap(), first);
        fs::create_dir_all(dir.join(".git")).unwrap();
        let with_git = identity(&dir).unwrap();
        fs::write(dir.join(".git/index"), "x").unwrap();
        assert_eq!(identity(&dir).unwrap(), with_git, ".git is not the tree");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// An empty scratch repository named `name` with an `fs/` directory,
    /// and a `git` that must succeed in it.
    fn scratch_repo(name: &str) -> (PathBuf, impl Fn(&[&str])) {
        let dir = std::env::temp_dir().join(format!("pipelock-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("fs")).unwrap();
        let at = dir.clone();
        let git = move |args: &[&str]| {
            let out = Command::new("git")
                .arg("-C")
                .arg(&at)
                .args(["-c", "user.name=t", "-c", "user.email=t@t.invalid"])
                .args(args)
                .output()
                .unwrap();
            assert!(out.status.success(), "git {args:?}");
        };
        (dir, git)
    }

    #[test]
    fn a_revs_patch_is_the_same_whatever_the_users_git_config() {
        let (dir, git) = scratch_repo("revs");
        git(&["init", "-q"]);
        fs::write(dir.join("fs/pipe.c"), "one\n").unwrap();
        git(&["add", "."]);
        git(&["commit", "-q", "-m", "a"]);
        git(&["tag", "a"]);
        fs::rename(dir.join("fs/pipe.c"), dir.join("fs/pipe2.c")).unwrap();
        fs::write(dir.join("fs/pipe2.c"), "one\n").unwrap();
        git(&["add", "-A"]);
        git(&["commit", "-q", "-m", "b"]);
        git(&["tag", "b"]);
        let plain = diff(&dir, "a", "b").unwrap();
        for (key, value) in [
            ("core.abbrev", "4"),
            ("diff.noprefix", "true"),
            ("diff.renames", "copies"),
            ("diff.mnemonicPrefix", "true"),
        ] {
            git(&["config", key, value]);
        }
        let configured = diff(&dir, "a", "b").unwrap();
        let text = String::from_utf8(configured.clone()).unwrap();
        assert_eq!(plain, configured, "{text}");
        assert!(
            text.contains("--- a/fs/pipe.c") && text.contains("+++ b/fs/pipe2.c"),
            "{text}"
        );
        let index = text.lines().find(|l| l.starts_with("index ")).unwrap();
        assert!(index.len() > 80, "full blob ids: {index}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_commit_is_checked_out_only_in_a_clean_tree_at_it() {
        let (dir, git) = scratch_repo("checkout");
        git(&["init", "-q"]);
        fs::write(dir.join("fs/pipe.c"), "one\n").unwrap();
        git(&["add", "."]);
        git(&["commit", "-q", "-m", "a"]);
        git(&["tag", "a"]);
        fs::write(dir.join("fs/pipe.c"), "two\n").unwrap();
        git(&["commit", "-q", "-am", "b"]);
        let (a, b) = (commit(&dir, "a").unwrap(), commit(&dir, "HEAD").unwrap());
        assert!(is_checked_out(&dir, &b));
        assert!(!is_checked_out(&dir, &a), "HEAD is b");
        fs::write(dir.join("fs/pipe.c"), "three\n").unwrap();
        assert!(!is_checked_out(&dir, &b), "a changed file");
        git(&["checkout", "-q", "fs/pipe.c"]);
        fs::write(dir.join("fs/new.c"), "").unwrap();
        assert!(!is_checked_out(&dir, &b), "a new file");
        fs::remove_file(dir.join("fs/new.c")).unwrap();
        assert!(is_checked_out(&dir, &b));

        // A commit that is not checked out is unpacked as it was.
        let dest = dir.with_extension("export");
        let _ = fs::remove_dir_all(&dest);
        export(&dir, &a, &dest).unwrap();
        assert_eq!(fs::read_to_string(dest.join("fs/pipe.c")).unwrap(), "one\n");
        assert!(!dest.join(".git").exists());
        fs::remove_dir_all(&dest).unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }
}
