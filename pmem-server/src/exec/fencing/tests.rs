use proto::fence::ConnEpoch;
use proto::request::Repr;
use proto::{AccessKey, Message, RegionIndex, RegionOffset, Status, Target};
use topology::{ServerId, Topology};

use crate::exec::Executor;
use crate::gate::Session;
use crate::persist::PersistPolicy;
use crate::server::{OpenedServer, ServerConfig};

/// Server `S` with regions `R1` and `R2` (indices 0 and 1), in `dir`.
fn open(dir: &std::path::Path) -> OpenedServer {
    let path = testkit::write_topology(dir, &[("R1", "1MiB"), ("R2", "1MiB")]);
    let config = ServerConfig {
        topology: Topology::load(path).unwrap(),
        server: ServerId::new("S"),
        data_dir: dir.join("data"),
        admin: "127.0.0.1:0".parse().unwrap(),
        persistence: PersistPolicy::Msync,
        format: true,
        create_missing: Vec::new(),
        reset_exactly_once: false,
        max_connections: 1,
        max_unproven: 1,
        timeouts: Default::default(),
        secrets: None,
        transport: None,
    };
    OpenedServer::open(&config).unwrap()
}

/// Server `S` of [`open`] running map epoch 5 (the folder lives as long as
/// the server is used).
fn at_epoch_5() -> (tempfile::TempDir, OpenedServer) {
    let dir = tempfile::tempdir().unwrap();
    let server = open(dir.path());
    server.exec.set_epoch(5);
    (dir, server)
}

/// A connection to `exec`: its gate standing and the epoch it said.
struct Peer<'a> {
    exec: &'a Executor,
    session: Session,
    said: ConnEpoch,
}

impl<'a> Peer<'a> {
    fn new(exec: &'a Executor) -> Self {
        Self {
            exec,
            session: exec.new_session(),
            said: ConnEpoch::default(),
        }
    }

    /// Sends `message`; the answer's status and value.
    fn call(&mut self, message: Message<'_>) -> (Status, u64) {
        let frame = message.encode_to_vec(5).unwrap();
        let mut out = Vec::new();
        self.exec
            .handle_frame_at(&mut self.session, &mut self.said, &frame, &mut out)
            .unwrap();
        match proto::parse_frame(&out).unwrap() {
            (Message::Response(r), 5) => (r.status, r.value),
            other => panic!("not an answer: {other:?}"),
        }
    }

    fn say(&mut self, epoch: u64) -> (Status, u64) {
        self.call(Message::MapEpoch(epoch))
    }

    fn request(&mut self, req: Repr<'_>) -> (Status, u64) {
        self.call(Message::Request(req))
    }

    /// A FETCH_ADD of `delta` at the start of region 0; the answer's status.
    fn add(&mut self, delta: u64) -> Status {
        let exec = self.exec;
        self.request(Repr::fetch_add(at(0), key(exec, 0), delta)).0
    }

    /// A READ of 8 bytes at the start of `region`; the answer's status.
    fn read(&mut self, region: u32) -> Status {
        let exec = self.exec;
        self.request(Repr::read(at(region), key(exec, region), 8)).0
    }
}

fn at(region: u32) -> Target {
    Target::Region(RegionOffset::new(RegionIndex(region), 0))
}

fn key(exec: &Executor, region: u32) -> AccessKey {
    exec.regions()
        .find(|r| r.entry.region == RegionIndex(region))
        .unwrap()
        .key()
}

/// The word at the start of `region`, read by an unfenced peer.
fn word(exec: &Executor, region: u32) -> u64 {
    let frame = Message::Request(Repr::read(at(region), key(exec, region), 8))
        .encode_to_vec(1)
        .unwrap();
    let mut out = Vec::new();
    exec.handle_frame(&mut exec.new_session(), &frame, &mut out)
        .unwrap();
    let data = &out[out.len() - 8..];
    u64::from_le_bytes(data.try_into().unwrap())
}

#[test]
fn map_epoch_is_answered_with_the_servers_epoch() {
    let (_dir, server) = at_epoch_5();
    let mut peer = Peer::new(&server.exec);
    assert_eq!(peer.say(4), (Status::StaleMap, 5));
    assert_eq!(peer.say(5), (Status::Ok, 5));
    assert_eq!(peer.say(6), (Status::Ok, 5));
}

#[test]
fn an_older_connection_is_refused_and_nothing_runs() {
    let (_dir, server) = at_epoch_5();
    let exec = &server.exec;
    let mut peer = Peer::new(exec);
    peer.say(4);
    let add = Repr::fetch_add(at(0), key(exec, 0), 3);
    assert_eq!(peer.request(add), (Status::StaleMap, 5));
    assert_eq!(word(exec, 0), 0, "the FETCH_ADD did not run");
    assert_eq!(exec.metrics().stale_map.get(), 1);
}

