//! A client or operator whose keys do not match the fabric's use of them
//! is told which side authenticates and what to pass: real daemons, with
//! and without `--secrets`, and the real `pmemctl`.

use std::path::{Path, PathBuf};
use std::process::Command;

use testkit::{Daemon, FabricSpec, Ports};
use topology::secrets::{Principal, write_key};

/// A one-server, one-device fabric, authenticated or not.
struct Fabric {
    dir: tempfile::TempDir,
    config: PathBuf,
    secrets: PathBuf,
    _daemons: Vec<Daemon>,
}

impl Fabric {
    fn start(authenticated: bool) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let spec = FabricSpec::new()
            .server("A", &[("A1", "4MiB")])
            .device("F")
            .client("c1");
        let config = spec.write(dir.path(), "topology.toml", &mut Ports::new());
        let secrets = dir.path().join("secrets");
        write_key(&secrets, Principal::Device("F"), &[0x11; 32]).expect("key");
        write_key(&secrets, Principal::Client("c1"), &[0xC1; 32]).expect("key");
        write_key(&secrets, Principal::Operator("admin"), &[0xAD; 32]).expect("key");
        let secrets_arg = secrets.to_str().expect("a UTF-8 path").to_owned();
        let extra: Vec<&str> = if authenticated {
            vec!["--secrets", &secrets_arg]
        } else {
            Vec::new()
        };
        let server = testkit::pmem_server(&config, "A", &dir.path().join("A"), &extra)
            .unwrap_or_else(|e| panic!("pmem-server did not start:\n{e}"));
        let device = testkit::fabric_device(&config, "F", &extra)
            .unwrap_or_else(|e| panic!("fabric-device did not start:\n{e}"));
        device.wait_links_up(1);
        Self {
            dir,
            config,
            secrets,
            _daemons: vec![server, device],
        }
    }

    /// Runs pmemctl with `args`, with `--secrets` when `with_key`; returns
    /// its one stderr line, checking that it failed with status 1.
    fn fails(&self, with_key: bool, args: &[&str]) -> String {
        let mut command = Command::new(env!("CARGO_BIN_EXE_pmemctl"));
        command
            .env_remove(pmem_client::pool::SECRETS_ENV)
            .arg("--config")
            .arg(&self.config)
            .args(["--connect-timeout-ms", "1000"]);
        if with_key {
            command.arg("--secrets").arg(&self.secrets);
        }
        let output = command.args(args).output().expect("run pmemctl");
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{stderr}");
        lines[0].to_owned()
    }

    fn dir(&self) -> &Path {
        self.dir.path()
    }
}

#[test]
fn no_key_against_an_authenticated_fabric_says_to_pass_one() {
    let fabric = Fabric::start(true);
    let line = fabric.fails(false, &["--client", "c1", "read", "1TiB", "8"]);
    assert!(
        line.contains("fabric device \"F\" requires authentication: pass --secrets DIR"),
        "{line}"
    );
    assert!(line.contains("client c1's key"), "{line}");
    assert!(line.contains("testbed keygen"), "{line}");
    assert!(!line.contains("AUTH_CHALLENGE"), "{line}");

    let line = fabric.fails(false, &["rotate-key", "A1"]);
    assert!(
        line.contains("server A requires authentication: pass --secrets DIR"),
        "{line}"
    );
    assert!(line.contains("operator.admin.key"), "{line}");
    assert!(!line.contains("AUTH_CHALLENGE"), "{line}");
    assert!(fabric.dir().exists());
}

#[test]
fn a_key_against_an_unauthenticated_fabric_says_to_drop_it() {
    let fabric = Fabric::start(false);
    let line = fabric.fails(true, &["--client", "c1", "read", "1TiB", "8"]);
    assert!(
        line.contains(
            "fabric device \"F\" does not use authentication (it runs --insecure): drop --secrets"
        ),
        "{line}"
    );
    assert!(!line.contains("no answer to HELLO/MAP"), "{line}");

    let line = fabric.fails(true, &["rotate-key", "A1"]);
    assert!(
        line.contains("server A does not use authentication (it runs --insecure): drop --secrets"),
        "{line}"
    );
    assert!(!line.contains("os error"), "{line}");
}
