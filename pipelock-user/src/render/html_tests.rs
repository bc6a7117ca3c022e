//! The page, checked against the report it draws.
use super::*;
use crate::model::fixtures::{hist, sample};

/// Every `data-field`/`data-value` pair of the page's lock sections.
fn values(html: &str) -> Vec<(usize, String, u64)> {
    let mut out = Vec::new();
    for section in html.split("<section class=\"lock\" data-row=\"").skip(1) {
        let row: usize = section[..section.find('"').unwrap()].parse().unwrap();
        for cell in section.split("data-field=\"").skip(1) {
            let field = &cell[..cell.find('"').unwrap()];
            let value = cell.split("data-value=\"").nth(1).unwrap();
            out.push((
                row,
                field.to_owned(),
                value[..value.find('"').unwrap()].parse().unwrap(),
            ));
        }
    }
    out
}

#[test]
fn a_trace_page_shows_each_figure_as_the_report_has_it() {
    let report = sample();
    let html = render_html(
        &Page::Trace {
            report: &report,
            workload: None,
        },
        8,
    );
    let json = serde_json::to_value(&report).unwrap();
    let found = values(&html);
    assert!(found.len() >= 8, "{found:?}");
    for (row, field, value) in found {
        let lock = &json["locks"][row];
        let want = field
            .split('.')
            .fold(lock, |v, key| &v[key])
            .as_u64()
            .unwrap_or_else(|| panic!("{field} of row {row}: {lock}"));
        assert_eq!(value, want, "{field} of row {row}");
    }
    assert!(html.contains("<svg"), "a chart");
    // Nothing to fetch (the SVG's xmlns is a name, not a fetch).
    assert!(
        !html.contains("<script")
            && !html.contains("src=")
            && !html.contains("href=")
            && !html.contains("url("),
        "self-contained"
    );
}

#[test]
fn an_ab_page_overlays_both_kernels() {
    let kernel = |release: &str, ns: u64| AbKernel {
        release: release.to_owned(),
        runs: 3,
        classes: vec![(
            "pipe-mutex".to_owned(),
            hist(&[ns, ns * 2, ns * 3]),
            Histogram::EMPTY,
        )],
    };
    let ab = AbPage {
        command: "run pipe-herd --trace".to_owned(),
        kernels: [kernel("6.1", 1000), kernel("6.18", 1500)],
        rows: vec![AbRow {
            metric: "pipe-mutex wait p99 (ns)".to_owned(),
            a: 2976.0,
            b: 4480.0,
            change_percent: 50.5,
            ci_percent: Some((20.0, 80.0)),
            significant: true,
        }],
    };
    let html = render_html(&Page::Ab(&ab), 8);
    assert_eq!(html.matches("<svg").count(), 1, "the waits overlaid; no holds");
    assert!(html.contains("A wait") && html.contains("B wait"), "a legend");
    assert!(html.contains("data-metric=\"pipe-mutex wait p99 (ns)\""));
    assert!(html.contains("data-field=\"b\" data-value=\"4480\""));
    assert!(html.contains("class=\"changed\""));
}
