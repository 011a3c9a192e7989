//! A fabric device on the control plane (`--etcd`): it takes the map from
//! a real etcd, forwards by it, and is a member while it runs.

use std::time::{Duration, Instant};

use control::Role;
use proto::Status;
use proto::request::Repr;
use testkit::{Conn, Daemon, Etcd, FabricSpec, Ports, pmem_server_with};

mod support;

use support::{FABRIC_DEVICE, device_on_etcd, members, put_map, server_on_etcd};

/// Server S (region R1), device F and client c: the topology written to a
/// fresh folder and put as the map at epoch 1 in a fresh etcd.
struct OnEtcd {
    dir: tempfile::TempDir,
    etcd: Etcd,
    config: std::path::PathBuf,
    topology: String,
}

impl OnEtcd {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
        let config = FabricSpec::new()
            .server("S", &[("R1", "4MiB")])
            .device("F")
            .client("c")
            .write(dir.path(), "topology.toml", &mut Ports::new());
        let topology = std::fs::read_to_string(&config).expect("topology");
        put_map(&etcd, 1, &topology);
        Self {
            dir,
            etcd,
            config,
            topology,
        }
    }
}

#[test]
fn a_device_on_etcd_forwards_by_the_map_and_is_a_member_while_it_runs() {
    let OnEtcd {
        dir, etcd, config, ..
    } = OnEtcd::start();
    let members = || members(&etcd);

    // The server reads the same map from its file; the device from etcd.
    let server = pmem_server_with(
        testkit::binary("pmem-server"),
        &config,
        "S",
        &dir.path().join("data"),
        &[],
    )
    .expect("server");
    let device = device_on_etcd(&etcd.endpoint(), "F", &[]).expect("device");
    assert_eq!(device.field("epoch"), "1");
    device.wait_links_up(1);
    let mut conn = Conn::connect(device.addr("port.p0"));
    conn.hello("c");
    let layout = testkit::layout(&config);
    let entry = &layout.entries()[0];
    let key = conn.region_key(entry.region.0);
    let write = Repr::write(proto::request::Target::Pmem(entry.start), key, b"on etcd");
    assert_eq!(conn.call(write).status, Status::Ok);

    let live = members();
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!((live[0].role, live[0].name.as_str()), (Role::Device, "F"));
    assert_eq!(live[0].address, device.addr("admin").to_string());
    device.kill9();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !members().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(members().is_empty(), "the record outlived the process");
    drop(server);
}

/// A metric the daemon must have.
fn metric(daemon: &Daemon, name: &str) -> f64 {
    daemon
        .metric(name, "")
        .unwrap_or_else(|| panic!("no {name}:\n{}", daemon.metrics()))
}

/// Device F on `etcd`, insecure.
fn device_f(etcd: &Etcd) -> Daemon {
    device_on_etcd(&etcd.endpoint(), "F", &[]).expect("device")
}

fn write_at(addr: proto::PmemAddr, key: proto::AccessKey, data: &[u8]) -> Repr<'_> {
    Repr::write(proto::request::Target::Pmem(addr), key, data)
}

