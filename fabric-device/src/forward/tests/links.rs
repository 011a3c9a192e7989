//! Server links: timeouts, a link breaking, a handshake with the wrong
//! server, and a reload.

use super::*;

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
