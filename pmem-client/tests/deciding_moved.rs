//! A replicated region left without a copy that decides, for a moment,
//! with real daemons on a real etcd: servers A and B keep two copies of
//! region A1, fabric device F owns it, and the client's only path is
//! through F.
//!
//! A1's copy on A decides; B's copy is syncing (it differs from A's in two
//! blocks and F resyncs at one byte per second, so it stays syncing). A is
//! killed: F has no copy to decide A1's atomics on and answers
//! SERVER_UNAVAILABLE. That is not final for a replicated region: the map
//! then moves the deciding role to B's copy (what a new owner does when
//! the deciding server it kept at its takeover turns out dead), and the
//! client's FETCH_ADD, which waited for it, completes once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use control::{ClusterMap, Endpoints, Keys, ReplicaState};
use pmem_client::AsyncPool;
use testkit::{Daemon, DaemonSpec, Etcd, FabricSpec, Ports, REGION_FILE_HEADER_LEN};
use topology::VirtAddr;

fn server(etcd: &Etcd, dir: &std::path::Path, id: &str) -> Daemon {
    Daemon::spawn(
        DaemonSpec::new(testkit::binary("pmem-server"))
            .args(["--etcd", &etcd.endpoint(), "--pool", "test", "--server", id])
            .args(["--admin", "127.0.0.1:0", "--insecure", "--data-dir"])
            .arg(dir.join(id)),
    )
    .unwrap_or_else(|e| panic!("pmem-server {id} did not start:\n{e}"))
}

/// The map pool `test` holds in etcd now.
fn map_in(etcd: &Etcd) -> ClusterMap {
    etcd.get_json_prefix(&Keys::of("test").map())
        .pop()
        .expect("a map")
}

#[test]
fn an_atomic_waits_for_the_deciding_role_to_move_off_a_dead_server_and_runs_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = FabricSpec::new()
        .server("A", &[("A1", "4MiB")])
        .server("B", &[])
        .device("F")
        .client("c1");
    let config = spec.write(dir.path(), "topology.toml", &mut Ports::new());
    let text = std::fs::read_to_string(&config).expect("read the topology");
    let replicated = text.replacen("name = \"test\"", "name = \"test\"\nreplicas = 2", 1);
    assert_ne!(
        text, replicated,
        "the [pool] table is where testkit writes it"
    );
    let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
    let endpoints = Endpoints::parse(&etcd.endpoint()).expect("endpoints");
    let key = Keys::of("test").map();
    etcd.put(&key, &ClusterMap::new(1, replicated).to_json())
        .expect("etcdctl put");
    assert_eq!(
        map_in(&etcd).replica_set("A1").map(|s| s.serving()),
        Some(2),
        "A1 has copies on A and B"
    );

    let a = server(&etcd, dir.path(), "A");
    let _b = server(&etcd, dir.path(), "B");
    let device = Daemon::spawn(
        DaemonSpec::new(testkit::binary("fabric-device"))
            .args([
                "--etcd",
                &etcd.endpoint(),
                "--pool",
                "test",
                "--device",
                "F",
            ])
            .args(["--admin", "127.0.0.1:0", "--insecure"])
            .args(["--request-timeout-ms", "2000", "--resync-rate", "1"])
            .args(["--reconnect-min-ms", "20", "--reconnect-max-ms", "200"]),
    )
    .unwrap_or_else(|e| panic!("fabric-device did not start:\n{e}"));
    device.wait_links_up(2);

    // B's copy differs from A's in blocks 1 and 2, as a copy that missed
    // writes would; marked syncing, its resync copies the first block at
    // once (the pacing bucket starts with one) and waits hours for the
    // second.
    let b_file = dir.path().join("B").join("A1.pmem");
    for block in [1u64, 2] {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&b_file)
            .and_then(|f| {
                use std::os::unix::fs::FileExt;
                f.write_all_at(&[0xEE; 8], REGION_FILE_HEADER_LEN + (block << 16))
            })
            .expect("change B's copy of A1");
    }
    control::copy_marks::mark_copy_state(
        &endpoints,
        "test",
        None,
        "A1",
        "B",
        ReplicaState::Syncing,
    )
    .expect("mark B's copy syncing");
    device.wait_for_log("region A1: resyncing the copy on server B");

    let pool = Arc::new(
        AsyncPool::builder_on_etcd(endpoints.clone(), "test", "c1")
            .connect()
            .unwrap_or_else(|e| panic!("pool: {}", pmem_client::error_chain(&e))),
    );
    let a1 = pool
        .regions()
        .into_iter()
        .find(|(id, _, _)| id == "A1")
        .expect("region A1")
        .1;
    let word = VirtAddr(a1.0 + 64);
    assert_eq!(pool.fetch_add(word, 1).expect("FETCH_ADD before"), 0);

    a.kill9();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !device_saw_a_down(&device) {
        assert!(Instant::now() < deadline, "{}", device.stderr_so_far());
        std::thread::sleep(Duration::from_millis(20));
    }
    let bump = {
        let pool = Arc::clone(&pool);
        std::thread::spawn(move || pool.fetch_add(word, 1))
    };
    // F answers SERVER_UNAVAILABLE at once (no copy decides); the client
    // keeps the FETCH_ADD waiting rather than failing it.
    std::thread::sleep(Duration::from_millis(1_500));
    assert!(
        !bump.is_finished(),
        "the FETCH_ADD ended before any copy could decide it: {:?}",
        bump.join()
    );
    let map = map_in(&etcd);
    let version = map.replica_set("A1").expect("A1").version;
    let moved = control::deciding::move_deciding_blocking(
        &endpoints,
        "test",
        None,
        &control::deciding::DecidingMove {
            region: "A1",
            takeover_version: version,
            dead: "A",
            reachable: &["B"],
            was_serving: &["B"],
        },
    )
    .expect("move the deciding role");
    assert!(
        matches!(moved, control::deciding::DecidingOutcome::Moved { .. }),
        "{moved:?}"
    );

    let old = bump
        .join()
        .expect("the FETCH_ADD's thread")
        .unwrap_or_else(|e| {
            panic!(
                "FETCH_ADD after the move: {}\nF's log:\n{}",
                pmem_client::error_chain(&e),
                device.stderr_so_far()
            )
        });
    assert_eq!(old, 1, "it ran on B's copy, which held the first one");
    assert_eq!(
        pool.fetch_add(word, 0).expect("FETCH_ADD after"),
        2,
        "applied once"
    );
    let now = map_in(&etcd);
    let set = now.replica_set("A1").expect("A1");
    assert_eq!(
        (set.state_on("A"), set.state_on("B")),
        (Some(ReplicaState::Offline), Some(ReplicaState::Serving))
    );
}

/// Whether F's log says its links to A went down.
fn device_saw_a_down(device: &Daemon) -> bool {
    device
        .stderr_so_far()
        .lines()
        .any(|l| l.contains("link to A/n0") && l.contains("down"))
}
