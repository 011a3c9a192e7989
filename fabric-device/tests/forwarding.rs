//! The fabric device between real pmem-servers and raw protocol clients.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use proto::hello::Role;
use proto::request::{Repr, Target};
use proto::{AccessKey, Message, Opcode, Status};
use testkit::{Conn, Daemon, FabricSpec, Ports, file_bytes, layout};
use topology::{Layout, PmemAddr};

/// A running test fabric: servers A and B (and whatever a test adds), one
/// fabric device F.
struct Fabric {
    dir: tempfile::TempDir,
    ports: Ports,
    config: PathBuf,
    layout: Layout,
    servers: HashMap<String, Daemon>,
    device: Daemon,
}

const DEVICE_FLAGS: &[&str] = &[
    "--request-timeout-ms",
    "2000",
    "--reconnect-min-ms",
    "20",
    "--reconnect-max-ms",
    "200",
];

fn two_servers() -> FabricSpec {
    FabricSpec::new()
        .server("A", &[("A1", "4MiB"), ("A2", "4MiB")])
        .server("B", &[("B1", "4MiB")])
        .device("F")
        .client("c1")
        .client("c2")
        .client("c3")
        .client("c4")
}

fn data_dir(dir: &Path, server: &str) -> PathBuf {
    dir.join("data").join(server)
}

fn start_server(dir: &Path, config: &Path, id: &str) -> Daemon {
    testkit::pmem_server(config, id, &data_dir(dir, id), &[])
        .unwrap_or_else(|e| panic!("pmem-server {id} did not start:\n{e}"))
}

impl Fabric {
    fn start(spec: &FabricSpec) -> Self {
        Self::start_with(spec, &[])
    }

    /// [`Fabric::start`] with `extra` device flags after [`DEVICE_FLAGS`].
    fn start_with(spec: &FabricSpec, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut ports = Ports::new();
        let config = spec.write(dir.path(), "topology.toml", &mut ports);
        let servers = spec
            .servers
            .iter()
            .map(|(id, _)| (id.clone(), start_server(dir.path(), &config, id)))
            .collect();
        let flags = [DEVICE_FLAGS, extra].concat();
        let device = testkit::fabric_device(&config, "F", &flags)
            .unwrap_or_else(|e| panic!("fabric-device did not start:\n{e}"));
        let mut fabric = Self {
            layout: layout(&config),
            dir,
            ports,
            config,
            servers,
            device,
        };
        fabric.device.wait_links_up(spec.servers.len());
        fabric.learn_keys();
        fabric
    }

    /// Learns the region keys from the device's MAP (client c1 may use
    /// every region: it has no allow-list).
    fn learn_keys(&mut self) {
        let map = self.client("c1").map();
        self.layout.learn_keys(&map);
    }

    fn device_addr(&self) -> std::net::SocketAddr {
        self.device.addr("port.p0")
    }

    fn client(&self, name: &str) -> Conn {
        let mut conn = Conn::connect(self.device_addr());
        let reply = conn.hello(name);
        assert_eq!(reply.opcode, Opcode::Hello, "{reply:?}");
        assert_eq!(reply.data, b"F");
        conn
    }

    fn metrics(&self) -> String {
        let (code, text) = telemetry::http_get(
            self.device.addr("admin"),
            "/metrics",
            Duration::from_secs(5),
        )
        .expect("scrape the device");
        assert_eq!(code, 200);
        text
    }

    fn region(&self, id: &str) -> &topology::LayoutEntry {
        self.layout.entry_by_id(&id.into()).expect("region")
    }

    fn pmem(&self, region: &str, offset: u64) -> Target {
        Target::Pmem(PmemAddr(self.region(region).start.get() + offset))
    }

    fn key(&self, region: &str) -> AccessKey {
        self.region(region).key
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13) ^ seed)
        .collect()
}

#[test]
fn writes_land_in_the_owning_servers_file_at_the_right_offset() {
    let fabric = Fabric::start(&two_servers());
    let mut conn = fabric.client("c1");
    let cases = [
        ("A1", 0u64, 64usize),
        ("A2", 1 << 20, 4096),
        ("B1", 12345, 300_000),
    ];
    for (i, &(region, offset, len)) in cases.iter().enumerate() {
        let data = pattern(len, i as u8);
        let reply = conn.call(Repr::write(
            fabric.pmem(region, offset),
            fabric.key(region),
            &data,
        ));
        assert_eq!(reply.status, Status::Ok, "{region}");
        let read = conn.call(Repr::read(
            fabric.pmem(region, offset),
            fabric.key(region),
            len as u32,
        ));
        assert_eq!(read.status, Status::Ok);
        assert!(read.data == data, "{region}: read back what was written");
        let server = &region[..1];
        assert!(
            file_bytes(&data_dir(fabric.dir.path(), server), region, offset, len) == data,
            "{region}: the bytes are in server {server}'s file at offset {offset}"
        );
    }
    // Nothing landed in the other server's file.
    assert_eq!(
        file_bytes(&data_dir(fabric.dir.path(), "B"), "B1", 0, 64),
        vec![0; 64]
    );
}

