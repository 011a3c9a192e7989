use std::time::Instant;

use proto::request::Repr;
use proto::{Message, PmemAddr, Status, Target};

use super::super::links::LINK_OPENING;
use super::super::tests::{
    all_up, bring_up, core, hello, key, link, pmem, server_map, server_response,
};
use super::super::{ClientAction, ConnId, Forwarder, LinkAction, LinkStatus};
use crate::link_tags::MAP_EPOCH_TAG;

/// Status and value of a reply to a client.
fn answer(action: ClientAction<'_>) -> (Status, u64) {
    let ClientAction::Reply(reply) = action else {
        panic!("expected a reply, got {action:?}");
    };
    match proto::parse_frame(reply.as_bytes()).unwrap().0 {
        Message::Response(r) => (r.status, r.value),
        other => panic!("not a response: {other:?}"),
    }
}

/// A core at epoch `epoch` with every link up and client c1 on `conn`.
fn core_at(epoch: u64, conn: ConnId) -> Forwarder {
    let mut core = core();
    all_up(&mut core);
    core.set_epoch(epoch);
    hello(&mut core, conn, "c1");
    core
}

fn say_epoch(core: &mut Forwarder, conn: ConnId, epoch: u64) -> (Status, u64) {
    let frame = Message::MapEpoch(epoch).encode_to_vec(3).unwrap();
    answer(core.client_frame(conn, &frame, Instant::now()))
}

fn read_request(core: &Forwarder) -> Vec<u8> {
    Message::Request(Repr::read(pmem(core, "PA.1", 0), key(core, "PA.1"), 8))
        .encode_to_vec(9)
        .unwrap()
}

/// A READ of an address no map of this pool has (yet).
fn read_beyond_the_map(core: &Forwarder) -> Vec<u8> {
    let end = core
        .map()
        .layout
        .entries()
        .iter()
        .map(|e| e.start.get() + e.len)
        .max()
        .unwrap();
    let beyond = Target::Pmem(PmemAddr(end + (1 << 30)));
    Message::Request(Repr::read(beyond, key(core, "PA.1"), 8))
        .encode_to_vec(9)
        .unwrap()
}

#[test]
fn map_epoch_is_answered_with_the_devices_epoch() {
    let mut core = core_at(5, 1);
    assert_eq!(say_epoch(&mut core, 1, 4), (Status::StaleMap, 5));
    assert_eq!(say_epoch(&mut core, 1, 5), (Status::Ok, 5));
    assert_eq!(say_epoch(&mut core, 1, 6), (Status::Ok, 5));
}

#[test]
fn an_older_connection_is_refused_stale_map_and_nothing_is_forwarded() {
    let mut core = core_at(5, 1);
    say_epoch(&mut core, 1, 4);
    let request = read_request(&core);
    let refused = answer(core.client_frame(1, &request, Instant::now()));
    assert_eq!(
        refused,
        (Status::StaleMap, 5),
        "the device's epoch in the value"
    );
    assert_eq!(core.requests_in_flight(), 0, "nothing forwarded");
    assert_eq!(core.metrics.stale_map.get(), 1);
}

#[test]
fn equal_and_newer_connections_are_served() {
    for said in [5, 6] {
        let mut core = core_at(5, 1);
        say_epoch(&mut core, 1, said);
        let request = read_request(&core);
        assert!(
            matches!(
                core.client_frame(1, &request, Instant::now()),
                ClientAction::Forward { .. }
            ),
            "epoch {said} at a device on 5"
        );
    }
}

#[test]
fn a_newer_connection_gets_stale_map_for_an_address_the_device_lacks() {
    let mut core = core_at(5, 1);
    say_epoch(&mut core, 1, 6);
    let request = read_beyond_the_map(&core);
    assert_eq!(
        answer(core.client_frame(1, &request, Instant::now())),
        (Status::StaleMap, 5)
    );
    // At the device's own epoch the address is simply wrong.
    say_epoch(&mut core, 1, 5);
    assert_eq!(
        answer(core.client_frame(1, &request, Instant::now())).0,
        Status::Unmapped
    );
}

