//! `testbed bench-roce`: the RoCE comparison runs end to end (a namespace,
//! a device with a RoCEv2 port, TCP and RoCE load) and writes a complete
//! report, from a copy of the testbed binary outside the source tree with
//! no cargo to be found; a setup that fails is one sentence, not a panic.
//! Needs root, as CI has.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A copy of the built testbed binary in `dir` (outside the source tree).
fn testbed_copy(dir: &Path) -> PathBuf {
    let copy = dir.join("testbed");
    std::fs::copy(env!("CARGO_BIN_EXE_testbed"), &copy).expect("copy the testbed binary");
    copy
}

/// Runs `testbed args…` from the copy in `dir`, with `dir` as its working
/// directory, `path` as its `PATH` and nothing of cargo's environment.
fn run_copy(dir: &Path, path: &str, args: &[&str]) -> (Output, String) {
    let mut command = Command::new(testbed_copy(dir));
    command.args(args).current_dir(dir).env("PATH", path);
    command.env("RUST_BACKTRACE", "1");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("CARGO") || name == "TESTKIT_PREBUILT_BINARIES" {
            command.env_remove(name);
        }
    }
    let output = output_of_fresh_copy(&mut command);
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output, text)
}

/// Runs `command`, whose program was just written. While the copy is open for
/// writing, a child forked by another test thread holds that descriptor until
/// it execs, and exec of the copy then fails with "Text file busy"
/// (ETXTBSY); that window is short, so try again.
fn output_of_fresh_copy(command: &mut Command) -> Output {
    for _ in 0..50 {
        match command.output() {
            Err(error) if error.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            result => return result.expect("run the testbed copy"),
        }
    }
    panic!("the testbed copy stayed busy (ETXTBSY) for 5 s");
}

/// The system's own folders (where `ip` lives), none of cargo's.
const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/sbin:/sbin:/usr/bin:/bin";

#[test]
fn quick_roce_bench_runs_from_a_copy_outside_the_tree_and_writes_a_complete_report() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("bench-roce");
    let out_arg = out.to_str().expect("a UTF-8 path");
    let args = ["bench-roce", "--quick", "--rounds", "1", "--out", out_arg];
    let (output, text) = run_copy(dir.path(), SYSTEM_PATH, &args);
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
            "tcp_device_busy_us_per_op",
            "roce_device_busy_us_per_op",
            "roce_ops_per_s",
        ] {
            let median = op[key]["median"].as_f64().unwrap_or(f64::NAN);
            assert!(median.is_finite() && median > 0.0, "{key} of {op}");
        }
    }
    for name in [
        "roce_device_cpu_per_op_over_tcp",
        "roce_device_busy_cpu_per_op_over_tcp",
    ] {
        let ratio = report[name].as_f64().unwrap_or(f64::NAN);
        assert!(ratio.is_finite() && ratio > 0.0, "{name}: {report}");
    }
}

#[test]
fn a_setup_that_fails_is_one_sentence_and_a_failed_exit() {
    let dir = tempfile::tempdir().expect("temp dir");
    // No `ip` on an empty PATH: the namespace cannot be made.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).expect("an empty folder");
    let out = dir.path().join("bench-roce");
    let args = [
        "bench-roce",
        "--quick",
        "--rounds",
        "1",
        "--out",
        out.to_str().expect("a UTF-8 path"),
    ];
    let (output, text) = run_copy(dir.path(), empty.to_str().expect("UTF-8"), &args);
    assert!(!output.status.success(), "{text}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("testbed: error: creating the network namespace"),
        "{text}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{text}");
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{text}"
    );
    assert!(!out.exists(), "no report from a failed setup: {text}");
}
