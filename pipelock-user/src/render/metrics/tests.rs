//! The exposition, checked on reports of known content.
use super::*;
use crate::model::fixtures::{hist, sample};

fn exposed(report: TraceReport) -> Arc<Exposition> {
    Arc::new(Exposition {
        report,
        classes: ClassSet::DEFAULT,
        per_lock_top: 10,
        addresses: Addresses::hidden(),
        version: "0.1.0",
    })
}

/// A lock with no name is exported under an id, not its kernel address,
/// unless asked; the same lock keeps its id from scrape to scrape.
#[test]
fn kernel_addresses_leave_the_host_only_when_asked() {
    let mut report = sample();
    report.locks[0].name = "0xffff888122f3a6c0 in pipe:[4242] call".to_owned();
    let hidden = exposed(report.clone());
    let (one, two) = (openmetrics(hidden.clone()), openmetrics(hidden.clone()));
    assert!(
        !one.contains("0xffff") && !one.contains("ffff888122f3a6c0"),
        "{one}"
    );
    assert!(one.contains("lock=\"lock-"), "{one}");
    assert!(one.contains(" in pipe:[4242] call\""), "{one}");
    assert_eq!(one, two, "the id is stable");
    let open = openmetrics(Arc::new(Exposition {
        addresses: Addresses::Exposed,
        ..(*exposed(report)).clone()
    }));
    assert!(
        open.contains("lock=\"0xffff888122f3a6c0 in pipe:[4242] call\""),
        "{open}"
    );
    // Other keys, other ids; short hex numbers are no addresses.
    assert_ne!(
        Addresses::hidden().apply("0xffff888122f3a6c0"),
        Addresses::hidden().apply("0xffff888122f3a6c0")
    );
    assert_eq!(
        Addresses::hidden().apply("wait_lock+0x8 0x1f"),
        "wait_lock+0x8 0x1f"
    );
}

