//! pipelock's programs and maps: the embedded object, the hook table, the
//! choice of attach mode, attaching, reading the maps back.
pub mod attach;
pub mod config;
pub mod hooks;
pub mod log;
pub mod maps;
pub mod memory;
pub mod object;
pub mod plan;
pub mod progstats;
pub mod retprobe;
pub mod selftest;
pub mod support_check;

pub use self::{
    attach::HookBodies,
    config::Filters,
    plan::{AttachMode, TracepointKind},
};
