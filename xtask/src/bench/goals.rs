//! The project's goals for its own cost, judged on `pipelock overhead
//! --json`'s rows (the shipped command reports figures, not verdicts), and
//! the `--callers` before/after table.

/// The goals on real hardware.
const TRACEPOINT_RATIO_GOAL: f64 = 0.97;
const BEGIN_NS_GOAL: f64 = 400.0;
/// `--callers` against the same build without: `contention_begin` at most
/// this many times its ns per run, and BPF time at most this share of the
/// workload's CPU.
const CALLERS_BEGIN_RATIO_GOAL: f64 = 2.0;
const CALLERS_BPF_SHARE_GOAL: f64 = 0.15;

/// A row's ns per run of the program whose name starts with `prefix`.
fn ns_per_run(row: &serde_json::Value, prefix: &str) -> Option<f64> {
    let program = row["programs"].as_array()?.iter().find(|p| {
        p["name"].as_str().is_some_and(|n| n.starts_with(prefix)) && p["run_count"].as_u64() > Some(0)
    })?;
    Some(program["run_time_ns"].as_f64()? / program["run_count"].as_f64()?)
}

/// The `--callers` goals, judged on the herd's tracepoint rows with and
/// without call stacks (the same build, one run).
fn callers_goals(rows: &[serde_json::Value]) -> Vec<String> {
    let verdict = |met: bool| if met { "met" } else { "**missed**" };
    let row = |tracer: &str| {
        rows.iter()
            .find(|r| r["workload"] == "pipe-herd" && r["tracer"] == tracer)
    };
    let (Some(plain), Some(callers)) = (row("tracepoint"), row("tracepoint, --callers")) else {
        return Vec::new();
    };
    let mut lines = Vec::new();
    let both = |row: &serde_json::Value| {
        Some(ns_per_run(row, "pipe_contention_begin")? + ns_per_run(row, "pipe_contention_end")?)
    };
    if let (Some(with), Some(without)) = (
        ns_per_run(callers, "pipe_contention_begin"),
        ns_per_run(plain, "pipe_contention_begin"),
    ) {
        let ratio = with / without;
        lines.push(format!(
            "pipe-herd tracepoint --callers: `contention_begin` {with:.0} ns a run against {without:.0} without ({ratio:.2}×, goal ≤ {CALLERS_BEGIN_RATIO_GOAL}×): {}",
            verdict(ratio <= CALLERS_BEGIN_RATIO_GOAL)
        ));
    }
    if let (Some(with), Some(without)) = (both(callers), both(plain)) {
        // Stacks are unwound at the end: the pair is the honest cost.
        lines.push(format!(
            "pipe-herd tracepoint --callers: `contention_begin` + `contention_end` {with:.0} ns against {without:.0} without ({:.2}×)",
            with / without
        ));
    }
    if let Some(share) = callers["bpf_share_of_cpu"].as_f64() {
        lines.push(format!(
            "pipe-herd tracepoint --callers: BPF time {:.1} % of the workload's CPU (goal ≤ {:.0} %): {}",
            share * 100.0,
            CALLERS_BPF_SHARE_GOAL * 100.0,
            verdict(share <= CALLERS_BPF_SHARE_GOAL)
        ));
    }
    lines
}
const COLLECTOR_GOAL: f64 = 0.01;

