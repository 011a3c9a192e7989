//! A fabric device on the control plane (`--etcd`): it takes the map from
//! a real etcd, forwards by it, and is a member while it runs.

use std::time::{Duration, Instant};

use control::{ClusterMap, Keys, Member, Role};
use proto::Status;
use proto::request::Repr;
use testkit::{Conn, Daemon, DaemonSpec, Etcd, FabricSpec, Ports, pmem_server_with};

const FABRIC_DEVICE: &str = env!("CARGO_BIN_EXE_fabric-device");

#[test]
fn a_device_on_etcd_forwards_by_the_map_and_is_a_member_while_it_runs() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
    let config = FabricSpec::new()
        .server("S", &[("R1", "4MiB")])
        .device("F")
        .client("c")
        .write(dir.path(), "topology.toml", &mut Ports::new());
    let topology = std::fs::read_to_string(&config).expect("topology");
    let map = ClusterMap { epoch: 1, topology };
    etcd.put(&Keys::of("test").map(), &map.to_json())
        .expect("etcdctl put");
    let members = || -> Vec<Member> {
        let records = etcd
            .get_prefix(&Keys::of("test").members())
            .expect("etcdctl get");
        records
            .iter()
            .map(|(key, v)| serde_json::from_str(v).unwrap_or_else(|e| panic!("{key}: {e}")))
            .collect()
    };

    // The server reads the same map from its file; the device from etcd.
    let server = pmem_server_with(
        testkit::binary("pmem-server"),
        &config,
        "S",
        &dir.path().join("data"),
        &[],
    )
    .expect("server");
    let device = Daemon::spawn(
        DaemonSpec::new(FABRIC_DEVICE)
            .args([
                "--etcd",
                &etcd.endpoint(),
                "--pool",
                "test",
                "--device",
                "F",
            ])
            .args(["--admin", "127.0.0.1:0", "--insecure"]),
    )
    .expect("device");
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
