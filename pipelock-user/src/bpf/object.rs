//! The embedded eBPF object, and loading it.
use aya::{Ebpf, EbpfLoader, programs::ProgramError};
use pipelock_common::{
    PREEMPT_DISABLE_MARK, PREEMPT_ENABLE_MARK, RDONLY_CAST_MARK, TRACE_CONFIG_GLOBAL, TraceConfig,
};

use super::log::LogReader;
use crate::Error;

/// The object built from `pipelock-ebpf` (empty in a `PIPELOCK_EBPF_STUB=1` build).
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/pipelock"));

/// A call of a kfunc of the kernel's BTF: code 0x85 (call), src_reg 2
/// (`BPF_PSEUDO_KFUNC_CALL`), off 0, `imm`; one instruction, as a
/// little-endian word.
const fn kfunc_call(imm: u32) -> u64 {
    (imm as u64) << 32 | 0x2085
}

/// What a marked call becomes on a kernel without the kfunc: `r0 = 0`
/// (code 0xb7, mov64 immediate): the "not cast" the programs fall back on
/// for `bpf_rdonly_cast`, nothing at all for the preemption kfuncs.
const NO_CALL: u64 = 0xb7;

/// The BTF ids of the kfuncs the programs call, on one kernel (None: it
/// has no such kfunc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Kfuncs {
    pub rdonly_cast: Option<u32>,
    /// `bpf_preempt_disable` and `bpf_preempt_enable`, both or neither.
    pub preempt: Option<(u32, u32)>,
}

impl Kfuncs {
    /// Each mark and what to write over it.
    fn rewrites(&self) -> [(u64, u64); 3] {
        let call = |id: Option<u32>| id.map_or(NO_CALL, kfunc_call);
        [
            (kfunc_call(RDONLY_CAST_MARK), call(self.rdonly_cast)),
            (kfunc_call(PREEMPT_DISABLE_MARK), call(self.preempt.map(|p| p.0))),
            (kfunc_call(PREEMPT_ENABLE_MARK), call(self.preempt.map(|p| p.1))),
        ]
    }
}

/// The object as one kernel loads it: every marked kfunc call given the
/// kfunc's BTF id there, or made `r0 = 0` where the kernel has none. Held
/// in words: aya parses the ELF in place and wants it 8-byte aligned, as
/// `include_bytes_aligned!` gives it.
pub struct KernelObject {
    words: Vec<u64>,
    len: usize,
    /// How many kfunc calls were rewritten.
    pub calls: usize,
}

impl KernelObject {
    pub fn new(object: &[u8], kfuncs: &Kfuncs) -> Self {
        let mut patched = Self {
            words: vec![0; object.len().div_ceil(8)],
            len: object.len(),
            calls: 0,
        };
        let bytes = patched.bytes_mut();
        bytes.copy_from_slice(object);
        let rewrites = kfuncs
            .rewrites()
            .map(|(mark, call)| (mark.to_le_bytes(), call.to_le_bytes()));
        // BPF code sections are 8-byte aligned in the ELF, so every
        // instruction starts a word.
        let mut calls = 0;
        for word in bytes.chunks_exact_mut(8) {
            if let Some((_, call)) = rewrites.iter().find(|(mark, _)| word == mark) {
                word.copy_from_slice(call);
                calls += 1;
            }
        }
        patched.calls = calls;
        patched
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the words' own memory, viewed as bytes, within its length.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; the borrow of `self` keeps it exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.len) }
    }
}

/// Loads the embedded object (maps created, no program loaded yet), with
/// `config` as the programs' [`TraceConfig`] (programs that read none may
/// go without).
///
/// With `log`, kernel-side aya-log messages are forwarded to the `log` crate.
/// `log`: forward the programs' log records for as long as the returned
/// reader lives (keep it while programs of `ebpf` may still be loaded).
pub fn load(config: Option<&TraceConfig>, log: bool) -> Result<(Ebpf, Option<LogReader>), Error> {
    if OBJECT.is_empty() {
        return Err(Error::StubObject);
    }
    let mut loader = EbpfLoader::new();
    if let Some(config) = config {
        loader.override_global(TRACE_CONFIG_GLOBAL, config, true);
    }
    // Without the kernel's BTF at hand the programs read with probe reads.
    let object = KernelObject::new(OBJECT, &Kfuncs::default());
    let mut ebpf = loader
        .load(object.bytes())
        .map_err(|source| Error::Load { source })?;
    // Best effort: without it the programs run, their records are lost.
    let log = if log { LogReader::start(&mut ebpf) } else { None };
    Ok((ebpf, log))
}

