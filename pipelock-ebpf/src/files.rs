//! From a task's fd or a `struct file` to the pipe behind it: the walk the
//! tracepoint programs do on a contended path and the splice hooks once
//! per call (read/write calls learn their pipe from their first mutex_lock).
use pipelock_common::TraceConfig;

use crate::{
    btf_ptr::{BtfPtr, word_at},
    kernel_memory::{read, read_words},
};

const S_IFMT: u16 = 0o170000;
const S_IFIFO: u16 = 0o010000;

/// The kernel's ceiling on fd numbers (`sysctl_nr_open` can be at most
/// `NR_OPEN`, 1 << 20). It also bounds `fd * 8` for the verifier, which
/// may type the fd array as memory and refuses an unbounded offset into it.
const NR_OPEN: u64 = 1 << 20;

/// The `struct file` at `fd` of `task` (the current task, typed). BtfPtr
/// loads down to the fd array (task, files, fd table: members of known
/// structs), and the array's element too where the kernel has
/// `bpf_rdonly_cast`; else a probe read.
#[inline(always)]
pub(crate) fn file_of_fd(cfg: &TraceConfig, task: BtfPtr, fd: u64) -> Option<u64> {
    let fdt = task.pointer(cfg.task_files)?.pointer(cfg.files_fdt)?;
    let max_fds = fdt.half(cfg.fdt_max_fds) as u64;
    if fd >= max_fds || fd >= NR_OPEN {
        return None;
    }
    file_at(cfg, fdt.word(cfg.fdt_fd) + fd * 8)
}

/// The `struct file *` stored at `address` (an fd slot, a kiocb's
/// `ki_filp`), None if NULL. An fd slot is one the verifier cannot type
/// (the array is a pointer to pointers); read as the `ki_filp` of a kiocb
/// laid over it, it is a typed file pointer.
#[inline(always)]
pub(crate) fn file_at(cfg: &TraceConfig, address: u64) -> Option<u64> {
    if let Some(kiocb) = BtfPtr::cast(address - cfg.kiocb_filp as u64, cfg.btf_kiocb) {
        return kiocb.pointer(cfg.kiocb_filp).map(BtfPtr::address);
    }
    let file = read::<u64>(address)?;
    (file != 0).then_some(file)
}

/// `(pipe_inode_info, inode number)` of a pipe or FIFO file: a FIFO inode
/// says it is one, and its `private_data` is the pipe. Plain loads where
/// the kernel has `bpf_rdonly_cast`, else two probe reads.
#[inline(always)]
pub(crate) fn pipe_of_file(cfg: &TraceConfig, file: u64) -> Option<(u64, u64)> {
    if file == 0 {
        return None;
    }
    if let Some(file) = BtfPtr::cast(file, cfg.btf_file) {
        let inode = file.pointer(cfg.file_inode)?;
        if inode.quarter(cfg.inode_mode) & S_IFMT != S_IFIFO {
            return None;
        }
        let pipe = word_at(cfg, file.address() + cfg.file_private_data as u64)?;
        return (pipe != 0).then_some((pipe, inode.word(cfg.inode_ino)));
    }
    let (inode, pipe) = read_words(file, cfg.file_inode, cfg.file_private_data)?;
    let (mode, ino) = read_words(inode, cfg.inode_mode, cfg.inode_ino)?;
    if mode as u16 & S_IFMT != S_IFIFO {
        return None;
    }
    (pipe != 0).then_some((pipe, ino))
}
