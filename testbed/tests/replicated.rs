//! Replicated regions under `testbed run` and `chaos`, as users run them:
//! the real binary, real daemons, every region kept twice (`--replicas 2`),
//! and every serving copy compared byte for byte after the run.

use std::path::Path;

mod support;

// Runs go on a fresh fabric of two servers (each its own failure domain),
// two devices and two clients.
use support::{run_dir, run_in_fresh_fabric, text};

/// The report of the single run under `dir/reports`.
fn report(dir: &Path) -> serde_json::Value {
    support::report(&run_dir(dir))
}

#[test]
fn more_copies_than_servers_are_refused_naming_the_problem() {
    let (output, _dir) = run_in_fresh_fabric(&["run", "--replicas", "3", "--duration", "1"]);
    let out = text(&output);
    assert!(!output.status.success(), "{out}");
    assert!(out.contains("--replicas 3"), "{out}");
    assert!(out.contains("topology.toml"), "{out}");
    assert!(out.contains("failure domain"), "{out}");
}

/// On etcd, so the map records the killed server's copies `offline` (the
/// owner device marks them): those are not compared, since a copy that
/// missed writes serves again only after a resync; every serving copy is.
#[test]
fn chaos_kill_server_with_two_copies_is_invisible_and_the_copies_stay_identical() {
    let (output, dir) = run_in_fresh_fabric(&[
        "chaos",
        "--scenario",
        "kill-server",
        "--faults",
        "1",
        "--duration",
        "6",
        "--replicas",
        "2",
        "--control",
        "etcd",
    ]);
    let out = text(&output);
    assert!(output.status.success(), "{out}");
    assert!(out.contains("verification    PASSED"), "{out}");
    assert!(out.contains("errors seen     0"), "{out}");
    assert!(out.contains("replicas        identical: "), "{out}");
    let report = report(dir.path());
    assert_eq!(report["faults"][0]["kind"], "kill-server");
    assert_eq!(report["faults"][0]["errors_seen"], 0);
    assert_eq!(report["replicas"]["differences"], serde_json::json!([]));
    let identical = report["replicas"]["identical"].as_u64().expect("identical");
    let compared = report["replicas"]["regions_compared"]
        .as_u64()
        .expect("compared");
    let skipped = report["replicas"]["not_compared"]
        .as_array()
        .expect("not compared")
        .len() as u64;
    assert_eq!(identical, compared, "{out}");
    assert_eq!(compared + skipped, 4, "{out}");
    assert!(
        report["replay"]
            .as_str()
            .is_some_and(|r| r.contains("--replicas 2")),
        "{report}"
    );
}

/// On etcd, killing a fabric device that owns replicated regions under
/// the mixed workload: the application sees no error (the other device
/// takes the regions over, or the killed one is back first: which one
/// wins depends on the machine's load, so the owners are only reported;
/// `fabric-device/tests/takeover.rs` checks the takeover itself), and the
/// copies that still serve are equal.
#[test]
fn chaos_kill_fabric_with_two_copies_is_invisible() {
    let (output, dir) = run_in_fresh_fabric(&[
        "chaos",
        "--scenario",
        "kill-fabric",
        "--faults",
        "1",
        "--duration",
        "6",
        "--replicas",
        "2",
        "--control",
        "etcd",
    ]);
    let out = text(&output);
    assert!(output.status.success(), "{out}");
    assert!(out.contains("verification    PASSED"), "{out}");
    assert!(out.contains("errors seen     0"), "{out}");
    let report = report(dir.path());
    assert_eq!(report["faults"][0]["kind"], "kill-fabric");
    assert_eq!(report["faults"][0]["errors_seen"], 0);
    let notes = report["notes"].as_array().expect("notes");
    assert!(
        notes
            .iter()
            .filter_map(|n| n.as_str())
            .any(|n| n.starts_with("replica sets at the end: ")),
        "{report}"
    );
    assert_eq!(report["replicas"]["differences"], serde_json::json!([]));
}

/// A server stopped with SIGSTOP past its liveness lease and the devices'
/// request timeout, then let go with SIGCONT once the map in etcd took a
/// copy it holds out of service, the workload running throughout: the
/// application sees nothing, everything acknowledged reads back, what the
/// thawed server then answers reaches no client, and the copies that still
/// serve are identical.
#[test]
fn a_frozen_server_is_fenced_off_and_its_thaw_makes_no_copy_diverge() {
    let (output, dir) = run_in_fresh_fabric(&[
        "chaos",
        "--scenario",
        "freeze-server",
        "--faults",
        "1",
        "--duration",
        "20",
        "--replicas",
        "2",
        "--control",
        "etcd",
    ]);
    let out = text(&output);
    assert!(output.status.success(), "{out}");
    assert!(out.contains("verification    PASSED"), "{out}");
    assert!(out.contains("errors seen     0"), "{out}");
    let report = report(dir.path());
    let fault = &report["faults"][0];
    assert_eq!(fault["kind"], "freeze-server", "{out}");
    assert_eq!(fault["errors_seen"], 0, "{out}");
    assert!(fault["restored_at_s"].is_number(), "thawed: {out}");
    // The thaw came only once the map in etcd had taken a copy of the
    // frozen server out of service (the run fails otherwise). A copy out of
    // service is not compared (it may have missed writes); every region
    // whose two copies serve compares equal, the frozen server's untouched
    // copies included.
    let replicas = &report["replicas"];
    assert_eq!(replicas["differences"], serde_json::json!([]), "{out}");
    let compared = replicas["regions_compared"].as_u64().expect("compared");
    let identical = replicas["identical"].as_u64().expect("identical");
    let out_of_service = replicas["not_compared"].as_array().expect("not compared");
    assert_eq!(identical, compared, "{out}");
    assert_eq!(compared + out_of_service.len() as u64, 4, "{out}");
    for line in out_of_service {
        let line = line.as_str().expect("a line");
        assert!(line.contains("1 serving copy"), "{line}");
    }
}

#[test]
fn a_run_with_two_copies_leaves_every_copy_identical() {
    let (output, dir) = run_in_fresh_fabric(&["run", "--duration", "2", "--replicas", "2"]);
    let out = text(&output);
    assert!(output.status.success(), "{out}");
    assert!(
        out.contains("replicas        identical: 4 regions"),
        "{out}"
    );
    assert_eq!(report(dir.path())["replicas"]["regions_compared"], 4);
}
