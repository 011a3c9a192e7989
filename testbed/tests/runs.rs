//! `testbed run`, `chaos`, `demo` and `up` as users run them: the real
//! binary, real daemons, real reports.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use testkit::{FabricSpec, Ports};

mod support;

use support::{Up, run_dir, run_in_fresh_fabric, start_up, start_up_in, testbed, text, two_by_two};

fn assert_report(dir: &Path) -> serde_json::Value {
    let run = run_dir(dir);
    for file in [
        "report.json",
        "report.md",
        "latency_cdf.svg",
        "throughput.svg",
    ] {
        assert!(
            run.join(file).is_file(),
            "{file} missing in {}",
            run.display()
        );
    }
    support::report(&run)
}

fn run_workload(workload: &str) {
    let (output, dir) = run_in_fresh_fabric(&[
        "run",
        "--workload",
        workload,
        "--duration",
        "1.5",
        "--depth",
        "4",
    ]);
    let out = text(&output);
    assert!(output.status.success(), "{out}");
    assert!(out.contains("verification    PASSED"), "{out}");
    let report = assert_report(dir.path());
    assert_eq!(report["workload"], workload);
    let ops: u64 = report["ops"]
        .as_object()
        .expect("ops")
        .values()
        .map(|op| op["count"].as_u64().unwrap_or(0))
        .sum();
    assert!(ops > 0, "{workload}: no operation completed\n{out}");
    assert_eq!(report["verification"]["passed"], true);
    // What ran is recorded, and a passed run removed its region files.
    assert_eq!(report["parameters"]["seed"], 42);
    assert_eq!(report["parameters"]["depth"], 4);
    assert_eq!(report["data_kept"], false);
    let data = report["data_dir"].as_str().expect("data_dir");
    assert!(!Path::new(data).exists(), "{data} is still there");
    assert!(
        out.contains("region files    removed (the run passed)"),
        "{out}"
    );
    let replay = report["replay"].as_str().expect("replay");
    assert!(out.contains(&format!("replay          {replay}")), "{out}");
    for needle in [
        " run ",
        &format!("--workload {workload} "),
        "--duration 1.5 ",
        "--depth 4 ",
        "--seed 42 ",
    ] {
        assert!(replay.contains(needle), "{needle:?} missing in {replay}");
    }
}

/// Every run is authenticated, without asking: fresh keys in the report's
/// folder, the servers admit only the devices that prove their keys, the
/// devices only the clients that prove theirs, and no daemon runs
/// `--insecure`; the workload runs and verifies.
#[test]
fn a_run_authenticates_every_connection_by_default() {
    let (output, dir) = run_in_fresh_fabric(&["run", "--workload", "mixed", "--duration", "1.5"]);
    let out = text(&output);
    assert!(output.status.success(), "{out}");
    assert!(out.contains("verification    PASSED"), "{out}");
    let run = run_dir(dir.path());
    let keys: Vec<_> = std::fs::read_dir(run.join("secrets"))
        .expect("the run's keys")
        .map(|e| e.expect("entry").path())
        .collect();
    // Two clients, two devices and the operator.
    assert_eq!(keys.len(), 5, "{keys:?}");
    for key in &keys {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(key).expect("key").permissions().mode();
        assert_eq!(mode & 0o077, 0, "{} is private", key.display());
    }
    for daemon in ["pmem-server-A", "fabric-device-F1"] {
        let log =
            std::fs::read_to_string(run.join(format!("logs/{daemon}.log"))).unwrap_or_default();
        assert!(log.contains("authentication on"), "{daemon}: {log}");
        assert!(!log.contains("--insecure"), "{daemon}: {log}");
        assert!(!log.contains("ERROR"), "{daemon}: {log}");
    }
}

#[test]
fn run_ycsb_a() {
    run_workload("ycsb-a");
}

#[test]
fn run_ycsb_b() {
    run_workload("ycsb-b");
}

#[test]
fn run_ycsb_c() {
    run_workload("ycsb-c");
}

#[test]
fn run_counter() {
    run_workload("counter");
}

#[test]
fn run_mixed() {
    run_workload("mixed");
}

