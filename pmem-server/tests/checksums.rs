//! Block checksums across restarts: a clean stop keeps them, so a byte
//! flipped while the server is down is reported by the first scrub after
//! the restart; after a crash they are recorded again.

use std::os::unix::fs::FileExt;
use std::path::Path;

use proto::request::Repr;
use proto::scrub::{self, ReportPacket};
use proto::{Message, Opcode};
use testkit::{Conn, at, key, pmem_server_with, write_topology};

/// This package's daemon, built with the features of the test run.
const PMEM_SERVER: &str = env!("CARGO_BIN_EXE_pmem-server");

const BLOCK: u64 = 64 << 10;

/// Scrubs the 64 blocks of region 0 (4 MiB) over a raw connection.
fn scrub(addr: std::net::SocketAddr) -> scrub::Report {
    let mut conn = Conn::connect(addr);
    conn.send(&Message::Scrub(scrub::Repr {
        region: 0,
        first: 0,
        blocks: 64,
    }));
    let reply = conn.recv();
    assert_eq!(reply.opcode, Opcode::ScrubReport, "{reply:?}");
    scrub::Report::parse(&ReportPacket::new_checked(&reply.data[..]).expect("a report"))
        .expect("a report")
}

/// Flips one byte of region file `file`'s data at `offset`.
fn flip(file: &Path, offset: u64) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .expect("region file");
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, 4096 + offset).expect("read");
    file.write_all_at(&[!byte[0]], 4096 + offset).expect("flip");
}

#[test]
fn a_clean_restart_keeps_the_checksums_and_a_crash_forgets_them() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = write_topology(dir.path(), &[("R1", "4MiB")]);
    let msync = ["--persistence", "msync"];
    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &msync).unwrap();
    let nic = server.addr("nic.n0");
    let first = scrub(nic);
    assert_eq!(
        (first.recorded, first.verified, first.head.total),
        (64, 0, 64)
    );
    // Written after the recording: kept out of the saved checksums.
    let reply = Conn::connect(nic).call(Repr::write_persist(
        at(0, 2 * BLOCK + 5),
        key(nic, 0),
        b"legitimate",
    ));
    assert_eq!(reply.status, proto::Status::Ok);
    let (status, _) = server.terminate();
    assert!(status.success());
    assert!(data.join("R1.sums").exists(), "saved at the clean stop");

    // Damage while the server is down.
    flip(&data.join("R1.pmem"), 7 * BLOCK + 3);
    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &msync).unwrap();
    assert!(!data.join("R1.sums").exists(), "removed once loaded");
    let nic = server.addr("nic.n0");
    let after = scrub(nic);
    assert_eq!(after.mismatches, [7], "{after:?}");
    assert_eq!((after.recorded, after.verified), (1, 62), "{after:?}");
    // The log line may reach the test's reader after the scrub's answer.
    server.wait_for_log("block checksums of the last clean stop loaded");

    // After a crash nothing is loaded: every block is recorded again.
    server.kill9();
    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &msync).unwrap();
    let fresh = scrub(server.addr("nic.n0"));
    assert_eq!((fresh.recorded, fresh.verified), (64, 0), "{fresh:?}");
    assert!(fresh.mismatches.is_empty());
    server.terminate();
}

#[test]
fn regions_written_over_rdma_are_unwatched() {
    use pmem_server::persist::PersistPolicy;
    use pmem_server::{OpenedServer, ServerConfig};
    use topology::{NicTransport, ServerId, Topology};

    let dir = tempfile::tempdir().unwrap();
    let topology = Topology::load(write_topology(dir.path(), &[("R1", "4MiB")])).unwrap();
    let config = |transport| ServerConfig {
        topology: topology.clone(),
        server: ServerId::new("S"),
        data_dir: dir.path().join("data"),
        admin: "127.0.0.1:0".parse().unwrap(),
        persistence: PersistPolicy::Msync,
        format: false,
        create_missing: Vec::new(),
        reset_exactly_once: false,
        max_connections: 1,
        max_unproven: 1,
        timeouts: Default::default(),
        secrets: None,
        transport,
    };
    let unwatched = |transport| {
        let opened = OpenedServer::open(&config(transport)).unwrap();
        let flags: Vec<bool> = opened
            .exec
            .regions()
            .map(|r| r.file.sums.is_unwatched())
            .collect();
        flags
    };
    assert_eq!(unwatched(None), [false], "a TCP NIC: every write is seen");
    assert_eq!(unwatched(Some(NicTransport::Verbs)), [true]);
}

/// The current checksums of `blocks` blocks of region `region` from block
/// `first`, or the status of the refusal.
fn current(
    addr: std::net::SocketAddr,
    region: u32,
    first: u64,
    blocks: u32,
) -> Result<proto::block_sums::Report, proto::Status> {
    use proto::block_sums;
    let mut conn = Conn::connect(addr);
    conn.send(&Message::BlockSums(block_sums::Repr {
        region,
        first,
        blocks,
    }));
    let reply = conn.recv();
    if reply.opcode != Opcode::BlockSumsReport {
        assert_eq!(reply.opcode, Opcode::Acknowledge, "{reply:?}");
        return Err(reply.status);
    }
    let packet = block_sums::ReportPacket::new_checked(&reply.data[..]).expect("a report");
    Ok(block_sums::Report::parse(&packet).expect("a report"))
}

#[test]
fn block_sums_follow_the_bytes_as_they_are_now() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = write_topology(dir.path(), &[("R1", "4MiB")]);
    let server = pmem_server_with(
        PMEM_SERVER,
        &config,
        "S",
        &data,
        &["--persistence", "msync"],
    )
    .unwrap();
    let nic = server.addr("nic.n0");
    let before = current(nic, 0, 0, 64).expect("sums");
    assert_eq!(
        (before.head.first, before.head.total, before.head.block_len),
        (0, 64, 65536)
    );
    assert_eq!(before.sums.len(), 64);
    assert!(before.sums.iter().all(|&s| s == before.sums[0]), "all zero");

    // A write changes its block's checksum at once, and no other.
    let reply =
        Conn::connect(nic).call(Repr::write_persist(at(0, 3 * BLOCK + 7), key(nic, 0), b"x"));
    assert_eq!(reply.status, proto::Status::Ok);
    let after = current(nic, 0, 2, 3).expect("sums");
    assert_eq!(after.head.first, 2);
    assert_eq!(after.sums[0], before.sums[2]);
    assert_ne!(after.sums[1], before.sums[3]);
    assert_eq!(after.sums[2], before.sums[4]);
    // So does a byte changed behind the server's back.
    flip(&data.join("R1.pmem"), 9 * BLOCK);
    assert_ne!(current(nic, 0, 9, 1).expect("sums").sums[0], before.sums[9]);

    // Runs outside the region or of no region are refused.
    assert_eq!(current(nic, 0, 63, 2), Err(proto::Status::OutOfBounds));
    assert_eq!(current(nic, 5, 0, 1), Err(proto::Status::Unmapped));
    server.terminate();
}
