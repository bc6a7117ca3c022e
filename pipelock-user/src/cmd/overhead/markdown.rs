//! `pipelock overhead`'s tables as markdown (docs/benchmarks.md).
use std::fmt::Write as _;

use super::{Results, Row};
use crate::model::ProgramStats;

fn percent(share: Option<f64>) -> String {
    share.map_or_else(|| "–".to_owned(), |s| format!("{:.2} %", s * 100.0))
}

/// The results as markdown: the ratio table, the per-program table, and
/// each cell against the floor of its hooks.
pub fn to_markdown(results: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Kernel {}, {} × {}, clock source {}, {} alternating pairs per cell.\n",
        results.kernel, results.cpus, results.cpu, results.clocksource, results.pairs
    );
    out.push_str(
        "| workload | tracer | traced/untraced (median) | min – max | BPF runs | ns per run | BPF time / workload CPU \
         | map memory | collector CPU (1 s refresh) |\n",
    );
    out.push_str("|---|---|---|---|---|---|---|---|---|\n");
    for row in &results.rows {
        let _ = writeln!(
            out,
            "| {} | {} | {:.3} | {:.3} – {:.3} | {} | {} | {} | {} | {} |",
            row.workload,
            row.tracer,
            row.ratio_median,
            row.ratio_min,
            row.ratio_max,
            row.bpf_runs.map_or_else(|| "–".to_owned(), |r| r.to_string()),
            row.bpf_ns_per_run
                .map_or_else(|| "–".to_owned(), |ns| format!("{ns:.0}")),
            percent(row.bpf_share_of_cpu),
            row.map_memory_bytes
                .map_or_else(|| "–".to_owned(), crate::units::human_mib),
            percent(row.collector_cpu_share),
        );
    }
    out.push_str("\nPer program (of each cell's traced run with run-time statistics on whose ns per run is the median, one per pair):\n\n");
    out.push_str(
        "| workload | mode | program | runs | ns per run | recursion misses |\n|---|---|---|---|---|---|\n",
    );
    for row in &results.rows {
        for p in row.programs.iter().filter(|p| p.run_count > 0) {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {:.0} | {} |",
                row.workload,
                row.tracer,
                p.name,
                p.run_count,
                p.ns_per_run(),
                p.recursion_misses
            );
        }
    }
    let checks: Vec<String> = results
        .rows
        .iter()
        .filter_map(|row| {
            let mut lines = Vec::new();
            let floor = results.rows.iter().find(|r| {
                r.workload == row.workload && r.tracer == format!("{}, empty programs", row.tracer)
            });
            if let Some(floor) = floor {
                // Per event where the floor has one program per event: an
                // average over every program would mix in tracepoint mode's
                // scheduler programs, which the empty run does not attach.
                let events = same_event(row, floor);
                let per_run = match (row.bpf_ns_per_run, floor.bpf_ns_per_run) {
                    (Some(ours), Some(empty)) if empty > 0.0 && events.is_empty() => format!(
                        "; per run {ours:.0} ns against {empty:.0} ns ({:.1}× the floor)",
                        ours / empty
                    ),
                    _ => String::new(),
                };
                lines.push(format!(
                    "- {} {}: empty programs on the same hooks alone give {:.3}; pipelock's programs {:.3}{per_run}",
                    row.workload, row.tracer, floor.ratio_median, row.ratio_median
                ));
                lines.extend(events);
            }
            lines.extend(with_callers(row, &results.rows));
            (!lines.is_empty()).then(|| lines.join("\n"))
        })
        .collect();
    if !checks.is_empty() {
        let _ = writeln!(out, "\n{}", checks.join("\n"));
    }
    for why in &results.skipped {
        let _ = writeln!(out, "\nNot measured here: {why}");
    }
    out
}

/// A `--callers` cell against the same mode without stacks: what turning
/// them on costs, per BPF run and in share of the workload's CPU.
fn with_callers(row: &Row, rows: &[Row]) -> Option<String> {
    let mode = row.tracer.strip_suffix(", --callers")?;
    let plain = rows
        .iter()
        .find(|r| r.workload == row.workload && r.tracer == mode)?;
    let (with, without) = (row.bpf_ns_per_run?, plain.bpf_ns_per_run?);
    let share = match (row.bpf_share_of_cpu, plain.bpf_share_of_cpu) {
        (Some(a), Some(b)) => format!(
            "; BPF time {} of the workload's CPU against {}",
            percent(Some(a)),
            percent(Some(b))
        ),
        _ => String::new(),
    };
    (without > 0.0).then(|| {
        format!(
            "- {} {mode}: with `--callers` {with:.0} ns per BPF run against {without:.0} ns without ({:.2}×){share}",
            row.workload,
            with / without
        )
    })
}

