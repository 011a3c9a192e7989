//! A pmem-server on the control plane (`--etcd`): it takes the map from a
//! real etcd, is a member (a lease-bound liveness record) while it runs and
//! not after, and says which endpoints it tried when etcd is unreachable.

use std::time::{Duration, Instant};

use control::Role;
use testkit::{Conn, Daemon, Etcd, write_topology};

mod support;

use support::{DeviceKeys, PATIENCE, as_device, members, put_map, server_on_etcd};

/// Loads `topology` into etcd as pool `test`'s map at epoch 1.
fn load_map(etcd: &Etcd, topology: String) {
    put_map(etcd, 1, topology);
}

/// Server `S` of the pool's map in etcd, with its data in `data`.
fn server_on(etcd: &str, data: &std::path::Path) -> Result<Daemon, String> {
    server_on_etcd(etcd, "S", data, &[])
}

#[test]
fn a_server_on_etcd_serves_its_map_and_is_a_member_only_while_it_runs() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
    let topology =
        std::fs::read_to_string(write_topology(dir.path(), &[("R1", "4MiB")])).expect("topology");
    load_map(&etcd, topology);
    let members = || members(&etcd);

    let data = dir.path().join("data");
    let server = server_on(&etcd.endpoint(), &data).expect("server");
    assert_eq!(server.field("epoch"), "1");
    let mut conn = Conn::connect(server.addr("nic.n0"));
    assert_eq!(conn.hello("c").data, b"S", "serves the map's server S");
    let live = members();
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(
        (live[0].role, live[0].name.as_str(), live[0].epoch),
        (Role::Server, "S", 1)
    );
    assert_eq!(live[0].address, server.addr("admin").to_string());
    assert_eq!(live[0].pid, server.pid());
    let first = live[0].incarnation;

    // Killed: nobody keeps its lease alive, and its record expires.
    server.kill9();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !members().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(members().is_empty(), "the record outlived the process");

    // Started again: a new incarnation under the same name; stopped
    // cleanly: its record goes before it drains.
    let server = server_on(&etcd.endpoint(), &data).expect("server again");
    let again = members();
    assert_eq!(again.len(), 1, "{again:?}");
    assert_ne!(again[0].incarnation, first);
    let (status, _) = server.terminate();
    assert!(status.success());
    assert!(members().is_empty());
}

#[test]
fn a_server_that_cannot_reach_etcd_says_which_endpoints_it_tried() {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = testkit::free_loopback_port();
    let url = format!("http://127.0.0.1:{port}");
    let err = server_on(&url, &dir.path().join("data")).expect_err("no etcd there");
    assert!(
        err.contains(&format!("cannot reach etcd at {url}")),
        "{err}"
    );
}

#[test]
fn a_server_refuses_a_region_the_map_takes_away_and_keeps_its_file() {
    use proto::Status;
    use proto::request::{Repr, Target};

    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
    let both = write_topology(dir.path(), &[("R1", "4MiB"), ("R2", "4MiB")]);
    let layout = testkit::layout(&both);
    let both = std::fs::read_to_string(both).expect("topology");
    let only_r1 =
        std::fs::read_to_string(write_topology(dir.path(), &[("R1", "4MiB")])).expect("topology");
    load_map(&etcd, both.clone());
    let data = dir.path().join("data");
    let server = server_on(&etcd.endpoint(), &data).expect("server");
    let mut conn = Conn::connect(server.addr("nic.n0"));
    conn.hello("c");
    let (r1, r2) = (&layout.entries()[0], &layout.entries()[1]);
    let (k1, k2) = (conn.region_key(r1.region.0), conn.region_key(r2.region.0));
    let write = |conn: &mut Conn, at: &topology::LayoutEntry, key, what: &[u8]| {
        conn.call(Repr::write(Target::Pmem(at.start), key, what))
            .status
    };
    assert_eq!(write(&mut conn, r2, k2, b"kept"), Status::Ok);

    // Epoch 2 no longer places R2 here: its requests are refused, R1's are
    // served, and R2's file keeps its bytes.
    put_map(&etcd, 2, only_r1);
    server.wait_for_log("map epoch=2 applied");
    assert!(
        server
            .stderr_so_far()
            .contains("no longer places region R2 on this server"),
        "{}",
        server.stderr_so_far()
    );
    assert_eq!(write(&mut conn, r2, k2, b"lost"), Status::Unmapped);
    let read = conn.call(Repr::read(Target::Pmem(r2.start), k2, 4));
    assert_eq!(read.status, Status::Unmapped);
    assert_eq!(write(&mut conn, r1, k1, b"served"), Status::Ok);
    assert_eq!(testkit::file_bytes(&data, "R2", 0, 4), b"kept");
    // Its liveness record says the epoch it runs.
    let deadline = Instant::now() + PATIENCE;
    while members(&etcd).first().map(|m| m.epoch) != Some(2) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(members(&etcd)[0].epoch, 2);

    // Epoch 3 places it here again: served, with its data.
    put_map(&etcd, 3, both);
    server.wait_for_log("map epoch=3 applied");
    let read = conn.call(Repr::read(Target::Pmem(r2.start), k2, 4));
    assert_eq!(
        (read.status, read.data.as_slice()),
        (Status::Ok, &b"kept"[..])
    );
    let metrics = server.metrics();
    assert_eq!(
        telemetry::metric_sum(&metrics, "pmem_server_map_epoch", ""),
        Some(3.0)
    );
    assert_eq!(
        telemetry::metric_sum(&metrics, "pmem_server_withdrawn_region_requests_total", ""),
        Some(2.0)
    );
}

