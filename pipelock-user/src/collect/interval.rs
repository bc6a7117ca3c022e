//! `--interval` and `pipelock top`: each tick takes what the kernel gathered
//! since the last one and keeps the running total in userspace, so both the
//! interval's figures (max included) and the whole run's are exact.
use std::time::Instant;

use pipelock_common::LockStats;

use super::Tracer;
use crate::{
    Error,
    bpf::maps::{self, Identities, Stats},
    model::{Snapshot, timing::merge_stats},
};

pub struct IntervalCollector {
    total: Stats,
    /// Every identity read so far: the kernel's map evicts old ones.
    known: Identities,
    last: Instant,
    /// When the running total starts (attach, or the last reset).
    since: Instant,
}

impl IntervalCollector {
    pub fn new(tracer: &Tracer) -> Self {
        Self {
            total: Stats::new(),
            known: Identities::default(),
            last: tracer.started(),
            since: tracer.started(),
        }
    }

    /// Starts the running total afresh (`r` in `pipelock top`).
    pub fn reset(&mut self) {
        self.total.clear();
        self.since = Instant::now();
    }

    pub fn tick(&mut self, tracer: &mut Tracer) -> Result<Snapshot, Error> {
        // Before the statistics are taken: that is when the maps are fullest.
        let fresh_ids = maps::read_identities(tracer.ebpf())?;
        let fill = maps::map_fill(tracer.ebpf(), &fresh_ids);
        self.known.merge(&fresh_ids);
        let fresh = maps::take_stats(tracer.ebpf_mut())?;
        // Identities the programs wrote between the read above and the swap.
        self.known.merge(&maps::read_identities(tracer.ebpf())?);
        let ids = &self.known;
        let interval = self.last.elapsed();
        self.last = Instant::now();
        for (key, stats) in &fresh {
            merge_stats(self.total.entry(*key).or_insert(LockStats::EMPTY), stats);
        }
        let mut total = tracer.build_report(&self.total, ids, self.since.elapsed())?;
        total.maps = fill.clone();
        Ok(Snapshot {
            interval: tracer.build_report(&fresh, ids, interval)?,
            total,
            fill,
        })
    }
}
