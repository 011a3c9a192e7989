//! Atomics under contention across many connections, and exactly-once replay.

use proto::request::Repr;
use proto::{Message, Status};
use testkit::{Conn, at, key, pmem_server_with, write_topology};

/// The exactly-once identity of the topology's only client, `c` (number 0),
/// on lane 0; and on lane 1, which its one RNIC gives it.
const CLIENT: u32 = 0;
const OTHER_LANE: u32 = 1 << proto::request::LANE_SHIFT;

/// This package's daemon, built with the features of the test run.
const PMEM_SERVER: &str = env!("CARGO_BIN_EXE_pmem-server");

const CONNECTIONS: usize = 8;
const ADDS_PER_CONNECTION: usize = 10_000;
/// Requests kept in flight per connection.
const WINDOW: usize = 64;

#[test]
fn fetch_add_from_eight_connections_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_topology(dir.path(), &[("R1", "4MiB")]);
    let server =
        pmem_server_with(PMEM_SERVER, &config, "S", &dir.path().join("data"), &[]).unwrap();
    let k = key(server.addr("nic.n0"), 0);
    let data = server.addr("nic.n0");
    std::thread::scope(|s| {
        for _ in 0..CONNECTIONS {
            s.spawn(|| {
                let mut conn = Conn::connect(data);
                let mut sent = 0;
                let mut received = 0;
                while received < ADDS_PER_CONNECTION {
                    while sent < ADDS_PER_CONNECTION && sent - received < WINDOW {
                        conn.send(&Message::Request(Repr::fetch_add(at(0, 256), k, 1)));
                        sent += 1;
                    }
                    assert_eq!(conn.recv().status, Status::Ok);
                    received += 1;
                }
            });
        }
    });
    let total = Conn::connect(data).call(Repr::fetch_add(at(0, 256), k, 0));
    assert_eq!(total.value, (CONNECTIONS * ADDS_PER_CONNECTION) as u64);
}

#[test]
fn compare_swap_counter_under_contention_loses_no_increment() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_topology(dir.path(), &[("R1", "4MiB")]);
    let server =
        pmem_server_with(PMEM_SERVER, &config, "S", &dir.path().join("data"), &[]).unwrap();
    let k = key(server.addr("nic.n0"), 0);
    let data = server.addr("nic.n0");
    const THREADS: usize = 4;
    const INCREMENTS: usize = 1_000;
    let failed_swaps = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                let mut conn = Conn::connect(data);
                let mut seen = conn.call(Repr::fetch_add(at(0, 8), k, 0)).value;
                for _ in 0..INCREMENTS {
                    loop {
                        let reply = conn.call(Repr::compare_swap(at(0, 8), k, seen, seen + 1));
                        assert_eq!(reply.status, Status::Ok);
                        if reply.value == seen {
                            seen += 1;
                            break;
                        }
                        failed_swaps.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        seen = reply.value;
                    }
                }
            });
        }
    });
    let total = Conn::connect(data).call(Repr::fetch_add(at(0, 8), k, 0));
    assert_eq!(total.value, (THREADS * INCREMENTS) as u64);
    eprintln!(
        "{} failed swaps retried",
        failed_swaps.load(std::sync::atomic::Ordering::Relaxed)
    );
}

