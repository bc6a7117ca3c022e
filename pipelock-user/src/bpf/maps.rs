//! Reading the programs' maps: per-lock statistics (drained per tick), what each lock is and who used it, drops, map fill.
use std::{
    collections::{BTreeMap, HashMap},
    os::fd::{AsFd as _, AsRawFd as _},
};

use aya::{
    Ebpf,
    maps::{Array, HashMap as BpfHashMap, Map, MapError, PerCpuArray, PerCpuValues},
};
use pipelock_common::{
    CpuLocalDetails, CpuLocalStats, DetailKey, DetailStats, Drop, LockInfo, LockKey, LockStats, LockUser,
    TaskName,
    asked_twice::{AskedKey, AskedTwice},
    maps,
};

use crate::{
    Error,
    model::{
        MapFill,
        naming::comm_text,
        owners::{Details, TaskNames, merge_detail},
        timing::merge_stats,
    },
};

fn map_err(name: &str) -> impl FnOnce(MapError) -> Error + use<> {
    let name = name.to_owned();
    move |source| Error::Map { map: name, source }
}

fn map<'a>(ebpf: &'a Ebpf, name: &str) -> Result<&'a Map, Error> {
    ebpf.map(name).ok_or_else(|| Error::Missing {
        kind: "map",
        name: name.to_owned(),
    })
}

/// Statistics by lock, with `u64` buckets. Boxed: a value is ~4.4 KB, and a table of them
/// that entries keep leaving and joining (a long trace of a churning
/// system) is eventually doubled; a table of pointers costs nothing to
/// double, and freed values are reused.
pub type Stats = HashMap<LockKey, Box<LockStats<u64>>>;

/// Adds one statistics map's entries to `into`.
fn add_stats(ebpf: &Ebpf, name: &str, into: &mut Stats) -> Result<(), Error> {
    let stats: BpfHashMap<_, LockKey, LockStats> =
        BpfHashMap::try_from(map(ebpf, name)?).map_err(map_err(name))?;
    for entry in stats.iter() {
        let (key, mut value) = entry.map_err(map_err(name))?;
        value.wait.count_buckets();
        value.hold.count_buckets();
        merge_stats(
            into.entry(key).or_insert_with(|| Box::new(LockStats::EMPTY)),
            &value,
        );
    }
    Ok(())
}

/// Every CPU's local table of one parity (`maps::CPU_LOCAL`, `maps::CPU_DETAILS`).
fn cpu_tables<T: aya::Pod>(ebpf: &Ebpf, name: &str) -> Result<Vec<T>, Error> {
    let cpu_tables: PerCpuArray<_, T> = PerCpuArray::try_from(map(ebpf, name)?).map_err(map_err(name))?;
    Ok(cpu_tables
        .get(&0, 0)
        .map_err(map_err(name))?
        .iter()
        .copied()
        .collect())
}

/// Adds every CPU's local lock table of one parity to `into`; true if any held a lock.
fn add_cpu_local(ebpf: &Ebpf, name: &str, into: &mut Stats) -> Result<bool, Error> {
    let mut held = false;
    for table in cpu_tables::<CpuLocalStats>(ebpf, name)? {
        for (key, stats) in table.entries() {
            held = true;
            let mut stats = *stats;
            stats.wait.count_buckets();
            stats.hold.count_buckets();
            merge_stats(
                into.entry(*key).or_insert_with(|| Box::new(LockStats::EMPTY)),
                &stats,
            );
        }
    }
    Ok(held)
}

/// Adds every CPU's local part table of one parity to `into`; true if any held a part.
fn add_cpu_details(ebpf: &Ebpf, name: &str, into: &mut Details) -> Result<bool, Error> {
    let mut held = false;
    for table in cpu_tables::<CpuLocalDetails>(ebpf, name)? {
        for (key, stats) in table.entries() {
            held = true;
            merge_detail(into.entry(*key).or_default(), stats);
        }
    }
    Ok(held)
}

/// Empties every CPU's local table of one parity for the interval that uses it next.
fn empty_cpu_local<T: aya::Pod>(ebpf: &mut Ebpf, name: &str, empty: T) -> Result<(), Error> {
    let cpus = aya::util::nr_cpus().map_err(|(_, source)| Error::Io {
        what: "counting the possible CPUs",
        source,
    })?;
    let zeros = PerCpuValues::try_from(vec![empty; cpus]).map_err(|source| Error::Io {
        what: "emptying a CPU-local table",
        source,
    })?;
    let mut cpu_tables: PerCpuArray<_, T> =
        PerCpuArray::try_from(map_mut(ebpf, name)?).map_err(map_err(name))?;
    cpu_tables.set(0, zeros, 0).map_err(map_err(name))
}