/// The sample's lock: waits of 100, 200 and 4000 ns.
#[test]
fn log_linear_buckets_become_cumulative_power_of_two_le_buckets_ending_in_inf() {
    let text = openmetrics(exposed(sample()));
    assert!(text.ends_with("# EOF\n"), "{text}");
    let bucket = |le: &str| {
        let prefix = format!("pipelock_lock_wait_seconds_bucket{{le=\"{le}\",class=\"pipe_mutex\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!("no bucket le={le}: {text}"))
            .to_owned()
    };
    // 100 ns and 200 ns: below 128 ns, below 256 ns; 4000 ns below 4096.
    assert_eq!(bucket("1.28e-7"), "1");
    assert_eq!(bucket("2.56e-7"), "2");
    assert_eq!(bucket("0.000002048"), "2");
    assert_eq!(bucket("0.000004096"), "3");
    assert_eq!(bucket("+Inf"), "3");
    assert!(
        text.contains("pipelock_lock_wait_seconds_count{class=\"pipe_mutex\"} 3\n"),
        "{text}"
    );
    assert!(
        text.contains("pipelock_lock_wait_seconds_sum{class=\"pipe_mutex\"} 0.0000043\n"),
        "{text}"
    );
    assert!(
        text.contains("pipelock_lock_contentions_total{class=\"pipe_mutex\"} 3"),
        "{text}"
    );
    // Every traced class has its series from the start, at 0.
    assert!(
        text.contains("pipelock_lock_contentions_total{class=\"other_in_pipe_call\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("pipelock_top_lock_contentions_total{class=\"pipe_mutex\",lock=\"pipe:[4242]\"} 3")
    );
    assert!(!text.contains("lock_hold"), "no hold in tracepoint mode: {text}");
    assert!(
        text.contains("pipelock_info{kernel=\"6.18.44\",mode=\"tracepoint (tp_btf)\",version=\"0.1.0\"} 1")
    );
    assert!(text.contains("pipelock_dropped_events_total{reason=\"stale_pending\"} 0"));
}

#[test]
fn only_the_busiest_locks_get_their_own_series() {
    let mut report = sample();
    let row = report.locks[0].clone();
    report.locks = (0..30u64)
        .map(|i| LockRow {
            lock_addr: i,
            name: format!("pipe:[{i}]"),
            wait: Timing::from_hist(&hist(&[i * 1000 + 1])),
            ..row.clone()
        })
        .collect();
    let text = openmetrics(Arc::new(Exposition {
        per_lock_top: 3,
        ..(*exposed(report)).clone()
    }));
    let locks: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("pipelock_top_lock_contentions_total"))
        .collect();
    assert_eq!(locks.len(), 3, "{locks:?}");
    assert!(
        locks[0].contains("pipe:[29]") && locks[2].contains("pipe:[27]"),
        "{locks:?}"
    );
}

/// The Grafana dashboard in deploy/ asks only for series the exporter
/// writes (every metric, in a hooked-mode report that has all of them).
#[test]
fn the_dashboard_queries_only_exported_series() {
    let dashboard = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/grafana-dashboard.json"
    ));
    let json: serde_json::Value = serde_json::from_str(dashboard).unwrap();
    let mut report = sample();
    let row = &mut report.locks[0];
    row.acquisitions = Some(10);
    row.hold = Timing::from_hist(&hist(&[50, 60]));
    row.holder = crate::model::HolderState {
        holder_on_cpu_ns: Some(1),
        holder_runnable_ns: Some(2),
        holder_sleeping_ns: Some(3),
    };
    report.maps = vec![crate::model::MapFill {
        name: "LOCK_STATS_A".into(),
        used: Some(1),
        capacity: 16,
        memlock_bytes: Some(4096),
    }];
    report.programs = vec![crate::model::ProgramStats {
        name: "mutex_lock_entry".into(),
        run_count: 5,
        run_time_ns: 500,
        recursion_misses: 0,
    }];
    report.tracer_cpu_s = Some(0.5);
    let text = openmetrics(exposed(report));
    let exported: std::collections::HashSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let mut asked = Vec::new();
    for panel in json["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let mut rest = expr;
            while let Some(at) = rest.find("pipelock_") {
                let name: String = rest[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                rest = &rest[at + name.len()..];
                assert!(
                    exported.contains(name.as_str()),
                    "{}: {name} is not exported",
                    panel["title"]
                );
                asked.push(name);
            }
        }
    }
    assert!(asked.len() >= 10, "{asked:?}");
}

#[test]
fn prometheus_text_declares_counters_by_their_sample_name() {
    let om = "# HELP pipelock_lock_contentions Contended.\n# TYPE pipelock_lock_contentions counter\n\
              pipelock_lock_contentions_total{class=\"pipe_mutex\"} 3\n\
              # HELP pipelock_map_memory_bytes Memory.\n# TYPE pipelock_map_memory_bytes gauge\n\
              # UNIT pipelock_map_memory_bytes bytes\npipelock_map_memory_bytes{map=\"A\"} 5\n# EOF\n";
    assert_eq!(
        prometheus_text(om),
        "# HELP pipelock_lock_contentions_total Contended.\n# TYPE pipelock_lock_contentions_total counter\n\
         pipelock_lock_contentions_total{class=\"pipe_mutex\"} 3\n\
         # HELP pipelock_map_memory_bytes Memory.\n# TYPE pipelock_map_memory_bytes gauge\n\
         pipelock_map_memory_bytes{map=\"A\"} 5\n"
    );
}

/// Each program's skipped runs are their own series, so a user can see
/// which hook loses events (and the drop table's sum stays as it was).
#[test]
fn each_programs_recursion_misses_are_exported() {
    let mut report = sample();
    report.programs = ["mutex_lock_entry", "pipe_read_entry"]
        .iter()
        .zip([7u64, 0])
        .map(|(name, misses)| crate::model::ProgramStats {
            name: (*name).into(),
            run_count: 10,
            run_time_ns: 100,
            recursion_misses: misses,
        })
        .collect();
    let text = openmetrics(exposed(report));
    assert!(
        text.contains("pipelock_bpf_recursion_misses_total{program=\"mutex_lock_entry\"} 7")
            && text.contains("pipelock_bpf_recursion_misses_total{program=\"pipe_read_entry\"} 0"),
        "{text}"
    );
}
