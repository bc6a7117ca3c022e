//! `--ebpf-log`: the programs' aya-log records, forwarded to `log`.
//!
//! aya-log delivers records only when `flush()` is called on its logger,
//! and the logger owns the log map's descriptor, which aya has already
//! written into every program it relocated: it must live as long as the
//! programs may still be loaded. A reader thread owns it and, on a tokio
//! runtime of its own, flushes it whenever its ring buffer becomes readable
//! (`AsyncFd`, as aya-log's documentation does it).
use std::thread::JoinHandle;

use aya::Ebpf;
use tokio::{io::unix::AsyncFd, sync::oneshot};

use crate::error::one_line;

/// Forwards the programs' log records until dropped.
pub struct LogReader {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl LogReader {
    /// Takes the log map out of `ebpf` and starts reading it; None (with a
    /// warning) where the object has no log map or no runtime can start.
    pub fn start(ebpf: &mut Ebpf) -> Option<Self> {
        let logger = match aya_log::EbpfLogger::init(ebpf) {
            Ok(logger) => logger,
            Err(err) => {
                log::warn!("eBPF logging unavailable: {}", one_line(&err));
                return None;
            }
        };
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("ebpf-log".into())
            .spawn(move || {
                // The reader only reads a ring buffer it was handed: it needs
                // no capability, and keeps none past an exporter's own drop.
                if let Err(err) = crate::kernel::privilege::drop_all() {
                    log::debug!("{err}");
                }
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_io().build() {
                    Ok(runtime) => runtime,
                    Err(err) => return log::warn!("eBPF logging unavailable: {err}"),
                };
                runtime.block_on(async move {
                    // SAFETY: the logger owns its ring buffer's descriptor for
                    // as long as it lives, and always answers with that one.
                    let registered =
                        unsafe { AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE) };
                    let mut logger = match registered {
                        Ok(fd) => fd,
                        Err(err) => return log::warn!("eBPF logging unavailable: {err}"),
                    };
                    tokio::pin!(stopped);
                    loop {
                        tokio::select! {
                            _ = &mut stopped => break,
                            ready = logger.readable_mut() => match ready {
                                Ok(mut guard) => {
                                    guard.get_inner_mut().flush();
                                    guard.clear_ready();
                                }
                                Err(err) => return log::warn!("eBPF log reader stopped: {err}"),
                            },
                        }
                    }
                    // What arrived before the stop.
                    logger.get_mut().flush();
                });
            })
            .ok()?;
        Some(Self {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for LogReader {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
