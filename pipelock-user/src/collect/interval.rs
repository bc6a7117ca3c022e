//! `--interval`, `pipelock top`, and every trace's once-a-second drain: each
//! tick takes what the kernel gathered since the last one and keeps the
//! running total in userspace, so both the interval's figures (max
//! included) and the whole run's are exact.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::Instant,
};

use pipelock_common::{LockKey, LockStats};

use super::{Tracer, rows};
use crate::{
    Error,
    bpf::maps::{self, Identities, Taken},
    model::{
        CollectorFill, LockClass, MapFill, Snapshot, SortKey, TraceReport,
        owners::{fold_details, merge_details},
        sort_rows,
        timing::merge_stats,
    },
};

/// Everything since attach (or the last reset), bounded: no aya, no I/O.
/// Parts (owners, callers, tasks) the running total keeps per tracked lock
/// on average: its bound in all (past it, every lock keeps its four
/// busiest: what is left fits well under the bound, so this is rare).
const MAX_DETAILS_PER_LOCK_AVG: usize = 8;

/// Thread names kept however few parts refer to them (below this the
/// clean-up is not worth its pass).
const NAMES_FLOOR: usize = 1024;

/// Owners (callers, tasks) a running total keeps one by one per lock; the
/// rest are summed in one "other" part.
pub const MAX_PARTS_PER_LOCK: usize = 64;

pub struct RunningTotal {
    /// Per lock, and per lock by owner, caller or task.
    pub taken: Taken,
    /// The tick each lock of `stats` was last active in.
    last_seen: HashMap<LockKey, u64>,
    /// Locks folded out of `stats`, by class: (how many, their sum).
    pub retired: BTreeMap<Option<LockClass>, (u64, LockStats<u64>)>,
    /// Identities of the locks in `stats` (the kernel's maps give each once).
    pub known: Identities,
    ticks: u64,
    max_tracked: usize,
}

impl RunningTotal {
    pub fn new(max_tracked: usize) -> Self {
        // Room for twice the bound from the start: a table at its bound
        // that entries keep leaving and joining is rehashed in place, never
        // grown, so memory settles once the bound is reached.
        let mut taken = Taken::default();
        taken.stats.reserve(2 * max_tracked);
        taken.details.reserve(MAX_DETAILS_PER_LOCK_AVG * max_tracked);
        let mut known = Identities::default();
        known.info.reserve(2 * max_tracked);
        known.users.reserve(2 * max_tracked);
        known.tasks.reserve(MAX_DETAILS_PER_LOCK_AVG * max_tracked);
        Self {
            taken,
            last_seen: HashMap::with_capacity(2 * max_tracked),
            retired: BTreeMap::new(),
            known,
            ticks: 0,
            max_tracked,
        }
    }

    /// How full the running total is, for the `--verbose` report.
    pub fn fill(&self) -> CollectorFill {
        CollectorFill {
            tracked: self.taken.stats.len(),
            max_tracked: self.max_tracked,
            retired: self.retired.values().map(|(count, _)| count).sum(),
            resident_bytes: resident_bytes(),
        }
    }

    pub fn clear(&mut self) {
        self.taken.stats.clear();
        self.taken.details.clear();
        self.last_seen.clear();
        self.retired.clear();
    }

    /// Adds one tick's statistics and identities.
    pub fn add(&mut self, fresh: &Taken, ids: &Identities) {
        self.known.merge(ids);
        self.ticks += 1;
        merge_details(&mut self.taken.details, &fresh.details);
        fold_details(&mut self.taken.details, MAX_PARTS_PER_LOCK);
        // Bounded in all, not only per lock.
        if self.taken.details.len() > MAX_DETAILS_PER_LOCK_AVG * self.max_tracked {
            fold_details(&mut self.taken.details, 4);
        }
        // Names of threads no part refers to any more (folded, retired),
        // once the table holds twice as many names as there are parts:
        // threads come and go by the thousand, and a clean-up every few
        // ticks would let the table peak at what those ticks brought, so
        // the collector's memory would follow the churn's rate instead of
        // its bound. Each pass at least halves the table: paid once per
        // as many new names as it keeps.
        if self.known.tasks.len() > NAMES_FLOOR.max(2 * self.taken.details.len()) {
            let named: HashSet<u32> = self.taken.details.keys().map(|k| k.id).collect();
            self.known.tasks.retain(|tid, _| named.contains(tid));
        }
        for (key, stats) in &fresh.stats {
            merge_stats(
                self.taken
                    .stats
                    .entry(*key)
                    .or_insert_with(|| Box::new(LockStats::EMPTY)),
                stats,
            );
            self.last_seen.insert(*key, self.ticks);
        }
        self.retire();
    }

