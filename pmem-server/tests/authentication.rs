//! A pmem-server started with `--secrets` answers only peers that prove
//! the key of the fabric device (or client) they name, and holds each
//! request to the grants of the client it is for: the real daemon, attacked
//! over its data port.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use proto::hello::Role;
use proto::opening::OpeningError;
use proto::request::Repr;
use proto::{AccessKey, Message, RegionIndex, Status};
use testkit::{Conn, Daemon, at, pmem_server_with, write_topology};
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
    // Refused before any key is looked at.
    let read = Repr::read(at(0, 0), AccessKey::NONE, 8);

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
    let k = device.map().entries[0].key;
    let read = Repr::read(at(0, 0), k, 8);
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
    for (reason, count) in [("not_granted", 3), ("unwired_client", 1), ("no_client", 1)] {
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

/// The key of operator `ops` in these tests.
const OPERATOR_KEY: [u8; 32] = [0x0F; 32];
/// The key of client `c` in these tests.
const CLIENT_KEY: [u8; 32] = [0xC1; 32];

/// A server with regions R1 and R2 whose client `c` may use the first MiB
/// of R1 only; device F, client c and operator `ops` have keys.
fn keyed_server(dir: &Path) -> Daemon {
    keyed_server_with(dir, &[])
}

/// [`keyed_server`] with more flags.
fn keyed_server_with(dir: &Path, extra: &[&str]) -> Daemon {
    let config = write_topology(dir, &[("R1", "4MiB"), ("R2", "4MiB")]);
    let mut text = std::fs::read_to_string(&config).expect("topology");
    text.push_str("allow = [{ region = \"R1\", size = \"1MiB\" }]\n");
    std::fs::write(&config, text).expect("topology");
    let secrets = secrets(dir);
    write_key(&secrets, Principal::Client("c"), &CLIENT_KEY).expect("key");
    write_key(&secrets, Principal::Operator("ops"), &OPERATOR_KEY).expect("key");
    let mut flags = vec!["--secrets", secrets.to_str().expect("path")];
    flags.extend_from_slice(extra);
    pmem_server_with(PMEM_SERVER, &config, "S", &dir.join("data"), &flags).expect("server")
}

/// A connection that proved `name`'s key in `role`.
fn proven(server: &Daemon, role: Role, name: &str, key: [u8; 32]) -> Conn {
    let mut conn = Conn::connect(server.addr("nic.n0"));
    conn.authenticate(role, name, key).expect("authenticated");
    conn
}

/// The keys a MAP gives, by region index.
fn keys(conn: &mut Conn) -> Vec<AccessKey> {
    conn.map().entries.iter().map(|e| e.key).collect()
}

/// Asks to rotate region `index`'s key; the status of the answer.
fn rotate(conn: &mut Conn, index: u32) -> Status {
    conn.send(&Message::RotateKey(RegionIndex(index)));
    conn.recv().status
}

/// The sum of metric `name`'s samples labelled `reason` on `server`'s
/// `/metrics`.
fn scraped(server: &Daemon, name: &str, reason: &str) -> u64 {
    let metrics = telemetry::http_get(server.addr("admin"), "/metrics", Duration::from_secs(5))
        .expect("metrics")
        .1;
    let labels = format!("reason=\"{reason}\"");
    telemetry::metric_sum(&metrics, name, &labels).unwrap_or(0.0) as u64
}

fn denied(server: &Daemon, reason: &str) -> u64 {
    scraped(server, "pmem_server_denied_requests_total", reason)
}

#[test]
fn region_keys_are_random_and_go_only_to_those_who_may_use_them() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = keyed_server(dir.path());
    let device_keys = keys(&mut proven(&server, Role::FabricDevice, "F", DEVICE_KEY));
    assert!(device_keys.iter().all(|k| !k.is_none()), "{device_keys:?}");
    assert_ne!(
        device_keys[0], device_keys[1],
        "each region has its own key"
    );

    // Client c's grants reach R1 only: it learns R1's key and not R2's.
    let mut client = proven(&server, Role::Client, "c", CLIENT_KEY);
    assert_eq!(keys(&mut client), vec![device_keys[0], AccessKey::NONE]);
    assert_eq!(
        client.call(Repr::read(at(0, 0), device_keys[0], 8)).status,
        Status::Ok
    );
    // A guessed key opens nothing, and is counted.
    let guessed = AccessKey(device_keys[0].get() ^ 1);
    assert_eq!(
        client.call(Repr::read(at(0, 0), guessed, 8)).status,
        Status::AccessDenied
    );
    assert_eq!(denied(&server, "bad_key"), 1);

    // The keys stay with the regions across a restart.
    let restarted = {
        let (status, stderr) = server.terminate();
        assert!(status.success(), "{stderr}");
        keyed_server(dir.path())
    };
    let again = keys(&mut proven(&restarted, Role::FabricDevice, "F", DEVICE_KEY));
    assert_eq!(again, device_keys, "keys survive a restart");
}

