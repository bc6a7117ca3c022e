//! How big pipelock's kernel maps are (`--max-locks`), and what they cost
//! in kernel memory on a machine of any CPU count: computed from the
//! object's map definitions the way the kernel accounts them
//! (`htab_map_mem_usage`, `array_map_mem_usage`, 6.4+), and checked
//! against the kernel's own `memlock` figure by the integration tests.
use std::ops::RangeInclusive;

use aya_obj::generated::bpf_map_type::{
    BPF_MAP_TYPE_ARRAY, BPF_MAP_TYPE_HASH, BPF_MAP_TYPE_LRU_HASH, BPF_MAP_TYPE_PERCPU_ARRAY,
    BPF_MAP_TYPE_PERCPU_HASH, BPF_MAP_TYPE_PERF_EVENT_ARRAY, BPF_MAP_TYPE_STACK_TRACE,
};
use pipelock_common::maps;

use crate::Error;

/// Locks the statistics maps hold per drain unless `--max-locks` says
/// otherwise (like `perf lock contention -M`).
pub const DEFAULT_MAX_LOCKS: u32 = 4096;
/// What `--max-locks` accepts: fewer than 16 locks cannot hold one pipe's
/// locks and their neighbours; beyond 256 Ki the statistics alone take
/// over half a GiB of kernel memory.
pub const MAX_LOCKS: RangeInclusive<u32> = 16..=262_144;

/// Call stacks the stack map holds unless `--stack-map-size` says otherwise.
pub const DEFAULT_STACKS: u32 = 4096;
/// What `--stack-map-size` accepts (each stack takes ~280 bytes).
pub const STACKS: RangeInclusive<u32> = 16..=262_144;

/// The sizes of the maps that grow with the number of locks traced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSizes {
    /// Entries of each statistics map (locks seen in one drain).
    pub max_locks: u32,
    /// Distinct call stacks kept (`--callers`).
    pub stacks: u32,
}

impl Default for MapSizes {
    fn default() -> Self {
        Self {
            max_locks: DEFAULT_MAX_LOCKS,
            stacks: DEFAULT_STACKS,
        }
    }
}

impl MapSizes {
    /// `--max-locks N`, checked.
    pub fn new(max_locks: Option<u32>) -> Result<Self, Error> {
        Self::with_stacks(max_locks, None)
    }

    /// `--max-locks N` and `--stack-map-size N`, checked.
    pub fn with_stacks(max_locks: Option<u32>, stacks: Option<u32>) -> Result<Self, Error> {
        let check = |flag: &str, value: Option<u32>, default: u32, range: &RangeInclusive<u32>| {
            let value = value.unwrap_or(default);
            if range.contains(&value) {
                Ok(value)
            } else {
                Err(Error::Usage(format!(
                    "{flag} {value}: must be between {} and {}",
                    range.start(),
                    range.end()
                )))
            }
        };
        Ok(Self {
            max_locks: check("--max-locks", max_locks, DEFAULT_MAX_LOCKS, &MAX_LOCKS)?,
            stacks: check("--stack-map-size", stacks, DEFAULT_STACKS, &STACKS)?,
        })
    }

    /// (map, entries) set at load: the statistics maps hold `max_locks`
    /// locks; identities and processes are kept for 4× and 2× as many
    /// (several rows per pipe, several processes per lock), as at the
    /// defaults, and the breakdowns (owners, callers, tasks) for 4×.
    pub fn overrides(&self) -> [(&'static str, u32); 7] {
        let n = self.max_locks;
        [
            (maps::STACKS, self.stacks),
            (maps::LOCK_STATS[0], n),
            (maps::LOCK_STATS[1], n),
            (maps::LOCK_INFO, 4 * n),
            (maps::LOCK_USERS, 2 * n),
            (maps::LOCK_DETAILS[0], 4 * n),
            (maps::LOCK_DETAILS[1], 4 * n),
        ]
    }
}

/// One map as the object defines it, with the load-time sizes applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapShape {
    pub name: String,
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
}