/// One line per goal this host's results say something about.
pub(super) fn host_goals(results: &serde_json::Value) -> Vec<String> {
    if results["emulated"].as_bool() == Some(true) {
        return vec!["not judged: an emulated CPU".to_owned()];
    }
    let verdict = |met: bool| if met { "met" } else { "**missed**" };
    let mut lines = Vec::new();
    let rows = results["rows"].as_array().map_or(&[][..], Vec::as_slice);
    for row in rows {
        let (workload, tracer) = (
            row["workload"].as_str().unwrap_or(""),
            row["tracer"].as_str().unwrap_or(""),
        );
        if tracer != "tracepoint" {
            continue;
        }
        if let Some(ratio) = row["ratio_median"].as_f64()
            && matches!(workload, "pipe-throughput" | "pipe-herd")
        {
            lines.push(format!(
                "{workload} tracepoint traced/untraced {ratio:.3} (goal ≥ {TRACEPOINT_RATIO_GOAL}): {}",
                verdict(ratio >= TRACEPOINT_RATIO_GOAL)
            ));
        }
        let begin = row["programs"].as_array().into_iter().flatten().find(|p| {
            p["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("pipe_contention_begin"))
                && p["run_count"].as_u64() > Some(0)
        });
        if let Some(begin) = begin
            && workload == "pipe-herd"
        {
            let ns =
                begin["run_time_ns"].as_f64().unwrap_or(0.0) / begin["run_count"].as_f64().unwrap_or(1.0);
            lines.push(format!(
                "{workload} tracepoint `contention_begin` {ns:.0} ns a run (goal ≤ {BEGIN_NS_GOAL:.0}): {}",
                verdict(ns <= BEGIN_NS_GOAL)
            ));
        }
        if let Some(share) = row["collector_cpu_share"].as_f64() {
            lines.push(format!(
                "{workload} tracepoint collector {:.2} % of one CPU (goal ≤ {:.0} %): {}",
                share * 100.0,
                COLLECTOR_GOAL * 100.0,
                verdict(share <= COLLECTOR_GOAL)
            ));
        }
    }
    lines.extend(callers_goals(rows));
    lines
}

/// The herd's `--callers` row of the build that unwound every stack at
/// `contention_begin`, as this bench measured it on this host (docs/ before
/// sampling): the baseline the sampled stacks are judged against.
const CALLERS_BEFORE: (f64, f64, f64, f64) = (1882.0, 148.0, 0.4337, 2.097);

/// `--callers` before and after stacks were sampled, as a markdown table;
/// empty where this run has no `--callers` row.
pub(super) fn callers_before_after(rows: &[serde_json::Value]) -> String {
    let Some(now) = rows
        .iter()
        .find(|r| r["workload"] == "pipe-herd" && r["tracer"] == "tracepoint, --callers")
    else {
        return String::new();
    };
    let ns = |prefix: &str| ns_per_run(now, prefix).map_or_else(|| "–".to_owned(), |v| format!("{v:.0}"));
    let (begin, end, share, ratio) = CALLERS_BEFORE;
    format!(
        "\n### `--callers` before and after sampling\n\nThe herd in tracepoint mode with `--callers`: \
         the build that unwound a stack at every `contention_begin` (measured by this bench on this host \
         before stacks were sampled) against this run.\n\n\
         | build | `contention_begin` ns per run | `contention_end` ns per run | BPF time / workload CPU | traced/untraced |\n\
         |---|---|---|---|---|\n\
         | every stack unwound at `contention_begin` | {begin:.0} | {end:.0} | {:.2} % | {ratio:.3} |\n\
         | sampled, unwound at `contention_end` (this run) | {} | {} | {} | {} |\n",
        share * 100.0,
        ns("pipe_contention_begin"),
        ns("pipe_contention_end"),
        now["bpf_share_of_cpu"]
            .as_f64()
            .map_or_else(|| "–".to_owned(), |s| format!("{:.2} %", s * 100.0)),
        now["ratio_median"]
            .as_f64()
            .map_or_else(|| "–".to_owned(), |r| format!("{r:.3}")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goals_are_judged_on_the_hosts_rows() {
        let results = serde_json::json!({
            "emulated": false,
            "rows": [
                {"workload": "pipe-herd", "tracer": "tracepoint", "ratio_median": 0.95, "collector_cpu_share": 0.002,
                 "programs": [{"name": "pipe_contention_begin_btf", "run_count": 10, "run_time_ns": 2170}]},
                {"workload": "pipe-herd", "tracer": "tracepoint, empty programs", "ratio_median": 1.0},
                {"workload": "pipe-throughput", "tracer": "fentry", "ratio_median": 0.4},
                {"workload": "pipe-herd", "tracer": "tracepoint, --callers", "bpf_share_of_cpu": 0.16,
                 "programs": [{"name": "pipe_contention_begin_btf", "run_count": 10, "run_time_ns": 3000},
                              {"name": "pipe_contention_end_btf", "run_count": 10, "run_time_ns": 3000}]},
            ]
        });
        let goals = host_goals(&results);
        assert_eq!(
            goals,
            [
                "pipe-herd tracepoint traced/untraced 0.950 (goal ≥ 0.97): **missed**",
                "pipe-herd tracepoint `contention_begin` 217 ns a run (goal ≤ 400): met",
                "pipe-herd tracepoint collector 0.20 % of one CPU (goal ≤ 1 %): met",
                "pipe-herd tracepoint --callers: `contention_begin` 300 ns a run against 217 without (1.38×, goal ≤ 2×): met",
                "pipe-herd tracepoint --callers: BPF time 16.0 % of the workload's CPU (goal ≤ 15 %): **missed**",
            ]
        );
        assert_eq!(
            host_goals(&serde_json::json!({"emulated": true})),
            ["not judged: an emulated CPU"]
        );
        let table = callers_before_after(results["rows"].as_array().unwrap());
        assert!(
            table.contains("| every stack unwound at `contention_begin` | 1882 | 148 | 43.37 % | 2.097 |"),
            "{table}"
        );
        assert!(
            table.contains("| sampled, unwound at `contention_end` (this run) | 300 | 300 | 16.00 % | – |"),
            "{table}"
        );
        assert!(callers_before_after(&[]).is_empty());
    }
}
