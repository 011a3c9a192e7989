//! Replicated regions on device A of the default topology with
//! `replicas = 2`: A owns PA.1 (primary on server A, backup on B) and PB.1
//! (primary on B, backup on A); B owns PA.2 and PB.2.

use proto::atomic_record::AtomicRecord;
use proto::request::{ExactlyOnce, Operation};

use super::*;
use crate::forward::{Offload, Outgoing};

pub(super) fn replicated() -> Forwarder {
    let topology = testkit::default_topology_with("replicas = 2");
    let mut core = core_with(&topology, ForwarderConfig::default());
    let ids: Vec<LinkId> = core.links().map(|(id, _)| id).collect();
    for id in ids {
        bring_up_with_server_keys(&mut core, id);
    }
    hello(&mut core, 1, "c1");
    core
}

/// The key server `server` gives region `region`: each server its own, so
/// a backup's key differs from its primary's.
pub(super) fn key_on(server: &str, region: RegionIndex) -> AccessKey {
    server_key(region, if server == "A" { 0 } else { 1 })
}

/// Completes a link's handshake with a MAP whose keys are the server's own.
pub(super) fn bring_up_with_server_keys(core: &mut Forwarder, link: LinkId) {
    let server = core.link_target(link).unwrap().server.to_string();
    core.link_connected(link);
    let hello = Message::Hello(hello::Repr {
        version: PROTOCOL_VERSION,
        role: Role::Server,
        capabilities: Capabilities::NONE,
        name: &server,
    })
    .encode_to_vec(LINK_OPENING.hello)
    .unwrap();
    core.link_frame(link, &hello, Instant::now());
    let mut map = core.map().layout.to_map();
    for entry in &mut map.entries {
        entry.key = key_on(&server, entry.region);
    }
    let map = Message::Map(map).encode_to_vec(LINK_OPENING.map).unwrap();
    core.link_frame(link, &map, Instant::now());
    assert_eq!(core.link_status(link), Some(LinkStatus::Up));
}

/// A request sent to a copy, as the outbox has it.
#[derive(Debug)]
pub(super) struct Sent {
    pub(super) link: LinkId,
    pub(super) tag: u64,
    pub(super) operation: Operation,
    pub(super) offset: u64,
    key: AccessKey,
    pub(super) operand: u64,
    pub(super) identity: Option<ExactlyOnce>,
    pub(super) payload: Vec<u8>,
    /// For the server's CPU (TCP) even where RDMA could carry it.
    cpu: bool,
    /// The work requests that carry it on an RDMA queue pair.
    pub(super) rdma: Option<Offload>,
}

/// An outbox split: the requests sent, the answers and the copies lost.
pub(super) type Split = (Vec<Sent>, Vec<(ConnId, Reply)>, Vec<(RegionIndex, String)>);

/// Splits an outbox into the requests sent, the answers and the copies lost.
pub(super) fn split(out: Vec<Outgoing>) -> Split {
    let (mut sent, mut answers, mut lost) = (Vec::new(), Vec::new(), Vec::new());
    for item in out {
        match item {
            Outgoing::Send {
                link,
                head,
                payload,
                cpu,
                rdma,
            } => sent.push(Sent::parse(link, &head, &payload, cpu, rdma)),
            Outgoing::Answer { conn, reply } => answers.push((conn, reply)),
            Outgoing::CopyLost { region, server, .. } => lost.push((region, server.to_string())),
            Outgoing::OwnerSuspected { .. } => {}
            other => panic!("no resync runs here: {other:?}"),
        }
    }
    (sent, answers, lost)
}

impl Sent {
    /// A region-addressed request for a copy, from its head and payload.
    fn parse(link: LinkId, head: &[u8], payload: &[u8], cpu: bool, rdma: Option<Offload>) -> Sent {
        let mut frame = head.to_vec();
        frame.extend_from_slice(payload);
        let (message, tag) = proto::parse_frame(&frame).unwrap();
        let Message::Request(req) = message else {
            panic!("{message:?}")
        };
        let Target::Region(at) = req.target else {
            panic!("not region-addressed: {req:?}")
        };
        Sent {
            link,
            tag,
            operation: req.operation,
            offset: at.offset,
            key: req.key,
            operand: req.operand,
            identity: req.exactly_once,
            payload: req.payload.to_vec(),
            cpu,
            rdma,
        }
    }
}

/// How a READ of a replicated region left the core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReadWent {
    /// Handed back to be written straight to its link.
    Direct,
    /// In the outbox, in its copy's order.
    Outbox,
}

