//! Drawing `pipelock top`: pure functions of the [`App`] state, so each
//! screen is tested in ratatui's test backend at a fixed size.
use std::collections::BTreeMap;

use ratatui::{
    Frame,
    layout::{Constraint, Layout, Rect},
    style::{Modifier, Style},
    text::Line,
    widgets::{Block, Borders, Cell, Clear, Paragraph, Row, Sparkline, Table, TableState, Wrap},
};

use super::{
    app::{App, TopRow},
    groups::rows_noun,
    groups_view::{draw_group_detail, draw_group_table},
    keys::{draw_help, footer_line},
};
use crate::{
    model::{ByKey, Timing},
    render::{header, render_histogram_width},
    units::{human_mib, human_ns, human_rate},
};

pub fn draw(frame: &mut Frame, app: &App) {
    let area = frame.area();
    let detail = if app.detail && app.has_selection() {
        (area.height / 2).min(18)
    } else {
        0
    };
    let lines = header_lines(app, usize::from(area.width));
    let [header, table, pane, footer] = Layout::vertical([
        Constraint::Length(lines.len() as u16),
        Constraint::Min(2),
        Constraint::Length(detail),
        Constraint::Length(1),
    ])
    .areas(area);
    frame.render_widget(Paragraph::new(lines), header);
    match app.by {
        ByKey::Lock => draw_table(frame, table, app),
        ByKey::Caller | ByKey::Task => draw_group_table(frame, table, app),
    }
    if detail > 0 {
        match app.selected_group() {
            Some(group) => draw_group_detail(frame, pane, app, group),
            None => draw_detail(frame, pane, app),
        }
    }
    frame.render_widget(Paragraph::new(footer_line(app)), footer);
    if app.help {
        // Over the header too: every key and column fits 30 rows.
        draw_help(frame, header.union(table).union(pane), app);
    } else if app.kernel_pane {
        draw_kernel_pane(frame, table.union(pane), app);
    }
}

/// The mode and what it measures, the refused modes, pipelock's own cost,
/// then one line of what matters now (the filter, a map near full, a note).
/// The lines before the last fit [`header::WIDTH`] columns.
fn header_lines(app: &App, width: usize) -> Vec<Line<'static>> {
    // Paused, the refresh interval does not matter: the word takes its place.
    let every = if app.paused {
        " · PAUSED".to_owned()
    } else {
        format!(", every {:.1} s", app.interval_s)
    };
    let mut lines = vec![
        Line::from(format!(
            "pipelock top · kernel {} · mode {} · {:.0} s{every}",
            app.kernel, app.mode, app.elapsed_s
        )),
        Line::from(header::measured(app.hooked)),
    ];
    if let Some(refused) = header::refused(&app.refused) {
        lines.push(Line::from(refused));
    }
    let per_run = app
        .bpf_ns_per_run
        .map_or_else(|| "n/a".to_owned(), |ns| human_ns(ns as u64));
    let memory = header::kernel_memory(&app.fill).map_or_else(String::new, |m| format!(" · maps {m}"));
    let cost = format!(
        "pipelock's BPF: {} runs/s, {per_run}/run, {:.2} % of a CPU{memory} · dropped: ",
        human_rate(app.bpf_runs_per_s),
        app.bpf_cpu_share * 100.0
    );
    let drops = if app.drops.is_empty() {
        "none".to_owned()
    } else {
        let all = app
            .drops
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ");
        // Where the list does not fit, its sum; `m` lists them.
        let room = width.saturating_sub(cost.chars().count());
        let total: u64 = app.drops.iter().map(|(_, n)| n).sum();
        if all.chars().count() <= room {
            all
        } else {
            format!("{total} (m)")
        }
    };
    lines.push(Line::from(format!("{cost}{drops}")));
    let drops: BTreeMap<String, u64> = app.drops.iter().cloned().collect();
    let last = if app.samples == 0 {
        "waiting for the first interval…".to_owned()
    } else if let Some(asked) = app.asked_twice.first() {
        // Before anything else: the figures below no longer matter much.
        format!(
            "DEADLOCK: {} asked for the mutex of {} that it holds{}",
            asked.task(),
            asked.lock,
            match app.asked_twice.len() {
                1 => String::new(),
                n => format!(" (and {} more; m)", n - 1),
            }
        )
    } else if !app.filter.is_empty() {
        let all = match app.by {
            ByKey::Lock => app.rows.len(),
            ByKey::Caller => app.callers.len(),
            ByKey::Task => app.tasks.len(),
        };
        format!(
            "filter \"{}\": {} of {all} {}",
            app.filter,
            app.shown(),
            rows_noun(app.by)
        )
    } else if let Some(warning) = header::map_warnings(&app.fill, &drops).into_iter().next() {
        format!("{warning} · m: maps")
    } else {
        match app.notes.as_slice() {
            [] => String::new(),
            [note] => format!("note: {note}"),
            [note, ..] => format!("note: {note} (m: {} notes)", app.notes.len()),
        }
    };
    lines.push(Line::from(last));
    lines
}

