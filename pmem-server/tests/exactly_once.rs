//! The exactly-once window belongs to the clients it numbers: a client
//! holding its own key cannot record a result under another client's
//! identity, a device acts only for the clients wired to it, a recorded
//! identity answers only the request that recorded it, an atomic decided at
//! another copy and recorded here by a device answers its retry here (a
//! client cannot plant such a record), and a window that was lost or
//! damaged stops the server instead of applying retries twice.
//! The real daemon, attacked over its data port.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use proto::atomic_record::AtomicRecord;
use proto::hello::Role;
use proto::request::{LANE_SHIFT, Repr};
use proto::{AccessKey, Opcode, Status};
use testkit::{Conn, Daemon, FabricSpec, Ports, at, pmem_server_with};
use topology::secrets::{Principal, write_key};

const PMEM_SERVER: &str = env!("CARGO_BIN_EXE_pmem-server");
/// The window file in a data directory, and where its first slot starts.
const WINDOW_FILE: &str = "exactly-once.pmem";
const FIRST_SLOT: u64 = 8192;

/// Each principal's key: its name's first byte, repeated.
fn key_of(name: &str) -> [u8; 32] {
    [name.as_bytes()[0] ^ name.len() as u8; 32]
}

/// Server `S` (one 4 MiB region `R1`), devices `F` and `G`, clients `c1`
/// and `c2` wired to both, `c3` wired to `G` only; a key for each.
fn fabric(dir: &Path) -> (PathBuf, PathBuf) {
    let config = FabricSpec::new()
        .server("S", &[("R1", "4MiB")])
        .device("F")
        .device("G")
        .client("c1")
        .client("c2")
        .client("c3")
        .write(dir, "topology.toml", &mut Ports::new());
    let text = std::fs::read_to_string(&config).expect("topology");
    let both = "id = \"c3\"\nrnics = [\n  { id = \"r0\", fabric_device = \"F\" },\n";
    assert!(text.contains(both), "{text}");
    let text = text.replace(both, "id = \"c3\"\nrnics = [\n");
    std::fs::write(&config, text).expect("topology");
    let secrets = dir.join("secrets");
    for device in ["F", "G"] {
        write_key(&secrets, Principal::Device(device), &key_of(device)).expect("key");
    }
    for client in ["c1", "c2", "c3"] {
        write_key(&secrets, Principal::Client(client), &key_of(client)).expect("key");
    }
    (config, secrets)
}

fn start(config: &Path, secrets: &Path, data: &Path, extra: &[&str]) -> Result<Daemon, String> {
    let mut args = vec!["--secrets", secrets.to_str().expect("path")];
    args.extend_from_slice(extra);
    pmem_server_with(PMEM_SERVER, config, "S", data, &args)
}

fn proven(server: &Daemon, role: Role, name: &str) -> Conn {
    let mut conn = Conn::connect(server.addr("nic.n0"));
    conn.authenticate(role, name, key_of(name))
        .unwrap_or_else(|e| panic!("{name} authenticates: {e:?}"));
    conn
}

/// The word at `offset` of R1, read by device `F` for client `c1`.
fn word(device: &mut Conn, key: AccessKey, offset: u64) -> u64 {
    let read = Repr {
        on_behalf: Some(0),
        ..Repr::read(at(0, offset), key, 8)
    };
    let reply = device.call(read);
    assert_eq!(reply.status, Status::Ok);
    u64::from_le_bytes(reply.data[..8].try_into().expect("8 bytes"))
}

fn refused(server: &Daemon, family: &str, reason: &str) -> u64 {
    let text = telemetry::http_get(server.addr("admin"), "/metrics", Duration::from_secs(5))
        .expect("metrics")
        .1;
    telemetry::metric_sum(&text, family, &format!("reason=\"{reason}\"")).unwrap_or(0.0) as u64
}

