//! Client connections: HELLO, their identity and share, and what a client
//! may have in flight.

use super::*;

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
