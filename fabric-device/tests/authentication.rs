//! The fabric device's admission of client connections: it starts only
//! with keys (or when told `--insecure`), answers nothing but HELLO and the
//! proof before a client proves its key, and counts a connection against
//! the caps only once it is proven; the real daemon, attacked over its
//! client port.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use proto::hello::Role;
use proto::request::{Repr, Target};
use proto::{Message, Opcode, RegionIndex, Status};
use testkit::{Conn, Daemon, FabricSpec, Ports, layout};
use topology::secrets::{Principal, write_key};

const C1_KEY: [u8; 32] = [0xC1; 32];

/// Servers A and B and device F with keys for F, c1 and c2: the topology,
/// the keys' folder and the running servers.
struct Keyed {
    _dir: tempfile::TempDir,
    config: PathBuf,
    secrets: PathBuf,
    _servers: Vec<Daemon>,
}

impl Keyed {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = FabricSpec::new()
            .server("A", &[("A1", "4MiB")])
            .server("B", &[("B1", "4MiB")])
            .device("F")
            .client("c1")
            .client("c2")
            .write(dir.path(), "topology.toml", &mut Ports::new());
        let secrets = dir.path().join("secrets");
        write_key(&secrets, Principal::Device("F"), &[0x11; 32]).expect("key");
        write_key(&secrets, Principal::Client("c1"), &C1_KEY).expect("key");
        write_key(&secrets, Principal::Client("c2"), &[0xC2; 32]).expect("key");
        write_key(&secrets, Principal::Operator("admin"), &[0xAD; 32]).expect("key");
        let servers = ["A", "B"]
            .iter()
            .map(|id| {
                let data = dir.path().join("data").join(id);
                testkit::pmem_server(&config, id, &data, &["--secrets", path(&secrets)])
                    .unwrap_or_else(|e| panic!("pmem-server {id} did not start:\n{e}"))
            })
            .collect();
        Self {
            _dir: dir,
            config,
            secrets,
            _servers: servers,
        }
    }

    /// Device F with the keys and `extra` flags, its links up.
    fn device(&self, extra: &[&str]) -> Daemon {
        let mut flags = vec!["--secrets", path(&self.secrets)];
        flags.extend_from_slice(extra);
        let device = testkit::fabric_device(&self.config, "F", &flags)
            .unwrap_or_else(|e| panic!("fabric-device did not start:\n{e}"));
        device.wait_links_up(2);
        device
    }

    /// A READ of A1's first bytes with `conn`'s key for it.
    fn read_a1(&self, conn: &mut Conn) -> Status {
        let a1 = layout(&self.config)
            .entry_by_id(&"A1".into())
            .expect("A1")
            .clone();
        let key = conn.region_key(a1.region.0);
        conn.call(Repr::read(Target::Pmem(a1.start), key, 8)).status
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// A connection that said HELLO as `client` and got the challenge.
fn challenged(port: std::net::SocketAddr, client: &str) -> Conn {
    let mut conn = Conn::connect(port);
    assert_eq!(conn.hello(client).opcode, Opcode::Hello);
    assert_eq!(conn.recv().opcode, Opcode::AuthChallenge);
    conn
}

/// c1, proven.
fn proven_c1(port: std::net::SocketAddr) -> Conn {
    let mut conn = Conn::connect(port);
    conn.authenticate(Role::Client, "c1", C1_KEY)
        .expect("c1 proves its key");
    conn
}

/// The sum of metric `name`'s samples labelled `reason` on `device`'s
/// `/metrics`.
fn metric(device: &Daemon, name: &str, reason: &str) -> u64 {
    let text = telemetry::http_get(device.addr("admin"), "/metrics", Duration::from_secs(5))
        .expect("metrics")
        .1;
    let labels = format!("reason=\"{reason}\"");
    telemetry::metric_sum(&text, name, &labels).unwrap_or(0.0) as u64
}

#[test]
fn without_keys_the_device_starts_only_when_told_insecure() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = FabricSpec::new()
        .server("A", &[("A1", "4MiB")])
        .device("F")
        .client("c1")
        .write(dir.path(), "topology.toml", &mut Ports::new());
    let refused = Command::new(env!("CARGO_BIN_EXE_fabric-device"))
        .arg("--config")
        .arg(&config)
        .args(["--device", "F", "--admin", "127.0.0.1:0"])
        .output()
        .expect("run fabric-device");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    for needed in ["testbed keygen", "--secrets DIR", "--insecure"] {
        assert!(stderr.contains(needed), "{needed:?} in {stderr}");
    }

    // With --insecure it starts, and says so once.
    let device = testkit::fabric_device(&config, "F", &["--insecure"])
        .unwrap_or_else(|e| panic!("an insecure device starts:\n{e}"));
    let mut anyone = Conn::connect(device.addr("port.p0"));
    assert_eq!(anyone.hello("c1").opcode, Opcode::Hello, "no proof asked");
    let (status, stderr) = device.terminate();
    assert!(status.success(), "{stderr}");
    assert_eq!(
        stderr.matches("--insecure: no authentication").count(),
        1,
        "{stderr}"
    );
}