#[test]
fn a_killed_server_is_unavailable_while_the_other_serves_and_comes_back() {
    let mut fabric = Fabric::start(&two_servers());
    let mut conn = fabric.client("c1");
    let write_a = |conn: &mut Conn, fabric: &Fabric, v: u64| {
        conn.call(Repr::atomic_write(
            fabric.pmem("A1", 0),
            fabric.key("A1"),
            v,
        ))
    };
    assert_eq!(write_a(&mut conn, &fabric, 1).status, Status::Ok);

    fabric.servers.remove("A").expect("server A").kill9();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let status = write_a(&mut conn, &fabric, 2).status;
        if status != Status::Ok {
            break status;
        }
        assert!(Instant::now() < deadline, "server A's death never showed");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status, Status::ServerUnavailable);
    let b = conn.call(Repr::fetch_add(fabric.pmem("B1", 8), fabric.key("B1"), 1));
    assert_eq!(b.status, Status::Ok, "server B keeps serving");

    let restarted = start_server(fabric.dir.path(), &fabric.config, "A");
    fabric.servers.insert("A".into(), restarted);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply = conn.call(Repr::fetch_add(fabric.pmem("A1", 0), fabric.key("A1"), 0));
        if reply.status == Status::Ok {
            assert_eq!(reply.value, 1, "the data survived the restart");
            break;
        }
        assert!(Instant::now() < deadline, "the link never came back");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn unknown_clients_unmapped_addresses_and_malformed_frames() {
    let fabric = Fabric::start(&two_servers());
    let mut stranger = Conn::connect(fabric.device_addr());
    let reply = stranger.hello("mallory");
    assert_eq!(reply.status, Status::UnknownClient);
    assert_eq!(
        stranger.try_recv(),
        None,
        "the device closes the connection"
    );

    let mut conn = fabric.client("c1");
    let end = fabric
        .layout
        .entries_by_address()
        .last()
        .expect("a region")
        .end();
    for target in [
        Target::Pmem(PmemAddr(0)),
        Target::Pmem(PmemAddr(end + 4096)),
    ] {
        assert_eq!(
            conn.call(Repr::read(target, AccessKey::NONE, 8)).status,
            Status::Unmapped
        );
    }

    // One client sends garbage; only its connection closes.
    let mut vandal = fabric.client("c2");
    vandal.send_raw(b"GET / HTTP/1.1\r\n\r\n");
    assert_eq!(vandal.try_recv(), None);
    let mut unknown_op = Message::Ping(1).encode_to_vec(77).expect("encode");
    unknown_op[3] = 0x7e;
    conn.send_raw(&unknown_op);
    let reply = conn.recv();
    assert_eq!((reply.tag, reply.status), (77, Status::Unsupported));
    let ok = conn.call(Repr::read(fabric.pmem("A1", 0), fabric.key("A1"), 8));
    assert_eq!(
        ok.status,
        Status::Ok,
        "the well-behaved client is unaffected"
    );
    // A wrong key is relayed from the server as ACCESS_DENIED.
    let denied = conn.call(Repr::read(
        fabric.pmem("A1", 0),
        AccessKey(fabric.key("A1").get() ^ 1),
        8,
    ));
    assert_eq!(denied.status, Status::AccessDenied);
}

