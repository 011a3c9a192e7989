//! Copies that answer STALE_MAP while the map's epoch moves, on device A
//! of the default topology with `replicas = 2` (PA.1: deciding copy on
//! server A, backup on B; PB.1: deciding copy on B): the copy is not lost,
//! its part goes again once its server runs the device's epoch, in order
//! with later requests of the same range, and a copy that keeps refusing
//! is lost.

use std::time::Duration;

use proto::request::{ExactlyOnce, Operation};

use super::replication::{Sent, answer, answered, index, replicated, send, send_read, split};
use super::takeover::{map_with_owner, server_runs};
use super::*;
use crate::forward::replication::STALE_RESENDS;

/// A core at map epoch `epoch`, which both servers confirmed.
fn at_epoch(epoch: u64) -> Forwarder {
    let mut core = replicated();
    core.set_epoch(epoch);
    let now = Instant::now();
    for server in ["A", "B"] {
        let l = link(&core, server, "n0");
        server_runs(&mut core, l, epoch, now);
    }
    assert!(split(core.take_outbox()).0.is_empty());
    core
}

fn write<'d>(
    region: &'static str,
    offset: u64,
    data: &'d [u8],
) -> impl FnOnce(&Forwarder) -> Repr<'d> + 'd {
    move |c| Repr::write(pmem(c, region, offset), key(c, region), data)
}

fn links_ab(core: &Forwarder) -> (LinkId, LinkId) {
    (link(core, "A", "n0"), link(core, "B", "n0"))
}

#[test]
fn a_copy_that_answers_stale_map_is_not_lost_its_part_goes_again_once_its_server_runs_the_epoch() {
    let mut core = at_epoch(4);
    let (a, b) = links_ab(&core);
    send(&mut core, write("PA.1", 4096, &[7; 300]), 9);
    let (sent, _, _) = split(core.take_outbox());
    assert_eq!(sent.iter().map(|s| s.link).collect::<Vec<_>>(), [a, b]);
    answer(&mut core, &sent[0], Status::Ok, 0);
    // B's server read epoch 5 (a mark bumped it) before the device did:
    // nothing ran there.
    answer(&mut core, &sent[1], Status::StaleMap, 5);
    let (again, answers, lost) = split(core.take_outbox());
    assert!(lost.is_empty(), "B's copy is not lost: {lost:?}");
    assert!(answers.is_empty(), "the write is not answered yet");
    assert!(again.is_empty(), "not before the device runs epoch 5");
    assert!(core.take_map_reread(), "the device reads the map now");

    // The device runs epoch 5 and says it on every link; B confirms.
    let said = core.set_epoch(5);
    assert!(said.iter().any(|(l, _)| *l == b));
    assert!(
        split(core.take_outbox()).0.is_empty(),
        "not before B confirms"
    );
    server_runs(&mut core, b, 5, Instant::now());
    let (again, answers, _) = split(core.take_outbox());
    assert!(answers.is_empty());
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(
        (again[0].link, again[0].operation, again[0].offset),
        (b, Operation::Write, 4096)
    );
    assert_eq!(again[0].payload, [7; 300], "the same request");
    assert_ne!(again[0].tag, sent[1].tag, "under a new link tag");
    answer(&mut core, &again[0], Status::Ok, 0);
    let (_, answers, lost) = split(core.take_outbox());
    assert!(lost.is_empty());
    assert_eq!(answers.len(), 1);
    assert_eq!(answered(&answers[0].1), (Status::Ok, 0, 9));
    assert_eq!(core.requests_in_flight(), 0);
}

