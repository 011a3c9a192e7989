//! A deposed owner fenced by a real pmem-server on a real etcd: a copy of a
//! replicated region takes changes only from the fabric device the map
//! names as the region's owner; after another device takes the region
//! over, the old owner's changes are refused NOT_OWNER (counted), and
//! STALE_MAP on a connection that says the old epoch.

use control::ownership::{Takeover, take_over_blocking};
use control::{ClusterMap, Endpoints};
use proto::Status;
use proto::request::{Repr, Target};
use testkit::{Conn, Etcd};

mod support;

use support::{DeviceKeys, as_device, put_cluster_map, server_on_etcd};

/// A counter the server must have.
fn counter(server: &testkit::Daemon, name: &str) -> f64 {
    server
        .metric(name, "")
        .unwrap_or_else(|| panic!("no {name}:\n{}", server.metrics()))
}

#[test]
fn a_deposed_owner_is_refused_by_the_copies_and_the_new_owner_served() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
    // Servers A and B, two copies of each region; devices F and G own the
    // regions in turn (A1: F, B1: G). Only server A runs: it holds A1's
    // primary and B1's backup.
    let config = testkit::FabricSpec::new()
        .server("A", &[("A1", "4MiB")])
        .server("B", &[("B1", "4MiB")])
        .device("F")
        .device("G")
        .client("c")
        .write(dir.path(), "fabric.toml", &mut testkit::Ports::new());
    let text = std::fs::read_to_string(config).expect("topology");
    let replicated = text.replacen("name = \"test\"", "name = \"test\"\nreplicas = 2", 1);
    assert_ne!(
        text, replicated,
        "the [pool] table is where testkit writes it"
    );
    let map = ClusterMap::new(1, replicated);
    let owner = |region: &str| map.replica_set(region).expect("replicated").owner.clone();
    assert_eq!((owner("A1").as_str(), owner("B1").as_str()), ("F", "G"));
    put_cluster_map(&etcd, &map);
    let keys = DeviceKeys::write(dir.path());
    let server = server_on_etcd(
        &etcd.endpoint(),
        "A",
        &dir.path().join("data"),
        &keys.flags(),
    )
    .expect("server");
    let data = server.addr("nic.n0");
    let device = |name: &str, key| {
        as_device(data, name, key).unwrap_or_else(|e| panic!("{name} connects: {e:?}"))
    };
    // A change of `region`'s copy here, for client c (number 0).
    let write = |conn: &mut Conn, region: usize, what: &[u8]| {
        let entry = conn.map().entries[region];
        conn.call(Repr {
            on_behalf: Some(0),
            ..Repr::write(Target::Pmem(entry.start), entry.key, what)
        })
    };
    let read = |conn: &mut Conn, region: usize| {
        let entry = conn.map().entries[region];
        conn.call(Repr {
            on_behalf: Some(0),
            ..Repr::read(Target::Pmem(entry.start), entry.key, 4)
        })
        .status
    };
    let (a1, b1) = (0, 1);
    let mut f = device("F", keys.f);
    let mut g = device("G", keys.g);

    // Each device changes the region it owns, not the other's.
    assert_eq!(write(&mut f, a1, b"by F").status, Status::Ok);
    assert_eq!(write(&mut g, b1, b"by G").status, Status::Ok);
    let refused = write(&mut g, a1, b"G, not A1's owner");
    assert_eq!((refused.status, refused.value), (Status::NotOwner, 1));
    assert_eq!(counter(&server, "pmem_server_not_owner_total"), 1.0);
    assert_eq!(
        read(&mut g, a1),
        Status::Ok,
        "reads are not judged by owner"
    );
    assert_eq!(
        testkit::file_bytes(&dir.path().join("data"), "A1", 0, 4),
        b"by F"
    );
    // In its own name, for no client (a resync), only a region's owner
    // reads and writes its copy.
    let own = |conn: &mut Conn, region: usize, write: bool| {
        let entry = conn.map().entries[region];
        let at = Target::Pmem(entry.start);
        let req = if write {
            Repr::write_persist(at, entry.key, b"by F")
        } else {
            Repr::read(at, entry.key, 4)
        };
        conn.call(req).status
    };
    assert_eq!(own(&mut f, a1, false), Status::Ok, "the owner reads");
    assert_eq!(own(&mut f, a1, true), Status::Ok, "the owner writes");
    assert_eq!(
        own(&mut g, a1, false),
        Status::AccessDenied,
        "not the owner, for no client"
    );

    // G takes A1 over (F is deemed dead), one transaction at epoch 2.
    let endpoints = Endpoints::parse(&etcd.endpoint()).expect("endpoint");
    let taken = take_over_blocking(&endpoints, "test", None, "G", &[("A1", 1)], &[])
        .expect("etcd answers")
        .remove(0)
        .expect("decided");
    assert!(
        matches!(taken, Takeover::Taken { epoch: 2, .. }),
        "{taken:?}"
    );
    server.wait_for_log("map epoch=2 applied");
    assert_eq!(own(&mut g, a1, false), Status::Ok, "the new owner reads");

    // F comes back, still taking itself for the owner: refused, nothing
    // written; G is served.
    let refused = write(&mut f, a1, b"F, stale");
    assert_eq!((refused.status, refused.value), (Status::NotOwner, 2));
    assert_eq!(counter(&server, "pmem_server_not_owner_total"), 2.0);
    assert_eq!(write(&mut g, a1, b"by G").status, Status::Ok);
    assert_eq!(
        testkit::file_bytes(&dir.path().join("data"), "A1", 0, 4),
        b"by G"
    );
    // Said on its connection, F's old epoch is refused before any owner
    // is looked at.
    f.send(&proto::Message::MapEpoch(1));
    let said = f.recv();
    assert_eq!(said.status, Status::StaleMap);
    assert_eq!(write(&mut f, a1, b"F, epoch 1").status, Status::StaleMap);
    assert_eq!(
        testkit::file_bytes(&dir.path().join("data"), "A1", 0, 4),
        b"by G"
    );
    drop(server);
}
