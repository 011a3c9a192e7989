//! Advice that fits the command: what `run` and `up` say when asked for
//! what the topology or the data directory cannot give, run as users run
//! them (the real binary, real daemons).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use testkit::{FabricSpec, Ports};

mod support;

use support::{testbed_in, text};

/// One server, one fabric device, two clients, on free loopback ports.
fn topology(dir: &Path) -> PathBuf {
    FabricSpec::new()
        .server("A", &[("A1", "16MiB")])
        .device("F1")
        .client("c1")
        .client("c2")
        .write(dir, "topology.toml", &mut Ports::new())
}

#[test]
fn run_refuses_more_clients_than_the_topology_has() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = topology(dir.path());
    let config = config.to_str().expect("utf-8 path");
    let output = testbed_in(dir.path(), &["run", config, "--clients", "5"]);
    let said = text(&output);
    assert!(!output.status.success(), "{said}");
    assert!(said.contains("--clients 5"), "{said}");
    assert!(said.contains("has 2 client(s) (c1, c2)"), "{said}");
    assert!(
        !dir.path().join("reports").exists(),
        "refused before any fabric started: {said}"
    );
    let output = testbed_in(dir.path(), &["run", config, "--clients", "0"]);
    assert!(!output.status.success(), "{}", text(&output));
}

#[test]
fn up_on_unfit_region_files_advises_its_own_format_option() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = topology(dir.path());
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("A")).expect("mkdir");
    std::fs::write(data.join("A/A1.pmem"), vec![0xA5; 8192]).expect("a foreign file");
    let args = [
        "up",
        config.to_str().expect("utf-8 path"),
        "--data-dir",
        data.to_str().expect("utf-8 path"),
    ];
    let refused = testbed_in(dir.path(), &args);
    let said = text(&refused);
    assert!(!refused.status.success(), "{said}");
    assert!(said.contains("`testbed up --format`"), "{said}");

    // With --format it starts; Ctrl-C's SIGINT stops it cleanly.
    let mut up = Command::new(env!("CARGO_BIN_EXE_testbed"))
        .args(args)
        .arg("--format")
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start testbed up --format");
    let mut lines = BufReader::new(up.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref().map_while(Result::ok) {
        let done = line.contains("fabric is up");
        seen.push(line);
        if done {
            break;
        }
    }
    assert!(
        seen.last().is_some_and(|l| l.contains("fabric is up")),
        "{seen:#?}"
    );
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(i32::try_from(up.id()).expect("pid"), libc::SIGINT);
    }
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(up.wait().expect("wait").success(), "{rest:#?}");
}