/// Sends a READ from client connection 1 and returns it as it went to a
/// copy: handed back straight for its link, or in the outbox.
pub(super) fn send_read<'d>(
    core: &mut Forwarder,
    build: impl FnOnce(&Forwarder) -> Repr<'d>,
    tag: u64,
) -> (Sent, ReadWent) {
    let frame = Message::Request(build(core)).encode_to_vec(tag).unwrap();
    match core.client_frame(1, &frame, Instant::now()) {
        ClientAction::Forward {
            link,
            head,
            payload,
            rdma,
        } => {
            let sent = Sent::parse(link, &head, payload, false, rdma);
            assert!(
                core.take_outbox().is_empty(),
                "a direct read queues nothing"
            );
            (sent, ReadWent::Direct)
        }
        ClientAction::Nothing => {
            let (mut sent, answers, _) = split(core.take_outbox());
            assert!(
                answers.is_empty() && sent.len() == 1,
                "{sent:?} {answers:?}"
            );
            (sent.remove(0), ReadWent::Outbox)
        }
        other => panic!("{other:?}"),
    }
}

pub(super) fn index(core: &Forwarder, region: &str) -> RegionIndex {
    core.map()
        .layout
        .entry_by_id(&region.into())
        .unwrap()
        .region
}

pub(super) fn send<'d>(
    core: &mut Forwarder,
    build: impl FnOnce(&Forwarder) -> Repr<'d>,
    tag: u64,
) -> ClientAction<'static> {
    let frame = Message::Request(build(core)).encode_to_vec(tag).unwrap();
    match core.client_frame(1, &frame, Instant::now()) {
        ClientAction::Nothing => ClientAction::Nothing,
        ClientAction::Reply(r) => ClientAction::Reply(r),
        other => panic!("{other:?}"),
    }
}

/// The server's answer to `sent`: OK with `value` (8 bytes of data for
/// READ).
pub(super) fn answer(core: &mut Forwarder, sent: &Sent, status: Status, value: u64) {
    let repr = match sent.operation {
        Operation::Read if status == Status::Ok => {
            let data = value.to_le_bytes();
            let frame = Message::Response(response::Repr::read_data(&data))
                .encode_to_vec(sent.tag)
                .unwrap();
            assert!(matches!(
                core.link_frame(sent.link, &frame, Instant::now()),
                LinkAction::Nothing | LinkAction::Deliver { .. }
            ));
            return;
        }
        op => response::Repr {
            kind: response::ResponseKind::answering(op.opcode()),
            status,
            value,
            payload: &[],
        },
    };
    let frame = Message::Response(repr).encode_to_vec(sent.tag).unwrap();
    core.link_frame(sent.link, &frame, Instant::now());
}

/// The status, value and tag of an answer.
pub(super) fn answered(reply: &Reply) -> (Status, u64, u64) {
    let (message, tag) = proto::parse_frame(reply.as_bytes()).unwrap();
    match message {
        Message::Response(r) => (r.status, r.value, tag),
        other => panic!("not a response: {other:?}"),
    }
}

#[test]
fn a_write_reaches_every_copy_and_is_answered_once_all_did() {
    let mut core = replicated();
    let pa1 = index(&core, "PA.1");
    let data = [7u8; 300];
    let action = send(
        &mut core,
        |c| Repr::write(pmem(c, "PA.1", 4096), key(c, "PA.1"), &data),
        9,
    );
    assert!(matches!(action, ClientAction::Nothing));
    let (sent, answers, _) = split(core.take_outbox());
    assert!(answers.is_empty());
    let to: Vec<LinkId> = sent.iter().map(|s| s.link).collect();
    // One connection per copy: the main lane of the NIC on the copy's socket.
    assert_eq!(to, [link(&core, "A", "n0"), link(&core, "B", "n0")]);
    for s in &sent {
        assert_eq!((s.operation, s.offset), (Operation::Write, 4096));
        assert_eq!(s.payload, data);
    }
    // Each copy's own key: the client sent the primary's.
    assert_eq!(sent[0].key, key_on("A", pa1));
    assert_eq!(sent[1].key, key_on("B", pa1));
    assert_ne!(sent[0].key, sent[1].key);
    // RDMA may carry a write to each copy (on a link with a queue pair).
    assert!(sent.iter().all(|s| !s.cpu));

    answer(&mut core, &sent[0], Status::Ok, 0);
    assert!(core.take_outbox().is_empty(), "the backup has not answered");
    assert_eq!(core.requests_in_flight(), 2);
    answer(&mut core, &sent[1], Status::Ok, 0);
    let (_, answers, lost) = split(core.take_outbox());
    assert!(lost.is_empty());
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].0, 1);
    assert_eq!(answered(&answers[0].1), (Status::Ok, 0, 9));
    assert_eq!(core.requests_in_flight(), 0);
}

#[test]
fn a_device_that_does_not_own_the_region_answers_not_owner() {
    let mut core = replicated();
    // PA.2 belongs to device B.
    let action = send(
        &mut core,
        |c| Repr::write(pmem(c, "PA.2", 0), key(c, "PA.2"), &[1; 8]),
        4,
    );
    assert_eq!(refused(action), Status::NotOwner);
    let read = send(
        &mut core,
        |c| Repr::read(pmem(c, "PB.2", 0), key(c, "PB.2"), 8),
        5,
    );
    assert_eq!(refused(read), Status::NotOwner);
    let (sent, answers, lost) = split(core.take_outbox());
    assert!(
        sent.is_empty() && answers.is_empty() && lost.is_empty(),
        "nothing forwarded"
    );
    assert_eq!(core.metrics.not_owner.get(), 2);
}