#[test]
fn sighup_reload_adds_a_server_without_dropping_clients() {
    let spec = two_servers();
    let mut fabric = Fabric::start(&spec);
    let mut conn = fabric.client("c1");

    let bigger = spec.clone().server("C", &[("C1", "4MiB")]);
    let config = bigger.write(fabric.dir.path(), "topology.toml", &mut fabric.ports);
    let new_layout = layout(&config);
    let c1 = new_layout.entry_by_id(&"C1".into()).expect("C1").clone();
    let c = start_server(fabric.dir.path(), &config, "C");
    fabric.servers.insert("C".into(), c);
    fabric.device.signal(libc::SIGHUP);

    let deadline = Instant::now() + Duration::from_secs(10);
    let target = Target::Pmem(c1.start.checked_add(64).expect("address"));
    // C1's key, from C itself (an unauthenticated server gives it to anyone).
    let c1_key = testkit::key(fabric.servers["C"].addr("nic.n0"), c1.region.0);
    loop {
        let reply = conn.call(Repr::write(target, c1_key, b"new region"));
        if reply.status == Status::Ok {
            break;
        }
        assert!(
            matches!(reply.status, Status::Unmapped | Status::ServerUnavailable),
            "{reply:?}"
        );
        assert!(
            Instant::now() < deadline,
            "the new region never became usable"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let read = conn.call(Repr::read(target, c1_key, 10));
    assert_eq!(read.data, b"new region", "same connection, new region");
    assert_eq!(
        file_bytes(&data_dir(fabric.dir.path(), "C"), "C1", 64, 10),
        b"new region"
    );

    // An invalid topology is refused and the old map keeps serving.
    std::fs::write(&config, "[pool\nthis is not toml").expect("write");
    fabric.device.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !fabric.device.stderr_so_far().contains("reload refused") {
        assert!(
            Instant::now() < deadline,
            "{}",
            fabric.device.stderr_so_far()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(conn.call(Repr::read(target, c1_key, 10)).status, Status::Ok);
    assert!(
        fabric
            .metrics()
            .contains("fabric_device_reloads_total{result=\"refused\"} 1")
    );
}

/// What a client expects back for a request it sent.
#[derive(Debug)]
enum Expect {
    Ack,
    Data(Vec<u8>),
    Atomic,
}

#[test]
fn many_clients_pipelining_mixed_operations_get_their_own_answers() {
    let fabric = Fabric::start(&two_servers());
    const OPS: usize = 1500;
    const WINDOW: usize = 32;
    std::thread::scope(|s| {
        for (n, name) in ["c1", "c2", "c3", "c4"].into_iter().enumerate() {
            let fabric = &fabric;
            s.spawn(move || {
                let mut conn = fabric.client(name);
                let region = ["A1", "A2", "B1"][n % 3];
                // Each client owns a 64 KiB slice; slot i holds 16 bytes.
                let base = n as u64 * 65536;
                let mut expected: HashMap<u64, Expect> = HashMap::new();
                let mut written: HashMap<u64, Vec<u8>> = HashMap::new();
                let mut sent = 0;
                while sent < OPS || !expected.is_empty() {
                    while sent < OPS && expected.len() < WINDOW {
                        let slot = (sent % 256) as u64;
                        let at = fabric.pmem(region, base + 4096 + slot * 16);
                        let k = fabric.key(region);
                        let data = pattern(16, sent as u8);
                        let (req, expect) = match sent % 4 {
                            0 => {
                                written.insert(slot, data.clone());
                                (Repr::write(at, k, &data), Expect::Ack)
                            }
                            1 if written.contains_key(&slot) => {
                                (Repr::read(at, k, 16), Expect::Data(written[&slot].clone()))
                            }
                            2 => (
                                Repr::fetch_add(fabric.pmem(region, base), k, 1),
                                Expect::Atomic,
                            ),
                            _ => (
                                Repr::compare_swap(fabric.pmem(region, base + 8), k, 0, 0),
                                Expect::Atomic,
                            ),
                        };
                        let tag = conn.send(&Message::Request(req));
                        expected.insert(tag, expect);
                        sent += 1;
                    }
                    let reply = conn.recv();
                    let expect = expected
                        .remove(&reply.tag)
                        .unwrap_or_else(|| panic!("{name}: reply to a tag never sent: {reply:?}"));
                    assert_eq!(reply.status, Status::Ok, "{name}: {reply:?}");
                    match expect {
                        Expect::Ack => assert_eq!(reply.opcode, Opcode::Acknowledge),
                        Expect::Atomic => assert_eq!(reply.opcode, Opcode::AtomicAcknowledge),
                        Expect::Data(data) => {
                            assert_eq!(reply.opcode, Opcode::ReadResponse);
                            assert_eq!(reply.data, data, "{name}: read its own write");
                        }
                    }
                }
                let count = conn.call(Repr::fetch_add(
                    fabric.pmem(region, base),
                    fabric.key(region),
                    0,
                ));
                assert_eq!(
                    count.value,
                    (OPS / 4) as u64,
                    "{name}: every increment applied once"
                );
            });
        }
    });
}

#[test]
fn metrics_pass_promtool_and_sigterm_exits_cleanly() {
    let fabric = Fabric::start(&two_servers());
    let mut conn = fabric.client("c1");
    conn.call(Repr::write_persist(
        fabric.pmem("A1", 0),
        fabric.key("A1"),
        &[7; 64],
    ));
    conn.call(Repr::read(fabric.pmem("B1", 0), fabric.key("B1"), 64));
    let text = fabric.metrics();
    telemetry::promtool_check(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    for line in [
        "fabric_device_requests_total{op=\"WRITE_PERSIST\",status=\"OK\"} 1",
        "fabric_device_requests_total{op=\"READ\",status=\"OK\"} 1",
        "fabric_device_link_up{server=\"A\",nic=\"n0\"} 1",
        "fabric_device_link_up{server=\"B\",nic=\"n0\"} 1",
        "fabric_device_connected_clients 1",
        "fabric_device_in_flight_requests 0",
        "fabric_device_map_regions 3",
    ] {
        assert!(text.contains(line), "missing {line:?}:\n{text}");
    }
    let Fabric { device, .. } = fabric;
    let (status, stderr) = device.terminate();
    assert!(status.success(), "{status:?}\n{stderr}");
    assert!(stderr.contains("stopped cleanly"), "{stderr}");
}

/// Both I/O back ends forward small and large frames intact, and the device
/// says which one runs, in its log at start and in
/// `fabric_device_io_backend`. io_uring gives way to epoll only with a
/// reason (on a kernel that refuses it), and the metric names it.
#[test]
fn each_io_backend_forwards_and_says_which_it_runs() {
    for (flag, wanted) in [("epoll", "epoll"), ("uring", "io_uring")] {
        let fabric = Fabric::start_with(&two_servers(), &["--io", flag]);
        let mut conn = fabric.client("c1");
        for (i, len) in [64, 200_000].into_iter().enumerate() {
            let data = pattern(len, i as u8);
            let target = fabric.pmem("A1", 4096);
            let reply = conn.call(Repr::write(target, fabric.key("A1"), &data));
            assert_eq!(reply.status, Status::Ok, "{flag}: write of {len} B");
            let read = conn.call(Repr::read(target, fabric.key("A1"), len as u32));
            assert_eq!(read.status, Status::Ok, "{flag}: read of {len} B");
            assert!(read.data == data, "{flag}: read back what was written");
        }
        let text = fabric.metrics();
        let exact = format!("fabric_device_io_backend{{backend=\"{wanted}\",fallback=\"none\"}} 1");
        let fell_back = wanted == "io_uring"
            && text.contains("fabric_device_io_backend{backend=\"epoll\",fallback=\"")
            && !text.contains("fallback=\"none\"");
        assert!(
            text.contains(&exact) || fell_back,
            "{flag}: missing {exact:?}:\n{text}"
        );
        let Fabric { device, .. } = fabric;
        let (status, stderr) = device.terminate();
        assert!(status.success(), "{status:?}\n{stderr}");
        let said = match fell_back {
            false => format!("I/O back end: {wanted}"),
            true => "I/O back end: epoll (io_uring was asked for and cannot run: ".to_owned(),
        };
        assert!(stderr.contains(&said), "{flag}: no {said:?} in\n{stderr}");
    }
}

/// A device spinning on io_uring finishes the kernel's work behind its
/// completions itself (with deferred task work, when the kernel flags
/// some waiting, else as the kernel posts them): a burst of pipelined
/// reads from two servers is answered in full, each with its own data.
#[test]
fn a_spinning_device_on_io_uring_answers_every_pipelined_read() {
    let fabric = Fabric::start_with(
        &two_servers(),
        &["--io", "uring", "--busy-poll-us", "400000"],
    );
    let mut conn = fabric.client("c1");
    let (a, b) = (pattern(64 * 48, 5), pattern(64 * 48, 9));
    for (region, data) in [("A1", &a), ("B1", &b)] {
        let target = fabric.pmem(region, 0);
        let reply = conn.call(Repr::write(target, fabric.key(region), data));
        assert_eq!(reply.status, Status::Ok, "write to {region}");
    }
    let mut wanted = HashMap::new();
    for i in 0..48usize {
        for (region, data) in [("A1", &a), ("B1", &b)] {
            let read = Repr::read(fabric.pmem(region, 64 * i as u64), fabric.key(region), 64);
            let tag = conn.send(&Message::Request(read));
            wanted.insert(tag, data[64 * i..64 * (i + 1)].to_vec());
        }
    }
    for _ in 0..wanted.len() {
        let reply = conn.recv();
        assert_eq!(reply.status, Status::Ok, "{reply:?}");
        let data = wanted
            .remove(&reply.tag)
            .expect("an answer to a request sent");
        assert!(reply.data == data, "tag {}: another read's data", reply.tag);
    }
    assert!(wanted.is_empty());
}

/// A device that busy polls after each event counts the turns that found
/// nothing as idle polling, so an operator sees how much of its spinning
/// CPU forwarded; a device that sleeps between events counts none. How much
/// CPU the spinning gets depends on what else runs on the machine, so the
/// test checks that some was counted, never more than the wall time it
/// spun in (one thread's CPU time cannot exceed it); how much is a figure
/// for `testbed bench` (`device_busy_cpu_us_per_op`).
#[test]
fn a_busy_polling_device_says_how_much_of_its_spinning_found_nothing() {
    let idle_seconds = |fabric: &Fabric| {
        let text = fabric.metrics();
        telemetry::metric_sum(&text, "fabric_device_idle_poll_seconds_total", "")
            .unwrap_or_else(|| panic!("no idle polling counter:\n{text}"))
    };
    let started = Instant::now();
    let spinning = Fabric::start_with(&two_servers(), &["--busy-poll-us", "400000"]);
    let sleeping = Fabric::start(&two_servers());
    for fabric in [&spinning, &sleeping] {
        let mut conn = fabric.client("c1");
        let read = Repr::read(fabric.pmem("A1", 0), fabric.key("A1"), 64);
        assert_eq!(conn.call(read).status, Status::Ok);
    }
    // The spinning device counts a run of empty turns when it ends, 400 ms
    // of wall time after the last event.
    let deadline = Instant::now() + Duration::from_secs(60);
    let idle = loop {
        let idle = idle_seconds(&spinning);
        if idle > 0.0 {
            break idle;
        }
        assert!(
            Instant::now() < deadline,
            "the spinning device never counted idle polling"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let wall = started.elapsed().as_secs_f64();
    assert!(
        idle <= wall,
        "idle polling {idle} s in {wall} s of wall time"
    );
    assert_eq!(idle_seconds(&sleeping), 0.0);
}

#[test]
fn large_reads_from_two_servers_interleave_intact_with_small_replies() {
    // Large bodies arrive over many reads while the other link's small
    // replies for the same client keep coming: each reply must go out
    // whole, never inside another one.
    let fabric = Fabric::start(&two_servers());
    let mut conn = fabric.client("c1");
    let big = 1 << 20;
    let a = pattern(big, 11);
    let b = pattern(big, 29);
    for (region, data) in [("A1", &a), ("B1", &b)] {
        let reply = conn.call(Repr::write(
            fabric.pmem(region, 0),
            fabric.key(region),
            data,
        ));
        assert_eq!(reply.status, Status::Ok, "{region}");
    }
    let mut expected: HashMap<u64, Vec<u8>> = HashMap::new();
    for _ in 0..6 {
        for (region, data, offset, len) in [
            ("A1", &a, 0usize, big),
            ("B1", &b, 5, 16),
            ("B1", &b, 100, 700_000),
            ("A1", &a, 7, 16),
        ] {
            let req = Repr::read(
                fabric.pmem(region, offset as u64),
                fabric.key(region),
                len as u32,
            );
            let tag = conn.send(&Message::Request(req));
            expected.insert(tag, data[offset..offset + len].to_vec());
        }
    }
    while !expected.is_empty() {
        let reply = conn.recv();
        assert_eq!(reply.status, Status::Ok, "{reply:?}");
        let want = expected
            .remove(&reply.tag)
            .unwrap_or_else(|| panic!("reply to a tag never sent: {}", reply.tag));
        assert!(reply.data == want, "tag {}: the bytes read back", reply.tag);
    }
}

#[test]
fn a_request_right_after_start_waits_for_the_links_instead_of_failing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = two_servers();
    let config = spec.write(dir.path(), "topology.toml", &mut Ports::new());
    let servers: Vec<Daemon> = ["A", "B"]
        .iter()
        .map(|id| start_server(dir.path(), &config, id))
        .collect();
    // Server B is stopped: its kernel accepts the device's connection, but
    // nobody answers the handshake until it continues.
    servers[1].signal(libc::SIGSTOP);
    let device = testkit::fabric_device(&config, "F", DEVICE_FLAGS)
        .unwrap_or_else(|e| panic!("fabric-device did not start:\n{e}"));
    let layout = layout(&config);
    let entry = layout.entry_by_id(&"B1".into()).expect("region B1");
    let mut conn = Conn::connect(device.addr("port.p0"));
    conn.hello("c1");
    let resumed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let resume = std::thread::spawn({
        let pid = servers[1].pid();
        let resumed = std::sync::Arc::clone(&resumed);
        move || {
            std::thread::sleep(Duration::from_millis(300));
            resumed.store(true, std::sync::atomic::Ordering::SeqCst);
            // SAFETY: kill has no memory preconditions; pid is our child.
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        }
    });
    // B1's key comes from B: the MAP waits for B's handshake too, so it is
    // answered only after B continued.
    let key = conn.region_key(entry.region.0);
    assert!(
        resumed.load(std::sync::atomic::Ordering::SeqCst),
        "the MAP was answered before server B continued"
    );
    let reply = conn.call(Repr::read(Target::Pmem(entry.start), key, 8));
    resume.join().expect("resume thread");
    assert_eq!(reply.status, Status::Ok, "{reply:?}");
}

/// A memory figure of `/proc/<pid>/status` (`VmRSS`, `VmHWM`), in bytes.
fn status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The most memory a process has had resident.
fn peak_resident_bytes(pid: u32) -> u64 {
    status_bytes(pid, "VmHWM")
}

/// The memory a process has resident now.
fn resident_bytes(pid: u32) -> u64 {
    status_bytes(pid, "VmRSS")
}

#[test]
fn a_client_that_never_reads_its_answers_cannot_grow_the_device() {
    let fabric = Fabric::start(&two_servers());
    let a1 = fabric.region("A1").clone();
    let full = Repr::read(Target::Pmem(a1.start), a1.key, 4 << 20);
    // 200 reads of 4 MiB (800 MiB of answers) sent in one go, never read.
    let mut hog = Conn::connect(fabric.device.addr("port.p0"));
    hog.hello("c1");
    let frame = Message::Request(full).encode_to_vec(1).expect("encode");
    let burst: Vec<u8> = (0..200).flat_map(|_| frame.iter().copied()).collect();
    hog.send_raw(&burst);
    std::thread::sleep(Duration::from_secs(2));
    let rss = resident_bytes(fabric.device.pid());
    eprintln!("device resident: {} MiB", rss >> 20);
    assert!(
        rss < 256 << 20,
        "device holds {} MiB for a client that reads nothing",
        rss >> 20
    );
    // A well-behaved client is still served meanwhile.
    let mut good = Conn::connect(fabric.device.addr("port.p0"));
    good.hello("c2");
    let reply = good.call(Repr::read(Target::Pmem(a1.start), a1.key, 64));
    assert_eq!(reply.status, Status::Ok);
}

#[test]
fn connections_that_never_say_hello_are_closed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = two_servers().write(dir.path(), "topology.toml", &mut Ports::new());
    let _servers: Vec<Daemon> = ["A", "B"]
        .iter()
        .map(|id| start_server(dir.path(), &config, id))
        .collect();
    let mut flags = DEVICE_FLAGS.to_vec();
    flags.extend_from_slice(&["--hello-timeout-ms", "300"]);
    let device = testkit::fabric_device(&config, "F", &flags)
        .unwrap_or_else(|e| panic!("fabric-device did not start:\n{e}"));
    let port = device.addr("port.p0");
    let mut silent = std::net::TcpStream::connect(port).expect("connect");
    // Only a bound on a hang: the metric below says why it was closed.
    silent
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let mut greeted = Conn::connect(port);
    greeted.hello("c1");
    let mut buf = [0u8; 16];
    match std::io::Read::read(&mut silent, &mut buf) {
        Ok(0) => {}
        Ok(n) => panic!("the silent connection was answered {n} bytes"),
        Err(e) => panic!("the silent connection was never closed: {e}"),
    }
    // The connection that said HELLO is still served.
    let a1 = layout(&config)
        .entry_by_id(&"A1".into())
        .expect("A1")
        .clone();
    let key = greeted.region_key(a1.region.0);
    let reply = greeted.call(Repr::read(Target::Pmem(a1.start), key, 8));
    assert_eq!(reply.status, Status::Ok);
    let metrics = telemetry::http_get(device.addr("admin"), "/metrics", Duration::from_secs(5))
        .map(|(_, body)| body)
        .expect("metrics");
    assert!(
        metrics
            .lines()
            .any(|l| l == "fabric_device_connections_closed_total{reason=\"hello_timeout\"} 1"),
        "{metrics}"
    );
}

/// A client connection that stays quiet for the idle timeout is closed; one
/// that keeps talking is not. A client at its connection cap is refused
/// BUSY, and a second HELLO naming another client closes the connection;
/// both are counted.
#[test]
fn idle_connections_close_and_no_client_takes_more_than_its_share() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = two_servers().write(dir.path(), "topology.toml", &mut Ports::new());
    let _servers: Vec<Daemon> = ["A", "B"]
        .iter()
        .map(|id| start_server(dir.path(), &config, id))
        .collect();
    let mut flags = DEVICE_FLAGS.to_vec();
    flags.extend_from_slice(&[
        "--idle-timeout-ms",
        "1500",
        "--max-connections-per-client",
        "2",
    ]);
    let device = testkit::fabric_device(&config, "F", &flags)
        .unwrap_or_else(|e| panic!("fabric-device did not start:\n{e}"));
    device.wait_links_up(2);
    let port = device.addr("port.p0");
    let a1 = layout(&config)
        .entry_by_id(&"A1".into())
        .expect("A1")
        .clone();
    let key = {
        let mut other = Conn::connect(port);
        other.hello("c2");
        other.region_key(a1.region.0)
    };
    let read = Repr::read(Target::Pmem(a1.start), key, 8);

    let mut quiet = Conn::connect(port);
    quiet.hello("c1");
    let mut busy = Conn::connect(port);
    busy.hello("c1");
    // A third connection of c1 is one too many.
    let mut third = Conn::connect(port);
    assert_eq!(third.hello("c1").status, Status::Busy);

    // `busy` talks every 300 ms for 3 s; `quiet` says nothing.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        assert_eq!(busy.call(read).status, Status::Ok);
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(
        quiet.try_recv().is_none(),
        "the quiet connection was closed"
    );
    assert_eq!(
        busy.call(read).status,
        Status::Ok,
        "the busy one is still served"
    );

    // The closed connection freed a place for c1; a second HELLO as
    // another client on it closes it.
    let mut switch = Conn::connect(port);
    switch.hello("c1");
    assert_eq!(switch.hello("c2").status, Status::UnknownClient);
    assert!(switch.try_recv().is_none(), "and closes the connection");

    let metrics = telemetry::http_get(device.addr("admin"), "/metrics", Duration::from_secs(5))
        .map(|(_, body)| body)
        .expect("metrics");
    for line in [
        "fabric_device_connections_closed_total{reason=\"idle\"} 1",
        "fabric_device_hello_refused_total{reason=\"connections_per_client\"} 1",
        "fabric_device_hello_refused_total{reason=\"identity_switch\"} 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line}\n{metrics}");
    }
}

/// Servers started with `--secrets` let the device's links in only when the
/// device proves its key; the device in turn serves only clients that prove
/// theirs. A device with another key never gets a link up, and the servers
/// count it.
#[test]
fn links_to_servers_that_ask_for_proof_open_only_with_the_devices_key() {
    use topology::secrets::{Principal, write_key};
    let dir = tempfile::tempdir().expect("temp dir");
    let config = two_servers().write(dir.path(), "topology.toml", &mut Ports::new());
    let secrets = dir.path().join("secrets");
    write_key(&secrets, Principal::Device("F"), &[0x11; 32]).expect("key");
    write_key(&secrets, Principal::Client("c1"), &[0xC1; 32]).expect("key");
    write_key(&secrets, Principal::Client("c2"), &[0xC2; 32]).expect("key");
    let secrets_arg = secrets.to_str().expect("path").to_owned();
    let servers: Vec<Daemon> = ["A", "B"]
        .iter()
        .map(|id| {
            testkit::pmem_server(
                &config,
                id,
                &data_dir(dir.path(), id),
                &["--secrets", &secrets_arg],
            )
            .unwrap_or_else(|e| panic!("pmem-server {id} did not start:\n{e}"))
        })
        .collect();
    let mut flags = DEVICE_FLAGS.to_vec();
    flags.extend_from_slice(&["--secrets", &secrets_arg]);
    let device = testkit::fabric_device(&config, "F", &flags)
        .unwrap_or_else(|e| panic!("fabric-device did not start:\n{e}"));
    device.wait_links_up(2);
    let a1 = layout(&config)
        .entry_by_id(&"A1".into())
        .expect("A1")
        .clone();
    let port = device.addr("port.p0");
    let mut client = Conn::connect(port);
    client
        .authenticate(Role::Client, "c1", [0xC1; 32])
        .expect("c1 proves its key");
    // The region key came from A (which gives it to the device it trusts)
    // and on to c1, whose grants reach A1.
    let key = client.region_key(a1.region.0);
    let write = Repr::write(Target::Pmem(a1.start), key, b"through");
    assert_eq!(client.call(write).status, Status::Ok);

    // What an attacker on the client port gets: nothing.
    let mut bare = Conn::connect(port);
    assert_eq!(bare.hello("c1").opcode, Opcode::Hello);
    assert_eq!(bare.recv().opcode, Opcode::AuthChallenge);
    assert_eq!(
        bare.call(write).status,
        Status::UnknownClient,
        "no proof, no request"
    );
    assert!(bare.try_recv().is_none(), "and the connection is closed");
    let refused = Conn::connect(port).authenticate(Role::Client, "c1", [0xC2; 32]);
    assert_eq!(
        refused,
        Err(proto::opening::OpeningError::Refused(Status::AccessDenied)),
        "c2's key does not open c1"
    );
    let refused = Conn::connect(port).authenticate(Role::Client, "c3", [0xC1; 32]);
    assert_eq!(
        refused,
        Err(proto::opening::OpeningError::Refused(Status::UnknownClient)),
        "a client without a key file cannot get in"
    );
    let metrics = telemetry::http_get(device.addr("admin"), "/metrics", Duration::from_secs(5))
        .expect("metrics")
        .1;
    for line in [
        "fabric_device_hello_refused_total{reason=\"unauthenticated\"} 1",
        "fabric_device_hello_refused_total{reason=\"bad_proof\"} 1",
        "fabric_device_hello_refused_total{reason=\"unknown_client\"} 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line}\n{metrics}");
    }
    drop(device);

    // The same device with another key.
    let impostor = dir.path().join("impostor");
    write_key(&impostor, Principal::Device("F"), &[0x22; 32]).expect("key");
    let mut flags = DEVICE_FLAGS.to_vec();
    flags.extend_from_slice(&["--secrets", impostor.to_str().expect("path")]);
    let device = testkit::fabric_device(&config, "F", &flags)
        .unwrap_or_else(|e| panic!("fabric-device did not start:\n{e}"));
    // Both servers refuse its proof (each counts it), and no link comes up.
    let refused = || -> u64 {
        servers
            .iter()
            .map(|s| {
                s.metric("pmem_server_auth_failures_total", "reason=\"bad_proof\"")
                    .map_or(0, |n| n as u64)
            })
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while refused() < 2 {
        assert!(Instant::now() < deadline, "both servers refused the proof");
        std::thread::sleep(Duration::from_millis(50));
    }
    let metrics = device.metrics();
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("fabric_device_link_up{") && l.ends_with(" 1")),
        "no link up: {metrics}"
    );
}

/// A client streaming 16 MiB WRITE_PERSISTs to server A (64 in flight,
/// reading its answers) next to a client making small requests to the same
/// server: the small client sees no errors (its requests go on the NIC's
/// main lane, the bulk ones on the bulk lane, which is up; the forwarding
/// core's unit test checks the choice of lane), and the device queues at
/// most a few frames for the link instead of taking in everything the bulk
/// client sends (before lanes and the link's high water: 308 MiB resident,
/// small requests held up to 244 ms). How long the small requests waited
/// depends on the machine: the test prints it, it does not judge it.
#[test]
fn a_bulk_client_does_not_starve_a_small_one_on_a_shared_link() {
    const BULK: usize = 16 << 20;
    let spec = FabricSpec::new()
        .server("A", &[("A1", "256MiB")])
        .device("F")
        .client("c1")
        .client("c2");
    let fabric = Fabric::start(&spec);
    let a1 = fabric.region("A1").clone();
    let run_for = Duration::from_secs(3);
    let small = |conn: &mut Conn, until: Instant| {
        let mut latencies = Vec::new();
        let mut n = 0u64;
        while Instant::now() < until {
            let started = Instant::now();
            let reply = if n.is_multiple_of(2) {
                conn.call(Repr::read(Target::Pmem(a1.start), a1.key, 8))
            } else {
                conn.call(Repr::fetch_add(Target::Pmem(a1.start), a1.key, 1))
            };
            assert_eq!(reply.status, Status::Ok, "small request {n}: {reply:?}");
            latencies.push(started.elapsed());
            n += 1;
        }
        latencies.sort();
        latencies
    };
    let mut good = fabric.client("c2");
    let alone = small(&mut good, Instant::now() + Duration::from_millis(500));

    let stop = Instant::now() + run_for;
    let bulk = std::thread::spawn({
        let mut hog = fabric.client("c1");
        let start = a1.start;
        let key = a1.key;
        move || {
            let block = pattern(BULK, 7);
            let depth = 64u64;
            let (mut sent, mut answered) = (0u64, 0u64);
            while Instant::now() < stop || answered < sent {
                while sent - answered < depth && Instant::now() < stop {
                    let at = PmemAddr(start.get() + (sent % 15) * BULK as u64);
                    hog.send(&Message::Request(Repr::write_persist(
                        Target::Pmem(at),
                        key,
                        &block,
                    )));
                    sent += 1;
                }
                let reply = hog.recv();
                assert_eq!(reply.status, Status::Ok, "bulk write: {reply:?}");
                answered += 1;
            }
            answered
        }
    });
    std::thread::sleep(Duration::from_millis(200));
    let beside = small(&mut good, stop);
    let bulk_writes = bulk.join().expect("the bulk client");
    let rss = peak_resident_bytes(fabric.device.pid());
    let pct = |l: &[Duration], p: usize| l[(l.len() * p / 100).min(l.len() - 1)];
    eprintln!(
        "alone: {} requests, p50 {:?} p99 {:?}; beside {bulk_writes} bulk 16 MiB writes: {} requests, p50 {:?} p99 {:?} max {:?}; device peak resident {} MiB",
        alone.len(),
        pct(&alone, 50),
        pct(&alone, 99),
        beside.len(),
        pct(&beside, 50),
        pct(&beside, 99),
        beside.last().copied().unwrap_or_default(),
        rss >> 20
    );
    assert!(bulk_writes > 0, "the bulk client got answers");
    assert!(
        rss < 128 << 20,
        "device peak resident {} MiB next to one bulk client",
        rss >> 20
    );
    let metrics = fabric.metrics();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("fabric_device_bulk_link_up{") && l.ends_with(" 1")),
        "{metrics}"
    );
}

