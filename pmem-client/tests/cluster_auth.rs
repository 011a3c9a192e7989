//! `pmemctl cluster` against a real etcd with authentication on: `secure`
//! sets it up for a topology, the operator's credentials change the map,
//! none are refused with the flag to pass, a daemon's are refused.

use std::path::Path;
use std::process::Command;

use testkit::Etcd;

const DEFAULT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/default.toml");

/// Runs `pmemctl cluster --etcd ENDPOINT ARGS…` with `credentials` (a file)
/// in the environment when given: exit code, stdout, stderr.
fn cluster(endpoint: &str, credentials: Option<&Path>, args: &[&str]) -> (i32, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pmemctl"));
    command
        .args(["cluster", "--etcd", endpoint])
        .args(args)
        .env_remove("PMEM_FABRIC_ETCD")
        .env_remove(control::CREDENTIALS_ENV);
    if let Some(file) = credentials {
        command.env(control::CREDENTIALS_ENV, file);
    }
    let out = command.output().expect("run pmemctl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn after_secure_only_the_operators_credentials_change_the_map() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
    let e = etcd.endpoint();
    let creds = dir.path().join("creds");
    let creds_arg = creds.to_str().expect("utf-8 path");

    let (code, out, err) = cluster(
        &e,
        None,
        &["secure", "--from", DEFAULT, "--credentials-out", creds_arg],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("etcd authentication on"), "{out}");
    for file in [
        "root.etcd",
        "operator.etcd",
        "server.A.etcd",
        "device.B.etcd",
        "client.c1.etcd",
        "client.c2.etcd",
    ] {
        assert!(out.contains(file), "{file} in {out}");
        assert!(creds.join(file).is_file(), "{file}");
    }
    // No password is printed.
    let operator = std::fs::read_to_string(creds.join("operator.etcd")).expect("read");
    let password = operator.trim().split_once(':').expect("user:password").1;
    assert!(!out.contains(password), "{out}");

    // Without credentials: refused, told which to pass.
    let (code, _, err) = cluster(&e, None, &["init", "--from", DEFAULT]);
    assert_ne!(code, 0);
    assert!(
        err.contains("--etcd-credentials") && err.contains("operator.etcd"),
        "{err}"
    );

    // The operator loads the map (credentials from the environment, or
    // from the flag).
    let (code, out, err) = cluster(
        &e,
        Some(&creds.join("operator.etcd")),
        &["init", "--from", DEFAULT],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("at epoch 1"), "{out}");
    let operator_flag = creds.join("operator.etcd");
    let (code, out, err) = cluster(
        &e,
        None,
        &[
            "--etcd-credentials",
            operator_flag.to_str().expect("path"),
            "--pool",
            "default",
            "show",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("pool default: map epoch 1"), "{out}");

    // Server A's user reads but may not change the map.
    let server_a = creds.join("server.A.etcd");
    let (code, _, err) = cluster(
        &e,
        Some(&server_a),
        &["apply", "--from", DEFAULT, "--epoch", "1"],
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("pmem-fabric.default.server.A") && err.contains("may not"),
        "{err}"
    );

    // Client c1's user reads the map and nothing else, and writes nothing.
    let c1 = std::fs::read_to_string(creds.join("client.c1.etcd")).expect("read");
    let c1 = c1.trim();
    assert!(c1.starts_with("pmem-fabric.default.client.c1:"), "{c1}");
    let as_c1 = |args: &[&str]| {
        let user = format!("--user={c1}");
        let mut all = vec![user.as_str()];
        all.extend_from_slice(args);
        etcd.ctl(&all)
    };
    let map = as_c1(&["get", "/pmem-fabric/default/map", "--print-value-only"]).expect("c1 reads");
    assert!(map.contains("\"epoch\":1"), "{map}");
    for refused in [
        vec!["get", "/pmem-fabric/default/intent/", "--prefix"],
        vec!["put", "/pmem-fabric/default/map", "{}"],
        vec!["put", "/pmem-fabric/default/members/client/c1", "{}"],
    ] {
        let err = as_c1(&refused).expect_err("c1 may read the map only");
        assert!(err.contains("permission denied"), "{refused:?}: {err}");
    }

    // A credentials file others may read is refused, naming the fix.
    std::fs::set_permissions(
        &server_a,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .expect("chmod");
    let (code, _, err) = cluster(&e, Some(&server_a), &["--pool", "default", "show"]);
    assert_ne!(code, 0);
    assert!(err.contains("chmod 600"), "{err}");
}