fn compare_swap(core: &Forwarder, region: &str, offset: u64, seq: u64) -> Repr<'static> {
    Repr {
        operation: Operation::CompareSwap,
        length: 8,
        compare: 5,
        operand: 6,
        exactly_once: Some(ExactlyOnce::on_lane(0, seq)),
        ..Repr::read(pmem(core, region, offset), key(core, region), 8)
    }
}

#[test]
fn an_atomic_is_decided_at_one_copy_and_its_word_written_to_the_other() {
    let mut core = replicated();
    let pb1 = index(&core, "PB.1");
    send(&mut core, |c| compare_swap(c, "PB.1", 64, 41), 3);
    let (sent, _, _) = split(core.take_outbox());
    // PB.1's deciding copy is its primary on server B: the atomic, then a
    // read of the word on the same link.
    assert_eq!(sent.len(), 2);
    let b = link(&core, "B", "n0");
    assert_eq!(
        (sent[0].link, sent[0].operation),
        (b, Operation::CompareSwap)
    );
    assert_eq!((sent[1].link, sent[1].operation), (b, Operation::Read));
    // Both for the server's CPU, on its connection, in this order: the
    // READ must see the atomic's word, which it would not if it overtook
    // the atomic on an RDMA queue pair.
    assert!(sent[0].cpu && sent[1].cpu);
    let number = core.map().clients["c1"].number;
    let identity = ExactlyOnce::on_lane(0, 41).stamped(number);
    assert_eq!(sent[0].identity, Some(identity));
    assert_eq!(sent[0].key, key_on("B", pb1));

    // Old value 5: swapped to 6; the word read back is 6.
    answer(&mut core, &sent[0], Status::Ok, 5);
    assert!(core.take_outbox().is_empty(), "the word is not read yet");
    answer(&mut core, &sent[1], Status::Ok, 6);
    let (sent, answers, _) = split(core.take_outbox());
    assert!(answers.is_empty(), "the backup does not have the word yet");
    assert_eq!(sent.len(), 1);
    let write = &sent[0];
    assert_eq!(write.link, link(&core, "A", "n0"));
    assert_eq!(write.operation, Operation::AtomicWrite);
    assert_eq!((write.offset, write.operand), (64, 6));
    assert_eq!(write.identity, Some(identity), "the client's identity");
    // Not pinned to the CPU by the core: the record's exactly-once
    // identity keeps it off RDMA where the queue pair is asked.
    assert!(!write.cpu);
    assert_eq!(write.key, key_on("A", pb1));
    // The atomic's record, so the backup's window remembers it: the
    // COMPARE_SWAP 5 -> 6 and the deciding copy's result.
    assert_eq!(
        AtomicRecord::parse(&write.payload),
        Ok(AtomicRecord::new(Opcode::CompareSwap, 5, 6, 5))
    );
    answer(&mut core, write, Status::Ok, 5);
    let (_, answers, _) = split(core.take_outbox());
    assert_eq!(answers.len(), 1);
    assert_eq!(
        answered(&answers[0].1),
        (Status::Ok, 5, 3),
        "the deciding copy's answer"
    );
    assert_eq!(core.metrics.atomics_decided.get(), 1);
    assert_eq!(core.metrics.atomics_applied.get(), 1);
}

#[test]
fn a_fetch_add_without_an_identity_writes_its_word_without_a_record() {
    let mut core = replicated();
    send(
        &mut core,
        |c| Repr::fetch_add(pmem(c, "PB.1", 128), key(c, "PB.1"), 3),
        3,
    );
    let (sent, _, _) = split(core.take_outbox());
    answer(&mut core, &sent[0], Status::Ok, 10);
    answer(&mut core, &sent[1], Status::Ok, 13);
    let (sent, _, _) = split(core.take_outbox());
    assert_eq!(sent.len(), 1);
    assert_eq!(
        (sent[0].operation, sent[0].operand),
        (Operation::AtomicWrite, 13)
    );
    assert_eq!(sent[0].identity, None);
    assert!(sent[0].payload.is_empty(), "no identity to record it under");

    // With one, the record is a FETCH_ADD of 3 that returned 10.
    let add = |c: &Forwarder| Repr {
        exactly_once: Some(ExactlyOnce::on_lane(0, 77)),
        ..Repr::fetch_add(pmem(c, "PB.1", 256), key(c, "PB.1"), 3)
    };
    send(&mut core, add, 4);
    let (sent, _, _) = split(core.take_outbox());
    answer(&mut core, &sent[0], Status::Ok, 10);
    answer(&mut core, &sent[1], Status::Ok, 13);
    let (sent, _, _) = split(core.take_outbox());
    assert_eq!(
        AtomicRecord::parse(&sent[0].payload),
        Ok(AtomicRecord::new(Opcode::FetchAdd, 0, 3, 10))
    );
}

