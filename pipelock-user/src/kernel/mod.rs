//! Everything read from the running kernel (or a captured copy of it):
//! kallsyms, BTF, tracefs, the kprobe PMU, program-type support, privileges.
//! Nothing here knows about attach modes or loads programs.
pub mod btf;
pub mod inspector;
pub mod privilege;
pub mod support;
pub mod symbols;
pub mod syscalls;

pub use self::{
    btf::KernelBtf,
    inspector::{Kallsyms, KernelInspector},
    support::{AttachSupport, Support},
    symbols::{KernelSymbols, SymbolKind},
    syscalls::syscall_name,
};
