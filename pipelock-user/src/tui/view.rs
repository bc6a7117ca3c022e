//! Drawing `pipelock top`: pure functions of the [`App`] state, so each
//! screen is tested in ratatui's test backend at a fixed size.
use ratatui::{
    Frame,
    layout::{Constraint, Layout, Rect},
    style::{Modifier, Style},
    text::Line,
    widgets::{Block, Borders, Cell, Paragraph, Row, Sparkline, Table, TableState},
};

use super::{
    app::{App, TopRow},
    groups::rows_noun,
    groups_view::{draw_group_detail, draw_group_table},
    keys::{draw_help, footer_line},
};
use crate::{
    model::{ByKey, Timing},
    render::render_histogram_width,
    units::{human_ns, human_rate},
};

pub fn draw(frame: &mut Frame, app: &App) {
    let area = frame.area();
    let detail = if app.detail && app.has_selection() {
        (area.height / 2).min(18)
    } else {
        0
    };
    let [header, table, pane, footer] = Layout::vertical([
        Constraint::Length(4),
        Constraint::Min(2),
        Constraint::Length(detail),
        Constraint::Length(1),
    ])
    .areas(area);
    frame.render_widget(Paragraph::new(header_lines(app)), header);
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
        draw_help(frame, table.union(pane), app);
    }
}

fn header_lines(app: &App) -> Vec<Line<'static>> {
    let paused = if app.paused { "  [PAUSED]" } else { "" };
    let first = format!(
        "pipelock top · kernel {} · mode {} · {:.0} s · every {:.1} s{paused}",
        app.kernel, app.mode, app.elapsed_s, app.interval_s
    );
    let per_run = app
        .bpf_ns_per_run
        .map_or_else(|| "n/a".to_owned(), |ns| human_ns(ns as u64));
    let drops = if app.drops.is_empty() {
        "none".to_owned()
    } else {
        app.drops
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let fill = app
        .fill
        .iter()
        .map(|m| match m.used {
            Some(used) => format!("{} {used}/{}", m.name.to_lowercase(), m.capacity),
            None => format!("{} ?/{}", m.name.to_lowercase(), m.capacity),
        })
        .collect::<Vec<_>>()
        .join(" ");
    let second = format!(
        "pipelock's BPF: {:.0} runs/s, {per_run}/run, {:.2} % of a CPU · dropped: {drops}",
        app.bpf_runs_per_s,
        app.bpf_cpu_share * 100.0
    );
    let memory: u64 = app.fill.iter().filter_map(|m| m.memlock_bytes).sum();
    let maps = format!(
        "maps: {fill} · kernel memory {:.1} MiB",
        memory as f64 / 1048576.0
    );
    let third = if app.samples == 0 {
        "waiting for the first interval…".to_owned()
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
    } else {
        app.notes.first().cloned().unwrap_or_default()
    };
    vec![
        Line::from(first),
        Line::from(second),
        Line::from(maps),
        Line::from(third),
    ]
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

/// The columns that fit `width`, most important first, shown in table order.
fn fitting_columns(width: u16) -> Vec<&'static Column> {
    let mut by_priority: Vec<&Column> = COLUMNS.iter().collect();
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
    let columns = fitting_columns(area.width);
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
    let widths = columns.iter().map(|c| {
        if c.header == "processes" {
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
            None => format!("{title}: n/a in this mode"),
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
mod tests {
    use crossterm::event::KeyCode;

    use super::*;
    use crate::tui::fixtures::{app_with, key, screen};

    #[test]
    fn empty_state_says_it_is_waiting() {
        let app = App::new("6.18.44".into(), "tracepoint (tp_btf)".into(), Vec::new(), 1.0);
        let text = screen(&app, 120, 20);
        assert!(text.contains("waiting for the first interval"), "{text}");
        assert!(text.contains("no traced lock was seen yet"), "{text}");
        assert!(text.contains("q quit"), "{text}");
    }

    #[test]
    fn many_rows_fill_the_table_largest_first() {
        let app = app_with(40);
        let text = screen(&app, 200, 30);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[4].contains("contended/s▼"), "{text}");
        assert!(lines[5].contains("pipe:[1040]"), "largest first: {text}");
        assert!(text.contains("pipelock's BPF: 500 runs/s, 50 ns/run"), "{text}");
        assert!(
            text.contains("lock_stats 40/4096 · kernel memory 5.0 MiB"),
            "{text}"
        );
        assert!(text.contains("dropped: stale_pending 3"), "{text}");
        assert!(
            text.contains("processes"),
            "wide terminal shows every column: {text}"
        );
    }

    #[test]
    fn selected_row_opens_its_histograms() {
        let mut app = app_with(5);
        app.on_key(key(KeyCode::Char('j')));
        app.on_key(key(KeyCode::Enter));
        let text = screen(&app, 160, 40);
        assert!(
            text.contains("pipe-mutex pipe:[1004]"),
            "second row selected: {text}"
        );
        assert!(text.contains("wait since start (2 samples)"), "{text}");
        assert!(text.contains("hold since start (2 samples)"), "{text}");
        assert!(text.contains("256 -> 511"), "log2 bucket lines: {text}");
        assert!(text.contains("contended per interval"), "{text}");
        assert!(
            text.contains("held by (owners: cpu 10% run 0% sleep 90%)"),
            "{text}"
        );
        assert!(text.contains("writer(4242) 1.00 us"), "{text}");
        assert!(
            text.contains("top call stack (2 contended, wait 1.00 us)"),
            "{text}"
        );
        assert!(text.contains("  vfs_write+0x2a4"), "{text}");
    }

    #[test]
    fn narrow_terminal_keeps_the_important_columns() {
        let mut app = app_with(5);
        app.on_key(key(KeyCode::Enter));
        for (w, h) in [(60, 12), (30, 6), (8, 3), (1, 1)] {
            let text = screen(&app, w, h);
            if w >= 60 {
                assert!(text.contains("lock"), "{w}x{h}: {text}");
                assert!(text.contains("contended/s"), "{w}x{h}: {text}");
                assert!(!text.contains("processes"), "{w}x{h}: {text}");
            }
        }
    }

    #[test]
    fn filter_shows_what_is_typed() {
        let mut app = app_with(4);
        app.on_key(key(KeyCode::Char('/')));
        for c in "rd-wait".chars() {
            app.on_key(key(KeyCode::Char(c)));
        }
        let text = screen(&app, 200, 20);
        assert!(text.contains("filter (class, lock, process): rd-wait"), "{text}");
        assert!(text.contains("filter \"rd-wait\": 2 of 4 locks"), "{text}");
        assert!(!text.contains("pipe-mutex"), "{text}");
    }
}