/// Tracepoint mode's programs against the empty ones on the same event.
fn same_event(row: &Row, floor: &Row) -> Vec<String> {
    use pipelock_common::programs::{
        EMPTY_CONTENTION_BEGIN, EMPTY_CONTENTION_END, PIPE_CONTENTION_BEGIN_BTF, PIPE_CONTENTION_END_BTF,
    };
    let per_run = |rows: &[ProgramStats], name: &str| {
        rows.iter()
            .find(|p| p.name == name && p.run_count > 0)
            .map(ProgramStats::ns_per_run)
    };
    [
        (
            "contention_begin",
            PIPE_CONTENTION_BEGIN_BTF,
            EMPTY_CONTENTION_BEGIN,
        ),
        ("contention_end", PIPE_CONTENTION_END_BTF, EMPTY_CONTENTION_END),
    ]
    .into_iter()
    .filter_map(|(event, ours, empty)| {
        let (ours, empty) = (per_run(&row.programs, ours)?, per_run(&floor.programs, empty)?);
        Some(format!(
            "- {} {}: `{event}` {ours:.0} ns per run against an empty program's {empty:.0} ns ({:.1}×)",
            row.workload,
            row.tracer,
            ours / empty
        ))
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(workload: &str, tracer: &str, ratio: f64, collector: f64) -> Row {
        Row {
            workload: workload.to_owned(),
            tracer: tracer.to_owned(),
            ratio_median: ratio,
            ratio_min: ratio,
            ratio_max: ratio,
            bpf_runs: Some(10),
            bpf_ns_per_run: Some(100.0),
            bpf_share_of_cpu: Some(0.2),
            map_memory_bytes: Some(1 << 20),
            collector_cpu_share: Some(collector),
            programs: Vec::new(),
        }
    }

    fn program(name: &str, runs: u64, ns: u64) -> ProgramStats {
        ProgramStats {
            name: name.to_owned(),
            run_count: runs,
            run_time_ns: runs * ns,
            recursion_misses: 0,
        }
    }

    fn results(emulated: bool) -> Results {
        let mut fentry = row("pipe-throughput", "fentry", 0.3, 0.05);
        fentry.bpf_ns_per_run = Some(350.0);
        let mut tracepoint = row("pipe-herd", "tracepoint", 0.97, 0.005);
        tracepoint.programs = vec![
            program("pipe_contention_begin_btf", 1000, 500),
            program("pipe_contention_end_btf", 1000, 250),
            program("holder_switch", 500, 80),
        ];
        let mut callers = row("pipe-herd", "tracepoint, --callers", 0.9, 0.006);
        callers.bpf_ns_per_run = Some(150.0);
        callers.bpf_share_of_cpu = Some(0.12);
        let mut tracepoint_floor = row("pipe-herd", "tracepoint, empty programs", 0.99, 0.004);
        tracepoint_floor.programs = vec![
            program("empty_contention_begin", 1200, 125),
            program("empty_contention_end", 1200, 100),
        ];
        Results {
            kernel: "6.12".to_owned(),
            cpu: "QEMU TCG CPU".to_owned(),
            cpus: 2,
            clocksource: "tsc".to_owned(),
            pairs: 5,
            rows: vec![
                fentry,
                row("pipe-throughput", "fentry, empty programs", 0.6, 0.02),
                tracepoint,
                tracepoint_floor,
                callers,
            ],
            emulated,
            skipped: vec!["kprobe: no kprobe PMU".to_owned()],
        }
    }

    #[test]
    fn markdown_states_each_cell_its_floor_and_what_was_not_measured() {
        let md = to_markdown(&results(false));
        assert!(md.contains("| pipe-throughput | fentry | 0.300 |"), "{md}");
        assert!(!md.contains("target") && !md.contains("met"), "no verdicts: {md}");
        assert!(
            md.contains(
                "empty programs on the same hooks alone give 0.600; pipelock's programs 0.300; \
                 per run 350 ns against 100 ns (3.5× the floor)"
            ),
            "{md}"
        );
        assert!(!md.contains("pipe-herd tracepoint: empty programs on the same hooks alone give 0.990; pipelock's programs 0.970; per run"), "{md}");
        assert!(
            md.contains("pipe-herd tracepoint: `contention_begin` 500 ns per run against an empty program's 125 ns (4.0×)"),
            "{md}"
        );
        assert!(
            md.contains("pipe-herd tracepoint: `contention_end` 250 ns per run against an empty program's 100 ns (2.5×)"),
            "{md}"
        );
        assert!(
            md.contains(
                "pipe-herd tracepoint: with `--callers` 150 ns per BPF run against 100 ns without (1.50×); \
                 BPF time 12.00 % of the workload's CPU against 20.00 %"
            ),
            "{md}"
        );
        assert!(
            md.contains("| 5.00 % |"),
            "the collector's share is in the table: {md}"
        );
        assert!(md.contains("Not measured here: kprobe: no kprobe PMU"), "{md}");
    }
}
