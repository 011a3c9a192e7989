//! Owner failover between real fabric devices on a real etcd: servers A and
//! B hold two copies of regions A1 and B1; device F1 owns A1, F2 owns B1.
//! While F1 lives, F2 refuses A1's requests NOT_OWNER; once F1 is killed,
//! F2 takes A1 over in the map (owner, version, B's copy syncing) and
//! serves it, and an atomic F1 had applied is answered from the deciding
//! copy's exactly-once window, not applied twice. A frozen F1 is taken
//! over once its lease is gone, and changes nothing when it thaws. F1
//! killed together with server A, A1's deciding copy: F2 takes A1 over
//! with B's copy deciding; and when A still accepted connections at the
//! takeover (stopped, as a dying server may be) and dies seconds after, F2
//! moves the deciding role to B's copy in a second transaction; but a
//! deciding server that answered F2 after the takeover keeps the role when
//! it dies, since its copy alone may hold writes acknowledged since.

mod support;

use std::time::{Duration, Instant};

use control::{ClusterMap, ReplicaState};
use proto::Status;
use proto::request::{Repr, Target};
use support::{DEVICE_FLAGS, PATIENCE, map_now};
use testkit::{Conn, Daemon, Etcd};
use topology::Layout;

fn client(device: &Daemon) -> Conn {
    support::client(device, "c")
}

/// The fabric of these tests: etcd, servers A and B, devices F1 and F2,
/// the map at epoch 1 (A1 owned by F1, B1 by F2).
struct Fabric {
    dir: tempfile::TempDir,
    etcd: Etcd,
    layout: Layout,
    map: ClusterMap,
    /// A and B; `None` once killed.
    servers: [Option<Daemon>; 2],
    /// `None` once killed.
    f1: Option<Daemon>,
    f2: Daemon,
}

impl Fabric {
    fn start() -> Self {
        Self::start_with(DEVICE_FLAGS)
    }

    /// The fabric with `device_flags` for both devices.
    fn start_with(device_flags: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
        let (config, replicated) = support::replicated_topology(dir.path(), &["F1", "F2"], "c");
        let map = support::put_first_map(&etcd, replicated);
        assert_eq!(
            (owner(&map, "A1").as_str(), owner(&map, "B1").as_str()),
            ("F1", "F2")
        );
        let layout = testkit::layout(&config);
        let servers = [
            support::server_on(&etcd, "A", dir.path()),
            support::server_on(&etcd, "B", dir.path()),
        ];
        let f1 = support::device_on(&etcd, "F1", device_flags);
        let f2 = support::device_on(&etcd, "F2", device_flags);
        f1.wait_links_up(2);
        f2.wait_links_up(2);
        Self {
            dir,
            etcd,
            layout,
            map,
            servers: servers.map(Some),
            f1: Some(f1),
            f2,
        }
    }

    fn f1(&self) -> &Daemon {
        self.f1.as_ref().expect("F1 runs")
    }

    fn at(&self, region: &str, offset: u64) -> Target {
        support::pmem(&self.layout, region, offset)
    }

    /// The region key of A1, as `conn`'s device gives it.
    fn a1_key(&self, conn: &mut Conn) -> proto::AccessKey {
        conn.region_key(self.layout.entry_by_id(&"A1".into()).expect("A1").region.0)
    }

    /// `len` bytes at `offset` of server `server`'s copy of A1.
    fn a1_copy(&self, server: &str, offset: u64, len: usize) -> Vec<u8> {
        support::copy_bytes(self.dir.path(), server, "A1", offset, len)
    }

