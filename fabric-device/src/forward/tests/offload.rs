//! Which requests a link's RDMA queue pair carries, as the core decides it
//! ([`decide`], and the core's own output on a link with a queue pair up),
//! and RDMA completions answered as the server's responses.

use std::collections::HashMap;

use proto::qp::caps;
use proto::request::{ExactlyOnce, Operation, flags};
use proto::roce::rc::{RemoteAddr, WcStatus};

use super::replication::{index, key_on, replicated, split};
use super::*;
use crate::forward::{Offload, RequestFields, Step, decide};

const RKEY: u32 = 0x2ee;
const KEY: AccessKey = AccessKey(0x5eed);
const LEN: u64 = 1 << 20;
const ALL: u64 = caps::FLUSH_PERSISTENT | caps::ATOMIC_WRITE;

fn remote(va: u64) -> RemoteAddr {
    RemoteAddr { va, rkey: RKEY }
}

/// The fields of `req` forwarded with tag 9 to `offset` in region 0.
fn fields(req: &Repr<'_>, offset: u64) -> RequestFields {
    RequestFields::forwarded(req, RegionOffset::new(RegionIndex(0), offset), 9)
}

/// What `decide` says of `req` at `offset` in a region keyed [`KEY`], of
/// [`LEN`] bytes, on a queue pair that can do `caps`.
fn decided(req: &Repr<'_>, offset: u64, caps: u64) -> Option<(Step, Option<Step>)> {
    decide(&fields(req, offset), KEY, LEN, RKEY, caps).map(|o| {
        assert_eq!(o.tag, 9, "the link tag comes with it");
        (o.first, o.then)
    })
}

fn anywhere() -> Target {
    Target::Region(RegionOffset::new(RegionIndex(0), 0))
}

#[test]
fn each_operation_becomes_its_work_requests() {
    let read = Repr::read(anywhere(), KEY, 64);
    assert_eq!(
        decided(&read, 100, ALL),
        Some((
            Step::Read {
                remote: remote(100),
                len: 64
            },
            None
        ))
    );
    let write = Repr::write(anywhere(), KEY, b"data");
    let write_step = Step::Write { remote: remote(8) };
    assert_eq!(decided(&write, 8, ALL), Some((write_step, None)));
    // Persistent: then flushed, bytes and all.
    let flush_4 = Step::Flush {
        remote: remote(8),
        len: 4,
    };
    let persistent = Repr {
        persist: true,
        ..write
    };
    assert_eq!(
        decided(&persistent, 8, ALL),
        Some((write_step, Some(flush_4)))
    );
    let write_persist = Repr {
        operation: Operation::WritePersist,
        ..write
    };
    assert_eq!(
        decided(&write_persist, 8, ALL),
        Some((write_step, Some(flush_4)))
    );
    let flush = Repr::flush(anywhere(), KEY, 64);
    assert_eq!(
        decided(&flush, 0, ALL),
        Some((
            Step::Flush {
                remote: remote(0),
                len: 64
            },
            None
        ))
    );
    let store = Repr::atomic_write(anywhere(), KEY, 0x0102);
    let store_step = Step::AtomicWrite {
        remote: remote(64),
        value: 0x0102,
    };
    assert_eq!(decided(&store, 64, ALL), Some((store_step, None)));
    let durable_store = Repr {
        persist: true,
        ..store
    };
    assert_eq!(
        decided(&durable_store, 64, ALL),
        Some((
            store_step,
            Some(Step::Flush {
                remote: remote(64),
                len: 8
            })
        ))
    );
}

/// A server without FLUSH: a write is made durable by a READ of its last
/// byte, which its RNIC answers only once the write is placed.
#[test]
fn without_flush_durability_is_a_read_of_the_last_byte() {
    let write_persist = Repr {
        operation: Operation::WritePersist,
        ..Repr::write(anywhere(), KEY, b"data")
    };
    let last = Step::Read {
        remote: remote(8 + 3),
        len: 1,
    };
    assert_eq!(
        decided(&write_persist, 8, caps::ATOMIC_WRITE),
        Some((Step::Write { remote: remote(8) }, Some(last)))
    );
    let flush = Repr::flush(anywhere(), KEY, 64);
    assert_eq!(
        decided(&flush, 0, caps::ATOMIC_WRITE),
        Some((
            Step::Read {
                remote: remote(63),
                len: 1
            },
            None
        ))
    );
}

