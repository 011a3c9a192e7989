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
    ] {
        let value = report["ratios"][key]
            .as_f64()
            .unwrap_or_else(|| panic!("ratio {key} missing or not a number\n{text}"));
        assert!(value.is_finite() && value > 0.0, "{key} = {value}");
    }
    // Every system was measured, with CPU cost for pmem-fabric.
    let rates = report["rates"].as_array().expect("rates");
    for system in ["direct", "fabric", "redis"] {
        assert!(
            rates.iter().any(|r| r["system"] == system),
            "{system} missing"
        );
    }
    assert!(
        rates
            .iter()
            .filter(|r| r["system"] == "fabric")
            .all(|r| r["server_cpu_s_per_million"].is_number()),
        "server CPU per million operations reported for every fabric workload"
    );
    let markdown = std::fs::read_to_string(out.join("report.md")).expect("read report.md");
    assert!(markdown.contains("`fabric_tput_over_redis`"));
}