/// Adds one breakdown map's entries to `into`.
fn add_details(ebpf: &Ebpf, name: &str, into: &mut Details) -> Result<(), Error> {
    let details: BpfHashMap<_, DetailKey, DetailStats> =
        BpfHashMap::try_from(map(ebpf, name)?).map_err(map_err(name))?;
    for entry in details.iter() {
        let (key, value) = entry.map_err(map_err(name))?;
        merge_detail(into.entry(key).or_default(), &value);
    }
    Ok(())
}

/// What the programs recorded: per lock, and per lock by owner, caller or task.
#[derive(Clone, Debug, Default)]
pub struct Taken {
    pub stats: Stats,
    pub details: Details,
}

/// Every traced lock's statistics not drained yet (both maps, all CPU-local tables).
pub fn read_stats(ebpf: &Ebpf) -> Result<Taken, Error> {
    let mut taken = Taken::default();
    for name in maps::CPU_LOCAL {
        add_cpu_local(ebpf, name, &mut taken.stats)?;
    }
    for name in maps::LOCK_STATS {
        add_stats(ebpf, name, &mut taken.stats)?;
    }
    for name in maps::CPU_DETAILS {
        add_cpu_details(ebpf, name, &mut taken.details)?;
    }
    for name in maps::LOCK_DETAILS {
        add_details(ebpf, name, &mut taken.details)?;
    }
    Ok(taken)
}

/// Takes everything the programs recorded since the last call: the
/// programs are switched to the other statistics map, an RCU grace period
/// passes (every program that could still hold a pointer into the old map
/// has returned), then the old map is read and emptied. Nothing is lost or
/// counted twice, whatever runs meanwhile.
/// Also returns the name of the map it drained.
pub fn take_stats(ebpf: &mut Ebpf) -> Result<(Taken, &'static str), Error> {
    let slot_map = ebpf.map_mut(maps::STATS_SLOT).ok_or_else(|| Error::Missing {
        kind: "map",
        name: maps::STATS_SLOT.to_owned(),
    })?;
    let mut slot: Array<_, u32> = Array::try_from(slot_map).map_err(map_err(maps::STATS_SLOT))?;
    // A count, not a flag: the programs' "already recorded" caches hold
    // for one interval (its parity picks the map).
    let interval = slot.get(&0, 0).map_err(map_err(maps::STATS_SLOT))?;
    slot.set(0, interval.wrapping_add(1), 0)
        .map_err(map_err(maps::STATS_SLOT))?;
    let old = interval as usize % 2;
    rcu_grace_period();
    let name = maps::LOCK_STATS[old];
    let details_name = maps::LOCK_DETAILS[old];
    let mut taken = Taken::default();
    add_stats(ebpf, name, &mut taken.stats)?;
    add_details(ebpf, details_name, &mut taken.details)?;
    // Only what the maps held is removed from them: a removal is a syscall,
    // and the CPU-local tables' locks and parts (dozens of owner rows on a herd) are
    // not there.
    let stats_keys: Vec<LockKey> = taken.stats.keys().copied().collect();
    let detail_keys: Vec<DetailKey> = taken.details.keys().copied().collect();
    if add_cpu_local(ebpf, maps::CPU_LOCAL[old], &mut taken.stats)? {
        empty_cpu_local(ebpf, maps::CPU_LOCAL[old], CpuLocalStats::EMPTY)?;
    }
    if add_cpu_details(ebpf, maps::CPU_DETAILS[old], &mut taken.details)? {
        empty_cpu_local(ebpf, maps::CPU_DETAILS[old], CpuLocalDetails::EMPTY)?;
    }
    let mut drained: BpfHashMap<_, LockKey, LockStats> =
        BpfHashMap::try_from(map_mut(ebpf, name)?).map_err(map_err(name))?;
    for key in &stats_keys {
        // No program writes this map now; a failed removal only leaves an
        // entry that is read again (and removed) two ticks later.
        let _ = drained.remove(key);
    }
    let mut drained: BpfHashMap<_, DetailKey, DetailStats> =
        BpfHashMap::try_from(map_mut(ebpf, details_name)?).map_err(map_err(details_name))?;
    for key in &detail_keys {
        let _ = drained.remove(key);
    }
    Ok((taken, name))
}

