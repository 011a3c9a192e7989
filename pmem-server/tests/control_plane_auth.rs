//! A pmem-server on an etcd with authentication on: it needs its own etcd
//! user's credentials file; without one it is told which to pass, and
//! another server's user cannot register it.

use control::access;
use control::{Endpoints, Role};
use testkit::{Daemon, Etcd, write_topology};

mod support;

use support::{members, put_map, server_on_etcd};

/// Server `S` of pool `test`'s map in etcd (no fabric keys), with `extra`
/// flags.
fn server_on(etcd: &str, data: &std::path::Path, extra: &[&str]) -> Result<Daemon, String> {
    server_on_etcd(etcd, "S", data, extra)
}

#[test]
fn a_server_on_an_etcd_with_authentication_runs_as_its_own_user_only() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
    let topology =
        std::fs::read_to_string(write_topology(dir.path(), &[("R1", "4MiB")])).expect("topology");
    put_map(&etcd, 1, topology);
    let endpoints = Endpoints::parse(&etcd.endpoint()).expect("endpoint");
    let daemons = [
        (Role::Server, "S".to_owned()),
        (Role::Server, "T".to_owned()),
    ];
    let made = access::secure_blocking(&endpoints, "test", &daemons, None).expect("secure");
    let root = made.root.as_ref().expect("root");
    etcd.set_root(root.user(), root.password());
    let creds = dir.path().join("creds");
    made.write_to(&creds).expect("credentials files");
    let data = dir.path().join("data");
    let url = etcd.endpoint();

    // No credentials: it does not start, and says which to pass.
    let err = server_on(&url, &data, &[]).expect_err("no credentials");
    assert!(
        err.contains("--etcd-credentials") && err.contains("authentication on"),
        "{err}"
    );

    // Server T's credentials read the map, but cannot register S.
    let t = access::daemon_file(&creds, Role::Server, "T");
    let err = server_on(
        &url,
        &data,
        &["--etcd-credentials", t.to_str().expect("path")],
    )
    .expect_err("another server's user");
    assert!(
        err.contains("pmem-fabric.test.server.T may not")
            && err.contains("/pmem-fabric/test/members/server/S"),
        "{err}"
    );

    // Its own: it serves and is a member while it runs.
    let s = access::daemon_file(&creds, Role::Server, "S");
    let server = server_on(
        &url,
        &data,
        &["--etcd-credentials", s.to_str().expect("path")],
    )
    .expect("server with its own credentials");
    assert_eq!(server.field("epoch"), "1");
    let members = || members(&etcd);
    let live = members();
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!((live[0].role, live[0].name.as_str()), (Role::Server, "S"));
    let (status, _) = server.terminate();
    assert!(status.success());
    assert!(members().is_empty(), "its record went with it");
}
