//! Kernel objects read with plain loads instead of `bpf_probe_read_kernel`.
//!
//! A pointer that comes from a `_btf` helper (`bpf_get_current_task_btf`,
//! `bpf_task_pt_regs`), or from a struct-pointer member of such an object,
//! carries its BTF type in the verifier. A load from it at a constant offset
//! is checked against that type and JIT-compiled as a guarded load (an
//! exception-table entry turns a fault into 0). It is a few instructions
//! where a helper call costs ~30 ns. The offsets come from `TRACE_CONFIG`,
//! which aya keeps in a frozen, program-read-only map: the verifier reads
//! them as constants, so `base + cfg.field` stays a typed pointer at a known
//! offset. (aya-ebpf emits no CO-RE relocations; this is how the run-time
//! offsets still allow typed loads.)
//!
//! The verifier wants each load the size of the member it lands in, and
//! a pointer member read whole: [`BtfPtr::pointer`] for struct pointers (the
//! result is typed again), [`BtfPtr::word`] for other 8-byte members,
//! [`BtfPtr::half`] for 4-byte ones, [`BtfPtr::quarter`] for 2-byte ones.
use aya_ebpf::{
    helpers::{bpf_get_current_task_btf, bpf_task_pt_regs},
    macros::map,
    maps::PerCpuArray,
};
use pipelock_common::{RDONLY_CAST_MARK, TraceConfig};

/// A kernel object whose type the verifier knows.
#[derive(Clone, Copy)]
pub(crate) struct BtfPtr(*const u8);

impl BtfPtr {
    /// The current task (`task_struct`).
    #[inline(always)]
    pub(crate) fn current_task() -> Self {
        // SAFETY: no preconditions.
        Self(unsafe { bpf_get_current_task_btf() }.cast_const().cast())
    }

    /// The user registers of `task`, a typed task pointer (`pt_regs` at the
    /// top of its kernel stack: the syscall number and arguments).
    #[inline(always)]
    pub(crate) fn user_regs_of(task: Self) -> Self {
        // SAFETY: `task` is a typed `task_struct` pointer (see `current_task`),
        // which is what the helper takes; the result is a typed `pt_regs`.
        Self(unsafe { bpf_task_pt_regs(task.0 as *mut _) } as usize as *const u8)
    }

    #[inline(always)]
    fn load<T: Copy>(self, offset: u32) -> T {
        // SAFETY: a typed kernel pointer: the verifier checks the access
        // against the member at `offset`, and the JIT guards the load.
        unsafe { core::ptr::read_volatile(self.0.add(offset as usize).cast::<T>()) }
    }

    /// The struct a pointer member at `offset` points at (None: NULL).
    #[inline(always)]
    pub(crate) fn pointer(self, offset: u32) -> Option<Self> {
        let to: *const u8 = self.load(offset);
        (!to.is_null()).then_some(Self(to))
    }

    /// An 8-byte member (a number, or a pointer the verifier does not type).
    #[inline(always)]
    pub(crate) fn word(self, offset: u32) -> u64 {
        self.load(offset)
    }

    /// A 4-byte member.
    #[inline(always)]
    pub(crate) fn half(self, offset: u32) -> u32 {
        self.load(offset)
    }

    /// The object's address, as a number to hand on (a probe read, or
    /// [`BtfPtr::cast`] again, takes it).
    #[inline(always)]
    pub(crate) fn address(self) -> u64 {
        self.0 as u64
    }

    /// A 2-byte member.
    #[inline(always)]
    pub(crate) fn quarter(self, offset: u32) -> u16 {
        self.load(offset)
    }

