//! `pipelock report --html`: one self-contained page (inline SVG and CSS,
//! no script, nothing fetched) for a trace, a run or an `ab` result. Each
//! figure's cell carries its exact value in `data-value`, so what the page
//! says can be checked against the JSON it was drawn from.
use std::fmt::Write as _;

use pipelock_common::{Histogram, loglinear};
use plotters::prelude::*;

use crate::{
    model::{LockRow, PERCENTILE_RESOLUTION, Timing, TraceReport, class_label, timing::error_label},
    units::human_ns,
};

/// What a page shows.
pub enum Page<'a> {
    /// A trace (or a run's trace): its busiest locks.
    Trace {
        report: &'a TraceReport,
        /// The run's workload and its headline figure, for a `run` result
        /// (`pipe-herd`, `wall time 0.514 s`).
        workload: Option<(String, String)>,
    },
    /// Two kernels: their distributions overlaid, and the comparison.
    Ab(&'a AbPage),
}

/// An `ab` result as the page draws it.
pub struct AbPage {
    pub command: String,
    pub kernels: [AbKernel; 2],
    pub rows: Vec<AbRow>,
}

/// One kernel's runs, merged per lock class.
pub struct AbKernel {
    pub release: String,
    pub runs: usize,
    pub classes: ClassHistograms,
}

/// Per lock class: every run's waits, and holds, in one histogram each.
pub type ClassHistograms = Vec<(String, Histogram<u64>, Histogram<u64>)>;

/// A row of `ab`'s table.
pub struct AbRow {
    pub metric: String,
    pub a: f64,
    pub b: f64,
    pub change_percent: f64,
    /// The 95 % interval of the change, in %.
    pub ci_percent: Option<(f64, f64)>,
    pub significant: bool,
}

/// Kernel A's colour, and B's, in the charts and the tables.
const COLOURS: [RGBColor; 2] = [RGBColor(31, 119, 180), RGBColor(255, 127, 14)];
const CHART: (u32, u32) = (720, 260);

const STYLE: &str = "body{font-family:sans-serif;margin:24px;color:#222;max-width:1100px}\
h1{font-size:22px}h2{font-size:17px;margin-top:32px;border-bottom:1px solid #ccc}\
table{border-collapse:collapse;margin:8px 0}td,th{padding:3px 10px;text-align:right;border-bottom:1px solid #eee}\
th:first-child,td:first-child{text-align:left}.note{color:#555;font-size:13px}\
.split{display:flex;width:600px;height:18px;margin:6px 0}.split div{height:100%}\
.on-cpu{background:#2ca02c}.runnable{background:#d62728}.sleeping{background:#9467bd}\
.key span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}\
.changed{font-weight:bold}";

/// The page, as HTML.
pub fn render_html(page: &Page, top: usize) -> String {
    let mut body = String::new();
    let title = match page {
        Page::Trace { report, workload } => {
            trace_body(
                &mut body,
                report,
                workload.as_ref().map(|(_, figure)| figure.as_str()),
                top,
            );
            let what = workload.as_ref().map_or("trace", |(name, _)| name.as_str());
            format!("pipelock: {what} on {}", report.kernel)
        }
        Page::Ab(ab) => {
            ab_body(&mut body, ab);
            format!(
                "pipelock ab: {} vs {}",
                ab.kernels[0].release, ab.kernels[1].release
            )
        }
    };
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\
         <style>{STYLE}</style></head>\n<body>\n<h1>{}</h1>\n{body}</body></html>\n",
        escape(&title),
        escape(&title)
    )
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn trace_body(out: &mut String, report: &TraceReport, workload: Option<&str>, top: usize) {
    let _ = writeln!(
        out,
        "<p>kernel {}, mode {}, {:.1} s{}.<br><span class=\"note\">{}; averages, maxima and totals \
         exact.</span></p>",
        escape(&report.kernel),
        escape(&report.mode),
        report.duration_s,
        workload.map_or(String::new(), |w| format!(", {}", escape(w))),
        escape(&report.percentile_resolution)
    );
    let shown: Vec<(usize, &LockRow)> = report
        .locks
        .iter()
        .enumerate()
        .filter(|(_, r)| r.wait.is_some() || r.hold.is_some())
        .take(top)
        .collect();
    if shown.is_empty() {
        out.push_str("<p>No lock was seen waiting or held.</p>\n");
    }
    for (index, row) in shown {
        lock_section(out, index, row);
    }
}

