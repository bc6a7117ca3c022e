//! `pipelock top`'s keys as the screen shows them: the key line at the
//! bottom (the common keys, within 100 columns) and the `?` help with
//! every key the app takes.
use ratatui::{
    Frame,
    layout::Rect,
    style::{Modifier, Style},
    text::Line,
    widgets::{Block, Borders, Clear, Paragraph},
};

use super::{
    app::{App, Input},
    groups::rows_noun,
};

/// Every key `top` takes, as `?` lists them.
pub const KEYS: &[(&str, &str)] = &[
    ("q, Esc", "quit (Esc first closes the help or the details)"),
    ("j/k, ↓/↑", "move the selection"),
    ("g/G, Home/End", "first / last row"),
    (
        "Enter",
        "details of the selected row: histograms, owners, call stacks",
    ),
    ("s", "next sort column"),
    (
        "c, a, w, h, t",
        "sort by contended/s, acquired/s, longest wait, longest hold, total wait",
    ),
    (
        "/, f",
        "filter rows by class, lock or process (Enter keeps, Esc clears)",
    ),
    (
        "b",
        "rows by lock, call stack (with --callers) or thread (with --by task)",
    ),
    (
        "m",
        "kernel side: every map's fill, dropped events, notes, refused modes' errors",
    ),
    (
        "F",
        "flame graph of the waits so far, to pipelock-top-TIME.svg (with --callers)",
    ),
    ("p, Space", "pause the view (the trace goes on)"),
    ("r", "reset: forget the figures so far"),
    ("?", "this help"),
];

/// Every column the lock table can show, as `?` explains them.
pub const COLUMNS: &[(&str, &str)] = &[
    (
        "class",
        "pipe-mutex, pipe-rd-wait/-wr-wait (wait queues), other-in-pipe-call, lockref",
    ),
    (
        "lock",
        "which: pipe:[inode], dentry:NAME, rq_lock(cpu N), a symbol or an address",
    ),
    (
        "acquired/s",
        "acquisitions per second over the last interval (fentry, kprobe)",
    ),
    (
        "contended/s",
        "acquisitions that had to wait, per second over the last interval",
    ),
    (
        "wait avg/p99/max",
        "time from asking for the lock to getting it, over the last interval",
    ),
    (
        "hold avg/p99/max",
        "time from getting the lock to releasing it (fentry, kprobe)",
    ),
    (
        "total contended/wait",
        "contended acquisitions and time waited since start (or r)",
    ),
    ("processes", "comm(pid) of each process seen on the lock"),
    (
        "-",
        "measured, but nothing this interval; p99 is within ±6.25 % of the true value",
    ),
];

pub(super) fn draw_help(frame: &mut Frame, area: Rect, app: &App) {
    let mut lines: Vec<Line> = KEYS
        .iter()
        .map(|(keys, what)| Line::from(format!(" {keys:<14} {what}")))
        .collect();
    lines.push(Line::from(" the lock table's columns:").style(Style::default().add_modifier(Modifier::BOLD)));
    lines.extend(
        COLUMNS
            .iter()
            .map(|(column, what)| Line::from(format!(" {column:<20} {what}"))),
    );
    if !app.hooked {
        lines.push(Line::from(
            " (this mode sees contended acquisitions only: no acquired/s or hold columns)",
        ));
    }
    let block = Block::default()
        .borders(Borders::ALL)
        .title(" keys · ? or Esc closes ");
    frame.render_widget(Clear, area);
    frame.render_widget(Paragraph::new(lines).block(block), area);
}

pub(super) fn footer_line(app: &App) -> Line<'static> {
    if app.input == Input::Filter {
        return Line::from(format!(
            "filter (class, lock, process): {}▏  Enter keep · Esc clear",
            app.filter
        ));
    }
    if let Some(status) = &app.status {
        return Line::from(status.clone());
    }
    // Short enough for 100 columns; `?` lists the rest.
    let switch = if app.groupings.callers || app.groupings.tasks {
        format!(" · b rows [{}]", rows_noun(app.by))
    } else {
        String::new()
    };
    Line::from(format!(
        "q quit · Enter details · s sort [{}] · / filter{switch} · p pause · ? keys",
        app.sort.label()
    ))
    .style(Style::default().add_modifier(Modifier::DIM))
}

#[cfg(test)]
mod tests {
    use crossterm::event::KeyCode;

    use super::*;
    use crate::{
        model::ByKey,
        tui::fixtures::{app_with, key, screen},
    };

    #[test]
    fn the_key_line_fits_100_columns_and_help_lists_every_key() {
        let mut app = app_with(5);
        app.groupings.callers = true;
        // The longest it gets: the longest sort label, rows by call stack.
        app.sort = crate::tui::app::SortColumn::ContentionsPerS;
        app.by = ByKey::Caller;
        let line = footer_line(&app).to_string();
        assert!(
            line.chars().count() <= 100,
            "{} columns: {line}",
            line.chars().count()
        );
        assert!(
            line.contains("b rows [call stacks]") && line.contains("? keys"),
            "{line}"
        );
        app.by = ByKey::Lock;
        app.on_key(key(KeyCode::Char('?')));
        let text = screen(&app, 100, 30);
        // Every key the app acts on, and nothing cut at the edge.
        for (keys, what) in KEYS {
            let shown = format!(" {keys:<14} {what}");
            assert!(text.contains(shown.trim_end()), "{keys} not in the help:\n{text}");
        }
        for (column, what) in COLUMNS {
            let shown = format!(" {column:<20} {what}");
            assert!(
                text.contains(shown.trim_end()),
                "{column} not in the help:\n{text}"
            );
        }
        app.on_key(key(KeyCode::Esc));
        assert!(!app.help);
        assert!(!screen(&app, 100, 30).contains("this help"));
    }
}
