//! The daemon's life: durability across kill -9, clean SIGTERM, region file
//! headers, direct PMEM addressing, metrics.

use proto::request::{Repr, Target};
use proto::{AccessKey, Message, Opcode, Status};
use std::time::Duration;
use testkit::{Conn, at, file_bytes, key, layout, pmem_server_with, write_topology};

/// This package's daemon, built with the features of the test run.
const PMEM_SERVER: &str = env!("CARGO_BIN_EXE_pmem-server");

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn write_persist_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_topology(dir.path(), &[("R1", "4MiB"), ("R2", "4MiB")]);
    let data = dir.path().join("data");
    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &[]).unwrap();
    let mut conn = Conn::connect(server.addr("nic.n0"));
    let block = pattern(4096, 7);
    let reply = conn.call(Repr::write_persist(
        at(1, 8192),
        key(server.addr("nic.n0"), 1),
        &block,
    ));
    assert_eq!(reply.status, Status::Ok);
    server.kill9();

    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &[]).unwrap();
    let mut conn = Conn::connect(server.addr("nic.n0"));
    let reply = conn.call(Repr::read(at(1, 8192), key(server.addr("nic.n0"), 1), 4096));
    assert_eq!(reply.opcode, Opcode::ReadResponse);
    assert_eq!(reply.status, Status::Ok);
    assert_eq!(reply.data, block);
    assert_eq!(
        file_bytes(&data, "R2", 8192, 4096),
        block,
        "the bytes are in R2's file"
    );
}

#[test]
fn sigterm_drains_flushes_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_topology(dir.path(), &[("R1", "4MiB")]);
    let data = dir.path().join("data");
    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &[]).unwrap();
    let mut conn = Conn::connect(server.addr("nic.n0"));
    // Pipeline plain writes (no persist) and let SIGTERM make them durable.
    let blocks: Vec<Vec<u8>> = (0..64).map(|i| pattern(1024, i as u8)).collect();
    for (i, block) in blocks.iter().enumerate() {
        conn.send(&Message::Request(Repr::write(
            at(0, i as u64 * 1024),
            key(server.addr("nic.n0"), 0),
            block,
        )));
    }
    for _ in &blocks {
        assert_eq!(conn.recv().status, Status::Ok);
    }
    let (status, stderr) = server.terminate();
    assert!(status.success(), "{status:?}\n{stderr}");
    assert!(stderr.contains("stopped cleanly"), "{stderr}");
    for (i, block) in blocks.iter().enumerate() {
        assert_eq!(&file_bytes(&data, "R1", i as u64 * 1024, 1024), block);
    }
}

#[test]
fn restart_keeps_data_and_bumps_generation() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_topology(dir.path(), &[("R1", "4MiB")]);
    let data = dir.path().join("data");
    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &[]).unwrap();
    Conn::connect(server.addr("nic.n0"))
        .call(Repr::atomic_write(at(0, 0), key(server.addr("nic.n0"), 0), 0xfeed).with_persist());
    let (status, _) = server.terminate();
    assert!(status.success());

    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &[]).unwrap();
    let reply = Conn::connect(server.addr("nic.n0")).call(Repr::fetch_add(
        at(0, 0),
        key(server.addr("nic.n0"), 0),
        1,
    ));
    assert_eq!(reply.value, 0xfeed);
    let (code, metrics) =
        telemetry::http_get(server.addr("admin"), "/metrics", Duration::from_secs(5)).unwrap();
    assert_eq!(code, 200);
    assert!(
        metrics.contains("pmem_server_region_generation{region=\"R1\"} 2"),
        "{metrics}"
    );
}

