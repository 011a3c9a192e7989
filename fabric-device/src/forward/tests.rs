//! The forwarding core on a virtual clock: routing, lanes, parking,
//! client admission, timeouts, links, reloads and region keys.

use std::time::Instant;

use proto::frame::Header;
use proto::hello::{self, Capabilities, Role};
use proto::map;
use proto::request::{Repr, Target};
use proto::response;
use topology::{AccessKey, EnvOverrides, PmemAddr, RegionIndex, RegionOffset, Topology};

use super::links::LINK_OPENING;
use super::routing::BULK_MIN_BYTES;
use super::*;
use crate::ids::Lane;
use crate::link_tags::KEY_REFRESH_TAG;

pub(super) fn topology() -> Topology {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/default.toml");
    Topology::load_with(path, &EnvOverrides::None).unwrap()
}

pub(super) fn core_with(topology: &Topology, config: ForwarderConfig) -> Forwarder {
    let map = DeviceMap::new(topology, &"A".into()).unwrap();
    let metrics = Arc::new(DeviceMetrics::new(Arc::new(telemetry::Registry::new())).unwrap());
    Forwarder::new(map, config, metrics)
}

pub(super) fn core() -> Forwarder {
    core_with(&topology(), ForwarderConfig::default())
}

/// The main lane to `server`'s `nic`.
pub(super) fn link(core: &Forwarder, server: &str, nic: &str) -> LinkId {
    lane(core, server, nic, Lane::Main)
}

pub(super) fn lane(core: &Forwarder, server: &str, nic: &str, lane: Lane) -> LinkId {
    core.links()
        .find(|&(id, k)| {
            k.server.as_str() == server && k.nic.as_str() == nic && core.link_lane(id) == Some(lane)
        })
        .map(|(id, _)| id)
        .unwrap()
}

/// Completes a link's handshake as its server would.
pub(super) fn bring_up(core: &mut Forwarder, link: LinkId) {
    let server = core.link_key(link).unwrap().server.to_string();
    let sent = core.link_connected(link);
    assert!(!sent.is_empty());
    let hello = Message::Hello(hello::Repr {
        version: PROTOCOL_VERSION,
        role: Role::Server,
        capabilities: Capabilities::NONE,
        name: &server,
    })
    .encode_to_vec(LINK_OPENING.hello)
    .unwrap();
    assert!(matches!(
        core.link_frame(link, &hello, Instant::now()),
        LinkAction::Nothing
    ));
    let map = Message::Map(server_map(core, 0))
        .encode_to_vec(LINK_OPENING.map)
        .unwrap();
    assert!(matches!(
        core.link_frame(link, &map, Instant::now()),
        LinkAction::Nothing
    ));
    assert_eq!(core.link_status(link), Some(LinkStatus::Up));
}

/// The key the simulated servers give region `region` (after
/// `rotations` rotations).
pub(super) fn server_key(region: RegionIndex, rotations: u64) -> AccessKey {
    AccessKey(0x5EC0_0000 + (rotations << 16) + u64::from(region.0))
}

/// A server's MAP, with a key for every region (a real server gives
/// only its own; the device must take only those).
pub(super) fn server_map(core: &Forwarder, rotations: u64) -> map::Repr {
    let mut map = core.map().layout.to_map();
    for entry in &mut map.entries {
        entry.key = server_key(entry.region, rotations);
    }
    map
}

pub(super) fn all_up(core: &mut Forwarder) {
    let ids: Vec<LinkId> = core.links().map(|(id, _)| id).collect();
    for id in ids {
        bring_up(core, id);
    }
}

pub(super) fn hello(core: &mut Forwarder, conn: ConnId, name: &str) -> ClientAction<'static> {
    core.client_opened(conn);
    let frame = Message::Hello(hello::Repr {
        version: PROTOCOL_VERSION,
        role: Role::Client,
        capabilities: Capabilities::NONE,
        name,
    })
    .encode_to_vec(1)
    .unwrap();
    match core.client_frame(conn, &frame, Instant::now()) {
        ClientAction::Reply(r) => ClientAction::Reply(r),
        ClientAction::ReplyAndClose(r) => ClientAction::ReplyAndClose(r),
        other => panic!("HELLO answered with {other:?}"),
    }
}

pub(super) fn pmem(core: &Forwarder, region: &str, offset: u64) -> Target {
    let start = core.map().layout.entry_by_id(&region.into()).unwrap().start;
    Target::Pmem(PmemAddr(start.get() + offset))
}

pub(super) fn key(core: &Forwarder, region: &str) -> AccessKey {
    core.map().layout.entry_by_id(&region.into()).unwrap().key
}

/// Status and tag of an error reply.
pub(super) fn status_of(reply: &Reply) -> (Status, u64) {
    let (message, tag) = proto::parse_frame(reply.as_bytes()).unwrap();
    match message {
        Message::Response(r) => (r.status, tag),
        other => panic!("not a response: {other:?}"),
    }
}

