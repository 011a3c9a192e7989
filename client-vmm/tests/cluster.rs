//! `pmemctl cluster` against a real etcd: loading the map, showing it,
//! changing it at a known epoch, draining a server, and the errors an
//! operator sees.

use std::process::Command;

use testkit::Etcd;

const DEFAULT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/default.toml");

/// Runs `pmemctl cluster --etcd ENDPOINT ARGS…`: exit code, stdout, stderr.
fn cluster(endpoint: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pmemctl"))
        .args(["cluster", "--etcd", endpoint])
        .args(args)
        .env_remove("PMEM_FABRIC_ETCD")
        .output()
        .expect("run pmemctl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn an_operator_loads_shows_changes_and_drains_through_etcd() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
    let e = etcd.endpoint();

    let (code, out, err) = cluster(&e, &["init", "--from", DEFAULT]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        format!("pool default: map loaded from {DEFAULT} at epoch 1\n")
    );
    let (code, _, err) = cluster(&e, &["init", "--from", DEFAULT]);
    assert_ne!(code, 0);
    assert!(
        err.contains("already holds a map") && err.contains("epoch 1"),
        "{err}"
    );

    let (code, out, err) = cluster(&e, &["--pool", "default", "show"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("pool default: map epoch 1"), "{out}");
    for line in [
        "servers:\n  A            active    not live",
        "devices:\n  A            active    not live",
    ] {
        assert!(out.contains(line), "{line:?} in\n{out}");
    }
    assert!(out.contains("region PA.1"), "{out}");

    // A change made against an old epoch is refused before anything is
    // written; against the current one it lands as the next epoch.
    let changed = dir.path().join("changed.toml");
    let text = std::fs::read_to_string(DEFAULT).expect("default");
    std::fs::write(
        &changed,
        text.replace("extent_size = \"2MiB\"", "extent_size = \"1MiB\""),
    )
    .expect("write");
    let changed = changed.to_str().expect("path");
    let (code, _, err) = cluster(&e, &["apply", "--from", changed, "--epoch", "7"]);
    assert_ne!(code, 0);
    assert!(err.contains("the map is at epoch 1, not 7"), "{err}");
    let (code, out, err) = cluster(&e, &["apply", "--from", changed, "--epoch", "1"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("epoch 1 -> 2"), "{out}");

    let (code, out, err) = cluster(&e, &["--pool", "default", "drain-server", "A"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("server A: intent recorded as draining"),
        "{out}"
    );
    let (_, out, _) = cluster(&e, &["--pool", "default", "show"]);
    assert!(out.contains("map epoch 2"), "{out}");
    assert!(out.contains("  A            draining  not live"), "{out}");
    let (code, _, err) = cluster(&e, &["--pool", "default", "drain-server", "Z"]);
    assert_ne!(code, 0);
    assert!(err.contains("has no server Z"), "{err}");
}

#[test]
fn bad_endpoints_and_an_unreachable_etcd_are_named() {
    let (code, _, err) = cluster("localhost:2379", &["--pool", "p", "show"]);
    assert_ne!(code, 0);
    assert!(err.contains("http://HOST:PORT"), "{err}");
    let port = testkit::free_loopback_port();
    let (code, _, err) = cluster(
        &format!("http://127.0.0.1:{port}"),
        &["--pool", "p", "show"],
    );
    assert_ne!(code, 0);
    assert!(
        err.contains(&format!("cannot reach etcd at http://127.0.0.1:{port}")),
        "{err}"
    );
    // Every other command still needs a topology file.
    let out = Command::new(env!("CARGO_BIN_EXE_pmemctl"))
        .args(["--client", "c1", "map"])
        .output()
        .expect("run pmemctl");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--config TOPOLOGY is needed"));
}
