//! The checks made on a server's own host: its PMEM device paths exist and
//! are directories or character devices. One fixture per message under
//! `tests/fixtures/host`.

use std::path::PathBuf;

use topology::{EnvOverrides, ProblemKind, ServerId, Topology};

fn load(name: &str) -> Topology {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/host")
        .join(format!("{name}.toml"));
    let topology = Topology::load_with(&path, &EnvOverrides::None).expect("loads");
    topology
        .validate()
        .unwrap_or_else(|e| panic!("{name} is valid anywhere: {e}"));
    topology
}

#[test]
fn a_missing_path_is_named_with_what_to_do() {
    let topology = load("path-missing");
    let problems = topology.check_host(&ServerId::new("A"));
    assert_eq!(problems.len(), 1, "{problems:?}");
    let text = problems[0].to_string();
    assert!(
        text.starts_with(&format!(
            "{}: server \"A\" socket \"0\" PMEM device \"pmem0\": path \"/nonexistent/pmem0\" \
             cannot be used on this host (No such file or directory",
            topology.source
        )),
        "{text}"
    );
    assert!(text.contains("ndctl create-namespace"), "{text}");
}

#[test]
fn a_regular_file_is_not_a_pmem_device() {
    let topology = load("path-regular-file");
    let problems = topology.check_host(&ServerId::new("A"));
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        matches!(&problems[0].kind, ProblemKind::DevicePathWrongKind { found, .. } if *found == "a regular file"),
        "{problems:?}"
    );
    assert_eq!(
        problems[0].to_string(),
        format!(
            "{}: server \"A\" socket \"0\" PMEM device \"pmem0\": path \"/proc/version\" is a \
             regular file; pmem-server takes a directory (an fsdax mount such as /mnt/pmem0) \
             or a device DAX character device (such as /dev/dax0.0)",
            topology.source
        )
    );
}

#[test]
fn directories_and_character_devices_pass() {
    let topology = load("paths-right-kind");
    assert_eq!(topology.check_host(&ServerId::new("A")), []);
}

#[test]
fn an_unknown_server_is_a_problem() {
    let topology = load("paths-right-kind");
    let problems = topology.check_host(&ServerId::new("Z"));
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0]
            .to_string()
            .contains("refers to unknown server \"Z\""),
        "{problems:?}"
    );
}
