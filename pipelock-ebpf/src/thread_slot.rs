//! Taking a thread's slot of `TASK_PIPE` or `TASK_WAITS` (see
//! [`ThreadSlot`]): the only way a program reaches a slot's value.
use core::{
    intrinsics::{AtomicOrdering, atomic_cxchg, atomic_xchg},
    ops::{Deref, DerefMut},
};

use pipelock_common::{Drop, ThreadSlot};

use crate::drops::count_drop;

/// A slot this program has taken: it alone reads and writes the value
/// until the slot is dropped (given back).
pub(crate) struct Taken<T: 'static> {
    slot: *mut ThreadSlot<T>,
}

impl<T> Taken<T> {
    /// Takes the slot at `slot`, whichever thread it is for, on behalf of
    /// thread `pid_tgid`; `None` while another program holds it. That is
    /// counted (`slot_busy`) when the holder is another thread's program
    /// (ids `TASK_SLOTS` apart, on another CPU). When it is this thread's
    /// own, this program runs nested inside it (a lock the outer program's
    /// helper takes, an interrupt): such an event is BPF's or the
    /// interrupt's, never one of a pipe call's locks, and is left out
    /// uncounted.
    #[inline(always)]
    pub(crate) fn any(slot: *mut ThreadSlot<T>, pid_tgid: u64) -> Option<Self> {
        // SAFETY: `slot` is a live, aligned array value (the map's memory
        // stays while programs run); `taken` is only accessed atomically.
        let (_, won) = unsafe {
            atomic_cxchg::<u64, { AtomicOrdering::Acquire }, { AtomicOrdering::Relaxed }>(
                &raw mut (*slot).taken,
                0,
                1,
            )
        };
        if !won {
            if Self::owner_hint(slot) != pid_tgid {
                count_drop(Drop::SlotBusy);
            }
            return None;
        }
        Some(Self { slot })
    }

    /// Takes the slot if it is thread `pid_tgid`'s. Most events are other
    /// threads': they only read the owner word, and take nothing.
    #[inline(always)]
    pub(crate) fn own(slot: *mut ThreadSlot<T>, pid_tgid: u64) -> Option<Self> {
        if Self::owner_hint(slot) != pid_tgid {
            return None;
        }
        let taken = Self::any(slot, pid_tgid)?;
        // Another thread may have claimed it between the hint and the take.
        (taken.owner() == pid_tgid).then_some(taken)
    }

    /// The owner word, read without taking the slot (as the kernel's
    /// `READ_ONCE`: BPF's LLVM selects no atomic load before ISA v4): stale
    /// or mid-claim, it only decides whether to try.
    #[inline(always)]
    pub(crate) fn owner_hint(slot: *mut ThreadSlot<T>) -> u64 {
        // SAFETY: a live, aligned array value.
        unsafe { core::ptr::read_volatile(&raw const (*slot).owner) }
    }

    /// The thread (`pid_tgid`) the slot is for.
    #[inline(always)]
    pub(crate) fn owner(&self) -> u64 {
        // SAFETY: taken: no other program writes the owner now.
        unsafe { (*self.slot).owner }
    }

    /// Gives the slot to thread `pid_tgid` (0: to nobody).
    #[inline(always)]
    pub(crate) fn set_owner(&mut self, pid_tgid: u64) {
        // SAFETY: taken; other CPUs read it only as a hint (`owner_hint`).
        unsafe { (*self.slot).owner = pid_tgid };
    }
}

impl<T> Deref for Taken<T> {
    type Target = T;

    #[inline(always)]
    fn deref(&self) -> &T {
        // SAFETY: taken: no other program touches the value until dropped.
        unsafe { &(*self.slot).value }
    }
}

impl<T> DerefMut for Taken<T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`.
        unsafe { &mut (*self.slot).value }
    }
}

impl<T> core::ops::Drop for Taken<T> {
    #[inline(always)]
    fn drop(&mut self) {
        // An exchange, not a store: it orders the value's writes before the
        // release on every JIT (BPF has no store-release before ISA v4).
        // SAFETY: as in `any`.
        unsafe { atomic_xchg::<u64, { AtomicOrdering::Release }>(&raw mut (*self.slot).taken, 0) };
    }
}
