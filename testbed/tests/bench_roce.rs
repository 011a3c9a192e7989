//! `testbed bench-roce --quick`: the RoCE comparison runs end to end (a
//! namespace, a device with a RoCEv2 port, TCP and RoCE load) and writes a
//! complete report. Needs root, as CI has.

use std::process::Command;

#[test]
fn quick_roce_bench_writes_a_complete_report() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("bench-roce");
    let output = Command::new(env!("CARGO_BIN_EXE_testbed"))
        .args(["bench-roce", "--quick", "--rounds", "1", "--out"])
        .arg(&out)
        .output()
        .expect("run testbed bench-roce");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{text}");
    assert!(out.join("roce-bench.md").is_file(), "{text}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("roce-bench.json")).expect("read"))
            .expect("roce-bench.json parses");
    let summary = report["summary"].as_array().expect("summary");
    assert_eq!(summary.len(), 3, "{report}");
    for op in summary {
        for key in [
            "tcp_device_us_per_op",
            "roce_device_us_per_op",
            "roce_ops_per_s",
        ] {
            let median = op[key]["median"].as_f64().unwrap_or(f64::NAN);
            assert!(median.is_finite() && median > 0.0, "{key} of {op}");
        }
    }
    let ratio = report["roce_device_cpu_per_op_over_tcp"]
        .as_f64()
        .unwrap_or(f64::NAN);
    assert!(ratio.is_finite() && ratio > 0.0, "{report}");
}