#[test]
fn header_mismatch_refuses_to_start_and_format_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = write_topology(dir.path(), &[("R1", "4MiB")]);
    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &[]).unwrap();
    Conn::connect(server.addr("nic.n0"))
        .call(Repr::atomic_write(at(0, 64), key(server.addr("nic.n0"), 0), 42).with_persist());
    server.terminate();

    // The same region, now 8 MiB in the topology.
    let config = write_topology(dir.path(), &[("R1", "8MiB")]);
    let err = pmem_server_with(PMEM_SERVER, &config, "S", &data, &[]).unwrap_err();
    assert!(err.contains("R1.pmem"), "{err}");
    assert!(
        err.contains("size is 4194304 but the topology says 8388608"),
        "{err}"
    );
    assert!(err.contains("--format"), "{err}");
    assert_eq!(
        std::fs::metadata(data.join("R1.pmem")).unwrap().len(),
        4096 + (4 << 20),
        "the refused file is left alone"
    );

    // A file that is not a region file at all.
    std::fs::write(data.join("R1.pmem"), vec![0u8; 8192]).unwrap();
    let err = pmem_server_with(PMEM_SERVER, &config, "S", &data, &[]).unwrap_err();
    assert!(err.contains("not a pmem-fabric region file"), "{err}");

    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &["--format"]).unwrap();
    let reply = Conn::connect(server.addr("nic.n0")).call(Repr::read(
        at(0, 64),
        key(server.addr("nic.n0"), 0),
        8,
    ));
    assert_eq!(reply.status, Status::Ok);
    assert_eq!(reply.data, vec![0; 8], "--format starts from zeroes");
    assert_eq!(
        std::fs::metadata(data.join("R1.pmem")).unwrap().len(),
        4096 + (8 << 20)
    );
}

#[test]
fn pmem_addressed_requests_work_directly() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_topology(dir.path(), &[("R1", "4MiB"), ("R2", "4MiB")]);
    let layout = layout(&config);
    let data = dir.path().join("data");
    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &[]).unwrap();
    let mut conn = Conn::connect(server.addr("nic.n0"));
    let r2 = layout.entries()[1].start;
    let addr = Target::Pmem(r2.checked_add(100).unwrap());
    assert_eq!(
        conn.call(Repr::write(addr, key(server.addr("nic.n0"), 1), b"direct"))
            .status,
        Status::Ok
    );
    let reply = conn.call(Repr::read(at(1, 100), key(server.addr("nic.n0"), 1), 6));
    assert_eq!(reply.data, b"direct");
    let past_end = Target::Pmem(layout.entries()[1].start.checked_add(8 << 20).unwrap());
    assert_eq!(
        conn.call(Repr::read(past_end, AccessKey::NONE, 1)).status,
        Status::Unmapped
    );
}

#[test]
fn hello_map_and_ping_are_answered() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_topology(dir.path(), &[("R1", "4MiB"), ("R2", "2MiB")]);
    let layout = layout(&config);
    let server =
        pmem_server_with(PMEM_SERVER, &config, "S", &dir.path().join("data"), &[]).unwrap();
    let mut conn = Conn::connect(server.addr("nic.n0"));
    let hello = conn.hello("c");
    assert_eq!(hello.opcode, Opcode::Hello);
    assert_eq!(hello.data, b"S", "the server answers with its id");

    // MAP carries the layout's digest and entries (`map` checks the tag).
    let map = conn.map();
    assert_eq!(map.digest, layout.digest());
    assert_eq!(map.entries.len(), 2);
    assert_eq!(map.entries[1].len, 2 << 20);

    conn.send(&Message::Ping(0xabc));
    let pong = conn.recv();
    assert_eq!((pong.opcode, pong.value), (Opcode::Pong, 0xabc));
}

