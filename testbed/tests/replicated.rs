//! Replicated regions under `testbed run` and `chaos`, as users run them:
//! the real binary, real daemons, every region kept twice (`--replicas 2`),
//! and every serving copy compared byte for byte after the run.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use testkit::{FabricSpec, Ports};

/// Two servers (each its own failure domain), two fabric devices, two
/// clients with one RNIC per device, on free loopback ports.
fn topology(dir: &Path) -> PathBuf {
    FabricSpec::new()
        .server("A", &[("A1", "16MiB"), ("A2", "16MiB")])
        .server("B", &[("B1", "16MiB"), ("B2", "16MiB")])
        .device("F1")
        .device("F2")
        .client("c1")
        .client("c2")
        .write(dir, "topology.toml", &mut Ports::new())
}

/// Runs testbed on a fresh topology with `args` (the command first);
/// returns its output and the folder holding topology and reports.
fn testbed(args: &[&str]) -> (Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = topology(dir.path());
    let reports = dir.path().join("reports");
    let mut all: Vec<&str> = args.to_vec();
    all.insert(1, config.to_str().expect("utf-8 path"));
    all.extend(["--reports", reports.to_str().expect("utf-8 path")]);
    let output = Command::new(env!("CARGO_BIN_EXE_testbed"))
        .args(&all)
        .output()
        .expect("run testbed");
    (output, dir)
}

fn text(output: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The report of the single run under `dir/reports`.
fn report(dir: &Path) -> serde_json::Value {
    let runs: Vec<PathBuf> = std::fs::read_dir(dir.join("reports"))
        .expect("reports folder")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    let json = std::fs::read_to_string(runs[0].join("report.json")).expect("report.json");
    serde_json::from_str(&json).expect("report.json parses")
}

#[test]
fn more_copies_than_servers_are_refused_naming_the_problem() {
    let (output, _dir) = testbed(&["run", "--replicas", "3", "--duration", "1"]);
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
    let (output, dir) = testbed(&[
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

/// A server stopped with SIGSTOP past its liveness lease and the devices'
/// request timeout, then let go with SIGCONT once the map in etcd took a
/// copy it holds out of service, the workload running throughout: the
/// application sees nothing, everything acknowledged reads back, what the
/// thawed server then answers reaches no client, and the copies that still
/// serve are identical.
#[test]
fn a_frozen_server_is_fenced_off_and_its_thaw_makes_no_copy_diverge() {
    let (output, dir) = testbed(&[
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
    let (output, dir) = testbed(&["run", "--duration", "2", "--replicas", "2"]);
    let out = text(&output);
    assert!(output.status.success(), "{out}");
    assert!(
        out.contains("replicas        identical: 4 regions"),
        "{out}"
    );
    assert_eq!(report(dir.path())["replicas"]["regions_compared"], 4);
}