#[test]
fn a_client_cannot_spend_another_clients_exactly_once_identity() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (config, secrets) = fabric(dir.path());
    let server = start(&config, &secrets, &dir.path().join("data"), &[]).expect("server");
    let mut attacker = proven(&server, Role::Client, "c1");
    let key = attacker.map().entries[0].key;
    assert_ne!(key, AccessKey::NONE, "c1 may use R1");

    // c1 (number 0) names c2 (number 1), on lane 0 and on c2's lane 1,
    // with the sequence number c2 is about to use: refused, nothing runs.
    let victims_seq = 77;
    for victim in [1, 1 | 1 << LANE_SHIFT] {
        let forged = Repr::fetch_add(at(0, 64), key, 1).with_exactly_once(victim, victims_seq);
        assert_eq!(attacker.call(forged).status, Status::AccessDenied);
    }
    // Its own identity is its own to use.
    let own = Repr::fetch_add(at(0, 4096), key, 1).with_exactly_once(0, victims_seq);
    assert_eq!(attacker.call(own).status, Status::Ok);

    // c2's real atomic arrives through device F: applied, exactly once.
    let mut device = proven(&server, Role::FabricDevice, "F");
    let victims = Repr {
        on_behalf: Some(1),
        ..Repr::fetch_add(at(0, 64), key, 5).with_exactly_once(1, victims_seq)
    };
    for attempt in 0..2 {
        let reply = device.call(victims);
        assert_eq!(
            (reply.status, reply.value),
            (Status::Ok, 0),
            "try {attempt}"
        );
    }
    assert_eq!(word(&mut device, key, 64), 5, "the victim's add, once");
    assert_eq!(
        refused(
            &server,
            "pmem_server_exactly_once_refused_total",
            "foreign_identity"
        ),
        2
    );

    // A device acts only for the clients wired to it: c3 (number 2) is
    // wired to G, not F.
    let for_c3 = |seq| Repr {
        on_behalf: Some(2),
        ..Repr::fetch_add(at(0, 128), key, 1).with_exactly_once(2, seq)
    };
    assert_eq!(device.call(for_c3(1)).status, Status::AccessDenied);
    assert_eq!(
        refused(
            &server,
            "pmem_server_denied_requests_total",
            "unwired_client"
        ),
        1
    );
    let mut g = proven(&server, Role::FabricDevice, "G");
    assert_eq!(g.call(for_c3(1)).status, Status::Ok);
    assert_eq!(word(&mut device, key, 128), 1);
}

#[test]
fn a_recorded_identity_answers_only_the_request_that_recorded_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (config, secrets) = fabric(dir.path());
    let server = start(&config, &secrets, &dir.path().join("data"), &[]).expect("server");
    let mut c1 = proven(&server, Role::Client, "c1");
    let key = c1.map().entries[0].key;
    let add = |offset, n| Repr::fetch_add(at(0, offset), key, n).with_exactly_once(0, 5);
    let first = c1.call(add(256, 3));
    assert_eq!((first.status, first.value), (Status::Ok, 0));

    // The same (client, lane, seq) with another operand, target or
    // operation: refused, never answered from the record.
    let cas = Repr::compare_swap(at(0, 256), key, 3, 9).with_exactly_once(0, 5);
    for other in [add(256, 4), add(264, 3), cas] {
        let reply = c1.call(other);
        assert_eq!(reply.status, Status::ExactlyOnceConflict, "{other:?}");
        assert_eq!(reply.value, 0, "no result given out");
    }
    // The real retry is still answered from the record, and nothing else ran.
    let retry = c1.call(add(256, 3));
    assert_eq!((retry.status, retry.value), (Status::Ok, 0));
    let mut device = proven(&server, Role::FabricDevice, "F");
    assert_eq!(word(&mut device, key, 256), 3);
    assert_eq!(word(&mut device, key, 264), 0);
    assert_eq!(
        refused(
            &server,
            "pmem_server_exactly_once_refused_total",
            "conflict"
        ),
        3
    );
}