#[test]
fn metrics_pass_promtool_and_count_operations() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_topology(dir.path(), &[("R1", "4MiB")]);
    let server =
        pmem_server_with(PMEM_SERVER, &config, "S", &dir.path().join("data"), &[]).unwrap();
    let mut conn = Conn::connect(server.addr("nic.n0"));
    conn.call(Repr::write_persist(
        at(0, 0),
        key(server.addr("nic.n0"), 0),
        &[1; 100],
    ));
    conn.call(Repr::read(at(0, 0), key(server.addr("nic.n0"), 0), 100));
    conn.call(Repr::read(
        at(0, 0),
        AccessKey(key(server.addr("nic.n0"), 0).get() ^ 1),
        100,
    ));
    let (code, text) =
        telemetry::http_get(server.addr("admin"), "/metrics", Duration::from_secs(5)).unwrap();
    assert_eq!(code, 200);
    telemetry::promtool_check(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    for line in [
        "pmem_server_operations_total{op=\"WRITE_PERSIST\",status=\"OK\"} 1",
        "pmem_server_operations_total{op=\"READ\",status=\"OK\"} 1",
        "pmem_server_operations_total{op=\"READ\",status=\"ACCESS_DENIED\"} 1",
        "pmem_server_received_bytes_total 100",
        "pmem_server_sent_bytes_total 100",
        "pmem_server_region_size_bytes{region=\"R1\"} 4194304",
        &format!(
            "pmem_server_persistence_mode{{mode=\"{}\"}} 1",
            server.field("mode")
        ),
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    let (code, body) =
        telemetry::http_get(server.addr("admin"), "/healthz", Duration::from_secs(5)).unwrap();
    assert_eq!((code, body.trim()), (200, "ok"));
}

#[test]
fn bad_command_lines_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_topology(dir.path(), &[("R1", "4MiB")]);
    let out = std::process::Command::new(PMEM_SERVER)
        .args(["--config"])
        .arg(&config)
        .args(["--server", "nobody", "--insecure"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no server \"nobody\""), "{stderr}");

    let out = std::process::Command::new(PMEM_SERVER)
        .args([
            "--config",
            "/nonexistent.toml",
            "--server",
            "S",
            "--insecure",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.toml"));

    let data = dir.path().join("data");
    let err = pmem_server_with(PMEM_SERVER, &config, "S", &data, &["--persistence", "dax"]);
    if let Err(stderr) = err {
        // No DAX filesystem here: forcing DAX must refuse, naming the file.
        assert!(stderr.contains("R1.pmem"), "{stderr}");
    }
}

#[test]
fn a_deleted_region_file_stops_the_server_instead_of_coming_back_empty() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = write_topology(dir.path(), &[("R1", "4MiB"), ("R2", "4MiB")]);
    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &[]).unwrap();
    Conn::connect(server.addr("nic.n0"))
        .call(Repr::atomic_write(at(1, 64), key(server.addr("nic.n0"), 1), 42).with_persist());
    server.terminate();
    std::fs::remove_file(data.join("R2.pmem")).unwrap();

    let err = pmem_server_with(PMEM_SERVER, &config, "S", &data, &[]).unwrap_err();
    assert!(err.contains("R2.pmem"), "{err}");
    assert!(err.contains("missing"), "{err}");
    assert!(err.contains("--format"), "{err}");
    assert!(!data.join("R2.pmem").exists(), "nothing was recreated");

    // The operator's way out: recreate the regions empty.
    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &["--format"]).unwrap();
    let reply = Conn::connect(server.addr("nic.n0")).call(Repr::read(
        at(1, 64),
        key(server.addr("nic.n0"), 1),
        8,
    ));
    assert_eq!(reply.data, vec![0; 8]);
}

/// A tmpfs of `size` mounted at `dir`, unmounted on drop.
struct SmallFs(std::path::PathBuf);

impl SmallFs {
    fn mount(dir: &std::path::Path, size: &str) -> SmallFs {
        std::fs::create_dir_all(dir).expect("mount point");
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("mount (root needed)");
        assert!(
            status.success(),
            "mount a {size} tmpfs at {}",
            dir.display()
        );
        SmallFs(dir.to_path_buf())
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_filesystem_too_small_for_the_regions_fails_at_start_with_the_shortfall() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("small");
    let _fs = SmallFs::mount(&data, "6m");
    let config = write_topology(dir.path(), &[("R1", "4MiB"), ("R2", "4MiB")]);
    let err = pmem_server_with(PMEM_SERVER, &config, "S", &data, &[]).unwrap_err();
    assert!(err.contains("R2.pmem"), "{err}");
    assert!(err.contains("cannot hold the region file"), "{err}");
    assert!(
        err.contains(&format!("needs {} bytes", 4096 + (4 << 20))),
        "{err}"
    );
    assert!(!err.contains("SIGBUS") && !err.contains("signal"), "{err}");
}

#[test]
fn a_damaged_exactly_once_file_stops_the_server_until_the_operator_resets_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = write_topology(dir.path(), &[("R1", "4MiB")]);
    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &[]).unwrap();
    server.terminate();
    let window = data.join("exactly-once.pmem");
    let len = std::fs::metadata(&window).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&window)
        .unwrap()
        .set_len(len / 2)
        .unwrap();

    let err = pmem_server_with(PMEM_SERVER, &config, "S", &data, &[]).unwrap_err();
    assert!(err.contains("exactly-once.pmem"), "{err}");
    assert!(err.contains("damaged"), "{err}");
    assert!(err.contains("--reset-exactly-once"), "{err}");
    assert_eq!(
        std::fs::metadata(&window).unwrap().len(),
        len / 2,
        "left alone"
    );

    let server =
        pmem_server_with(PMEM_SERVER, &config, "S", &data, &["--reset-exactly-once"]).unwrap();
    assert_eq!(std::fs::metadata(&window).unwrap().len(), len, "reset");
    server.terminate();
}