#[test]
fn only_an_operator_rotates_a_key_and_the_old_key_stops_working() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = keyed_server(dir.path());
    let mut client = proven(&server, Role::Client, "c", CLIENT_KEY);
    let old = keys(&mut client)[0];

    // Neither a client nor a device may rotate.
    assert_eq!(rotate(&mut client, 0), Status::AccessDenied);
    let mut device = proven(&server, Role::FabricDevice, "F", DEVICE_KEY);
    assert_eq!(rotate(&mut device, 0), Status::AccessDenied);
    assert_eq!(denied(&server, "not_operator"), 2);
    assert_eq!(keys(&mut device)[0], old, "nothing rotated");

    // The operator rotates R1's key; it may not touch data itself.
    let mut operator = proven(&server, Role::Admin, "ops", OPERATOR_KEY);
    assert_eq!(
        operator.call(Repr::read(at(0, 0), old, 8)).status,
        Status::AccessDenied
    );
    assert_eq!(rotate(&mut operator, 0), Status::Ok);
    assert_eq!(rotate(&mut operator, 9), Status::Unmapped);
    let new = keys(&mut client)[0];
    assert_ne!(new, old);
    assert!(!new.is_none());

    // The stale key is refused (and counted), the new one works.
    let stale_before = denied(&server, "bad_key");
    let write = |key| Repr::write(at(0, 64), key, b"rotated");
    assert_eq!(client.call(write(old)).status, Status::AccessDenied);
    assert_eq!(denied(&server, "bad_key"), stale_before + 1);
    assert_eq!(client.call(write(new)).status, Status::Ok);

    // The rotated key is the one kept across a restart.
    let (status, stderr) = server.terminate();
    assert!(status.success(), "{stderr}");
    let restarted = keyed_server(dir.path());
    let mut device = proven(&restarted, Role::FabricDevice, "F", DEVICE_KEY);
    assert_eq!(keys(&mut device)[0], new);
}

#[test]
fn a_peer_that_has_not_proven_its_key_cannot_send_large_frames() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = keyed_server(dir.path());
    let write = Repr::write(at(0, 0), AccessKey::NONE, &[0; 1 << 20]);
    let frame = Message::Request(write).encode_to_vec(1).expect("encode");
    // Before the proof: closed once the header is in, the body never read.
    let mut stranger = Conn::connect(server.addr("nic.n0"));
    stranger.send_raw(&frame[..4096]);
    assert!(stranger.try_recv().is_none(), "closed");
    let metrics = telemetry::http_get(server.addr("admin"), "/metrics", Duration::from_secs(5))
        .expect("metrics")
        .1;
    assert!(
        metrics
            .lines()
            .any(|l| l == "pmem_server_connections_closed_total{reason=\"unframeable\"} 1"),
        "{metrics}"
    );
    // After it, large frames are served.
    let mut device = proven(&server, Role::FabricDevice, "F", DEVICE_KEY);
    let key = keys(&mut device)[0];
    let write = Repr {
        on_behalf: Some(0),
        ..Repr::write(at(0, 0), key, &[5; 1 << 20])
    };
    assert_eq!(device.call(write).status, Status::Ok);
}

#[test]
fn without_keys_the_server_starts_only_when_told_insecure() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write_topology(dir.path(), &[("R1", "4MiB")]);
    let data = dir.path().join("data");
    let refused = Command::new(PMEM_SERVER)
        .arg("--config")
        .arg(&config)
        .args(["--server", "S", "--admin", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .output()
        .expect("run pmem-server");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    for needed in ["testbed keygen", "--secrets DIR", "--insecure"] {
        assert!(stderr.contains(needed), "{needed:?} in {stderr}");
    }
    assert!(!data.exists(), "refused before touching the data directory");

    // With --insecure it serves anyone, and says so once.
    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &["--insecure"])
        .expect("an insecure server starts");
    let mut anyone = Conn::connect(server.addr("nic.n0"));
    assert!(!anyone.map().entries[0].key.is_none(), "no proof asked");
    let (status, stderr) = server.terminate();
    assert!(status.success(), "{stderr}");
    assert_eq!(
        stderr.matches("--insecure: no authentication").count(),
        1,
        "{stderr}"
    );
}

