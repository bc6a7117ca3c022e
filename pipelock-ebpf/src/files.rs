//! From a task's fd or a `struct file` to the pipe behind it: the walk the
//! tracepoint programs do on a contended path and the splice hooks once
//! per call (read/write calls learn their pipe from their first mutex_lock).
use aya_ebpf::helpers::bpf_get_current_task;
use pipelock_common::TraceConfig;

use crate::maps::{read, read_words};

const S_IFMT: u16 = 0o170000;
const S_IFIFO: u16 = 0o010000;

/// The current task's `struct file` at `fd`.
#[inline(always)]
pub(crate) fn file_of_fd(cfg: &TraceConfig, fd: u64) -> Option<u64> {
    // SAFETY: no preconditions; used as an address for probe reads only.
    let task = unsafe { bpf_get_current_task() };
    let files = read::<u64>(task + cfg.task_files as u64)?;
    let fdt = read::<u64>(files + cfg.files_fdt as u64)?;
    let (max_fds, fd_array) = read_words(fdt, cfg.fdt_max_fds, cfg.fdt_fd)?;
    if fd >= max_fds as u32 as u64 {
        return None;
    }
    let file = read::<u64>(fd_array + fd * 8)?;
    (file != 0).then_some(file)
}

/// `(pipe_inode_info, inode number)` of a pipe or FIFO file: a FIFO inode
/// says it is one, and its `private_data` is the pipe.
#[inline(always)]
pub(crate) fn pipe_of_file(cfg: &TraceConfig, file: u64) -> Option<(u64, u64)> {
    let (inode, pipe) = read_words(file, cfg.file_inode, cfg.file_private_data)?;
    let (mode, ino) = read_words(inode, cfg.inode_mode, cfg.inode_ino)?;
    if mode as u16 & S_IFMT != S_IFIFO {
        return None;
    }
    (pipe != 0).then_some((pipe, ino))
}
