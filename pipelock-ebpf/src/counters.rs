//! How counters and histograms inside map values are updated: atomic adds
//! where every CPU writes the value, plain adds on a CPU's own.
use core::marker::PhantomData;

use pipelock_common::{Histogram, loglinear};

/// `*at += value`, atomically (BPF's `lock *(u64 *)(r + 0) += v`).
///
/// # Safety
/// `at` points at a live, 8-byte aligned map value.
#[inline(always)]
pub(crate) unsafe fn atomic_add(at: *mut u64, value: u64) {
    // SAFETY: as the caller promises.
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(at, value)
    };
}

/// `*at += 1` on a 4-byte histogram bucket, atomically (BPF's
/// `lock *(u32 *)(r + 0) += 1`).
///
/// # Safety
/// `at` points at a live, 4-byte aligned map value.
#[inline(always)]
unsafe fn atomic_inc32(at: *mut u32) {
    // SAFETY: as the caller promises.
    unsafe {
        core::intrinsics::atomic_xadd::<u32, u32, { core::intrinsics::AtomicOrdering::Relaxed }>(at, 1)
    };
}

/// How the counters of a map value may be updated, as a type: a value
/// every CPU may update at once takes [`Atomic`] adds, a CPU's own one
/// [`Plain`] adds.
pub(crate) trait Adds {
    /// `*at += value`.
    ///
    /// # Safety
    /// `at` points into a live, aligned map value this kind of add is
    /// right for (see [`MapValue::new`]).
    unsafe fn add(at: *mut u64, value: u64);

    /// `*at += 1` on a 4-byte histogram bucket.
    ///
    /// # Safety
    /// As for [`Adds::add`].
    unsafe fn inc(at: *mut u32);
}

/// A value every CPU updates (and, as fentry programs run with only
/// migration disabled, several tasks on one CPU too): a plain
/// read-modify-write would lose updates, an atomic add (BPF's `lock +=`)
/// cannot.
pub(crate) enum Atomic {}

/// This CPU's own value, which one program run at a time updates
/// (`crate::cpu_local` says which programs may): plain adds.
pub(crate) enum Plain {}

impl Adds for Atomic {
    #[inline(always)]
    unsafe fn add(at: *mut u64, value: u64) {
        // SAFETY: as the caller promises.
        unsafe { atomic_add(at, value) };
    }

    #[inline(always)]
    unsafe fn inc(at: *mut u32) {
        // SAFETY: as the caller promises.
        unsafe { atomic_inc32(at) };
    }
}

impl Adds for Plain {
    #[inline(always)]
    unsafe fn add(at: *mut u64, value: u64) {
        // SAFETY: as the caller promises; nothing else writes it meanwhile.
        unsafe { *at += value };
    }

    #[inline(always)]
    unsafe fn inc(at: *mut u32) {
        // SAFETY: as for `add`.
        unsafe { *at += 1 };
    }
}

/// A map value updated only as `A` allows, reached through its pointer and
/// never through a `&mut`: another CPU's update of a shared value would
/// alias any reference to it.
pub(crate) struct MapValue<T, A> {
    at: *mut T,
    adds: PhantomData<A>,
}

/// The address of a field of the value a [`MapValue`] method is given,
/// e.g. `stats.add(field!(contentions), 1)`.
macro_rules! field {
    ($($path:tt)+) => {
        // SAFETY: the method passes its own live, aligned value; only the
        // field's address is taken, no reference.
        |value| unsafe { &raw mut (*value).$($path)+ }
    };
}
pub(crate) use field;

impl<T, A: Adds> MapValue<T, A> {
    /// # Safety
    /// `at` is a live, aligned map value for the rest of the program's
    /// run, and `A` is right for it: [`Plain`] only where no other program
    /// run can write it meanwhile.
    #[inline(always)]
    pub(crate) unsafe fn new(at: *mut T) -> Self {
        Self {
            at,
            adds: PhantomData,
        }
    }

    /// `field += value`.
    #[inline(always)]
    pub(crate) fn add(&self, field: impl FnOnce(*mut T) -> *mut u64, value: u64) {
        // SAFETY: a field of a live value `A` is right for (`new`).
        unsafe { A::add(field(self.at), value) };
    }

    /// `field = max(field, value)`, a plain compare and store: BPF has no
    /// atomic max before compare-and-exchange, which needs a newer BPF
    /// ISA, so two updates at once can lose a maximum, never a count.
    #[inline(always)]
    pub(crate) fn raise(&self, field: impl FnOnce(*mut T) -> *mut u64, value: u64) {
        let at = field(self.at);
        // SAFETY: a field of a live, aligned value; a racing store may win.
        unsafe {
            if value > at.read_volatile() {
                at.write_volatile(value);
            }
        }
    }

    /// The field's value now (another CPU's update may follow at once).
    #[inline(always)]
    pub(crate) fn load(&self, field: impl FnOnce(*mut T) -> *mut u64) -> u64 {
        // SAFETY: a field of a live, aligned value.
        unsafe { field(self.at).read_volatile() }
    }

    /// `field = value`, a plain store: of two at once, either may stay.
    #[inline(always)]
    pub(crate) fn store(&self, field: impl FnOnce(*mut T) -> *mut u64, value: u64) {
        // SAFETY: a field of a live, aligned value.
        unsafe { field(self.at).write_volatile(value) };
    }

    /// Adds one duration to a histogram field. No `count`: it is the sum of
    /// the buckets, which userspace takes (one add less per duration).
    #[inline(always)]
    pub(crate) fn record(&self, hist: impl FnOnce(*mut T) -> *mut Histogram, ns: u64) {
        let hist = hist(self.at);
        // SAFETY: fields of a live, aligned value `A` is right for.
        unsafe {
            A::add(&raw mut (*hist).total_ns, ns);
            let max = &raw mut (*hist).max_ns;
            if ns > max.read_volatile() {
                max.write_volatile(ns);
            }
            let index = forget_range(loglinear::bucket(ns));
            if index < loglinear::BUCKETS {
                A::inc((&raw mut (*hist).buckets).cast::<u32>().add(index));
            }
        }
    }
}

/// A map value of one of two kinds, chosen at run time (a CPU's own table
/// when it has room, else the shared map): each arm is updated as its type
/// allows, [`with_value!`] runs the same code for either.
pub(crate) enum EitherValue<T> {
    Here(MapValue<T, Plain>),
    Shared(MapValue<T, Atomic>),
}

/// Runs `$body` with `$value` bound to the [`MapValue`] inside an
/// [`EitherValue`], whichever its kind.
macro_rules! with_value {
    ($either:expr, |$value:ident| $body:expr) => {
        match $either {
            $crate::counters::EitherValue::Here($value) => $body,
            $crate::counters::EitherValue::Shared($value) => $body,
        }
    };
}
pub(crate) use with_value;

/// `index`, with what the compiler knows of its range forgotten. A bucket
/// index comes from a count of leading zeros, which BPF spells as bit
/// tricks the verifier cannot bound; the compiler can, and would drop the
/// bounds check the verifier needs before the index becomes an offset
/// into the map value.
#[inline(always)]
fn forget_range(mut index: usize) -> usize {
    // SAFETY: a register moved onto itself.
    unsafe {
        core::arch::asm!("{0} = {0}", inout(reg) index, options(pure, nomem, nostack, preserves_flags))
    };
    index
}
