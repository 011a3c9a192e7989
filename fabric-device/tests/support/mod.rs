//! What the fabric device's tests on the control plane share: this
//! package's daemon and the workspace's pmem-server on a real etcd's pool
//! `test`, the map put there as an operator would, and the pool's live
//! members read back. Each test file takes it with `mod support;` and uses
//! part of it.
#![allow(dead_code)] // each test binary uses its own part

use std::path::Path;
use std::time::Duration;

use control::{ClusterMap, Keys, Member};
use testkit::{Daemon, Etcd};

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
