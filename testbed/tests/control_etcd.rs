//! Fabrics on the control plane (`--control etcd`) as users run them: the
//! real testbed binary starts a real etcd with its authentication on,
//! loads the topology, runs every daemon on it; chaos kills etcd (or its
//! leader) under the workload and the data path keeps serving.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod support;

use support::{report, run_dir, run_in_fresh_fabric, start_up, text, two_by_two};

/// A chaos run of `scenario` with one fault on a fresh fabric on etcd;
/// returns its output, report, run folder and the folder holding it all.
fn chaos_on_etcd(
    scenario: &str,
    extra: &[&str],
) -> (String, serde_json::Value, PathBuf, tempfile::TempDir) {
    let mut args = vec!["chaos", "--scenario", scenario, "--faults", "1"];
    args.extend(["--duration", "4", "--control", "etcd"]);
    args.extend(extra);
    let (output, dir) = run_in_fresh_fabric(&args);
    let out = text(&output);
    assert!(output.status.success(), "{out}");
    let run = run_dir(dir.path());
    (out, report(&run), run, dir)
}

/// The sum of `field` (`count`, `errors`) over every operation kind in
/// `report`.
fn total(report: &serde_json::Value, field: &str) -> u64 {
    report["ops"]
        .as_object()
        .expect("ops")
        .values()
        .map(|op| op[field].as_u64().expect("a number"))
        .sum()
}

/// The checks every etcd chaos run shares: one fault of `scenario`, no
/// application error, some operations, verification passed; the fault.
fn assert_one_fault_unseen<'r>(
    scenario: &str,
    out: &str,
    report: &'r serde_json::Value,
) -> &'r serde_json::Value {
    let faults = report["faults"].as_array().expect("faults");
    assert_eq!(faults.len(), 1, "{out}");
    assert_eq!(faults[0]["kind"], scenario, "{out}");
    assert_eq!(faults[0]["errors_seen"], 0, "{out}");
    assert_eq!(total(report, "errors"), 0, "{out}");
    assert!(total(report, "count") > 0, "{out}");
    assert_eq!(report["verification"]["passed"], true, "{out}");
    assert!(out.contains("verification    PASSED"), "{out}");
    &faults[0]
}

/// The common checks of an etcd chaos run: one fault of `scenario`,
/// restored; no application error; verification passed; every daemon took
/// its map from etcd as its own user.
fn assert_served_through(scenario: &str, out: &str, report: &serde_json::Value, run: &Path) {
    let fault = assert_one_fault_unseen(scenario, out, report);
    assert!(fault["restored_at_s"].is_number(), "etcd came back");
    let replay = report["replay"].as_str().expect("replay");
    assert!(replay.contains("--control etcd"), "{replay}");
    for log in [
        "pmem-server-A",
        "pmem-server-B",
        "fabric-device-F1",
        "fabric-device-F2",
    ] {
        let text = std::fs::read_to_string(run.join("logs").join(format!("{log}.log")))
            .unwrap_or_else(|e| panic!("{log}: {e}"));
        assert!(text.contains("at epoch 1 from etcd"), "{log}:\n{text}");
    }
    for file in [
        "root.etcd",
        "operator.etcd",
        "server.A.etcd",
        "device.F2.etcd",
    ] {
        let path = run.join("etcd-credentials").join(file);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
                .permissions(),
        );
        assert_eq!(mode & 0o077, 0, "{} is owner-only", path.display());
    }
}

#[test]
fn chaos_kill_etcd_under_the_workload_is_invisible_to_the_application() {
    let (out, report, run, _dir) = chaos_on_etcd("kill-etcd", &[]);
    assert_served_through("kill-etcd", &out, &report, &run);
    assert_eq!(report["faults"][0]["target"], "etcd");
    assert_eq!(report["parameters"]["control"], "etcd, 1 member(s)");
}

