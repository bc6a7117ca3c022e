//! The traced command's process tree: a process forked by one that is
//! followed is traced and followed too (`pipelock trace -- COMMAND`), and a
//! process's marks go when it exits (its pid may be handed out again).
use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::btf_tracepoint, programs::BtfTracePointContext};
use pipelock_common::{Drop, task_filter};

use crate::{
    drops::count_drop,
    kernel_memory::read,
    maps::{TASK_FILTER, config},
};

/// `sched_process_fork(struct task_struct *parent, struct task_struct *child)`.
#[btf_tracepoint(function = "sched_process_fork")]
pub fn follow_fork(ctx: BtfTracePointContext) -> i32 {
    let parent = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: a lookup only.
    let followed = unsafe { TASK_FILTER.get(&parent) }.is_some_and(|marks| marks & task_filter::FOLLOW != 0);
    if !followed {
        return 0;
    }
    let child: u64 = ctx.arg(1);
    let Some(child_tgid) = read::<u32>(child + config().task_tgid as u64) else {
        return 0;
    };
    // A new thread of a followed process: already followed by its process id.
    if child_tgid != parent {
        let marks = task_filter::TRACED | task_filter::FOLLOW;
        if TASK_FILTER.insert(&child_tgid, &marks, 0).is_err() {
            count_drop(Drop::FollowFull);
        }
    }
    0
}

/// `sched_process_exit(struct task_struct *p)`, on the process's leader.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn follow_exit(_ctx: BtfTracePointContext) -> i32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if tgid == tid {
        let _ = TASK_FILTER.remove(&tgid);
    }
    0
}
