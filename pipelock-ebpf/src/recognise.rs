//! What a lock contended inside a pipe call, but not the pipe's, is: on the
//! herd most such waits are for run-queue locks and tasks' `pi_lock`s of
//! the wake-up path. Only an address is known, so each guess is checked
//! against the object it would belong to before it is believed. Runs once
//! per thread and lock (when the lock is named), not per wait.
use pipelock_common::{LockInfo, TraceConfig, known};

use crate::kernel_memory::read;

/// Fills `info.known` (and `detail`, `name`) if `lock` is the `wait_lock`
/// of `info.pipe`'s mutex, a run queue's lock or a task's `pi_lock`.
#[inline(always)]
pub(crate) fn recognise(cfg: &TraceConfig, lock: u64, info: &mut LockInfo) {
    if lock == info.pipe + cfg.mutex_wait_lock as u64 {
        info.known = known::PIPE_MUTEX_WAIT_LOCK;
        return;
    }
    // A run queue points to itself (`rq->cfs.rq`): a random address does not.
    if cfg.rq_self != 0 {
        let rq = lock.wrapping_sub(cfg.rq_lock as u64);
        if read::<u64>(rq + cfg.rq_self as u64) == Some(rq)
            && let Some(cpu) = read::<u32>(rq + cfg.rq_cpu as u64)
        {
            info.known = known::RUN_QUEUE;
            info.detail = cpu as u64;
            return;
        }
    }
    // A task's group leader leads itself and shares the task's process id.
    let task = lock.wrapping_sub(cfg.task_pi_lock as u64);
    let Some(leader) = read::<u64>(task + cfg.task_group_leader as u64) else {
        return;
    };
    let tgid = |task: u64| read::<u32>(task + cfg.task_tgid as u64);
    if leader == 0
        || read::<u64>(leader + cfg.task_group_leader as u64) != Some(leader)
        || tgid(task).is_none_or(|id| id == 0 || Some(id) != tgid(leader))
    {
        return;
    }
    if let (Some(pid), Some(comm)) = (
        read::<u32>(task + cfg.task_pid as u64),
        read::<[u8; 16]>(task + cfg.task_comm as u64),
    ) {
        info.known = known::TASK_PI;
        info.detail = pid as u64;
        if let Some(name) = info.name.get_mut(..16) {
            name.copy_from_slice(&comm);
        }
    }
}
