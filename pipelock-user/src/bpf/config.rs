//! What the programs are told at load time: the kernel's struct offsets
//! (from BTF) and the filters, as one `TraceConfig` global.
use pipelock_common::TraceConfig;

use crate::{Error, kernel::KernelBtf, model::ClassSet};

/// What to trace.
#[derive(Clone, Debug, Default)]
pub struct Filters {
    /// Only this process (thread group id).
    pub tgid: Option<u32>,
    /// Only tasks with this comm.
    pub comm: Option<String>,
    /// The classes to record; empty means [`ClassSet::DEFAULT`].
    pub classes: ClassSet,
}

impl Filters {
    /// The classes actually traced.
    pub fn classes(&self) -> ClassSet {
        if self.classes.is_empty() {
            ClassSet::DEFAULT
        } else {
            self.classes
        }
    }
}

/// x86-64 syscall numbers (read, write, readv, writev).
#[cfg(target_arch = "x86_64")]
const SYSCALLS: [u32; 4] = [0, 1, 19, 20];

/// Resolves every offset the programs need from the kernel's BTF.
pub fn trace_config(btf: &KernelBtf, filters: &Filters) -> Result<TraceConfig, Error> {
    let off = |t: &str, m: &str| btf.offset_of(t, m);
    Ok(TraceConfig {
        kiocb_filp: off("kiocb", "ki_filp")?,
        task_files: off("task_struct", "files")?,
        files_fdt: off("files_struct", "fdt")?,
        fdt_max_fds: off("fdtable", "max_fds")?,
        fdt_fd: off("fdtable", "fd")?,
        file_inode: off("file", "f_inode")?,
        file_private_data: off("file", "private_data")?,
        inode_mode: off("inode", "i_mode")?,
        inode_ino: off("inode", "i_ino")?,
        pipe_rd_wait_lock: off("pipe_inode_info", "rd_wait.lock")?,
        pipe_wr_wait_lock: off("pipe_inode_info", "wr_wait.lock")?,
        regs_syscall_nr: off("pt_regs", "orig_ax")?,
        regs_arg0: off("pt_regs", "di")?,
        nr_read: SYSCALLS[0],
        nr_write: SYSCALLS[1],
        nr_readv: SYSCALLS[2],
        nr_writev: SYSCALLS[3],
        filter_tgid: filters.tgid.unwrap_or(0),
        class_mask: filters.classes().mask(),
        path_dentry: off("path", "dentry")?,
        dentry_lockref: off("dentry", "d_lockref.lock")?,
        dentry_name: off("dentry", "d_name.name")?,
        dentry_hash: off("dentry", "d_name.hash_len")?,
        filter_comm_set: u32::from(filters.comm.is_some()),
        filter_comm: comm_bytes(filters.comm.as_deref().unwrap_or(""))?,
    })
}

/// A `-c COMM` as the kernel stores it: at most 15 bytes, NUL-padded (a
/// longer name is cut like the kernel cuts the task's).
fn comm_bytes(comm: &str) -> Result<[u8; 16], Error> {
    if comm.contains('\0') {
        return Err(Error::Usage("-c: a command name cannot contain NUL".to_owned()));
    }
    let mut bytes = [0u8; 16];
    let len = comm.len().min(15);
    bytes[..len].copy_from_slice(&comm.as_bytes()[..len]);
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::{kernel::KernelInspector, model::LockClass};

    #[test]
    fn config_carries_the_fixture_kernels_offsets_and_the_filters() {
        let btf = KernelInspector::at(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kernels/debian-6.1.0-57"),
        )
        .btf()
        .unwrap();
        let filters = Filters {
            tgid: Some(42),
            comm: Some("cat".into()),
            classes: ClassSet::PIPE_WAIT,
        };
        let config = trace_config(&btf, &filters).unwrap();
        assert_eq!((config.file_private_data, config.dentry_lockref), (200, 88));
        assert_eq!((config.pipe_rd_wait_lock, config.pipe_wr_wait_lock), (32, 56));
        assert_eq!(config.filter_tgid, 42);
        assert_eq!(&config.filter_comm[..4], b"cat\0");
        assert_eq!(config.class_mask, ClassSet::PIPE_WAIT.mask());
        let default = trace_config(&btf, &Filters::default()).unwrap();
        assert_eq!(default.class_mask, ClassSet::DEFAULT.mask());
        assert_eq!(
            default.class_mask & (1 << LockClass::Lockref.id()),
            0,
            "lockref is opt-in"
        );
        assert!(
            trace_config(
                &btf,
                &Filters {
                    comm: Some("a\0b".into()),
                    ..Filters::default()
                }
            )
            .is_err()
        );
    }
}
