//! The register workload's history, checked for linearizability by
//! stateright's tester, on today's unreplicated fabric under faults that
//! should leave it linearizable, and with every region kept twice while a
//! server dies: the real binary, real daemons.

use std::path::{Path, PathBuf};

mod support;

use support::{testbed, text, two_by_two};

/// A register chaos run of `scenario` with one fault (and `extra`
/// arguments), which must pass; returns the run's folder (inside `dir`)
/// and its report.
fn register_chaos(dir: &Path, scenario: &str, extra: &[&str]) -> (PathBuf, serde_json::Value) {
    // The default topology's shape with three clients.
    let config = two_by_two(dir, &["c1", "c2", "c3"]);
    let reports = dir.join("reports");
    let mut args = vec![
        "chaos",
        config.to_str().expect("utf-8 path"),
        "--scenario",
        scenario,
        "--faults",
        "1",
        "--workload",
        "register",
        "--clients",
        "3",
        "--depth",
        "3",
        "--duration",
        "5",
        "--reports",
        reports.to_str().expect("utf-8 path"),
    ];
    args.extend_from_slice(extra);
    let output = testbed(&args);
    let out = text(&output);
    assert!(output.status.success(), "{out}");
    assert!(out.contains("  linearizability PASSED ("), "{out}");
    let run = std::fs::read_dir(&reports)
        .expect("reports")
        .map(|e| e.expect("entry").path())
        .next()
        .expect("a run folder");
    let json = std::fs::read_to_string(run.join("report.json")).expect("report.json");
    let report: serde_json::Value = serde_json::from_str(&json).expect("report parses");
    assert_eq!(report["workload"], "register");
    assert_eq!(report["faults"][0]["kind"], scenario, "{out}");
    assert!(report["faults"][0]["restored_at_s"].is_number(), "{out}");
    let check = &report["linearizability"];
    assert_eq!(check["passed"], true, "{out}");
    assert_eq!(check["words"], 8, "{out}");
    // Every client issued operations, and each has its history.
    for client in ["c1", "c2", "c3", "setup"] {
        let history = run.join("workers").join(format!("{client}.history.jsonl"));
        let lines = std::fs::read_to_string(&history).expect("history file");
        assert!(lines.lines().count() >= 8, "{}: {lines}", history.display());
    }
    assert!(check["ops"].as_u64().expect("ops") > 100, "{out}");
    (run, report)
}

/// Replaces the value the first READ of `run`'s client c1 saw, not 0, by one
/// no operation stored; returns the word.
fn tamper_with_a_read(run: &Path) -> u64 {
    let path = run.join("workers").join("c1.history.jsonl");
    let text = std::fs::read_to_string(&path).expect("history");
    let mut lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("entry"))
        .collect();
    let read = lines
        .iter_mut()
        .find(|e| e["outcome"]["ok"]["read"].as_u64().is_some_and(|v| v != 0))
        .expect("a read that saw a stored value");
    read["outcome"]["ok"]["read"] = serde_json::json!(0x0bad_cafe_u64);
    let word = read["word"].as_u64().expect("word");
    let out: Vec<String> = lines.iter().map(|e| e.to_string()).collect();
    std::fs::write(&path, out.join("\n")).expect("write history");
    word
}

#[test]
fn register_under_kill_fabric_is_linearizable_and_a_forged_read_is_caught() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (run, report) = register_chaos(dir.path(), "kill-fabric", &[]);
    // A fabric device's death stays invisible to the application.
    assert_eq!(report["faults"][0]["errors_seen"], 0);
    // The recorded history checks again on its own, then fails once one
    // read is made to see a value nobody stored.
    let run_arg = run.to_str().expect("utf-8 path");
    let output = testbed(&["check-linearizable", run_arg]);
    let out = text(&output);
    assert!(output.status.success(), "{out}");
    assert!(out.contains("linearizability: PASSED ("), "{out}");
    let word = tamper_with_a_read(&run);
    let output = testbed(&["check-linearizable", run_arg]);
    let out = text(&output);
    assert!(!output.status.success(), "{out}");
    assert!(
        out.contains(&format!("no linearization of word [{word}]")),
        "{out}"
    );
    assert!(
        out.contains(&format!("read -> read {}", 0x0bad_cafe_u64)),
        "{out}"
    );
}

#[test]
fn register_under_restart_all_is_linearizable() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_, report) = register_chaos(dir.path(), "restart-all", &[]);
    assert_eq!(report["faults"][0]["target"], "all");
}

#[test]
fn check_linearizable_names_a_folder_without_history() {
    let dir = tempfile::tempdir().expect("temp dir");
    let output = testbed(&["check-linearizable", dir.path().to_str().expect("utf-8")]);
    let out = text(&output);
    assert!(!output.status.success(), "{out}");
    assert!(
        out.contains("no *.history.jsonl file here or in workers/"),
        "{out}"
    );
}

/// Two copies of every region on etcd, a server killed and restarted under
/// the register workload: the application sees no error, and the history
/// of reads, writes, compare-and-swaps and fetch-and-adds on the hot words
/// (atomics decided at one copy, their words and records carried to the
/// other) is linearizable.
#[test]
fn register_with_two_copies_under_kill_server_is_linearizable() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_, report) = register_chaos(
        dir.path(),
        "kill-server",
        &["--replicas", "2", "--control", "etcd"],
    );
    assert_eq!(report["faults"][0]["errors_seen"], 0);
    assert_eq!(report["replicas"]["differences"], serde_json::json!([]));
}
