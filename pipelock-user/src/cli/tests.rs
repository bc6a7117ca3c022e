//! The command line against its definitions: every option parses, bad values are refused by name.
use super::*;
use clap::CommandFactory;

#[test]
fn cli_is_consistent() {
    Cli::command().debug_assert();
}

fn parse(line: &str) -> Cli {
    let args = std::iter::once("pipelock").chain(line.split_whitespace());
    Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{line}: {e}"))
}

/// Every option of every subcommand parses into its field (clap checks
/// a value's type only when it is read, so each one is read here).
#[test]
fn every_option_parses_into_its_value() {
    let Command::Trace(trace) = parse(
        "trace --mode tracepoint --duration 2 -p 1 -c cat --class pipe-mutex,pipe-wait --class other -n 5 \
         --sort hold-max --interval 0.5 --reset --hist --bpf-stats --csv a.csv --json a.json -- sleep 1",
    )
    .command
    else {
        panic!("not trace");
    };
    assert_eq!(trace.tracing.mode, Some(AttachMode::Tracepoint));
    let filters = trace.tracing.filters(true);
    assert_eq!((filters.pids, filters.comm.as_deref()), (vec![1], Some("cat")));
    assert!(!filters.follow_children, "-p names what is traced");
    assert_eq!(
        filters.classes,
        ClassSet::DEFAULT,
        "pipe-mutex + pipe-wait + other"
    );
    assert_eq!((trace.top, trace.sort), (5, SortKey::HoldMax));
    assert_eq!(trace.duration, Some(Duration::from_secs(2)));
    assert_eq!(trace.interval, Some(Duration::from_millis(500)));
    assert!(trace.reset && trace.hist && trace.bpf_stats);
    assert_eq!(trace.command, ["sleep", "1"]);
    let Command::Trace(auto) = parse("trace").command else {
        panic!("not trace");
    };
    assert_eq!((auto.tracing.mode, auto.sort), (None, SortKey::WaitTotal));
    assert!(
        auto.tracing.filters(false).classes.is_empty(),
        "no --class: the default set"
    );
    assert!(
        auto.tracing.filters(true).follow_children,
        "-- COMMAND: its process tree"
    );
    let Command::Trace(all) = parse("trace -a -- true").command else {
        panic!("not trace");
    };
    assert!(!all.tracing.filters(true).follow_children, "-a: system-wide");

    let Command::Top(top) =
        parse("top --mode kprobe --interval 0.5 --class lockref --workload pipe-herd").command
    else {
        panic!("not top");
    };
    assert_eq!(top.tracing.mode, Some(AttachMode::Kprobe));
    assert_eq!(top.workload, Some(WorkloadName::PipeHerd));
    assert_eq!(
        top.tracing.filters(true).classes,
        ClassSet::of(&[crate::model::LockClass::Lockref])
    );

    let Command::Overhead(overhead) = parse(
        "overhead --pairs 2 --seconds 0.5 --workload pipe-herd,lockref-stat --mode tracepoint,fentry \
         --markdown a.md --json a.json",
    )
    .command
    else {
        panic!("not overhead");
    };
    assert_eq!(overhead.modes, [AttachMode::Tracepoint, AttachMode::Fentry]);
    assert_eq!(
        overhead.workloads,
        [WorkloadName::PipeHerd, WorkloadName::LockrefStat]
    );
    let Command::Overhead(default) = parse("overhead").command else {
        panic!("not overhead");
    };
    assert_eq!(default.modes, AttachMode::ALL);

    let Command::Run(run) = parse(
        "run pipe-throughput --duration 1 --passes 3 --copies 2 --runs 2 --cpus 0-1,3 --json a --csv b \
         -q --no-counters --trace --trace-mode tracepoint",
    )
    .command
    else {
        panic!("not run");
    };
    let WorkloadCommand::PipeThroughput { common, trace, .. } = run.workload else {
        panic!("not pipe-throughput");
    };
    assert_eq!((common.runs, common.quiet, common.no_counters), (2, true, true));
    assert_eq!(common.cpus.map(|c| c.0), Some(vec![0, 1, 3]));
    assert!(trace.trace);
    assert_eq!(trace.trace_mode, Some(AttachMode::Tracepoint));

    let Command::Ab(ab) =
        parse("ab --kernel a --kernel b --runs 2 --accel tcg --memory 2G -- run pipe-herd").command
    else {
        panic!("not ab");
    };
    assert_eq!(
        (ab.accel, ab.runs, ab.memory),
        (Some(pipelock_vm::qemu::Accel::Tcg), 2, 2048)
    );
    let Command::Ab(auto) = parse("ab --kernel a --kernel b -- run pipe-herd").command else {
        panic!("not ab");
    };
    assert_eq!(auto.accel, None, "auto");

    for line in [
        "probe --self-test --duration 0.5 --ebpf-log",
        "probe --save-facts /tmp/x",
        "probe --kernel-facts /tmp/x",
        "top -- sleep 1",
        "run pipe-herd -k 3 --limit 10 --cpus 0",
        "run pipe-stream --bytes 1G --bufsize 4096 --source /etc/hostname --sink pipe",
        "run pipe-stream --duration 2",
        "run lockref-stat --threads 2 --duration 1 --path /tmp --op fstat --mode same",
        "run lockref-stat --procs 2 --mode separate --op open-close",
        "compare a.json b.json",
    ] {
        parse(line);
    }
}

/// `run`'s subcommands and the workload list name the same workloads.
#[test]
fn run_has_one_subcommand_per_workload() {
    let cli = Cli::command();
    let run = cli.find_subcommand("run").unwrap();
    let subcommands: Vec<&str> = run.get_subcommands().map(|c| c.get_name()).collect();
    let names: Vec<&str> = WorkloadName::ALL.iter().map(|w| w.name()).collect();
    assert_eq!(subcommands, names);
    for workload in WorkloadName::ALL {
        let value = clap::ValueEnum::to_possible_value(&workload).unwrap();
        assert_eq!(value.get_name(), workload.name(), "--workload's spelling");
    }
}

#[test]
fn bad_values_are_refused_by_name() {
    for (line, says) in [
        ("trace --mode fast", "fast"),
        ("trace --class mutexes", "mutexes"),
        ("trace --sort speed", "speed"),
        ("overhead --mode auto", "auto"),
        ("run pipe-herd --trace-mode fentry", "--trace"),
        ("trace --duration 0", "greater than 0"),
        ("trace -a -p 1", "cannot be used with"),
        ("trace -p x", "invalid digit"),
    ] {
        let args = std::iter::once("pipelock").chain(line.split_whitespace());
        let err = Cli::try_parse_from(args).expect_err(line).to_string();
        assert!(err.contains(says), "{line}: {err}");
    }
}
