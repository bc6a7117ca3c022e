//! `pipelock top`'s screen: the app state (keys and samples in, no I/O), a
//! pure view of it, and the terminal guard. The event loop that wires them
//! to a collector is `crate::cmd::top`.
pub mod app;
#[cfg(test)]
pub mod fixtures;
pub mod groups;
mod groups_view;
mod keys;
pub mod terminal;
pub mod view;
