//! What the testbed's integration tests share: the fabric most of them run
//! on, the real `testbed` binary run as a user runs it (`testbed up` kept
//! running until the test stops it), and the run folder and report it
//! leaves. Each test file takes it with `mod support;` and uses part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Lines};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};

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
/// topology and reports. A run that fails keeps the folder (its logs and
/// region files are what explains it) and says where on stderr.
pub fn run_in_fresh_fabric(args: &[&str]) -> (Output, tempfile::TempDir) {
    let mut dir = tempfile::tempdir().expect("temp dir");
    let config = two_by_two(dir.path(), &["c1", "c2"]);
    let reports = dir.path().join("reports");
    let mut all: Vec<&str> = args.to_vec();
    all.insert(1, config.to_str().expect("utf-8 path"));
    all.extend(["--reports", reports.to_str().expect("utf-8 path")]);
    let output = testbed(&all);
    if !output.status.success() {
        dir.disable_cleanup(true);
        eprintln!("the failed run's folder is kept: {}", dir.path().display());
    }
    (output, dir)
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

/// A `testbed up` process and the lines it printed before "fabric is up".
pub struct Up {
    /// The `testbed up` process.
    pub child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    /// What it printed before "fabric is up".
    pub table: Vec<String>,
    /// Its folder: topology, data, keys and run folder.
    pub dir: tempfile::TempDir,
}

/// `testbed up` on a fresh [`two_by_two`] fabric (clients c1 and c2) with
/// `extra` flags.
pub fn start_up(extra: &[&str]) -> Up {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = two_by_two(dir.path(), &["c1", "c2"]);
    start_up_in(dir, &config, extra)
}

/// `testbed up CONFIG --data-dir DIR/data EXTRA…` run in `dir`, once it
/// printed that the fabric is up.
pub fn start_up_in(dir: tempfile::TempDir, config: &Path, extra: &[&str]) -> Up {
    let mut child = Command::new(env!("CARGO_BIN_EXE_testbed"))
        .args(["up", config.to_str().expect("path"), "--data-dir"])
        .arg(dir.path().join("data"))
        .args(extra)
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start testbed up");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut table = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("line");
        if line.contains("fabric is up") {
            break;
        }
        table.push(line);
    }
    assert!(!table.is_empty(), "testbed up printed nothing");
    Up {
        child,
        lines,
        table,
        dir,
    }
}

impl Up {
    /// The keys' folder `testbed up` made and printed (`keys: DIR …`).
    pub fn keys(&self) -> PathBuf {
        self.table
            .iter()
            .find_map(|l| l.strip_prefix("keys: ")?.split_whitespace().next())
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("no keys line: {:#?}", self.table))
    }

    /// The words of the operator's `cluster: pmemctl cluster …` line.
    pub fn cluster_line(&self) -> Vec<&str> {
        self.table
            .iter()
            .find_map(|l| l.strip_prefix("cluster: "))
            .unwrap_or_else(|| panic!("no cluster line: {:#?}", self.table))
            .split_whitespace()
            .collect()
    }

    /// SIGTERM, then every daemon must report stopped and the exit be 0;
    /// returns the folder, data included.
    pub fn stop(mut self) -> tempfile::TempDir {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(i32::try_from(self.child.id()).expect("pid"), libc::SIGTERM);
        }
        let rest: Vec<String> = self.lines.map_while(Result::ok).collect();
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "{rest:#?}");
        assert_eq!(
            rest.iter().filter(|l| l.ends_with(": stopped")).count(),
            4,
            "{rest:#?}"
        );
        self.dir
    }
}