#[test]
fn a_device_follows_epochs_that_add_and_remove_a_server_while_it_serves() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
    let (config_one, config_two) = testkit::one_then_two_servers(dir.path());
    let text = |path: &std::path::Path| std::fs::read_to_string(path).expect("topology");
    put_map(&etcd, 1, &text(&config_one));

    let server = |config: &std::path::Path, id: &str| {
        pmem_server_with(
            testkit::binary("pmem-server"),
            config,
            id,
            &dir.path().join(format!("data-{id}")),
            &[],
        )
        .expect("server")
    };
    let _s1 = server(&config_one, "S1");
    // The new server runs before the map names it, as an operator would
    // start it before adding it.
    let _s2 = server(&config_two, "S2");
    let device = device_f(&etcd);
    assert_eq!(device.field("epoch"), "1");
    device.wait_links_up(1);
    assert_eq!(metric(&device, "fabric_device_map_epoch"), 1.0);

    let layout = testkit::layout(&config_two);
    let (r1, r2) = (&layout.entries()[0], &layout.entries()[1]);
    let mut conn = Conn::connect(device.addr("port.p0"));
    conn.hello("c");
    let k1 = conn.region_key(r1.region.0);
    assert_eq!(
        conn.call(write_at(r2.start, k1, b"too early")).status,
        Status::Unmapped,
        "epoch 1 does not place R2"
    );

    // Requests in flight while the map changes all complete.
    let mut tags = Vec::new();
    for i in 0..200u64 {
        let data = i.to_le_bytes();
        tags.push(conn.send(&proto::Message::Request(write_at(
            proto::PmemAddr(r1.start.0 + i * 8),
            k1,
            &data,
        ))));
    }
    put_map(&etcd, 2, &text(&config_two));
    for i in 200..400u64 {
        let data = i.to_le_bytes();
        tags.push(conn.send(&proto::Message::Request(write_at(
            proto::PmemAddr(r1.start.0 + i * 8),
            k1,
            &data,
        ))));
    }
    for tag in tags {
        let reply = conn.recv();
        assert_eq!(reply.tag, tag);
        assert_eq!(reply.status, Status::Ok, "{reply:?}");
    }
    device.wait_for_log("map epoch=2 applied");
    assert_eq!(metric(&device, "fabric_device_map_epoch"), 2.0);
    device.wait_links_up(2);

    // The same connection now reaches the new server's region.
    let k2 = conn.region_key(r2.region.0);
    assert_eq!(
        conn.call(write_at(r2.start, k2, b"on S2")).status,
        Status::Ok
    );
    let read = Repr::read(proto::request::Target::Pmem(r2.start), k2, 5);
    let reply = conn.call(read);
    assert_eq!(
        (reply.status, reply.data.as_slice()),
        (Status::Ok, &b"on S2"[..])
    );

    // Epoch 3 takes the server away again: its region is refused by the
    // device, the other one is still served on the same connection.
    put_map(&etcd, 3, &text(&config_one));
    device.wait_for_log("map epoch=3 applied");
    assert_eq!(
        conn.call(write_at(r2.start, k2, b"gone")).status,
        Status::Unmapped
    );
    assert_eq!(
        conn.call(write_at(r1.start, k1, b"kept")).status,
        Status::Ok
    );
}

