//! A task asking for a mutex it owns (see `pipelock_common::asked_twice`),
//! recorded at its contended begin whatever the filters: a deadlock stops
//! whoever needs that mutex next, traced or not.
use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    programs::tracing::StackIdContext,
};
use pipelock_common::{
    Drop, LCB_F_MUTEX, TraceConfig,
    asked_twice::{AskedKey, AskedTwice, asks_twice},
};

use super::holder::mutex_owner_word;
use crate::{
    btf_ptr::BtfPtr,
    details::unwound,
    drops::count_drop,
    files::{file_of_fd, pipe_of_file},
    maps::ASKED_TWICE,
};

/// At a `contention_begin` of `lock` (`flags`) by `task`: records the ask
/// once per thread and mutex if `task` owns the mutex already.
#[inline(always)]
pub(crate) fn check<C: EbpfContext + StackIdContext>(
    ctx: &C,
    cfg: &TraceConfig,
    task: BtfPtr,
    lock: u64,
    flags: u32,
) {
    if flags & LCB_F_MUTEX == 0 {
        return;
    }
    let Some(word) = mutex_owner_word(cfg, lock) else {
        return;
    };
    if !asks_twice(word, task.address()) {
        return;
    }
    let key = AskedKey {
        pid_tgid: bpf_get_current_pid_tgid(),
        lock,
    };
    // SAFETY: a lookup only.
    if unsafe { ASKED_TWICE.get(&key) }.is_some() {
        return;
    }
    // Rare, so the syscall's first argument is worth a look: the fd of the
    // pipe whose mutex this is, in every pipe call that takes it.
    let regs = BtfPtr::user_regs_of(task);
    let (pipe, ino) = file_of_fd(cfg, task, regs.word(cfg.regs_arg0) as u32 as u64)
        .and_then(|file| pipe_of_file(cfg, file))
        .filter(|(pipe, _)| *pipe == lock)
        .unwrap_or((0, 0));
    let event = AskedTwice {
        // SAFETY: no preconditions.
        at_ns: unsafe { bpf_ktime_get_ns() },
        pipe,
        ino,
        stack_id: unwound(ctx),
        syscall: regs.word(cfg.regs_syscall_nr) as i32,
        comm: bpf_get_current_comm().unwrap_or_default(),
    };
    if ASKED_TWICE.insert(&key, &event, BPF_NOEXIST.into()).is_err() {
        count_drop(Drop::AskedTwiceFull);
    }
}
