//! `pmemctl scrub --checksums` on an authenticated fabric: the first scrub
//! records every block's checksum on the server, a byte flipped in a region
//! file behind the server's back is reported by region and block with a
//! non-zero exit, and a legitimate write through the fabric in between is
//! not reported.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use pmem_client::{Pool, VIRT_BASE};
use testkit::{Daemon, FabricSpec, Ports};
use topology::secrets::{Principal, write_key};
use topology::{Topology, VirtAddr};

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

fn metrics(daemon: &Daemon) -> String {
    telemetry::http_get(daemon.addr("admin"), "/metrics", Duration::from_secs(5))
        .expect("metrics")
        .1
}

const BLOCK: u64 = 64 << 10;

#[test]
fn a_flipped_byte_is_reported_by_region_and_block_but_a_fabric_write_is_not() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = FabricSpec::new()
        .server("A", &[("A1", "4MiB"), ("A2", "4MiB")])
        .device("F")
        .client("c1");
    let config = spec.write(dir.path(), "topology.toml", &mut Ports::new());
    let secrets = dir.path().join("secrets");
    write_key(&secrets, Principal::Device("F"), &[0x11; 32]).expect("key");
    write_key(&secrets, Principal::Client("c1"), &[0xC1; 32]).expect("key");
    write_key(&secrets, Principal::Operator("admin"), &[0xAD; 32]).expect("key");
    let secrets_dir = secrets.to_str().expect("path");
    // The server maps its region files shared, so bytes written to a file
    // on disk are what it reads.
    let data = dir.path().join("A");
    let server = testkit::pmem_server(
        &config,
        "A",
        &data,
        &["--secrets", secrets_dir, "--persistence", "msync"],
    )
    .unwrap_or_else(|e| panic!("pmem-server did not start:\n{e}"));
    let device = testkit::fabric_device(&config, "F", &["--secrets", secrets_dir])
        .unwrap_or_else(|e| panic!("fabric-device did not start:\n{e}"));
    device.wait_links_up(1);

    // Only an operator may scrub.
    let refused = pmemctl(
        &config,
        &secrets,
        &["scrub", "--checksums", "--operator", "eve"],
    );
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");

    // The first scrub records every block.
    let first = pmemctl(&config, &secrets, &["scrub", "--checksums"]);
    let out = String::from_utf8_lossy(&first.stdout);
    assert!(first.status.success(), "{first:?}");
    assert!(
        out.contains("region A1 (server A): 64 blocks of 64 KiB: 0 verified, 64 recorded"),
        "{out}"
    );
    assert!(out.contains("region A2 (server A)"), "{out}");

    // A legitimate write through the fabric into block 3 of A1 (the first
    // region of the pool's virtual space).
    let topology = Topology::load(&config).expect("topology");
    let pool = Pool::builder(topology, "c1")
        .secrets(&secrets)
        .connect()
        .expect("the client connects");
    pool.write_persist(VirtAddr(VIRT_BASE + 3 * BLOCK + 100), b"legitimate")
        .expect("write");

    // A byte of block 5 of A2 flips behind the server's back.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(data.join("A2.pmem"))
        .expect("region file");
    let at = 4096 + 5 * BLOCK + 7;
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, at).expect("read");
    file.write_all_at(&[!byte[0]], at).expect("flip");
    file.sync_all().expect("sync");

    let second = pmemctl(&config, &secrets, &["scrub", "--checksums"]);
    let out = String::from_utf8_lossy(&second.stdout);
    let err = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "{out}\n{err}");
    assert!(
        out.contains("region A1 (server A): 64 blocks of 64 KiB: 63 verified, 1 recorded"),
        "the written block is recorded again, not reported: {out}"
    );
    assert!(!out.contains("MISMATCH region A1"), "{out}");
    assert!(
        out.contains("MISMATCH region A2 block 5 (offset 0x50000, 65536 bytes)"),
        "{out}"
    );
    assert_eq!(out.matches("MISMATCH").count(), 1, "{out}");
    assert!(
        err.contains("1 block(s) in 1 region(s) no longer match"),
        "{err}"
    );

    // One region asked for, and the metrics.
    let only = pmemctl(
        &config,
        &secrets,
        &["scrub", "--checksums", "--region", "A1"],
    );
    assert!(only.status.success(), "{only:?}");
    let out = String::from_utf8_lossy(&only.stdout);
    assert!(out.contains("64 verified, 0 recorded"), "{out}");
    assert!(!out.contains("A2"), "{out}");
    let text = metrics(&server);
    for series in [
        "pmem_server_scrubbed_blocks_total{region=\"A2\",result=\"mismatch\"} 1",
        "pmem_server_scrubbed_blocks_total{region=\"A1\",result=\"verified\"} 127",
        "pmem_server_scrubbed_blocks_total{region=\"A1\",result=\"recorded\"} 65",
    ] {
        assert!(text.contains(series), "{series} in:\n{text}");
    }
}
