//! Routing and rewrite: the region offset, the lane, the fallback link, the
//! client's number, its grants, and answers relayed back.

use super::*;

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
            rdma,
        } => {
            assert!(payload.is_empty());
            assert_eq!(rdma, None, "no queue pair: TCP only");
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
    let main = lane(&core, "B", "n1", LinkClass::Main);
    let bulk = lane(&core, "B", "n1", LinkClass::Bulk);
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
    core.link_down(lane(&core, "B", "n0", LinkClass::Bulk));
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
    let bulk = lane(&core, "B", "n1", LinkClass::Bulk);
    let req = read(&core);
    match core.client_frame(1, &req, Instant::now()) {
        ClientAction::Forward { link, .. } => assert_eq!(link, bulk),
        other => panic!("{other:?}"),
    }
    core.link_down(bulk);
    core.link_down(lane(&core, "B", "n0", LinkClass::Bulk));
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