#[test]
fn a_connection_on_an_older_epoch_is_refused_stale_map_and_nothing_runs() {
    use proto::request::{Repr, Target};
    use proto::{Message, Status};

    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
    let path = write_topology(dir.path(), &[("R1", "4MiB")]);
    let layout = testkit::layout(&path);
    let topology = std::fs::read_to_string(path).expect("topology");
    load_map(&etcd, topology.clone());
    let data = dir.path().join("data");
    let server = server_on(&etcd.endpoint(), &data).expect("server");
    let r1 = &layout.entries()[0];
    let mut conn = Conn::connect(server.addr("nic.n0"));
    conn.hello("c");
    let key = conn.region_key(r1.region.0);
    let say = |conn: &mut Conn, epoch| {
        let tag = conn.send(&Message::MapEpoch(epoch));
        let reply = conn.recv();
        assert_eq!(reply.tag, tag);
        (reply.status, reply.value)
    };
    assert_eq!(say(&mut conn, 1), (Status::Ok, 1));
    let write = |what: &'static [u8]| Repr::write(Target::Pmem(r1.start), key, what);
    assert_eq!(conn.call(write(b"one")).status, Status::Ok);

    put_map(
        &etcd,
        2,
        topology.replace("[pool]\n", "[pool]\n# epoch 2\n"),
    );
    server.wait_for_log("map epoch=2 applied");
    let stale = conn.call(write(b"two"));
    assert_eq!((stale.status, stale.value), (Status::StaleMap, 2));
    assert_eq!(
        testkit::file_bytes(&data, "R1", 0, 3),
        b"one",
        "nothing ran"
    );
    assert_eq!(server.metric("pmem_server_stale_map_total", ""), Some(1.0));

    assert_eq!(say(&mut conn, 2), (Status::Ok, 2));
    assert_eq!(conn.call(write(b"two")).status, Status::Ok);
    assert_eq!(testkit::file_bytes(&data, "R1", 0, 3), b"two");
}

#[test]
fn a_device_the_map_adds_may_connect_and_one_it_removes_is_cut_off() {
    use proto::Status;
    use proto::opening::OpeningError;
    use proto::request::{Repr, Target};

    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
    // Server S, devices F and G, client c wired to both. Epoch 1 names F
    // only; epoch 2 adds G; epoch 3 removes F.
    let both = testkit::FabricSpec::new()
        .server("S", &[("R1", "4MiB")])
        .device("F")
        .device("G")
        .client("c")
        .write(dir.path(), "fabric.toml", &mut testkit::Ports::new());
    let both = std::fs::read_to_string(both).expect("topology");
    let only_f = control::edit::remove_device(&both, "G").expect("without G");
    let only_g = control::edit::remove_device(&both, "F").expect("without F");
    let keys = DeviceKeys::write(dir.path());
    let (f_key, g_key) = (keys.f, keys.g);
    load_map(&etcd, only_f.topology);
    let data_dir = dir.path().join("data");
    let server = server_on_etcd(&etcd.endpoint(), "S", &data_dir, &keys.flags()).expect("server");
    let data = server.addr("nic.n0");
    let device = |name: &str, key| as_device(data, name, key);
    // A write for client c (number 0) through a device; its status.
    let write_for_c = |conn: &mut Conn, what: &[u8]| {
        let key = conn.map().entries[0].key;
        let start = conn.map().entries[0].start;
        conn.call(Repr {
            on_behalf: Some(0),
            ..Repr::write(Target::Pmem(start), key, what)
        })
        .status
    };

    // Epoch 1: G has a key file but is not in the map.
    assert_eq!(
        device("G", g_key).err(),
        Some(OpeningError::Refused(Status::UnknownClient))
    );
    let mut f = device("F", f_key).expect("F is in the map");
    assert_eq!(write_for_c(&mut f, b"by F"), Status::Ok);

    // Epoch 2 adds G: it connects and acts for the client wired to it,
    // without a restart of the server.
    put_map(&etcd, 2, both);
    server.wait_for_log("map epoch=2 applied");
    assert!(
        server
            .stderr_so_far()
            .contains("map epoch=2: fabric device G may connect"),
        "{}",
        server.stderr_so_far()
    );
    let mut g = device("G", g_key).expect("G is in the map now");
    assert_eq!(write_for_c(&mut g, b"by G"), Status::Ok);
    let r1 = g.map().entries[0];
    let r1_key = r1.key;
    assert_eq!(write_for_c(&mut f, b"by F"), Status::Ok, "F kept its link");
    assert_eq!(write_for_c(&mut g, b"by G"), Status::Ok);

    // Epoch 3 removes F: on its open link nothing runs any more (a request
    // is answered STALE_MAP with epoch 3, for its client to move to that
    // map and another path), it gets no region key, and F cannot connect
    // again; G goes on.
    put_map(&etcd, 3, only_g.topology);
    server.wait_for_log("map epoch=3 applied");
    assert!(
        server
            .stderr_so_far()
            .contains("fabric device F is no longer in the map"),
        "{}",
        server.stderr_so_far()
    );
    let stale = f.call(Repr {
        on_behalf: Some(0),
        ..Repr::write(Target::Pmem(r1.start), r1_key, b"late")
    });
    assert_eq!((stale.status, stale.value), (Status::StaleMap, 3));
    assert_eq!(
        testkit::file_bytes(&data_dir, "R1", 0, 4),
        b"by G",
        "nothing ran"
    );
    let tag = f.send(&proto::Message::MapRequest);
    let refused = f.recv();
    assert_eq!(
        (refused.tag, refused.status, refused.value),
        (tag, Status::StaleMap, 3)
    );
    assert_eq!(
        device("F", f_key).err(),
        Some(OpeningError::Refused(Status::UnknownClient))
    );
    assert_eq!(write_for_c(&mut g, b"by G"), Status::Ok);
    assert_eq!(
        server.metric("pmem_server_auth_failures_total", "reason=\"revoked\""),
        Some(1.0),
        "{}",
        server.metrics()
    );
}

