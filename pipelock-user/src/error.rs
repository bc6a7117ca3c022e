use std::{io, path::PathBuf};

/// Everything that can stop a pipelock command; `main` prints it as one line.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Loading BPF programs needs privileges the caller lacks.
    #[error(
        "pipelock needs root, or CAP_BPF and CAP_PERFMON, to load eBPF programs: this process lacks {missing} \
         (run it with sudo, or grant them: setpriv/capsh, AmbientCapabilities= in a unit)"
    )]
    NotPrivileged { missing: String },
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
    /// `pipelock ab` found a kernel unsafe: a thread asked for a lock it
    /// held, or tasks stayed blocked (exit status 3; the verdict was
    /// printed).
    #[error("kernel {kernels} is unsafe (see the verdict above)")]
    Unsafe { kernels: String },
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

/// A few words for why `err` stopped an attach mode, for a header line:
/// the errno of the syscall that refused (`EPERM`), or what the kernel
/// lacks. `one_line` keeps the whole story for `pipelock probe` and JSON.
pub fn short_reason(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(err) = cause {
        if let Some(code) = err.downcast_ref::<io::Error>().and_then(io::Error::raw_os_error) {
            return errno_name(code).map_or_else(|| format!("errno {code}"), str::to_owned);
        }
        if let Some(Error::Unsupported { reason }) = err.downcast_ref::<Error>() {
            if reason.contains("CONFIG_KPROBES") {
                return "no kprobes in this kernel".to_owned();
            }
            return shorten(reason, 40);
        }
        cause = err.source();
    }
    shorten(&one_line(err), 40)
}

/// The errno names a program load or attach returns.
fn errno_name(code: i32) -> Option<&'static str> {
    Some(match code {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::E2BIG => "E2BIG",
        libc::EACCES => "EACCES",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EINVAL => "EINVAL",
        libc::ENOSPC => "ENOSPC",
        libc::ENOSYS => "ENOSYS",
        libc::ENOTSUP => "EOPNOTSUPP",
        libc::ESRCH => "ESRCH",
        libc::EFAULT => "EFAULT",
        libc::ENOMEM => "ENOMEM",
        // The kernel's internal ENOTSUPP, which leaks out of BPF syscalls.
        524 => "ENOTSUPP",
        _ => return None,
    })
}

/// `text` cut at a word boundary to at most `max` characters, `…` marking the cut.
pub fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let limit: String = text.chars().take(max.saturating_sub(1)).collect();
    let cut = limit.rfind(' ').filter(|&i| i > max / 2).unwrap_or(limit.len());
    format!("{}…", limit[..cut].trim_end_matches([' ', ',', ';', ':']))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_named_by_its_errno_or_what_the_kernel_lacks() {
        let load = Error::Io {
            what: "BPF_PROG_LOAD",
            source: io::Error::from_raw_os_error(libc::EPERM),
        };
        assert_eq!(short_reason(&load), "EPERM");
        let kprobes = Error::Unsupported {
            reason: "no kprobe PMU (kernel built without CONFIG_KPROBES)".to_owned(),
        };
        assert_eq!(short_reason(&kprobes), "no kprobes in this kernel");
        let unknown = Error::Io {
            what: "x",
            source: io::Error::from_raw_os_error(4095),
        };
        assert_eq!(short_reason(&unknown), "errno 4095");
        let long = Error::Unsupported {
            reason: "none of mutex_lock, mutex_unlock, pipe_read, pipe_write can be hooked here".to_owned(),
        };
        let short = short_reason(&long);
        assert!(short.chars().count() <= 40 && short.ends_with('…'), "{short}");
    }
}
