//! What the fabric device's tests between real processes share: this
//! package's daemon and the workspace's pmem-server on a real etcd's pool
//! `test`, maps put there as an operator would and read back, the pool's
//! live members, a topology of servers A (region A1) and B (region B1) with
//! two copies of each region, region addresses, a copy's bytes from its
//! file, and a daemon's metrics. Each test file takes it with `mod
//! support;` and uses part of it.

#![allow(dead_code)] // each test binary uses its own part

use std::path::{Path, PathBuf};
use std::time::Duration;

use control::{ClusterMap, Keys, Member};
use proto::request::Target;
use proto::{AccessKey, Status};
use testkit::{Conn, Daemon, DaemonSpec, Etcd, FabricSpec, Ports, file_bytes};
use topology::{Layout, PmemAddr};

/// This package's daemon, built with the features of the test run.
pub const FABRIC_DEVICE: &str = env!("CARGO_BIN_EXE_fabric-device");

/// How long a test waits for a daemon to do what it should do soon (a
/// bound on a wait, not a measurement).
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Starts fabric device `device` of pool `test`'s map on `etcd` with
/// `extra` flags (`--insecure` unless they give `--secrets`), and waits
/// until it is ready.
pub fn device_on_etcd(etcd: &str, device: &str, extra: &[&str]) -> Result<Daemon, String> {
    Daemon::spawn(testkit::fabric_device_on_etcd_spec(
        FABRIC_DEVICE,
        etcd,
        "test",
        device,
        extra,
    ))
}

/// Starts the workspace's pmem-server as server `server` of pool `test`'s
/// map on `etcd`, its data in `data`, with `extra` flags (`--insecure`
/// unless they give `--secrets`); panics naming the server when it does
/// not start.
pub fn server_on_etcd(etcd: &str, server: &str, data: &Path, extra: &[&str]) -> Daemon {
    Daemon::spawn(testkit::pmem_server_on_etcd_spec(
        testkit::binary("pmem-server"),
        etcd,
        "test",
        server,
        data,
        extra,
    ))
    .unwrap_or_else(|e| panic!("pmem-server {server}: {e}"))
}

/// Puts `map` as pool `test`'s map, as an operator's change would.
pub fn put_cluster_map(etcd: &Etcd, map: &ClusterMap) {
    etcd.put(&Keys::of("test").map(), &map.to_json())
        .expect("etcdctl put");
}

/// Puts `topology` as pool `test`'s map at `epoch`.
pub fn put_map(etcd: &Etcd, epoch: u64, topology: &str) {
    put_cluster_map(etcd, &ClusterMap::new(epoch, topology));
}

/// The live members of pool `test`, read with etcdctl.
pub fn members(etcd: &Etcd) -> Vec<Member> {
    etcd.get_json_prefix(&Keys::of("test").members())
}

/// The map pool `test` holds in etcd now.
pub fn map_now(etcd: &Etcd) -> ClusterMap {
    etcd.get_json_prefix(&Keys::of("test").map())
        .pop()
        .expect("a map")
}

/// Flags that make a device notice a dead server within a test's patience
/// and reconnect to a restarted one quickly.
pub const DEVICE_FLAGS: &[&str] = &[
    "--request-timeout-ms",
    "2000",
    "--reconnect-min-ms",
    "20",
    "--reconnect-max-ms",
    "200",
];

/// The data directory of `server` under the test's directory `dir`.
pub fn data_dir(dir: &Path, server: &str) -> PathBuf {
    dir.join("data").join(server)
}

/// Writes `dir/topology.toml`: servers A (region A1) and B (region B1) of
/// 4 MiB, `devices`, client `client`, and two copies of every region
/// (`replicas = 2`). Returns its path and its text.
pub fn replicated_topology(dir: &Path, devices: &[&str], client: &str) -> (PathBuf, String) {
    let mut spec = FabricSpec::new()
        .server("A", &[("A1", "4MiB")])
        .server("B", &[("B1", "4MiB")]);
    for device in devices {
        spec = spec.device(device);
    }
    let config = spec
        .client(client)
        .write(dir, "topology.toml", &mut Ports::new());
    let text = std::fs::read_to_string(&config).expect("read the topology");
    let replicated = text.replacen("name = \"test\"", "name = \"test\"\nreplicas = 2", 1);
    assert_ne!(
        text, replicated,
        "the [pool] table is where testkit writes it"
    );
    std::fs::write(&config, &replicated).expect("write the topology");
    (config, replicated)
}

/// Puts `topology` in `etcd` as pool `test`'s map at epoch 1.
pub fn put_first_map(etcd: &Etcd, topology: String) -> ClusterMap {
    let map = ClusterMap::new(1, topology);
    etcd.put(&Keys::of("test").map(), &map.to_json())
        .expect("etcdctl put");
    map
}

/// pmem-server `server` following pool `test` in `etcd`, on its data
/// directory under `dir` (again, after a kill).
pub fn server_on(etcd: &Etcd, server: &str, dir: &Path) -> Daemon {
    Daemon::spawn(
        DaemonSpec::new(testkit::binary("pmem-server"))
            .args(["--etcd", &etcd.endpoint(), "--pool", "test"])
            .args(["--server", server, "--admin", "127.0.0.1:0"])
            .args(["--insecure", "--data-dir"])
            .arg(data_dir(dir, server)),
    )
    .unwrap_or_else(|e| panic!("pmem-server {server} did not start:\n{e}"))
}

/// Fabric device `device` following pool `test` in `etcd`, with `flags`.
pub fn device_on(etcd: &Etcd, device: &str, flags: &[&str]) -> Daemon {
    Daemon::spawn(
        DaemonSpec::new(FABRIC_DEVICE)
            .args(["--etcd", &etcd.endpoint(), "--pool", "test"])
            .args(["--device", device, "--admin", "127.0.0.1:0", "--insecure"])
            .args(flags),
    )
    .unwrap_or_else(|e| panic!("fabric-device {device} did not start:\n{e}"))
}

/// A raw client connection to `device`'s port p0, said HELLO as `client`.
pub fn client(device: &Daemon, client: &str) -> Conn {
    let mut conn = Conn::connect(device.addr("port.p0"));
    let reply = conn.hello(client);
    assert_eq!(reply.status, Status::Ok, "{reply:?}");
    conn
}

/// The address of `offset` in `region`.
pub fn pmem(layout: &Layout, region: &str, offset: u64) -> Target {
    let entry = layout.entry_by_id(&region.into()).expect("region");
    Target::Pmem(PmemAddr(entry.start.get() + offset))
}

/// `region`'s key, as the layout knows it.
pub fn key(layout: &Layout, region: &str) -> AccessKey {
    layout.entry_by_id(&region.into()).expect("region").key
}

/// `len` bytes at `offset` of `server`'s copy of `region`, from its file
/// (past the region header), under the test's directory `dir`.
pub fn copy_bytes(dir: &Path, server: &str, region: &str, offset: u64, len: usize) -> Vec<u8> {
    file_bytes(&data_dir(dir, server), region, offset, len)
}

/// The sum of `daemon`'s samples of metric `name` (every label set).
pub fn metric(daemon: &Daemon, name: &str) -> f64 {
    let (code, text) =
        telemetry::http_get(daemon.addr("admin"), "/metrics", Duration::from_secs(5))
            .expect("scrape the daemon's metrics");
    assert_eq!(code, 200);
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
