//! `testbed bench --quick`: the smoke run CI does — the report must be
//! complete (every ratio present and finite), not meet the targets.

use std::process::Command;

#[test]
fn quick_bench_writes_a_complete_report() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("bench");
    let output = Command::new(env!("CARGO_BIN_EXE_testbed"))
        .args(["bench", "--quick", "--out"])
        .arg(&out)
        .output()
        .expect("run testbed bench");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{text}");
    for file in [
        "report.json",
        "report.md",
        "latency_cdf.svg",
        "throughput_vs_clients.svg",
    ] {
        assert!(out.join(file).is_file(), "{file} missing\n{text}");
    }
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).expect("read"))
            .expect("report.json parses");
    for key in [
        "fabric_p50_over_floor_rtt",
        "direct_p50_over_floor_rtt",
        "fabric_tput_over_redis",
        "fabric_bw_over_floor_bw",
        "direct_bw_over_floor_bw",
        "fabric_persist_p50_over_redis_aof",
        "authenticated_read_p50_over_plain",
        "fabric_p99_over_floor_p99",
        "device_cpu_us_per_op",
        "device_busy_cpu_us_per_op",
        "fabric_cpu_per_op_over_redis",
        "direct_p99_over_floor_p99",
        "fabric_p50_over_spinning_floor",
        "fabric_p99_over_spinning_floor_p99",
        "direct_p50_over_spinning_floor",
        "direct_p99_over_spinning_floor_p99",
        "replicated_persist_p50_over_unreplicated",
        "replicated_read_tput_over_unreplicated",
        "cache_auto_over_cached_small_read_p99",
        "cache_auto_over_cached_small_write_p99",
    ] {
        let value = report["ratios"][key]
            .as_f64()
            .unwrap_or_else(|| panic!("ratio {key} missing or not a number\n{text}"));
        assert!(value.is_finite() && value > 0.0, "{key} = {value}");
    }
    // Every ratio was measured in two rounds (the quick run's; at least
    // three for authentication), and its value is their median.
    for (key, spread) in report["ratio_spread"].as_object().expect("ratio_spread") {
        let rounds = spread["rounds"].as_array().expect("rounds");
        let expected = if key == "authenticated_read_p50_over_plain" {
            3
        } else {
            2
        };
        assert_eq!(rounds.len(), expected, "{key}: {spread}");
        let (min, max) = (spread["min"].as_f64(), spread["max"].as_f64());
        assert!(
            min <= spread["median"].as_f64() && spread["median"].as_f64() <= max,
            "{key}: {spread}"
        );
        assert_eq!(spread["median"], report["ratios"][key], "{key}");
    }
    // Every system was measured, with CPU cost for pmem-fabric.
    let rates = report["rates"].as_array().expect("rates");
    for system in ["direct", "fabric", "redis"] {
        assert!(
            rates.iter().any(|r| r["system"] == system),
            "{system} missing"
        );
    }
    // Server CPU per million operations for every workload of every
    // system; device CPU exactly on the fabric path.
    let latency = report["latency"].as_array().expect("latency");
    for case in rates.iter().chain(latency) {
        let system = case.get("system").unwrap_or(&case["path"]);
        let server = case["server_cpu_s_per_million"].as_f64();
        assert!(
            server.is_some_and(|v| v.is_finite() && v >= 0.0),
            "server CPU per million operations missing: {case}"
        );
        assert_eq!(
            case["device_cpu_s_per_million"].is_number(),
            system == "fabric",
            "device CPU per million operations: {case}"
        );
    }
    // A throughput case on the fabric path splits the device's CPU: the
    // part that forwarded is some of it, not more (the rest busy polled).
    // `/proc` counts CPU in ticks of 10 ms: two are allowed either way.
    let seconds = report["plan"]["seconds"].as_f64().expect("plan seconds");
    for case in rates.iter().filter(|r| r["system"] == "fabric") {
        let all = case["device_cpu_s_per_million"]
            .as_f64()
            .expect("device CPU");
        let busy = case["device_busy_cpu_s_per_million"]
            .as_f64()
            .unwrap_or_else(|| panic!("device CPU forwarding missing: {case}"));
        let ops = case["ops_per_s"].as_f64().expect("ops/s") * seconds;
        let slack = 0.02 / ops * 1e6;
        assert!(busy > -slack && busy <= all + slack, "{case}");
    }
    for redis in report["redis"].as_array().expect("redis") {
        assert!(
            redis["server_cpu_s_per_million"].is_number(),
            "redis-server CPU per million requests missing: {redis}"
        );
    }
    // Authentication measured: opening costs the proofs, requests nothing.
    let auth = &report["authentication"];
    for key in [
        "open_plain_p50_us",
        "open_authenticated_p50_us",
        "read_plain_p50_us",
        "read_authenticated_p50_us",
    ] {
        assert!(
            auth[key].as_f64().is_some_and(|v| v > 0.0),
            "authentication {key} missing: {auth}"
        );
    }
    assert!(
        report["plan"]["device_busy_poll_us"]
            .as_u64()
            .is_some_and(|us| us > 0),
        "the device's busy polling is part of the plan"
    );
    // The device's memory per idle connection, measured with real ones.
    let memory = &report["device_memory"];
    assert_eq!(memory["connections"], report["plan"]["idle_connections"]);
    let (before, after) = (
        memory["rss_before"].as_u64().expect("rss_before"),
        memory["rss_after"].as_u64().expect("rss_after"),
    );
    assert!(
        before > 0 && after > before,
        "100 client connections must cost the device memory: {memory}"
    );
    assert!(
        memory["rss_idle"].as_u64().is_some_and(|idle| idle > 0),
        "the device's memory with the connections idle: {memory}"
    );
    // The spinning floor, and a 64 B READ with the client polling on both
    // paths.
    let spinning = &report["floor_rtt_spinning"];
    assert!(
        spinning["p50_us"].as_f64().is_some_and(|v| v > 0.0)
            && spinning["samples"].as_u64().is_some_and(|n| n > 0),
        "the spinning floor: {spinning}"
    );
    for path in ["direct", "fabric"] {
        assert!(
            latency.iter().any(|c| c["path"] == path
                && c["op"] == "READ"
                && c["size"] == 64
                && c["client_spins"] == true),
            "{path} READ 64 B with a polling client missing"
        );
    }
    // The cache policies: the bulk WRITEs ask for non-temporal stores
    // under auto and not under cached; both measured in every round.
    let cache = &report["cache_policy"];
    let policies = cache["policies"].as_array().expect("cache policies");
    let bulk_non_temporal: Vec<(&str, bool)> = policies
        .iter()
        .map(|p| {
            (
                p["policy"].as_str().expect("policy"),
                p["bulk_non_temporal"].as_bool().expect("bulk_non_temporal"),
            )
        })
        .collect();
    assert_eq!(bulk_non_temporal, [("cached", false), ("auto", true)]);
    for p in policies {
        for key in ["read_p99_us", "write_p99_us", "bulk_bytes_per_s"] {
            assert!(p[key].as_f64().is_some_and(|v| v > 0.0), "{key}: {p}");
        }
    }
    // The replicated fabric: both sides measured.
    let replication = &report["replication"];
    assert_eq!(replication["replicas"], 2);
    for key in [
        "persist_p50_us_unreplicated",
        "persist_p50_us_replicated",
        "read_ops_per_s_unreplicated",
        "read_ops_per_s_replicated",
    ] {
        assert!(
            replication[key].as_f64().is_some_and(|v| v > 0.0),
            "{key}: {replication}"
        );
    }
    let markdown = std::fs::read_to_string(out.join("report.md")).expect("read report.md");
    assert!(markdown.contains("`fabric_tput_over_redis`"));
    assert!(markdown.contains("per idle client connection"));
    assert!(markdown.contains("both ends polling"));
    assert!(markdown.contains("## Server cache policy"));
    assert!(markdown.contains("## A replicated region"));
}

#[test]
fn too_many_idle_connections_for_the_open_file_limit_are_refused_clearly() {
    // A limit the bench may not raise: an unprivileged process cannot pass
    // its hard limit, and root cannot pass the kernel's ceiling.
    let ceiling: usize = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .expect("read /proc/sys/fs/nr_open")
        .trim()
        .parse()
        .expect("nr_open is a number");
    let dir = tempfile::tempdir().expect("temp dir");
    let output = Command::new(env!("CARGO_BIN_EXE_testbed"))
        .args(["bench", "--quick", "--idle-connections"])
        .arg((ceiling + 1).to_string())
        .arg("--out")
        .arg(dir.path().join("bench"))
        .output()
        .expect("run testbed bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    for part in [
        "idle client connections need",
        "open-file limit (RLIMIT_NOFILE)",
        "--idle-connections",
    ] {
        assert!(stderr.contains(part), "{part:?} missing from:\n{stderr}");
    }
    assert!(
        !dir.path().join("bench").join("report.json").exists(),
        "nothing measured"
    );
}