#[test]
fn a_write_overlapping_a_part_sent_under_an_older_epoch_goes_after_it_on_that_copys_link() {
    let mut core = at_epoch(4);
    let (a, b) = links_ab(&core);
    send(&mut core, write("PA.1", 0, &[1; 64]), 1);
    let (first, _, _) = split(core.take_outbox());
    // The device moves to epoch 5 with the write in flight: its parts,
    // sent under epoch 4, may come back STALE_MAP.
    core.set_epoch(5);
    server_runs(&mut core, a, 5, Instant::now());
    server_runs(&mut core, b, 5, Instant::now());
    // Overlapping it: waits. Elsewhere: goes at once.
    send(&mut core, write("PA.1", 32, &[2; 64]), 2);
    assert!(split(core.take_outbox()).0.is_empty(), "waits behind it");
    send(&mut core, write("PA.1", 8192, &[3; 8]), 3);
    let (elsewhere, _, _) = split(core.take_outbox());
    assert_eq!(elsewhere.len(), 2, "a write elsewhere is not held");

    answer(&mut core, &first[0], Status::Ok, 0);
    assert!(
        split(core.take_outbox()).0.is_empty(),
        "B's part is not answered yet"
    );
    // B ran epoch 5 before the MAP_EPOCH that said it reached it.
    answer(&mut core, &first[1], Status::StaleMap, 5);
    let (sent, _, lost) = split(core.take_outbox());
    assert!(lost.is_empty(), "{lost:?}");
    let order: Vec<(LinkId, u64, u8)> = sent
        .iter()
        .map(|s| (s.link, s.offset, s.payload[0]))
        .collect();
    // The first write again on B's link, then the second on both links:
    // B applies them in the order A did.
    assert_eq!(order, [(b, 0, 1), (a, 32, 2), (b, 32, 2)]);
    for s in sent.iter().chain(&elsewhere) {
        answer(&mut core, s, Status::Ok, 0);
    }
    let (_, answers, lost) = split(core.take_outbox());
    assert!(lost.is_empty());
    let mut tags: Vec<u64> = answers.iter().map(|(_, r)| answered(r).2).collect();
    tags.sort_unstable();
    assert_eq!(tags, [1, 2, 3]);
    assert!(answers.iter().all(|(_, r)| answered(r).0 == Status::Ok));
}

#[test]
fn a_write_in_flight_when_the_epoch_moves_holds_overlapping_ones_until_answered() {
    let mut core = at_epoch(4);
    send(&mut core, write("PA.1", 0, &[1; 64]), 1);
    let (first, _, _) = split(core.take_outbox());
    core.set_epoch(5);
    send(&mut core, write("PA.1", 0, &[2; 64]), 2);
    assert!(split(core.take_outbox()).0.is_empty(), "waits behind it");
    // Both copies applied it: the waiting write goes.
    answer(&mut core, &first[0], Status::Ok, 0);
    answer(&mut core, &first[1], Status::Ok, 0);
    let (sent, answers, _) = split(core.take_outbox());
    assert_eq!(answered(&answers[0].1), (Status::Ok, 0, 1));
    assert_eq!(sent.len(), 2);
    assert!(sent.iter().all(|s| s.payload[0] == 2));
}

#[test]
fn an_atomic_refused_stale_map_at_the_deciding_copy_goes_again_with_its_identity() {
    let mut core = at_epoch(4);
    let (a, b) = links_ab(&core);
    let add = |c: &Forwarder| Repr {
        exactly_once: Some(ExactlyOnce::on_lane(0, 21)),
        ..Repr::fetch_add(pmem(c, "PB.1", 64), key(c, "PB.1"), 2)
    };
    send(&mut core, add, 5);
    let (sent, _, _) = split(core.take_outbox());
    assert_eq!(
        sent.iter()
            .map(|s| (s.link, s.operation))
            .collect::<Vec<_>>(),
        [(b, Operation::FetchAdd), (b, Operation::Read)]
    );
    answer(&mut core, &sent[0], Status::StaleMap, 5);
    answer(&mut core, &sent[1], Status::StaleMap, 5);
    let (again, answers, lost) = split(core.take_outbox());
    assert!(again.is_empty() && answers.is_empty() && lost.is_empty());

    core.set_epoch(5);
    server_runs(&mut core, b, 5, Instant::now());
    let (again, _, _) = split(core.take_outbox());
    assert_eq!(
        again
            .iter()
            .map(|s| (s.link, s.operation))
            .collect::<Vec<_>>(),
        [(b, Operation::FetchAdd), (b, Operation::Read)],
        "the atomic, then its word, in that order"
    );
    assert_eq!(again[0].identity, sent[0].identity, "the same identity");
    assert!(again[0].identity.is_some());
    answer(&mut core, &again[0], Status::Ok, 10);
    answer(&mut core, &again[1], Status::Ok, 12);
    let (word, _, _) = split(core.take_outbox());
    assert_eq!(word.len(), 1);
    assert_eq!(
        (word[0].link, word[0].operation, word[0].operand),
        (a, Operation::AtomicWrite, 12)
    );
    answer(&mut core, &word[0], Status::Ok, 10);
    let (_, answers, lost) = split(core.take_outbox());
    assert!(lost.is_empty());
    assert_eq!(answered(&answers[0].1), (Status::Ok, 10, 5));
}

