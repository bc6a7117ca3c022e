//! The kernel's BTF: which functions it describes, and struct member
//! offsets (Rust BPF objects get no CO-RE relocations, so the programs are
//! handed the offsets at load time).
use crate::Error;

/// The kernel's BTF (`/sys/kernel/btf/vmlinux`): function and struct layouts.
pub struct KernelBtf {
    pub(super) btf: btf_rs::Btf,
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
    /// The BTF id of struct `name` (its definition, not a forward
    /// declaration): what `bpf_rdonly_cast` is told to read an address as.
    pub fn struct_id(&self, name: &str) -> Result<u32, Error> {
        self.btf
            .resolve_ids_by_name(name)
            .ok()
            .and_then(|ids| {
                ids.into_iter().find(|&id| {
                    matches!(self.btf.resolve_type_by_id(id),
                        Ok(btf_rs::Type::Struct(s)) if !s.members.is_empty())
                })
            })
            .ok_or_else(|| Error::KernelStruct(name.to_owned()))
    }

    /// The BTF id of `bpf_rdonly_cast` (6.2+), the kfunc through which the
    /// programs read kernel objects with plain loads (`Typed::cast` in the
    /// eBPF crate); None: they take probe reads.
    pub fn rdonly_cast_id(&self) -> Option<u32> {
        self.function_id("bpf_rdonly_cast")
    }

    /// The BTF ids of `bpf_preempt_disable` and `bpf_preempt_enable`
    /// (6.10+), between which fentry/fexit programs run their bodies
    /// (`preempt` in the eBPF crate); None: they run preemptible.
    pub fn preempt_ids(&self) -> Option<(u32, u32)> {
        Some((
            self.function_id("bpf_preempt_disable")?,
            self.function_id("bpf_preempt_enable")?,
        ))
    }

    /// The BTF id of function `name` (a kfunc is called by it), if BTF
    /// describes one.
    pub fn function_id(&self, name: &str) -> Option<u32> {
        self.btf
            .resolve_ids_by_name(name)
            .ok()?
            .into_iter()
            .find(|&id| matches!(self.btf.resolve_type_by_id(id), Ok(btf_rs::Type::Func(_))))
    }

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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::kernel::KernelInspector;

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

    /// `bpf_rdonly_cast` came with 6.2: 6.1's programs take the probe
    /// reads, the others plain loads. The struct ids are definitions (a
    /// forward declaration has no members to read).
    #[test]
    fn rdonly_cast_and_struct_ids_per_kernel() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kernels");
        for (kernel, has_cast) in [
            ("debian-6.1.0-57", false),
            ("debian-6.12.117", true),
            ("debian-6.18.15", true),
            ("host-6.18.44", true),
        ] {
            let btf = KernelInspector::at(fixtures.join(kernel)).btf().unwrap();
            assert_eq!(btf.rdonly_cast_id().is_some(), has_cast, "{kernel}");
            assert!(btf.function_id("no_such_function").is_none());
            for name in ["file", "inode", "kiocb", "mutex", "pt_regs", "task_struct"] {
                let id = btf.struct_id(name).unwrap_or_else(|e| panic!("{kernel}: {e}"));
                let btf_rs::Type::Struct(record) = btf.btf.resolve_type_by_id(id).unwrap() else {
                    panic!("{kernel}: {name} is not a struct");
                };
                assert!(!record.members.is_empty(), "{kernel}: {name}");
            }
            assert_eq!(
                btf.struct_id("no_such_struct").unwrap_err().to_string(),
                "kernel BTF has no struct no_such_struct"
            );
        }
    }
}
