//! Reading the programs' maps: per-lock statistics (merged over CPUs, and
//! drained per tick), what each lock is and who used it, drops, map fill.
use std::{
    collections::{BTreeMap, HashMap},
    os::fd::{AsFd as _, AsRawFd as _},
};

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, Map, MapError, PerCpuArray, PerCpuHashMap},
};
use pipelock_common::{Drop, LockInfo, LockStats, LockUser, Pending, maps};

use crate::{
    Error,
    model::{MapFill, naming::comm_text, timing::merge_stats},
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

/// Every traced lock's statistics, the CPUs merged.
pub fn read_stats(ebpf: &Ebpf) -> Result<HashMap<u64, LockStats>, Error> {
    let stats: PerCpuHashMap<_, u64, LockStats> =
        PerCpuHashMap::try_from(map(ebpf, maps::LOCK_STATS)?).map_err(map_err(maps::LOCK_STATS))?;
    let mut merged = HashMap::new();
    for entry in stats.iter() {
        let (lock, per_cpu) = entry.map_err(map_err(maps::LOCK_STATS))?;
        let total = merged.entry(lock).or_insert(LockStats::EMPTY);
        for cpu in per_cpu.iter() {
            merge_stats(total, cpu);
        }
    }
    Ok(merged)
}

/// Reads the statistics and removes what was read from the kernel, so the
/// next read holds only what happened since (klockstat's `-i`). An event
/// landing on a lock between its read and its removal is lost: a window of
/// microseconds per lock.
pub fn take_stats(ebpf: &mut Ebpf) -> Result<HashMap<u64, LockStats>, Error> {
    let stats = read_stats(ebpf)?;
    let map = ebpf.map_mut(maps::LOCK_STATS).ok_or_else(|| Error::Missing {
        kind: "map",
        name: maps::LOCK_STATS.to_owned(),
    })?;
    let mut live: PerCpuHashMap<_, u64, LockStats> =
        PerCpuHashMap::try_from(map).map_err(map_err(maps::LOCK_STATS))?;
    for lock in stats.keys() {
        // Already gone is fine: nothing else removes entries.
        let _ = live.remove(lock);
    }
    Ok(stats)
}

/// `LOCK_INFO` and `LOCK_USERS`, read into memory.
#[derive(Default)]
pub struct Identities {
    pub info: HashMap<u64, LockInfo>,
    /// (tgid, comm) of the processes seen on each lock.
    pub users: HashMap<u64, Vec<(u32, String)>>,
}

/// What each lock is and who was seen on it (read once per report or tick:
/// the process map can hold thousands of entries, two syscalls each).
pub fn read_identities(ebpf: &Ebpf) -> Result<Identities, Error> {
    let info: BpfHashMap<_, u64, LockInfo> =
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
            .entry(user.lock)
            .or_default()
            .push((user.tgid, comm_text(&comm)));
    }
    Ok(ids)
}

/// The `DROPS` counters by reason, summed over CPUs.
pub fn read_drops(ebpf: &Ebpf) -> Result<BTreeMap<String, u64>, Error> {
    let drops: PerCpuArray<_, u64> =
        PerCpuArray::try_from(map(ebpf, maps::DROPS)?).map_err(map_err(maps::DROPS))?;
    let names = [
        "pending_full",
        "stats_full",
        "unmatched_end",
        "nested",
        "users_full",
    ];
    let mut dropped = BTreeMap::new();
    for (reason, name) in Drop::ALL.iter().zip(names) {
        let per_cpu = drops.get(&(*reason as u32), 0).map_err(map_err(maps::DROPS))?;
        dropped.insert(name.to_owned(), per_cpu.iter().sum());
    }
    Ok(dropped)
}

/// How full each of pipelock's maps is: a full map drops events.
pub fn map_fill(ebpf: &Ebpf, ids: &Identities) -> Vec<MapFill> {
    // Counting keys costs a syscall per entry: the identity maps were just
    // read, so only the small per-tick maps are walked here. The per-thread
    // LRU maps evict old threads instead of dropping events; their fill is
    // not counted.
    let count = |name: &str| -> Option<usize> {
        let map = ebpf.map(name)?;
        match name {
            maps::LOCK_STATS => Some(
                PerCpuHashMap::<_, u64, LockStats>::try_from(map)
                    .ok()?
                    .keys()
                    .count(),
            ),
            maps::PENDING => Some(BpfHashMap::<_, u32, Pending>::try_from(map).ok()?.keys().count()),
            maps::LOCK_INFO => Some(ids.info.len()),
            maps::LOCK_USERS => Some(ids.users.values().map(Vec::len).sum()),
            _ => None,
        }
    };
    [
        maps::LOCK_STATS,
        maps::LOCK_INFO,
        maps::LOCK_USERS,
        maps::PENDING,
        maps::TASK_PIPE,
        maps::TASK_LOCKREF,
    ]
    .into_iter()
    .filter_map(|name| {
        let (Map::HashMap(data) | Map::LruHashMap(data) | Map::PerCpuHashMap(data)) = ebpf.map(name)? else {
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