fn lock_section(out: &mut String, index: usize, row: &LockRow) {
    let _ = writeln!(
        out,
        "<section class=\"lock\" data-row=\"{index}\"><h2>{} {}</h2>",
        class_label(row.class),
        escape(&row.name)
    );
    let _ = writeln!(
        out,
        "<p>contended <span data-field=\"contentions\" data-value=\"{c}\">{c}</span>{}</p>",
        row.acquisitions.map_or(String::new(), |a| format!(
            ", acquired <span data-field=\"acquisitions\" data-value=\"{a}\">{a}</span>"
        )),
        c = row.contentions,
    );
    out.push_str(
        "<table><tr><th></th><th>count</th><th>avg</th><th>p50</th><th>p90</th><th>p99</th>\
                  <th>p99.9</th><th>max</th><th>percentiles</th></tr>\n",
    );
    for (kind, timing) in [("wait", &row.wait), ("hold", &row.hold)] {
        if let Some(t) = timing {
            timing_row(out, kind, t);
        }
    }
    out.push_str("</table>\n");
    let series: Vec<Series> = [("wait", &row.wait, 0), ("hold", &row.hold, 1)]
        .into_iter()
        .filter_map(|(kind, timing, colour)| {
            timing.as_ref().map(|t| Series {
                label: kind.to_owned(),
                colour: COLOURS[colour],
                hist: t.to_hist(),
            })
        })
        .collect();
    out.push_str(&chart(&series, "share of the waits and holds (%)"));
    holder_split(out, row);
    out.push_str("</section>\n");
}

fn timing_row(out: &mut String, kind: &str, t: &Timing) {
    let cell = |field: &str, ns: u64| {
        format!(
            "<td data-field=\"{kind}.{field}\" data-value=\"{ns}\">{}</td>",
            human_ns(ns)
        )
    };
    let _ = writeln!(
        out,
        "<tr><th>{kind}</th><td data-field=\"{kind}.count\" data-value=\"{n}\">{n}</td>{}{}{}{}{}{}<td>{}</td></tr>",
        cell("avg_ns", t.avg_ns),
        cell("p50_ns", t.p50_ns),
        cell("p90_ns", t.p90_ns),
        cell("p99_ns", t.p99_ns),
        cell("p999_ns", t.p999_ns),
        cell("max_ns", t.max_ns),
        escape(&error_label(t.percentile_error)),
        n = t.count,
    );
}

/// Who the waiters waited for, and what that owner was doing meanwhile.
fn holder_split(out: &mut String, row: &LockRow) {
    let parts = [
        ("on-cpu", "on CPU", row.holder.holder_on_cpu_ns),
        ("runnable", "runnable (preempted)", row.holder.holder_runnable_ns),
        ("sleeping", "sleeping", row.holder.holder_sleeping_ns),
    ];
    let total: u64 = parts.iter().filter_map(|p| p.2).sum();
    if total == 0 {
        return;
    }
    out.push_str("<p>While they waited, the lock's owner was:</p><div class=\"split\">");
    for (class, _, ns) in parts {
        let ns = ns.unwrap_or(0);
        let _ = write!(
            out,
            "<div class=\"{class}\" style=\"width:{:.2}%\" data-field=\"holder_{}_ns\" data-value=\"{ns}\"></div>",
            100.0 * ns as f64 / total as f64,
            class.replace('-', "_")
        );
    }
    out.push_str("</div><p class=\"key\">");
    for (class, label, ns) in parts {
        let _ = write!(
            out,
            "<span class=\"{class}\"></span>{label} {:.0} %",
            100.0 * ns.unwrap_or(0) as f64 / total as f64
        );
    }
    out.push_str("</p>\n");
}

fn ab_body(out: &mut String, ab: &AbPage) {
    let _ = writeln!(
        out,
        "<p><code>{}</code></p><p class=\"key\">{}</p><p class=\"note\">{}. Each run's percentiles \
         are compared across runs; <b>bold</b>: Welch's 95 % interval of the change excludes zero.</p>",
        escape(&ab.command),
        ab.kernels
            .iter()
            .zip(COLOURS)
            .zip(["A", "B"])
            .map(|((k, c), name)| format!(
                "<span style=\"background:rgb({},{},{})\"></span>{name}: {} ({} runs)",
                c.0,
                c.1,
                c.2,
                escape(&k.release),
                k.runs
            ))
            .collect::<Vec<_>>()
            .join(" "),
        PERCENTILE_RESOLUTION
    );
    let classes: Vec<&String> = ab.kernels[0]
        .classes
        .iter()
        .map(|(class, ..)| class)
        .filter(|c| ab.kernels[1].classes.iter().any(|(other, ..)| other == *c))
        .collect();
    for class in classes {
        let _ = writeln!(
            out,
            "<section class=\"class\" data-class=\"{class}\"><h2>{class}</h2>"
        );
        for (kind, pick) in [("wait", 0), ("hold", 1)] {
            let series: Vec<Series> = ab
                .kernels
                .iter()
                .zip(COLOURS)
                .zip(["A", "B"])
                .filter_map(|((kernel, colour), name)| {
                    let (_, wait, hold) = kernel.classes.iter().find(|(c, ..)| c == class)?;
                    let hist = if pick == 0 { wait } else { hold };
                    (hist.count > 0).then(|| Series {
                        label: format!("{name} {kind}"),
                        colour,
                        hist: *hist,
                    })
                })
                .collect();
            if series.len() == 2 {
                out.push_str(&chart(&series, &format!("share of the {kind}s (%)")));
            }
        }
        ab_table(
            out,
            ab.rows
                .iter()
                .filter(|r| r.metric.starts_with(&format!("{class} "))),
        );
        out.push_str("</section>\n");
    }
    out.push_str("<h2>every figure</h2>\n");
    ab_table(out, ab.rows.iter());
}