/// Anonymous MAP_REQUEST and ROTATE_KEY, before HELLO or after HELLO and
/// before the proof, get a refusal and a closed connection, not a MAP.
#[test]
fn an_unproven_client_gets_no_map_and_rotates_no_key() {
    let fabric = Keyed::start();
    let device = fabric.device(&[]);
    let port = device.addr("port.p0");
    for message in [Message::MapRequest, Message::RotateKey(RegionIndex(0))] {
        for hello_first in [false, true] {
            let mut stranger = match hello_first {
                true => challenged(port, "c1"),
                false => Conn::connect(port),
            };
            stranger.send(&message);
            let reply = stranger.recv();
            assert_ne!(reply.opcode, Opcode::Map, "{message:?}: {reply:?}");
            assert_eq!(reply.status, Status::UnknownClient, "{message:?}");
            assert!(stranger.try_recv().is_none(), "closed");
        }
    }
    assert_eq!(
        metric(
            &device,
            "fabric_device_hello_refused_total",
            "unauthenticated"
        ),
        4
    );
    // Even a proven client rotates nothing here: keys are the servers'.
    let mut c1 = proven_c1(port);
    c1.send(&Message::RotateKey(RegionIndex(0)));
    assert_ne!(c1.recv().status, Status::Ok);
}

/// Connections that say HELLO as c1 and never prove it count against none
/// of c1's caps: with room for 8 proven connections and 2 per client, 64
/// such strangers neither fill the device nor make it answer c1 BUSY.
#[test]
fn unproven_hellos_do_not_keep_the_real_client_out() {
    let fabric = Keyed::start();
    let device = fabric.device(&["--max-clients", "8", "--max-connections-per-client", "2"]);
    let port = device.addr("port.p0");
    let strangers: Vec<Conn> = (0..64).map(|_| challenged(port, "c1")).collect();
    let mut first = proven_c1(port);
    let mut second = proven_c1(port);
    assert_eq!(fabric.read_a1(&mut first), Status::Ok);
    assert_eq!(fabric.read_a1(&mut second), Status::Ok);
    // The cap still holds for proven connections.
    let third = Conn::connect(port).authenticate(Role::Client, "c1", C1_KEY);
    assert_eq!(
        third,
        Err(proto::opening::OpeningError::Refused(Status::Busy))
    );
    drop(strangers);
}

/// Unproven connections are bounded apart: past `--max-unproven` a new one
/// closes the oldest, and one that does not prove its key within
/// `--hello-timeout-ms` of opening is closed.
#[test]
fn unproven_connections_are_bounded_in_number_and_time() {
    let fabric = Keyed::start();
    let device = fabric.device(&["--max-unproven", "4", "--hello-timeout-ms", "1500"]);
    let port = device.addr("port.p0");
    let mut strangers: Vec<Conn> = (0..5).map(|_| challenged(port, "c1")).collect();
    assert!(strangers[0].try_recv().is_none(), "the oldest was closed");
    assert_eq!(
        metric(
            &device,
            "fabric_device_connections_closed_total",
            "unproven_evicted"
        ),
        1
    );
    for stranger in &mut strangers[1..] {
        assert!(stranger.try_recv().is_none(), "closed unproven");
    }
    assert_eq!(
        metric(
            &device,
            "fabric_device_connections_closed_total",
            "hello_timeout"
        ),
        4
    );
    let mut c1 = proven_c1(port);
    assert_eq!(fabric.read_a1(&mut c1), Status::Ok);
}