#[test]
fn chaos_kill_etcd_leader_of_three_members_is_invisible_to_the_application() {
    let (out, report, run, _dir) = chaos_on_etcd("kill-etcd-leader", &["--etcd-members", "3"]);
    assert_served_through("kill-etcd-leader", &out, &report, &run);
    // The report names the member that led.
    let target = report["faults"][0]["target"].as_str().expect("target");
    assert!(
        ["leader etcd0", "leader etcd1", "leader etcd2"].contains(&target),
        "{target}"
    );
    assert_eq!(report["parameters"]["control"], "etcd, 3 member(s)");
}

#[test]
fn etcd_scenarios_without_etcd_are_refused_with_the_flags_to_give() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = two_by_two(dir.path(), &["c1", "c2"]);
    for (args, needle) in [
        (vec!["--scenario", "kill-etcd"], "needs --control etcd"),
        (
            vec!["--scenario", "kill-etcd-leader", "--control", "etcd"],
            "--etcd-members 3",
        ),
        (
            vec!["--scenario", "kill-fabric", "--etcd-members", "3"],
            "needs --control etcd",
        ),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_testbed"))
            .args(["chaos", config.to_str().expect("utf-8 path")])
            .args(&args)
            .arg("--reports")
            .arg(dir.path().join("reports"))
            .output()
            .expect("run testbed");
        let out = text(&output);
        assert!(!output.status.success(), "{args:?}: {out}");
        assert!(out.contains(needle), "{args:?}: {out}");
    }
    assert!(!dir.path().join("reports").exists(), "nothing was started");
}

/// Runs `pmemctl ARGS…` with no etcd variables from the environment.
fn pmemctl(args: &[&str]) -> Output {
    Command::new(testkit::binary_in("pmem-client", "pmemctl"))
        .args(args)
        .env_remove("PMEM_FABRIC_ETCD")
        .env_remove("PMEM_FABRIC_ETCD_CREDENTIALS")
        .output()
        .expect("run pmemctl")
}

#[test]
fn up_on_etcd_prints_its_endpoint_and_the_operators_cluster_line() {
    let up = start_up(&["--control", "etcd"]);
    let printed = &up.table;
    let etcd_line = printed
        .iter()
        .find(|l| l.starts_with("etcd: http://127.0.0.1:"))
        .unwrap_or_else(|| panic!("no etcd line: {printed:#?}"));
    assert!(
        !etcd_line.contains(":2379 "),
        "never the system etcd: {etcd_line}"
    );
    let words = up.cluster_line();
    assert_eq!(words[..2], ["pmemctl", "cluster"], "{words:?}");

    // The operator's line works as printed: every daemon is live.
    let shown = pmemctl(&words[1..]);
    let out = text(&shown);
    assert!(shown.status.success(), "{out}");
    assert!(out.contains("map epoch 1"), "{out}");
    assert_eq!(out.matches("live at").count(), 4, "{out}");

    // Without credentials pmemctl is refused and told what to pass.
    let at = words
        .iter()
        .position(|w| *w == "--etcd-credentials")
        .expect("credentials flag");
    let mut bare: Vec<&str> = words[1..].to_vec();
    bare.drain(at - 1..at + 1);
    let refused = pmemctl(&bare);
    let out = text(&refused);
    assert!(!refused.status.success(), "{out}");
    assert!(
        out.contains("--etcd-credentials") && out.contains("operator.etcd"),
        "{out}"
    );

    // A daemon's own credentials read the map but cannot change it.
    let creds_dir = Path::new(words[at + 1])
        .parent()
        .expect("credentials folder");
    let server_a = creds_dir.join("server.A.etcd");
    let mut as_server: Vec<&str> = words[1..].to_vec();
    as_server[at] = server_a.to_str().expect("path");
    let last = as_server.len() - 1;
    as_server[last] = "drain-server";
    as_server.push("B");
    let refused = pmemctl(&as_server);
    let out = text(&refused);
    assert!(!refused.status.success(), "{out}");
    assert!(
        out.contains("pmem-fabric.") && out.contains("may not") && out.contains("intent"),
        "{out}"
    );
    up.stop();
}

