//! What the testbed's integration tests share: the fabric most of them run
//! on, the real `testbed` binary run as a user runs it, and the run folder
//! and report it leaves. Each test file takes it with `mod support;` and
//! uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use testkit::{FabricSpec, Ports};

/// Two servers with two 16 MiB regions each, two fabric devices, and
/// `clients` (one RNIC per device each), on free loopback ports; written
/// to `dir/topology.toml`.
pub fn two_by_two(dir: &Path, clients: &[&str]) -> PathBuf {
    let spec = FabricSpec::new()
        .server("A", &[("A1", "16MiB"), ("A2", "16MiB")])
        .server("B", &[("B1", "16MiB"), ("B2", "16MiB")])
        .device("F1")
        .device("F2");
    clients
        .iter()
        .fold(spec, |spec, client| spec.client(client))
        .write(dir, "topology.toml", &mut Ports::new())
}

/// Runs the testbed binary with `args` and waits for it.
pub fn testbed(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_testbed"))
        .args(args)
        .output()
        .expect("run testbed")
}

/// Runs the testbed binary with `args` in the folder `dir` and waits.
pub fn testbed_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_testbed"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run testbed")
}

/// Runs the testbed's command `args[0]` on a fresh [`two_by_two`] fabric
/// (clients c1 and c2) with its reports in a fresh folder, the rest of
/// `args` after the topology; returns the output and the folder holding
/// topology and reports.
pub fn run_in_fresh_fabric(args: &[&str]) -> (Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = two_by_two(dir.path(), &["c1", "c2"]);
    let reports = dir.path().join("reports");
    let mut all: Vec<&str> = args.to_vec();
    all.insert(1, config.to_str().expect("utf-8 path"));
    all.extend(["--reports", reports.to_str().expect("utf-8 path")]);
    (testbed(&all), dir)
}

/// What a process printed: its stdout, then its stderr.
pub fn text(output: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The single run folder under `dir/reports`.
pub fn run_dir(dir: &Path) -> PathBuf {
    let mut runs: Vec<PathBuf> = std::fs::read_dir(dir.join("reports"))
        .expect("reports folder")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    runs.remove(0)
}

/// The `report.json` of the run folder `run`.
pub fn report(run: &Path) -> serde_json::Value {
    let json = std::fs::read_to_string(run.join("report.json")).expect("read report.json");
    serde_json::from_str(&json).expect("report.json parses")
}