/// An ATOMIC_WRITE under an identity is stored once: its retry, after
/// another client stored a later value, is answered from the record and
/// does not bring the old value back (a plain store retried after a
/// failover did, which the linearizability check of `restart-all` caught);
/// another value under the same identity is refused.
#[test]
fn a_retried_exactly_once_atomic_write_is_not_stored_again_over_a_later_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (config, secrets) = fabric(dir.path());
    let server = start(&config, &secrets, &dir.path().join("data"), &[]).expect("server");
    let mut c1 = proven(&server, Role::Client, "c1");
    let mut c2 = proven(&server, Role::Client, "c2");
    let key = c1.map().entries[0].key;
    let store = |value| Repr::atomic_write(at(0, 512), key, value).with_exactly_once(0, 9);
    let first = c1.call(store(7));
    assert_eq!(first.status, Status::Ok);
    let later = c2.call(Repr::atomic_write(at(0, 512), key, 8).with_exactly_once(1, 1));
    assert_eq!(later.status, Status::Ok);

    let retry = c1.call(store(7));
    assert_eq!(retry.status, Status::Ok, "answered from the record");
    let conflict = c1.call(store(6));
    assert_eq!(conflict.status, Status::ExactlyOnceConflict);
    let mut device = proven(&server, Role::FabricDevice, "F");
    assert_eq!(word(&mut device, key, 512), 8, "the later store stands");
    let metrics = telemetry::http_get(server.addr("admin"), "/metrics", Duration::from_secs(5))
        .expect("metrics")
        .1;
    assert_eq!(
        telemetry::metric_sum(&metrics, "pmem_server_exactly_once_replays_total", ""),
        Some(1.0),
        "one retry answered from the record"
    );
}

/// A request device `F` sends for client `c1` (number 0).
fn for_c1(req: Repr<'_>) -> Repr<'_> {
    Repr {
        on_behalf: Some(0),
        ..req
    }
}

#[test]
fn an_atomic_recorded_at_a_backup_answers_its_retry_there() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (config, secrets) = fabric(dir.path());
    let server = start(&config, &secrets, &dir.path().join("data"), &[]).expect("server");
    let mut device = proven(&server, Role::FabricDevice, "F");
    let key = device.map().entries[0].key;

    // c1's FETCH_ADD of 5 (seq 31) was decided at another copy, where the
    // word went from 10 to 15: the device writes 15 here with the record.
    let add = AtomicRecord::new(Opcode::FetchAdd, 0, 5, 10).to_bytes();
    let carried = for_c1(
        Repr::atomic_write(at(0, 64), key, 15)
            .with_exactly_once(0, 31)
            .recording(&add),
    );
    let reply = device.call(carried);
    assert_eq!((reply.status, reply.value), (Status::Ok, 10));
    assert_eq!(word(&mut device, key, 64), 15);
    // That copy died; the client's retry reaches this one: answered with
    // the first result, never applied a second time.
    let retry = for_c1(Repr::fetch_add(at(0, 64), key, 5).with_exactly_once(0, 31));
    for attempt in 0..2 {
        let reply = device.call(retry);
        assert_eq!(
            (reply.status, reply.value),
            (Status::Ok, 10),
            "try {attempt}"
        );
    }
    assert_eq!(word(&mut device, key, 64), 15, "not added again");

    // A COMPARE_SWAP 15 -> 20 decided elsewhere (it returned 15): its
    // retry is answered, another request under its identity is refused.
    let cas = AtomicRecord::new(Opcode::CompareSwap, 15, 20, 15).to_bytes();
    let carried = for_c1(
        Repr::atomic_write(at(0, 64), key, 20)
            .with_exactly_once(0, 32)
            .recording(&cas),
    );
    assert_eq!(device.call(carried).status, Status::Ok);
    let retry = for_c1(Repr::compare_swap(at(0, 64), key, 15, 20).with_exactly_once(0, 32));
    let reply = device.call(retry);
    assert_eq!((reply.status, reply.value), (Status::Ok, 15));
    let other = for_c1(Repr::compare_swap(at(0, 64), key, 20, 7).with_exactly_once(0, 32));
    let reply = device.call(other);
    assert_eq!(reply.status, Status::ExactlyOnceConflict);
    assert_eq!(word(&mut device, key, 64), 20);
}