/// The map epochs the report saw `daemon` run, in order.
fn epochs_of(report: &serde_json::Value, daemon: &str) -> Vec<u64> {
    report["map_epochs"]
        .as_array()
        .map(|changes| {
            changes
                .iter()
                .filter(|c| c["daemon"] == daemon)
                .map(|c| c["epoch"].as_u64().expect("an epoch"))
                .collect()
        })
        .unwrap_or_default()
}

/// The checks every membership change shares: one change, made at epoch
/// 2, no application error, verification passed.
fn assert_changed_under_load(scenario: &str, out: &str, report: &serde_json::Value) -> String {
    let fault = assert_one_fault_unseen(scenario, out, report);
    let target = fault["target"].as_str().expect("target").to_owned();
    assert!(target.ends_with(" at epoch 2"), "{target}");
    target
}

#[test]
fn chaos_add_server_under_the_workload_brings_the_held_back_server_in() {
    let (out, report, run, _dir) = chaos_on_etcd("add-server", &[]);
    let target = assert_changed_under_load("add-server", &out, &report);
    assert_eq!(target, "B at epoch 2", "the last server was held back");
    // The first map did not name B: the workers' map has A's regions only.
    let first = std::fs::read_to_string(run.join("topology.toml")).expect("first map");
    assert!(!first.contains("id = \"B1\""), "{first}");
    // B started on the changed map; both devices followed it (and linked to
    // B: the fault waits for every device link before it returns).
    let b = std::fs::read_to_string(run.join("logs/pmem-server-B.log")).expect("B's log");
    assert!(b.contains("at epoch 2 from etcd"), "{b}");
    for device in ["F1", "F2"] {
        let log = std::fs::read_to_string(run.join(format!("logs/fabric-device-{device}.log")))
            .expect("device log");
        assert!(log.contains("map epoch=2 applied"), "{device}:\n{log}");
        assert_eq!(
            epochs_of(&report, &format!("fabric-device {device}")),
            [1, 2],
            "{report:#}"
        );
    }
    assert_eq!(epochs_of(&report, "pmem-server B"), [2], "{report:#}");
    let markdown = std::fs::read_to_string(run.join("report.md")).expect("report.md");
    assert!(markdown.contains("## Map epochs"), "{markdown}");
    assert!(run.join("map_epochs.svg").exists());
    // The workers opened the pool on etcd and followed the change: each
    // ran epoch 1, then 2, and had a request served by B's regions.
    assert_workers_followed(&report, 2);
    let first_use = notes(&report)
        .into_iter()
        .find(|n| n.starts_with("map change → first use: server B added at epoch 2"))
        .unwrap_or_else(|| panic!("no first-use note: {report:#}"));
    for worker in ["c1", "c2"] {
        assert!(
            first_use.contains(&format!("{worker} "))
                && !first_use.contains(&format!("{worker} none")),
            "{first_use}"
        );
    }
}

/// The report's notes.
fn notes(report: &serde_json::Value) -> Vec<String> {
    report["notes"]
        .as_array()
        .expect("notes")
        .iter()
        .map(|n| n.as_str().expect("a note").to_owned())
        .collect()
}

/// Every worker (c1, c2) opened the pool on etcd at epoch 1 and ran
/// `epoch` after the change: its pool followed the map.
fn assert_workers_followed(report: &serde_json::Value, epoch: u64) {
    for worker in ["c1", "c2"] {
        assert_eq!(
            epochs_of(report, &format!("worker {worker}")),
            [1, epoch],
            "{report:#}"
        );
    }
}

