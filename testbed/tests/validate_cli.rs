//! `testbed validate` as a user runs it: the real binary on real files.

use std::path::PathBuf;
use std::process::{Command, Output};

fn configs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../configs")
}

fn testbed(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_testbed"))
        .args(args)
        .env_remove("PMEMFABRIC_POOL__EXTENT_SIZE")
        .output()
        .expect("run testbed")
}

/// The value printed after a summary label such as `regions`.
fn count(stdout: &str, label: &str) -> String {
    stdout
        .lines()
        .find_map(|l| {
            let l = l.trim();
            l.strip_prefix(label)
                .filter(|rest| rest.starts_with(' '))
                .map(|rest| rest.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no {label:?} line in:\n{stdout}"))
}

#[test]
fn fig4a_summary_has_the_seed_counts() {
    let path = configs().join("fig4a.toml");
    let out = testbed(&["validate", path.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(count(&stdout, "clients"), "9");
    assert_eq!(count(&stdout, "fabric devices"), "3");
    assert_eq!(count(&stdout, "servers"), "6");
    assert_eq!(count(&stdout, "regions"), "36");
    assert_eq!(count(&stdout, "capacity"), "576MiB");
    // The address map lists every region once, first and last included.
    let map_rows = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with('P') && l.contains("0x"))
        .count();
    assert_eq!(map_rows, 36, "{stdout}");
    assert!(stdout.contains("PA.1") && stdout.contains("PF.6"));
}

#[test]
fn missing_link_fails_naming_device_and_server() {
    let text = std::fs::read_to_string(configs().join("fig4a.toml")).unwrap();
    // Fabric device B's block lists its links in server order; drop its link to server D.
    let device_b = text.find("id = \"B\"\nadmin = \"127.0.2.2:9200\"").unwrap();
    let link = text[device_b..]
        .find("  { server = \"D\", nic = \"n1\" },\n")
        .unwrap()
        + device_b;
    let broken = format!(
        "{}{}",
        &text[..link],
        &text[link + "  { server = \"D\", nic = \"n1\" },\n".len()..]
    );
    let dir = std::env::temp_dir().join(format!("testbed-validate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("fig4a-missing-link.toml");
    std::fs::write(&path, broken).unwrap();

    let out = testbed(&["validate", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let problems: Vec<&str> = stderr.lines().filter(|l| l.starts_with("  ")).collect();
    assert_eq!(problems.len(), 1, "{stderr}");
    assert!(problems[0].contains("fig4a-missing-link.toml"), "{stderr}");
    assert!(problems[0].contains("fabric device \"B\""), "{stderr}");
    assert!(problems[0].contains("server \"D\""), "{stderr}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn every_problem_of_a_bad_file_is_printed() {
    let path = configs().join("test-fixtures/invalid/no-nics.toml");
    let out = testbed(&["validate", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("2 problem(s)"), "{stderr}");
    assert!(stderr.contains("server \"A\": has no NICs"), "{stderr}");
    assert!(stderr.contains("has no link to server \"A\""), "{stderr}");
}

#[test]
fn unreadable_and_unparsable_files_fail_cleanly() {
    let out = testbed(&["validate", "/nonexistent/topology.toml"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains("/nonexistent/topology.toml: cannot read topology file"),
        "{stderr}"
    );

    let path = configs().join("test-fixtures/unparsable/unknown-field.toml");
    let out = testbed(&["validate", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains("unknown-field.toml: invalid topology"),
        "{stderr}"
    );
    assert!(stderr.contains("extent_sise"), "{stderr}");
}

#[test]
fn embedded_default_validates_and_honours_env_overrides() {
    let out = testbed(&["validate"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        stdout.contains("<embedded configs/default.toml>"),
        "{stdout}"
    );
    assert_eq!(count(&stdout, "regions"), "4");
    assert_eq!(count(&stdout, "extent size"), "2MiB");

    let out = Command::new(env!("CARGO_BIN_EXE_testbed"))
        .arg("validate")
        .env("PMEMFABRIC_POOL__EXTENT_SIZE", "4MiB")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        count(&String::from_utf8_lossy(&out.stdout), "extent size"),
        "4MiB"
    );
}

#[test]
fn an_admin_endpoint_on_every_interface_is_valid_but_warned_about() {
    let dir = tempfile::tempdir().expect("temp dir");
    let text = std::fs::read_to_string(configs().join("single.toml"))
        .expect("single.toml")
        .replace("admin = \"127.0.2.1:9200\"", "admin = \"0.0.0.0:9200\"");
    let path = dir.path().join("open-admin.toml");
    std::fs::write(&path, text).expect("write");
    let out = testbed(&["validate", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: ")
            && stderr.contains("open-admin.toml: fabric device \"A\" admin: 0.0.0.0:9200 listens on every interface"),
        "{stderr}"
    );
    // The shipped configs give management addresses: no warning.
    let out = testbed(&["validate", configs().join("single.toml").to_str().unwrap()]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("warning"));
}

#[test]
fn host_checks_run_only_on_the_servers_host() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../topology/tests/fixtures/host/path-regular-file.toml");
    let path = path.to_str().unwrap();
    // Anywhere else the file is valid: the path is the server's business.
    let out = testbed(&["validate", path]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // On server A's host, /proc/version is no PMEM device.
    let out = testbed(&["validate", path, "--host", "A"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("not usable on this host, 1 problem(s):"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "server \"A\" socket \"0\" PMEM device \"pmem0\": path \"/proc/version\" is a regular file"
        ),
        "{stderr}"
    );
}

#[test]
fn schema_problems_are_printed_once_each_with_line_and_column() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../topology/tests/fixtures/schema/many-problems.toml");
    let out = testbed(&["validate", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("invalid topology, 4 problem(s):"),
        "{stderr}"
    );
    assert!(
        stderr.contains("many-problems.toml:20:15: server \"A\" NIC \"n0\": transport \"udp\""),
        "{stderr}"
    );
    assert_eq!(stderr.matches("extent_sise").count(), 1, "{stderr}");
}

#[test]
fn an_override_is_blamed_on_its_variable_once() {
    let path = configs().join("default.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_testbed"))
        .args(["validate", path.to_str().unwrap()])
        .env("PMEMFABRIC_POOL__EXTENT_SIZE", "3MiB")
        .output()
        .expect("run testbed");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let problems: Vec<&str> = stderr.lines().filter(|l| l.starts_with("  ")).collect();
    assert_eq!(problems.len(), 1, "once, not once per region: {stderr}");
    assert!(
        problems[0].contains(
            "environment variable PMEMFABRIC_POOL__EXTENT_SIZE=3MiB: pool: extent size 3MiB"
        ),
        "{stderr}"
    );
    assert!(!problems[0].contains("default.toml"), "{stderr}");
}