/// With `--persistence emulated`, killing the daemon is a power cut: what
/// was persisted comes back, and nothing else does.
#[test]
fn emulated_persistence_makes_kill_9_a_power_cut() {
    use proto::request::ExactlyOnce;
    let dir = tempfile::tempdir().unwrap();
    let config = write_topology(dir.path(), &[("R1", "4MiB")]);
    let data = dir.path().join("data");
    let emulated = ["--persistence", "emulated"];
    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &emulated).unwrap();
    let k = key(server.addr("nic.n0"), 0);
    let once = ExactlyOnce::on_lane(0, 1).stamped(0);
    let fetch_add = || Repr::fetch_add(at(0, 65536), k, 5).with_exactly_once(once.client, once.seq);
    let mut conn = Conn::connect(server.addr("nic.n0"));
    let persisted = pattern(4096, 1);
    let volatile = pattern(4096, 2);
    for (request, value) in [
        (Repr::write_persist(at(0, 0), k, &persisted), 0),
        (Repr::write(at(0, 8192), k, &volatile), 0),
        (fetch_add().with_persist(), 0),
        (Repr::atomic_write(at(0, 65600), k, 9), 0),
    ] {
        let reply = conn.call(request);
        assert_eq!((reply.status, reply.value), (Status::Ok, value));
    }
    server.kill9();

    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &emulated).unwrap();
    let mut conn = Conn::connect(server.addr("nic.n0"));
    let read = |conn: &mut Conn, offset: u64, len: u32| {
        let reply = conn.call(Repr::read(at(0, offset), k, len));
        assert_eq!(reply.status, Status::Ok);
        reply.data
    };
    assert_eq!(read(&mut conn, 0, 4096), persisted, "WRITE_PERSIST kept");
    assert_eq!(
        read(&mut conn, 8192, 4096),
        vec![0; 4096],
        "plain WRITE lost"
    );
    assert_eq!(
        read(&mut conn, 65600, 8),
        vec![0; 8],
        "unpersisted ATOMIC_WRITE lost"
    );
    assert_eq!(
        read(&mut conn, 65536, 8),
        5u64.to_le_bytes(),
        "persistent FETCH_ADD kept"
    );
    let retry = conn.call(fetch_add().with_persist());
    assert_eq!(
        (retry.status, retry.value),
        (Status::Ok, 0),
        "answered from the window"
    );
    assert_eq!(
        read(&mut conn, 65536, 8),
        5u64.to_le_bytes(),
        "and not applied again"
    );
}

