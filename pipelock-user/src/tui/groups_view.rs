//! Drawing the call-stack and thread rows of `pipelock top` (`--by`, `b`):
//! the row's stack or thread leads, its figures follow as far as the
//! terminal is wide.
use ratatui::{
    Frame,
    layout::{Constraint, Layout, Rect},
    style::{Modifier, Style},
    text::Line,
    widgets::{Block, Borders, Cell, Paragraph, Row, Table, TableState},
};

use super::{
    app::{App, SortColumn},
    groups::{GroupRow, rows_noun},
};
use crate::{
    model::ByKey,
    units::{human_ns, human_rate},
};

/// A call-stack or thread table column, like [`Column`].
struct GroupColumn {
    header: &'static str,
    width: u16,
    cell: fn(&GroupRow) -> String,
}

const GROUP_COLUMNS: [GroupColumn; 8] = [
    GroupColumn {
        header: "class",
        width: 18,
        cell: |r| r.class.to_owned(),
    },
    GroupColumn {
        header: "contended/s",
        width: 12,
        cell: |r| human_rate(r.contentions_per_s),
    },
    GroupColumn {
        header: "acquired/s",
        width: 11,
        cell: |r| r.acquisitions_per_s.map_or_else(|| "n/a".to_owned(), human_rate),
    },
    GroupColumn {
        header: "total contended",
        width: 15,
        cell: |r| r.total_contentions.to_string(),
    },
    GroupColumn {
        header: "total wait",
        width: 11,
        cell: |r| human_ns(r.wait_total_ns),
    },
    GroupColumn {
        header: "wait avg",
        width: 9,
        cell: |r| human_ns(r.wait_avg_ns()),
    },
    GroupColumn {
        header: "wait max",
        width: 9,
        cell: |r| human_ns(r.wait_max_ns),
    },
    GroupColumn {
        header: "hold total",
        width: 11,
        cell: |r| r.hold_total_ns.map_or_else(|| "n/a".to_owned(), human_ns),
    },
];

/// The sort key's column among [`GROUP_COLUMNS`] (wait and hold sort by
/// the totals these rows keep).
fn group_sort_header(app: &App) -> &'static str {
    match app.sort {
        SortColumn::ContentionsPerS => "contended/s",
        SortColumn::AcquisitionsPerS => "acquired/s",
        SortColumn::WaitAvg => "wait avg",
        SortColumn::WaitMax => "wait max",
        SortColumn::HoldAvg | SortColumn::HoldMax => "hold total",
        SortColumn::TotalWait => "total wait",
        SortColumn::Name => match app.by {
            ByKey::Task => "thread",
            _ => "caller",
        },
    }
}

/// `--by caller` / `--by task`: the stack (or thread) leads each row, the
/// figures follow as far as the terminal is wide.
pub(super) fn draw_group_table(frame: &mut Frame, area: Rect, app: &App) {
    let label = if app.by == ByKey::Task { "thread" } else { "caller" };
    let label_width: u16 = if app.by == ByKey::Task { 24 } else { 40 };
    let sorted_by = group_sort_header(app);
    let mut used = label_width + 1;
    let columns: Vec<&GroupColumn> = GROUP_COLUMNS
        .iter()
        .filter(|c| {
            used += c.width + 1;
            used <= area.width
        })
        .collect();
    let marked = |header: &str| {
        if header == sorted_by {
            format!("{header}▼")
        } else {
            header.to_owned()
        }
    };
    let header = Row::new(
        std::iter::once(Cell::from(marked(label)))
            .chain(columns.iter().map(|c| Cell::from(marked(c.header)))),
    )
    .style(Style::default().add_modifier(Modifier::BOLD | Modifier::REVERSED));
    let visible = app.visible_groups();
    let rows = visible.iter().map(|row| {
        Row::new(
            std::iter::once(Cell::from(row.label.clone()))
                .chain(columns.iter().map(|c| Cell::from((c.cell)(row)))),
        )
    });
    let widths = std::iter::once(Constraint::Min(label_width))
        .chain(columns.iter().map(|c| Constraint::Length(c.width)));
    let table = Table::new(rows, widths)
        .header(header)
        .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED));
    let mut state = TableState::default().with_selected((!visible.is_empty()).then_some(app.selected));
    if visible.is_empty() {
        let recorded = match app.by {
            ByKey::Caller => !app.callers.is_empty(),
            _ => !app.tasks.is_empty(),
        };
        let empty = if recorded {
            format!("no {} match the filter", rows_noun(app.by))
        } else {
            format!("no {} seen yet", rows_noun(app.by))
        };
        let [head, rest] = Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(area);
        frame.render_stateful_widget(table, head, &mut state);
        frame.render_widget(Paragraph::new(empty), rest);
        return;
    }
    frame.render_stateful_widget(table, area, &mut state);
}

