//! A pmem-server started with `--secrets` answers only peers that prove
//! the key of the fabric device (or client) they name, and holds each
//! request to the grants of the client it is for: the real daemon, attacked
//! over its data port.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use proto::Status;
use proto::hello::Role;
use proto::opening::OpeningError;
use proto::request::Repr;
use testkit::{Conn, at, key, layout, pmem_server_with, write_topology};
use topology::secrets::{Principal, write_key};

const PMEM_SERVER: &str = env!("CARGO_BIN_EXE_pmem-server");
/// The key of device `F` in these tests.
const DEVICE_KEY: [u8; 32] = [0x42; 32];

fn metric(metrics: &str, reason: &str) -> u64 {
    let series = format!("pmem_server_auth_failures_total{{reason=\"{reason}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series)?.parse().ok())
        .unwrap_or(0)
}

fn secrets(dir: &Path) -> std::path::PathBuf {
    let secrets = dir.join("secrets");
    write_key(&secrets, Principal::Device("F"), &DEVICE_KEY).expect("key");
    secrets
}

#[test]
fn only_a_peer_that_proves_its_key_is_served() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write_topology(dir.path(), &[("R1", "4MiB")]);
    // Client c (number 0) may change the first MiB of R1 and read the third.
    let mut text = std::fs::read_to_string(&config).expect("topology");
    text.push_str(
        "allow = [{ region = \"R1\", size = \"1MiB\" }, \
         { region = \"R1\", offset = \"2MiB\", size = \"1MiB\", access = \"read\" }]\n",
    );
    std::fs::write(&config, text).expect("topology");
    let secrets = secrets(dir.path());
    let server = pmem_server_with(
        PMEM_SERVER,
        &config,
        "S",
        &dir.path().join("data"),
        &["--secrets", secrets.to_str().expect("path")],
    )
    .expect("server");
    let data = server.addr("nic.n0");
    let k = key(&layout(&config), 0);
    let read = Repr::read(at(0, 0), k, 8);

    // A request with no HELLO: refused, connection closed.
    let mut anonymous = Conn::connect(data);
    assert_eq!(anonymous.call(read).status, Status::UnknownClient);
    assert!(anonymous.try_recv().is_none(), "closed");
    // A HELLO without the proof, then a request: refused.
    let mut lazy = Conn::connect(data);
    lazy.hello_as(Role::FabricDevice, "F");
    let challenge = lazy.recv();
    assert_eq!(challenge.opcode, proto::Opcode::AuthChallenge);
    assert_eq!(lazy.call(read).status, Status::UnknownClient);
    // A name the topology does not have, or one without a key file.
    for (role, name) in [(Role::FabricDevice, "G"), (Role::Client, "c")] {
        let refused = Conn::connect(data).authenticate(role, name, DEVICE_KEY);
        assert_eq!(
            refused,
            Err(OpeningError::Refused(Status::UnknownClient)),
            "{name}"
        );
    }
    // Device F's name with the wrong key: impersonation fails.
    let refused = Conn::connect(data).authenticate(Role::FabricDevice, "F", [7; 32]);
    assert_eq!(refused, Err(OpeningError::Refused(Status::AccessDenied)));

    // Device F with its key: both sides proved. Each request is held to
    // the grants of the client the device says it is for.
    let mut device = Conn::connect(data);
    device
        .authenticate(Role::FabricDevice, "F", DEVICE_KEY)
        .expect("authenticated");
    let for_client = |number, at: u64| Repr {
        on_behalf: Some(number),
        ..Repr::read(testkit::at(0, at), k, 8)
    };
    assert_eq!(device.call(for_client(0, 0)).status, Status::Ok);
    assert_eq!(
        device.call(for_client(0, 1 << 20)).status,
        Status::AccessDenied
    );
    // The read-only range reads, but does not take a write or an atomic.
    assert_eq!(device.call(for_client(0, 2 << 20)).status, Status::Ok);
    for change in [
        Repr::write(testkit::at(0, 2 << 20), k, b"nope"),
        Repr::fetch_add(testkit::at(0, 2 << 20), k, 1),
    ] {
        let change = Repr {
            on_behalf: Some(0),
            ..change
        };
        assert_eq!(device.call(change).status, Status::AccessDenied);
    }
    assert_eq!(device.call(for_client(5, 0)).status, Status::AccessDenied);
    assert_eq!(device.call(read).status, Status::AccessDenied, "for nobody");

    let metrics = telemetry::http_get(server.addr("admin"), "/metrics", Duration::from_secs(5))
        .expect("metrics")
        .1;
    assert_eq!(metric(&metrics, "unauthenticated"), 2, "{metrics}");
    assert_eq!(metric(&metrics, "unknown_principal"), 2, "{metrics}");
    assert_eq!(metric(&metrics, "bad_proof"), 1, "{metrics}");
    for (reason, count) in [("not_granted", 3), ("unknown_client", 1), ("no_client", 1)] {
        let line = format!("pmem_server_denied_requests_total{{reason=\"{reason}\"}} {count}");
        assert!(metrics.lines().any(|l| l == line), "{line}\n{metrics}");
    }
}

#[test]
fn a_key_file_others_can_read_stops_the_server_with_the_fix() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write_topology(dir.path(), &[("R1", "4MiB")]);
    let secrets = secrets(dir.path());
    let file = secrets.join("device.F.key");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let err = pmem_server_with(
        PMEM_SERVER,
        &config,
        "S",
        &dir.path().join("data"),
        &["--secrets", secrets.to_str().expect("path")],
    )
    .expect_err("refused to start");
    assert!(
        err.contains(&format!("chmod 600 {}", file.display())),
        "{err}"
    );
    std::fs::remove_file(&file).expect("rm");
    let err = pmem_server_with(
        PMEM_SERVER,
        &config,
        "S",
        &dir.path().join("data"),
        &["--secrets", secrets.to_str().expect("path")],
    )
    .expect_err("refused to start");
    assert!(err.contains("device.F.key: no key file"), "{err}");
}