#[test]
fn a_map_that_wires_a_client_to_an_added_device_brings_its_exactly_once_lane() {
    use proto::Status;
    use proto::request::{ExactlyOnce, Repr, Target};
    use testkit::{FabricSpec, Ports};

    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
    let mut ports = Ports::new();
    // Epoch 1: c1 has one RNIC (on F). Epoch 2 adds device G, wires an
    // RNIC of c1 to it (FabricSpec wires each client to every device) and
    // adds client c2.
    let one = FabricSpec::new()
        .server("S", &[("R1", "4MiB")])
        .device("F")
        .client("c1");
    let two = one.clone().device("G").client("c2");
    let one = one.write(dir.path(), "one.toml", &mut ports);
    let two = two.write(dir.path(), "two.toml", &mut ports);
    let layout = testkit::layout(&one);
    let r1 = &layout.entries()[0];
    load_map(&etcd, std::fs::read_to_string(&one).expect("topology"));
    let server = server_on(&etcd.endpoint(), &dir.path().join("data")).expect("server");
    let mut conn = Conn::connect(server.addr("nic.n0"));
    conn.hello("c1");
    let key = conn.region_key(r1.region.0);
    let at = |offset: u64| Target::Pmem(proto::PmemAddr(r1.start.0 + offset));
    // c1 (number 0) on lane 2, its RNIC on G; c2 (number 1) on lane 0.
    let identity = |lane: u8, number: u32| ExactlyOnce::on_lane(lane, 0).stamped(number).client;
    let add =
        |offset: u64, client: u32| Repr::fetch_add(at(offset), key, 1).with_exactly_once(client, 7);
    let (on_g, c2) = (add(64, identity(2, 0)), add(128, identity(0, 1)));
    assert_eq!(
        conn.call(on_g).status,
        Status::UnknownClient,
        "no lane 2 at epoch 1"
    );
    assert_eq!(
        conn.call(c2).status,
        Status::UnknownClient,
        "no c2 at epoch 1"
    );

    put_map(&etcd, 2, std::fs::read_to_string(&two).expect("topology"));
    server.wait_for_log("map epoch=2 applied");
    for request in [on_g, c2] {
        for attempt in 0..2 {
            let reply = conn.call(request);
            assert_eq!(
                (reply.status, reply.value),
                (Status::Ok, 0),
                "{request:?}, try {attempt}: applied once, then answered from the window"
            );
        }
    }
    for offset in [64, 128] {
        let read = conn.call(Repr::read(at(offset), key, 8));
        assert_eq!(
            read.data,
            1u64.to_le_bytes(),
            "the word at {offset}, added to once"
        );
    }
    assert!(
        !server.stderr_so_far().contains("exactly-once identities"),
        "the window file had room:\n{}",
        server.stderr_so_far()
    );
}
