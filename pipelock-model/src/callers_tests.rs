//! Tests of the callers and tasks model.
use pipelock_common::{LockKey, sampling};

use super::*;

fn frames(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn tracing_and_locking_frames_are_cut_from_the_top() {
    let stack = frames(&[
        "bpf_prog_6deef7357e7b4530_pipe_contention_begin_btf+0x1a4",
        "bpf_trace_run2+0x8c",
        "__bpf_trace_contention_begin+0x9",
        "__mutex_lock.constprop.0+0x4a2",
        "mutex_lock+0x3a",
        "anon_pipe_write+0x50",
        "vfs_write+0x2a4",
        "ksys_write+0x6d",
        "do_syscall_64+0x82",
    ]);
    assert_eq!(
        caller_frames(&stack, 2),
        ["anon_pipe_write+0x50", "vfs_write+0x2a4"]
    );
    assert_eq!(caller_frames(&stack, 8).len(), 4);
    // A stack of machinery only is shown as it is.
    assert_eq!(caller_frames(&stack[..3], 8).len(), 3);
}

#[test]
fn globs_match_a_frame_or_its_function() {
    let glob = |g: &str| glob::Pattern::new(g).unwrap();
    assert!(frame_matches(&glob("anon_pipe_write"), "anon_pipe_write+0x50"));
    assert!(frame_matches(&glob("*pipe_write*"), "anon_pipe_write+0x50"));
    assert!(frame_matches(
        &glob("anon_pipe_write+0x5?"),
        "anon_pipe_write+0x50"
    ));
    assert!(!frame_matches(&glob("pipe_write"), "anon_pipe_write+0x50"));
}

fn part(lock: u64, kind: u32, id: u32, contentions: u64, wait_ns: u64) -> (DetailKey, DetailStats) {
    (
        DetailKey {
            lock: LockKey { lock, owner: 1 },
            kind,
            id,
        },
        DetailStats {
            acquisitions: contentions * 2,
            contentions,
            wait_ns,
            wait_max_ns: wait_ns,
            hold_ns: 5,
            ..DetailStats::default()
        },
    )
}

#[test]
fn stacks_that_differ_below_the_depth_merge_and_lost_ones_are_said() {
    let parts = [
        part(1, detail::CALLER, 7, 2, 100),
        part(1, detail::CALLER, 8, 3, 300),
        part(1, detail::CALLER, NO_STACK, 1, 10),
        part(1, detail::OWNER, 9, 50, 5000),
    ];
    let stack_of = |id: u32| match id {
        7 => Some(frames(&[
            "mutex_lock+0x3a",
            "anon_pipe_write+0x50",
            "vfs_write+0x1",
        ])),
        8 => Some(frames(&[
            "mutex_lock+0x3a",
            "anon_pipe_write+0x50",
            "vfs_writev+0x9",
        ])),
        _ => None,
    };
    let rows = callers_of(
        Some(LockClass::PipeMutex),
        parts.iter().map(|(k, v)| (k, v)),
        &stack_of,
        1,
        true,
        32,
        &LockTotals::default(),
    );
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0].stack, ["anon_pipe_write+0x50"]);
    assert_eq!(
        (rows[0].contentions, rows[0].acquisitions, rows[0].wait_total_ns),
        (5, Some(10), 400)
    );
    assert_eq!(rows[1].stack, ["(stack lost)"]);
    let deeper = callers_of(
        None,
        parts.iter().map(|(k, v)| (k, v)),
        &stack_of,
        2,
        false,
        32,
        &LockTotals::default(),
    );
    assert_eq!(deeper.len(), 3, "two stacks apart at depth 2: {deeper:?}");
    assert_eq!(
        deeper[0].acquisitions, None,
        "tracepoint mode counts no acquisitions"
    );
    let merged = merge_callers(rows.clone().into_iter().chain(rows));
    assert_eq!(merged[0].contentions, 10);
    assert!(
        merged.iter().all(|r| r.margin.is_none()),
        "no stack was sampled: exact"
    );
}

/// A small deterministic generator (xorshift64*), for simulated sampling.
struct Draws(u64);

