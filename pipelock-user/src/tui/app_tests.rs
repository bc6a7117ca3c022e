//! `top`'s app state: keys, samples, sorting and filters.
use crossterm::event::KeyCode;

use super::*;
use crate::tui::fixtures::{app_with, key, report};

#[test]
fn a_sample_becomes_rates_per_second() {
    let app = app_with(3);
    let top = app.visible()[0];
    assert_eq!(top.lock_addr, 3, "sorted by contended/s, largest first");
    assert_eq!(top.contentions_per_s, 15.0, "30 contentions over a 2 s interval");
    assert_eq!(top.acquisitions_per_s, Some(150.0));
    assert_eq!(app.bpf_runs_per_s, 500.0);
    assert_eq!(app.bpf_ns_per_run, Some(50.0));
    assert_eq!(app.drops, vec![("stale_pending".to_owned(), 3)]);
    assert_eq!(app.history[&(3, 0)], VecDeque::from([30]));
}

#[test]
fn keys_move_sort_filter_and_quit() {
    let mut app = app_with(4);
    assert_eq!(app.on_key(key(KeyCode::Char('j'))), Action::None);
    assert_eq!(app.on_key(key(KeyCode::Down)), Action::None);
    assert_eq!(app.selected, 2);
    for _ in 0..10 {
        app.on_key(key(KeyCode::Char('j')));
    }
    assert_eq!(app.selected, 3, "stops at the last row");
    app.on_key(key(KeyCode::Char('k')));
    assert_eq!(app.selected, 2);
    app.on_key(key(KeyCode::Char('s')));
    assert_eq!(app.sort, SortColumn::AcquisitionsPerS);
    app.on_key(key(KeyCode::Char('t')));
    assert_eq!(app.sort, SortColumn::TotalWait);
    app.on_key(key(KeyCode::Enter));
    assert!(app.detail);
    assert_eq!(
        app.on_key(key(KeyCode::Esc)),
        Action::None,
        "Esc closes the pane first"
    );
    assert!(!app.detail);
    // Filter: typed keys go to the filter, not to the commands.
    app.on_key(key(KeyCode::Char('/')));
    for c in "mutex".chars() {
        app.on_key(key(KeyCode::Char(c)));
    }
    assert_eq!(app.input, Input::Filter);
    assert_eq!(app.sort, SortColumn::TotalWait, "'t' of 'mutex' did not re-sort");
    app.on_key(key(KeyCode::Enter));
    assert_eq!(app.input, Input::Normal);
    assert!(app.visible().iter().all(|r| r.class == "pipe-mutex"));
    assert_eq!(app.visible().len(), 2);
    app.on_key(key(KeyCode::Char('f')));
    app.on_key(key(KeyCode::Esc));
    assert_eq!(app.visible().len(), 4, "Esc clears the filter");
    app.on_key(key(KeyCode::Char('p')));
    assert!(app.paused);
    assert_eq!(app.on_key(key(KeyCode::Char('r'))), Action::Reset);
    assert!(app.rows.is_empty());
    assert_eq!(app.on_key(key(KeyCode::Char('q'))), Action::Quit);
    let ctrl_c = KeyEvent {
        modifiers: KeyModifiers::CONTROL,
        ..key(KeyCode::Char('c'))
    };
    assert_eq!(app.on_key(ctrl_c), Action::Quit);
    assert_eq!(app.on_key(key(KeyCode::Esc)), Action::Quit);
}

#[test]
fn paused_view_ignores_samples() {
    let mut app = app_with(2);
    app.on_key(key(KeyCode::Char('p')));
    let before = app.rows.clone();
    app.on_sample(Sample {
        snapshot: Snapshot {
            interval: report(Vec::new(), 1.0),
            total: report(Vec::new(), 11.0),
            fill: Vec::new(),
        },
        elapsed_s: 11.0,
    });
    assert_eq!(app.rows, before);
}

#[test]
fn f_asks_for_a_flame_graph_only_where_call_stacks_are_recorded() {
    let mut app = app_with(3);
    assert_eq!(app.on_key(key(KeyCode::Char('F'))), Action::None);
    assert!(
        app.status.as_deref().is_some_and(|s| s.contains("--callers")),
        "{:?}",
        app.status
    );
    app.on_key(key(KeyCode::Char('j')));
    assert_eq!(app.status, None, "the next key clears what F said");
    app.groupings.callers = true;
    assert_eq!(app.on_key(key(KeyCode::Char('F'))), Action::FlameGraph);
    assert!(app.total.is_some(), "the running totals F draws");
}