#[test]
fn an_atomic_write_with_an_identity_is_decided_and_recorded_at_every_copy() {
    let mut core = replicated();
    let store = |c: &Forwarder| Repr {
        exactly_once: Some(ExactlyOnce::on_lane(0, 12)),
        ..Repr::atomic_write(pmem(c, "PB.1", 512), key(c, "PB.1"), 99)
    };
    send(&mut core, store, 6);
    let (sent, _, _) = split(core.take_outbox());
    // To the deciding copy alone, with the read of its word.
    let b = link(&core, "B", "n0");
    let shapes: Vec<_> = sent.iter().map(|s| (s.link, s.operation)).collect();
    assert_eq!(shapes, [(b, Operation::AtomicWrite), (b, Operation::Read)]);
    answer(&mut core, &sent[0], Status::Ok, 4);
    answer(&mut core, &sent[1], Status::Ok, 99);
    let (sent, _, _) = split(core.take_outbox());
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].link, link(&core, "A", "n0"));
    assert_eq!(
        (sent[0].operation, sent[0].operand),
        (Operation::AtomicWrite, 99)
    );
    // Its record: a retry reaching the backup once it decides is answered
    // from there, not stored again over a later store.
    assert_eq!(
        AtomicRecord::parse(&sent[0].payload),
        Ok(AtomicRecord::new(Opcode::AtomicWrite, 0, 99, 4))
    );

    // Without an identity it goes to both copies at once, as a write does.
    send(
        &mut core,
        |c| Repr::atomic_write(pmem(c, "PB.1", 520), key(c, "PB.1"), 5),
        7,
    );
    let (sent, _, _) = split(core.take_outbox());
    let shapes: Vec<_> = sent.iter().map(|s| (s.link, s.operation)).collect();
    assert_eq!(
        shapes,
        [
            (link(&core, "B", "n0"), Operation::AtomicWrite),
            (link(&core, "A", "n0"), Operation::AtomicWrite)
        ]
    );
}

#[test]
fn a_client_cannot_send_an_atomics_record() {
    let mut core = replicated();
    let record = AtomicRecord::new(Opcode::FetchAdd, 0, 1, 0).to_bytes();
    // To a region this device owns and to one it does not: refused before
    // anything else, never forwarded.
    for (region, tag) in [("PB.1", 5), ("PA.2", 6)] {
        let action = send(
            &mut core,
            |c| {
                Repr::atomic_write(pmem(c, region, 64), key(c, region), 1)
                    .with_exactly_once(0, 9)
                    .recording(&record)
            },
            tag,
        );
        assert_eq!(refused(action), Status::AccessDenied, "{region}");
    }
    assert!(core.take_outbox().is_empty(), "nothing forwarded");
    assert_eq!(core.metrics.records_refused.get(), 2);
}

#[test]
fn the_word_written_to_the_others_is_the_one_read_back_not_a_replayed_result() {
    let mut core = replicated();
    send(&mut core, |c| compare_swap(c, "PB.1", 64, 42), 3);
    let (sent, _, _) = split(core.take_outbox());
    // A retry answered from the window: old 5 (so "6" by the request), but
    // the word has moved on to 99 since.
    answer(&mut core, &sent[0], Status::Ok, 5);
    answer(&mut core, &sent[1], Status::Ok, 99);
    let (sent, _, _) = split(core.take_outbox());
    assert_eq!(sent[0].operand, 99, "never an old result that rolls back");
}

#[test]
fn a_write_overlapping_an_undecided_atomic_waits_and_goes_after_its_word() {
    let mut core = replicated();
    send(&mut core, |c| compare_swap(c, "PB.1", 64, 43), 3);
    let (atomic, _, _) = split(core.take_outbox());
    // Overlaps the word: waits. Elsewhere: goes at once.
    send(
        &mut core,
        |c| Repr::write(pmem(c, "PB.1", 60), key(c, "PB.1"), &[1; 8]),
        4,
    );
    assert!(core.take_outbox().is_empty(), "waits for the decision");
    send(
        &mut core,
        |c| Repr::read(pmem(c, "PB.1", 64), key(c, "PB.1"), 8),
        5,
    );
    assert!(
        core.take_outbox().is_empty(),
        "a read of the word waits too"
    );
    send(
        &mut core,
        |c| Repr::write(pmem(c, "PB.1", 8192), key(c, "PB.1"), &[2; 8]),
        6,
    );
    let (elsewhere, _, _) = split(core.take_outbox());
    assert_eq!(elsewhere.len(), 2, "a write elsewhere is not held");
    assert!(elsewhere.iter().all(|s| s.offset == 8192));

    answer(&mut core, &atomic[0], Status::Ok, 5);
    answer(&mut core, &atomic[1], Status::Ok, 6);
    let (sent, _, _) = split(core.take_outbox());
    let a = link(&core, "A", "n0");
    let b = link(&core, "B", "n0");
    let order: Vec<(LinkId, Operation, u64)> = sent
        .iter()
        .map(|s| (s.link, s.operation, s.offset))
        .collect();
    // The word to the backup first, then the write to both copies, then
    // the read (to the deciding copy, behind the write on its link).
    assert_eq!(
        order,
        [
            (a, Operation::AtomicWrite, 64),
            (b, Operation::Write, 60),
            (a, Operation::Write, 60),
            (b, Operation::Read, 64),
        ]
    );
}