fn ab_table<'a>(out: &mut String, rows: impl Iterator<Item = &'a AbRow>) {
    out.push_str(
        "<table><tr><th>metric</th><th>A (mean)</th><th>B (mean)</th><th>change</th><th>95 % CI</th></tr>\n",
    );
    for row in rows {
        let _ = writeln!(
            out,
            "<tr class=\"{}\" data-metric=\"{}\"><td>{}</td><td data-field=\"a\" data-value=\"{}\">{}</td>\
             <td data-field=\"b\" data-value=\"{}\">{}</td><td>{:+.1} %</td><td>{}</td></tr>",
            if row.significant { "changed" } else { "" },
            escape(&row.metric),
            escape(&row.metric),
            row.a,
            figure(row.a),
            row.b,
            figure(row.b),
            row.change_percent,
            row.ci_percent.map_or("—".to_owned(), |(low, high)| format!(
                "{low:+.1} % … {high:+.1} %"
            ))
        );
    }
    out.push_str("</table>\n");
}

fn figure(x: f64) -> String {
    if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.2}")
    }
}

/// One histogram of a chart.
struct Series {
    label: String,
    colour: RGBColor,
    hist: Histogram<u64>,
}

/// The log-linear buckets of each series as bars over a log time axis,
/// each bar the share of its series' count (so two kernels with different
/// counts overlay), with each series' p50 and p99 as lines. The axis ends
/// past the largest p99.9: a few outliers at milliseconds would otherwise
/// squeeze the rest into a sliver (the maximum is in the table).
fn chart(series: &[Series], y_label: &str) -> String {
    if series.iter().all(|s| s.hist.max_ns == 0) {
        return "<p class=\"note\">all 0 ns: taken at once, uncontended</p>\n".to_owned();
    }
    let edge = series
        .iter()
        .filter_map(|s| loglinear::percentile(&s.hist.buckets, s.hist.max_ns, 0.999))
        .map(|p| {
            let at = loglinear::bucket(p.ns as u64);
            (loglinear::lower(at) + loglinear::width(at)) as f64
        })
        .fold(1.0, f64::max);
    let buckets = |h: &Histogram<u64>| -> Vec<(f64, f64, f64)> {
        h.buckets
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| {
                // A log axis has no 0: the 0 ns bucket is drawn at 0.5..1 ns.
                let low = (loglinear::lower(i) as f64).max(0.5);
                let high = ((loglinear::lower(i) + loglinear::width(i)) as f64).min(edge);
                (low, high, 100.0 * *n as f64 / h.count.max(1) as f64)
            })
            .filter(|(low, high, _)| low < high)
            .collect()
    };
    let bars: Vec<Vec<(f64, f64, f64)>> = series.iter().map(|s| buckets(&s.hist)).collect();
    let all = bars.iter().flatten();
    let x_low = all.clone().map(|b| b.0).fold(f64::INFINITY, f64::min);
    let x_high = edge;
    let y_high = all.map(|b| b.2).fold(0.0, f64::max) * 1.1;
    if !x_low.is_finite() || y_high <= 0.0 {
        return String::new();
    }
    let mut svg = String::new();
    let drawn = (|| -> Result<(), Box<dyn std::error::Error + '_>> {
        let root = SVGBackend::with_string(&mut svg, CHART).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(52)
            .build_cartesian_2d((x_low * 0.9..x_high).log_scale(), 0.0..y_high)?;
        chart
            .configure_mesh()
            .x_desc("duration")
            .y_desc(y_label)
            .x_label_formatter(&|ns| human_ns(*ns as u64))
            .draw()?;
        for (s, bars) in series.iter().zip(&bars) {
            let colour = s.colour;
            chart
                .draw_series(bars.iter().map(move |&(low, high, share)| {
                    Rectangle::new([(low, 0.0), (high, share)], colour.mix(0.55).filled())
                }))?
                .label(&s.label)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
            for q in [0.5, 0.99] {
                if let Some(p) = loglinear::percentile(&s.hist.buckets, s.hist.max_ns, q) {
                    let at = p.ns.clamp(0.5, x_high);
                    chart.draw_series(std::iter::once(PathElement::new(
                        vec![(at, 0.0), (at, y_high)],
                        colour.stroke_width(2),
                    )))?;
                }
            }
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    })();
    if drawn.is_err() {
        return String::new();
    }
    format!(
        "<figure>{svg}<figcaption class=\"note\">lines: each series' p50 and p99; the axis ends past \
         the largest p99.9 (the maximum is in the table)</figcaption></figure>\n"
    )
}

#[cfg(test)]
#[path = "html_tests.rs"]
mod tests;