#[test]
fn unfenced_connections_are_served_as_before() {
    let mut core = core_at(5, 1);
    let request = read_request(&core);
    assert!(matches!(
        core.client_frame(1, &request, Instant::now()),
        ClientAction::Forward { .. }
    ));
    let unknown = read_beyond_the_map(&core);
    assert_eq!(
        answer(core.client_frame(1, &unknown, Instant::now())).0,
        Status::Unmapped
    );
    // Saying 0 (following no map) lifts a fence.
    say_epoch(&mut core, 1, 4);
    say_epoch(&mut core, 1, 0);
    assert!(matches!(
        core.client_frame(1, &request, Instant::now()),
        ClientAction::Forward { .. }
    ));
    assert_eq!(core.metrics.stale_map.get(), 0);
}

#[test]
fn an_exactly_once_atomic_refused_stale_is_forwarded_once_after_the_client_catches_up() {
    let mut core = core_at(5, 1);
    say_epoch(&mut core, 1, 4);
    let fetch_add = Message::Request(
        Repr::fetch_add(pmem(&core, "PA.1", 0), key(&core, "PA.1"), 1).with_exactly_once(0, 77),
    )
    .encode_to_vec(2)
    .unwrap();
    assert_eq!(
        answer(core.client_frame(1, &fetch_add, Instant::now())),
        (Status::StaleMap, 5)
    );
    assert_eq!(core.requests_in_flight(), 0);
    assert_eq!(say_epoch(&mut core, 1, 5), (Status::Ok, 5));
    let ClientAction::Forward { head, .. } = core.client_frame(1, &fetch_add, Instant::now())
    else {
        panic!("the retry is forwarded");
    };
    let (Message::Request(forwarded), _) = proto::parse_frame(&head).unwrap() else {
        panic!("not a request");
    };
    assert_eq!(forwarded.exactly_once.unwrap().seq, 77, "the same number");
    assert_eq!(core.requests_in_flight(), 1, "forwarded once");
}

#[test]
fn the_device_says_its_epoch_on_every_link_up_and_on_links_that_open() {
    let mut core = core();
    let a = link(&core, "A", "n0");
    bring_up(&mut core, a);
    assert!(core.set_epoch(0).is_empty(), "on a file: nothing to say");
    let said = core.set_epoch(3);
    assert_eq!(said.len(), 1, "only the link that is up");
    assert_eq!(said[0].0, a);
    let (message, tag) = proto::parse_frame(&said[0].1).unwrap();
    assert_eq!(
        (message.opcode(), tag),
        (proto::Opcode::MapEpoch, MAP_EPOCH_TAG)
    );
    assert!(matches!(message, Message::MapEpoch(3)));

    // A link opening later says it right after its handshake.
    let b = link(&core, "B", "n0");
    let server = "B";
    core.link_connected(b);
    let hello = Message::Hello(proto::hello::Repr {
        version: proto::PROTOCOL_VERSION,
        role: proto::hello::Role::Server,
        capabilities: proto::hello::Capabilities::NONE,
        name: server,
    })
    .encode_to_vec(LINK_OPENING.hello)
    .unwrap();
    core.link_frame(b, &hello, Instant::now());
    let map = Message::Map(server_map(&core, 0))
        .encode_to_vec(LINK_OPENING.map)
        .unwrap();
    match core.link_frame(b, &map, Instant::now()) {
        LinkAction::Send(bytes) => {
            assert!(matches!(
                proto::parse_frame(&bytes).unwrap().0,
                Message::MapEpoch(3)
            ));
        }
        other => panic!("expected MAP_EPOCH, got {other:?}"),
    }
    assert_eq!(core.link_status(b), Some(LinkStatus::Up));
}