/// `--emulated-power-cut-after N` ends the daemon (status
/// [`testkit::EMULATED_POWER_CUT_EXIT`]) when it attempts persist step
/// N + 1, before answering: every acknowledged WRITE_PERSIST is there after
/// a restart and the one the cut interrupted is not. Without `--persistence
/// emulated` the flag is refused.
#[test]
fn an_emulated_power_cut_ends_the_daemon_before_it_answers() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_topology(dir.path(), &[("R1", "4MiB")]);
    let data = dir.path().join("data");
    let refused = pmem_server_with(
        PMEM_SERVER,
        &config,
        "S",
        &data,
        &["--emulated-power-cut-after", "3"],
    )
    .expect_err("the flag needs --persistence emulated");
    assert!(
        refused.contains("needs --persistence emulated"),
        "{refused}"
    );

    let cut = [
        "--persistence",
        "emulated",
        "--emulated-power-cut-after",
        "3",
    ];
    let mut server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &cut).unwrap();
    let k = key(server.addr("nic.n0"), 0);
    let mut conn = Conn::connect(server.addr("nic.n0"));
    let block = |i: u64| pattern(4096, i as u8 + 1);
    let mut acknowledged = 0;
    let interrupted = loop {
        let tag = conn.send(&Message::Request(Repr::write_persist(
            at(0, acknowledged * 4096),
            k,
            &block(acknowledged),
        )));
        match conn.try_recv() {
            Some(reply) => {
                assert_eq!((reply.tag, reply.status), (tag, Status::Ok));
                acknowledged += 1;
            }
            None => break acknowledged,
        }
        assert!(
            acknowledged < 64,
            "no power cut after {acknowledged} WRITE_PERSISTs"
        );
    };
    let status = server
        .wait_exit(Duration::from_secs(10))
        .expect("the daemon ends at the cut");
    assert_eq!(
        status.code(),
        Some(testkit::EMULATED_POWER_CUT_EXIT),
        "{status}"
    );
    assert!(acknowledged > 0, "the cut came before the first request");

    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &cut[..2]).unwrap();
    let mut conn = Conn::connect(server.addr("nic.n0"));
    for i in 0..=interrupted {
        let reply = conn.call(Repr::read(at(0, i * 4096), k, 4096));
        assert_eq!(reply.status, Status::Ok);
        if i < interrupted {
            assert_eq!(reply.data, block(i), "acknowledged block {i} lost");
        } else {
            assert_eq!(reply.data, vec![0; 4096], "the interrupted block persisted");
        }
    }
}

/// A connection that sends nothing is closed after the HELLO timeout, and
/// one that goes quiet after a request after the idle timeout; both are
/// counted, and a connection that keeps talking stays open.
#[test]
fn silent_connections_are_closed_and_counted() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let config = write_topology(dir.path(), &[("R1", "1MiB")]);
    let flags = ["--hello-timeout-ms", "300", "--idle-timeout-ms", "600"];
    let server =
        pmem_server_with(PMEM_SERVER, &config, "S", &dir.path().join("d"), &flags).unwrap();
    let addr = server.addr("nic.n0");
    let k = key(addr, 0);
    let closed_within = |stream: &mut std::net::TcpStream, limit: Duration| {
        stream.set_read_timeout(Some(limit)).unwrap();
        let mut buf = [0u8; 64];
        matches!(stream.read(&mut buf), Ok(0))
    };
    let started = std::time::Instant::now();
    let mut silent = std::net::TcpStream::connect(addr).unwrap();
    let mut quiet = Conn::connect(addr);
    let mut talker = Conn::connect(addr);
    assert_eq!(quiet.call(Repr::read(at(0, 0), k, 8)).status, Status::Ok);
    assert_eq!(talker.call(Repr::read(at(0, 0), k, 8)).status, Status::Ok);
    assert!(
        closed_within(&mut silent, Duration::from_secs(5)),
        "the silent connection is closed"
    );
    assert!(started.elapsed() >= Duration::from_millis(250));
    // The talker speaks every 200 ms for 1.2 s: past the idle timeout.
    for _ in 0..5 {
        assert_eq!(talker.call(Repr::read(at(0, 0), k, 8)).status, Status::Ok);
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(quiet.try_recv().is_none(), "the quiet connection is closed");
    assert_eq!(talker.call(Repr::read(at(0, 0), k, 8)).status, Status::Ok);
    let metrics = telemetry::http_get(server.addr("admin"), "/metrics", Duration::from_secs(5))
        .map(|(_, body)| body)
        .unwrap();
    for line in [
        "pmem_server_connections_closed_total{reason=\"hello_timeout\"} 1",
        "pmem_server_connections_closed_total{reason=\"idle\"} 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line}\n{metrics}");
    }
}

/// A NIC on verbs that cannot start stops the server with the NIC and what
/// to do: built without the `verbs` feature, how to build it; with it, on
/// a host without an RDMA device (this one), which device is missing.
#[test]
fn a_verbs_nic_that_cannot_start_says_which_and_why() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = write_topology(dir.path(), &[("R1", "4MiB")]);
    let err =
        pmem_server_with(PMEM_SERVER, &config, "S", &data, &["--transport", "verbs"]).unwrap_err();
    assert!(err.contains("NIC n0"), "{err}");
    assert!(
        err.contains("cargo build -p pmem-server --features verbs") || err.contains("RDMA device"),
        "{err}"
    );
    let err =
        pmem_server_with(PMEM_SERVER, &config, "S", &data, &["--transport", "udp"]).unwrap_err();
    assert!(
        err.contains("unknown transport \"udp\": tcp or verbs"),
        "{err}"
    );
}

