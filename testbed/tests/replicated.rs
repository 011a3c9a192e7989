//! Replicated regions under `testbed run` and `chaos`, as users run them:
//! the real binary, real daemons, every region kept twice (`--replicas 2`),
//! and every serving copy compared byte for byte after the run.

use serde_json::{Value, json};

mod support;

// Runs go on a fresh fabric of two servers (each its own failure domain),
// two devices and two clients.
use support::{run_dir, run_in_fresh_fabric, text};

/// What one run left: what it printed and its report.
struct Run {
    out: String,
    report: Value,
}

/// `testbed ARGS` on a fresh fabric; the run must pass (exit 0).
fn passing_run(args: &[&str]) -> Run {
    let (output, dir) = run_in_fresh_fabric(args);
    let out = text(&output);
    assert!(output.status.success(), "{out}");
    let report = support::report(&run_dir(dir.path()));
    Run { out, report }
}

/// `testbed chaos --scenario SCENARIO --faults N --duration S` with every
/// region kept twice and the map in etcd (so the owner devices record in
/// it which copies serve, and a dead owner is taken over), which must
/// pass with the application seeing no error and every acknowledged
/// write read back; every fault's errors are checked, and every copy the
/// map still has serving must equal the others.
fn chaos_with_two_copies_on_etcd(scenario: &str, faults: &str, duration: &str) -> Run {
    let run = passing_run(&[
        "chaos",
        "--scenario",
        scenario,
        "--faults",
        faults,
        "--duration",
        duration,
        "--replicas",
        "2",
        "--control",
        "etcd",
    ]);
    let (out, report) = (&run.out, &run.report);
    assert!(out.contains("verification    PASSED"), "{out}");
    assert!(out.contains("errors seen     0"), "{out}");
    let injected = report["faults"].as_array().expect("faults");
    assert!(!injected.is_empty(), "{out}");
    for fault in injected {
        assert_eq!(fault["errors_seen"], 0, "{fault}: {out}");
    }
    assert_eq!(report["replicas"]["differences"], json!([]), "{out}");
    assert_eq!(report["parameters"]["scenario"], scenario, "{out}");
    let replay = report["replay"].as_str().expect("replay");
    for part in [
        format!("--scenario {scenario}"),
        "--replicas 2".to_owned(),
        "--control etcd".to_owned(),
        "--seed ".to_owned(),
    ] {
        assert!(replay.contains(&part), "{part} in {replay}");
    }
    run
}

/// The copies compared after a run: every region's copies were either
/// compared (and found identical) or left out because the map had one of
/// them not serving; `regions` in all. Returns the lines left out.
fn every_serving_copy_identical(report: &Value, regions: u64) -> Vec<String> {
    let replicas = &report["replicas"];
    let compared = replicas["regions_compared"].as_u64().expect("compared");
    let identical = replicas["identical"].as_u64().expect("identical");
    let skipped: Vec<String> = replicas["not_compared"]
        .as_array()
        .expect("not compared")
        .iter()
        .map(|l| l.as_str().expect("a line").to_owned())
        .collect();
    assert_eq!(identical, compared, "{replicas}");
    assert_eq!(compared + skipped.len() as u64, regions, "{replicas}");
    skipped
}

/// The shared counters grew by exactly the FETCH_ADDs the clients saw
/// acknowledged (plus at most those of unknown outcome): none was applied
/// twice, none acknowledged was lost. Returns the acknowledged count.
fn counters_match_the_acknowledged_fetch_adds(run: &Run) -> u64 {
    let sums = &run.report["verification"]["counter_increments"];
    let (acked, uncertain, grew) = (
        sums["acked"].as_u64().expect("acked"),
        sums["uncertain"].as_u64().expect("uncertain"),
        sums["grew"].as_u64().expect("grew"),
    );
    assert!(sums["words"].as_u64().expect("words") > 0, "{sums}");
    assert!(acked > 0, "the workload's FETCH_ADDs: {sums}");
    assert!(
        (acked..=acked + uncertain).contains(&grew),
        "counters grew by {grew}: {acked} acknowledged, {uncertain} of unknown outcome"
    );
    assert!(
        run.out.contains(&format!(
            "counters        grew by {grew} over {} shared words; {acked} FETCH_ADDs of 1 \
             acknowledged, {uncertain} of unknown outcome",
            sums["words"]
        )),
        "{}",
        run.out
    );
    acked
}