#[test]
fn atomic_write_goes_only_where_the_rnic_executes_it() {
    let store = Repr::atomic_write(anywhere(), KEY, 1);
    assert!(decided(&store, 64, ALL).is_some());
    assert_eq!(decided(&store, 64, caps::FLUSH_PERSISTENT), None);
}

#[test]
fn what_the_server_must_check_or_number_is_not_carried() {
    let read = Repr::read(anywhere(), KEY, 8);
    assert!(decided(&read, 0, ALL).is_some(), "the baseline goes");
    // Another key (an allocation's, or a wrong one): the server checks it.
    let other_key = Repr {
        key: AccessKey(1),
        ..read
    };
    assert_eq!(decided(&other_key, 0, ALL), None);
    // No key at all, even where the region has none either.
    let none = Repr {
        key: AccessKey::NONE,
        ..read
    };
    assert_eq!(
        decide(&fields(&none, 0), AccessKey::NONE, LEN, RKEY, ALL),
        None
    );
    // Exactly-once atomics: the server keeps their window; and so an
    // exactly-once store too.
    let cas = Repr {
        exactly_once: Some(ExactlyOnce::on_lane(0, 5)),
        ..Repr::compare_swap(anywhere(), KEY, 0, 1)
    };
    assert_eq!(decided(&cas, 64, ALL), None);
    let once = Repr {
        exactly_once: Some(ExactlyOnce::on_lane(0, 6)),
        ..Repr::atomic_write(anywhere(), KEY, 1)
    };
    assert_eq!(decided(&once, 64, ALL), None);
    // Atomics the server decides, even without exactly-once.
    assert_eq!(decided(&Repr::fetch_add(anywhere(), KEY, 1), 64, ALL), None);
    // A PMEM address the server translates.
    let mut by_address = fields(&read, 0);
    by_address.flags &= !flags::REGION_ADDRESSED;
    assert_eq!(decide(&by_address, KEY, LEN, RKEY, ALL), None);
}

#[test]
fn what_the_rnic_would_refuse_is_not_carried() {
    // Up to the region's last byte, and not one beyond.
    let read = Repr::read(anywhere(), KEY, 8);
    assert!(decided(&read, LEN - 8, ALL).is_some());
    assert_eq!(decided(&read, LEN - 7, ALL), None);
    assert_eq!(decided(&read, u64::MAX - 2, ALL), None, "no overflow");
    // An atomic off its 8-byte word.
    let store = Repr::atomic_write(anywhere(), KEY, 1);
    assert!(decided(&store, 64, ALL).is_some());
    assert_eq!(decided(&store, 65, ALL), None);
    // A write whose data is not its length.
    let write = Repr::write(anywhere(), KEY, b"data");
    let mut short = fields(&write, 0);
    short.payload_len = 3;
    assert_eq!(decide(&short, KEY, LEN, RKEY, ALL), None);
}

/// A READ of region PB.2, forwarded: its link, head and work requests.
fn forward_read(
    core: &mut Forwarder,
    tag: u64,
) -> (LinkId, [u8; FORWARD_HEAD_LEN], Option<Offload>) {
    let req = Message::Request(Repr::read(pmem(core, "PB.2", 100), key(core, "PB.2"), 64))
        .encode_to_vec(tag)
        .unwrap();
    match core.client_frame(10, &req, Instant::now()) {
        ClientAction::Forward {
            link, head, rdma, ..
        } => (link, head, rdma),
        other => panic!("{other:?}"),
    }
}

/// A core with every link up and client 10 in session; PB.2 (region 3)
/// is reached by the link to B's NIC n1.
fn up() -> (Forwarder, LinkId) {
    let mut core = core();
    all_up(&mut core);
    hello(&mut core, 10, "c1");
    let b = link(&core, "B", "n1");
    (core, b)
}

fn rkeys(region: u32) -> HashMap<u32, u32> {
    HashMap::from([(region, RKEY)])
}

