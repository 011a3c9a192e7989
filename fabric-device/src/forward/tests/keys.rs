//! Region keys: learnt from each region's server, passed on to granted
//! clients, and learnt again after a refusal or when polled.

use super::*;

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