/// The report's notes that start with `prefix`.
fn notes_starting(report: &Value, prefix: &str) -> Vec<String> {
    report["notes"]
        .as_array()
        .expect("notes")
        .iter()
        .filter_map(|n| n.as_str())
        .filter(|n| n.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

/// Whether the report says a fault came after the workload had ended
/// (the application then saw nothing of it).
fn late(report: &Value) -> bool {
    report["notes"]
        .as_array()
        .expect("notes")
        .iter()
        .filter_map(|n| n.as_str())
        .any(|n| n.contains("came after the workload had ended"))
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

#[test]
fn the_scenarios_about_copies_need_copies_and_etcd() {
    let (output, _dir) = run_in_fresh_fabric(&[
        "chaos",
        "--scenario",
        "kill-owner-and-decider",
        "--control",
        "etcd",
    ]);
    let out = text(&output);
    assert!(!output.status.success(), "{out}");
    assert!(out.contains("--replicas 2"), "{out}");
    let (output, _dir) = run_in_fresh_fabric(&[
        "chaos",
        "--scenario",
        "kill-server-then-other",
        "--replicas",
        "2",
    ]);
    let out = text(&output);
    assert!(!output.status.success(), "{out}");
    assert!(out.contains("needs --control etcd"), "{out}");
}

/// On etcd, so the map records the killed server's copies `offline` (the
/// owner device marks them): those are not compared, since a copy that
/// missed writes serves again only after a resync; every serving copy is.
#[test]
fn chaos_kill_server_with_two_copies_is_invisible_and_the_copies_stay_identical() {
    let run = chaos_with_two_copies_on_etcd("kill-server", "1", "6");
    assert!(
        run.out.contains("replicas        identical: "),
        "{}",
        run.out
    );
    assert_eq!(run.report["faults"][0]["kind"], "kill-server");
    every_serving_copy_identical(&run.report, 4);
}

/// On etcd, killing a fabric device that owns replicated regions under
/// the mixed workload: the application sees no error (the other device
/// takes the regions over, or the killed one is back first: which one
/// wins depends on the machine's load, so the owners are only reported;
/// `fabric-device/tests/takeover.rs` checks the takeover itself), and the
/// copies that still serve are equal.
#[test]
fn chaos_kill_fabric_with_two_copies_is_invisible() {
    let run = chaos_with_two_copies_on_etcd("kill-fabric", "1", "6");
    assert_eq!(run.report["faults"][0]["kind"], "kill-fabric");
    assert_eq!(
        notes_starting(&run.report, "replica sets at the end: ").len(),
        1,
        "{}",
        run.report
    );
}

/// The server of a region's deciding copy and the region's owner device
/// SIGKILLed at the same moment under the mixed workload, both restarted
/// later: the
/// surviving device takes the region over with the surviving copy
/// deciding, the application sees no error, no FETCH_ADD is applied twice
/// (the shared counters, which live in that region, grew by exactly the
/// increments acknowledged), everything acknowledged reads back, and the
/// copies that serve at the end are identical.
#[test]
fn the_owner_and_the_deciding_copy_killed_together_apply_no_atomic_twice() {
    let run = chaos_with_two_copies_on_etcd("kill-owner-and-decider", "1", "10");
    let fault = &run.report["faults"][0];
    assert_eq!(fault["kind"], "kill-owner-and-decider", "{}", run.out);
    assert!(fault["restored_at_s"].is_number(), "{}", run.out);
    // The counters' region: A1, owned by F1 at the start, deciding on A.
    assert_eq!(fault["target"], "F1+A (A1)", "{}", run.out);
    let hit = notes_starting(&run.report, "kill-owner-and-decider: ");
    assert_eq!(hit.len(), 1, "{}", run.report);
    assert!(hit[0].contains("owned region A1"), "{}", hit[0]);
    assert!(!late(&run.report), "{}", run.report);
    counters_match_the_acknowledged_fetch_adds(&run);
    // F1 was restarted only once F2 had taken A1 over.
    let owners = notes_starting(&run.report, "replica sets at the end: ");
    assert!(
        owners.iter().any(|n| n.contains("A1 owner F2")),
        "{owners:?}"
    );
    every_serving_copy_identical(&run.report, 4);
}

/// A server killed and restarted under the workload; its copies resync
/// while the workload runs and serve again; then the server holding the
/// other copies is killed (and restarted): the application sees no error
/// either time, nothing acknowledged is lost, no FETCH_ADD is applied
/// twice, and the copies that serve at the end are identical. The second
/// kill waits for the map, so the workers are held open until it is done
/// (it must not come after the workload).
#[test]
fn a_server_back_from_a_kill_resyncs_and_then_survives_the_other_servers_death() {
    let run = chaos_with_two_copies_on_etcd("kill-server-then-other", "1", "14");
    let faults = run.report["faults"].as_array().expect("faults");
    let kinds: Vec<&str> = faults.iter().map(|f| f["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["kill-server", "kill-server-after-resync"],
        "{}",
        run.out
    );
    let (first, second) = (&faults[0], &faults[1]);
    assert_ne!(first["target"], second["target"], "{}", run.out);
    // The second kill came only after the first server was back.
    let back = first["restored_at_s"].as_f64().expect("restarted");
    assert!(second["at_s"].as_f64().expect("at") > back, "{}", run.out);
    assert!(second["restored_at_s"].is_number(), "{}", run.out);
    let waited = notes_starting(&run.report, "kill-server-after-resync: ");
    assert_eq!(waited.len(), 1, "{}", run.report);
    assert!(
        !late(&run.report),
        "the second kill came while the workload ran: {}",
        run.report
    );
    counters_match_the_acknowledged_fetch_adds(&run);
    every_serving_copy_identical(&run.report, 4);
}

/// A server stopped with SIGSTOP past its liveness lease and the devices'
/// request timeout, then let go with SIGCONT once the map in etcd took a
/// copy it holds out of service, the workload running throughout: the
/// application sees nothing, everything acknowledged reads back, what the
/// thawed server then answers reaches no client, and the copies that still
/// serve are identical.
#[test]
fn a_frozen_server_is_fenced_off_and_its_thaw_makes_no_copy_diverge() {
    let run = chaos_with_two_copies_on_etcd("freeze-server", "1", "20");
    let out = &run.out;
    let fault = &run.report["faults"][0];
    assert_eq!(fault["kind"], "freeze-server", "{out}");
    assert!(fault["restored_at_s"].is_number(), "thawed: {out}");
    // The thaw came only once the map in etcd had taken a copy of the
    // frozen server out of service (the run fails otherwise). A copy out of
    // service is not compared (it may have missed writes); every region
    // whose two copies serve compares equal, the frozen server's untouched
    // copies included.
    for line in every_serving_copy_identical(&run.report, 4) {
        assert!(line.contains("1 serving copy"), "{line}");
    }
}

#[test]
fn a_run_with_two_copies_leaves_every_copy_identical() {
    let run = passing_run(&["run", "--duration", "2", "--replicas", "2"]);
    assert!(
        run.out.contains("replicas        identical: 4 regions"),
        "{}",
        run.out
    );
    assert_eq!(run.report["replicas"]["regions_compared"], 4);
}
