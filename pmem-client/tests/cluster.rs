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

    // Its regions have one copy each: each gets a copy on B, which no
    // server runs here, so the drain stops at its first wait and says so;
    // its steps stay in the map.
    let (code, out, err) = cluster(
        &e,
        &["--pool", "default", "drain-server", "A", "--timeout", "1"],
    );
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("server A: intent recorded as draining")
            && out.contains("region PA.1: copy added on B"),
        "{out}"
    );
    assert!(
        err.contains("region PA.1: the copy on B is still syncing after 1 s, so A's copy is kept"),
        "{err}"
    );
    // The regions that had one copy are recorded for a drain run again.
    let record = control::Keys::of("default").drain_single_copies("A");
    let recorded = etcd.get_prefix(&record).expect("etcdctl get");
    assert!(
        recorded.len() == 1 && recorded[0].1.lines().any(|r| r == "PA.1"),
        "{recorded:?}"
    );
    let (_, out, _) = cluster(&e, &["--pool", "default", "show"]);
    assert!(out.contains("  A            draining  not live"), "{out}");
    let (code, out, err) = cluster(
        &e,
        &["--pool", "default", "drain-server", "A", "--intent-only"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("server A: intent recorded as draining"),
        "{out}"
    );
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

/// Server C's snippet for `add-server`: one region, one NIC; a third server
/// for the default topology.
const SERVER_C_FILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../topology/tests/fixtures/snippets/server_c.toml"
);

