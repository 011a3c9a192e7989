//! The forwarding core on a virtual clock: helpers that build a core over
//! the default topology and play its servers, and the tests by concern.

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
use crate::ids::LinkClass;
use crate::link_tags::KEY_REFRESH_TAG;

mod clients;
mod copy_timeout;
mod keys;
mod links;
mod offload;
mod parking;
mod replication;
mod resync;
mod routing;
mod stale;
mod takeover;

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
    lane(core, server, nic, LinkClass::Main)
}

pub(super) fn lane(core: &Forwarder, server: &str, nic: &str, lane: LinkClass) -> LinkId {
    core.links()
        .find(|&(id, k)| {
            k.server.as_str() == server && k.nic.as_str() == nic && core.link_lane(id) == Some(lane)
        })
        .map(|(id, _)| id)
        .unwrap()
}

/// Completes a link's handshake as its server would.
pub(super) fn bring_up(core: &mut Forwarder, link: LinkId) {
    let server = core.link_target(link).unwrap().server.to_string();
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
