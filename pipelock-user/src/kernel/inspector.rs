//! Every fact pipelock reads about the running kernel goes through
//! [`KernelInspector`]. Its paths hang off one root directory: `/` on a live
//! system, a fixture tree captured from a real kernel in tests. Nothing here
//! loads programs or changes the system (see [`crate::bpf`] for that).
use std::{
    collections::HashSet,
    fs,
    path::{Path, PathBuf},
};

use super::{btf::KernelBtf, support::AttachSupport, symbols::KernelSymbols};
use crate::Error;

/// Kernel function names a captured fixture keeps from kallsyms: every family
/// pipelock hooks or may hook (the full list is ~200k lines and mostly noise).
const CAPTURED_SYMBOL_PARTS: &[&str] = &[
    "pipe",
    "splice",
    "do_tee",
    "mutex",
    "spin_",
    "wake_up",
    "wait",
    "lockref",
    "dput",
    "dget",
    "legitimize",
    "unlazy",
    "vfs_",
    "complete_walk",
];

/// The tracepoints whose presence a fixture records.
const CAPTURED_TRACEPOINTS: &[(&str, &str)] = &[("lock", "contention_begin"), ("lock", "contention_end")];

/// Where a captured tree records the live program-type checks.
const SUPPORT_FILE: &str = "pipelock-attach-support.txt";

/// The two places tracefs is found: its own mount, and the debugfs legacy path.
const TRACEFS_DIRS: [&str; 2] = ["sys/kernel/tracing", "sys/kernel/debug/tracing"];

/// debugfs's preemption models, the one in force in parentheses.
const PREEMPT_FILE: &str = "sys/kernel/debug/sched/preempt";

/// Reads kernel facts below a root directory.
#[derive(Clone, Debug)]
pub struct KernelInspector {
    root: PathBuf,
}

/// Text symbols from `/proc/kallsyms` (functions only; data symbols are not
/// there without `CONFIG_KALLSYMS_ALL`, so pipelock never relies on them).
#[derive(Clone, Debug, Default)]
pub struct Kallsyms {
    functions: HashSet<String>,
}

impl Kallsyms {
    pub fn parse(text: &str) -> Self {
        let functions = text
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_ascii_whitespace();
                let (_addr, kind, name) = (fields.next()?, fields.next()?, fields.next()?);
                matches!(kind, "t" | "T").then(|| name.to_owned())
            })
            .collect();
        Self { functions }
    }

    pub fn has_function(&self, name: &str) -> bool {
        self.functions.contains(name)
    }

    pub fn len(&self) -> usize {
        self.functions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.functions.is_empty()
    }
}

impl KernelInspector {
    /// An inspector of the running kernel.
    pub fn live() -> Self {
        Self::at("/")
    }

    /// An inspector whose `/` is `root` (a fixture tree in tests).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.root.join(relative)
    }

    fn read(&self, relative: &str) -> Result<String, Error> {
        let path = self.path(relative);
        fs::read_to_string(&path).map_err(Error::read(path))
    }

    /// `uname -r`.
    pub fn release(&self) -> Result<String, Error> {
        Ok(self.read("proc/sys/kernel/osrelease")?.trim().to_owned())
    }

    /// The kernel version as (major, minor, patch), parsed from the release.
    pub fn version(&self) -> Result<(u32, u32, u32), Error> {
        let release = self.release()?;
        Ok(parse_version(&release))
    }

    pub fn btf_path(&self) -> PathBuf {
        self.path("sys/kernel/btf/vmlinux")
    }

    pub fn has_btf(&self) -> bool {
        self.btf_path().is_file()
    }

    pub fn btf(&self) -> Result<KernelBtf, Error> {
        let path = self.btf_path();
        let btf = btf_rs::Btf::from_file(&path).map_err(|source| Error::Btf { path, source })?;
        Ok(KernelBtf { btf })
    }

    pub fn kallsyms(&self) -> Result<Kallsyms, Error> {
        Ok(Kallsyms::parse(&self.read("proc/kallsyms")?))
    }

    /// Every symbol with its address (zeros without privilege: then empty).
    pub fn symbols(&self) -> Result<KernelSymbols, Error> {
        Ok(KernelSymbols::parse(&self.read("proc/kallsyms")?))
    }

    /// The kprobe PMU exists only with `CONFIG_KPROBES`; aya attaches through it.
    pub fn has_kprobes(&self) -> bool {
        self.path("sys/bus/event_source/devices/kprobe/type").is_file()
    }

    /// Where tracefs is mounted below the root, if it is.
    pub fn tracefs(&self) -> Option<PathBuf> {
        TRACEFS_DIRS
            .iter()
            .map(|dir| self.path(dir))
            .find(|dir| dir.join("events").is_dir())
    }

    /// Program-type checks recorded with a captured tree, if any (a live
    /// kernel has none: they are made by loading programs, see `crate::bpf`).
    pub fn recorded_support(&self) -> Result<Option<AttachSupport>, Error> {
        let path = self.path(SUPPORT_FILE);
        if !path.is_file() {
            return Ok(None);
        }
        let text = self.read(SUPPORT_FILE)?;
        AttachSupport::from_text(&text)
            .map(Some)
            .ok_or_else(|| Error::Read {
                path,
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, "not an attach-support record"),
            })
    }

    /// The preemption model in force (`none`, `voluntary`, `full`, `lazy`),
    /// where debugfs says (`sched/preempt`, a kernel with dynamic
    /// preemption). It decides whether fentry programs can be preempted
    /// mid-run (see `model::notes::skipped_runs`).
    pub fn preemption(&self) -> Option<String> {
        let text = fs::read_to_string(self.path(PREEMPT_FILE)).ok()?;
        parse_preemption(&text)
    }

    /// Whether tracefs lists the tracepoint `category:name`.
    pub fn has_tracepoint(&self, category: &str, name: &str) -> bool {
        self.tracefs()
            .is_some_and(|dir| dir.join("events").join(category).join(name).join("id").is_file())
    }
}

