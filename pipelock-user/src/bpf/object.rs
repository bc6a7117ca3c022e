//! The embedded eBPF object, and loading it.
use aya::{Ebpf, EbpfLoader, programs::ProgramError};
use pipelock_common::{TRACE_CONFIG_GLOBAL, TraceConfig};

use super::log::LogReader;
use crate::Error;

/// The object built from `pipelock-ebpf` (empty in a `PIPELOCK_EBPF_STUB=1` build).
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/pipelock"));

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
    let mut ebpf = loader.load(OBJECT).map_err(|source| Error::Load { source })?;
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