#[test]
fn a_read_during_a_write_goes_behind_it_at_the_deciding_copy() {
    let mut core = replicated();
    // PA.1's deciding copy is its primary on server A.
    send(
        &mut core,
        |c| Repr::write(pmem(c, "PA.1", 0), key(c, "PA.1"), &[3; 64]),
        1,
    );
    let (writes, _, _) = split(core.take_outbox());
    let (read, went) = send_read(
        &mut core,
        |c| Repr::read(pmem(c, "PA.1", 32), key(c, "PA.1"), 16),
        2,
    );
    assert_eq!(went, ReadWent::Outbox, "in the copy's order");
    let a = link(&core, "A", "n0");
    assert_eq!(read.link, a, "the deciding copy, on the write's link");
    assert_eq!(writes[0].link, a);
    assert!(
        read.tag > writes[0].tag,
        "sent after the write on that link"
    );
    // A read of another range does not wait its turn.
    let (read, went) = send_read(
        &mut core,
        |c| Repr::read(pmem(c, "PA.1", 4096), key(c, "PA.1"), 16),
        3,
    );
    assert_eq!(went, ReadWent::Direct);
    assert_eq!(read.key, key_on("A", index(&core, "PA.1")));

    // Without a write in flight, a read may go to either serving copy,
    // straight to its link.
    for w in &writes {
        answer(&mut core, w, Status::Ok, 0);
    }
    core.take_outbox();
    let (read, went) = send_read(
        &mut core,
        |c| Repr::read(pmem(c, "PA.1", 32), key(c, "PA.1"), 16),
        4,
    );
    assert_eq!(went, ReadWent::Direct);
    assert!([a, link(&core, "B", "n0")].contains(&read.link));
    // Its answer reaches the client like any copy's.
    let data = 9u64.to_le_bytes();
    let frame = Message::Response(response::Repr::read_data(&data))
        .encode_to_vec(read.tag)
        .unwrap();
    match core.link_frame(read.link, &frame, Instant::now()) {
        LinkAction::Deliver { conn, payload, .. } => assert_eq!((conn, payload), (1, &data[..])),
        other => panic!("{other:?}"),
    }
}

#[test]
fn reads_stay_on_one_copy_until_it_has_a_batch_pending_then_spread() {
    use crate::forward::replication::READ_SPREAD;
    let mut core = replicated();
    let a = link(&core, "A", "n0");
    let mut targets = Vec::new();
    for tag in 0..READ_SPREAD as u64 + 1 {
        let (read, _) = send_read(
            &mut core,
            |c| Repr::read(pmem(c, "PA.1", 64 * tag), key(c, "PA.1"), 64),
            tag + 1,
        );
        targets.push(read.link);
    }
    // PA.1's copies in set order: its primary on A, its backup on B.
    assert!(
        targets[..READ_SPREAD].iter().all(|&l| l == a),
        "a batch of reads goes to one copy: {targets:?}"
    );
    let next = core.link_target(targets[READ_SPREAD]).unwrap();
    assert_eq!(
        next.server.as_str(),
        "B",
        "past a batch pending there, the other copy takes reads"
    );
}

#[test]
fn a_lost_copy_holds_the_answer_until_it_is_marked_then_answers_ok() {
    let mut core = replicated();
    let pa1 = index(&core, "PA.1");
    send(
        &mut core,
        |c| Repr::write_persist(pmem(c, "PA.1", 0), key(c, "PA.1"), &[4; 32]),
        8,
    );
    let (sent, _, _) = split(core.take_outbox());
    answer(&mut core, &sent[0], Status::Ok, 0);
    // The backup's link breaks with the write in flight.
    let failed = core.link_down(sent[1].link);
    assert!(failed.is_empty(), "no error for the client");
    let (_, answers, lost) = split(core.take_outbox());
    assert!(
        answers.is_empty(),
        "held until the map says the copy is offline"
    );
    assert_eq!(lost, [(pa1, "B".to_owned())]);
    assert_eq!(core.metrics.copies_offline.get(), 1);

    core.copy_marked(pa1, &"B".into(), Instant::now());
    let (_, answers, _) = split(core.take_outbox());
    assert_eq!(answers.len(), 1);
    assert_eq!(answered(&answers[0].1), (Status::Ok, 0, 8));

    // From now on the region is written on server A alone.
    send(
        &mut core,
        |c| Repr::write(pmem(c, "PA.1", 0), key(c, "PA.1"), &[5; 8]),
        9,
    );
    let (sent, _, lost) = split(core.take_outbox());
    assert!(lost.is_empty());
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].link, link(&core, "A", "n0"));
}