/// `m`: what the header sums up, in full.
fn draw_kernel_pane(frame: &mut Frame, area: Rect, app: &App) {
    let mut lines = vec![Line::from(
        " map                  entries used   capacity   kernel memory",
    )];
    for m in &app.fill {
        lines.push(Line::from(format!(
            " {:<20} {:>12}   {:>8}   {}",
            m.name,
            m.used.map_or_else(|| "not counted".to_owned(), |u| u.to_string()),
            m.capacity,
            m.memlock_bytes.map_or_else(|| "n/a".to_owned(), human_mib)
        )));
    }
    for asked in &app.asked_twice {
        lines.push(Line::from(format!(" {}", asked.line())));
    }
    if let Some(c) = &app.collector {
        lines.push(Line::from(format!(
            " pipelock keeps {} of {} locks one by one (--track-locks), {} retired; resident memory {}",
            c.tracked,
            c.max_tracked,
            c.retired,
            c.resident_bytes.map_or_else(|| "n/a".to_owned(), human_mib)
        )));
    }
    lines.push(Line::from(""));
    lines.push(Line::from(if app.drops.is_empty() {
        " dropped events: none".to_owned()
    } else {
        format!(
            " dropped events: {} (the manual's trace page says what each means)",
            app.drops
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }));
    for refusal in &app.refused {
        lines.push(Line::from(format!(
            " {} refused: {}",
            refusal.mode, refusal.detail
        )));
    }
    for note in &app.notes {
        lines.push(Line::from(format!(" note: {note}")));
    }
    let block = Block::default()
        .borders(Borders::ALL)
        .title(" kernel side · m or Esc closes ");
    frame.render_widget(Clear, area);
    frame.render_widget(
        Paragraph::new(lines).block(block).wrap(Wrap { trim: false }),
        area,
    );
}

/// A table column: header, width (room for the sort marker ▼ included),
/// and the cell of a row.
struct Column {
    header: &'static str,
    width: u16,
    /// Lower is kept longer when the terminal is narrow.
    priority: u8,
    cell: fn(&TopRow) -> String,
}

fn timing(t: Option<&Timing>, measured: bool, pick: fn(&Timing) -> u64) -> String {
    match t {
        Some(t) => human_ns(pick(t)),
        None if measured => "-".to_owned(),
        None => "n/a".to_owned(),
    }
}

const COLUMNS: [Column; 13] = [
    Column {
        header: "class",
        width: 18,
        priority: 3,
        cell: |r| r.class.to_owned(),
    },
    Column {
        header: "lock",
        width: 26,
        priority: 0,
        cell: |r| r.name.clone(),
    },
    Column {
        header: "acquired/s",
        width: 11,
        priority: 4,
        cell: |r| r.acquisitions_per_s.map_or_else(|| "n/a".to_owned(), human_rate),
    },
    Column {
        header: "contended/s",
        width: 12,
        priority: 1,
        cell: |r| human_rate(r.contentions_per_s),
    },
    Column {
        header: "wait avg",
        width: 9,
        priority: 2,
        cell: |r| timing(r.wait.as_ref(), r.total_wait.is_some(), |t| t.avg_ns),
    },
    Column {
        header: "wait p99",
        width: 9,
        priority: 8,
        cell: |r| timing(r.wait.as_ref(), r.total_wait.is_some(), |t| t.p99_ns),
    },
    Column {
        header: "wait max",
        width: 9,
        priority: 5,
        cell: |r| timing(r.wait.as_ref(), r.total_wait.is_some(), |t| t.max_ns),
    },
    Column {
        header: "hold avg",
        width: 9,
        priority: 6,
        cell: |r| timing(r.hold.as_ref(), r.total_hold.is_some(), |t| t.avg_ns),
    },
    Column {
        header: "hold p99",
        width: 9,
        priority: 9,
        cell: |r| timing(r.hold.as_ref(), r.total_hold.is_some(), |t| t.p99_ns),
    },
    Column {
        header: "hold max",
        width: 9,
        priority: 7,
        cell: |r| timing(r.hold.as_ref(), r.total_hold.is_some(), |t| t.max_ns),
    },
    Column {
        header: "total contended",
        width: 15,
        priority: 11,
        cell: |r| r.total_contentions.to_string(),
    },
    Column {
        header: "total wait",
        width: 11,
        priority: 10,
        cell: |r| timing(r.total_wait.as_ref(), false, |t| t.total_ns),
    },
    Column {
        header: "processes",
        width: 24,
        priority: 12,
        cell: |r| r.comms.join(" "),
    },
];

/// Columns of what only fentry and kprobe measure: left out in tracepoint
/// mode rather than shown as a column of `n/a` (the header says why).
const HOOKED_ONLY: [&str; 4] = ["acquired/s", "hold avg", "hold p99", "hold max"];

/// The columns that fit `width`, most important first, shown in table order.
fn fitting_columns(width: u16, hooked: bool) -> Vec<&'static Column> {
    let mut by_priority: Vec<&Column> = COLUMNS
        .iter()
        .filter(|c| hooked || !HOOKED_ONLY.contains(&c.header))
        .collect();
    by_priority.sort_by_key(|c| c.priority);
    let mut used = 0u16;
    let mut kept = Vec::new();
    for column in by_priority {
        let need = column.width + 1;
        if used + need <= width || kept.is_empty() {
            used += need;
            kept.push(column.header);
        }
    }
    COLUMNS.iter().filter(|c| kept.contains(&c.header)).collect()
}