impl Draws {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// The kernel's scheme, simulated: of 4 stacks with known waits, the
/// first `exact` events and every long wait are recorded as they are,
/// the rest one in `w` at random with weight w (left out otherwise). The
/// stated 95 % margins must cover the true totals about 95 % of the time,
/// also for a rare stack whose sampling-phase events are often all left
/// out (where the plug-in variance would call its row exact).
#[test]
fn sampled_estimates_are_covered_by_their_margins() {
    const STACKS: usize = 4;
    let (w, exact, events, trials) = (32u32, 1024u64, 60_000u64, 400);
    let mut draws = Draws(0x9e37_79b9_7f4a_7c15);
    let mut covered = [[0u32; 2]; STACKS];
    let mut truth = [[0u64; 2]; STACKS];
    let mut rare_unsampled = 0;
    for _ in 0..trials {
        let mut parts = [DetailStats::default(); STACKS];
        let mut totals = LockTotals::default();
        truth = [[0; 2]; STACKS];
        for n in 0..events {
            let r = draws.next();
            // Stacks in proportions 6:3:1, and one in 1 500 rare; waits
            // log-spread from 100 ns to ~50 µs (the longest ones never
            // sampled).
            let stack = match r % 10 {
                _ if (r >> 40).is_multiple_of(1500) => 3,
                0..=5 => 0,
                6..=8 => 1,
                _ => 2,
            };
            let wait = 100u64 << ((r >> 8) % 10);
            truth[stack][0] += 1;
            truth[stack][1] += wait;
            totals.contentions += 1;
            totals.wait_ns += wait;
            let weight = if n < exact || wait >= sampling::LONG_WAIT_NS {
                1
            } else if (r >> 32).is_multiple_of(u64::from(w)) {
                u64::from(w)
            } else {
                continue;
            };
            let part = &mut parts[stack];
            part.contentions += weight;
            part.wait_ns += weight * wait;
            if weight > 1 {
                part.sampled[sampling::RECORDS] += 1;
                part.sampled[sampling::CONTENDED] += 1;
                part.sampled[sampling::WAIT_SQUARES] += sampling::square(wait);
                part.sampled[sampling::WAIT_SUM] += wait;
            }
        }
        rare_unsampled += u32::from(parts[3].sampled[sampling::RECORDS] == 0);
        let remainder = Remainder::of(&totals, &parts, w, false);
        let (mut counted, mut waited) = (0, 0);
        for (stack, part) in parts.iter().enumerate() {
            let estimate = Estimate::of(part, w, &remainder);
            let margin = CallerMargin::of(part, w, false, &remainder).expect("events were left out");
            let [count, wait] = truth[stack];
            covered[stack][0] += u32::from(estimate.contentions.abs_diff(count) <= margin.contentions);
            covered[stack][1] += u32::from(estimate.wait_ns.abs_diff(wait) <= margin.wait_total_ns);
            counted += estimate.contentions;
            waited += estimate.wait_ns;
        }
        // The rows share out the lock's own figures (to rounding).
        assert!(
            counted.abs_diff(totals.contentions) <= STACKS as u64,
            "{counted} of {totals:?}"
        );
        assert!(
            waited.abs_diff(totals.wait_ns) <= STACKS as u64,
            "{waited} of {totals:?}"
        );
    }
    assert!(
        rare_unsampled > trials / 4,
        "the rare stack went unsampled in only {rare_unsampled} of {trials} trials"
    );
    for (stack, [count, wait]) in covered.iter().enumerate() {
        for (what, hits) in [("count", count), ("wait", wait)] {
            let rate = f64::from(*hits) / f64::from(trials);
            // A handful of sampled records gives a Poisson interval that
            // is conservative, not tight.
            let expected = if stack == 3 { 0.93..=1.0 } else { 0.91..=0.99 };
            assert!(
                expected.contains(&rate),
                "stack {stack} {what}: the 95 % margin covered the truth in {rate:.3} of trials (truth {:?})",
                truth[stack]
            );
        }
    }
}

/// Without anything sampled or left out, a row is exact; with events
/// left out but none of its own sampled, it still has a margin, no wider
/// than what was left out.
#[test]
fn a_row_with_no_sampled_record_is_exact_only_if_nothing_was_left_out() {
    let row = DetailStats {
        contentions: 273,
        wait_ns: 273_000,
        ..DetailStats::default()
    };
    // Another row whose 100 sampled records stand for 3 200 events.
    let other = DetailStats {
        contentions: 3_200,
        wait_ns: 3_200_000,
        sampled: [100, 100, sampling::square(1000) * 100, 0, 100_000, 0],
        ..DetailStats::default()
    };
    let totals = |contentions| LockTotals {
        contentions,
        wait_ns: contentions * 1000,
        ..LockTotals::default()
    };
    let nothing = Remainder::of(&totals(273), [&row], 32, false);
    assert_eq!(CallerMargin::of(&row, 32, false, &nothing), None);
    let many = Remainder::of(&totals(10_273), [&row, &other], 32, false);
    let margin = CallerMargin::of(&row, 32, false, &many).expect("events were left out");
    // 10 000 left to estimate, none of 100 records this row's: Wilson's
    // upper end, z² / (100 + z²) of them (z = 1.959964).
    let z2 = 1.959_964_f64.powi(2);
    let upper = 10_000.0 * z2 / (100.0 + z2);
    assert_eq!(margin.contentions, upper.round() as u64);
    assert_eq!(Estimate::of(&row, 32, &many).contentions, 273);
    assert_eq!(Estimate::of(&other, 32, &many).contentions, 10_000);
    // With no record sampled at all, what was left out bounds the margin.
    let few = Remainder::of(&totals(283), [&row], 32, false);
    assert_eq!(
        CallerMargin::of(&row, 32, false, &few).map(|m| m.contentions),
        Some(10)
    );
    assert_eq!(
        CallerMargin::of(&row, 1, false, &many),
        None,
        "every stack unwound"
    );
}

/// A lock contended once, whose one wait was sampled (after its CPU's
/// exact unwinds of that second) and so counts 32 times in its row: the
/// row must not claim more than the lock's one contention.
#[test]
fn a_caller_row_never_exceeds_its_locks_exact_count() {
    let sampled = DetailStats {
        contentions: 32,
        wait_ns: 32 * 1_500,
        wait_max_ns: 1_500,
        sampled: [1, 1, sampling::square(1_500), 0, 1_500, 0],
        ..DetailStats::default()
    };
    let key = DetailKey {
        lock: LockKey {
            lock: 0xff00,
            owner: 1,
        },
        kind: detail::CALLER,
        id: 7,
    };
    let stack_of = |_| Some(frames(&["mutex_lock+0x3a", "anon_pipe_read+0x332"]));
    let totals = LockTotals {
        contentions: 1,
        wait_ns: 1_500,
        ..LockTotals::default()
    };
    let rows = callers_of(None, [(&key, &sampled)], &stack_of, 1, false, 32, &totals);
    assert_eq!(
        (rows[0].contentions, rows[0].wait_total_ns),
        (1, 1_500),
        "{rows:?}"
    );
    let margin = rows[0].margin.expect("a sampled row is an estimate");
    assert!(margin.contentions <= 1, "{margin:?}");
    // Hooked modes: acquisitions and holds are shared out the same way.
    let hooked = DetailStats {
        acquisitions: 32 + 5,
        hold_ns: 32 * 400 + 5 * 100,
        sampled: [1, 1, sampling::square(1_500), sampling::square(400), 1_500, 400],
        ..sampled
    };
    let totals = LockTotals {
        acquisitions: 7,
        hold_ns: 500 + 2 * 450,
        ..totals
    };
    let rows = callers_of(None, [(&key, &hooked)], &stack_of, 1, true, 32, &totals);
    assert_eq!(rows[0].acquisitions, Some(7));
    assert_eq!(rows[0].hold_total_ns, Some(1_400));
}

#[test]
fn the_share_margin_is_wilsons() {
    // Wilson 95 % intervals: 0 of 10 → [0, 0.2775]; 5 of 10 → [0.2366,
    // 0.7634]; 10 of 10 → [0.7225, 1].
    for (n, of, half) in [(0, 10, 0.2775), (5, 10, 0.2634), (10, 10, 0.2775)] {
        let ours = share_margin(n, of);
        assert!((ours - half).abs() < 5e-4, "{n} of {of}: {ours} against {half}");
    }
    assert_eq!(share_margin(0, 0), 1.0, "no record: anything is possible");
    assert!((z95() - 1.959_964).abs() < 1e-6, "{}", z95());
}

#[test]
fn margins_of_merged_rows_add_in_quadrature() {
    let m = |c| CallerMargin {
        contentions: c,
        ..Default::default()
    };
    assert_eq!(CallerMargin::plus(Some(m(3)), Some(m(4))), Some(m(5)));
    assert_eq!(CallerMargin::plus(None, Some(m(4))), Some(m(4)));
    assert_eq!(CallerMargin::plus(None, None), None);
}

#[test]
fn tasks_are_grouped_by_class_and_thread() {
    let parts = [
        part(1, detail::TASK, 11, 2, 100),
        part(2, detail::TASK, 11, 3, 300),
        part(2, detail::CALLER, 11, 3, 300),
        part(1, detail::TASK, 12, 1, 1000),
    ];
    let names: TaskNames = [(11, (10, "writer".to_owned()))].into_iter().collect();
    let rows = tasks_of(
        parts.iter().map(|(k, v)| (Some(LockClass::PipeMutex), k, v)),
        &names,
        false,
    );
    assert_eq!(rows.len(), 2);
    assert_eq!((rows[0].tid, rows[0].wait_total_ns), (12, 1000));
    assert_eq!(rows[0].label(), "tid 12");
    assert_eq!(
        (rows[1].contentions, rows[1].label()),
        (5, "writer(10/11)".to_owned())
    );
}
