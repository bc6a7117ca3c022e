//! The terminal while `pipelock top` owns it: raw mode and the alternate
//! screen, always given back (on drop, and by a panic hook).
use std::io;

use crossterm::{
    execute,
    terminal::{EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode},
};

use crate::Error;

pub fn terminal_err(source: io::Error) -> Error {
    Error::Io {
        what: "drawing the terminal",
        source,
    }
}

/// Raw mode and the alternate screen while alive; restored on drop and by
/// a panic hook, so a crash never leaves the user's terminal unusable.
pub struct TerminalGuard;

impl TerminalGuard {
    pub fn enter() -> Result<Self, Error> {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore_terminal();
            previous(info);
        }));
        enable_raw_mode().map_err(terminal_err)?;
        execute!(io::stdout(), EnterAlternateScreen).map_err(terminal_err)?;
        Ok(Self)
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore_terminal();
    }
}

fn restore_terminal() {
    let _ = disable_raw_mode();
    let _ = execute!(io::stdout(), LeaveAlternateScreen);
}