fn draw_table(frame: &mut Frame, area: Rect, app: &App) {
    let columns = fitting_columns(area.width, app.hooked);
    let sorted_by = app.sort.label();
    let header = Row::new(columns.iter().map(|c| {
        let title = if c.header == sorted_by {
            format!("{}▼", c.header)
        } else {
            c.header.to_owned()
        };
        Cell::from(title)
    }))
    .style(Style::default().add_modifier(Modifier::BOLD | Modifier::REVERSED));
    let visible = app.visible();
    let rows = visible
        .iter()
        .map(|row| Row::new(columns.iter().map(|c| Cell::from((c.cell)(row)))));
    // The last text column takes the room left: the process list where it
    // fits, else the lock's name, which is then not cut.
    let stretch = if columns.iter().any(|c| c.header == "processes") {
        "processes"
    } else {
        "lock"
    };
    let widths = columns.iter().map(|c| {
        if c.header == stretch {
            Constraint::Min(c.width)
        } else {
            Constraint::Length(c.width)
        }
    });
    let table = Table::new(rows, widths)
        .header(header)
        .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED));
    let mut state = TableState::default().with_selected((!visible.is_empty()).then_some(app.selected));
    if visible.is_empty() {
        let empty = if app.rows.is_empty() {
            "no traced lock was seen yet"
        } else {
            "no lock matches the filter"
        };
        let [head, rest] = Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(area);
        frame.render_stateful_widget(table, head, &mut state);
        frame.render_widget(Paragraph::new(empty), rest);
        return;
    }
    frame.render_stateful_widget(table, area, &mut state);
}

fn draw_detail(frame: &mut Frame, area: Rect, app: &App) {
    let Some(row) = app.selected_row() else {
        return;
    };
    let block = Block::default().borders(Borders::TOP).title(format!(
        " {} {} · {} · Enter/Esc closes ",
        row.class,
        row.name,
        row.comms.join(" ")
    ));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let [wait, hold, right] = Layout::horizontal([
        Constraint::Percentage(35),
        Constraint::Percentage(35),
        Constraint::Percentage(30),
    ])
    .areas(inner);
    let owners = if row.owners.is_empty() { 0 } else { 5 };
    let caller = row
        .top_caller
        .as_ref()
        .map_or(0, |c| 1 + c.stack.len().min(4) as u16);
    let [held_by, called_from, trend] = Layout::vertical([
        Constraint::Length(owners),
        Constraint::Length(caller),
        Constraint::Min(2),
    ])
    .areas(right);
    if owners > 0 {
        frame.render_widget(Paragraph::new(owner_lines(row)), held_by);
    }
    if let Some(top) = &row.top_caller {
        let mut lines = vec![Line::from(format!(
            "top call stack ({} contended, wait {})",
            top.contentions,
            human_ns(top.wait_total_ns)
        ))];
        lines.extend(top.stack.iter().take(4).map(|f| Line::from(format!("  {f}"))));
        frame.render_widget(Paragraph::new(lines), called_from);
    }
    let histogram = |title: &str, t: Option<&Timing>, area: Rect| {
        let bar = usize::from(area.width.saturating_sub(36)).clamp(4, 40);
        let text = match t {
            Some(t) => format!(
                "{title} since start ({} samples)\n{}",
                t.count,
                render_histogram_width(t, bar)
            ),
            None => format!("{title}: not measured in this mode"),
        };
        Paragraph::new(text)
    };
    frame.render_widget(histogram("wait", row.total_wait.as_ref(), wait), wait);
    frame.render_widget(histogram("hold", row.total_hold.as_ref(), hold), hold);
    let history: Vec<u64> = app
        .history
        .get(&(row.lock_addr, row.owner))
        .map(|h| h.iter().copied().collect())
        .unwrap_or_default();
    // The newest intervals that fit, newest at the right.
    let shown = &history[history.len().saturating_sub(usize::from(trend.width))..];
    frame.render_widget(
        Sparkline::default()
            .block(Block::default().title("contended per interval"))
            .data(shown),
        trend,
    );
}

/// "held by": the lock's busiest owners and what they were doing.
fn owner_lines(row: &TopRow) -> Vec<Line<'static>> {
    let states = |h: &crate::model::HolderState| {
        h.percentages().map_or_else(
            || "state n/a".to_owned(),
            |[cpu, runnable, sleep]| format!("cpu {cpu:.0}% run {runnable:.0}% sleep {sleep:.0}%"),
        )
    };
    let mut lines = vec![Line::from(format!("held by (owners: {})", states(&row.holder)))];
    for owner in &row.owners {
        lines.push(Line::from(format!(
            "{} {} · {}",
            owner.label(),
            human_ns(owner.wait_ns),
            states(&owner.holder)
        )));
    }
    lines
}

#[cfg(test)]
#[path = "view_tests.rs"]
mod tests;