#[test]
fn a_copy_that_keeps_answering_stale_map_is_lost_after_a_few_resends() {
    let mut core = at_epoch(4);
    let (_, b) = links_ab(&core);
    let pa1 = index(&core, "PA.1");
    send(&mut core, write("PA.1", 0, &[4; 16]), 9);
    let (mut sent, _, _) = split(core.take_outbox());
    answer(&mut core, &sent[0], Status::Ok, 0);
    let mut part: Sent = sent.remove(1);
    for round in 0..u64::from(STALE_RESENDS) {
        let epoch = 5 + round;
        answer(&mut core, &part, Status::StaleMap, epoch);
        core.set_epoch(epoch);
        server_runs(&mut core, b, epoch, Instant::now());
        let (mut again, answers, lost) = split(core.take_outbox());
        assert!(lost.is_empty() && answers.is_empty(), "round {round}");
        assert_eq!(again.len(), 1, "round {round}: sent again");
        part = again.remove(0);
    }
    answer(
        &mut core,
        &part,
        Status::StaleMap,
        5 + u64::from(STALE_RESENDS),
    );
    let (again, answers, lost) = split(core.take_outbox());
    assert!(again.is_empty(), "not sent again: {again:?}");
    assert_eq!(lost, [(pa1, "B".to_owned())]);
    assert!(answers.is_empty(), "held until the loss is recorded");
    core.copy_marked(pa1, &"B".into(), Instant::now());
    let (_, answers, _) = split(core.take_outbox());
    assert_eq!(answered(&answers[0].1), (Status::Ok, 0, 9));
}

#[test]
fn a_server_behind_the_device_is_asked_its_epoch_again_until_it_runs_it() {
    let mut core = at_epoch(4);
    let (a, b) = links_ab(&core);
    core.set_epoch(5);
    server_runs(&mut core, a, 5, Instant::now());
    send(&mut core, write("PA.1", 0, &[5; 16]), 9);
    let (sent, _, _) = split(core.take_outbox());
    answer(&mut core, &sent[0], Status::Ok, 0);
    // B's server still runs epoch 4 and its map lacks something of the
    // device's epoch 5: STALE_MAP with its older epoch.
    answer(&mut core, &sent[1], Status::StaleMap, 4);
    assert!(split(core.take_outbox()).0.is_empty(), "B does not run 5");
    let now = Instant::now();
    let resaid: Vec<LinkId> = core.fence_resends(now).iter().map(|(l, _)| *l).collect();
    assert_eq!(resaid, [b], "MAP_EPOCH again to B");
    assert!(core.fence_resends(now).is_empty(), "once per period");
    // B says it runs epoch 4 still: not yet.
    server_runs(&mut core, b, 4, now);
    assert!(split(core.take_outbox()).0.is_empty());
    let later = now + crate::forward::replication::RESAY_EVERY;
    let resaid: Vec<LinkId> = core.fence_resends(later).iter().map(|(l, _)| *l).collect();
    assert_eq!(resaid, [b]);
    server_runs(&mut core, b, 5, later);
    let (again, _, _) = split(core.take_outbox());
    assert_eq!(again.len(), 1);
    answer(&mut core, &again[0], Status::Ok, 0);
    let (_, answers, lost) = split(core.take_outbox());
    assert!(lost.is_empty());
    assert_eq!(answered(&answers[0].1), (Status::Ok, 0, 9));
}

