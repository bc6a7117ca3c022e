//! Types and names shared by pipelock's eBPF programs and its userspace.
//!
//! Everything here is `#[repr(C)]` and plain data: the kernel side writes it into
//! maps, the userspace side reads the same bytes back. The `user` feature adds
//! the `aya::Pod` impls userspace needs to read them.
#![no_std]

/// Program names in the eBPF object (the Rust function names of the programs).
pub mod programs {
    /// Classic tracepoint on `lock:contention_begin`, counting events per CPU.
    pub const CONTENTION_BEGIN_COUNT_TP: &str = "contention_begin_count_tp";
    /// The same counter as a BTF-enabled (`tp_btf`) tracepoint program.
    pub const CONTENTION_BEGIN_COUNT_BTF: &str = "contention_begin_count_btf";
    /// Empty fentry program: `pipelock probe` loads it to learn whether fentry works.
    pub const PROBE_FENTRY: &str = "probe_fentry";
    /// Empty kprobe program: `pipelock probe` attaches it to learn whether kprobes work.
    pub const PROBE_KPROBE: &str = "probe_kprobe";
}

/// Map names in the eBPF object (the Rust static names of the maps).
pub mod maps {
    /// `PerCpuArray<u64>` with one slot: `lock:contention_begin` events seen.
    pub const CONTENTION_BEGIN_COUNT: &str = "CONTENTION_BEGIN_COUNT";
}

/// The tracepoint the self-test counts: category and name as tracefs spells them.
pub const CONTENTION_BEGIN_TRACEPOINT: (&str, &str) = ("lock", "contention_begin");

/// Number of log2 buckets in a [`Histogram`]: bucket `i` holds values in
/// `[2^(i-1), 2^i)` nanoseconds (bucket 0 holds 0), so 64 buckets cover every `u64`.
pub const HIST_BUCKETS: usize = 64;

/// Log2 histogram bucket of a duration in nanoseconds.
///
/// Bucket 0 holds 0 ns, bucket `i >= 1` holds `[2^(i-1), 2^i)`; the last bucket
/// also takes everything above its lower bound.
#[inline(always)]
pub const fn hist_bucket(value_ns: u64) -> usize {
    // `64 - leading_zeros` is the bit length, which is exactly the bucket index.
    let bucket = (u64::BITS - value_ns.leading_zeros()) as usize;
    if bucket >= HIST_BUCKETS {
        HIST_BUCKETS - 1
    } else {
        bucket
    }
}

/// Aggregated timings of one kind (wait or hold) of one lock.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Histogram {
    /// Number of recorded durations.
    pub count: u64,
    /// Sum of recorded durations, in nanoseconds.
    pub total_ns: u64,
    /// Longest recorded duration, in nanoseconds.
    pub max_ns: u64,
    /// Per-bucket counts; see [`hist_bucket`].
    pub buckets: [u64; HIST_BUCKETS],
}

impl Histogram {
    pub const EMPTY: Self = Self {
        count: 0,
        total_ns: 0,
        max_ns: 0,
        buckets: [0; HIST_BUCKETS],
    };

    /// Records one duration (not atomic: for per-CPU values or userspace merges).
    #[inline(always)]
    pub fn record(&mut self, value_ns: u64) {
        self.count += 1;
        self.total_ns += value_ns;
        if value_ns > self.max_ns {
            self.max_ns = value_ns;
        }
        self.buckets[hist_bucket(value_ns)] += 1;
    }
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: `#[repr(C)]`, only `u64` fields, no padding, every bit pattern valid.
    unsafe impl aya::Pod for super::Histogram {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_bit_lengths() {
        assert_eq!(hist_bucket(0), 0);
        assert_eq!(hist_bucket(1), 1);
        assert_eq!(hist_bucket(2), 2);
        assert_eq!(hist_bucket(3), 2);
        assert_eq!(hist_bucket(4), 3);
        assert_eq!(hist_bucket(1023), 10);
        assert_eq!(hist_bucket(1024), 11);
        assert_eq!(hist_bucket(u64::MAX), HIST_BUCKETS - 1);
    }

    #[test]
    fn record_tracks_count_total_max_and_bucket() {
        let mut h = Histogram::EMPTY;
        for v in [0, 5, 5, 1000] {
            h.record(v);
        }
        assert_eq!(h.count, 4);
        assert_eq!(h.total_ns, 1010);
        assert_eq!(h.max_ns, 1000);
        assert_eq!(h.buckets[0], 1);
        assert_eq!(h.buckets[3], 2);
        assert_eq!(h.buckets[10], 1);
        assert_eq!(h.buckets.iter().sum::<u64>(), h.count);
    }
}