    /// Sends `req` through F2 until it is answered otherwise than NOT_OWNER
    /// or STALE_MAP (F2 takes A1 over meanwhile).
    fn through_f2_once_it_owns(&self, conn: &mut Conn, req: Repr<'_>) -> testkit::Reply {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let reply = conn.call(req);
            if !matches!(reply.status, Status::NotOwner | Status::StaleMap) {
                return reply;
            }
            assert!(
                Instant::now() < deadline,
                "A1 was never taken over:\n{}",
                self.f2.stderr_so_far()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The map names F2 as A1's owner, with A's copy (the deciding one)
    /// serving and B's marked syncing by the takeover (version 2), or
    /// already resynced by F2 and serving again (version 3); B1's record is
    /// untouched.
    fn assert_f2_owns_a1(&self) {
        let now = map_now(&self.etcd);
        let a1 = now.replica_set("A1").expect("A1");
        assert_eq!(a1.owner.as_str(), "F2");
        assert_eq!(a1.state_on("A"), Some(ReplicaState::Serving));
        match (a1.version, a1.state_on("B")) {
            (2, Some(ReplicaState::Syncing)) | (3, Some(ReplicaState::Serving)) => {}
            other => panic!("A1's version and B's copy after the takeover: {other:?}"),
        }
        assert_eq!(now.replica_set("B1"), self.map.replica_set("B1"));
        // Logged once the map is written: it may follow what etcd shows.
        self.f2
            .wait_for_log("took region A1 over from dead fabric device F1");
    }
}

fn owner(map: &ClusterMap, region: &str) -> String {
    map.replica_set(region).expect("replicated").owner.clone()
}

#[test]
fn a_dead_owners_region_is_taken_over_and_its_atomics_stay_exactly_once() {
    let mut fabric = Fabric::start();

    // F1 owns A1: a counter bumped once there, exactly once.
    let mut via_f1 = client(fabric.f1());
    let key = fabric.a1_key(&mut via_f1);
    let bump = Repr::fetch_add(fabric.at("A1", 64), key, 1).with_exactly_once(0, 7);
    let first = via_f1.call(bump);
    assert_eq!((first.status, first.value), (Status::Ok, 0));
    // F2 does not order A1 while F1 lives.
    let mut via_f2 = client(&fabric.f2);
    let write = Repr::write(fabric.at("A1", 0), key, b"after");
    assert_eq!(via_f2.call(write).status, Status::NotOwner);
    assert_eq!(owner(&map_now(&fabric.etcd), "A1"), "F1");

    // F1 dies. The retry of its atomic through F2 is answered, once F2
    // owns A1, from the deciding copy's window: the old value it first
    // gave, not applied again.
    fabric.f1.take().expect("F1 runs").kill9();
    let again = fabric.through_f2_once_it_owns(&mut via_f2, bump);
    assert_eq!((again.status, again.value), (Status::Ok, 0));
    let read = via_f2.call(Repr::read(fabric.at("A1", 64), key, 8));
    assert_eq!(read.status, Status::Ok);
    assert_eq!(read.data, 1u64.to_le_bytes(), "applied once");
    fabric.assert_f2_owns_a1();

    // Writes reach both copies again: the syncing one takes every write.
    assert_eq!(via_f2.call(write).status, Status::Ok);
    for server in ["A", "B"] {
        assert_eq!(fabric.a1_copy(server, 0, 5), b"after", "{server}'s copy");
        assert_eq!(
            fabric.a1_copy(server, 64, 8),
            1u64.to_le_bytes(),
            "{server}'s copy"
        );
    }
}

/// A frozen owner accepts connections (the kernel does it for it), so only
/// its lease, gone after its time to live, tells it is dead. Thawed, it
/// changes nothing: servers refuse its old epoch, and once it has the map
/// it refuses the region's requests itself.
#[test]
fn a_frozen_owner_is_taken_over_past_its_lease_and_changes_nothing_when_thawed() {
    let fabric = Fabric::start();
    let mut via_f1 = client(fabric.f1());
    let key = fabric.a1_key(&mut via_f1);
    let mut via_f2 = client(&fabric.f2);
    assert_eq!(
        via_f1
            .call(Repr::write(fabric.at("A1", 0), key, b"first"))
            .status,
        Status::Ok
    );
    // Every thread stopped before the write goes: a thread still running
    // could forward it while F1 still owns A1, which is no deposed owner's
    // change.
    fabric.f1().freeze();
    // Sent to the frozen owner: it reads it only once thawed.
    via_f1.send(&proto::Message::Request(Repr::write(
        fabric.at("A1", 0),
        key,
        b"stale",
    )));
    let fresh =
        fabric.through_f2_once_it_owns(&mut via_f2, Repr::write(fabric.at("A1", 0), key, b"fresh"));
    assert_eq!(fresh.status, Status::Ok);
    fabric.assert_f2_owns_a1();

    fabric.f1().signal(libc::SIGCONT);
    let stale = via_f1.recv();
    assert_ne!(
        stale.status,
        Status::Ok,
        "the deposed owner changed a copy; F1's log:\n{}\nA's log:\n{}",
        fabric.f1().stderr_so_far(),
        fabric.servers[0]
            .as_ref()
            .map(|s| s.stderr_so_far())
            .unwrap_or_default()
    );
    for server in ["A", "B"] {
        assert_eq!(fabric.a1_copy(server, 0, 5), b"fresh", "{server}'s copy");
    }
    // Once it runs the new map, it refuses A1 itself, saying that epoch
    // (2, the takeover's, or 3 once F2 resynced B's copy).
    let deadline = Instant::now() + PATIENCE;
    loop {
        let reply = via_f1.call(Repr::write(fabric.at("A1", 0), key, b"again"));
        assert_ne!(reply.status, Status::Ok, "the deposed owner changed a copy");
        if reply.status == Status::NotOwner && reply.value >= 2 {
            break;
        }
        assert!(Instant::now() < deadline, "F1 never learnt it was deposed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(fabric.a1_copy("A", 0, 5), b"fresh");
}

/// The owner and the server of its region's deciding copy die at one
/// moment: the surviving device takes the region over with the surviving
/// copy deciding (the dead one is passed over and no longer serves), so
/// the region serves at once; an atomic the old owner completed is
/// answered from the surviving copy's window (its record came with the
/// word), not applied again.
#[test]
fn the_owner_killed_with_the_deciding_copy_leaves_the_other_copy_deciding() {
    let mut fabric = Fabric::start();
    let mut via_f1 = client(fabric.f1());
    let key = fabric.a1_key(&mut via_f1);
    let bump = Repr::fetch_add(fabric.at("A1", 64), key, 1).with_exactly_once(0, 7);
    let first = via_f1.call(bump);
    assert_eq!((first.status, first.value), (Status::Ok, 0));
    let mut via_f2 = client(&fabric.f2);

    // Server A (A1's first copy, the deciding one) and F1 die together.
    fabric.servers[0].take().expect("A runs").kill9();
    fabric.f1.take().expect("F1 runs").kill9();
    let again = fabric.through_f2_once_it_owns(&mut via_f2, bump);
    assert_eq!(
        (again.status, again.value),
        (Status::Ok, 0),
        "answered from B's window:\n{}",
        fabric.f2.stderr_so_far()
    );
    let read = via_f2.call(Repr::read(fabric.at("A1", 64), key, 8));
    assert_eq!(read.status, Status::Ok);
    assert_eq!(read.data, 1u64.to_le_bytes(), "applied once");
    let write = via_f2.call(Repr::write(fabric.at("A1", 0), key, b"after"));
    assert_eq!(write.status, Status::Ok);
    assert_eq!(fabric.a1_copy("B", 0, 5), b"after");
    let now = map_now(&fabric.etcd);
    let a1 = now.replica_set("A1").expect("A1");
    assert_eq!(a1.owner.as_str(), "F2");
    assert_eq!(a1.state_on("B"), Some(ReplicaState::Serving));
    assert_ne!(a1.state_on("A"), Some(ReplicaState::Serving), "{a1:?}");
}

/// The race of the owner and its deciding copy's server dying at the same
/// instant, held open: server A is stopped (its ports still accept, as a
/// dying server's do while it is torn down) when F1 is killed, so F2
/// takes A1 over keeping A's copy deciding and B's syncing. A is then
/// killed: its ports refuse, and F2 moves the deciding role in a second
/// transaction (A's copy offline, B's serving again), so the retry of an
/// atomic F1 completed is answered from B's window, once, and A1 serves.
/// Without the move A1 would answer SERVER_UNAVAILABLE until A is back.
#[test]
fn a_deciding_copy_found_dead_just_after_the_takeover_hands_the_role_to_the_other_copy() {
    let mut fabric = Fabric::start();
    let mut via_f1 = client(fabric.f1());
    let key = fabric.a1_key(&mut via_f1);
    let bump = Repr::fetch_add(fabric.at("A1", 64), key, 1).with_exactly_once(0, 7);
    let first = via_f1.call(bump);
    assert_eq!((first.status, first.value), (Status::Ok, 0));
    let mut via_f2 = client(&fabric.f2);

    fabric.servers[0]
        .as_ref()
        .expect("A runs")
        .signal(libc::SIGSTOP);
    fabric.f1.take().expect("F1 runs").kill9();
    // F2 learns of F1's death from requests it refuses NOT_OWNER, and takes
    // A1 over; A still accepts connections, so its copy keeps deciding.
    // The requests are not waited for: once F2 owns A1 they wait for A.
    let mut trigger = client(&fabric.f2);
    let deadline = Instant::now() + PATIENCE;
    loop {
        trigger.send(&proto::Message::Request(Repr::read(
            fabric.at("A1", 0),
            key,
            8,
        )));
        if owner(&map_now(&fabric.etcd), "A1") == "F2" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "A1 was never taken over:\n{}",
            fabric.f2.stderr_so_far()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let taken = map_now(&fabric.etcd);
    let a1 = taken.replica_set("A1").expect("A1");
    assert_eq!(
        (a1.state_on("A"), a1.state_on("B")),
        (Some(ReplicaState::Serving), Some(ReplicaState::Syncing)),
        "the takeover kept A deciding: {a1:?}"
    );

    // A stays stopped longer than a dying server's teardown usually takes
    // (the recheck once gave up after 3 s), then dies: its ports refuse,
    // it said nothing to F2 since the takeover, and F2 moves the role to
    // B. Until the map says so, A1 has no serving copy F2 reaches: its requests are
    // answered SERVER_UNAVAILABLE (nothing ran), which a client retries.
    std::thread::sleep(Duration::from_secs(4));
    fabric.servers[0].take().expect("A runs").kill9();
    let deadline = Instant::now() + PATIENCE;
    let again = loop {
        let reply = fabric.through_f2_once_it_owns(&mut via_f2, bump);
        if reply.status != Status::ServerUnavailable {
            break reply;
        }
        assert!(
            Instant::now() < deadline,
            "A1's deciding role never left dead server A:\n{}",
            fabric.f2.stderr_so_far()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        (again.status, again.value),
        (Status::Ok, 0),
        "answered from B's window:\n{}",
        fabric.f2.stderr_so_far()
    );
    let read = via_f2.call(Repr::read(fabric.at("A1", 64), key, 8));
    assert_eq!(read.status, Status::Ok);
    assert_eq!(read.data, 1u64.to_le_bytes(), "applied once");
    let now = map_now(&fabric.etcd);
    let a1 = now.replica_set("A1").expect("A1");
    assert_eq!(a1.owner.as_str(), "F2");
    assert_eq!(a1.state_on("A"), Some(ReplicaState::Offline), "{a1:?}");
    assert_eq!(a1.state_on("B"), Some(ReplicaState::Serving), "{a1:?}");
    // Logged once the map is written: it may follow what etcd shows.
    fabric
        .f2
        .wait_for_log("deciding copy moved from dead server A");
}

/// The move of the deciding role must not lose acknowledged writes: after
/// F2 takes A1 over with A alive, A confirms F2's epoch and a write is
/// acknowledged with A's copy the only serving one (B's syncing); A then
/// dies within the recheck's watch. Moving the role to B's copy would
/// serve a copy that may lack that write, so F2 leaves A deciding and says
/// why, and A1 never answers a read with bytes older than the write.
#[test]
fn a_deciding_copy_that_answered_after_the_takeover_keeps_the_role_when_its_server_dies() {
    // B's copy differs from A's in two blocks, as a copy that missed
    // writes would. A resync paced at one byte per second copies the first
    // from its full bucket (one block) at once and waits about 18 hours for
    // the second, so B's copy stays syncing throughout.
    let flags = [DEVICE_FLAGS, &["--resync-rate", "1"]].concat();
    let mut fabric = Fabric::start_with(&flags);
    let b_file = support::data_dir(fabric.dir.path(), "B").join("A1.pmem");
    for block in [1u64, 2] {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&b_file)
            .and_then(|f| {
                use std::os::unix::fs::FileExt;
                f.write_all_at(&[0xEE; 8], testkit::REGION_FILE_HEADER_LEN + (block << 16))
            })
            .expect("change B's copy of A1");
    }
    let mut via_f1 = client(fabric.f1());
    let key = fabric.a1_key(&mut via_f1);
    fabric.f1.take().expect("F1 runs").kill9();
    let mut via_f2 = client(&fabric.f2);
    let write = Repr::write(fabric.at("A1", 0), key, b"acked");
    let reply = fabric.through_f2_once_it_owns(&mut via_f2, write);
    assert_eq!(reply.status, Status::Ok, "{}", fabric.f2.stderr_so_far());
    let taken = map_now(&fabric.etcd);
    let a1 = taken.replica_set("A1").expect("A1");
    assert_eq!(a1.owner.as_str(), "F2");
    assert_eq!(
        (a1.state_on("A"), a1.state_on("B")),
        (Some(ReplicaState::Serving), Some(ReplicaState::Syncing)),
        "{a1:?}"
    );

    fabric.servers[0].take().expect("A runs").kill9();
    fabric
        .f2
        .wait_for_log("but it answered this device after it took region A1 over");
    let log = fabric.f2.stderr_so_far();
    assert!(
        !log.contains("deciding copy moved from dead server A"),
        "{log}"
    );
    let read = via_f2.call(Repr::read(fabric.at("A1", 0), key, 5));
    assert!(
        read.status != Status::Ok || read.data == b"acked",
        "A1 answered {:?} {:?} after losing the copy with the acknowledged write",
        read.status,
        read.data
    );
}