/// Every map of the eBPF object `object`, sized as `sizes` makes them.
pub fn object_shapes(object: &[u8], sizes: &MapSizes) -> Result<Vec<MapShape>, Error> {
    let parsed = aya_obj::Object::parse(object).map_err(|e| Error::Load {
        source: aya::EbpfError::ParseError(e),
    })?;
    let overrides = sizes.overrides();
    let mut shapes: Vec<MapShape> = parsed
        .maps
        .iter()
        .map(|(name, map)| MapShape {
            name: name.clone(),
            map_type: map.map_type(),
            key_size: map.key_size(),
            value_size: map.value_size(),
            max_entries: overrides
                .iter()
                .find(|(n, _)| n == name)
                .map_or(map.max_entries(), |&(_, entries)| entries),
        })
        .collect();
    shapes.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(shapes)
}

const fn round8(n: u64) -> u64 {
    n.div_ceil(8) * 8
}

/// `struct bpf_htab` / `struct bpf_array` with their embedded `bpf_map`
/// (x86-64, rounded up: a few hundred bytes per map either way).
const MAP_HEADER: u64 = 512;
/// `struct htab_elem` before its key: hash-list node, LRU node, hash.
const HTAB_ELEM: u64 = 48;
/// `struct bucket`: list head and spinlock.
const BUCKET: u64 = 16;
/// `struct stack_map_bucket` before its frames: freelist node, hash, count.
const STACK_BUCKET: u64 = 16;
/// `HASHTAB_MAP_LOCK_COUNT` per-CPU `int`s of every hash map.
const HTAB_LOCKS: u64 = 8;

/// Kernel memory of one map on a machine with `cpus` possible CPUs.
pub fn kernel_bytes(shape: &MapShape, cpus: u64) -> u64 {
    let (key, value, entries) = (
        round8(u64::from(shape.key_size)),
        round8(u64::from(shape.value_size)),
        u64::from(shape.max_entries),
    );
    match shape.map_type {
        t if t == BPF_MAP_TYPE_HASH as u32
            || t == BPF_MAP_TYPE_LRU_HASH as u32
            || t == BPF_MAP_TYPE_PERCPU_HASH as u32 =>
        {
            let percpu = t == BPF_MAP_TYPE_PERCPU_HASH as u32;
            let lru = t == BPF_MAP_TYPE_LRU_HASH as u32;
            let elem = HTAB_ELEM + key + if percpu { 8 } else { value };
            let mut usage = MAP_HEADER + BUCKET * entries.next_power_of_two() + 4 * cpus * HTAB_LOCKS;
            // Plain hash maps keep one spare element per CPU for updates.
            let elems = if percpu || lru { entries } else { entries + cpus };
            usage += elem * elems;
            if percpu {
                usage += value * cpus * elems;
            } else if !lru {
                usage += 8 * cpus;
            }
            usage
        }
        t if t == BPF_MAP_TYPE_PERCPU_ARRAY as u32 => MAP_HEADER + entries * 8 + entries * value * cpus,
        t if t == BPF_MAP_TYPE_ARRAY as u32 => MAP_HEADER + entries * value,
        // One slot per CPU (aya sizes it to the CPU count).
        t if t == BPF_MAP_TYPE_PERF_EVENT_ARRAY as u32 => MAP_HEADER + 8 * cpus,
        // A bucket pointer per (power-of-two) slot; each preallocated
        // `stack_map_bucket` holds its header and the frames.
        t if t == BPF_MAP_TYPE_STACK_TRACE as u32 => {
            MAP_HEADER + 8 * entries.next_power_of_two() + entries * (STACK_BUCKET + value)
        }
        _ => MAP_HEADER,
    }
}

/// All the maps' kernel memory on a machine with `cpus` possible CPUs.
pub fn total_bytes(shapes: &[MapShape], cpus: u64) -> u64 {
    shapes.iter().map(|s| kernel_bytes(s, cpus)).sum()
}

#[cfg(test)]
mod tests {
    use std::mem::size_of;

    use pipelock_common::{LockKey, LockStats};

    use super::*;

    const MIB: u64 = 1 << 20;

    fn shape(name: &str, map_type: u32, key: usize, value: usize, entries: u32) -> MapShape {
        MapShape {
            name: name.to_owned(),
            map_type,
            key_size: key as u32,
            value_size: value as u32,
            max_entries: entries,
        }
    }