#[test]
fn a_copy_whose_request_timed_out_is_dropped_though_its_link_is_up() {
    let config = ForwarderConfig::default();
    let mut core = replicated();
    let pa1 = index(&core, "PA.1");
    let start = Instant::now();
    send(
        &mut core,
        |c| Repr::write(pmem(c, "PA.1", 0), key(c, "PA.1"), &[6; 8]),
        10,
    );
    let (sent, _, _) = split(core.take_outbox());
    answer(&mut core, &sent[0], Status::Ok, 0);
    let (replies, silent) = core.handle_timeouts(start + config.request_timeout * 2);
    assert!(replies.is_empty(), "no TIMEOUT for the client");
    assert_eq!(silent, [sent[1].link]);
    let (_, answers, lost) = split(core.take_outbox());
    assert!(answers.is_empty());
    assert_eq!(lost, [(pa1, "B".to_owned())]);
    core.copy_marked(pa1, &"B".into(), Instant::now());
    let (_, answers, _) = split(core.take_outbox());
    assert_eq!(answered(&answers[0].1), (Status::Ok, 0, 10));
}

#[test]
fn the_last_serving_copy_is_never_dropped_its_failure_fails_the_request() {
    let mut core = replicated();
    let pa1 = index(&core, "PA.1");
    send(
        &mut core,
        |c| Repr::write(pmem(c, "PA.1", 0), key(c, "PA.1"), &[6; 8]),
        1,
    );
    let (sent, _, _) = split(core.take_outbox());
    core.link_down(sent[1].link);
    core.copy_marked(pa1, &"B".into(), Instant::now());
    answer(&mut core, &sent[0], Status::Ok, 0);
    core.take_outbox();
    send(
        &mut core,
        |c| Repr::write(pmem(c, "PA.1", 0), key(c, "PA.1"), &[7; 8]),
        2,
    );
    let (sent, _, _) = split(core.take_outbox());
    assert_eq!(sent.len(), 1);
    core.link_down(sent[0].link);
    let (_, answers, lost) = split(core.take_outbox());
    assert!(lost.is_empty(), "server A's copy stays serving");
    assert_eq!(answers.len(), 1);
    assert_eq!(answered(&answers[0].1).0, Status::ServerUnavailable);
}

#[test]
fn a_copy_that_refuses_a_change_the_others_made_is_dropped() {
    let mut core = replicated();
    let pa1 = index(&core, "PA.1");
    send(
        &mut core,
        |c| Repr::write(pmem(c, "PA.1", 0), key(c, "PA.1"), &[8; 8]),
        1,
    );
    let (sent, _, _) = split(core.take_outbox());
    answer(&mut core, &sent[0], Status::Ok, 0);
    answer(&mut core, &sent[1], Status::IoError, 0);
    let (_, answers, lost) = split(core.take_outbox());
    assert!(answers.is_empty());
    assert_eq!(lost, [(pa1, "B".to_owned())]);
    core.copy_marked(pa1, &"B".into(), Instant::now());
    let (_, answers, _) = split(core.take_outbox());
    assert_eq!(answered(&answers[0].1).0, Status::Ok);
}

#[test]
fn a_new_map_replaces_the_local_states_only_when_its_record_moved_on() {
    let topology = testkit::default_topology_with("replicas = 2");
    let mut core = replicated();
    let pa1 = index(&core, "PA.1");
    send(
        &mut core,
        |c| Repr::write(pmem(c, "PA.1", 0), key(c, "PA.1"), &[1; 8]),
        1,
    );
    let (sent, _, _) = split(core.take_outbox());
    core.link_down(sent[1].link);
    core.copy_marked(pa1, &"B".into(), Instant::now());
    answer(&mut core, &sent[0], Status::Ok, 0);
    core.take_outbox();
    let b = sent[1].link;
    bring_up_with_server_keys(&mut core, b);
    let write_targets = |core: &mut Forwarder| {
        send(
            core,
            |c| Repr::write(pmem(c, "PA.1", 0), key(c, "PA.1"), &[1; 8]),
            2,
        );
        let (sent, _, _) = split(core.take_outbox());
        sent.len()
    };
    // The same file again (version 1): the copy stays offline here.
    core.reload(DeviceMap::new(&topology, &"A".into()).unwrap());
    assert_eq!(write_targets(&mut core), 1);
    // The map in etcd marked it offline, then brought it back (version 3).
    let mut records = control::replica_state::initial(&topology);
    let record = records.iter_mut().find(|r| r.region == "PA.1").unwrap();
    record.version = 3;
    core.reload(
        DeviceMap::new(&topology, &"A".into())
            .unwrap()
            .with_replica_states(&records),
    );
    assert_eq!(write_targets(&mut core), 2);
}