/// A short chaos run with one fault; returns its output and report.
fn chaos(scenario: &str) -> (String, serde_json::Value) {
    let (output, dir) = run_in_fresh_fabric(&[
        "chaos",
        "--scenario",
        scenario,
        "--faults",
        "1",
        "--duration",
        "3",
    ]);
    let out = text(&output);
    assert!(output.status.success(), "{out}");
    assert!(out.contains("verification    PASSED"), "{out}");
    let report = assert_report(dir.path());
    let faults = report["faults"].as_array().expect("faults");
    assert_eq!(faults.len(), 1, "{out}");
    assert_eq!(faults[0]["kind"], scenario);
    // The seed drives the workload and the faults; the replay names both.
    assert_eq!(report["parameters"]["seed"], 7);
    assert_eq!(report["parameters"]["scenario"], scenario);
    let replay = report["replay"].as_str().expect("replay");
    for needle in [
        format!(" chaos {}", report["topology"].as_str().expect("topology")),
        format!("--scenario {scenario} --faults 1 "),
        "--seed 7 ".to_owned(),
    ] {
        assert!(replay.contains(&needle), "{needle:?} missing in {replay}");
    }
    assert!(out.contains("reads checked   "), "{out}");
    assert!(
        faults[0]["restored_at_s"].is_number(),
        "the target came back"
    );
    (out, report)
}

#[test]
fn chaos_kill_fabric_is_invisible_to_the_application() {
    let (out, _) = chaos("kill-fabric");
    assert!(out.contains("errors seen     0"), "{out}");
}

#[test]
fn chaos_kill_server_loses_nothing_acknowledged() {
    let (_, report) = chaos("kill-server");
    assert_eq!(report["verification"]["passed"], true);
}

#[test]
fn chaos_restart_all_loses_nothing_acknowledged() {
    let (_, report) = chaos("restart-all");
    assert_eq!(report["faults"][0]["target"], "all");
}

/// The pid of the `testbed worker` process of `client` whose command line
/// names `dir`, once it runs.
fn worker_pid(dir: &Path, client: &str) -> Option<i32> {
    let dir = dir.to_str().expect("utf-8 path");
    std::fs::read_dir("/proc").ok()?.find_map(|entry| {
        let entry = entry.ok()?;
        let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let has = |arg: &str| args.contains(&arg.as_bytes());
        let names_dir = args.iter().any(|a| a.starts_with(dir.as_bytes()));
        (has("worker") && has("--client") && has(client) && names_dir).then_some(pid)
    })
}

/// A run whose worker dies leaves no result for its keys: it fails, keeps
/// its region files and says where they are.
#[test]
fn a_failed_run_keeps_its_region_files_and_says_where() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = two_by_two(dir.path(), &["c1", "c2"]);
    let reports = dir.path().join("reports");
    let child = Command::new(env!("CARGO_BIN_EXE_testbed"))
        .args(["run", config.to_str().expect("utf-8 path")])
        .args(["--clients", "1", "--duration", "60", "--reports"])
        .arg(&reports)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start testbed run");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let pid = loop {
        if let Some(pid) = worker_pid(dir.path(), "c1") {
            break pid;
        }
        assert!(std::time::Instant::now() < deadline, "no worker started");
        std::thread::sleep(Duration::from_millis(20));
    };
    // SAFETY: kill(2) on the pid of a worker this test's run started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let output = child.wait_with_output().expect("wait for testbed run");
    let out = text(&output);
    assert!(!output.status.success(), "{out}");
    assert!(
        out.contains("worker c1") && out.contains("left no result"),
        "{out}"
    );
    assert!(
        out.contains("CONTRACT VIOLATED: the final verification"),
        "{out}"
    );
    let report = assert_report(dir.path());
    assert_eq!(report["data_kept"], true);
    let data = report["data_dir"].as_str().expect("data_dir");
    assert!(
        out.contains(&format!("region files    kept in {data}")),
        "{out}"
    );
    let regions = std::fs::read_dir(data)
        .unwrap_or_else(|e| panic!("{data}: {e}"))
        .count();
    assert!(regions > 0, "{data} is empty");
}

#[test]
fn demo_runs_the_default_fabric_and_passes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let reports = dir.path().join("reports");
    let output = testbed(&[
        "demo",
        "--duration",
        "4",
        "--reports",
        reports.to_str().expect("path"),
    ]);
    let out = text(&output);
    assert!(output.status.success(), "{out}");
    for needle in [
        "verification    PASSED",
        "errors seen     0",
        "kill-fabric B",
        "kill-server B",
        "replicas        ",
        "report.md",
        "http://127.0.2.1:9200/metrics",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in\n{out}");
    }
    assert_report(dir.path());
}

