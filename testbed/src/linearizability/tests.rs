//! Hand-made histories: ones with no linearization must fail, ones with
//! one (operations of unknown outcome included) must pass.

use super::history::{Entry, Outcome, WordOp, WordRet};
use super::*;

const BUDGET: Duration = Duration::from_secs(60);

/// Process `p` on word `w`, from `at` to `to` (ns), returning `ret`.
fn ok(p: u64, w: u64, (at, to): (u64, u64), op: WordOp, ret: WordRet) -> Entry {
    Entry {
        client: format!("c{}", p % 3),
        process: p,
        word: w,
        op,
        invoked_ns: at,
        completed_ns: to,
        outcome: Outcome::Ok(ret),
    }
}

/// Process `p` on word `w`, invoked at `at`, given up on at `to`.
fn unknown(p: u64, w: u64, (at, to): (u64, u64), op: WordOp) -> Entry {
    Entry {
        outcome: Outcome::Unknown("timed out".to_owned()),
        ..ok(p, w, (at, to), op, WordRet::Write)
    }
}

fn read(p: u64, w: u64, span: (u64, u64), seen: u64) -> Entry {
    ok(p, w, span, WordOp::Read, WordRet::Read(seen))
}

fn write(p: u64, w: u64, span: (u64, u64), value: u64) -> Entry {
    ok(p, w, span, WordOp::Write(value), WordRet::Write)
}

fn verdict(entries: &[Entry]) -> LinearizabilityReport {
    check(entries, BUDGET).expect("a well-formed history")
}

#[test]
fn a_read_of_a_value_before_it_was_written_fails() {
    let report = verdict(&[read(1, 0, (0, 10), 5), write(2, 0, (20, 30), 5)]);
    assert!(!report.passed, "{report:?}");
    assert_eq!(report.failed_words, [0]);
    assert!(
        report.summary().starts_with("FAILED (2 ops on 1 words"),
        "{}",
        report.summary()
    );
    // Overlapping, the same two are fine.
    assert!(verdict(&[read(1, 0, (0, 25), 5), write(2, 0, (20, 30), 5)]).passed);
}

#[test]
fn new_then_old_fails() {
    let history = [
        write(1, 0, (0, 10), 1),
        write(1, 0, (20, 30), 2),
        read(2, 0, (40, 50), 2),
        read(3, 0, (60, 70), 1),
    ];
    assert!(!verdict(&history).passed);
    // Had the reads overlapped the second write, either order is fine.
    let overlapping = [
        write(1, 0, (0, 10), 1),
        write(1, 0, (20, 80), 2),
        read(2, 0, (40, 50), 2),
        read(3, 0, (60, 70), 1),
    ];
    assert!(!verdict(&overlapping).passed, "2 then 1 while 2 stays");
    let reads_swapped = [
        write(1, 0, (0, 10), 1),
        write(1, 0, (20, 80), 2),
        read(2, 0, (40, 50), 1),
        read(3, 0, (60, 70), 2),
    ];
    assert!(verdict(&reads_swapped).passed);
}

#[test]
fn a_lost_fetch_add_and_a_swap_that_did_not_stick_fail() {
    let lost = [
        ok(1, 0, (0, 10), WordOp::FetchAdd(1), WordRet::FetchAdd(0)),
        ok(2, 0, (20, 30), WordOp::FetchAdd(1), WordRet::FetchAdd(0)),
    ];
    assert!(!verdict(&lost).passed);
    let swap = WordOp::CompareSwap {
        expected: 0,
        new: 9,
    };
    let stuck = [
        ok(1, 0, (0, 10), swap, WordRet::CompareSwap(0)),
        read(2, 0, (20, 30), 9),
    ];
    assert!(verdict(&stuck).passed);
    let not_stuck = [
        ok(1, 0, (0, 10), swap, WordRet::CompareSwap(0)),
        read(2, 0, (20, 30), 0),
    ];
    assert!(!verdict(&not_stuck).passed);
}

#[test]
fn an_operation_of_unknown_outcome_may_apply_at_any_later_point_or_never() {
    // The store of 3 was given up on; it took effect after the store of 7
    // that began later.
    let late = [
        unknown(1, 0, (0, 10), WordOp::Write(3)),
        write(2, 0, (20, 30), 7),
        read(3, 0, (40, 50), 7),
        read(3, 0, (60, 70), 3),
    ];
    let report = verdict(&late);
    assert!(report.passed, "{report:?}");
    assert_eq!(report.unknown, 1);
    assert_eq!(
        report.summary(),
        "PASSED (4 ops on 1 words, 1 of unknown outcome)"
    );
    // Never: the add given up on shows nowhere; a read given up on neither.
    let never = [
        unknown(1, 0, (0, 10), WordOp::FetchAdd(100)),
        unknown(4, 0, (5, 15), WordOp::Read),
        ok(2, 0, (20, 30), WordOp::FetchAdd(1), WordRet::FetchAdd(0)),
        read(3, 0, (40, 50), 1),
    ];
    assert!(verdict(&never).passed);
    // The same history with the store of 3 acknowledged has no
    // linearization: it must precede the store of 7.
    let acked = [
        write(1, 0, (0, 10), 3),
        write(2, 0, (20, 30), 7),
        read(3, 0, (40, 50), 7),
        read(3, 0, (60, 70), 3),
    ];
    assert!(!verdict(&acked).passed);
    // But not before its invocation.
    let too_early = [
        read(3, 0, (0, 5), 3),
        unknown(1, 0, (10, 20), WordOp::Write(3)),
    ];
    assert!(!verdict(&too_early).passed);
}