/// Waits until every BPF program running now has returned: they run inside
/// RCU read-side sections, and `membarrier(MEMBARRIER_CMD_GLOBAL)` is
/// `synchronize_rcu()`. Where it is refused (nohz_full), a generous sleep:
/// the programs run for microseconds.
fn rcu_grace_period() {
    const MEMBARRIER_CMD_GLOBAL: libc::c_long = 1;
    // SAFETY: membarrier takes no pointers.
    let done = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) } == 0;
    if !done {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `LOCK_INFO` and `LOCK_USERS`, read into memory.
#[derive(Default)]
pub struct Identities {
    pub info: HashMap<LockKey, LockInfo>,
    /// (tgid, comm) of the processes seen on each lock.
    pub users: HashMap<LockKey, Vec<(u32, String)>>,
    /// Owners' and waiters' process ids and names, by thread id.
    pub tasks: TaskNames,
    /// Call stacks (return addresses, innermost first) by id in `STACKS`.
    pub stacks: HashMap<u32, Vec<u64>>,
}

impl Identities {
    /// Keeps what `fresh` adds: identities stay known to the collector after
    /// the kernel's LRU map has evicted them.
    pub fn merge(&mut self, fresh: &Identities) {
        self.info.extend(fresh.info.iter().map(|(k, v)| (*k, *v)));
        self.tasks
            .extend(fresh.tasks.iter().map(|(k, v)| (*k, v.clone())));
        self.stacks
            .extend(fresh.stacks.iter().map(|(k, v)| (*k, v.clone())));
        for (key, users) in &fresh.users {
            let known = self.users.entry(*key).or_default();
            known.extend(users.iter().cloned());
            known.sort();
            known.dedup();
        }
    }
}

/// What each lock is and who was seen on it (read once per report or tick:
/// the process map can hold thousands of entries, two syscalls each).
pub fn read_identities(ebpf: &Ebpf) -> Result<Identities, Error> {
    let info: BpfHashMap<_, LockKey, LockInfo> =
        BpfHashMap::try_from(map(ebpf, maps::LOCK_INFO)?).map_err(map_err(maps::LOCK_INFO))?;
    let users: BpfHashMap<_, LockUser, [u8; 16]> =
        BpfHashMap::try_from(map(ebpf, maps::LOCK_USERS)?).map_err(map_err(maps::LOCK_USERS))?;
    let mut ids = Identities::default();
    for entry in info.iter() {
        let (lock, lock_info) = entry.map_err(map_err(maps::LOCK_INFO))?;
        ids.info.insert(lock, lock_info);
    }
    for entry in users.iter() {
        let (user, comm) = entry.map_err(map_err(maps::LOCK_USERS))?;
        ids.users
            .entry(user.key)
            .or_default()
            .push((user.tgid, comm_text(&comm)));
    }
    let tasks: BpfHashMap<_, u32, TaskName> =
        BpfHashMap::try_from(map(ebpf, maps::TASK_NAMES)?).map_err(map_err(maps::TASK_NAMES))?;
    for entry in tasks.iter() {
        let (tid, name) = entry.map_err(map_err(maps::TASK_NAMES))?;
        ids.tasks.insert(tid, (name.tgid, comm_text(&name.comm)));
    }
    Ok(ids)
}

/// Adds the call stacks `details` name that `known` lacks (ids stay
/// valid: the stack map is never emptied, so each is read once).
pub fn read_stacks(
    ebpf: &Ebpf,
    details: &Details,
    known: &Identities,
    into: &mut Identities,
) -> Result<(), Error> {
    let wanted: Vec<u32> = details
        .keys()
        .filter(|k| k.kind == pipelock_common::detail::CALLER && k.id != pipelock_common::NO_STACK)
        .map(|k| k.id)
        .filter(|id| !known.stacks.contains_key(id) && !into.stacks.contains_key(id))
        .collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let stacks =
        aya::maps::StackTraceMap::try_from(map(ebpf, maps::STACKS)?).map_err(map_err(maps::STACKS))?;
    for id in wanted {
        // A missing id was a failed store the programs counted.
        if let Ok(trace) = stacks.get(&id, 0) {
            into.stacks
                .insert(id, trace.frames().iter().map(|f| f.ip).collect());
        }
    }
    Ok(())
}

/// Reads the identities and removes what was read from the kernel's maps:
/// the collector keeps them, so each tick reads only what is new, and the
/// maps hold the locks of one interval, not of every lock ever seen. A lock
/// whose identity is gone is named again by the next program that needs it.
pub fn take_identities(ebpf: &mut Ebpf) -> Result<Identities, Error> {
    let ids = read_identities(ebpf)?;
    let mut info: BpfHashMap<_, LockKey, LockInfo> =
        BpfHashMap::try_from(map_mut(ebpf, maps::LOCK_INFO)?).map_err(map_err(maps::LOCK_INFO))?;
    for key in ids.info.keys() {
        let _ = info.remove(key);
    }
    let mut users: BpfHashMap<_, LockUser, [u8; 16]> =
        BpfHashMap::try_from(map_mut(ebpf, maps::LOCK_USERS)?).map_err(map_err(maps::LOCK_USERS))?;
    for (key, seen) in &ids.users {
        for (tgid, _) in seen {
            let _ = users.remove(&LockUser {
                key: *key,
                tgid: *tgid,
                _pad: 0,
            });
        }
    }
    let mut tasks: BpfHashMap<_, u32, TaskName> =
        BpfHashMap::try_from(map_mut(ebpf, maps::TASK_NAMES)?).map_err(map_err(maps::TASK_NAMES))?;
    for tid in ids.tasks.keys() {
        let _ = tasks.remove(tid);
    }
    Ok(ids)
}

fn map_mut<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut Map, Error> {
    ebpf.map_mut(name).ok_or_else(|| Error::Missing {
        kind: "map",
        name: name.to_owned(),
    })
}

/// Every thread seen asking for a mutex it owns since attach (the map is
/// never emptied; a few entries at most).
pub fn read_asked_twice(ebpf: &Ebpf) -> Result<Vec<(AskedKey, AskedTwice)>, Error> {
    let table: BpfHashMap<_, AskedKey, AskedTwice> =
        BpfHashMap::try_from(map(ebpf, maps::ASKED_TWICE)?).map_err(map_err(maps::ASKED_TWICE))?;
    table
        .iter()
        .map(|entry| entry.map_err(map_err(maps::ASKED_TWICE)))
        .collect()
}

/// The return addresses of stack `id` in `STACKS`, innermost first (empty
/// for `NO_STACK` or a stack the map no longer has).
pub fn read_stack(ebpf: &Ebpf, id: u32) -> Vec<u64> {
    if id == pipelock_common::NO_STACK {
        return Vec::new();
    }
    map(ebpf, maps::STACKS)
        .ok()
        .and_then(|stacks| aya::maps::StackTraceMap::try_from(stacks).ok())
        .and_then(|stacks| stacks.get(&id, 0).ok())
        .map(|trace| trace.frames().iter().map(|f| f.ip).collect())
        .unwrap_or_default()
}

/// The `DROPS` counters by reason, summed over CPUs.
pub fn read_drops(ebpf: &Ebpf) -> Result<BTreeMap<String, u64>, Error> {
    let drops: PerCpuArray<_, u64> =
        PerCpuArray::try_from(map(ebpf, maps::DROPS)?).map_err(map_err(maps::DROPS))?;
    let mut dropped = BTreeMap::new();
    for reason in Drop::ALL {
        let per_cpu = drops.get(&(reason as u32), 0).map_err(map_err(maps::DROPS))?;
        dropped.insert(reason.name().to_owned(), per_cpu.iter().sum());
    }
    Ok(dropped)
}

/// How full each of pipelock's maps is: a full map drops events.
pub fn map_fill(ebpf: &Ebpf, ids: &Identities) -> Vec<MapFill> {
    // Counting keys costs a syscall per entry: the identity maps were just
    // read, so only the statistics and breakdown maps are walked (called
    // after a drain, all are nearly empty; the drained ones' counts are what
    // was taken).
    // The LRU maps (lockref state, names) evict the oldest instead of
    // dropping events, the per-thread slots are reused, and the owner and
    // stack maps would cost a syscall per entry: their fill is not counted
    // here (a full one counts its drops).
    let count = |name: &str| -> Option<usize> {
        let map = ebpf.map(name)?;
        match name {
            name if maps::LOCK_STATS.contains(&name) => Some(
                BpfHashMap::<_, LockKey, LockStats>::try_from(map)
                    .ok()?
                    .keys()
                    .count(),
            ),
            name if maps::LOCK_DETAILS.contains(&name) => Some(
                BpfHashMap::<_, DetailKey, DetailStats>::try_from(map)
                    .ok()?
                    .keys()
                    .count(),
            ),
            maps::LOCK_INFO => Some(ids.info.len()),
            maps::LOCK_USERS => Some(ids.users.values().map(Vec::len).sum()),
            _ => None,
        }
    };
    [
        maps::LOCK_STATS[0],
        maps::LOCK_STATS[1],
        maps::LOCK_DETAILS[0],
        maps::LOCK_DETAILS[1],
        maps::LOCK_INFO,
        maps::LOCK_USERS,
        maps::TASK_NAMES,
        maps::WATCHED,
        maps::STACKS,
        maps::TASK_WAITS,
        maps::TASK_PIPE,
        maps::TASK_LOCKREF,
    ]
    .into_iter()
    .filter_map(|name| {
        let (Map::HashMap(data)
        | Map::LruHashMap(data)
        | Map::PerCpuHashMap(data)
        | Map::Array(data)
        | Map::StackTraceMap(data)) = ebpf.map(name)?
        else {
            return None;
        };
        Some(MapFill {
            name: name.to_owned(),
            used: count(name),
            capacity: data.info().ok()?.max_entries(),
            memlock_bytes: memlock(data.fd().as_fd().as_raw_fd()),
        })
    })
    .collect()
}

/// `memlock:` of one of this process's BPF map descriptors.
fn memlock(fd: i32) -> Option<u64> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("memlock:"))
        .and_then(|v| v.trim().parse().ok())
}
