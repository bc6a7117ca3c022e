//! The embedded eBPF object, and loading it.
use aya::{Ebpf, EbpfLoader, programs::ProgramError};
use pipelock_common::{RDONLY_CAST_MARK, TRACE_CONFIG_GLOBAL, TraceConfig};

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

/// A `bpf_rdonly_cast` call as compiled.
const MARKED_CALL: u64 = kfunc_call(RDONLY_CAST_MARK);
/// What a marked call becomes on a kernel without the kfunc: `r0 = 0`
/// (code 0xb7, mov64 immediate), the "not cast" the programs fall back on.
const NO_CAST: u64 = 0xb7;

/// The object as one kernel loads it: every `bpf_rdonly_cast` call given
/// the kfunc's BTF id there (`rdonly_cast`), or made `r0 = 0` where the
/// kernel has none. Held in words: aya parses the ELF in place and wants
/// it 8-byte aligned, as `include_bytes_aligned!` gives it.
pub struct KernelObject {
    words: Vec<u64>,
    len: usize,
    /// How many kfunc calls were rewritten.
    pub calls: usize,
}

impl KernelObject {
    pub fn new(object: &[u8], rdonly_cast: Option<u32>) -> Self {
        let mut patched = Self {
            words: vec![0; object.len().div_ceil(8)],
            len: object.len(),
            calls: 0,
        };
        let bytes = patched.bytes_mut();
        bytes.copy_from_slice(object);
        let call = rdonly_cast.map_or(NO_CAST, kfunc_call).to_le_bytes();
        // BPF code sections are 8-byte aligned in the ELF, so every
        // instruction starts a word.
        let mut calls = 0;
        for word in bytes.chunks_exact_mut(8) {
            if *word == MARKED_CALL.to_le_bytes() {
                word.copy_from_slice(&call);
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
    let object = KernelObject::new(OBJECT, None);
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

    /// Every marked call becomes the kfunc's id, or `r0 = 0`, and nothing
    /// else of the object changes.
    #[test]
    fn marked_calls_are_rewritten_and_nothing_else() {
        let mut object = vec![0u8; 64];
        object[..8].copy_from_slice(&MARKED_CALL.to_le_bytes());
        object[24..32].copy_from_slice(&MARKED_CALL.to_le_bytes());
        // Not at an instruction boundary: left alone.
        object[36..44].copy_from_slice(&MARKED_CALL.to_le_bytes());
        object[56..].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        let patched = KernelObject::new(&object[..63], Some(0x1234));
        assert_eq!(patched.calls, 2);
        assert_eq!(patched.bytes().len(), 63);
        let got: Vec<u64> = words(&patched).collect();
        assert_eq!(got[0], 0x1234_0000_2085);
        assert_eq!(got[3], 0x1234_0000_2085);
        assert_eq!(&patched.bytes()[8..24], &object[8..24]);
        assert_eq!(&patched.bytes()[32..63], &object[32..63]);
        let none = KernelObject::new(&object, None);
        assert_eq!((none.calls, words(&none).next()), (2, Some(NO_CAST)));
    }

    /// The real object calls the kfunc (the fd walk and the owner read),
    /// and after rewriting no mark is left for the verifier to refuse.
    #[test]
    fn the_object_calls_rdonly_cast_only_through_marks() {
        if OBJECT.is_empty() {
            eprintln!("skipped: no eBPF object in this build (PIPELOCK_EBPF_STUB)");
            return;
        }
        let marks = OBJECT
            .windows(8)
            .filter(|w| u64::from_le_bytes((*w).try_into().unwrap()) == MARKED_CALL)
            .count();
        let patched = KernelObject::new(OBJECT, Some(77));
        assert!(patched.calls > 0);
        assert_eq!(patched.calls, marks, "a mark off an instruction boundary");
        assert_eq!(words(&patched).filter(|&w| w == MARKED_CALL).count(), 0);
    }
}