#[test]
fn equal_and_newer_connections_are_served() {
    let (_dir, server) = at_epoch_5();
    let exec = &server.exec;
    for said in [5, 6] {
        let mut peer = Peer::new(exec);
        peer.say(said);
        assert_eq!(peer.add(1), Status::Ok);
    }
    assert_eq!(word(exec, 0), 2);
}

#[test]
fn a_newer_connection_gets_stale_map_for_a_region_not_served_here() {
    let (_dir, server) = at_epoch_5();
    let exec = &server.exec;
    exec.set_withdrawn(RegionIndex(1), true, 5);
    let mut ahead = Peer::new(exec);
    ahead.say(6);
    // A withdrawn region, and one the server's layout does not have.
    assert_eq!(
        ahead.request(Repr::read(at(1), key(exec, 1), 8)),
        (Status::StaleMap, 5)
    );
    assert_eq!(
        ahead.request(Repr::read(at(9), key(exec, 0), 8)),
        (Status::StaleMap, 5)
    );
    // At the server's own epoch the region is simply not here.
    let mut level = Peer::new(exec);
    level.say(5);
    assert_eq!(level.read(1), Status::Unmapped);
}

#[test]
fn a_region_withdrawn_by_a_map_not_run_yet_is_stale_for_older_connections() {
    let (_dir, server) = at_epoch_5();
    let exec = &server.exec;
    // Applying epoch 6: its withdrawals come before the server runs it.
    exec.set_withdrawn(RegionIndex(1), true, 6);
    let mut behind = Peer::new(exec);
    behind.say(5);
    assert_eq!(
        behind.read(1),
        Status::StaleMap,
        "sent for the old placement: to be sent again where the region is now"
    );
    assert_eq!(behind.read(0), Status::Ok, "other regions are served");
    exec.set_epoch(6);
    let mut level = Peer::new(exec);
    level.say(6);
    assert_eq!(
        level.read(1),
        Status::Unmapped,
        "at the map that withdrew it"
    );
    // Withdrawn again by a later map: the first withdrawal stays.
    assert!(!exec.set_withdrawn(RegionIndex(1), true, 7));
    assert_eq!(level.read(1), Status::Unmapped);
}

#[test]
fn unfenced_connections_are_served_as_before() {
    let (_dir, server) = at_epoch_5();
    let exec = &server.exec;
    exec.set_withdrawn(RegionIndex(1), true, 5);
    let mut peer = Peer::new(exec);
    assert_eq!(peer.add(1), Status::Ok);
    assert_eq!(peer.read(1), Status::Unmapped);
    // A server on a topology file fences nobody.
    exec.set_epoch(0);
    peer.say(3);
    assert_eq!(peer.add(1), Status::Ok);
    assert_eq!(exec.metrics().stale_map.get(), 0);
}

#[test]
fn an_exactly_once_atomic_refused_stale_runs_once_when_retried_after_catching_up() {
    let (_dir, server) = at_epoch_5();
    let exec = &server.exec;
    let mut peer = Peer::new(exec);
    peer.say(4);
    let add = || Repr::fetch_add(at(0), key(exec, 0), 10).with_exactly_once(0, 41);
    assert_eq!(peer.request(add()), (Status::StaleMap, 5));
    assert_eq!(peer.say(5), (Status::Ok, 5));
    assert_eq!(peer.request(add()), (Status::Ok, 0), "runs: the old value");
    assert_eq!(word(exec, 0), 10);
    // Retried once more: answered from the window, not applied again.
    assert_eq!(peer.request(add()), (Status::Ok, 0));
    assert_eq!(word(exec, 0), 10);
}

/// The replica set record of `region` owned by `owner`, both copies
/// serving.
fn owned(region: &str, owner: &str) -> control::ReplicaSetRecord {
    let copy = |server: &str| control::CopyRecord {
        server: server.to_owned(),
        state: control::ReplicaState::Serving,
    };
    control::ReplicaSetRecord {
        region: region.to_owned(),
        version: 1,
        owner: owner.to_owned(),
        copies: vec![copy("S"), copy("T")],
    }
}

#[test]
fn a_map_that_gives_a_held_region_to_another_owner_names_the_deposed_device() {
    // The server fences the queue pairs of the devices named (`qp_fence`).
    let (_dir, server) = at_epoch_5();
    let exec = &server.exec;
    assert!(exec.follow_owners(&[owned("R1", "A")]).is_empty());
    // The same owners again (a copy marked, say): nobody deposed.
    assert!(exec.follow_owners(&[owned("R1", "A")]).is_empty());
    assert_eq!(exec.follow_owners(&[owned("R1", "B")]), ["A"]);
    // A region that has no record any more has lost its owner too.
    assert_eq!(exec.follow_owners(&[]), ["B"]);
}