#[test]
fn up_serves_every_daemon_until_sigterm() {
    let up = start_up(&[]);
    // Every daemon is listed, and its /metrics passes promtool.
    let admins: Vec<String> = up
        .table
        .iter()
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with("http://")))
        .map(|url| {
            url.trim_start_matches("http://")
                .trim_end_matches("/metrics")
                .to_owned()
        })
        .collect();
    assert_eq!(admins.len(), 4, "{:#?}", up.table);
    for admin in &admins {
        let (code, metrics) = telemetry::http_get(
            admin.parse().expect("address"),
            "/metrics",
            Duration::from_secs(5),
        )
        .expect("scrape");
        assert_eq!(code, 200);
        telemetry::promtool_check(&metrics).unwrap_or_else(|e| panic!("{admin}: {e}"));
    }
    assert!(
        up.dir.path().join("data/A/A1.pmem").is_file(),
        "region files in the data dir"
    );
    up.stop();
}

/// Connects `client` with its key from `up`'s folder and attaches to the
/// pool's allocator.
fn attach(up: &Up, config: &Path, client: &str) -> (pmem_client::Pool, pmem_client::Allocator) {
    let topology = topology::Topology::load(config).expect("topology");
    let pool = pmem_client::Pool::builder(topology, client)
        .secrets(up.keys())
        .connect()
        .expect("connect");
    let allocator = pool
        .block_on(pmem_client::Allocator::attach(pool.handle().clone()))
        .unwrap_or_else(|e| panic!("attach: {}", pmem_client::error_chain(&e)));
    (pool, allocator)
}

#[test]
fn up_formats_a_pool_with_an_allocator_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = FabricSpec::new()
        .server("A", &[("A1", "8MiB")])
        .server("B", &[("B1", "8MiB")])
        .device("F1")
        .device("F2")
        .client("c1")
        .allocator("")
        .write(dir.path(), "topology.toml", &mut Ports::new());

    let up = start_up_in(dir, &config, &[]);
    assert!(
        up.table
            .iter()
            .any(|l| l == "allocator: formatted pool \"test\" (first start)"),
        "{:#?}",
        up.table
    );
    let (pool, allocator) = attach(&up, &config, "c1");
    let at = pool
        .block_on(allocator.alloc_named("kept", 4096))
        .expect("alloc_named");
    pool.write_persist(at, b"still here").expect("write");
    drop((allocator, pool));
    let dir = up.stop();

    // The same data dir again: formatted already, nothing lost.
    let up = start_up_in(dir, &config, &[]);
    assert!(
        up.table
            .iter()
            .any(|l| l == "allocator: pool \"test\" already formatted, its data kept"),
        "{:#?}",
        up.table
    );
    let (pool, allocator) = attach(&up, &config, "c1");
    let (again, size) = pool.block_on(allocator.open("kept")).expect("open");
    assert_eq!((again, size), (at, 4096));
    assert_eq!(pool.read(at, 10).expect("read"), b"still here");
    drop((allocator, pool));
    up.stop();
}

/// `testbed run` with `--data-dir` on `config`, reports under `reports`.
fn run_on_data(config: &Path, data: &Path, reports: &Path, extra: &[&str]) -> (bool, String) {
    let mut args = vec![
        "run",
        config.to_str().expect("utf-8 path"),
        "--data-dir",
        data.to_str().expect("utf-8 path"),
        "--reports",
        reports.to_str().expect("utf-8 path"),
        "--duration",
        "1",
        "--depth",
        "4",
    ];
    args.extend(extra);
    let output = testbed(&args);
    (output.status.success(), text(&output))
}

#[test]
fn runs_on_an_allocator_pool_keep_their_keys_in_a_named_object() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = FabricSpec::new()
        .server("A", &[("A1", "16MiB")])
        .server("B", &[("B1", "16MiB")])
        .device("F1")
        .device("F2")
        .client("c1")
        .client("c2")
        .allocator("")
        .write(dir.path(), "topology.toml", &mut Ports::new());
    let (data, reports) = (dir.path().join("data"), dir.path().join("reports"));

    let (ok, out) = run_on_data(&config, &data, &reports, &["--workload", "mixed"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("formatted pool \"test\" (first start)"),
        "{out}"
    );
    assert!(out.contains("verification    PASSED"), "{out}");
    assert!(!out.contains(" 0 counters checked"), "{out}");

    // The same data again: the object is reused, and what the first run
    // left in it does not count against the second.
    let (ok, out) = run_on_data(&config, &data, &reports, &["--workload", "mixed"]);
    assert!(ok, "{out}");
    assert!(out.contains("already formatted, its data kept"), "{out}");
    assert!(out.contains("verification    PASSED"), "{out}");

    // A run that needs more than the object holds says what to do.
    let (ok, out) = run_on_data(
        &config,
        &data,
        &reports,
        &["--workload", "ycsb-a", "--keys", "100000"],
    );
    assert!(!ok, "{out}");
    assert!(
        out.contains("named object \"testbed.workload\" holds")
            && out.contains("pmemctl rm testbed.workload"),
        "{out}"
    );

    // The counters live where the object says: the runs incremented them.
    let up = start_up_in(dir, &config, &[]);
    let (pool, allocator) = attach(&up, &config, "c1");
    let (base, size) = pool
        .block_on(allocator.open("testbed.workload"))
        .expect("the run's named object");
    assert!(size >= 2 << 20, "{size}");
    let used = pool.read(base, 4096).expect("read the counters");
    assert!(
        used.iter().any(|&b| b != 0),
        "the counters were never incremented"
    );
    drop((allocator, pool));
    up.stop();
}