/// The named program of `ebpf`, as its concrete type.
pub fn program_mut<'a, P>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut P, Error>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    let missing = || Error::Missing {
        kind: "program",
        name: name.to_owned(),
    };
    let program = ebpf.program_mut(name).ok_or_else(missing)?;
    program.try_into().map_err(|_| missing())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(object: &KernelObject) -> impl Iterator<Item = u64> + '_ {
        object
            .bytes()
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
    }

    const MARKED_CALL: u64 = kfunc_call(RDONLY_CAST_MARK);

    /// Every marked call becomes the kfunc's id, or `r0 = 0`, and nothing
    /// else of the object changes.
    #[test]
    fn marked_calls_are_rewritten_and_nothing_else() {
        let mut object = vec![0u8; 72];
        object[..8].copy_from_slice(&MARKED_CALL.to_le_bytes());
        object[24..32].copy_from_slice(&MARKED_CALL.to_le_bytes());
        // Not at an instruction boundary: left alone.
        object[36..44].copy_from_slice(&MARKED_CALL.to_le_bytes());
        object[48..56].copy_from_slice(&kfunc_call(PREEMPT_DISABLE_MARK).to_le_bytes());
        object[56..64].copy_from_slice(&kfunc_call(PREEMPT_ENABLE_MARK).to_le_bytes());
        object[64..].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        let kfuncs = Kfuncs {
            rdonly_cast: Some(0x1234),
            preempt: Some((0x55, 0x66)),
        };
        let patched = KernelObject::new(&object[..71], &kfuncs);
        assert_eq!(patched.calls, 4);
        assert_eq!(patched.bytes().len(), 71);
        let got: Vec<u64> = words(&patched).collect();
        assert_eq!(got[0], 0x1234_0000_2085);
        assert_eq!(got[3], 0x1234_0000_2085);
        assert_eq!((got[6], got[7]), (0x55_0000_2085, 0x66_0000_2085));
        assert_eq!(&patched.bytes()[8..24], &object[8..24]);
        assert_eq!(&patched.bytes()[32..48], &object[32..48]);
        assert_eq!(&patched.bytes()[64..71], &object[64..71]);
        let none = KernelObject::new(&object, &Kfuncs::default());
        let got: Vec<u64> = words(&none).collect();
        assert_eq!(none.calls, 4);
        assert_eq!((got[0], got[6], got[7]), (NO_CALL, NO_CALL, NO_CALL));
    }

    /// The real object calls the kfuncs (the fd walk, the owner read, and
    /// around every fentry/fexit program's body), and after rewriting no
    /// mark is left for the verifier to refuse.
    #[test]
    fn the_object_calls_kfuncs_only_through_marks() {
        if OBJECT.is_empty() {
            eprintln!("skipped: no eBPF object in this build (PIPELOCK_EBPF_STUB)");
            return;
        }
        let kfuncs = Kfuncs {
            rdonly_cast: Some(77),
            preempt: Some((78, 79)),
        };
        let count = |mark: u64| {
            OBJECT
                .windows(8)
                .filter(|w| u64::from_le_bytes((*w).try_into().unwrap()) == mark)
                .count()
        };
        let (casts, disables, enables) = (
            count(MARKED_CALL),
            count(kfunc_call(PREEMPT_DISABLE_MARK)),
            count(kfunc_call(PREEMPT_ENABLE_MARK)),
        );
        assert!(
            casts > 0 && disables > 0,
            "{casts} casts, {disables} preemption calls"
        );
        assert!(enables >= disables, "{disables} disables but {enables} enables");
        let patched = KernelObject::new(OBJECT, &kfuncs);
        assert_eq!(
            patched.calls,
            casts + disables + enables,
            "a mark off an instruction boundary"
        );
        for (mark, _) in kfuncs.rewrites() {
            assert_eq!(words(&patched).filter(|&w| w == mark).count(), 0);
        }
    }
}
