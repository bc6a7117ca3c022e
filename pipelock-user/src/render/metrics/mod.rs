//! A trace's running totals as Prometheus metrics (`pipelock serve`),
//! encoded by prometheus-client through a custom collector: the programs'
//! log-linear buckets become cumulative `le` buckets, class totals and the
//! busiest locks become labelled series, pipelock's own cost its own.
//! OpenMetrics text is what the crate writes; the Prometheus text format
//! (for scrapers that do not ask for OpenMetrics) differs from it only in
//! how counters and units are declared, see [`prometheus_text`].
use std::{collections::BTreeMap, sync::Arc};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeCounterValue, NoLabelSet},
    metrics::MetricType,
    registry::{Registry, Unit},
};

use crate::model::{ClassSet, LockClass, LockRow, Timing, TraceReport};

/// Upper bounds of the exported buckets, in ns: `2^k` for k in 7..=35
/// (128 ns to 34 s). A log-linear bucket of the programs lies within one
/// power of two, `[2^(i-1), 2^i)` with `i` the bit length of its lower
/// bound, so it lands whole in `le = 2^max(i, 7)`; anything at or above
/// 2^35 ns only in `+Inf`. A fixed set keeps each series' buckets the same from
/// scrape to scrape, as `histogram_quantile` over time needs.
const FIRST_BUCKET_LOG2: u32 = 7;
const LAST_BUCKET_LOG2: u32 = 35;

/// What one scrape shows: the running totals since `serve` started.
#[derive(Clone, Debug)]
pub struct Exposition {
    pub report: TraceReport,
    /// The classes traced (each gets its series from the start, at 0).
    pub classes: ClassSet,
    /// Locks exported one by one, busiest by wait first (`--per-lock-top`).
    pub per_lock_top: usize,
    /// How kernel addresses in lock names leave the host.
    pub addresses: Addresses,
    pub version: &'static str,
}

/// How kernel addresses in exported lock names (`0xffff888122f3a6c0 in
/// pipe:[ino] call`, a lock with no name) are shown.
#[derive(Clone, Debug)]
pub enum Addresses {
    /// Each becomes `lock-` and 12 hex digits of a keyed hash (SipHash with
    /// a key drawn when `serve` starts and never shown): stable while it
    /// runs, so a lock keeps its series, and no way back to the address.
    Hidden(std::hash::RandomState),
    /// As they are (`--expose-addresses`).
    Exposed,
}

impl Addresses {
    pub fn hidden() -> Self {
        Self::Hidden(std::hash::RandomState::new())
    }

    /// `name` with every hexadecimal number of 8 digits or more (an
    /// address) hidden as this says.
    pub fn apply(&self, name: &str) -> String {
        let Self::Hidden(key) = self else {
            return name.to_owned();
        };
        let mut out = String::with_capacity(name.len());
        let mut rest = name;
        while let Some(at) = rest.find("0x") {
            out.push_str(&rest[..at]);
            let digits = rest[at + 2..].chars().take_while(char::is_ascii_hexdigit).count();
            let (number, after) = rest[at..].split_at(2 + digits);
            match u64::from_str_radix(&number[2..], 16) {
                Ok(address) if digits >= 8 => {
                    let id = std::hash::BuildHasher::hash_one(key, address) & 0xffff_ffff_ffff;
                    out.push_str(&format!("lock-{id:012x}"));
                }
                _ => out.push_str(number),
            }
            rest = after;
        }
        out.push_str(rest);
        out
    }
}

/// `pipe-mutex` → `pipe_mutex` (label values in the usual metric style).
fn class_value(class: Option<LockClass>) -> String {
    class.map_or("unknown", LockClass::name).replace('-', "_")
}

/// A histogram as prometheus-client takes it: sum (s), count, and per
/// bucket (upper bound in s, count in that bucket alone).
struct Buckets {
    sum: f64,
    count: u64,
    buckets: Vec<(f64, u64)>,
}

/// The buckets of `timings` merged, in seconds, ending with `+Inf`
/// (`f64::MAX` is the crate's spelling).
fn buckets<'a>(timings: impl IntoIterator<Item = &'a Timing>) -> Buckets {
    let span = (LAST_BUCKET_LOG2 - FIRST_BUCKET_LOG2 + 1) as usize;
    let mut counts = vec![0u64; span + 1];
    let (mut sum_ns, mut count) = (0u128, 0u64);
    for timing in timings {
        sum_ns += u128::from(timing.total_ns);
        count += timing.count;
        for &(lower, n) in &timing.buckets {
            // Upper bound of [lower, 2·lower): 2^i with i = bit length of lower.
            let i = u64::BITS - lower.leading_zeros();
            let slot = i.saturating_sub(FIRST_BUCKET_LOG2) as usize;
            counts[slot.min(span)] += n;
        }
    }
    let mut out: Vec<(f64, u64)> = (0..span)
        .map(|k| ((1u64 << (FIRST_BUCKET_LOG2 as usize + k)) as f64 / 1e9, counts[k]))
        .collect();
    out.push((f64::MAX, counts[span]));
    Buckets {
        sum: sum_ns as f64 / 1e9,
        count,
        buckets: out,
    }
}