#[test]
fn chaos_add_device_under_the_workload_is_admitted_by_every_server() {
    let (out, report, run, _dir) = chaos_on_etcd("add-device", &[]);
    let target = assert_changed_under_load("add-device", &out, &report);
    assert_eq!(target, "F2 at epoch 2", "the last device with a spare path");
    // Both servers took F2 from the new map, without a restart, and F2's
    // links came up (the fault waits for them).
    for server in ["A", "B"] {
        let log = std::fs::read_to_string(run.join(format!("logs/pmem-server-{server}.log")))
            .expect("server log");
        assert!(
            log.contains("map epoch=2: fabric device F2 may connect"),
            "{server}:\n{log}"
        );
        assert!(!log.contains("UNKNOWN_CLIENT"), "{server}:\n{log}");
        assert!(log.contains("map epoch=2 applied"), "{server}:\n{log}");
    }
    let f2 = std::fs::read_to_string(run.join("logs/fabric-device-F2.log")).expect("F2's log");
    assert!(f2.contains("at epoch 2 from etcd"), "{f2}");
    assert_workers_followed(&report, 2);
}

#[test]
fn chaos_remove_device_under_the_workload_is_invisible_to_the_application() {
    let (out, report, run, _dir) = chaos_on_etcd("remove-device", &[]);
    let target = assert_changed_under_load("remove-device", &out, &report);
    assert_eq!(target, "F2 at epoch 2", "the last device with a spare path");
    let f1 = std::fs::read_to_string(run.join("logs/fabric-device-F1.log")).expect("F1's log");
    assert!(f1.contains("map epoch=2 applied"), "{f1}");
    assert_eq!(epochs_of(&report, "fabric-device F1"), [1, 2], "{report:#}");
    for server in ["A", "B"] {
        assert_eq!(
            epochs_of(&report, &format!("pmem-server {server}")),
            [1, 2],
            "{report:#}"
        );
    }
    // F2 was stopped after it left the map and not seen again.
    let f2 = epochs_of(&report, "fabric-device F2");
    assert!(f2.iter().all(|&e| e == 1), "{f2:?}");
    // The servers dropped its key with the map that removed it.
    for server in ["A", "B"] {
        let log = std::fs::read_to_string(run.join(format!("logs/pmem-server-{server}.log")))
            .expect("server log");
        assert!(
            log.contains("map epoch=2: fabric device F2 is no longer in the map"),
            "{server}:\n{log}"
        );
    }
    assert_workers_followed(&report, 2);
}

/// Whether network namespaces can be made here; says why not otherwise.
fn namespaces_usable() -> bool {
    if let Err(e) = testbed::fabric::netns::require_root() {
        eprintln!("skipping: {e}");
        return false;
    }
    let made = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !made {
        eprintln!("skipping: `ip netns` does not work here (iproute2 missing?)");
    }
    made
}

#[test]
fn chaos_add_server_in_network_namespaces_workers_follow_over_their_management_links() {
    if !namespaces_usable() {
        return;
    }
    let (out, report, _run, _dir) = chaos_on_etcd("add-server", &["--net", "netns"]);
    assert_changed_under_load("add-server", &out, &report);
    // Each worker, in its client's namespace, reached etcd over its own
    // management link and followed the change.
    assert_workers_followed(&report, 2);
}

#[test]
fn up_in_network_namespaces_on_three_etcd_members_and_down_again() {
    if !namespaces_usable() {
        return;
    }
    let up = start_up(&["--net", "netns", "--control", "etcd", "--etcd-members", "3"]);
    let words = up.cluster_line();
    // Every daemon, each in its own namespace, reached etcd over its
    // management link and is live there.
    let shown = pmemctl(&words[1..]);
    let out = text(&shown);
    assert!(shown.status.success(), "{out}");
    assert!(out.contains("map epoch 1"), "{out}");
    assert_eq!(out.matches("live at").count(), 4, "{out}");
    // Their records carry their management addresses (10.240.0.0/12).
    assert_eq!(out.matches("live at 10.2").count(), 4, "{out}");
    let prefix = up
        .table
        .iter()
        .find_map(|l| l.split_whitespace().find(|w| w.starts_with("pf")))
        .map(|w| w.split('-').next().expect("prefix").to_owned());
    up.stop();
    if let Some(prefix) = prefix {
        let left = testbed::fabric::netns::list_namespaces().expect("ip netns list");
        assert!(
            !left.iter().any(|n| n.starts_with(&format!("{prefix}-"))),
            "{left:?}"
        );
    }
}
