//! What userspace keeps once it has read it, recorded once per collection
//! interval: lock identities (`LOCK_INFO`), the processes on a lock
//! (`LOCK_USERS`) and owners' names (`TASK_NAMES`). Userspace drains those
//! maps every interval and keeps what it read, so a program that finds an
//! entry recorded by itself or another program in this interval can skip
//! the hash lookup that would find it there. The caches here (and a
//! thread's own, `TaskWaits::recorded`) hold for one interval only:
//! userspace forgets the identities of locks it retires and names nobody
//! refers to, and a cache that outlived them would leave those unnamed for
//! good when they come back.
use aya_ebpf::{bindings::BPF_NOEXIST, helpers::bpf_get_current_comm, macros::map, maps::PerCpuArray};
use pipelock_common::{Drop, LockInfo, LockKey, LockUser};

use crate::{
    drops::count_drop,
    maps::{LOCK_INFO, LOCK_USERS, interval},
};

/// What this CPU recorded in `interval`: the lock it last named, the
/// (lock, process) it last put in `LOCK_USERS`, and the owners it named, at
/// `tid % RECENT_OWNERS`, each tagged with its interval. A contended lock
/// comes back to the same CPU event after event, and a per-CPU array read
/// (inlined by the verifier on recent kernels) is much cheaper than the
/// hash lookups that would find it recorded. Only a cache: a stale entry
/// costs a lookup.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Recent {
    interval: u32,
    user_tgid: u32,
    named: LockKey,
    user: LockKey,
    owners: [u64; RECENT_OWNERS],
}

/// Owners one CPU remembers naming: a 64-process herd's, without collisions.
const RECENT_OWNERS: usize = 64;

#[map]
static RECENT: PerCpuArray<Recent> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's cache, reached through its pointer, never a reference: a
/// program interrupted on this CPU by another that uses the cache sees the
/// other's writes between two of its own accesses. Each field is read and
/// written whole, and such a race only makes the cache miss, or a name be
/// looked up twice.
#[derive(Clone, Copy)]
struct Cache(*mut Recent);

/// Reads one field of the cache (`at` is a field address of a live value).
#[inline(always)]
fn load<F: Copy>(at: *const F) -> F {
    // SAFETY: an aligned field of this CPU's live map value.
    unsafe { core::ptr::read_volatile(at) }
}

/// Writes one field of the cache.
#[inline(always)]
fn store<F: Copy>(at: *mut F, value: F) {
    // SAFETY: as in `load`.
    unsafe { core::ptr::write_volatile(at, value) }
}

/// This CPU's cache, emptied of the lock and process of a past interval.
#[inline(always)]
fn recent() -> Option<Cache> {
    let recent = RECENT.get_ptr_mut(0)?;
    let now = interval();
    // SAFETY (all field addresses here and below): `recent` is this CPU's
    // live, aligned value; only addresses are taken.
    unsafe {
        if load(&raw const (*recent).interval) != now {
            store(&raw mut (*recent).interval, now);
            store(&raw mut (*recent).named, LockKey::default());
            store(&raw mut (*recent).user, LockKey::default());
        }
    }
    Some(Cache(recent))
}

/// Whether thread `tid` is not yet named from this CPU in this interval;
/// from now on it counts as named (the caller names it). Owners change at
/// nearly every contended wait of a herd, and this saves the `TASK_NAMES`
/// lookup that would find the name there.
#[inline(always)]
pub(crate) fn first_naming(tid: u32) -> bool {
    let Some(Cache(recent)) = recent() else {
        return true;
    };
    // SAFETY: as in `recent`.
    let (interval, owners) = unsafe { (load(&raw const (*recent).interval), &raw mut (*recent).owners) };
    let tag = (interval as u64) << 32 | tid as u64;
    let index = tid as usize % RECENT_OWNERS;
    if index >= RECENT_OWNERS {
        return true;
    }
    // SAFETY: `index` is within the array.
    let seen = unsafe { owners.cast::<u64>().add(index) };
    if load(seen) == tag {
        return false;
    }
    store(seen, tag);
    true
}

/// Names a lock in `LOCK_INFO` unless it is named already (`info` makes
/// the name only when it is not).
#[inline(always)]
pub(crate) fn name_lock(key: &LockKey, info: impl FnOnce() -> LockInfo) {
    let recent = recent();
    // SAFETY: as in `recent`.
    if let Some(Cache(recent)) = recent
        && load(unsafe { &raw const (*recent).named }) == *key
    {
        return;
    }
    // SAFETY: a lookup only. (A refused insert into an LRU map still takes
    // a node off its free list and puts it back: look first.)
    if unsafe { LOCK_INFO.get(key) }.is_none() {
        let _ = LOCK_INFO.insert(key, &info(), BPF_NOEXIST as u64);
    }
    if let Some(Cache(recent)) = recent {
        // SAFETY: as in `recent`.
        store(unsafe { &raw mut (*recent).named }, *key);
    }
}

/// Records the process on a lock once (it shows in the report's processes).
#[inline(always)]
pub(crate) fn note_user(key: LockKey, tgid: u32) {
    if let Some(Cache(recent)) = recent() {
        // SAFETY: as in `recent`.
        let (user, user_tgid) = unsafe { (&raw mut (*recent).user, &raw mut (*recent).user_tgid) };
        if load(user) == key && load(user_tgid) == tgid {
            return;
        }
        store(user, key);
        store(user_tgid, tgid);
    }
    let user = LockUser { key, tgid, _pad: 0 };
    // SAFETY: a lookup; the comm is only fetched for a process not seen yet.
    if unsafe { LOCK_USERS.get(user) }.is_none() {
        let comm = bpf_get_current_comm().unwrap_or([0; 16]);
        if LOCK_USERS.insert(user, comm, BPF_NOEXIST as u64).is_err() {
            count_drop(Drop::UsersFull);
        }
    }
}