/// A call stack's frames in full (a thread's row has none to add).
pub(super) fn draw_group_detail(frame: &mut Frame, area: Rect, app: &App, row: &GroupRow) {
    let title = match app.by {
        ByKey::Task => format!(" {} {} · Enter/Esc closes ", row.class, row.label),
        _ => format!(" {} call stack · Enter/Esc closes ", row.class),
    };
    let block = Block::default().borders(Borders::TOP).title(title);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let avg = if row.total_acquisitions.is_some() {
        "per acquisition"
    } else {
        "per contended acquisition"
    };
    let mut lines = vec![Line::from(format!(
        "{} contended{} · wait {} in all, {} {avg}, max {} · hold {}",
        row.total_contentions,
        row.total_acquisitions
            .map_or_else(String::new, |a| format!(" of {a} acquisitions")),
        human_ns(row.wait_total_ns),
        human_ns(row.wait_avg_ns()),
        human_ns(row.wait_max_ns),
        row.hold_total_ns.map_or_else(|| "n/a".to_owned(), human_ns),
    ))];
    lines.extend(row.stack.iter().map(|f| Line::from(format!("  {f}"))));
    frame.render_widget(Paragraph::new(lines), inner);
}

#[cfg(test)]
mod tests {
    use crossterm::event::KeyCode;

    use super::*;
    use crate::tui::fixtures::{app_grouped, key, screen};

    #[test]
    fn call_stack_rows_and_their_frames() {
        let mut app = app_grouped(ByKey::Caller);
        let text = screen(&app, 200, 30);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[4].contains("caller") && lines[4].contains("contended/s▼"),
            "{text}"
        );
        assert!(
            lines[5].contains("anon_pipe_write+0x50 < vfs_write+0x2a4"),
            "{text}"
        );
        assert!(lines[5].contains("pipe-mutex"), "{text}");
        assert!(text.contains("b rows [call stacks]"), "{text}");
        app.on_key(key(KeyCode::Char('j')));
        app.on_key(key(KeyCode::Enter));
        let text = screen(&app, 200, 30);
        assert!(text.contains("pipe-mutex call stack"), "{text}");
        assert!(
            text.contains("30 contended of 90 acquisitions · wait 90.00 us in all, 1.00 us per acquisition"),
            "{text}"
        );
        assert!(text.contains("  ksys_write+0x73"), "every frame: {text}");
        for (w, h) in [(60, 12), (8, 3), (1, 1)] {
            let text = screen(&app, w, h);
            if w >= 60 {
                assert!(text.contains("caller"), "{w}x{h}: {text}");
            }
        }
    }

    #[test]
    fn thread_rows_name_their_threads() {
        let mut app = app_grouped(ByKey::Task);
        let text = screen(&app, 200, 20);
        assert!(text.contains("thread"), "{text}");
        assert!(text.contains("herd(4000/4001)"), "{text}");
        app.on_key(key(KeyCode::Char('/')));
        for c in "zzz".chars() {
            app.on_key(key(KeyCode::Char(c)));
        }
        let text = screen(&app, 200, 20);
        assert!(text.contains("no threads match the filter"), "{text}");
        assert!(text.contains("filter \"zzz\": 0 of 2 threads"), "{text}");
    }
}
