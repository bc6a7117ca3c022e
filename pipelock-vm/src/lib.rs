//! Booting real kernels under qemu for pipelock: fetching Debian's kernel
//! packages with a private apt configuration, packing an initramfs
//! (busybox, the binaries, an /init script), running qemu with a hard
//! timeout, and reading the guest's console (its verdict, its framed
//! results). xtask's VM tests and `pipelock ab` both use it.
pub mod build;
pub mod cpio;
pub mod guest_log;
pub mod image;
pub mod kernels;
pub mod qemu;

use std::process::Command;

/// What can go wrong preparing or booting a guest.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or written, or a process started.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A command ran and failed.
    #[error("{command} failed: {detail}")]
    Command { command: String, detail: String },
    /// Input that cannot be used: a kernel list line, a kernel that is not
    /// there, a package apt does not know.
    #[error("{0}")]
    Invalid(String),
    /// A kernel build failed: the compiler's last complaint, and the log.
    #[error("kernel {side} does not build: {errors} (build log: {})", log.display())]
    BuildFailed {
        side: String,
        errors: String,
        log: std::path::PathBuf,
    },
    /// Stopped on request (Ctrl-C) before it was done.
    #[error("interrupted")]
    Interrupted,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The error of `what` failing with `source`.
pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// Runs a command to completion; fails with its stderr's last line.
pub fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd
        .output()
        .map_err(io(format!("cannot start {:?}", cmd.get_program())))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(Error::Command {
        command: format!("{cmd:?}"),
        detail: stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map_or_else(|| out.status.to_string(), |l| l.trim().to_owned()),
    })
}