#[test]
fn a_server_on_a_newer_epoch_makes_the_device_read_its_map_again() {
    let mut core = core_at(5, 1);
    let a = link(&core, "A", "n0");
    // The server's answer to the device's MAP_EPOCH: it runs 5 too.
    let same = proto::fence::epoch_reply(proto::Opcode::MapEpoch, MAP_EPOCH_TAG, Status::Ok, 5);
    assert!(matches!(
        core.link_frame(a, &same, Instant::now()),
        LinkAction::Nothing
    ));
    assert!(!core.take_map_reread());
    let newer =
        proto::fence::epoch_reply(proto::Opcode::MapEpoch, MAP_EPOCH_TAG, Status::StaleMap, 6);
    assert!(matches!(
        core.link_frame(a, &newer, Instant::now()),
        LinkAction::Nothing
    ));
    assert!(core.take_map_reread());
    assert!(!core.take_map_reread(), "asked once");
}

#[test]
fn a_servers_stale_map_is_relayed_with_its_epoch() {
    let mut core = core_at(5, 1);
    say_epoch(&mut core, 1, 5);
    let request = read_request(&core);
    let (link_id, head) = match core.client_frame(1, &request, Instant::now()) {
        ClientAction::Forward { link, head, .. } => (link, head),
        other => panic!("{other:?}"),
    };
    let link_tag = proto::frame::Header::parse(&head).unwrap().tag;
    let mut stale = server_response(link_tag, Status::StaleMap, &[]);
    proto::response::Packet::new_unchecked(&mut stale[proto::frame::HEADER_LEN..]).set_value(7);
    let LinkAction::Deliver { head, .. } = core.link_frame(link_id, &stale, Instant::now()) else {
        panic!("relayed to the client");
    };
    let (Message::Response(r), tag) = proto::parse_frame(&head).unwrap() else {
        panic!("not a response");
    };
    assert_eq!((r.status, r.value, tag), (Status::StaleMap, 7, 9));
    assert!(core.take_map_reread(), "the server runs a newer epoch");
    assert_eq!(
        core.metrics.stale_map.get(),
        0,
        "not the device's own refusal"
    );
}

/// A QP_CONNECT saying `epoch` (or none).
fn qp_connect(epoch: Option<u64>) -> Vec<u8> {
    let connect = proto::qp::Connect {
        endpoint: proto::qp::Endpoint {
            qpn: 0x42,
            psn: 0x100,
            ip: std::net::Ipv4Addr::new(10, 66, 0, 2),
            mtu: 1024,
        },
        atomics: None,
        epoch,
    };
    Message::QpConnect(connect).encode_to_vec(7).unwrap()
}

/// Whether `action` sets up a queue pair for a QP_CONNECT saying `epoch`.
fn sets_up(action: &ClientAction<'_>, epoch: Option<u64>) -> bool {
    matches!(action, ClientAction::ConnectQp { connect, tag: 7 } if connect.epoch == epoch)
}

#[test]
fn a_queue_pair_asked_for_at_an_older_epoch_is_refused_stale_map() {
    let mut core = core_at(5, 1);
    let now = Instant::now();
    let refused = answer(core.client_frame(1, &qp_connect(Some(4)), now));
    assert_eq!(
        refused,
        (Status::StaleMap, 5),
        "the device's epoch in the value"
    );
    for epoch in [Some(5), Some(6), None, Some(0)] {
        let frame = qp_connect(epoch);
        let action = core.client_frame(1, &frame, now);
        assert!(sets_up(&action, epoch), "{epoch:?}: {action:?}");
    }
    // Without an epoch of its own, the control connection's is judged; one
    // said in the QP_CONNECT is the queue pair's.
    assert_eq!(say_epoch(&mut core, 1, 4), (Status::StaleMap, 5));
    let refused = answer(core.client_frame(1, &qp_connect(None), now));
    assert_eq!(refused, (Status::StaleMap, 5));
    let frame = qp_connect(Some(5));
    let action = core.client_frame(1, &frame, now);
    assert!(sets_up(&action, Some(5)), "{action:?}");
    assert_eq!(
        core.metrics.stale_map.get(),
        2,
        "the two refused QP_CONNECTs"
    );
    // A device on a topology file (epoch 0) fences no queue pair.
    let mut on_file = core_at(0, 2);
    let frame = qp_connect(Some(3));
    let action = on_file.client_frame(2, &frame, now);
    assert!(sets_up(&action, Some(3)), "{action:?}");
}