#[test]
fn a_link_with_its_queue_pair_up_carries_the_request_as_rdma() {
    let (mut core, b) = up();
    // No queue pair: the TCP frame only.
    let (link, _, rdma) = forward_read(&mut core, 1);
    assert_eq!(link, b);
    assert_eq!(rdma, None);
    core.queue_pair_up(b, rkeys(3), ALL);
    let (link, head, rdma) = forward_read(&mut core, 2);
    assert_eq!(link, b);
    let link_tag = Header::parse(&head).unwrap().tag;
    assert_eq!(
        rdma,
        Some(Offload {
            tag: link_tag,
            first: Step::Read {
                remote: remote(100),
                len: 64
            },
            then: None,
        })
    );
    // Down again (refused, broken, closed): back to TCP.
    core.queue_pair_down(b);
    assert_eq!(forward_read(&mut core, 3).2, None);
    // And a link that went down forgets its queue pair.
    core.queue_pair_up(b, rkeys(3), ALL);
    assert!(forward_read(&mut core, 4).2.is_some());
    core.link_down(b);
    bring_up(&mut core, b);
    assert_eq!(forward_read(&mut core, 5).2, None);
}

#[test]
fn a_region_the_server_gave_no_rkey_for_stays_on_tcp() {
    let (mut core, b) = up();
    core.queue_pair_up(b, rkeys(2), ALL);
    assert_eq!(forward_read(&mut core, 1).2, None);
}

/// The key the request must carry is the one the server gave in its MAP,
/// and the core follows it when the keys are learnt again.
#[test]
fn the_key_checked_is_the_one_the_server_gave() {
    let (mut core, b) = up();
    core.queue_pair_up(b, rkeys(3), ALL);
    let stale = key(&core, "PB.2");
    assert!(forward_read(&mut core, 1).2.is_some());
    // The server's keys rotate; the device polls them on the link.
    core.refresh_keys_soon(b);
    assert!(core.key_refresh(b).is_some());
    let map = Message::Map(server_map(&core, 1))
        .encode_to_vec(KEY_REFRESH_TAG)
        .unwrap();
    core.link_frame(b, &map, Instant::now());
    assert_ne!(key(&core, "PB.2"), stale);
    let req = Message::Request(Repr::read(pmem(&core, "PB.2", 100), stale, 64))
        .encode_to_vec(2)
        .unwrap();
    match core.client_frame(10, &req, Instant::now()) {
        ClientAction::Forward { rdma, .. } => assert_eq!(rdma, None, "the old key"),
        other => panic!("{other:?}"),
    }
    assert!(forward_read(&mut core, 3).2.is_some(), "the new key");
}

/// A pool with an allocator keeps every request on the servers' CPUs,
/// where per-extent keys and record owners are checked.
#[test]
fn a_pool_with_an_allocator_never_goes_one_sided() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/alloc.toml");
    let topology = Topology::load_with(path, &EnvOverrides::None).unwrap();
    let mut core = core_with(&topology, ForwarderConfig::default());
    all_up(&mut core);
    hello(&mut core, 10, "c1");
    let b = link(&core, "B", "n1");
    core.queue_pair_up(b, rkeys(index(&core, "PB.2").0), ALL);
    let (link, _, rdma) = forward_read(&mut core, 1);
    assert_eq!(link, b);
    assert_eq!(rdma, None);
    assert!(!one_sided(&core.map().layout));
    assert!(one_sided(&super::core().map().layout));
}