#[test]
fn a_reused_data_dir_counts_from_what_it_holds() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = two_by_two(dir.path(), &["c1", "c2"]);
    let (data, reports) = (dir.path().join("data"), dir.path().join("reports"));
    for round in 0..2 {
        let (ok, out) = run_on_data(&config, &data, &reports, &["--workload", "counter"]);
        assert!(ok, "round {round}: {out}");
        assert!(
            out.contains("verification    PASSED"),
            "round {round}: {out}"
        );
    }
}

#[test]
fn up_with_prometheus_scrapes_every_daemon() {
    let up = start_up(&["--prometheus"]);
    let url = up
        .table
        .iter()
        .find_map(|l| l.strip_prefix("prometheus: http://"))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no prometheus line in {:#?}", up.table))
        .to_owned();
    let (code, body) = telemetry::http_get(
        url.parse().expect("address"),
        "/api/v1/targets",
        Duration::from_secs(5),
    )
    .expect("query Prometheus");
    assert_eq!(code, 200);
    let targets: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let active = targets["data"]["activeTargets"]
        .as_array()
        .expect("targets");
    assert_eq!(active.len(), 4, "{body}");
    assert!(active.iter().all(|t| t["health"] == "up"), "{body}");
    up.stop();
}

#[test]
fn netns_up_then_crash_then_down_leaves_nothing() {
    let up = start_up(&["--net", "netns"]);
    assert!(
        up.table.iter().any(|l| l.contains("pf")),
        "daemons run in namespaces: {:#?}",
        up.table
    );
    // Every daemon answers on its management address from the root namespace.
    for admin in up
        .table
        .iter()
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with("http://")))
        .map(|url| {
            url.trim_start_matches("http://")
                .trim_end_matches("/metrics")
        })
    {
        let (code, _) = telemetry::http_get(
            admin.parse().expect("address"),
            "/healthz",
            Duration::from_secs(5),
        )
        .expect("reach the daemon's admin address");
        assert_eq!(code, 200);
    }
    let prefix = up
        .table
        .iter()
        .flat_map(|l| l.split_whitespace())
        .find_map(|w| w.trim_matches(|c| c == '(' || c == ')').split_once("-s-"))
        .map(|(prefix, _)| prefix.to_owned())
        .expect("a server namespace in the table");
    // Crash the testbed: its daemons and namespaces are left behind...
    let mut up = up;
    up.child.kill().expect("kill testbed");
    up.child.wait().expect("reap");
    let leftovers = || {
        let out = Command::new("ip")
            .args(["netns", "list"])
            .output()
            .expect("ip netns list");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with(&format!("{prefix}-")))
            .count()
    };
    assert!(leftovers() > 0, "the crash left namespaces");
    // ...and `testbed down` removes them.
    let out = testbed(&["down", "--prefix", &prefix]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(leftovers(), 0, "{}", text(&out));
}

#[test]
fn netns_chaos_cut_link_is_invisible_to_the_application() {
    let (output, dir) = run_in_fresh_fabric(&[
        "chaos",
        "--scenario",
        "cut-link",
        "--net",
        "netns",
        "--faults",
        "2",
        "--duration",
        "4",
    ]);
    let out = text(&output);
    assert!(output.status.success(), "{out}");
    assert!(out.contains("errors seen     0"), "{out}");
    assert!(out.contains("verification    PASSED"), "{out}");
    let report = assert_report(dir.path());
    let faults = report["faults"].as_array().expect("faults");
    assert_eq!(faults.len(), 2);
    assert!(
        faults
            .iter()
            .all(|f| f["kind"] == "cut-link" && f["restored_at_s"].is_number())
    );
}
