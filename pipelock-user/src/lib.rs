//! pipelock's userspace: kernel inspection, loading and attaching the embedded
//! eBPF programs, and the reports built from what they collect.
//!
//! Data flows in one direction: [`inspector`] (what the kernel offers) →
//! [`attach`] (which mode each lock class gets) → [`ebpf`] (load, attach, read
//! maps) → the reports in [`probe`] and [`selftest`]. The built-in load
//! generators live in [`workload`], their statistics in [`stats`].

pub mod attach;
pub mod cli;
pub mod compare;
pub mod ebpf;
pub mod error;
pub mod inspector;
pub mod interrupt;
pub mod lockstats;
pub mod overhead;
pub mod privilege;
pub mod probe;
pub mod progstats;
pub mod selftest;
pub mod stats;
pub mod top;
pub mod trace;
pub mod workload;

pub use error::Error;