#[test]
fn a_part_whose_server_never_runs_the_epoch_loses_its_copy_after_the_request_timeout() {
    let mut core = at_epoch(4);
    let pa1 = index(&core, "PA.1");
    send(&mut core, write("PA.1", 0, &[6; 16]), 9);
    let (sent, _, _) = split(core.take_outbox());
    answer(&mut core, &sent[0], Status::Ok, 0);
    // B runs epoch 6; the device never gets that map.
    answer(&mut core, &sent[1], Status::StaleMap, 6);
    let refused = Instant::now();
    let timeout = ForwarderConfig::default().request_timeout;
    assert!(core.poll_timeout().is_some_and(|t| t <= refused + timeout));
    core.fence_resends(refused);
    assert!(split(core.take_outbox()).2.is_empty(), "not yet");
    core.fence_resends(refused + timeout + Duration::from_millis(1));
    let (again, _, lost) = split(core.take_outbox());
    assert!(again.is_empty());
    assert_eq!(lost, [(pa1, "B".to_owned())]);
}

#[test]
fn a_read_refused_stale_map_is_read_again_once_the_server_runs_the_epoch() {
    let mut core = at_epoch(4);
    let (read, _) = send_read(
        &mut core,
        |c| Repr::read(pmem(c, "PA.1", 128), key(c, "PA.1"), 8),
        7,
    );
    answer(&mut core, &read, Status::StaleMap, 5);
    let (again, answers, lost) = split(core.take_outbox());
    assert!(again.is_empty() && answers.is_empty() && lost.is_empty());

    core.set_epoch(5);
    for server in ["A", "B"] {
        let l = link(&core, server, "n0");
        server_runs(&mut core, l, 5, Instant::now());
    }
    let (again, _, _) = split(core.take_outbox());
    assert_eq!(again.len(), 1);
    assert_eq!(
        (again[0].operation, again[0].offset),
        (Operation::Read, 128)
    );
    let data = 42u64.to_le_bytes();
    let frame = Message::Response(response::Repr::read_data(&data))
        .encode_to_vec(again[0].tag)
        .unwrap();
    match core.link_frame(again[0].link, &frame, Instant::now()) {
        LinkAction::Deliver { conn, payload, .. } => {
            assert_eq!(conn, 1);
            assert_eq!(payload, &data[..]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_deposed_owner_sends_no_refused_part_again_its_client_is_told_not_owner() {
    let mut core = at_epoch(4);
    let (a, b) = links_ab(&core);
    send(&mut core, write("PA.1", 0, &[5; 64]), 11);
    let (sent, _, _) = split(core.take_outbox());
    // Both servers run the takeover's epoch 5 already (this device was
    // frozen past its lease): nothing ran.
    answer(&mut core, &sent[0], Status::StaleMap, 5);
    answer(&mut core, &sent[1], Status::StaleMap, 5);
    assert!(core.take_map_reread());
    // The map it reads gives PA.1 to B; both servers confirm epoch 5.
    core.reload(map_with_owner("PA.1", "B", 2));
    core.set_epoch(5);
    let now = Instant::now();
    server_runs(&mut core, a, 5, now);
    server_runs(&mut core, b, 5, now);
    let (again, answers, lost) = split(core.take_outbox());
    assert!(
        again.is_empty(),
        "a deposed owner sends nothing again: {again:?}"
    );
    assert!(lost.is_empty(), "{lost:?}");
    assert_eq!(answers.len(), 1);
    assert_eq!(answered(&answers[0].1).0, Status::NotOwner);
    assert_eq!(answered(&answers[0].1).2, 11);
    assert_eq!(core.requests_in_flight(), 0);
}
