//! Which tasks are recorded: the traced command's process tree, `-p`, `-t`
//! and `-c`, checked before any statistics map is touched.
use aya_ebpf::helpers::bpf_get_current_comm;
use pipelock_common::{TraceConfig, task_filter};

use crate::{maps::TASK_FILTER, task::process_comm};

/// The traced command's process tree, `-p`, `-t` and `-c` (the thread's or
/// its process's command name): whether the current task is one to record.
#[inline(always)]
pub(crate) fn wanted(cfg: &TraceConfig, pid_tgid: u64) -> bool {
    if cfg.filter_tasks != 0 {
        // SAFETY: lookups only.
        let marks = |id: u32| unsafe { TASK_FILTER.get(&id) }.copied().unwrap_or(0);
        let by_process = marks((pid_tgid >> 32) as u32) & task_filter::TRACED != 0;
        let by_thread = || {
            cfg.filter_tasks & task_filter::BY_TID != 0 && marks(pid_tgid as u32) & task_filter::THREAD != 0
        };
        if !by_process && !by_thread() {
            return false;
        }
    }
    cfg.filter_comm_set == 0
        || bpf_get_current_comm().is_ok_and(|comm| comm == cfg.filter_comm)
        // A thread named apart from its process (an io_uring worker):
        // `-c` names processes.
        || process_comm(cfg).is_some_and(|comm| comm == cfg.filter_comm)
}
