//! `--interval` and `pipelock top`: each tick takes what the kernel gathered
//! since the last one and keeps the running total in userspace, so both the
//! interval's figures (max included) and the whole run's are exact.
use std::{collections::HashMap, time::Instant};

use pipelock_common::LockStats;

use super::Tracer;
use crate::{
    Error,
    bpf::maps,
    model::{Snapshot, timing::merge_stats},
};

pub struct IntervalCollector {
    total: HashMap<u64, LockStats>,
    last: Instant,
    /// When the running total starts (attach, or the last reset).
    since: Instant,
}

impl IntervalCollector {
    pub fn new(tracer: &Tracer) -> Self {
        Self {
            total: HashMap::new(),
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
        let ids = maps::read_identities(tracer.ebpf())?;
        let fill = maps::map_fill(tracer.ebpf(), &ids);
        let fresh = maps::take_stats(tracer.ebpf_mut())?;
        let interval = self.last.elapsed();
        self.last = Instant::now();
        for (lock, stats) in &fresh {
            merge_stats(self.total.entry(*lock).or_insert(LockStats::EMPTY), stats);
        }
        let mut total = tracer.build_report(&self.total, &ids, self.since.elapsed())?;
        total.maps = fill.clone();
        Ok(Snapshot {
            interval: tracer.build_report(&fresh, &ids, interval)?,
            total,
            fill,
        })
    }
}
