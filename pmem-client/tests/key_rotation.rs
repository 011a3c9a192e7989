//! Region keys on an authenticated fabric: the operator rotates a key with
//! `pmemctl rotate-key` while a client is running, and the client keeps
//! working with the new key it learns through its fabric device; the old
//! key is refused by the server. With two devices, the one the client asks
//! first may not know the new key yet: the client asks the other too.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use pmem_client::{Pool, VIRT_BASE};
use testkit::{Daemon, FabricSpec, Ports};
use topology::secrets::{Principal, write_key};
use topology::{Topology, VirtAddr};

/// Counter `name{label}` in a Prometheus text, 0 when absent.
fn counter(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}

/// The sum of every series of `name` in a Prometheus text.
fn total(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn metrics(daemon: &Daemon) -> String {
    telemetry::http_get(daemon.addr("admin"), "/metrics", Duration::from_secs(5))
        .expect("metrics")
        .1
}

/// Runs `pmemctl --config CONFIG --secrets SECRETS ARGS…`.
fn pmemctl(config: &Path, secrets: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pmemctl"))
        .arg("--config")
        .arg(config)
        .arg("--secrets")
        .arg(secrets)
        .args(args)
        .output()
        .expect("run pmemctl")
}

#[test]
fn a_running_client_follows_a_key_rotation_and_the_old_key_is_refused() {
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
    let with_secrets = ["--secrets", secrets.to_str().expect("path")];
    let server = testkit::pmem_server(&config, "A", &dir.path().join("A"), &with_secrets)
        .unwrap_or_else(|e| panic!("pmem-server did not start:\n{e}"));
    let device = testkit::fabric_device(&config, "F", &with_secrets)
        .unwrap_or_else(|e| panic!("fabric-device did not start:\n{e}"));
    device.wait_links_up(1);

    let topology = Topology::load(&config).expect("topology");
    let pool = Pool::builder(topology, "c1")
        .secrets(&secrets)
        .connect()
        .expect("the client connects");
    let at = VirtAddr(VIRT_BASE + 4096);
    pool.write_persist(at, b"before").expect("write");

    // Pool commands need a client; rotate-key is the operator's.
    let no_client = pmemctl(&config, &secrets, &["read", "1TiB", "8"]);
    assert_eq!(no_client.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&no_client.stderr).contains("--client ID is needed"),
        "{no_client:?}"
    );

    // Someone without an operator key cannot rotate.
    let refused = pmemctl(
        &config,
        &secrets,
        &["rotate-key", "A1", "--operator", "eve"],
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("pmemctl: error: the operator's key: ")
            && stderr.contains("operator.eve.key: no key file"),
        "{stderr}"
    );

    let rotated = pmemctl(&config, &secrets, &["rotate-key", "A1"]);
    assert!(
        rotated.status.success(),
        "{}",
        String::from_utf8_lossy(&rotated.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&rotated.stdout),
        "rotated the key of region A1\n"
    );

    // The running client's next request carries the old key: the server
    // refuses it, the device learns the new key, the client asks its
    // device again and goes on.
    assert_eq!(
        pool.read(at, 6).expect("read after the rotation"),
        b"before"
    );
    pool.write_persist(at, b"after!")
        .expect("write after the rotation");
    assert_eq!(pool.stats().key_refreshes, 1);
    assert_eq!(
        counter(&metrics(&device), "fabric_device_key_refreshes_total"),
        1
    );
    assert!(
        counter(
            &metrics(&server),
            "pmem_server_denied_requests_total{reason=\"bad_key\"}"
        ) >= 1
    );

    // A client that connects now gets the new key at once.
    let topology = Topology::load(&config).expect("topology");
    let fresh = Pool::builder(topology, "c1")
        .secrets(&secrets)
        .connect()
        .expect("a new client connects");
    assert_eq!(fresh.read(at, 6).expect("read"), b"after!");
    assert_eq!(fresh.stats().key_refreshes, 0);
}

/// Server A has two sockets, A1 on socket 0. Device F links only to A's
/// socket-1 NIC and G only to its socket-0 NIC, so the client (an RNIC to
/// each, F's first) sends A1's requests through G, which lands on A1's own
/// socket. After a rotation G's request is refused and G learns the new
/// key; F, which no request went through, still gives the old one. The
/// client must not stop at F's answer.
#[test]
fn a_key_rotated_behind_one_device_is_learnt_from_the_other() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = FabricSpec::new()
        .sockets_per_server(2)
        .server("A", &[("A1", "4MiB")])
        .device("F")
        .device("G")
        .client("c1");
    let config = spec.write(dir.path(), "topology.toml", &mut Ports::new());
    let text = std::fs::read_to_string(&config).expect("read the topology");
    let both =
        "links = [\n  { server = \"A\", nic = \"n0\" },\n  { server = \"A\", nic = \"n1\" },\n]";
    assert_eq!(text.matches(both).count(), 2, "{text}");
    let text = text
        .replacen(both, "links = [\n  { server = \"A\", nic = \"n1\" },\n]", 1)
        .replacen(both, "links = [\n  { server = \"A\", nic = \"n0\" },\n]", 1);
    std::fs::write(&config, &text).expect("write the topology");
    let secrets = dir.path().join("secrets");
    for (principal, byte) in [
        (Principal::Device("F"), 0x11),
        (Principal::Device("G"), 0x22),
        (Principal::Client("c1"), 0xC1),
        (Principal::Operator("admin"), 0xAD),
    ] {
        write_key(&secrets, principal, &[byte; 32]).expect("key");
    }
    let with_secrets = ["--secrets", secrets.to_str().expect("path")];
    let _server = testkit::pmem_server(&config, "A", &dir.path().join("A"), &with_secrets)
        .unwrap_or_else(|e| panic!("pmem-server did not start:\n{e}"));
    let devices = ["F", "G"].map(|d| {
        testkit::fabric_device(&config, d, &with_secrets)
            .unwrap_or_else(|e| panic!("fabric-device {d} did not start:\n{e}"))
    });
    for d in &devices {
        d.wait_links_up(1);
    }
    let [f, g] = &devices;

    let topology = Topology::load(&config).expect("topology");
    let pool = Pool::builder(topology, "c1")
        .secrets(&secrets)
        .connect()
        .expect("the client connects");
    assert_eq!(
        pool.paths()[0].device.split(' ').next(),
        Some("F"),
        "{:?}",
        pool.paths()
    );
    let at = VirtAddr(VIRT_BASE + 4096);
    pool.write_persist(at, b"before").expect("write");
    let requests = |d: &Daemon| total(&metrics(d), "fabric_device_requests_total");
    let through_f = requests(f);
    assert!(requests(g) >= 1, "A1's requests go through G");

    let rotated = pmemctl(&config, &secrets, &["rotate-key", "A1"]);
    assert!(
        rotated.status.success(),
        "{}",
        String::from_utf8_lossy(&rotated.stderr)
    );
    pool.write_persist(at, b"after!")
        .expect("write after the rotation, refused once through G");
    assert_eq!(pool.read(at, 6).expect("read"), b"after!");
    assert_eq!(requests(f), through_f, "no request went through F");
    assert_eq!(
        counter(&metrics(f), "fabric_device_key_refreshes_total"),
        0,
        "F never learnt the new key"
    );
    assert_eq!(counter(&metrics(g), "fabric_device_key_refreshes_total"), 1);
    assert_eq!(pool.stats().key_refreshes, 1);
}