/// Anonymous MAP_REQUEST and ROTATE_KEY, before HELLO or after HELLO and
/// before the proof, get nothing but a refusal and a closed connection.
#[test]
fn an_unproven_peer_gets_no_map_and_rotates_no_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = keyed_server(dir.path());
    let data = server.addr("nic.n0");
    let before = keys(&mut proven(&server, Role::FabricDevice, "F", DEVICE_KEY));
    for message in [Message::MapRequest, Message::RotateKey(RegionIndex(0))] {
        for hello_first in [false, true] {
            let mut stranger = Conn::connect(data);
            if hello_first {
                // As the operator, without its key.
                stranger.hello_as(Role::Admin, "ops");
                assert_eq!(stranger.recv().opcode, proto::Opcode::AuthChallenge);
            }
            stranger.send(&message);
            let reply = stranger.recv();
            assert_ne!(reply.opcode, proto::Opcode::Map, "{message:?}: {reply:?}");
            assert_eq!(reply.status, Status::UnknownClient, "{message:?}");
            assert!(stranger.try_recv().is_none(), "closed");
        }
    }
    let after = keys(&mut proven(&server, Role::FabricDevice, "F", DEVICE_KEY));
    assert_eq!(after, before, "nothing rotated");
}

fn closed(server: &Daemon, reason: &str) -> u64 {
    scraped(server, "pmem_server_connections_closed_total", reason)
}

/// Connections that say HELLO as client `c` and never prove it count
/// against no cap of the real `c`: with room for 8 proven connections, 64
/// such strangers do not keep it out.
#[test]
fn unproven_hellos_do_not_keep_the_real_client_out() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = keyed_server_with(dir.path(), &["--max-connections", "8"]);
    let data = server.addr("nic.n0");
    let strangers: Vec<Conn> = (0..64)
        .map(|_| {
            let mut stranger = Conn::connect(data);
            stranger.hello("c");
            assert_eq!(stranger.recv().opcode, proto::Opcode::AuthChallenge);
            stranger
        })
        .collect();
    let mut client = proven(&server, Role::Client, "c", CLIENT_KEY);
    let key = keys(&mut client)[0];
    assert_eq!(client.call(Repr::read(at(0, 0), key, 8)).status, Status::Ok);
    drop(strangers);
}

/// Unproven connections are bounded apart: past `--max-unproven` a new one
/// closes the oldest, and one that does not prove its key within
/// `--hello-timeout-ms` of opening is closed.
#[test]
fn unproven_connections_are_bounded_in_number_and_time() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = keyed_server_with(
        dir.path(),
        &["--max-unproven", "4", "--hello-timeout-ms", "1500"],
    );
    let data = server.addr("nic.n0");
    let mut strangers: Vec<Conn> = (0..5)
        .map(|_| {
            let mut stranger = Conn::connect(data);
            stranger.hello("c");
            assert_eq!(stranger.recv().opcode, proto::Opcode::AuthChallenge);
            stranger
        })
        .collect();
    // The fifth evicted the first.
    assert!(strangers[0].try_recv().is_none(), "the oldest was closed");
    assert_eq!(closed(&server, "unproven_evicted"), 1);
    // The others did not prove in time: closed, counted.
    for stranger in &mut strangers[1..] {
        assert!(stranger.try_recv().is_none(), "closed unproven");
    }
    assert_eq!(closed(&server, "hello_timeout"), 4);
    // A proven client is not held to the HELLO timeout.
    let mut client = proven(&server, Role::Client, "c", CLIENT_KEY);
    std::thread::sleep(Duration::from_millis(2000));
    let key = keys(&mut client)[0];
    assert_eq!(client.call(Repr::read(at(0, 0), key, 8)).status, Status::Ok);
}

/// Asks for the current checksums of R1's first two blocks; the answer's
/// status, and the checksums when it is a report.
fn block_sums(conn: &mut Conn) -> (Status, Vec<u64>) {
    conn.send(&Message::BlockSums(proto::block_sums::Repr {
        region: 0,
        first: 0,
        blocks: 2,
    }));
    let reply = conn.recv();
    if reply.opcode != proto::Opcode::BlockSumsReport {
        return (reply.status, Vec::new());
    }
    let packet = proto::block_sums::ReportPacket::new_checked(&reply.data[..]).expect("a report");
    let report = proto::block_sums::Report::parse(&packet).expect("a report");
    (Status::Ok, report.sums)
}

#[test]
fn block_checksums_go_to_operators_and_devices_not_to_clients() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = keyed_server(dir.path());
    let mut client = proven(&server, Role::Client, "c", CLIENT_KEY);
    assert_eq!(block_sums(&mut client), (Status::AccessDenied, Vec::new()));
    assert_eq!(denied(&server, "not_operator_or_device"), 1);
    let mut device = proven(&server, Role::FabricDevice, "F", DEVICE_KEY);
    let (status, sums) = block_sums(&mut device);
    assert_eq!((status, sums.len()), (Status::Ok, 2));
    let mut operator = proven(&server, Role::Admin, "ops", OPERATOR_KEY);
    assert_eq!(block_sums(&mut operator), (Status::Ok, sums));
}
