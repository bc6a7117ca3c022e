//! Which kernels the VM tests boot (`xtask/vm-kernels.txt`) and fetching
//! Debian's with a private apt configuration, cached under target/vm.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use crate::{Error, Result, io};

fn invalid(why: String) -> Error {
    Error::Invalid(why)
}

#[derive(Debug)]
pub struct Kernel {
    pub name: String,
    pub source: Source,
    pub expected_program_types: String,
}

#[derive(Debug)]
pub enum Source {
    Apt { suite: String, glob: String },
    File(PathBuf),
}

/// Parses `vm-kernels.txt`: `NAME SOURCE EXPECTED` per line, `#` comments.
pub fn parse_kernel_list(text: &str) -> Result<Vec<Kernel>> {
    let mut kernels = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [name, source, expected] = fields[..] else {
            return Err(invalid(format!(
                "vm-kernels.txt:{}: want `NAME SOURCE EXPECTED-PROGRAM-TYPES`, got `{line}`",
                number + 1
            )));
        };
        let source = if let Some(path) = source.strip_prefix("file:") {
            Source::File(PathBuf::from(path))
        } else if let Some(rest) = source.strip_prefix("apt:") {
            let (suite, glob) = rest
                .split_once(':')
                .ok_or_else(|| invalid(format!("vm-kernels.txt:{}: want apt:SUITE:GLOB", number + 1)))?;
            Source::Apt {
                suite: suite.to_owned(),
                glob: glob.to_owned(),
            }
        } else {
            return Err(invalid(format!(
                "vm-kernels.txt:{}: source must start with apt: or file:",
                number + 1
            )));
        };
        for kind in expected.split(',') {
            if !["tracepoint", "tp_btf", "fentry", "kprobe"].contains(&kind) {
                return Err(invalid(format!(
                    "vm-kernels.txt:{}: unknown program type `{kind}`",
                    number + 1
                )));
            }
        }
        kernels.push(Kernel {
            name: name.to_owned(),
            source,
            expected_program_types: expected.to_owned(),
        });
    }
    Ok(kernels)
}

/// `*` matches any run of characters; everything else matches itself.
/// `--kernel 6.1` picks debian-6.1, not debian-6.12: a selector matches a
/// whole name or a whole `-`-separated tail of it (`6.1`, `debian-6.1`).
pub fn selects(name: &str, selector: &str) -> bool {
    name == selector
        || name
            .strip_suffix(selector)
            .is_some_and(|head| head.ends_with('-'))
}

pub fn glob_match(glob: &str, text: &str) -> bool {
    match glob.split_once('*') {
        None => glob == text,
        Some((prefix, rest)) => {
            let Some(text) = text.strip_prefix(prefix) else {
                return false;
            };
            (0..=text.len()).any(|skip| text.is_char_boundary(skip) && glob_match(rest, &text[skip..]))
        }
    }
}

/// Orders `6.1.0-9` before `6.1.0-57`: digit runs compare as numbers.
pub fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn chunks(s: &str) -> Vec<(u64, String)> {
        let mut out = Vec::new();
        let mut rest = s;
        while !rest.is_empty() {
            let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            if digits > 0 {
                out.push((rest[..digits].parse().unwrap_or(u64::MAX), String::new()));
                rest = &rest[digits..];
            } else {
                let text = rest.len() - rest.trim_start_matches(|c: char| !c.is_ascii_digit()).len();
                out.push((0, rest[..text].to_owned()));
                rest = &rest[text..];
            }
        }
        out
    }
    chunks(a).cmp(&chunks(b))
}

/// apt with its own sources list and state directory: the system's apt
/// configuration is neither read nor changed.
pub struct PrivateApt {
    dir: PathBuf,
}

impl PrivateApt {
    pub fn new(dir: &Path) -> Self {
        Self { dir: dir.to_owned() }
    }

    fn options(&self) -> Vec<String> {
        let d = self.dir.display();
        vec![
            format!("-oDir::Etc::SourceList={d}/sources.list"),
            "-oDir::Etc::SourceParts=/dev/null".to_owned(),
            format!("-oDir::State={d}/state"),
            format!("-oDir::State::status={d}/state/status"),
            format!("-oDir::Cache={d}/cache"),
            // Downloads land in our folder, which the _apt sandbox user cannot write.
            "-oAPT::Sandbox::User=root".to_owned(),
        ]
    }