    /// The kernel object at `address`, of BTF type `btf_id` (a
    /// `TraceConfig::btf_*` field, a constant to the verifier), through the
    /// `bpf_rdonly_cast` kfunc (6.2+): its members read with plain,
    /// fault-guarded loads where `bpf_probe_read_kernel` is a helper call.
    /// None where the kernel has no such kfunc (userspace turned the call
    /// into `r0 = 0`, and the verifier prunes the typed path): the caller
    /// reads the object with probe reads instead.
    ///
    /// The caller checks `address` for 0 first: the kfunc hands a NULL
    /// back, but whether the verifier may take its result for non-NULL
    /// (and wire the test below to "cast") is the kernel's to decide, and
    /// a NULL cast is an object whose every member reads 0 (the loads are
    /// fault-guarded).
    ///
    /// The call is written as raw bytes: Rust has no `__ksym` externs, and
    /// the aya 0.14 loader relocates no kfunc calls, so userspace writes the
    /// kfunc's BTF id over [`RDONLY_CAST_MARK`] (see `bpf::object`).
    #[inline(always)]
    pub(crate) fn cast(address: u64, btf_id: u32) -> Option<Self> {
        let cast: u64;
        // SAFETY: a kfunc call with the BPF calling convention (arguments
        // in r1 and r2, result in r0, r1-r5 clobbered); it reads nothing.
        unsafe {
            core::arch::asm!(
                // code 0x85 (call), src_reg 2 (BPF_PSEUDO_KFUNC_CALL), off 0
                // (the kernel's own BTF), imm the mark.
                ".8byte ({mark} << 32) | 0x2085",
                mark = const RDONLY_CAST_MARK,
                inlateout("r1") address => _,
                inlateout("r2") u64::from(btf_id) => _,
                lateout("r0") cast,
                lateout("r3") _,
                lateout("r4") _,
                lateout("r5") _,
                options(nostack, readonly),
            );
        }
        (cast != 0).then_some(Self(cast as *const u8))
    }
}

/// The 8-byte word at kernel `address` as a plain number, in one guarded
/// load: the `owner` (an `atomic_long_t`) of a `struct mutex` cast over it.
/// A pointer member read through a typed object stays a pointer to the
/// verifier (6.18 types a `void *` one as untrusted memory) and refuses
/// what the compiler may do with a number, e.g. `|` two of them to test
/// both for 0. None: the kernel has no `bpf_rdonly_cast`.
#[inline(always)]
pub(crate) fn word_at(cfg: &TraceConfig, address: u64) -> Option<u64> {
    Some(BtfPtr::cast(address - cfg.mutex_owner as u64, cfg.btf_mutex)?.word(cfg.mutex_owner))
}

/// One word per CPU that turns a pointer into a number (see [`with_address`]).
#[map]
static AS_NUMBER: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// `compute` of the address `pointer` holds, as a number the verifier lets
/// a program compute with. It refuses arithmetic with an unknown number on
/// a context pointer, but a pointer stored in a map value reads back as a
/// plain number (storing one needs CAP_PERFMON, which loading these
/// programs needs anyway). A store and two loads, where a probe read of
/// the pointer cost ~10-30 ns.
///
/// An interrupt's lock event on this CPU runs its program between the
/// store and the load now and then (the self-test caught 1 in ~3 million
/// syscalls judged by an interrupt's stack). Only this program stores this
/// pointer, so if the word still holds it after `compute`, nothing else
/// was stored meanwhile; otherwise it is all done again. (That check is a
/// second load compared with the pointer, an equality test the verifier
/// allows privileged programs: compared with the number `compute` used,
/// the compiler would know the two equal and hand `compute` the pointer.)
#[inline(always)]
pub(crate) fn with_address<T, R>(pointer: *const T, compute: impl Fn(u64) -> R) -> Option<R> {
    let scratch = AS_NUMBER.get_ptr_mut(0)?;
    for _ in 0..2 {
        // SAFETY: this CPU's word; the check below catches another
        // program's store.
        let number = unsafe {
            core::ptr::write_volatile(scratch.cast::<*const T>(), pointer);
            core::ptr::read_volatile(scratch)
        };
        let result = compute(number);
        // SAFETY: as above.
        if unsafe { core::ptr::read_volatile(scratch) } == pointer as u64 {
            return Some(result);
        }
    }
    None
}