#[test]
fn an_operator_adds_and_removes_servers_and_devices_one_epoch_each() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
    let e = etcd.endpoint();
    let snippet = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write snippet");
        path.to_str().expect("path").to_owned()
    };
    let run = |args: &[&str]| cluster(&e, &[&["--pool", "default"], args].concat());
    let (code, _, err) = cluster(&e, &["init", "--from", DEFAULT]);
    assert_eq!(code, 0, "{err}");

    let (code, out, err) = run(&["add-server", "--from", SERVER_C_FILE]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("pool default: server C added at epoch 2\n"),
        "{out}"
    );
    assert!(
        out.contains("every fabric device (A, B) is linked"),
        "{out}"
    );
    let (_, out, _) = run(&["show"]);
    assert!(out.contains("map epoch 2"), "{out}");
    assert!(out.contains("  C            active    not live"), "{out}");
    assert!(
        out.contains("region PC.1") && out.contains("of C: unreachable"),
        "{out}"
    );
    let (code, _, err) = run(&["add-server", "--from", SERVER_C_FILE]);
    assert_ne!(code, 0);
    assert!(err.contains("already has a server C"), "{err}");

    // A server holding regions goes only by force, which names them.
    let (code, _, err) = run(&["remove-server", "C"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("holds regions PC.1") && err.contains("--force"),
        "{err}"
    );
    let (code, out, err) = run(&["remove-server", "C", "--force"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("removed at epoch 3"), "{out}");
    assert!(out.contains("regions PC.1 become unreachable"), "{out}");
    let (_, out, _) = run(&["show"]);
    assert!(
        out.contains("not in the map: server C (removed, not live)"),
        "{out}"
    );
    assert!(!out.contains("region PC.1"), "{out}");

    // Devices: B goes (each client keeps its RNIC on A), A cannot go.
    let (code, out, err) = run(&["remove-device", "B"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("device B removed at epoch 4"), "{out}");
    assert!(out.contains("client c1 loses its RNIC(s) on B"), "{out}");
    let (code, _, err) = run(&["remove-device", "A"]);
    assert_ne!(code, 0);
    assert!(err.contains("without any RNIC"), "{err}");
    let b = snippet(
        "b.toml",
        "[[fabric_devices]]\nid = \"B\"\nports = [{ id = \"p0\", listen = \"127.0.2.2:7100\" }]\n\
         links = [{ server = \"A\", nic = \"n0\" }, { server = \"B\", nic = \"n0\" }]\n",
    );
    let (code, out, err) = run(&["add-device", "--from", &b]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("device B added at epoch 5"), "{out}");
    // An invalid result is refused whole: a device that misses a server.
    let bad = snippet(
        "bad.toml",
        "[[fabric_devices]]\nid = \"X\"\nports = [{ id = \"p0\", listen = \"127.0.2.9:7100\" }]\n\
         links = [{ server = \"A\", nic = \"n0\" }]\n",
    );
    let (code, _, err) = run(&["add-device", "--from", &bad]);
    assert_ne!(code, 0);
    assert!(err.contains("invalid cluster map"), "{err}");
    let (_, out, _) = run(&["show"]);
    assert!(out.contains("map epoch 5"), "{out}");
}

#[test]
fn two_operators_adding_servers_at_once_never_half_apply() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
    let e = etcd.endpoint();
    let (code, _, err) = cluster(&e, &["init", "--from", DEFAULT]);
    assert_eq!(code, 0, "{err}");
    let mut paths = Vec::new();
    for (id, ip) in [("D", "127.0.1.6"), ("E", "127.0.1.7")] {
        let text = std::fs::read_to_string(SERVER_C_FILE)
            .expect("read server C's snippet")
            .replace("\"C\"", &format!("\"{id}\""))
            .replace("PC.1", &format!("P{id}.1"))
            .replace("127.0.1.5", ip);
        let path = dir.path().join(format!("{id}.toml"));
        std::fs::write(&path, text).expect("write");
        paths.push(path.to_str().expect("path").to_owned());
    }
    // Both at once: each either lands as its own epoch or loses with a
    // conflict that names the epochs; nothing else.
    let outcomes: Vec<(i32, String, String)> = std::thread::scope(|s| {
        let runs: Vec<_> = paths
            .iter()
            .map(|p| {
                let e = &e;
                s.spawn(move || cluster(e, &["--pool", "default", "add-server", "--from", p]))
            })
            .collect();
        runs.into_iter()
            .map(|r| r.join().expect("pmemctl"))
            .collect()
    });
    let won: Vec<&str> = ["D", "E"]
        .into_iter()
        .zip(&outcomes)
        .filter(|(_, (code, _, _))| *code == 0)
        .map(|(id, _)| id)
        .collect();
    for (code, _, err) in &outcomes {
        if *code != 0 {
            assert!(
                err.contains("the map changed meanwhile") && err.contains("against epoch 1"),
                "{err}"
            );
        }
    }
    assert!(!won.is_empty(), "{outcomes:?}");
    let (_, out, _) = cluster(&e, &["--pool", "default", "show"]);
    assert!(
        out.contains(&format!("map epoch {}", 1 + won.len())),
        "{out}"
    );
    for id in ["D", "E"] {
        assert_eq!(
            out.contains(&format!("region P{id}.1")),
            won.contains(&id),
            "{out}"
        );
    }
}

#[test]
fn an_operator_sees_and_marks_the_copies_of_replicated_regions() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
    let e = etcd.endpoint();
    let replicated = dir.path().join("replicated.toml");
    let text = std::fs::read_to_string(DEFAULT).expect("default");
    std::fs::write(
        &replicated,
        text.replace("name = \"default\"", "name = \"default\"\nreplicas = 2"),
    )
    .expect("write");
    let from = replicated.to_str().expect("path");
    let (code, _, err) = cluster(&e, &["init", "--from", from]);
    assert_eq!(code, 0, "{err}");

    let (code, out, err) = cluster(&e, &["--pool", "default", "show"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(
            "copies: A:0 serving (primary), B:0 serving (backup); owner device A; replica set \
             version 1"
        ),
        "{out}"
    );
    assert!(
        out.contains("copies: B:1 serving (primary), A:1 serving (backup); owner device B"),
        "{out}"
    );

    let mark = |args: &[&str]| {
        let mut all = vec!["--pool", "default", "mark-replica"];
        all.extend_from_slice(args);
        cluster(&e, &all)
    };
    let (code, out, err) = mark(&["PA.1", "B", "offline"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "pool default: region PA.1: copy on B serving -> offline (replica set version 2, map \
         epoch 2)\n"
    );
    let (_, out, _) = cluster(&e, &["--pool", "default", "show"]);
    assert!(out.starts_with("pool default: map epoch 2"), "{out}");
    assert!(
        out.contains("copies: A:0 serving (primary), B:0 offline (backup); owner device A; replica set version 2"),
        "{out}"
    );

    // The last serving copy stays serving; nothing is written.
    let (code, _, err) = mark(&["PA.1", "A", "offline"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("would leave the region without a serving copy"),
        "{err}"
    );
    let (code, _, err) = mark(&["PA.1", "B", "serving"]);
    assert_ne!(code, 0);
    assert!(err.contains("mark it syncing"), "{err}");
    let (code, _, err) = mark(&["PA.1", "B", "gone"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("expected serving, syncing or offline"),
        "{err}"
    );
    let (_, out, _) = cluster(&e, &["--pool", "default", "show"]);
    assert!(out.starts_with("pool default: map epoch 2"), "{out}");

    // No server of A's is live: nothing could resync B's copy from it.
    let (code, _, err) = mark(&["PA.1", "B", "syncing"]);
    assert_ne!(code, 0);
    assert!(
        err.contains(
            "region PA.1: marking the copy on B syncing needs a serving copy to resync it \
             from, but server A (serving) is not live in etcd; nothing was changed"
        ),
        "{err}"
    );
    let (_, out, _) = cluster(&e, &["--pool", "default", "show"]);
    assert!(out.starts_with("pool default: map epoch 2"), "{out}");
}
