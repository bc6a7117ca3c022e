//! Every fact pipelock reads about the running kernel goes through
//! [`KernelInspector`]. Its paths hang off one root directory: `/` on a live
//! system, a fixture tree captured from a real kernel in tests. Nothing here
//! loads programs or changes the system (see [`crate::ebpf`] for that).
use std::{
    collections::HashSet,
    fs,
    path::{Path, PathBuf},
};

use crate::{Error, attach::AttachSupport};

/// Kernel function names a captured fixture keeps from kallsyms: every family
/// pipelock hooks or may hook (the full list is ~200k lines and mostly noise).
const CAPTURED_SYMBOL_PARTS: &[&str] = &[
    "pipe",
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

/// The kernel's BTF (`/sys/kernel/btf/vmlinux`): function and struct layouts.
pub struct KernelBtf {
    btf: btf_rs::Btf,
}

impl KernelBtf {
    /// Whether BTF describes a function of this name (a fentry/tp_btf target
    /// must have a BTF FUNC; kallsyms alone is not enough).
    pub fn has_function(&self, name: &str) -> bool {
        self.btf
            .resolve_types_by_name(name)
            .is_ok_and(|types| types.iter().any(|t| matches!(t, btf_rs::Type::Func(_))))
    }
}

impl KernelBtf {
    /// Byte offset of a (dotted) member path inside a struct, e.g.
    /// `offset_of("pipe_inode_info", "rd_wait.lock")`. Anonymous struct and
    /// union members are searched through, typedefs and qualifiers followed.
    pub fn offset_of(&self, type_name: &str, path: &str) -> Result<u32, Error> {
        let missing = || Error::KernelType {
            type_name: type_name.to_owned(),
            member: path.to_owned(),
        };
        let mut current = self
            .btf
            .resolve_types_by_name(type_name)
            .map_err(|_| missing())?
            .into_iter()
            .find(|t| matches!(t, btf_rs::Type::Struct(s) if !s.members.is_empty()))
            .ok_or_else(missing)?;
        let mut bits = 0;
        for field in path.split('.') {
            let (offset, member_type) = self.find_member(&current, field).ok_or_else(missing)?;
            bits += offset;
            current = member_type;
        }
        Ok(bits / 8)
    }

    /// The type behind typedefs, const, volatile, restrict and type tags.
    fn strip(&self, mut ty: btf_rs::Type) -> Option<btf_rs::Type> {
        use btf_rs::Type::{Const, Restrict, TypeTag, Typedef, Volatile};
        loop {
            ty = match &ty {
                Typedef(t) => self.btf.resolve_chained_type(t).ok()?,
                Const(t) | Volatile(t) | Restrict(t) => self.btf.resolve_chained_type(t).ok()?,
                TypeTag(t) => self.btf.resolve_chained_type(t).ok()?,
                _ => return Some(ty),
            };
        }
    }

    /// (bit offset, type) of member `name` of a struct or union.
    fn find_member(&self, ty: &btf_rs::Type, name: &str) -> Option<(u32, btf_rs::Type)> {
        let record = match ty {
            btf_rs::Type::Struct(record) | btf_rs::Type::Union(record) => record,
            _ => return None,
        };
        for member in &record.members {
            let member_name = self.btf.resolve_name(member).unwrap_or_default();
            let Some(member_type) = self
                .btf
                .resolve_chained_type(member)
                .ok()
                .and_then(|t| self.strip(t))
            else {
                continue;
            };
            if member_name == name {
                return Some((member.bit_offset(), member_type));
            }
            if member_name.is_empty()
                && let Some((inner, found)) = self.find_member(&member_type, name)
            {
                return Some((member.bit_offset() + inner, found));
            }
        }
        None
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
    /// kernel has none: they are made by loading programs, see `crate::ebpf`).
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

#[cfg(test)]
mod tests {
    use super::*;

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

    /// The measured offsets of ../shared/notes/kernel-facts.md, from the BTF
    /// of each fixture kernel.
    #[test]
    fn btf_offsets_match_the_measured_kernel_facts() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kernels");
        for (kernel, private_data, f_inode, d_lockref, task_files) in [
            ("debian-6.1.0-57", 200, 32, 88, 3048),
            ("debian-6.12.117", 32, 40, 128, 3048),
            ("debian-6.18.15", 24, 32, 128, 3320),
            ("host-6.18.44", 24, 32, 128, 1824),
        ] {
            let btf = KernelInspector::at(fixtures.join(kernel)).btf().unwrap();
            let off = |t: &str, m: &str| btf.offset_of(t, m).unwrap_or_else(|e| panic!("{kernel}: {e}"));
            assert_eq!(off("file", "private_data"), private_data, "{kernel}");
            assert_eq!(off("file", "f_inode"), f_inode, "{kernel}");
            assert_eq!(off("dentry", "d_lockref"), d_lockref, "{kernel}");
            assert_eq!(off("task_struct", "files"), task_files, "{kernel}");
            assert_eq!(off("pipe_inode_info", "mutex"), 0, "{kernel}");
            assert_eq!(off("pipe_inode_info", "rd_wait.lock"), 32, "{kernel}");
            assert_eq!(off("pipe_inode_info", "wr_wait.lock"), 56, "{kernel}");
            assert_eq!(
                off("pipe_inode_info", "head"),
                80,
                "{kernel}: head, in an anonymous union on 6.18"
            );
            assert_eq!(off("inode", "i_ino"), 64, "{kernel}");
            assert_eq!(off("pt_regs", "orig_ax"), 120, "{kernel}");
            assert_eq!(off("pt_regs", "di"), 112, "{kernel}");
            assert!(btf.offset_of("pipe_inode_info", "no_such_member").is_err());
            assert!(btf.offset_of("no_such_struct", "x").is_err());
        }
    }

    #[test]
    fn versions_parse_from_distro_releases() {
        assert_eq!(parse_version("6.1.0-44-cloud-amd64"), (6, 1, 0));
        assert_eq!(parse_version("6.12.57+deb12-cloud-amd64"), (6, 12, 57));
        assert_eq!(parse_version("6.18.44-fc-v782"), (6, 18, 44));
        assert_eq!(parse_version("weird"), (0, 0, 0));
    }
}