    /// The statistics maps at the default size: shared, they cost nearly
    /// the same on 2 and 256 CPUs (a spare element per CPU); per CPU they
    /// would take ~2.3 GiB on 256.
    #[test]
    fn statistics_memory_does_not_grow_with_the_cpu_count() {
        let (key, value) = (size_of::<LockKey>(), size_of::<LockStats>());
        let shared = shape(
            "LOCK_STATS_A",
            BPF_MAP_TYPE_HASH as u32,
            key,
            value,
            DEFAULT_MAX_LOCKS,
        );
        let per_cpu = MapShape {
            map_type: BPF_MAP_TYPE_PERCPU_HASH as u32,
            ..shared.clone()
        };
        let (two, many) = (kernel_bytes(&shared, 2), kernel_bytes(&shared, 256));
        // A value: 3 counters, 2 histograms of 3 figures and 272 u32
        // buckets, the last holder: 2256 bytes. 4096 + 256 elements of
        // 2256 + 16 + 48 bytes: 10.1 MB.
        assert_eq!(value, 2256);
        assert!(many - two < MIB, "{two} vs {many}");
        assert!(many < 11 * MIB, "one statistics map: {many} bytes");
        // 4096 × 256 × 2256 bytes of values alone.
        assert!(kernel_bytes(&per_cpu, 256) > 2200 * MIB);
    }

    /// The bound the maps are designed to: every map of the object at the default sizes on
    /// a 256-CPU machine, ≤ 64 MiB.
    #[test]
    fn every_map_at_the_defaults_fits_64_mib_on_256_cpus() {
        if crate::bpf::object::OBJECT.is_empty() {
            // A stub build has no object to measure; the real build (xtask) has.
            eprintln!("skipped: no eBPF object in this build (PIPELOCK_EBPF_STUB)");
            return;
        }
        let shapes = object_shapes(crate::bpf::object::OBJECT, &MapSizes::default()).unwrap();
        for name in maps::LOCK_STATS
            .iter()
            .chain([&maps::LOCK_INFO, &maps::TASK_WAITS, &maps::TASK_PIPE])
        {
            assert!(shapes.iter().any(|s| s.name == *name), "{name} not in {shapes:?}");
        }
        let total = total_bytes(&shapes, 256);
        let mib = |bytes: u64| bytes as f64 / MIB as f64;
        println!(
            "every map at the defaults: {:.1} MiB on 2 CPUs, {:.1} MiB on 256",
            mib(total_bytes(&shapes, 2)),
            mib(total)
        );
        assert!(total <= 64 * MIB, "{:.1} MiB", mib(total));
        // --max-locks scales the lock maps, and only them.
        let big = object_shapes(
            crate::bpf::object::OBJECT,
            &MapSizes::new(Some(8 * DEFAULT_MAX_LOCKS)).unwrap(),
        )
        .unwrap();
        let stats = |s: &[MapShape]| {
            s.iter()
                .find(|m| m.name == maps::LOCK_STATS[1])
                .unwrap()
                .max_entries
        };
        assert_eq!((stats(&shapes), stats(&big)), (4096, 32768));
        assert!(total_bytes(&big, 256) > total);
    }

    #[test]
    fn max_locks_outside_its_range_is_refused_by_name() {
        assert_eq!(MapSizes::new(None).unwrap(), MapSizes::default());
        for bad in [0, 15, 262_145, u32::MAX] {
            let err = MapSizes::new(Some(bad)).unwrap_err().to_string();
            assert!(err.contains(&format!("--max-locks {bad}")), "{err}");
        }
        assert_eq!(
            MapSizes::new(Some(16)).unwrap().overrides()[3],
            (maps::LOCK_INFO, 64)
        );
        for bad in [0, 15, 262_145] {
            let err = MapSizes::with_stacks(None, Some(bad)).unwrap_err().to_string();
            assert!(err.contains(&format!("--stack-map-size {bad}")), "{err}");
        }
        assert_eq!(
            MapSizes::with_stacks(None, Some(64)).unwrap().overrides()[0],
            (maps::STACKS, 64)
        );
    }
}