#[test]
fn words_are_judged_alone_and_the_smallest_failing_one_is_printed() {
    let mut history = vec![
        write(1, 0, (0, 10), 1),
        read(2, 0, (20, 30), 1),
        // Word 1: five operations, the last one wrong.
        write(1, 1, (40, 50), 4),
        read(2, 1, (60, 70), 4),
        ok(3, 1, (80, 90), WordOp::FetchAdd(2), WordRet::FetchAdd(4)),
        read(2, 1, (100, 110), 6),
        read(3, 1, (120, 130), 4),
        // Word 2: two operations, wrong.
        read(4, 2, (0, 10), 8),
        write(5, 2, (20, 30), 8),
    ];
    let report = verdict(&history);
    assert_eq!(report.failed_words, [1, 2]);
    assert_eq!(report.words, 3);
    assert!(
        report.failure[0].starts_with("word 2: from the value 0, 1 operations"),
        "{:?}",
        report.failure
    );
    assert_eq!(report.failure.len(), 2, "{:?}", report.failure);
    assert!(
        report.failure[1].contains("read -> read 8"),
        "{:?}",
        report.failure
    );
    // Without word 2, word 1 is printed from the last point its value was
    // certain: 6, after the FETCH_ADD that found 4 and the read after it.
    history.truncate(7);
    let report = verdict(&history);
    assert_eq!(report.failed_words, [1]);
    assert!(
        report.failure[0].starts_with("word 1: from the value 6, 1 operations"),
        "{:?}",
        report.failure
    );
    assert_eq!(report.failure.len(), 2, "{:?}", report.failure);
    assert!(
        report.failure[1].contains("read -> read 4"),
        "{:?}",
        report.failure
    );
}

#[test]
fn a_process_with_overlapping_operations_is_refused() {
    let overlapping = [write(1, 0, (0, 10), 1), read(1, 1, (5, 20), 0)];
    let err = check(&overlapping, BUDGET).expect_err("overlap");
    assert!(
        err.to_string()
            .contains("process 1 of c1: an operation invoked at 5 ns overlaps"),
        "{err}"
    );
    let after_unknown = [
        unknown(1, 0, (0, 10), WordOp::Write(2)),
        read(1, 0, (20, 30), 2),
    ];
    let err = check(&after_unknown, BUDGET).expect_err("after unknown");
    assert!(
        err.to_string().contains("follows one of unknown outcome"),
        "{err}"
    );
    let backwards = [read(2, 0, (20, 10), 0)];
    assert!(check(&backwards, BUDGET).is_err());
}

#[test]
fn two_stores_nothing_read_may_have_ended_either_way() {
    // The tester leaves the first piece with one of the two values; the
    // read that follows may need the other.
    for seen in [1, 2] {
        let history = [
            write(1, 0, (0, 10), 1),
            write(2, 0, (0, 10), 2),
            read(3, 0, (20, 30), seen),
            read(3, 0, (40, 50), seen),
        ];
        assert!(verdict(&history).passed, "read {seen}");
    }
    let neither = [
        write(1, 0, (0, 10), 1),
        write(2, 0, (0, 10), 2),
        read(3, 0, (20, 30), 0),
    ];
    let report = verdict(&neither);
    assert!(!report.passed);
    assert!(
        report.failure[0].starts_with("word 0: from the value 0, 3 operations"),
        "{:?}",
        report.failure
    );
}

#[test]
fn a_run_sized_history_of_a_correct_register_passes() {
    // Twelve processes on two words, each busy a tenth of the time as the
    // workload's pauses make them: a register that applies every
    // operation at the middle of its span.
    let mut words = [Word(0), Word(0)];
    let mut rng = crate::workload::keys::Rng::new(3);
    let mut history = Vec::new();
    let mut spans: Vec<(u64, u64, u64, u64)> = Vec::new();
    for p in 0..12u64 {
        let mut at = rng.below(50);
        for _ in 0..150 {
            let len = 5 + rng.below(60);
            spans.push((at + len / 2, p, at, at + len));
            at += len + 1 + rng.below(600);
        }
    }
    spans.sort_unstable();
    for (_, p, at, to) in spans {
        let w = rng.below(2);
        let op = match rng.below(4) {
            0 => WordOp::Read,
            1 => WordOp::Write(rng.next_u64()),
            2 => WordOp::CompareSwap {
                expected: if rng.below(2) == 0 {
                    words[w as usize].0
                } else {
                    1
                },
                new: rng.next_u64(),
            },
            _ => WordOp::FetchAdd(rng.next_u64()),
        };
        let ret = stateright::semantics::SequentialSpec::invoke(&mut words[w as usize], &op);
        history.push(ok(p, w, (at, to), op, ret));
    }
    let report = verdict(&history);
    assert!(report.passed, "{:?}", report.failure);
    assert_eq!(report.ops, 1800);
}