/// Each copy of a replicated region has its own key on its own server:
/// the request to a copy goes as RDMA with that key, and an atomic decided
/// by a server's CPU never does.
#[test]
fn a_copy_goes_as_rdma_with_its_own_servers_key() {
    let mut core = replicated();
    let pa1 = index(&core, "PA.1");
    let links: Vec<LinkId> = core.links().map(|(id, _)| id).collect();
    for &l in &links {
        core.queue_pair_up(l, rkeys(pa1.0), ALL);
    }
    let key_a = key_on("A", pa1);
    assert_ne!(key_on("B", pa1), key_a);
    let write = Message::Request(Repr::write(pmem(&core, "PA.1", 64), key_a, b"copy"))
        .encode_to_vec(5)
        .unwrap();
    assert!(matches!(
        core.client_frame(1, &write, Instant::now()),
        ClientAction::Nothing
    ));
    let (sent, _, _) = split(core.take_outbox());
    assert_eq!(sent.len(), 2, "{sent:?}");
    let servers: Vec<String> = sent
        .iter()
        .map(|s| core.link_target(s.link).unwrap().server.to_string())
        .collect();
    assert!(servers.contains(&"A".into()) && servers.contains(&"B".into()));
    for s in &sent {
        let work = s.rdma.unwrap_or_else(|| panic!("not carried: {s:?}"));
        assert_eq!(work.tag, s.tag);
        assert!(matches!(work.first, Step::Write { remote } if remote.va == 64));
    }
    let cas = Message::Request(Repr::compare_swap(pmem(&core, "PA.1", 128), key_a, 0, 1))
        .encode_to_vec(6)
        .unwrap();
    core.client_frame(1, &cas, Instant::now());
    let (sent, _, _) = split(core.take_outbox());
    assert!(!sent.is_empty());
    assert!(sent.iter().all(|s| s.rdma.is_none()), "{sent:?}");
}

/// Forwards a READ over an RDMA queue pair and ends it with `outcome`:
/// what the client gets, as (client tag, status, data).
fn complete_read(outcome: Result<&[u8], WcStatus>) -> (u64, Status, Vec<u8>) {
    let (mut core, b) = up();
    core.queue_pair_up(b, rkeys(3), ALL);
    let (_, _, rdma) = forward_read(&mut core, 77);
    let tag = rdma.expect("carried").tag;
    assert_eq!(core.requests_in_flight(), 1);
    let answered = match core.rdma_completed(b, tag, outcome, Instant::now()) {
        LinkAction::Deliver {
            conn,
            head,
            payload,
        } => {
            assert_eq!(conn, 10);
            let mut frame = head.to_vec();
            frame.extend_from_slice(payload);
            let (message, tag) = proto::parse_frame(&frame).unwrap();
            let Message::Response(r) = message else {
                panic!("{message:?}")
            };
            (tag, r.status, r.payload.to_vec())
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(core.requests_in_flight(), 0);
    // Answered once.
    assert!(matches!(
        core.rdma_completed(b, tag, Ok(&[]), Instant::now()),
        LinkAction::Nothing
    ));
    answered
}

#[test]
fn a_completed_read_brings_its_data_to_the_client() {
    let data = [0xAB; 64];
    assert_eq!(complete_read(Ok(&data)), (77, Status::Ok, data.to_vec()));
}

#[test]
fn a_failed_work_request_answers_as_the_server_would_have() {
    assert_eq!(
        complete_read(Err(WcStatus::RemoteAccessError)).1,
        Status::OutOfBounds
    );
    assert_eq!(
        complete_read(Err(WcStatus::RemoteInvalidRequest)).1,
        Status::BadRequest
    );
    assert_eq!(
        complete_read(Err(WcStatus::RemoteOperationalError)).1,
        Status::IoError
    );
    assert_eq!(
        complete_read(Err(WcStatus::RetryExceeded)).1,
        Status::IoError
    );
    let (tag, status, data) = complete_read(Err(WcStatus::RemoteAccessError));
    assert_eq!(tag, 77);
    assert!(data.is_empty(), "{status}: no data");
}

/// A write's completion is an acknowledgement with no data.
#[test]
fn a_completed_write_is_acknowledged() {
    let (mut core, b) = up();
    core.queue_pair_up(b, rkeys(3), ALL);
    let req = Message::Request(Repr::write(
        pmem(&core, "PB.2", 0),
        key(&core, "PB.2"),
        b"w",
    ))
    .encode_to_vec(8)
    .unwrap();
    let ClientAction::Forward { rdma, .. } = core.client_frame(10, &req, Instant::now()) else {
        panic!("not forwarded");
    };
    let tag = rdma.expect("carried").tag;
    let LinkAction::Deliver { head, payload, .. } =
        core.rdma_completed(b, tag, Ok(&[]), Instant::now())
    else {
        panic!("no answer");
    };
    assert!(payload.is_empty());
    let (message, client_tag) = proto::parse_frame(&head).unwrap();
    assert_eq!(client_tag, 8);
    assert!(matches!(
        message,
        Message::Response(r) if r.status == Status::Ok && r.kind == response::ResponseKind::Acknowledge
    ));
}