/// One series per loaded program, labelled with its name.
fn per_program<V>(report: &TraceReport, pick: impl Fn(&crate::model::ProgramStats) -> V) -> Vec<(Labels, V)> {
    report
        .programs
        .iter()
        .map(|p| (labels(&[("program", &p.name)]), pick(p)))
        .collect()
}

/// The collector prometheus-client calls on each scrape.
#[derive(Debug)]
struct ReportCollector(Arc<Exposition>);

type Labels = Vec<(String, String)>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Counts are `u64`, times `f64` seconds.
fn counters<V: EncodeCounterValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    series: &[(Labels, V)],
) -> Result<(), std::fmt::Error> {
    if series.is_empty() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(name, help, unit.as_ref(), MetricType::Counter)?;
    for (labels, value) in series {
        family
            .encode_family(labels)?
            .encode_counter::<NoLabelSet, _, f64>(value, None)?;
    }
    Ok(())
}

fn gauges(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    series: &[(Labels, f64)],
) -> Result<(), std::fmt::Error> {
    if series.is_empty() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?;
    for (labels, value) in series {
        family.encode_family(labels)?.encode_gauge(value)?;
    }
    Ok(())
}

fn histograms(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: &[(Labels, Buckets)],
) -> Result<(), std::fmt::Error> {
    if series.is_empty() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
    for (labels, h) in series {
        family
            .encode_family(labels)?
            .encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None)?;
    }
    Ok(())
}

/// Whether a row is one lock (not a sum of retired ones).
fn is_one_lock(row: &LockRow) -> bool {
    !row.name.starts_with('(')
}