    /// (Re)reads the package lists at most once a day. A release name (`bookworm`)
    /// brings its -updates and -security suites, where kernel updates land.
    fn update(&self, suites: &[&str]) -> Result<()> {
        let mut sources = String::new();
        for suite in suites {
            let mut all = vec![(*suite).to_owned()];
            if !suite.contains('-') {
                all.extend([format!("{suite}-updates"), format!("{suite}-security")]);
            }
            for suite in all {
                let archive = if suite.ends_with("-security") {
                    "debian-security"
                } else {
                    "debian"
                };
                sources.push_str(&format!(
                    "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
                     http://deb.debian.org/{archive} {suite} main\n"
                ));
            }
        }
        let sources_path = self.dir.join("sources.list");
        let stamp = self.dir.join("state/updated");
        let fresh = fs::read_to_string(&sources_path).is_ok_and(|s| s == sources)
            && fs::metadata(&stamp)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|age| age < Duration::from_secs(86_400)));
        if fresh {
            return Ok(());
        }
        let dir = || io(format!("cannot prepare {}", self.dir.display()));
        fs::create_dir_all(self.dir.join("state/lists/partial")).map_err(dir())?;
        fs::create_dir_all(self.dir.join("cache/archives/partial")).map_err(dir())?;
        fs::write(&sources_path, sources).map_err(dir())?;
        fs::write(self.dir.join("state/status"), "").map_err(dir())?;
        crate::run(
            Command::new("apt-get")
                .args(self.options())
                .args(["update", "-qq"]),
        )?;
        fs::write(stamp, "").map_err(dir())?;
        Ok(())
    }

    fn output(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("apt-cache")
            .args(self.options())
            .args(args)
            .output()
            .map_err(io("cannot start apt-cache"))?;
        if !out.status.success() {
            return Err(Error::Command {
                command: format!("apt-cache {args:?}"),
                detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The vmlinuz of the newest package matching `glob` in `suite`, cached by version.
    pub fn kernel_image(
        &self,
        suite: &str,
        glob: &str,
        cache: &Path,
        all_suites: &[&str],
    ) -> Result<PathBuf> {
        self.update(all_suites)?;
        if !all_suites.contains(&suite) {
            return Err(invalid(format!("suite {suite} is not among the sources")));
        }
        let prefix = glob.split('*').next().unwrap_or(glob);
        let package = self
            .output(&["pkgnames", prefix])?
            .lines()
            .filter(|name| glob_match(glob, name))
            .max_by(|a, b| natural_cmp(a, b))
            .map(str::to_owned)
            .ok_or_else(|| invalid(format!("no Debian package matches {glob} in {suite}")))?;
        let version = self
            .output(&["show", "--no-all-versions", &package])?
            .lines()
            .find_map(|l| l.strip_prefix("Version: ").map(str::to_owned))
            .ok_or_else(|| invalid(format!("apt-cache shows no version of {package}")))?;
        let dir = cache.join(format!("{package}_{version}"));
        let image = dir.join("vmlinuz");
        if image.is_file() {
            return Ok(image);
        }
        eprintln!("pipelock-vm: fetching {package} {version}");
        let staging = cache.join(format!(".download-{}", std::process::id()));
        fs::create_dir_all(&staging).map_err(io(format!("cannot create {}", staging.display())))?;
        crate::run(
            Command::new("apt-get")
                .args(self.options())
                .args(["download", "-qq"])
                .arg(format!("{package}={version}"))
                .current_dir(&staging),
        )?;
        let deb = fs::read_dir(&staging)
            .map_err(io(format!("cannot read {}", staging.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|e| e == "deb"))
            .ok_or_else(|| invalid("apt-get download left no .deb".to_owned()))?;
        let extracted = vmlinuz_of_deb(&deb, &staging.join("root"))?;
        fs::create_dir_all(&dir).map_err(io(format!("cannot create {}", dir.display())))?;
        fs::rename(&extracted, &image).map_err(io(format!("cannot move {}", extracted.display())))?;
        let _ = fs::remove_dir_all(&staging);
        Ok(image)
    }
}

/// Unpacks a kernel `.deb` into `into` and returns its `boot/vmlinuz-*`.
pub fn vmlinuz_of_deb(deb: &Path, into: &Path) -> Result<PathBuf> {
    crate::run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(into))?;
    fs::read_dir(into.join("boot"))
        .map_err(|_| {
            invalid(format!(
                "{} holds no boot/ directory: not a kernel package",
                deb.display()
            ))
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .ok_or_else(|| invalid(format!("{} holds no boot/vmlinuz-*", deb.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_kernel_list_parses() {
        let text = include_str!("../../xtask/vm-kernels.txt");
        let kernels = parse_kernel_list(text).unwrap();
        assert!(kernels.len() >= 3);
        assert!(kernels.iter().any(|k| k.name == "debian-6.18"));
    }

    #[test]
    fn bad_kernel_lines_are_named() {
        let err = parse_kernel_list("x apt:bookworm:linux-* tracepoint,bogus\n").unwrap_err();
        assert!(err.to_string().contains("vm-kernels.txt:1"), "{err}");
        assert!(parse_kernel_list("x ftp:foo tracepoint\n").is_err());
        assert!(parse_kernel_list("x\n").is_err());
        let k = parse_kernel_list("mine file:/boot/vmlinuz tp_btf # comment\n").unwrap();
        assert!(matches!(&k[0].source, Source::File(p) if p == Path::new("/boot/vmlinuz")));
    }

    #[test]
    fn a_kernel_selector_matches_whole_version_parts() {
        assert!(selects("debian-6.1", "6.1"));
        assert!(selects("debian-6.1", "debian-6.1"));
        assert!(!selects("debian-6.12", "6.1"));
        assert!(!selects("debian-6.18", "6.1"));
        assert!(selects("debian-6.18", "6.18"));
        assert!(!selects("debian-6.18", "18"));
    }

    #[test]
    fn globs_and_versions_pick_the_newest_kernel() {
        let glob = "linux-image-6.1.0-*-cloud-amd64-unsigned";
        assert!(glob_match(glob, "linux-image-6.1.0-57-cloud-amd64-unsigned"));
        assert!(!glob_match(glob, "linux-image-6.1.0-57-cloud-amd64-unsigned-dbg"));
        assert!(!glob_match(glob, "linux-image-6.12.1-cloud-amd64"));
        let names = [
            "linux-image-6.1.0-9-cloud",
            "linux-image-6.1.0-57-cloud",
            "linux-image-6.1.0-10-cloud",
        ];
        assert_eq!(
            names.iter().max_by(|a, b| natural_cmp(a, b)),
            Some(&"linux-image-6.1.0-57-cloud")
        );
        assert_eq!(natural_cmp("6.12.117", "6.12.99"), std::cmp::Ordering::Greater);
    }
}