pub(super) fn refused(action: ClientAction<'_>) -> Status {
    match action {
        ClientAction::Reply(reply) => status_of(&reply).0,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A response from a server to link tag `tag`.
pub(super) fn server_response(tag: u64, status: Status, data: &[u8]) -> Vec<u8> {
    let repr = if data.is_empty() {
        response::Repr::ack(status)
    } else {
        response::Repr::read_data(data)
    };
    Message::Response(repr).encode_to_vec(tag).unwrap()
}

#[test]
fn read_is_rewritten_to_region_offset_and_relayed_back() {
    let mut core = core();
    all_up(&mut core);
    hello(&mut core, 10, "c1");
    let req = Message::Request(Repr::read(pmem(&core, "PB.2", 100), key(&core, "PB.2"), 64))
        .encode_to_vec(7)
        .unwrap();
    let (link_id, head) = match core.client_frame(10, &req, Instant::now()) {
        ClientAction::Forward {
            link,
            head,
            payload,
        } => {
            assert!(payload.is_empty());
            (link, head)
        }
        other => panic!("{other:?}"),
    };
    // PB.2 is on server B's socket 1: the link to B's NIC n1.
    assert_eq!(link_id, link(&core, "B", "n1"));
    let (message, link_tag) = proto::parse_frame(&head).unwrap();
    let Message::Request(forwarded) = message else {
        panic!("{message:?}")
    };
    assert_eq!(
        forwarded.target,
        Target::Region(RegionOffset::new(RegionIndex(3), 100))
    );
    assert_eq!(forwarded.length, 64);
    assert_eq!(forwarded.key, key(&core, "PB.2"));

    assert_eq!(core.requests_in_flight(), 1);
    let data = [0xab; 64];
    let response = server_response(link_tag, Status::Ok, &data);
    match core.link_frame(link_id, &response, Instant::now()) {
        LinkAction::Deliver {
            conn,
            head,
            payload,
        } => {
            assert_eq!(core.requests_in_flight(), 0, "a drain may end now");
            assert_eq!(conn, 10);
            assert_eq!(payload, &data);
            let mut frame = head.to_vec();
            frame.extend_from_slice(payload);
            let (message, tag) = proto::parse_frame(&frame).unwrap();
            assert_eq!(tag, 7, "the client's own tag is restored");
            assert!(matches!(message, Message::Response(r) if r.status == Status::Ok));
        }
        other => panic!("{other:?}"),
    }
    // Answered once: a duplicate response is dropped.
    assert!(matches!(
        core.link_frame(link_id, &response, Instant::now()),
        LinkAction::Nothing
    ));
}

#[test]
fn write_payload_is_relayed_untouched() {
    let mut core = core();
    all_up(&mut core);
    hello(&mut core, 1, "c2");
    let data: Vec<u8> = (0..=255).collect();
    let req = Message::Request(Repr::write(
        pmem(&core, "PA.1", 4096),
        key(&core, "PA.1"),
        &data,
    ))
    .encode_to_vec(3)
    .unwrap();
    match core.client_frame(1, &req, Instant::now()) {
        ClientAction::Forward { head, payload, .. } => {
            assert_eq!(payload, &data[..]);
            assert_eq!(
                payload.as_ptr(),
                req[FORWARD_HEAD_LEN..].as_ptr(),
                "not copied"
            );
            let mut frame = head.to_vec();
            frame.extend_from_slice(payload);
            assert!(proto::parse_frame(&frame).is_ok());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn large_requests_take_the_bulk_lane_and_small_ones_the_main_lane() {
    let mut core = core();
    all_up(&mut core);
    hello(&mut core, 1, "c1");
    let send = |core: &mut Forwarder, req: Repr<'_>| {
        let frame = Message::Request(req).encode_to_vec(9).unwrap();
        match core.client_frame(1, &frame, Instant::now()) {
            ClientAction::Forward { link, .. } => link,
            other => panic!("{other:?}"),
        }
    };
    let (at, k) = (pmem(&core, "PB.2", 0), key(&core, "PB.2"));
    let big = vec![7u8; BULK_MIN_BYTES as usize];
    let main = lane(&core, "B", "n1", Lane::Main);
    let bulk = lane(&core, "B", "n1", Lane::Bulk);
    assert_eq!(send(&mut core, Repr::read(at, k, 64)), main);
    assert_eq!(send(&mut core, Repr::write(at, k, &big[1..])), main);
    assert_eq!(send(&mut core, Repr::fetch_add(at, k, 1)), main);
    assert_eq!(send(&mut core, Repr::write_persist(at, k, &big)), bulk);
    assert_eq!(
        send(&mut core, Repr::read(at, k, BULK_MIN_BYTES as u32)),
        bulk
    );
    // Without its bulk lane a large request takes the main one.
    core.link_down(bulk);
    core.link_down(lane(&core, "B", "n0", Lane::Bulk));
    assert_eq!(send(&mut core, Repr::write(at, k, &big)), main);
}

#[test]
fn falls_back_to_the_other_socket_then_to_server_unavailable() {
    let mut core = core();
    all_up(&mut core);
    hello(&mut core, 1, "c1");
    let read = |core: &Forwarder| {
        Message::Request(Repr::read(pmem(core, "PB.2", 0), key(core, "PB.2"), 8))
            .encode_to_vec(5)
            .unwrap()
    };
    let same_socket = link(&core, "B", "n1");
    let other_socket = link(&core, "B", "n0");
    core.link_down(same_socket);
    let req = read(&core);
    match core.client_frame(1, &req, Instant::now()) {
        ClientAction::Forward { link, .. } => assert_eq!(link, other_socket),
        other => panic!("{other:?}"),
    }
    core.link_down(other_socket);
    // Then the bulk lanes carry small requests too.
    let bulk = lane(&core, "B", "n1", Lane::Bulk);
    let req = read(&core);
    match core.client_frame(1, &req, Instant::now()) {
        ClientAction::Forward { link, .. } => assert_eq!(link, bulk),
        other => panic!("{other:?}"),
    }
    core.link_down(bulk);
    core.link_down(lane(&core, "B", "n0", Lane::Bulk));
    let req = read(&core);
    assert_eq!(
        refused(core.client_frame(1, &req, Instant::now())),
        Status::ServerUnavailable
    );
    // Server A is unaffected.
    let req = Message::Request(Repr::read(pmem(&core, "PA.1", 0), key(&core, "PA.1"), 8))
        .encode_to_vec(6)
        .unwrap();
    assert!(matches!(
        core.client_frame(1, &req, Instant::now()),
        ClientAction::Forward { .. }
    ));
}

#[test]
fn requests_wait_for_links_still_on_their_first_attempt() {
    let mut core = core();
    hello(&mut core, 1, "c1");
    let t0 = Instant::now();
    let req = Message::Request(Repr::read(pmem(&core, "PA.1", 0), key(&core, "PA.1"), 8))
        .encode_to_vec(7)
        .unwrap();
    assert!(matches!(
        core.client_frame(1, &req, t0),
        ClientAction::Nothing
    ));
    assert!(core.take_unparked().is_empty(), "no link up yet");
    assert!(
        core.poll_timeout().is_some(),
        "the parked request has a deadline"
    );
    all_up(&mut core);
    let unparked = core.take_unparked();
    assert_eq!(unparked, vec![(1, req.clone())]);
    assert!(matches!(
        core.client_frame(1, &unparked[0].1, t0),
        ClientAction::Forward { .. }
    ));
}

#[test]
fn parked_requests_fail_when_the_first_attempt_fails_or_time_runs_out() {
    let mut core = core();
    hello(&mut core, 1, "c1");
    let t0 = Instant::now();
    let read = |core: &Forwarder, region: &str, tag| {
        Message::Request(Repr::read(pmem(core, region, 0), key(core, region), 8))
            .encode_to_vec(tag)
            .unwrap()
    };
    let (a, b) = (read(&core, "PA.1", 1), read(&core, "PB.2", 2));
    assert!(matches!(
        core.client_frame(1, &a, t0),
        ClientAction::Nothing
    ));
    assert!(matches!(
        core.client_frame(1, &b, t0),
        ClientAction::Nothing
    ));
    // Server A's links both fail their first connect: its request is
    // refused, server B's keeps waiting.
    for nic in ["n0", "n1"] {
        let id = link(&core, "A", nic);
        core.link_down(id);
    }
    let unparked = core.take_unparked();
    assert_eq!(unparked.len(), 1);
    assert_eq!(
        refused(core.client_frame(1, &unparked[0].1, t0)),
        Status::ServerUnavailable
    );
    // Now a request for A fails at once: A is no longer starting.
    assert_eq!(
        refused(core.client_frame(1, &a, t0)),
        Status::ServerUnavailable
    );
    let late = t0 + ForwarderConfig::default().request_timeout;
    let (replies, _) = core.handle_timeouts(late);
    let statuses: Vec<_> = replies.iter().map(|(_, r)| status_of(r)).collect();
    assert_eq!(statuses, vec![(Status::Timeout, 2)]);
    assert_eq!(core.poll_timeout(), None);
}

/// The HELLO refusal counter for `reason`.
fn hello_refusals(core: &Forwarder, reason: &str) -> u64 {
    core.metrics.hello_refused.with(&[reason]).get()
}

#[test]
fn a_connection_keeps_the_identity_of_its_first_hello() {
    let mut core = core();
    all_up(&mut core);
    assert!(matches!(hello(&mut core, 1, "c1"), ClientAction::Reply(_)));
    // Saying the same name again is harmless.
    let again = Message::Hello(hello::Repr {
        version: PROTOCOL_VERSION,
        role: Role::Client,
        capabilities: Capabilities::NONE,
        name: "c1",
    })
    .encode_to_vec(2)
    .unwrap();
    assert!(matches!(
        core.client_frame(1, &again, Instant::now()),
        ClientAction::Reply(_)
    ));
    // Another client's name closes the connection; the session keeps c1.
    let switch = Message::Hello(hello::Repr {
        version: PROTOCOL_VERSION,
        role: Role::Client,
        capabilities: Capabilities::NONE,
        name: "c2",
    })
    .encode_to_vec(3)
    .unwrap();
    match core.client_frame(1, &switch, Instant::now()) {
        ClientAction::ReplyAndClose(reply) => {
            assert_eq!(status_of(&reply), (Status::UnknownClient, 3));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(core.session_client(1), Some("c1"));
    assert_eq!(hello_refusals(&core, "identity_switch"), 1);
}

#[test]
fn a_client_gets_at_most_its_share_of_connections() {
    let mut core = core_with(
        &topology(),
        ForwarderConfig {
            max_connections_per_client: 2,
            ..ForwarderConfig::default()
        },
    );
    all_up(&mut core);
    for conn in [1, 2] {
        assert!(matches!(
            hello(&mut core, conn, "c1"),
            ClientAction::Reply(_)
        ));
    }
    match hello(&mut core, 3, "c1") {
        ClientAction::ReplyAndClose(reply) => assert_eq!(status_of(&reply).0, Status::Busy),
        other => panic!("{other:?}"),
    }
    assert_eq!(hello_refusals(&core, "connections_per_client"), 1);
    // Other clients are not affected; a closed connection frees a place.
    assert!(matches!(hello(&mut core, 4, "c2"), ClientAction::Reply(_)));
    core.client_closed(1);
    assert!(matches!(hello(&mut core, 5, "c1"), ClientAction::Reply(_)));
}

#[test]
fn unknown_clients_and_addresses_are_refused() {
    let mut core = core();
    all_up(&mut core);
    match hello(&mut core, 1, "intruder") {
        ClientAction::ReplyAndClose(reply) => {
            assert_eq!(status_of(&reply), (Status::UnknownClient, 1));
        }
        other => panic!("{other:?}"),
    }
    // Requests before an accepted HELLO are refused too.
    let req = Message::Request(Repr::read(pmem(&core, "PA.1", 0), AccessKey::NONE, 8))
        .encode_to_vec(2)
        .unwrap();
    assert_eq!(
        refused(core.client_frame(1, &req, Instant::now())),
        Status::UnknownClient
    );

    hello(&mut core, 2, "c1");
    let end = core.map().layout.entries_by_address().last().unwrap().end();
    for target in [
        Target::Pmem(PmemAddr(0)),
        Target::Pmem(PmemAddr(end)),
        Target::Region(RegionOffset::new(RegionIndex(99), 0)),
        Target::Region(RegionOffset::new(RegionIndex(0), 64 << 20)),
    ] {
        let req = Message::Request(Repr::read(target, AccessKey::NONE, 8))
            .encode_to_vec(3)
            .unwrap();
        assert_eq!(
            refused(core.client_frame(2, &req, Instant::now())),
            Status::Unmapped,
            "{target:?}"
        );
    }
}

#[test]
fn lost_requests_time_out_and_late_answers_are_dropped() {
    let mut core = core_with(
        &topology(),
        ForwarderConfig {
            request_timeout: Duration::from_millis(100),
            max_in_flight_per_client: 8,
            ..ForwarderConfig::default()
        },
    );
    all_up(&mut core);
    hello(&mut core, 1, "c1");
    let start = Instant::now();
    let req = Message::Request(Repr::flush(pmem(&core, "PA.2", 0), key(&core, "PA.2"), 64))
        .encode_to_vec(44)
        .unwrap();
    let (link_id, link_tag) = match core.client_frame(1, &req, start) {
        ClientAction::Forward { link, head, .. } => (link, proto::parse_frame(&head).unwrap().1),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        core.poll_timeout(),
        Some(start + Duration::from_millis(100))
    );
    assert!(
        core.handle_timeouts(start + Duration::from_millis(99))
            .0
            .is_empty()
    );
    let (expired, silent) = core.handle_timeouts(start + Duration::from_millis(100));
    assert_eq!(silent, vec![link_id], "the silent link is reported");
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].0, 1);
    assert_eq!(status_of(&expired[0].1), (Status::Timeout, 44));
    assert_eq!(core.poll_timeout(), None);
    let late = server_response(link_tag, Status::Ok, &[]);
    assert!(matches!(
        core.link_frame(link_id, &late, start),
        LinkAction::Nothing
    ));
}

#[test]
fn a_broken_link_fails_its_requests_at_once() {
    let mut core = core();
    all_up(&mut core);
    hello(&mut core, 1, "c1");
    hello(&mut core, 2, "c2");
    let mut tags = Vec::new();
    for (conn, tag) in [(1, 100), (2, 200), (1, 101)] {
        let req = Message::Request(Repr::fetch_add(
            pmem(&core, "PA.1", 8),
            key(&core, "PA.1"),
            1,
        ))
        .encode_to_vec(tag)
        .unwrap();
        match core.client_frame(conn, &req, Instant::now()) {
            ClientAction::Forward { link, .. } => tags.push(link),
            other => panic!("{other:?}"),
        }
    }
    assert!(tags.iter().all(|l| *l == tags[0]), "same region, same link");
    let mut failed: Vec<(ConnId, (Status, u64))> = core
        .link_down(tags[0])
        .iter()
        .map(|(conn, reply)| (*conn, status_of(reply)))
        .collect();
    failed.sort_by_key(|(_, (_, tag))| *tag);
    assert_eq!(
        failed,
        vec![
            (1, (Status::ServerUnavailable, 100)),
            (1, (Status::ServerUnavailable, 101)),
            (2, (Status::ServerUnavailable, 200)),
        ]
    );
    assert_eq!(core.poll_timeout(), None, "their deadlines are gone too");
}

#[test]
fn responses_from_two_servers_return_out_of_order_to_many_clients() {
    let mut core = core();
    all_up(&mut core);
    let mut sent = Vec::new();
    for conn in 0..4u64 {
        hello(&mut core, conn, if conn % 2 == 0 { "c1" } else { "c2" });
        for (i, region) in ["PA.1", "PB.1"].iter().enumerate() {
            let tag = conn * 10 + i as u64;
            let req = Message::Request(Repr::read(pmem(&core, region, 0), key(&core, region), 8))
                .encode_to_vec(tag)
                .unwrap();
            match core.client_frame(conn, &req, Instant::now()) {
                ClientAction::Forward { link, head, .. } => {
                    sent.push((link, proto::parse_frame(&head).unwrap().1, conn, tag));
                }
                other => panic!("{other:?}"),
            }
        }
    }
    let mut link_tags: Vec<(LinkId, u64)> = sent.iter().map(|s| (s.0, s.1)).collect();
    link_tags.sort();
    link_tags.dedup();
    assert_eq!(link_tags.len(), sent.len(), "tags are unique per link");
    // Answer in reverse order.
    for (link_id, link_tag, conn, tag) in sent.into_iter().rev() {
        let response = server_response(link_tag, Status::Ok, &[tag as u8; 8]);
        match core.link_frame(link_id, &response, Instant::now()) {
            LinkAction::Deliver {
                conn: to,
                head,
                payload,
            } => {
                assert_eq!(to, conn);
                assert_eq!(payload, &[tag as u8; 8]);
                let tag_back = frame::Packet::new_unchecked(&head[..]).tag();
                assert_eq!(tag_back, tag);
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn exactly_once_requests_carry_the_clients_own_number() {
    let mut core = core();
    all_up(&mut core);
    hello(&mut core, 1, "c2");
    let req = Message::Request(
        Repr::fetch_add(pmem(&core, "PA.1", 0), key(&core, "PA.1"), 1).with_exactly_once(999, 5),
    )
    .encode_to_vec(1)
    .unwrap();
    match core.client_frame(1, &req, Instant::now()) {
        ClientAction::Forward { head, .. } => {
            let (Message::Request(fwd), _) = proto::parse_frame(&head).unwrap() else {
                panic!()
            };
            let once = fwd.exactly_once.unwrap();
            assert_eq!((once.client, once.seq), (1, 5), "c2 is client number 1");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn allow_lists_are_enforced_before_any_server_sees_the_request() {
    let mut t = topology();
    t.clients[0].allow = vec![topology::AllowRange {
        region: "PA.2".into(),
        offset: topology::ByteSize(0),
        size: Some(topology::ByteSize(1 << 20)),
        access: topology::Access::ReadWrite,
    }];
    let mut core = core_with(&t, ForwarderConfig::default());
    all_up(&mut core);
    hello(&mut core, 1, "c1");
    let inside = Message::Request(Repr::read(pmem(&core, "PA.2", 4096), key(&core, "PA.2"), 8))
        .encode_to_vec(1)
        .unwrap();
    assert!(matches!(
        core.client_frame(1, &inside, Instant::now()),
        ClientAction::Forward { .. }
    ));
    for (region, offset, len) in [("PA.1", 0, 8), ("PA.2", (1 << 20) - 4, 8)] {
        let req = Message::Request(Repr::read(
            pmem(&core, region, offset),
            key(&core, region),
            len,
        ))
        .encode_to_vec(2)
        .unwrap();
        assert_eq!(
            refused(core.client_frame(1, &req, Instant::now())),
            Status::AccessDenied
        );
    }
    // Region-addressed requests are held to the same ranges.
    let region_read = |region: &str, offset: u64| {
        let index = core.map.layout.entry_by_id(&region.into()).unwrap().region;
        Message::Request(Repr::read(
            Target::Region(RegionOffset::new(index, offset)),
            key(&core, region),
            8,
        ))
        .encode_to_vec(3)
        .unwrap()
    };
    let (inside, outside) = (region_read("PA.2", 4096), region_read("PA.1", 0));
    assert!(matches!(
        core.client_frame(1, &inside, Instant::now()),
        ClientAction::Forward { .. }
    ));
    assert_eq!(
        refused(core.client_frame(1, &outside, Instant::now())),
        Status::AccessDenied
    );
}

#[test]
fn reply_bytes_on_the_way_are_bounded_per_client_and_in_total() {
    let mut core = core_with(
        &topology(),
        ForwarderConfig {
            max_reply_bytes_per_client: 3 << 20,
            max_reply_bytes_total: 5 << 20,
            ..ForwarderConfig::default()
        },
    );
    all_up(&mut core);
    hello(&mut core, 1, "c1");
    hello(&mut core, 2, "c2");
    let big_read = |core: &Forwarder, tag| {
        Message::Request(Repr::read(
            pmem(core, "PA.1", 0),
            key(core, "PA.1"),
            2 << 20,
        ))
        .encode_to_vec(tag)
        .unwrap()
    };
    // A client that never reads its answers: two 2 MiB READs pass
    // (the second while under 3 MiB), then it must wait.
    let mut sent = Vec::new();
    for tag in 1..=2 {
        assert!(core.client_has_room(1));
        match core.client_frame(1, &big_read(&core, tag), Instant::now()) {
            ClientAction::Forward { link, head, .. } => sent.push((link, head)),
            other => panic!("{other:?}"),
        }
    }
    assert!(!core.client_has_room(1), "4 MiB on the way for c1");
    // Another client still gets its share until the total is reached.
    assert!(core.client_has_room(2));
    assert!(matches!(
        core.client_frame(2, &big_read(&core, 9), Instant::now()),
        ClientAction::Forward { .. }
    ));
    assert!(!core.client_has_room(2), "6 MiB on the way in total");
    // An answer to c1 makes room again.
    let (link, head) = sent[0];
    let link_tag = frame::Header::parse(&head).unwrap().tag;
    let data = vec![0u8; 2 << 20];
    let answer = Message::Response(response::Repr::read_data(&data))
        .encode_to_vec(link_tag)
        .unwrap();
    assert!(matches!(
        core.link_frame(link, &answer, Instant::now()),
        LinkAction::Deliver { conn: 1, .. }
    ));
    assert!(core.client_has_room(1));
    assert!(core.client_has_room(2));
}

#[test]
fn in_flight_limit_applies_per_client() {
    let mut core = core_with(
        &topology(),
        ForwarderConfig {
            request_timeout: Duration::from_secs(1),
            max_in_flight_per_client: 2,
            ..ForwarderConfig::default()
        },
    );
    all_up(&mut core);
    hello(&mut core, 1, "c1");
    hello(&mut core, 2, "c2");
    let mut last = None;
    for tag in 0..2 {
        let req = Message::Request(Repr::read(pmem(&core, "PA.1", 0), key(&core, "PA.1"), 8))
            .encode_to_vec(tag)
            .unwrap();
        if let ClientAction::Forward { link, head, .. } = core.client_frame(1, &req, Instant::now())
        {
            last = Some((link, proto::parse_frame(&head).unwrap().1));
        }
    }
    assert!(!core.client_has_room(1));
    assert!(core.client_has_room(2), "other clients are not held back");
    let (link_id, link_tag) = last.unwrap();
    core.link_frame(
        link_id,
        &server_response(link_tag, Status::Ok, &[0; 8]),
        Instant::now(),
    );
    assert!(core.client_has_room(1));
}

#[test]
fn handshake_with_the_wrong_server_closes_the_link() {
    let mut core = core();
    let id = link(&core, "A", "n0");
    core.link_connected(id);
    let imposter = Message::Hello(hello::Repr {
        version: PROTOCOL_VERSION,
        role: Role::Server,
        capabilities: Capabilities::NONE,
        name: "B",
    })
    .encode_to_vec(LINK_OPENING.hello)
    .unwrap();
    assert!(matches!(
        core.link_frame(id, &imposter, Instant::now()),
        LinkAction::Close(_)
    ));

    // A server whose map disagrees (its region moved) is refused too.
    let id = link(&core, "A", "n1");
    core.link_connected(id);
    let hello = Message::Hello(hello::Repr {
        version: PROTOCOL_VERSION,
        role: Role::Server,
        capabilities: Capabilities::NONE,
        name: "A",
    })
    .encode_to_vec(LINK_OPENING.hello)
    .unwrap();
    core.link_frame(id, &hello, Instant::now());
    let mut theirs = core.map().layout.to_map();
    theirs.entries[0].len /= 2;
    let map = Message::Map(theirs)
        .encode_to_vec(LINK_OPENING.map)
        .unwrap();
    assert!(matches!(
        core.link_frame(id, &map, Instant::now()),
        LinkAction::Close(_)
    ));
    assert_ne!(core.link_status(id), Some(LinkStatus::Up));
}

#[test]
fn reload_adds_a_server_and_keeps_sessions_and_links() {
    let mut core = core();
    all_up(&mut core);
    hello(&mut core, 1, "c1");
    let before: Vec<LinkId> = core.links().map(|(id, _)| id).collect();

    let mut bigger = topology();
    let mut server = bigger.servers[1].clone();
    server.id = "C".into();
    server.admin = None;
    server.sockets[0].devices[0].regions[0].id = "PC.1".into();
    server.sockets[1].devices[0].regions[0].id = "PC.2".into();
    for (i, nic) in server.nics.iter_mut().enumerate() {
        nic.listen = format!("127.0.1.{}:7000", 10 + i);
    }
    bigger.servers.push(server);
    for device in &mut bigger.fabric_devices {
        device.links.push(topology::FabricLink {
            server: "C".into(),
            nic: "n0".into(),
        });
    }
    let outcome = core.reload(DeviceMap::new(&bigger, &"A".into()).unwrap());
    assert_eq!(outcome.connect.len(), 2, "C's main and bulk lanes");
    assert!(outcome.disconnect.is_empty() && outcome.reconnect.is_empty());
    for id in &before {
        assert_eq!(
            core.link_status(*id),
            Some(LinkStatus::Up),
            "old links stay up"
        );
    }
    bring_up(&mut core, outcome.connect[0]);
    let req = Message::Request(Repr::read(pmem(&core, "PC.2", 0), key(&core, "PC.2"), 8))
        .encode_to_vec(1)
        .unwrap();
    match core.client_frame(1, &req, Instant::now()) {
        ClientAction::Forward { link, .. } => assert_eq!(link, outcome.connect[0]),
        other => panic!("the existing session uses the new region: {other:?}"),
    }
}

/// The keys in the MAP client `conn` gets.
fn client_keys(core: &mut Forwarder, conn: ConnId) -> Vec<AccessKey> {
    let request = Message::MapRequest.encode_to_vec(5).unwrap();
    match core.client_frame(conn, &request, Instant::now()) {
        ClientAction::Reply(reply) => match proto::parse_frame(reply.as_bytes()).unwrap() {
            (Message::Map(map), 5) => map.entries.iter().map(|e| e.key).collect(),
            other => panic!("not a MAP: {other:?}"),
        },
        other => panic!("MAP_REQUEST answered with {other:?}"),
    }
}

#[test]
fn keys_come_from_each_regions_own_server_and_go_to_granted_clients_only() {
    let mut t = topology();
    t.clients[0].allow = vec![topology::AllowRange {
        region: "PA.2".into(),
        offset: topology::ByteSize(0),
        size: Some(topology::ByteSize(1 << 20)),
        access: topology::Access::Read,
    }];
    let mut core = core_with(&t, ForwarderConfig::default());
    // Server A's links only: its MAP offers keys for B's regions too,
    // which the device must not take from it.
    let a = link(&core, "A", "n0");
    bring_up(&mut core, a);
    let index = |id: &str| core.map().layout.entry_by_id(&id.into()).unwrap().region;
    let (pa2, pb1) = (index("PA.2"), index("PB.1"));
    assert_eq!(key(&core, "PA.2"), server_key(pa2, 0));
    assert_eq!(
        key(&core, "PB.1"),
        AccessKey::NONE,
        "A has no say over B's keys"
    );

    // c1 may read part of PA.2 only: that key is all it gets.
    hello(&mut core, 1, "c1");
    let keys = client_keys(&mut core, 1);
    assert_eq!(keys[pa2.0 as usize], server_key(pa2, 0));
    assert_eq!(keys.iter().filter(|k| !k.is_none()).count(), 1, "{keys:?}");
    // c2 has no allow-list: it reaches B's regions, whose keys come
    // once B's links are up (they are still starting).
    hello(&mut core, 2, "c2");
    let request = Message::MapRequest.encode_to_vec(5).unwrap();
    assert!(matches!(
        core.client_frame(2, &request, Instant::now()),
        ClientAction::Nothing
    ));
    all_up(&mut core);
    assert_eq!(core.take_unparked().len(), 1);
    let keys = client_keys(&mut core, 2);
    assert_eq!(keys[pb1.0 as usize], server_key(pb1, 0));
    assert!(keys.iter().all(|k| !k.is_none()), "{keys:?}");
    // No session, no keys.
    core.client_opened(3);
    assert!(client_keys(&mut core, 3).iter().all(|k| k.is_none()));
}

#[test]
fn a_map_waits_while_a_reached_regions_key_is_still_coming() {
    let mut core = core();
    hello(&mut core, 1, "c1");
    let request = Message::MapRequest.encode_to_vec(9).unwrap();
    let t0 = Instant::now();
    assert!(matches!(
        core.client_frame(1, &request, t0),
        ClientAction::Nothing
    ));
    all_up(&mut core);
    let unparked = core.take_unparked();
    assert_eq!(unparked, vec![(1, request)]);
    match core.client_frame(1, &unparked[0].1, t0) {
        ClientAction::Reply(reply) => match proto::parse_frame(reply.as_bytes()).unwrap() {
            (Message::Map(map), 9) => {
                assert!(map.entries.iter().all(|e| e.key != AccessKey::NONE))
            }
            other => panic!("not a MAP: {other:?}"),
        },
        other => panic!("MAP_REQUEST answered with {other:?}"),
    }
}

#[test]
fn a_refusal_makes_the_device_learn_its_servers_keys_again() {
    let mut core = core();
    all_up(&mut core);
    hello(&mut core, 1, "c1");
    let region = core
        .map()
        .layout
        .entry_by_id(&"PA.1".into())
        .unwrap()
        .region;
    let stale = key(&core, "PA.1");
    let link_id = link(&core, "A", "n0");
    assert_eq!(core.key_refresh(link_id), None, "nothing refused yet");

    // The server refuses the old key (an operator rotated it).
    let req = Message::Request(Repr::read(pmem(&core, "PA.1", 0), stale, 8))
        .encode_to_vec(3)
        .unwrap();
    let (link_id, tag) = match core.client_frame(1, &req, Instant::now()) {
        ClientAction::Forward { link, head, .. } => (link, Header::parse(&head[..]).unwrap().tag),
        other => panic!("not forwarded: {other:?}"),
    };
    let denied = server_response(tag, Status::AccessDenied, &[]);
    assert!(matches!(
        core.link_frame(link_id, &denied, Instant::now()),
        LinkAction::Deliver { .. }
    ));
    let ask = core.key_refresh(link_id).expect("a MAP_REQUEST is due");
    let (message, tag) = proto::parse_frame(&ask).unwrap();
    assert_eq!((message, tag), (Message::MapRequest, KEY_REFRESH_TAG));
    assert_eq!(core.key_refresh(link_id), None, "asked once");

    let answer = Message::Map(server_map(&core, 1))
        .encode_to_vec(KEY_REFRESH_TAG)
        .unwrap();
    assert!(matches!(
        core.link_frame(link_id, &answer, Instant::now()),
        LinkAction::Nothing
    ));
    assert_eq!(key(&core, "PA.1"), server_key(region, 1));
    assert_eq!(
        client_keys(&mut core, 1)[region.0 as usize],
        server_key(region, 1)
    );
    assert_eq!(core.metrics.key_refreshes.get(), 1);
    // An answer nobody asked for breaks the link's protocol.
    assert!(matches!(
        core.link_frame(link_id, &answer, Instant::now()),
        LinkAction::Close(_)
    ));
}

#[test]
fn a_link_to_a_server_on_verbs_can_ask_for_its_keys_without_a_refusal() {
    let mut core = core();
    all_up(&mut core);
    let region = core
        .map()
        .layout
        .entry_by_id(&"PA.1".into())
        .unwrap()
        .region;
    let link_id = link(&core, "A", "n0");
    core.refresh_keys_soon(link_id);
    let ask = core.key_refresh(link_id).expect("a MAP_REQUEST is due");
    assert_eq!(core.metrics.key_polls.get(), 1);
    assert_eq!(
        core.metrics.key_refreshes.get(),
        0,
        "a poll is not a refusal"
    );
    assert_eq!(
        proto::parse_frame(&ask).unwrap(),
        (Message::MapRequest, KEY_REFRESH_TAG)
    );
    // While it is under way, asking again does not send another.
    core.refresh_keys_soon(link_id);
    assert_eq!(core.key_refresh(link_id), None);
    let answer = Message::Map(server_map(&core, 2))
        .encode_to_vec(KEY_REFRESH_TAG)
        .unwrap();
    assert!(matches!(
        core.link_frame(link_id, &answer, Instant::now()),
        LinkAction::Nothing
    ));
    assert_eq!(key(&core, "PA.1"), server_key(region, 2));
}