#[test]
fn a_server_that_goes_away_loses_its_copies_of_owned_regions_at_once() {
    let mut core = replicated();
    let b_links: Vec<LinkId> = core
        .links()
        .filter(|(_, k)| k.server.as_str() == "B")
        .map(|(id, _)| id)
        .collect();
    for link in &b_links {
        core.link_down(*link);
    }
    let (_, _, mut lost) = split(core.take_outbox());
    lost.sort();
    // A owns PA.1 (backup on B) and PB.1 (primary on B); PA.2 and PB.2 are
    // device B's to mark.
    let expected = [
        (index(&core, "PA.1"), "B".to_owned()),
        (index(&core, "PB.1"), "B".to_owned()),
    ];
    assert_eq!(lost, expected);
    // PB.1's deciding copy is now server A's: an atomic goes there.
    send(&mut core, |c| compare_swap(c, "PB.1", 0, 1), 2);
    let (sent, _, _) = split(core.take_outbox());
    assert_eq!(sent[0].link, link(&core, "A", "n0"));
}

#[test]
fn a_server_never_reached_loses_nothing_until_a_write_needs_it() {
    let topology = testkit::default_topology_with("replicas = 2");
    let mut core = core_with(&topology, ForwarderConfig::default());
    let ids: Vec<LinkId> = core.links().map(|(id, _)| id).collect();
    for id in ids {
        match core.link_target(id).unwrap().server.as_str() {
            "A" => bring_up_with_server_keys(&mut core, id),
            _ => {
                core.link_down(id);
            }
        }
    }
    hello(&mut core, 1, "c1");
    assert!(
        core.take_outbox().is_empty(),
        "no copy lost without traffic"
    );
    send(
        &mut core,
        |c| Repr::write(pmem(c, "PA.1", 0), key(c, "PA.1"), &[1; 8]),
        3,
    );
    let (sent, _, lost) = split(core.take_outbox());
    assert_eq!(lost, [(index(&core, "PA.1"), "B".to_owned())]);
    assert_eq!(sent.len(), 1, "written on server A alone");
}

/// The links of `server`'s NICs.
pub(super) fn links_of(core: &Forwarder, server: &str) -> Vec<LinkId> {
    core.links()
        .filter(|(_, k)| k.server.as_str() == server)
        .map(|(id, _)| id)
        .collect()
}

#[test]
fn a_new_map_while_the_primary_is_down_keeps_the_clients_key_working_on_the_backup() {
    let topology = testkit::default_topology_with("replicas = 2");
    let mut core = replicated();
    let pa1 = index(&core, "PA.1");
    let client_key = key(&core, "PA.1");
    assert_eq!(client_key, key_on("A", pa1));
    for link in links_of(&core, "A") {
        core.link_down(link);
    }
    core.copy_marked(pa1, &"A".into(), Instant::now());
    core.take_outbox();
    // The map moves on (the copy marked offline there): the device cannot
    // ask server A for its keys again.
    let mut records = control::replica_state::initial(&topology);
    let record = records.iter_mut().find(|r| r.region == "PA.1").unwrap();
    record.version = 2;
    record.copies[0].state = control::ReplicaState::Offline;
    core.reload(
        DeviceMap::new(&topology, &"A".into())
            .unwrap()
            .with_replica_states(&records),
    );
    assert_eq!(key(&core, "PA.1"), client_key, "the primary's key is kept");
    send(
        &mut core,
        |c| Repr::write(pmem(c, "PA.1", 0), client_key, &[7; 8]),
        3,
    );
    let (sent, _, _) = split(core.take_outbox());
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].link, link(&core, "B", "n0"));
    assert_eq!(sent[0].key, key_on("B", pa1), "the backup's own key");
}

#[test]
fn a_device_that_never_learnt_the_primarys_key_gives_clients_a_serving_copys() {
    let topology = testkit::default_topology_with("replicas = 2");
    let mut core = core_with(&topology, ForwarderConfig::default());
    let pa1 = index(&core, "PA.1");
    // Server A never answers; the map says its copy of PA.1 is offline.
    let mut records = control::replica_state::initial(&topology);
    let record = records.iter_mut().find(|r| r.region == "PA.1").unwrap();
    record.version = 2;
    record.copies[0].state = control::ReplicaState::Offline;
    core.reload(
        DeviceMap::new(&topology, &"A".into())
            .unwrap()
            .with_replica_states(&records),
    );
    for link in links_of(&core, "B") {
        bring_up_with_server_keys(&mut core, link);
    }
    hello(&mut core, 1, "c1");
    let frame = Message::MapRequest.encode_to_vec(9).unwrap();
    let ClientAction::Reply(reply) = core.client_frame(1, &frame, Instant::now()) else {
        panic!("the MAP is answered");
    };
    let (Message::Map(map), _) = proto::parse_frame(reply.as_bytes()).unwrap() else {
        panic!("a MAP");
    };
    let given = map.entries.iter().find(|e| e.region == pa1).unwrap().key;
    assert_eq!(given, key_on("B", pa1));
    send(
        &mut core,
        |c| Repr::write(pmem(c, "PA.1", 0), given, &[7; 8]),
        4,
    );
    let (sent, _, _) = split(core.take_outbox());
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].key, key_on("B", pa1));
}

