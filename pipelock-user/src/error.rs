use std::{io, path::PathBuf};

/// Everything that can stop a pipelock command; `main` prints it as one line.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Loading BPF programs needs privileges the caller lacks.
    #[error("pipelock needs root (or CAP_BPF and CAP_PERFMON) to load eBPF programs; run it with sudo")]
    NotPrivileged,
    /// The binary was built with `PIPELOCK_EBPF_STUB=1` and carries no programs.
    #[error(
        "this pipelock binary was built without its eBPF programs (PIPELOCK_EBPF_STUB=1); \
         rebuild it with `cargo xtask build`"
    )]
    StubObject,
    /// A kernel fact could not be read.
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The kernel's BTF could not be parsed.
    #[error("cannot parse kernel BTF at {path}")]
    Btf {
        path: PathBuf,
        #[source]
        source: btf_rs::Error,
    },
    /// The kernel's BTF lacks a struct member pipelock reads.
    #[error("kernel BTF has no {type_name}.{member}")]
    KernelType { type_name: String, member: String },
    /// The kernel's BTF lacks a struct pipelock reads.
    #[error("kernel BTF has no struct {0}")]
    KernelStruct(String),
    /// The embedded eBPF object was rejected as a whole.
    #[error("cannot load pipelock's eBPF object")]
    Load {
        #[source]
        source: aya::EbpfError,
    },
    /// The object lacks a program or map userspace expects (a build mismatch).
    #[error("the eBPF object has no {kind} named {name}")]
    Missing { kind: &'static str, name: String },
    /// A program failed to load or attach.
    #[error("cannot {action} eBPF program {program}")]
    Program {
        action: &'static str,
        program: String,
        #[source]
        source: aya::programs::ProgramError,
    },
    /// A map could not be read.
    #[error("cannot read eBPF map {map}")]
    Map {
        map: String,
        #[source]
        source: aya::maps::MapError,
    },
    /// A system call needed by pipelock failed.
    #[error("{what} failed")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// A result file cannot be written.
    #[error("cannot write {path}")]
    Output {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A workload could not run as asked.
    #[error("workload failed: {reason}")]
    Workload { reason: String },
    /// Preparing or booting a guest kernel failed (`pipelock ab`).
    #[error(transparent)]
    Vm { source: pipelock_vm::Error },
    /// A guest of `pipelock ab` booted but gave no usable result.
    #[error("kernel {kernel}: {reason}")]
    Guest { kernel: String, reason: String },
    /// The kernel cannot be traced the way the command asks.
    #[error("{reason}")]
    Unsupported { reason: String },
    /// The arguments are valid one by one but not together.
    #[error("{0}")]
    Usage(String),
    /// The thread that drains the maps ended with a panic.
    #[error("the collector thread stopped with a panic")]
    CollectorPanicked,
    /// Ctrl-C (or SIGTERM) stopped the command; what finished was reported.
    #[error("interrupted")]
    Interrupted,
    /// The self-test ran but saw nothing: the pipeline is broken somewhere.
    #[error("self-test failed: {reason}")]
    SelfTest { reason: String },
}

impl Error {
    pub(crate) fn read(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| Self::Read { path, source }
    }
}

/// One line with every cause, the way `main` reports errors: `a: b: c`.
pub fn one_line(err: &(dyn std::error::Error + 'static)) -> String {
    let mut line = err.to_string();
    let mut cause = err.source();
    while let Some(err) = cause {
        let text = err.to_string();
        // aya nests errors that repeat their inner message; print each once.
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = err.source();
    }
    // aya appends "Verifier output: <log>" even when the log is empty.
    let line = line.replace('\n', " ");
    let line = line.trim_end();
    line.strip_suffix("Verifier output:")
        .unwrap_or(line)
        .trim_end()
        .to_owned()
}
