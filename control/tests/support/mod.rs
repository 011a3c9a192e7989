//! What the control plane's tests against a secured etcd share: a
//! repository config, an etcd whose pool `test` has users for servers A
//! and B and the devices named, and a daemon's credentials among them.

#![allow(dead_code)] // each test binary uses its own part

use control::access::{self, PoolCredentials};
use control::{Credentials, Endpoints, Role};
use testkit::Etcd;

/// The text of `configs/<name>` in the repository.
pub fn config(name: &str) -> String {
    let path = format!("{}/../configs/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// An etcd with pool `test` secured for servers A, B and `devices`, and
/// authentication on.
pub async fn secured(
    dir: &std::path::Path,
    devices: &[&str],
) -> (Etcd, Endpoints, PoolCredentials) {
    let mut etcd = Etcd::start(dir).unwrap_or_else(|e| panic!("etcd: {e}"));
    let endpoints = Endpoints::parse(&etcd.endpoint()).expect("endpoint");
    let daemons: Vec<(Role, String)> = [(Role::Server, "A"), (Role::Server, "B")]
        .into_iter()
        .chain(devices.iter().map(|d| (Role::Device, *d)))
        .map(|(role, name)| (role, name.to_owned()))
        .collect();
    let made = access::secure(&endpoints, "test", &daemons, None)
        .await
        .expect("secure");
    let root = made.root.as_ref().expect("a root was made");
    etcd.set_root(root.user(), root.password());
    (etcd, endpoints, made)
}

/// The etcd credentials made for daemon `name` in `role`.
pub fn daemon<'c>(made: &'c PoolCredentials, role: Role, name: &str) -> &'c Credentials {
    made.daemons
        .iter()
        .find(|(r, n, _)| *r == role && n == name)
        .map(|(_, _, c)| c)
        .expect("a user per daemon")
}