#[test]
fn replayed_fetch_add_is_applied_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_topology(dir.path(), &[("R1", "4MiB")]);
    let server =
        pmem_server_with(PMEM_SERVER, &config, "S", &dir.path().join("data"), &[]).unwrap();
    let k = key(server.addr("nic.n0"), 0);
    let data = server.addr("nic.n0");
    let mut first_path = Conn::connect(data);
    let mut second_path = Conn::connect(data);

    let add = Repr::fetch_add(at(0, 16), k, 5).with_exactly_once(CLIENT, 1);
    let first = first_path.call(add);
    // The same request re-issued on another connection, as after a failover.
    let replay = second_path.call(add);
    assert_eq!((first.status, replay.status), (Status::Ok, Status::Ok));
    assert_eq!(
        first.value, replay.value,
        "the replay returns the first result"
    );

    // A new sequence number applies again; another lane's seq 1 is its own.
    first_path.call(Repr::fetch_add(at(0, 16), k, 5).with_exactly_once(CLIENT, 2));
    first_path.call(Repr::fetch_add(at(0, 16), k, 5).with_exactly_once(OTHER_LANE, 1));
    let total = first_path.call(Repr::fetch_add(at(0, 16), k, 0));
    assert_eq!(total.value, 15);

    // Compare-and-swap too: a replayed successful swap does not swap again.
    let cas = Repr::compare_swap(at(0, 24), k, 0, 9).with_exactly_once(CLIENT, 3);
    assert_eq!(first_path.call(cas).value, 0);
    first_path.call(Repr::atomic_write(at(0, 24), k, 0));
    assert_eq!(second_path.call(cas).value, 0, "answered from the window");
    assert_eq!(
        first_path.call(Repr::fetch_add(at(0, 24), k, 0)).value,
        0,
        "not swapped twice"
    );
}

#[test]
fn exactly_once_holds_across_a_server_crash() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_topology(dir.path(), &[("R1", "4MiB")]);
    let data = dir.path().join("data");
    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &[]).unwrap();
    let k = key(server.addr("nic.n0"), 0);
    let add = Repr::fetch_add(at(0, 32), k, 10).with_exactly_once(CLIENT, 500);
    let first = Conn::connect(server.addr("nic.n0")).call(add);
    assert_eq!((first.status, first.value), (Status::Ok, 0));
    // The response might have been lost: the server dies before the client
    // hears back, and the client retries against the restarted server.
    server.kill9();
    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &[]).unwrap();
    let mut conn = Conn::connect(server.addr("nic.n0"));
    let retry = conn.call(add);
    assert_eq!(
        (retry.status, retry.value),
        (Status::Ok, 0),
        "answered from the window"
    );
    let now = conn.call(Repr::fetch_add(at(0, 32), k, 0));
    assert_eq!(now.value, 10, "applied once");
    // `--format` starts a fresh window along with fresh regions.
    server.kill9();
    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &["--format"]).unwrap();
    let new_key = key(server.addr("nic.n0"), 0);
    assert_ne!(new_key, k, "fresh regions get fresh keys");
    let add = Repr {
        key: new_key,
        ..add
    };
    let fresh = Conn::connect(server.addr("nic.n0")).call(add);
    assert_eq!((fresh.status, fresh.value), (Status::Ok, 0));
}

/// Exactly-once identities the topology does not have are refused before
/// they run or leave state, and counted; so is the reserved sequence number.
#[test]
fn forged_exactly_once_identities_are_refused_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_topology(dir.path(), &[("R1", "4MiB")]);
    let server =
        pmem_server_with(PMEM_SERVER, &config, "S", &dir.path().join("data"), &[]).unwrap();
    let k = key(server.addr("nic.n0"), 0);
    let mut conn = Conn::connect(server.addr("nic.n0"));
    // Client number 5 does not exist; client 0 has lanes 0 and 1 only.
    for forged in [5, 2 << proto::request::LANE_SHIFT, u32::MAX] {
        let reply = conn.call(Repr::fetch_add(at(0, 40), k, 1).with_exactly_once(forged, 1));
        assert_eq!(reply.status, Status::UnknownClient, "identity {forged:#x}");
    }
    let reply = conn.call(Repr::fetch_add(at(0, 40), k, 1).with_exactly_once(CLIENT, u64::MAX));
    assert_eq!(reply.status, Status::BadRequest, "reserved sequence number");
    assert_eq!(
        conn.call(Repr::fetch_add(at(0, 40), k, 0)).value,
        0,
        "none of them ran"
    );
    let metrics = telemetry::http_get(
        server.addr("admin"),
        "/metrics",
        std::time::Duration::from_secs(5),
    )
    .unwrap()
    .1;
    for (reason, count) in [("unknown_identity", 3), ("reserved_seq", 1)] {
        let line = format!("pmem_server_exactly_once_refused_total{{reason=\"{reason}\"}} {count}");
        assert!(metrics.lines().any(|l| l == line), "{line}:\n{metrics}");
    }
}