impl KernelInspector {
    /// Copies the facts this inspector reads into `dest`, laid out as below `/`,
    /// so `KernelInspector::at(dest)` answers as this kernel does. This is how
    /// the test fixtures of real kernels are made (`pipelock probe --save-facts`).
    ///
    /// `support`, the live program-type checks, is recorded beside the facts.
    pub fn capture(&self, dest: &Path, support: Option<&AttachSupport>) -> Result<(), Error> {
        let write = |relative: &str, contents: &[u8]| -> Result<(), Error> {
            let path = dest.join(relative);
            if let Some(dir) = path.parent() {
                fs::create_dir_all(dir).map_err(Error::read(dir))?;
            }
            fs::write(&path, contents).map_err(Error::read(path))
        };
        write(
            "proc/sys/kernel/osrelease",
            self.read("proc/sys/kernel/osrelease")?.as_bytes(),
        )?;
        let kallsyms: String = self
            .read("proc/kallsyms")?
            .lines()
            .filter(|line| {
                let name = line.split_ascii_whitespace().nth(2).unwrap_or("");
                CAPTURED_SYMBOL_PARTS.iter().any(|part| name.contains(part))
            })
            .flat_map(|line| [line, "\n"])
            .collect();
        write("proc/kallsyms", kallsyms.as_bytes())?;
        if self.has_btf() {
            let btf = fs::read(self.btf_path()).map_err(Error::read(self.btf_path()))?;
            write("sys/kernel/btf/vmlinux", &btf)?;
        }
        if self.has_kprobes() {
            let kprobe_type = "sys/bus/event_source/devices/kprobe/type";
            write(kprobe_type, self.read(kprobe_type)?.as_bytes())?;
        }
        if let Some(tracefs) = self.tracefs() {
            for (category, name) in CAPTURED_TRACEPOINTS {
                let id = format!("events/{category}/{name}/id");
                if let Ok(value) = fs::read(tracefs.join(&id)) {
                    write(&format!("{}/{id}", TRACEFS_DIRS[0]), &value)?;
                }
            }
        }
        if let Ok(preempt) = fs::read(self.path(PREEMPT_FILE)) {
            write(PREEMPT_FILE, &preempt)?;
        }
        if let Some(support) = support {
            write(SUPPORT_FILE, support.to_text().as_bytes())?;
        }
        Ok(())
    }
}

/// `6.18.44-fc-v782` → (6, 18, 44); missing parts are 0.
pub fn parse_version(release: &str) -> (u32, u32, u32) {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|part| part.parse().unwrap_or(0));
    (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    )
}

/// `none voluntary full (lazy)` → `lazy`: debugfs lists the models and
/// puts the one in force in parentheses.
pub fn parse_preemption(text: &str) -> Option<String> {
    text.split_ascii_whitespace()
        .find_map(|word| word.strip_prefix('(')?.strip_suffix(')'))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preemption_in_force_is_the_one_in_parentheses() {
        assert_eq!(
            parse_preemption("none voluntary full (lazy) \n").as_deref(),
            Some("lazy")
        );
        assert_eq!(
            parse_preemption("none (voluntary) full \n").as_deref(),
            Some("voluntary")
        );
        assert_eq!(parse_preemption("none voluntary full\n"), None);
    }

    /// A captured tree answers `preemption` as the kernel it came from.
    #[test]
    fn the_preemption_model_is_captured_with_the_facts() {
        let scratch = std::env::temp_dir().join(format!("pipelock-preempt-{}", std::process::id()));
        let (live, captured) = (scratch.join("live"), scratch.join("captured"));
        let file = live.join(PREEMPT_FILE);
        fs::create_dir_all(file.parent().unwrap()).unwrap();
        fs::create_dir_all(live.join("proc/sys/kernel")).unwrap();
        fs::write(
            live.join("proc/sys/kernel/osrelease"),
            "6.18.15+deb13-cloud-amd64\n",
        )
        .unwrap();
        fs::write(live.join("proc/kallsyms"), "ffffffff81234560 t pipe_read\n").unwrap();
        fs::write(&file, "none voluntary full (lazy) \n").unwrap();
        KernelInspector::at(&live).capture(&captured, None).unwrap();
        let answer = KernelInspector::at(&captured).preemption();
        let _ = fs::remove_dir_all(&scratch);
        assert_eq!(answer.as_deref(), Some("lazy"));
    }

    #[test]
    fn kallsyms_keeps_text_symbols_only() {
        let syms = Kallsyms::parse(
            "ffffffff81000000 T _stext\n\
             ffffffff81234560 t pipe_read\n\
             ffffffff82000000 D pipefifo_fops\n\
             ffffffffc0000000 t some_fn\t[some_module]\n\
             garbage\n",
        );
        assert!(syms.has_function("pipe_read"));
        assert!(syms.has_function("_stext"));
        assert!(syms.has_function("some_fn"));
        assert!(!syms.has_function("pipefifo_fops"));
        assert_eq!(syms.len(), 3);
    }

    #[test]
    fn versions_parse_from_distro_releases() {
        assert_eq!(parse_version("6.1.0-44-cloud-amd64"), (6, 1, 0));
        assert_eq!(parse_version("6.12.57+deb12-cloud-amd64"), (6, 12, 57));
        assert_eq!(parse_version("6.18.44-fc-v782"), (6, 18, 44));
        assert_eq!(parse_version("weird"), (0, 0, 0));
    }
}