    /// Folds the longest-idle locks beyond the limit into per-class sums,
    /// and forgets their identities.
    fn retire(&mut self) {
        if self.taken.stats.len() <= self.max_tracked {
            return;
        }
        // Down to 90 %, so this is not paid again on the next tick.
        let keep = self.max_tracked * 9 / 10;
        let mut idle: Vec<(u64, LockKey)> = self.last_seen.iter().map(|(k, t)| (*t, *k)).collect();
        idle.sort_unstable();
        for (_, key) in idle.into_iter().take(self.taken.stats.len() - keep) {
            let Some(stats) = self.taken.stats.remove(&key) else {
                continue;
            };
            self.last_seen.remove(&key);
            let class = self
                .known
                .info
                .get(&key)
                .and_then(|i| LockClass::from_id(i.class));
            let (count, sum) = self.retired.entry(class).or_insert((0, LockStats::EMPTY));
            *count += 1;
            merge_stats(sum, &stats);
        }
        let stats = &self.taken.stats;
        // A retired row is a sum: its owners and callers go with it.
        self.taken.details.retain(|key, _| stats.contains_key(&key.lock));
        self.known.info.retain(|key, _| stats.contains_key(key));
        // A pipe's wait-queue rows take their processes from its mutex's key.
        let owners: HashSet<u64> = stats.keys().map(|k| k.owner).collect();
        self.known.users.retain(|key, _| owners.contains(&key.owner));
    }
}

pub struct IntervalCollector {
    total: RunningTotal,
    last: Instant,
    /// When the running total starts (attach, or the last reset).
    since: Instant,
    /// `track_parts`: the figures since the previous part ended, so a
    /// command that runs its workload several times can report each run's
    /// own locks (their identities come from `total`).
    part: Option<(RunningTotal, Instant)>,
}

impl IntervalCollector {
    pub fn new(tracer: &Tracer) -> Self {
        Self {
            total: RunningTotal::new(tracer.track_locks()),
            last: tracer.started(),
            since: tracer.started(),
            part: None,
        }
    }

    /// Keeps a second running total that `end_part` reports and restarts.
    pub fn track_parts(&mut self) {
        self.part = Some((RunningTotal::new(self.total.max_tracked), Instant::now()));
    }

    /// Starts the running total afresh (`r` in `pipelock top`).
    pub fn reset(&mut self) {
        self.total.clear();
        self.since = Instant::now();
    }

    /// Takes what the kernel gathered since the last drain into the
    /// running total; returns it (the interval's own figures) with the
    /// maps' fill. No report is built: long traces drain every second.
    pub fn drain(&mut self, tracer: &mut Tracer) -> Result<Drained, Error> {
        let (fresh, drained) = maps::take_stats(tracer.ebpf_mut())?;
        // After the swap: every program that wrote those statistics has
        // returned, and named its locks first.
        let mut fresh_ids = maps::take_identities(tracer.ebpf_mut())?;
        maps::read_stacks(tracer.ebpf(), &fresh.details, &self.total.known, &mut fresh_ids)?;
        let mut fill = maps::map_fill(tracer.ebpf(), &fresh_ids);
        // The drained maps were as full as what they gave (empty now).
        let slot = pipelock_common::maps::LOCK_STATS
            .iter()
            .position(|m| *m == drained);
        let drained_details = slot.map_or("", |slot| pipelock_common::maps::LOCK_DETAILS[slot]);
        for map in &mut fill {
            if map.name == drained {
                map.used = Some(fresh.stats.len());
            } else if map.name == drained_details {
                map.used = Some(fresh.details.len());
            }
        }
        self.total.add(&fresh, &fresh_ids);
        if let Some((part, _)) = &mut self.part {
            part.add(&fresh, &Identities::default());
        }
        tracer.take_asked_twice()?;
        let interval = self.last.elapsed();
        self.last = Instant::now();
        Ok(Drained {
            fresh,
            fill,
            interval,
        })
    }

    /// The report of one drain's figures alone.
    pub fn interval_report(&self, tracer: &Tracer, drained: &Drained) -> Result<TraceReport, Error> {
        let mut report = tracer.build_report(&drained.fresh, &self.total.known, drained.interval)?;
        report.maps = drained.fill.clone();
        report.collector = Some(self.total.fill());
        Ok(report)
    }