#[test]
fn a_device_keeps_its_map_through_bad_maps_an_etcd_outage_and_a_compaction() {
    let OnEtcd {
        dir,
        mut etcd,
        config,
        topology,
    } = OnEtcd::start();
    let _server = pmem_server_with(
        testkit::binary("pmem-server"),
        &config,
        "S",
        &dir.path().join("data"),
        &[],
    )
    .expect("server");
    let device = device_f(&etcd);
    device.wait_links_up(1);
    let layout = testkit::layout(&config);
    let r1 = &layout.entries()[0];
    let mut conn = Conn::connect(device.addr("port.p0"));
    conn.hello("c");
    let key = conn.region_key(r1.region.0);
    let served = |conn: &mut Conn, what: &[u8]| {
        assert_eq!(conn.call(write_at(r1.start, key, what)).status, Status::Ok);
    };

    // An invalid map put by hand is refused, once, naming why; the device
    // keeps epoch 1 and serves.
    put_map(&etcd, 2, &topology.replace("extent_size", "extent_sizes"));
    device.wait_for_log("refusing the map at etcd /pmem-fabric/test/map");
    let log = device.stderr_so_far();
    assert!(
        log.contains("(epoch 2)") && log.contains("keeping epoch 1"),
        "{log}"
    );
    assert_eq!(log.matches("refusing the map").count(), 1, "{log}");
    assert_eq!(metric(&device, "fabric_device_map_epoch"), 1.0);
    served(&mut conn, b"bad map");

    // etcd goes away: the device says so once and keeps forwarding.
    etcd.kill();
    device.wait_for_log("lost the map watch on etcd");
    served(&mut conn, b"no etcd");
    std::thread::sleep(Duration::from_secs(2));
    served(&mut conn, b"still no etcd");
    let log = device.stderr_so_far();
    assert_eq!(log.matches("lost the map watch").count(), 1, "{log}");
    assert!(metric(&device, "fabric_device_etcd_errors_total") >= 1.0);
    // It comes back: a change made afterwards reaches the device.
    etcd.restart().unwrap_or_else(|e| panic!("etcd again: {e}"));
    put_map(
        &etcd,
        3,
        &topology.replace("[pool]\n", "[pool]\n# epoch 3\n"),
    );
    device.wait_for_log("map epoch=3 applied");
    device.wait_for_log("following the map on etcd again");
    served(&mut conn, b"epoch 3");
    assert!(metric(&device, "fabric_device_map_watch_restarts_total") >= 1.0);

    // Stopped while the map changes twice and etcd compacts its history:
    // once resumed, the device reaches the newest epoch.
    device.signal(libc::SIGSTOP);
    put_map(
        &etcd,
        4,
        &topology.replace("[pool]\n", "[pool]\n# epoch 4\n"),
    );
    put_map(
        &etcd,
        5,
        &topology.replace("[pool]\n", "[pool]\n# epoch 5\n"),
    );
    let status = etcd
        .ctl(&["endpoint", "status", "-w", "json"])
        .expect("status");
    let at = status.find("\"revision\":").expect("revision") + "\"revision\":".len();
    let revision: String = status[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    etcd.ctl(&["compact", &revision]).expect("compact");
    device.signal(libc::SIGCONT);
    device.wait_for_log("map epoch=5 applied");
    served(&mut conn, b"epoch 5");
}

#[test]
fn a_device_that_cannot_reach_etcd_says_which_endpoints_it_tried() {
    let port = testkit::free_loopback_port();
    let url = format!("http://127.0.0.1:{port}");
    let err = device_on_etcd(&url, "F", &[]).expect_err("no etcd there");
    assert!(
        err.contains(&format!("cannot reach etcd at {url}")),
        "{err}"
    );
}

/// Says MAP_EPOCH `epoch` on `conn`; the answer's status and value (the
/// listener's epoch).
fn say_epoch(conn: &mut Conn, epoch: u64) -> (Status, u64) {
    let tag = conn.send(&proto::Message::MapEpoch(epoch));
    let reply = conn.recv();
    assert_eq!(reply.tag, tag);
    (reply.status, reply.value)
}

#[test]
fn a_client_on_an_older_epoch_is_refused_stale_map_until_it_says_the_new_one() {
    let OnEtcd {
        dir,
        etcd,
        config,
        topology,
    } = OnEtcd::start();
    // Both follow the map: the device says its epoch on its link.
    let _server = server_on_etcd(&etcd.endpoint(), "S", &dir.path().join("data"), &[]);
    let device = device_f(&etcd);
    device.wait_links_up(1);
    let layout = testkit::layout(&config);
    let r1 = &layout.entries()[0];
    let mut conn = Conn::connect(device.addr("port.p0"));
    conn.hello("c");
    let key = conn.region_key(r1.region.0);
    assert_eq!(say_epoch(&mut conn, 1), (Status::Ok, 1));
    assert_eq!(
        conn.call(write_at(r1.start, key, b"epoch 1")).status,
        Status::Ok
    );

    // The map moves on to epoch 2; the device applies it.
    put_map(
        &etcd,
        2,
        &topology.replace("[pool]\n", "[pool]\n# epoch 2\n"),
    );
    device.wait_for_log("map epoch=2 applied");
    let stale = conn.call(write_at(r1.start, key, b"epoch 1 again"));
    assert_eq!(
        (stale.status, stale.value),
        (Status::StaleMap, 2),
        "refused with the device's epoch"
    );
    assert_eq!(metric(&device, "fabric_device_stale_map_total"), 1.0);
    let read = Repr::read(proto::request::Target::Pmem(r1.start), key, 7);
    let reply = conn.call(read);
    assert_eq!(reply.status, Status::StaleMap);

    // Caught up: served again, and the refused write never ran.
    assert_eq!(say_epoch(&mut conn, 2), (Status::Ok, 2));
    let reply = conn.call(read);
    assert_eq!(
        (reply.status, reply.data.as_slice()),
        (Status::Ok, &b"epoch 1"[..])
    );
    // A connection that says no epoch is served as before.
    let mut unfenced = Conn::connect(device.addr("port.p0"));
    unfenced.hello("c");
    assert_eq!(unfenced.call(read).status, Status::Ok);
}

#[test]
fn a_device_takes_its_clients_keys_from_each_new_map() {
    use proto::hello::Role;
    use topology::secrets::{Principal, write_key};
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
    let mut ports = Ports::new();
    let base = FabricSpec::new().server("S", &[("R1", "4MiB")]).device("F");
    let mut text = |spec: FabricSpec, name: &str| {
        let path = spec.write(dir.path(), name, &mut ports);
        std::fs::read_to_string(&path).expect("topology")
    };
    // Epoch 1 names c1; epoch 2 replaces it by c2; epoch 3 adds c3, whose
    // key file is not a key.
    let one = text(base.clone().client("c1"), "one.toml");
    let two = text(base.clone().client("c2"), "two.toml");
    let three = text(base.clone().client("c2").client("c3"), "three.toml");
    let secrets = dir.path().join("secrets");
    let (c1_key, c2_key) = ([0xC1; 32], [0xC2; 32]);
    write_key(&secrets, Principal::Device("F"), &[0x11; 32]).expect("key");
    write_key(&secrets, Principal::Client("c1"), &c1_key).expect("key");
    write_key(&secrets, Principal::Client("c2"), &c2_key).expect("key");
    write_key(&secrets, Principal::Client("c3"), &[0xC3; 32]).expect("key");
    std::fs::write(
        secrets.join(Principal::Client("c3").file_name()),
        "not a key\n",
    )
    .expect("spoil c3's key");
    put_map(&etcd, 1, &one);

    let keyed = ["--secrets", secrets.to_str().expect("a UTF-8 path")];
    let data = dir.path().join("data");
    let server = server_on_etcd(&etcd.endpoint(), "S", &data, &keyed);
    let device = device_on_etcd(&etcd.endpoint(), "F", &keyed)
        .unwrap_or_else(|e| panic!("{FABRIC_DEVICE}: {e}"));
    device.wait_links_up(1);
    let r1 = testkit::layout(&dir.path().join("one.toml")).entries()[0].clone();
    let port = device.addr("port.p0");
    let proven = |client: &str, key: [u8; 32]| {
        let mut conn = Conn::connect(port);
        conn.authenticate(Role::Client, client, key).map(|()| conn)
    };
    let write = |conn: &mut Conn, what: &[u8]| {
        let key = conn.region_key(r1.region.0);
        conn.call(write_at(r1.start, key, what)).status
    };

    let mut c1 = proven("c1", c1_key).expect("c1 is in epoch 1");
    let c1_region_key = c1.region_key(r1.region.0);
    assert_eq!(write(&mut c1, b"c1 at epoch 1"), Status::Ok);
    assert!(
        proven("c2", c2_key).is_err(),
        "c2 is not in epoch 1: refused although its key is in the folder"
    );

    // Epoch 2: c2 may prove its key without a restart; c1 may not, and its
    // open connection is refused at its next request.
    put_map(&etcd, 2, &two);
    server.wait_for_log("map epoch=2 applied");
    device.wait_for_log("map epoch=2 applied");
    let log = device.stderr_so_far();
    assert!(log.contains("map epoch=2: client c2 may connect"), "{log}");
    assert!(
        log.contains("map epoch=2: client c1 is no longer in the map"),
        "{log}"
    );
    let mut c2 = proven("c2", c2_key).expect("c2 is in epoch 2");
    assert_eq!(write(&mut c2, b"c2 at epoch 2"), Status::Ok);
    assert!(proven("c1", c1_key).is_err(), "c1 left the map at epoch 2");
    let refused = c1.call(write_at(r1.start, c1_region_key, b"c1 at epoch 2"));
    assert_eq!(refused.status, Status::UnknownClient, "{refused:?}");

    // Epoch 3 adds c3, whose key file is not a key: the device leaves c3
    // out, saying why and naming the file, and applies the rest of the map
    // (staying on epoch 2 would have the server answer STALE_MAP to every
    // request it forwards).
    put_map(&etcd, 3, &three);
    device.wait_for_log("map epoch=3 applied");
    let log = device.stderr_so_far();
    let c3_file = secrets.join(Principal::Client("c3").file_name());
    assert!(
        log.contains("map epoch=3: client c3 cannot connect")
            && log.contains(&format!("{}: not a key", c3_file.display())),
        "{log}"
    );
    assert!(proven("c3", [0xC3; 32]).is_err(), "c3 has no usable key");
    server.wait_for_log("map epoch=3 applied");
    assert_eq!(write(&mut c2, b"c2 at epoch 3"), Status::Ok);
}
