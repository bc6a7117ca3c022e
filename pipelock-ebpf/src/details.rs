//! A lock's parts: its figures by owner, caller (call stack) or task, and
//! the names of the threads those rows show.
use aya_ebpf::{EbpfContext, helpers::bpf_get_current_comm, programs::tracing::StackIdContext};
use pipelock_common::{DetailKey, DetailStats, Drop, LockKey, NO_STACK, TaskName, TraceConfig, detail};

use crate::{
    counters::bump,
    drops::count_drop,
    maps::{STACKS, TASK_NAMES, detail_of},
};

/// The current call stack's id in `STACKS` if callers are recorded
/// ([`NO_STACK`] otherwise, or when it could not be stored).
#[inline(always)]
pub(crate) fn stack_id<C: EbpfContext + StackIdContext>(cfg: &TraceConfig, ctx: &C) -> u32 {
    if cfg.details & (1 << detail::CALLER) == 0 {
        return NO_STACK;
    }
    match ctx.get_stackid(&STACKS, 0) {
        Ok(id) => id as u32,
        Err(_) => {
            count_drop(Drop::StackLost);
            NO_STACK
        }
    }
}

/// One acquisition (or contended wait) in a lock's part `kind`/`id`;
/// the part, for what a caller adds.
#[inline(always)]
pub(crate) fn record_part(
    lock: LockKey,
    kind: u32,
    id: u32,
    acquired: bool,
    contended: bool,
    wait_ns: u64,
    hold_ns: u64,
) -> Option<&'static mut DetailStats> {
    let part = detail_of(&DetailKey { lock, kind, id })?;
    // SAFETY: a live map value; every update of it is atomic.
    let part = unsafe { &mut *part };
    if acquired {
        bump(&mut part.acquisitions, 1);
    }
    if contended {
        bump(&mut part.contentions, 1);
    }
    bump(&mut part.wait_ns, wait_ns);
    if wait_ns > part.wait_max_ns {
        part.wait_max_ns = wait_ns;
    }
    if hold_ns != 0 {
        bump(&mut part.hold_ns, hold_ns);
    }
    Some(part)
}

/// Records the current thread's names (per-task rows), once per slot owner.
#[inline(always)]
pub(crate) fn name_current(cfg: &TraceConfig, pid_tgid: u64) {
    // Waiters are named for `--by task`, and in the hooked modes holders
    // are named as spinlock owners.
    if cfg.details & (1 << detail::TASK | 1 << detail::OWNER) == 0 {
        return;
    }
    let name = TaskName {
        tgid: (pid_tgid >> 32) as u32,
        _pad: 0,
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    };
    let _ = TASK_NAMES.insert(&(pid_tgid as u32), &name, 0);
}