#[test]
fn a_client_cannot_plant_an_atomics_record() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (config, secrets) = fabric(dir.path());
    let server = start(&config, &secrets, &dir.path().join("data"), &[]).expect("server");
    let mut c1 = proven(&server, Role::Client, "c1");
    let key = c1.map().entries[0].key;
    // c1 claims its own FETCH_ADD (seq 40) already ran and returned 500.
    let claim = AtomicRecord::new(Opcode::FetchAdd, 0, 1, 500).to_bytes();
    let forged = Repr::atomic_write(at(0, 128), key, 999)
        .with_exactly_once(0, 40)
        .recording(&claim);
    assert_eq!(c1.call(forged).status, Status::AccessDenied);
    assert_eq!(
        refused(
            &server,
            "pmem_server_denied_requests_total",
            "record_from_client"
        ),
        1
    );
    // Nothing was stored or recorded: the real atomic runs.
    let real = c1.call(Repr::fetch_add(at(0, 128), key, 1).with_exactly_once(0, 40));
    assert_eq!((real.status, real.value), (Status::Ok, 0));
    let mut device = proven(&server, Role::FabricDevice, "F");
    assert_eq!(word(&mut device, key, 128), 1);
}

/// What is done to the window file while the server is down.
#[derive(Debug, Clone, Copy)]
enum Damage {
    Emptied,
    Deleted,
    RandomBytesInASlot,
}

#[test]
fn a_lost_or_damaged_window_stops_the_server_until_the_operator_resets_it() {
    for damage in [Damage::Emptied, Damage::Deleted, Damage::RandomBytesInASlot] {
        let dir = tempfile::tempdir().expect("temp dir");
        let (config, secrets) = fabric(dir.path());
        let data = dir.path().join("data");
        let server = start(&config, &secrets, &data, &[]).expect("server");
        let mut c1 = proven(&server, Role::Client, "c1");
        let key = c1.map().entries[0].key;
        let atomic = Repr::fetch_add(at(0, 64), key, 1).with_exactly_once(0, 9);
        assert_eq!(c1.call(atomic).status, Status::Ok);
        drop(c1);
        server.terminate();

        let window = data.join(WINDOW_FILE);
        match damage {
            Damage::Emptied => std::fs::File::create(&window).map(drop).expect("truncate"),
            Damage::Deleted => std::fs::remove_file(&window).expect("delete"),
            Damage::RandomBytesInASlot => {
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&window)
                    .expect("open");
                let noise: Vec<u8> = (0..64u32)
                    .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
                    .collect();
                file.write_all_at(&noise, FIRST_SLOT + 64).expect("write");
            }
        }
        let err = start(&config, &secrets, &data, &[]).expect_err("refused to start");
        let why = match damage {
            Damage::Emptied => "it is empty",
            Damage::Deleted => "it is missing",
            Damage::RandomBytesInASlot => "fails its check",
        };
        assert!(
            err.contains("exactly-once window file is damaged"),
            "{damage:?}: {err}"
        );
        assert!(err.contains(why), "{damage:?}: {err}");
        assert!(err.contains("--reset-exactly-once"), "{damage:?}: {err}");

        // The operator's explicit way out: an empty window, data kept.
        let server = start(&config, &secrets, &data, &["--reset-exactly-once"])
            .unwrap_or_else(|e| panic!("{damage:?}: starts after a reset: {e}"));
        let mut device = proven(&server, Role::FabricDevice, "F");
        assert_eq!(
            word(&mut device, key, 64),
            1,
            "{damage:?}: the region kept its data"
        );
    }
}
