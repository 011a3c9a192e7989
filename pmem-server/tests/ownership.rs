//! A deposed owner fenced by a real pmem-server on a real etcd: a copy of a
//! replicated region takes changes only from the fabric device the map
//! names as the region's owner; after another device takes the region
//! over, the old owner's changes are refused NOT_OWNER (counted), and
//! STALE_MAP on a connection that says the old epoch.

use std::time::{Duration, Instant};

use control::ownership::{Takeover, take_over_blocking};
use control::{ClusterMap, Endpoints, Keys};
use proto::Status;
use proto::hello::Role;
use proto::request::{Repr, Target};
use testkit::{Conn, Daemon, DaemonSpec, Etcd};
use topology::secrets::{Principal, write_key};

const PMEM_SERVER: &str = env!("CARGO_BIN_EXE_pmem-server");

/// How long the test waits for the server to apply a map (a bound on a
/// wait, not a measurement).
const PATIENCE: Duration = Duration::from_secs(60);

fn wait_for_log(daemon: &Daemon, needle: &str) {
    let deadline = Instant::now() + PATIENCE;
    while !daemon.stderr_so_far().contains(needle) {
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in the log:\n{}",
            daemon.stderr_so_far()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn counter(daemon: &Daemon, name: &str) -> f64 {
    let (_, text) = telemetry::http_get(daemon.addr("admin"), "/metrics", Duration::from_secs(5))
        .expect("metrics");
    telemetry::metric_sum(&text, name, "").unwrap_or_else(|| panic!("no {name}:\n{text}"))
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
    etcd.put(&Keys::of("test").map(), &map.to_json())
        .expect("etcdctl put");
    let secrets = dir.path().join("keys");
    std::fs::create_dir_all(&secrets).expect("keys folder");
    let (f_key, g_key) = ([0xF1; 32], [0x61; 32]);
    write_key(&secrets, Principal::Device("F"), &f_key).expect("F's key");
    write_key(&secrets, Principal::Device("G"), &g_key).expect("G's key");
    let server = Daemon::spawn(
        DaemonSpec::new(PMEM_SERVER)
            .args([
                "--etcd",
                &etcd.endpoint(),
                "--pool",
                "test",
                "--server",
                "A",
            ])
            .args(["--admin", "127.0.0.1:0", "--secrets"])
            .arg(&secrets)
            .arg("--data-dir")
            .arg(dir.path().join("data")),
    )
    .expect("server");
    let data = server.addr("nic.n0");
    let device = |name: &str, key| {
        let mut conn = Conn::connect(data);
        conn.authenticate(Role::FabricDevice, name, key)
            .unwrap_or_else(|e| panic!("{name} connects: {e:?}"));
        conn
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
    let mut f = device("F", f_key);
    let mut g = device("G", g_key);

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
    wait_for_log(&server, "map epoch=2 applied");
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