#[test]
fn requests_overlapping_a_block_a_resync_holds_wait_until_it_is_released() {
    let mut core = replicated();
    let region = index(&core, "PB.1").0;
    let block = 64 << 10;
    assert!(core.hold_for_resync(region, 0, block));
    // Overlapping the held block: waits, the read behind the write.
    send(
        &mut core,
        |c| Repr::write(pmem(c, "PB.1", 60), key(c, "PB.1"), &[1; 8]),
        4,
    );
    send(
        &mut core,
        |c| Repr::read(pmem(c, "PB.1", 64), key(c, "PB.1"), 8),
        5,
    );
    assert!(core.take_outbox().is_empty(), "both wait for the hold");
    // The next block is not held.
    send(
        &mut core,
        |c| Repr::write(pmem(c, "PB.1", block + 8), key(c, "PB.1"), &[2; 8]),
        6,
    );
    let (elsewhere, _, _) = split(core.take_outbox());
    assert_eq!(elsewhere.len(), 2, "to both copies at once");
    assert!(elsewhere.iter().all(|s| s.offset == block + 8));

    // Released (the resync's write is queued): the waiting requests go,
    // in their order.
    core.release_resync_hold(region, 0, block, Instant::now());
    let (sent, _, _) = split(core.take_outbox());
    let a = link(&core, "A", "n0");
    let b = link(&core, "B", "n0");
    let order: Vec<(LinkId, Operation, u64)> = sent
        .iter()
        .map(|s| (s.link, s.operation, s.offset))
        .collect();
    assert_eq!(
        order,
        [
            (b, Operation::Write, 60),
            (a, Operation::Write, 60),
            (b, Operation::Read, 64),
        ]
    );
    // A region that is not replicated here holds nothing.
    assert!(!core.hold_for_resync(u32::MAX, 0, block));
}

/// The keys a server gave for its copies are what a link's queue pair to
/// that server checks: each copy's own.
#[test]
fn each_servers_copy_keys_are_the_ones_it_gave() {
    let core = replicated();
    let (pa1, pb1) = (index(&core, "PA.1"), index(&core, "PB.1"));
    let on = |server: &str, region: RegionIndex| core.copy_key_on(region.0, &server.into());
    assert_eq!(on("B", pa1), Some(key_on("B", pa1)));
    assert_eq!(on("B", pb1), Some(key_on("B", pb1)));
    assert_eq!(on("A", pa1), Some(key_on("A", pa1)));
    assert_ne!(key_on("A", pa1), key_on("B", pa1));
}

#[test]
fn a_map_that_drops_a_copy_leaves_the_other_copies_of_requests_in_flight_alone() {
    let mut core = replicated();
    let client_key = key(&core, "PA.1");
    send(
        &mut core,
        |c| Repr::write(pmem(c, "PA.1", 0), client_key, &[5; 8]),
        6,
    );
    let (sent, _, _) = split(core.take_outbox());
    let servers: Vec<String> = sent
        .iter()
        .map(|s| core.link_target(s.link).unwrap().server.to_string())
        .collect();
    assert_eq!(servers, ["A", "B"], "to both copies, A's first");
    // The map drops B's copy (a drain moved it) while the write is in
    // flight: PA.1 is a single copy again, on A.
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../configs/default.toml"
    ))
    .unwrap()
    .replace("name = \"default\"", "name = \"default\"\nreplicas = 2")
    .replace("id = \"PA.1\"\n", "id = \"PA.1\"\n      replicas = []\n");
    let single =
        Topology::from_toml_str("default.toml", &text, &EnvOverrides::None).expect("valid");
    core.reload(DeviceMap::new(&single, &"A".into()).unwrap());
    // B's link breaks with its part in flight: that concerns no copy of
    // PA.1 any more, and fails nothing.
    core.link_down(sent[1].link);
    let (_, answers, lost) = split(core.take_outbox());
    assert_eq!(lost, [], "no copy lost");
    assert!(answers.is_empty(), "A has not answered yet: {answers:?}");
    answer(&mut core, &sent[0], Status::Ok, 0);
    let (_, answers, lost) = split(core.take_outbox());
    assert_eq!(lost, []);
    assert_eq!(answers.len(), 1);
    assert_eq!(answered(&answers[0].1), (Status::Ok, 0, 6));
}