    /// The report of everything since attach (or the last reset), the
    /// retired locks folded in per class.
    pub fn total_report(&self, tracer: &Tracer, fill: &[MapFill]) -> Result<TraceReport, Error> {
        let mut total = report_of(tracer, &self.total, &self.total.known, self.since)?;
        total.maps = fill.to_vec();
        total.collector = Some(self.total.fill());
        Ok(total)
    }

    /// Drains, then reports what the kernel gathered since the previous
    /// part ended (or since `track_parts`), and starts the next part.
    pub fn end_part(&mut self, tracer: &mut Tracer) -> Result<TraceReport, Error> {
        let drained = self.drain(tracer)?;
        let Some((part, since)) = &mut self.part else {
            return Err(Error::Usage("the collector keeps no parts".into()));
        };
        let mut report = report_of(tracer, part, &self.total.known, *since)?;
        report.maps = drained.fill;
        part.clear();
        *since = Instant::now();
        Ok(report)
    }

    /// A drain with both reports (`pipelock top` shows both).
    pub fn tick(&mut self, tracer: &mut Tracer) -> Result<Snapshot, Error> {
        let drained = self.drain(tracer)?;
        Ok(Snapshot {
            interval: self.interval_report(tracer, &drained)?,
            total: self.total_report(tracer, &drained.fill)?,
            fill: drained.fill,
        })
    }
}

/// The report of a running total, its retired locks folded in per class.
fn report_of(
    tracer: &Tracer,
    total: &RunningTotal,
    known: &Identities,
    since: Instant,
) -> Result<TraceReport, Error> {
    let mut report = tracer.build_report(&total.taken, known, since.elapsed())?;
    if !total.retired.is_empty() {
        let (mode, hooked) = (tracer.short_mode(), tracer.attached().mode.is_hooked());
        for (class, (count, stats)) in &total.retired {
            report
                .locks
                .push(rows::retired(*class, *count, stats, &mode, hooked));
        }
        sort_rows(&mut report.locks, SortKey::WaitTotal);
        report.totals = TraceReport::totals(&report.locks);
    }
    Ok(report)
}

/// `VmRSS` of pipelock's own process.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// One drain: the figures since the previous one, and the maps' fill.
pub struct Drained {
    pub fresh: Taken,
    pub fill: Vec<MapFill>,
    pub interval: std::time::Duration,
}

#[cfg(test)]
mod tests {
    use pipelock_common::LockInfo;

    use super::*;

    fn contended(n: u64) -> LockStats<u64> {
        LockStats {
            contentions: n,
            ..LockStats::EMPTY
        }
    }

    /// A churning system: every tick brings new locks. The total stays at
    /// its limit, nothing is lost from the sums, and the idle go first.
    #[test]
    fn a_running_total_stays_bounded_and_loses_nothing() {
        let mut total = RunningTotal::new(100);
        let mut sum = 0;
        for tick in 0..50u64 {
            let mut fresh = Taken::default();
            let mut ids = Identities::default();
            for i in 0..20 {
                let key = LockKey {
                    lock: 0x1000 + i,
                    owner: tick * 100 + i,
                };
                fresh.stats.insert(key, Box::new(contended(i + 1)));
                ids.info.insert(
                    key,
                    LockInfo {
                        class: LockClass::PipeMutex.id(),
                        ..LockInfo::default()
                    },
                );
                sum += i + 1;
            }
            // One lock stays busy all along: it must never be retired.
            let busy = LockKey { lock: 1, owner: 1 };
            fresh.stats.insert(busy, Box::new(contended(1)));
            sum += 1;
            total.add(&fresh, &ids);
            assert!(
                total.taken.stats.len() <= 100,
                "tick {tick}: {} locks",
                total.taken.stats.len()
            );
            assert!(
                total.taken.stats.contains_key(&busy),
                "tick {tick}: the busy lock was retired"
            );
        }
        let kept: u64 = total.taken.stats.values().map(|s| s.contentions).sum();
        let retired: u64 = total.retired.values().map(|(_, s)| s.contentions).sum();
        assert_eq!(kept + retired, sum, "every contention is in a row");
        let (count, _) = total.retired[&Some(LockClass::PipeMutex)];
        assert_eq!(count as usize + total.taken.stats.len(), 50 * 20 + 1);
        let fill = total.fill();
        assert_eq!(
            (fill.tracked, fill.max_tracked, fill.retired),
            (total.taken.stats.len(), 100, count),
            "the --verbose line counts what the total holds"
        );
        assert!(
            total.known.info.len() <= 100,
            "identities of retired locks are forgotten"
        );
    }
}