impl Collector for ReportCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let exposed = &self.0;
        let report = &exposed.report;
        let hooked = report.locks.iter().any(|r| r.acquisitions.is_some());
        let mut by_class: BTreeMap<String, Vec<&LockRow>> = exposed
            .classes
            .iter()
            .map(|c| (class_value(Some(c)), Vec::new()))
            .collect();
        for row in &report.locks {
            by_class.entry(class_value(row.class)).or_default().push(row);
        }
        gauges(
            &mut encoder,
            "info",
            "pipelock's kernel and attach mode (always 1)",
            None,
            &[(
                labels(&[
                    ("kernel", &report.kernel),
                    ("mode", &report.mode),
                    ("version", exposed.version),
                ]),
                1.0,
            )],
        )?;
        let class_series = |pick: &dyn Fn(&LockRow) -> Option<u64>| -> Vec<(Labels, u64)> {
            by_class
                .iter()
                .map(|(class, rows)| {
                    (
                        labels(&[("class", class)]),
                        rows.iter().filter_map(|r| pick(r)).sum(),
                    )
                })
                .collect()
        };
        counters(
            &mut encoder,
            "lock_contentions",
            "Contended acquisitions (slow path), by lock class",
            None,
            &class_series(&|r| Some(r.contentions)),
        )?;
        if hooked {
            counters(
                &mut encoder,
                "lock_acquisitions",
                "Every acquisition (fentry/kprobe modes), by lock class",
                None,
                &class_series(&|r| r.acquisitions),
            )?;
        }
        let hist_series = |hold: bool| -> Vec<(Labels, Buckets)> {
            by_class
                .iter()
                .map(|(class, rows)| {
                    let timings = rows
                        .iter()
                        .filter_map(|r| if hold { r.hold.as_ref() } else { r.wait.as_ref() });
                    (labels(&[("class", class)]), buckets(timings))
                })
                .collect()
        };
        histograms(
            &mut encoder,
            "lock_wait",
            "Wait for a lock: contended acquisitions (tracepoint mode) or every acquisition (fentry/kprobe)",
            &hist_series(false),
        )?;
        if hooked {
            histograms(
                &mut encoder,
                "lock_hold",
                "Hold of a lock, acquisition to release (fentry/kprobe modes)",
                &hist_series(true),
            )?;
        }
        let mut owner_states = Vec::new();
        for (class, rows) in &by_class {
            let state = |pick: fn(&LockRow) -> Option<u64>| rows.iter().filter_map(|r| pick(r)).sum::<u64>();
            if rows.iter().any(|r| r.holder.total_ns().is_some()) {
                for (name, ns) in [
                    ("on_cpu", state(|r| r.holder.holder_on_cpu_ns)),
                    ("runnable", state(|r| r.holder.holder_runnable_ns)),
                    ("sleeping", state(|r| r.holder.holder_sleeping_ns)),
                ] {
                    owner_states.push((labels(&[("class", class), ("state", name)]), ns as f64 / 1e9));
                }
            }
        }
        counters(
            &mut encoder,
            "lock_owner_wait",
            "Wait for a mutex, by what its owner was doing meanwhile (on_cpu, runnable, sleeping)",
            Some(Unit::Seconds),
            &owner_states,
        )?;
        let mut top: Vec<&LockRow> = report.locks.iter().filter(|r| is_one_lock(r)).collect();
        top.sort_by(|a, b| {
            let wait = |r: &LockRow| r.wait.as_ref().map_or(0, |w| w.total_ns);
            wait(b).cmp(&wait(a)).then(a.name.cmp(&b.name))
        });
        top.truncate(exposed.per_lock_top);
        let lock_labels = |r: &LockRow| {
            labels(&[
                ("class", &class_value(r.class)),
                ("lock", &exposed.addresses.apply(&r.name)),
            ])
        };
        counters(
            &mut encoder,
            "top_lock_contentions",
            "Contended acquisitions of each of the busiest locks (by wait; --per-lock-top)",
            None,
            &top.iter()
                .map(|r| (lock_labels(r), r.contentions))
                .collect::<Vec<_>>(),
        )?;
        if hooked {
            counters(
                &mut encoder,
                "top_lock_acquisitions",
                "Acquisitions of each of the busiest locks",
                None,
                &top.iter()
                    .map(|r| (lock_labels(r), r.acquisitions.unwrap_or(0)))
                    .collect::<Vec<_>>(),
            )?;
        }
        histograms(
            &mut encoder,
            "top_lock_wait",
            "Wait for each of the busiest locks",
            &top.iter()
                .map(|r| (lock_labels(r), buckets(r.wait.iter())))
                .collect::<Vec<_>>(),
        )?;
        if hooked {
            histograms(
                &mut encoder,
                "top_lock_hold",
                "Hold of each of the busiest locks",
                &top.iter()
                    .map(|r| (lock_labels(r), buckets(r.hold.iter())))
                    .collect::<Vec<_>>(),
            )?;
        }
        counters(
            &mut encoder,
            "dropped_events",
            "Events pipelock saw but could not record, by reason",
            None,
            &report
                .drops
                .iter()
                .map(|(reason, n)| (labels(&[("reason", reason)]), *n))
                .collect::<Vec<_>>(),
        )?;
        let maps = |pick: fn(&crate::model::MapFill) -> Option<f64>| -> Vec<(Labels, f64)> {
            report
                .maps
                .iter()
                .filter_map(|m| Some((labels(&[("map", &m.name)]), pick(m)?)))
                .collect()
        };
        gauges(
            &mut encoder,
            "map_entries",
            "Entries in a kernel map at the last drain (where counted)",
            None,
            &maps(|m| m.used.map(|u| u as f64)),
        )?;
        gauges(
            &mut encoder,
            "map_capacity_entries",
            "Entries a kernel map can hold",
            None,
            &maps(|m| Some(f64::from(m.capacity))),
        )?;
        gauges(
            &mut encoder,
            "map_memory",
            "Kernel memory of a map (memlock)",
            Some(Unit::Bytes),
            &maps(|m| m.memlock_bytes.map(|b| b as f64)),
        )?;
        counters(
            &mut encoder,
            "bpf_runs",
            "Runs of pipelock's BPF programs (kernel run-time statistics)",
            None,
            &per_program(report, |p| p.run_count),
        )?;
        counters(
            &mut encoder,
            "bpf_run",
            "Time pipelock's BPF programs ran (kernel run-time statistics)",
            Some(Unit::Seconds),
            &per_program(report, |p| p.run_time_ns as f64 / 1e9),
        )?;
        counters(
            &mut encoder,
            "bpf_recursion_misses",
            "Runs of pipelock's BPF programs the kernel skipped because a run was already under way on that CPU (fentry, tp_btf: the same program, interrupted or preempted; kprobe: any program): each can lose an event",
            None,
            &per_program(report, |p| p.recursion_misses),
        )?;
        if let Some(cpu) = report.tracer_cpu_s {
            counters(
                &mut encoder,
                "collector_cpu",
                "CPU time of pipelock's own process since it attached",
                Some(Unit::Seconds),
                &[(Vec::new(), cpu)],
            )?;
        }
        Ok(())
    }
}

/// The exposition in the OpenMetrics text format.
pub fn openmetrics(exposed: Arc<Exposition>) -> String {
    let mut registry = Registry::with_prefix("pipelock");
    registry.register_collector(Box::new(ReportCollector(exposed)));
    let mut out = String::new();
    // Writing to a String cannot fail; a collector error would be a bug.
    if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
        out.clear();
    }
    out
}

/// OpenMetrics text as the Prometheus text format (0.0.4): a counter is
/// declared by its sample name (`foo_total`, not `foo`), there are no
/// `# UNIT` lines and no `# EOF`. Everything else is the same.
pub fn prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let declared = ["# HELP ", "# TYPE "]
            .iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (*p, rest)));
        match declared {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let name = if counters.contains(name) {
                    format!("{name}_total")
                } else {
                    name.to_owned()
                };
                out.push_str(&format!("{prefix}{name} {tail}\n"));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
