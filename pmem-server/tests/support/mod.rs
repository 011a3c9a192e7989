//! What pmem-server's tests on the control plane share: this package's
//! daemon on a real etcd's pool `test`, the map put there as an operator
//! would, the pool's live members read back, and fabric devices' keys and
//! their authenticated connections. Each test file takes it with
//! `mod support;` and uses part of it.
#![allow(dead_code)] // each test binary uses its own part

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use control::{ClusterMap, Keys, Member};
use proto::hello::Role;
use proto::opening::OpeningError;
use testkit::{Conn, Daemon, Etcd};
use topology::secrets::{Principal, write_key};

/// This package's daemon, built with the features of the test run.
pub const PMEM_SERVER: &str = env!("CARGO_BIN_EXE_pmem-server");

/// How long a test waits for the server to do what it should do soon (a
/// bound on a wait, not a measurement).
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Starts server `server` of pool `test`'s map on `etcd` with its data in
/// `data` and `extra` flags (`--insecure` unless they give `--secrets`),
/// and waits until it is ready.
pub fn server_on_etcd(
    etcd: &str,
    server: &str,
    data: &Path,
    extra: &[&str],
) -> Result<Daemon, String> {
    Daemon::spawn(testkit::pmem_server_on_etcd_spec(
        PMEM_SERVER,
        etcd,
        "test",
        server,
        data,
        extra,
    ))
}

/// Puts `map` as pool `test`'s map, as an operator's change would.
pub fn put_cluster_map(etcd: &Etcd, map: &ClusterMap) {
    etcd.put(&Keys::of("test").map(), &map.to_json())
        .expect("etcdctl put");
}

/// Puts `topology` as pool `test`'s map at `epoch`.
pub fn put_map(etcd: &Etcd, epoch: u64, topology: impl Into<String>) {
    put_cluster_map(etcd, &ClusterMap::new(epoch, topology));
}

/// The live members of pool `test`, read with etcdctl.
pub fn members(etcd: &Etcd) -> Vec<Member> {
    etcd.get_json_prefix(&Keys::of("test").members())
}

/// The keys of fabric devices F and G, written to a `keys` folder.
#[derive(Debug)]
pub struct DeviceKeys {
    /// The folder, for `--secrets`.
    pub secrets: PathBuf,
    /// F's key.
    pub f: [u8; 32],
    /// G's key.
    pub g: [u8; 32],
}

impl DeviceKeys {
    /// Writes F's and G's keys to `dir/keys`.
    pub fn write(dir: &Path) -> Self {
        let secrets = dir.join("keys");
        std::fs::create_dir_all(&secrets).expect("keys folder");
        let (f, g) = ([0xF1; 32], [0x61; 32]);
        write_key(&secrets, Principal::Device("F"), &f).expect("F's key");
        write_key(&secrets, Principal::Device("G"), &g).expect("G's key");
        Self { secrets, f, g }
    }

    /// `--secrets DIR`, for a server that proves these keys.
    pub fn flags(&self) -> [&str; 2] {
        ["--secrets", self.secrets.to_str().expect("a UTF-8 path")]
    }
}

/// A connection to the server at `data` proven as fabric device `name`.
pub fn as_device(data: SocketAddr, name: &str, key: [u8; 32]) -> Result<Conn, OpeningError> {
    let mut conn = Conn::connect(data);
    conn.authenticate(Role::FabricDevice, name, key)
        .map(|()| conn)
}
