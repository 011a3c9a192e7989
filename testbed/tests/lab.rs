//! The RDMA lab end to end: a QEMU guest whose stock Debian kernel (rxe)
//! and stock rdma-core are its RDMA stack runs the mixed workload on the
//! verbs transport through the fabric devices' RoCEv2 ports, while both
//! devices are killed in turn; every acknowledged write and atomic reads
//! back. Needs root, QEMU and the lab image (the lab's scripts install and
//! build them), and the `verbs` feature: `scripts/test.sh` runs it as
//! `cargo test -p testbed --features verbs --test lab`.
#![cfg(feature = "verbs")]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

static LAB: Mutex<()> = Mutex::new(());

/// Runs `testbed chaos --net lab` with two faults of `scenario` and checks
/// the run: it passed, the application saw no error, and the workload went
/// over RoCEv2 without damaged or out-of-sequence packets. Returns the
/// report and the guest's rxe counters.
fn lab_chaos(scenario: &str) -> (serde_json::Value, BTreeMap<String, u64>) {
    // One lab at a time: every run uses the same namespace.
    let _lab = LAB
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().expect("temp dir");
    let reports = dir.path().join("reports");
    let out = Command::new(env!("CARGO_BIN_EXE_testbed"))
        .args(["chaos", "--net", "lab", "--scenario", scenario])
        .args(["--faults", "2", "--duration", "10", "--seed", "3"])
        .arg("--reports")
        .arg(&reports)
        .output()
        .expect("run testbed");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let runs: Vec<PathBuf> = std::fs::read_dir(&reports)
        .map(|d| d.map(|e| e.expect("entry").path()).collect())
        .unwrap_or_default();
    let logs = runs
        .first()
        .map(|run| {
            let console =
                std::fs::read_to_string(run.join("logs/guest-c1.log")).unwrap_or_default();
            let worker =
                std::fs::read_to_string(run.join("logs/worker-c1.log")).unwrap_or_default();
            format!("guest console:\n{console}\nworker:\n{worker}")
        })
        .unwrap_or_default();
    assert!(out.status.success(), "{text}\n{logs}");
    assert_eq!(runs.len(), 1, "{runs:?}");

    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(runs[0].join("report.json")).expect("report.json"),
    )
    .expect("report JSON");
    assert_eq!(report["verification"]["passed"], true, "{text}");
    let ops: u64 = report["ops"]
        .as_object()
        .expect("ops")
        .values()
        .map(|s| s["count"].as_u64().unwrap_or(0))
        .sum();
    let errors: u64 = report["ops"]
        .as_object()
        .expect("ops")
        .values()
        .map(|s| s["errors"].as_u64().unwrap_or(0))
        .sum();
    assert!(ops > 100, "{text}");
    assert_eq!(
        errors, 0,
        "device kills are invisible to the application: {text}"
    );
    assert_eq!(report["faults"].as_array().map(Vec::len), Some(2), "{text}");

    // The workload really went over RoCEv2: both devices' ports carried it,
    // and neither side saw a damaged or out-of-sequence packet.
    let counters = |v: &serde_json::Value| -> BTreeMap<String, u64> {
        serde_json::from_value(v.clone()).expect("counters")
    };
    let roce = &report["roce"];
    for device in ["F1", "F2"] {
        let c = counters(&roce["devices"][device]);
        assert!(c["packets_received"] > 0, "{device}: {c:?}\n{text}");
        assert_eq!(c["icrc_errors"], 0, "{device}: {c:?}");
    }
    let guest = counters(&roce["guests"]["c1"]);
    assert!(guest["sent_pkts"] > 100, "{guest:?}\n{logs}");
    for zero in ["rcvd_seq_err", "out_of_seq_request"] {
        assert_eq!(guest[zero], 0, "rxe {zero}: {guest:?}");
    }
    (report, guest)
}

#[test]
fn a_guest_rdma_client_runs_verified_through_device_kills() {
    let (_, guest) = lab_chaos("kill-fabric");
    assert_eq!(guest["retry_exceeded_err"], 0, "{guest:?}");
}

/// Taking a device's RoCEv2 interface down leaves the control connection
/// up: the guest's queue pair retransmits until its retries run out, and
/// the pool fails over on that error completion.
#[test]
fn a_guest_rdma_client_fails_over_when_its_queue_pair_runs_out_of_retries() {
    let (_, guest) = lab_chaos("cut-link");
    assert!(
        guest["completer_retry_err"] > 0,
        "the QP retransmitted: {guest:?}"
    );
}
