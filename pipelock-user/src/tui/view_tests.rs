//! `top`'s screen, drawn into ratatui's test backend: columns, panes, help.
use crossterm::event::KeyCode;

use super::*;
use crate::{
    model::Refusal,
    tui::fixtures::{app_with, key, screen},
};

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
    assert_eq!(
        lines[0], "pipelock top · kernel 6.12.117 · mode fentry · 10 s, every 1.0 s",
        "{text}"
    );
    assert!(lines[4].contains("contended/s▼"), "{text}");
    assert!(lines[5].contains("pipe:[1040]"), "largest first: {text}");
    assert!(text.contains("pipelock's BPF: 500 runs/s, 50 ns/run"), "{text}");
    assert!(text.contains("maps 5.0 MiB · dropped: stale_pending 3"), "{text}");
    assert!(
        !text.contains("LOCK_STATS"),
        "the per-map list is behind m: {text}"
    );
    assert!(
        text.contains("processes"),
        "wide terminal shows every column: {text}"
    );
}

/// The tracepoint mode of this host: fentry refused, no kprobes.
fn tracepoint_app() -> App {
    let mut app = app_with(5);
    app.kernel = "6.12.57+deb13-cloud-amd64".into();
    app.mode = "tracepoint (tp_btf)".into();
    app.elapsed_s = 3600.0;
    app.paused = true;
    app.with_attach(
        false,
        vec![
            Refusal {
                mode: "fentry".into(),
                reason: "EPERM".into(),
                detail: "cannot load eBPF program pipe_read_exit: the BPF_PROG_LOAD syscall \
                         returned Operation not permitted (os error 1)"
                    .into(),
            },
            Refusal {
                mode: "kprobe".into(),
                reason: "no kprobes in this kernel".into(),
                detail: "no kprobe PMU (kernel built without CONFIG_KPROBES)".into(),
            },
        ],
    )
}

#[test]
fn the_first_three_lines_are_whole_at_100_columns() {
    let app = tracepoint_app();
    let text = screen(&app, 100, 24);
    let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    assert_eq!(
        lines[..3],
        [
            "pipelock top · kernel 6.12.57+deb13-cloud-amd64 · mode tracepoint (tp_btf) · 3600 s · PAUSED",
            header::measured(false),
            "refused here: fentry (EPERM), kprobe (no kprobes in this kernel); details: pipelock probe",
        ],
        "{text}"
    );
    assert!(
        lines[3].ends_with("· maps 5.0 MiB · dropped: stale_pending 3"),
        "the fourth line too is whole: {text}"
    );
    let mut crowded = tracepoint_app();
    crowded.drops = vec![("in_interrupt".into(), 5), ("stale_pending".into(), 7)];
    let text = screen(&crowded, 100, 24);
    assert!(
        text.lines()
            .nth(3)
            .unwrap()
            .trim_end()
            .ends_with("· dropped: 12 (m)"),
        "the fourth line too is whole: {text}"
    );
}

#[test]
fn tracepoint_mode_has_no_column_it_cannot_fill() {
    let text = screen(&tracepoint_app(), 200, 24);
    let header = text.lines().find(|l| l.contains("contended/s")).unwrap();
    for unmeasured in ["acquired/s", "hold avg", "hold p99", "hold max"] {
        assert!(!header.contains(unmeasured), "{header}");
    }
    assert!(!text.contains("n/a"), "{text}");
    assert!(
        text.contains("no hold times or acquisition counts"),
        "said once, above: {text}"
    );
}

#[test]
fn the_help_explains_every_column_and_fits_30_rows() {
    // "wait avg/p99/max" names "wait avg", "wait p99" and "wait max".
    let explained: Vec<String> = crate::tui::keys::COLUMNS
        .iter()
        .flat_map(|(name, _)| {
            if !name.contains(' ') {
                return vec![(*name).to_owned()];
            }
            let mut parts = name.split('/');
            let first = parts.next().unwrap_or_default();
            let stem = first.rsplit_once(' ').map_or("", |(stem, _)| stem);
            std::iter::once(first.to_owned())
                .chain(parts.map(move |p| format!("{stem} {p}").trim().to_owned()))
                .collect::<Vec<_>>()
        })
        .collect();
    for column in &COLUMNS {
        assert!(
            explained.iter().any(|e| e == column.header),
            "{} unexplained: {explained:?}",
            column.header
        );
    }
    let mut app = tracepoint_app();
    app.on_key(key(KeyCode::Char('?')));
    let text = screen(&app, 100, 30);
    assert!(
        text.contains("no acquired/s or hold columns)"),
        "the last line is shown: {text}"
    );
}

#[test]
fn m_shows_every_map_the_drops_and_the_whole_refusals() {
    let mut app = tracepoint_app();
    app.on_key(key(KeyCode::Char('m')));
    let text = screen(&app, 120, 30);
    assert!(text.contains("kernel side"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().take(4).eq(["│", "LOCK_STATS", "5", "4096"])),
        "{text}"
    );
    assert!(text.contains("dropped events: stale_pending 3"), "{text}");
    assert!(
        text.contains("fentry refused: cannot load eBPF program pipe_read_exit"),
        "{text}"
    );
    app.on_key(key(KeyCode::Esc));
    assert!(!screen(&app, 120, 30).contains("kernel side"), "Esc closes it");
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
    assert!(text.contains("256 -> 511"), "power-of-two bucket lines: {text}");
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