#[test]
fn a_region_lost_with_its_manifest_stops_the_server_until_the_operator_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = write_topology(
        dir.path(),
        &[("R1", "4MiB"), ("R2", "4MiB"), ("R3", "4MiB")],
    );
    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &[]).unwrap();
    let nic = server.addr("nic.n0");
    for index in 0..3 {
        Conn::connect(nic)
            .call(Repr::atomic_write(at(index, 64), key(nic, index), 42).with_persist());
    }
    server.terminate();
    std::fs::remove_file(data.join("R2.pmem")).unwrap();
    std::fs::remove_file(data.join("regions.manifest")).unwrap();

    let err = pmem_server_with(PMEM_SERVER, &config, "S", &data, &[]).unwrap_err();
    assert!(err.contains("region R2"), "{err}");
    assert!(err.contains("R2.pmem"), "{err}");
    assert!(
        !err.contains("region R1 ("),
        "only the lost region is named: {err}"
    );
    assert!(err.contains("--create-missing R2"), "{err}");
    assert!(err.contains("--format"), "{err}");
    assert!(!data.join("R2.pmem").exists(), "nothing was recreated");

    let err = pmem_server_with(
        PMEM_SERVER,
        &config,
        "S",
        &data,
        &["--create-missing", "R9"],
    )
    .unwrap_err();
    assert!(err.contains("--create-missing R9"), "{err}");
    assert!(err.contains("no region \"R9\""), "{err}");

    // Naming the lost region creates it alone; the others keep their data.
    let server = pmem_server_with(
        PMEM_SERVER,
        &config,
        "S",
        &data,
        &["--create-missing", "R2"],
    )
    .unwrap();
    let nic = server.addr("nic.n0");
    let word = |index| {
        Conn::connect(nic)
            .call(Repr::read(at(index, 64), key(nic, index), 8))
            .data
    };
    assert_eq!(word(0), 42u64.to_le_bytes());
    assert_eq!(word(1), vec![0; 8], "R2 is created empty");
    assert_eq!(word(2), 42u64.to_le_bytes());
    let (_, stderr) = server.terminate();
    assert!(stderr.contains("region R2: created empty"), "{stderr}");

    // From now on the manifest lists R2 again: no flag needed.
    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &[]).unwrap();
    server.terminate();
}

#[test]
fn a_new_data_directory_and_a_new_region_are_created_without_flags() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = write_topology(dir.path(), &[("R1", "4MiB")]);
    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &[]).unwrap();
    let (_, stderr) = server.terminate();
    assert!(stderr.contains("region R1: created empty"), "{stderr}");
    assert!(data.join("R1.pmem").exists());

    // The topology grows: the manifest does not list R2, so it is new.
    let config = write_topology(dir.path(), &[("R1", "4MiB"), ("R2", "4MiB")]);
    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &[]).unwrap();
    let (_, stderr) = server.terminate();
    assert!(stderr.contains("region R2: created empty"), "{stderr}");
    assert!(!stderr.contains("region R1: created"), "{stderr}");
}

#[test]
fn every_region_and_the_manifest_gone_from_a_used_data_directory_stops_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = write_topology(dir.path(), &[("R1", "4MiB"), ("R2", "4MiB")]);
    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &[]).unwrap();
    server.terminate();
    for file in ["R1.pmem", "R2.pmem", "regions.manifest"] {
        std::fs::remove_file(data.join(file)).unwrap();
    }
    // The exactly-once window is still there: the directory was in use.
    let err = pmem_server_with(PMEM_SERVER, &config, "S", &data, &[]).unwrap_err();
    assert!(
        err.contains("region R1") && err.contains("region R2"),
        "{err}"
    );
    assert!(err.contains("exactly-once.pmem"), "{err}");
    assert!(
        err.contains("--create-missing R1 --create-missing R2"),
        "{err}"
    );
    assert!(!data.join("R1.pmem").exists(), "nothing was recreated");
    let extra = ["--create-missing", "R1", "--create-missing", "R2"];
    let server = pmem_server_with(PMEM_SERVER, &config, "S", &data, &extra).unwrap();
    server.terminate();
}