/// Gauge or counter `series` (name and labels) in a Prometheus text.
fn sample(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}

/// Before HELLO a connection may send small frames only; after it, a
/// client's large requests are read only as far as its request budget (and
/// the device's) allows. A client that starts many 16 MiB WRITEs and never
/// finishes them holds its own budget, not the device's memory, and
/// another client's requests, large ones included, still go through.
#[test]
fn large_requests_are_read_only_within_the_request_budgets() {
    use std::io::Write;
    let budgets = [
        "--max-request-mib-per-client",
        "20",
        "--max-request-mib-total",
        "40",
    ];
    let fabric = Fabric::start_with(&two_servers(), &budgets);
    let device = &fabric.device;
    let port = fabric.device_addr();
    let a1 = fabric.region("A1").clone();
    let metrics = || fabric.metrics();

    // A stranger's large frame closes its connection before its body is read.
    let mut stranger = Conn::connect(port);
    let big = Message::Request(Repr::write(
        Target::Pmem(a1.start),
        AccessKey::NONE,
        &[0; 1 << 20],
    ))
    .encode_to_vec(1)
    .expect("encode");
    stranger.send_raw(&big[..4096]);
    assert!(stranger.try_recv().is_none(), "closed");

    // Eight connections of c1 each start a 16 MiB WRITE and send what the
    // device takes of its first 12 MiB within a second.
    let huge = Message::Request(Repr::write(
        Target::Pmem(a1.start),
        AccessKey::NONE,
        &vec![7u8; 16 << 20],
    ))
    .encode_to_vec(2)
    .expect("encode");
    let hogs: Vec<Conn> = (0..8)
        .map(|_| {
            let mut hog = Conn::connect(port);
            hog.hello("c1");
            hog.stream
                .set_write_timeout(Some(Duration::from_millis(300)))
                .expect("timeout");
            let _ = hog.stream.write_all(&huge[..12 << 20]);
            hog
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let text = metrics();
    let held = sample(&text, "fabric_device_request_bytes_held");
    eprintln!("device holds {} KiB of requests", held >> 10);
    assert!(held <= 20 << 20, "{held} bytes held past c1's budget");
    assert!(sample(&text, "fabric_device_request_budget_waits_total") >= 1);
    assert_eq!(
        sample(
            &text,
            "fabric_device_connections_closed_total{reason=\"unframeable\"}"
        ),
        1
    );
    let rss = peak_resident_bytes(device.pid());
    eprintln!("device peak resident: {} MiB", rss >> 20);

    // c2 is served meanwhile, a 1 MiB WRITE included.
    let mut good = Conn::connect(port);
    good.hello("c2");
    let key = good.region_key(a1.region.0);
    let target = Target::Pmem(a1.start.checked_add(1 << 20).expect("address"));
    let reply = good.call(Repr::write(target, key, &vec![9u8; 1 << 20]));
    assert_eq!(reply.status, Status::Ok);
    assert_eq!(good.call(Repr::read(target, key, 8)).data, vec![9u8; 8]);

    // Gone clients hold nothing.
    drop(hogs);
    let deadline = Instant::now() + Duration::from_secs(5);
    while sample(&metrics(), "fabric_device_request_bytes_held") != 0 {
        assert!(Instant::now() < deadline, "{}", metrics());
        std::thread::sleep(Duration::from_millis(20));
    }
}
