//! The fabric device's RoCEv2 port with real kernel packets: a client in a
//! network namespace, behind a veth pair, sets up a queue pair over its
//! control connection and runs RDMA READ, WRITE, atomics and FLUSH through
//! the device to real pmem-servers, on each of the port's frame paths
//! (an AF_XDP socket, rings shared with the kernel, socket calls); malformed frames put
//! on the wire first are counted and dropped. Needs root (network
//! namespaces, raw sockets), as CI has.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use proto::request::{Repr, Target};
use proto::roce::rc::{CompletionKind, WcStatus, WorkOp, WorkRequest};
use testkit::netns::VethNamespace;
use testkit::roce::RawRoceClient;
use testkit::{Conn, FabricSpec, Ports, RoceSpec, layout};
use topology::PmemAddr;

const CHILD_ENV: &str = "PF_ROCE_CHILD";

/// The byte pattern the client writes at `offset` of region `region`.
fn pattern(region: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32 * 7 + region * 31) as u8)
        .collect()
}

const WRITE_LEN: usize = 3000;
const COUNTER_AT: u64 = 0x10_000;

#[test]
fn a_raw_rc_client_reaches_the_pool_through_the_roce_port_on_af_xdp() {
    round_trips_through_the_roce_port("xdp", "pfxdpe", "10.238.2");
}

#[test]
fn a_raw_rc_client_reaches_the_pool_through_the_roce_port_on_the_packet_ring() {
    round_trips_through_the_roce_port("packet-ring", "pfroce", "10.251.0");
}

#[test]
fn a_raw_rc_client_reaches_the_pool_through_the_roce_port_on_the_socket_path() {
    round_trips_through_the_roce_port("socket", "pfsock", "10.254.0");
}

/// Malformed frames put on the wire before the client's traffic, that
/// pass the port's kernel filter (IPv4 to the port's address, UDP to 4791,
/// not a fragment): this many have IPv4 or UDP headers that do not hold
/// together, and this many are refused by the RoCEv2 datagram checks.
const BAD_HEADERS: usize = 3;
const MALFORMED_DATAGRAMS: usize = 3;

/// An Ethernet + IPv4 + UDP frame to `dst` port 4791 from `src`, with
/// `payload`; `edit` changes the bytes after the checksums are written.
fn udp_frame(
    macs: ([u8; 6], [u8; 6]),
    src: Ipv4Addr,
    dst: Ipv4Addr,
    payload: &[u8],
    edit: impl FnOnce(&mut Vec<u8>),
) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&macs.1);
    f.extend_from_slice(&macs.0);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let total = (20 + 8 + payload.len()) as u16;
    let mut ip = vec![0x45, 0];
    ip.extend_from_slice(&total.to_be_bytes());
    ip.extend_from_slice(&[0, 1, 0x40, 0, 64, 17, 0, 0]);
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    let sum = ip
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum::<u32>();
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = !(((sum & 0xffff) + (sum >> 16)) as u16);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&0xC001u16.to_be_bytes());
    f.extend_from_slice(&4791u16.to_be_bytes());
    f.extend_from_slice(&(8 + payload.len() as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    edit(&mut f);
    f
}

/// Malformed frames for the port at `dst` (MAC `dst_mac`): first
/// [`BAD_HEADERS`] with broken headers, then [`MALFORMED_DATAGRAMS`] that
/// the datagram checks refuse, then two the kernel filter stops.
fn malformed_frames(dst_mac: [u8; 6], dst: Ipv4Addr, src: Ipv4Addr) -> Vec<Vec<u8>> {
    let macs = ([0x02, 0, 0, 0, 0, 0x03], dst_mac);
    let frame = |payload: &[u8], edit: &dyn Fn(&mut Vec<u8>)| {
        udp_frame(macs, src, dst, payload, |f| edit(f))
    };
    vec![
        // IPv4 total length past the end of the frame.
        frame(&[0; 20], &|f| {
            f[16..18].copy_from_slice(&1000u16.to_be_bytes())
        }),
        // A UDP length shorter than its own header.
        frame(&[0; 20], &|f| {
            f[38..40].copy_from_slice(&4u16.to_be_bytes())
        }),
        // A UDP length past the end of the datagram.
        frame(&[0; 20], &|f| {
            f[38..40].copy_from_slice(&100u16.to_be_bytes())
        }),
        // A wrong IPv4 header checksum.
        frame(&[0; 20], &|f| f[24] ^= 0xff),
        // A datagram too short for a base transport header.
        frame(&[1, 2, 3], &|_| {}),
        // IPv4 options (RoCEv2 has none); a UDP header where they end.
        frame(&[0; 20], &|f| {
            f[14] = 0x46;
            f[40..42].copy_from_slice(&4791u16.to_be_bytes());
            f[42..44].copy_from_slice(&24u16.to_be_bytes());
        }),
        // Stopped by the filter: an IPv4 header longer than the frame, and
        // an Ethernet header alone.
        frame(&[0; 4], &|f| f[14] = 0x4f),
        frame(&[], &|f| f.truncate(14)),
    ]
}

/// Sends `frames` out of interface `interface` of namespace `veth`, from
/// a thread that enters it.
fn inject(veth: &VethNamespace, interface: &str, frames: Vec<Vec<u8>>) {
    let interface = std::ffi::CString::new(interface).expect("interface name");
    std::thread::scope(|s| {
        s.spawn(|| {
            veth.enter_on_this_thread().expect("enter the namespace");
            // SAFETY: a NUL-terminated name that outlives the call.
            let index = unsafe { libc::if_nametoindex(interface.as_ptr()) };
            assert_ne!(index, 0, "{interface:?} in the namespace");
            // SAFETY: plain socket creation; the descriptor is closed below.
            let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
            assert!(
                fd >= 0,
                "packet socket: {}",
                std::io::Error::last_os_error()
            );
            // SAFETY: sockaddr_ll is plain old data; all zeroes is valid.
            let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            to.sll_family = libc::AF_PACKET as u16;
            to.sll_ifindex = index as i32;
            to.sll_halen = 6;
            for frame in &frames {
                to.sll_addr[..6].copy_from_slice(&frame[..6]);
                // SAFETY: the frame and the address are live for the call,
                // with their sizes passed.
                let sent = unsafe {
                    libc::sendto(
                        fd,
                        frame.as_ptr().cast(),
                        frame.len(),
                        0,
                        (&raw const to).cast(),
                        size_of::<libc::sockaddr_ll>() as libc::socklen_t,
                    )
                };
                assert_eq!(
                    sent,
                    frame.len() as isize,
                    "{}",
                    std::io::Error::last_os_error()
                );
            }
            // SAFETY: the descriptor opened above, closed once.
            unsafe { libc::close(fd) };
        });
    });
}

/// The MAC address of `interface` in this namespace.
fn mac_of(interface: &str) -> [u8; 6] {
    let text = std::fs::read_to_string(format!("/sys/class/net/{interface}/address"))
        .expect("interface address");
    let bytes: Vec<u8> = text
        .trim()
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).expect("hex"))
        .collect();
    bytes.try_into().expect("6 bytes")
}

/// One round-trip test at a time: the client gives up after about 130 ms
/// without an answer, which two fabrics starting at once on a loaded
/// machine can exceed.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn round_trips_through_the_roce_port(path: &str, tag: &str, subnet: &str) {
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let veth = VethNamespace::create(tag, subnet).expect("network namespace (root needed)");
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = FabricSpec::new()
        .server("A", &[("A1", "4MiB")])
        .server("B", &[("B1", "4MiB")])
        .device("F")
        .client("c0")
        .roce_port(
            "F",
            RoceSpec {
                interface: veth.host.clone(),
                control_ip: veth.addr(254).to_string(),
                roce_ip: veth.addr(1).to_string(),
            },
        );
    let config = spec.write(dir.path(), "topology.toml", &mut Ports::new());
    let _servers = testkit::pmem_servers(&config, &["A", "B"], dir.path());
    let device = testkit::fabric_device(&config, "F", &["--roce-io", path])
        .unwrap_or_else(|e| panic!("fabric-device did not start:\n{e}"));
    device.wait_links_up(2);
    assert_eq!(device.field("roce.p0"), veth.addr(1).to_string());

    // Malformed frames first: dropped and counted, and the port serves on.
    let peer = format!("{tag}c{}", &veth.host[tag.len() + 1..]);
    inject(
        &veth,
        &peer,
        malformed_frames(mac_of(&veth.host), veth.addr(1), veth.addr(3)),
    );

    let control = device.addr("port.p0");
    let exe = std::env::current_exe().expect("test binary");
    let out = Command::new("ip")
        .args(["netns", "exec", &veth.ns])
        .arg(&exe)
        .args(["--exact", "roce_client_process", "--ignored", "--nocapture"])
        .env(
            CHILD_ENV,
            format!("{control};{};{}", config.display(), veth.addr(2)),
        )
        .output()
        .expect("client process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("roce-client-ok"),
        "client failed:\n{stdout}\n{stderr}\ndevice:\n{}",
        device.stderr_so_far()
    );

    // What the client wrote over RoCE reads back over the TCP transport.
    let layout = layout(&config);
    let mut conn = Conn::connect(control);
    conn.hello("c0");
    for entry in layout.entries() {
        let key = conn.region_key(entry.region.0);
        let reply = conn.call(Repr::read(Target::Pmem(entry.start), key, WRITE_LEN as u32));
        assert_eq!(
            reply.data,
            pattern(entry.region.0, WRITE_LEN),
            "region {}",
            entry.region_id
        );
        let counter = PmemAddr(entry.start.get() + COUNTER_AT);
        let reply = conn.call(Repr::read(Target::Pmem(counter), key, 16));
        let mut expected = 10u64.to_le_bytes().to_vec();
        expected.extend_from_slice(b"placed!!");
        assert_eq!(reply.data, expected, "region {}", entry.region_id);
    }

    // The device publishes its RoCE counters shortly after the traffic.
    let scrape = || {
        telemetry::http_get(device.addr("admin"), "/metrics", Duration::from_secs(5))
            .map(|(_, body)| body)
            .expect("metrics")
    };
    let value = |metrics: &str, prefix: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let received = "fabric_device_roce_packets_received_total{port=\"p0\"}";
    let arp = "fabric_device_roce_arp_replies_total";
    let naks = "fabric_device_roce_naks_sent_total{port=\"p0\",qp=\"all\",kind=\"remote_access\"}";
    // Counters of one port are published together, but each scrape may
    // come between two publications: wait for all of them.
    let published =
        |m: &str| value(m, received) >= 10.0 && value(m, arp) >= 1.0 && value(m, naks) >= 1.0;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut metrics = scrape();
    while !published(&metrics) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        metrics = scrape();
    }
    assert!(value(&metrics, received) >= 10.0, "{metrics}");
    assert!(value(&metrics, arp) >= 1.0, "{metrics}");
    assert_eq!(value(&metrics, naks), 1.0, "the bad R_Key: {metrics}");
    let dropped = |reason: &str| {
        value(
            &metrics,
            &format!("fabric_device_roce_dropped_total{{port=\"p0\",reason=\"{reason}\"}}"),
        )
    };
    assert_eq!(dropped("icrc_error"), 0.0);
    assert_eq!(
        dropped("bad_headers"),
        BAD_HEADERS as f64,
        "the injected frames: {metrics}"
    );
    assert_eq!(
        dropped("malformed"),
        MALFORMED_DATAGRAMS as f64,
        "the injected frames: {metrics}"
    );
    assert_eq!(dropped("ring_malformed"), 0.0, "{metrics}");
    let running = format!("fabric_device_roce_io{{port=\"p0\",path=\"{path}\",fallback=\"none\"}}");
    assert_eq!(value(&metrics, &running), 1.0, "{metrics}");
    let af_xdp = value(
        &metrics,
        "fabric_device_roce_af_xdp_frames_total{port=\"p0\"}",
    );
    if path == "xdp" {
        assert!(
            af_xdp >= 10.0,
            "the client's frames came by AF_XDP: {metrics}"
        );
    } else {
        assert_eq!(af_xdp, 0.0, "{metrics}");
    }
    telemetry::promtool_check(&metrics).expect("promtool accepts the metrics");
}

/// The client process, started inside the namespace by the test above.
#[test]
#[ignore = "the RoCE client process that a_raw_rc_client_reaches_the_pool_through_the_roce_port starts"]
fn roce_client_process() {
    let Ok(args) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut parts = args.split(';');
    let (Some(control), Some(config), Some(local)) = (parts.next(), parts.next(), parts.next())
    else {
        panic!("{CHILD_ENV}: control;config;local address, not {args:?}");
    };
    let layout = layout(&PathBuf::from(config));
    let mut conn = Conn::connect(control.parse().expect("control address"));
    conn.hello("c0");
    let local: Ipv4Addr = local.parse().expect("ip");
    let mut client = RawRoceClient::connect(&mut conn, local, 0x42).expect("queue pair");
    let mut expected = Vec::new();
    let mut id = 0;
    let mut post = |client: &mut RawRoceClient, op, kind| {
        id += 1;
        client.qp.post(WorkRequest::new(id, op)).expect("post");
        expected.push(kind);
    };
    for entry in layout.entries() {
        let region = entry.region.0;
        let at = |off: u64| client.remote(region, entry.start.get() + off);
        let data = pattern(region, WRITE_LEN);
        let (w, r, f, a1, aw, p) = (
            at(0),
            at(0),
            at(COUNTER_AT),
            at(COUNTER_AT),
            at(COUNTER_AT + 8),
            at(0),
        );
        post(
            &mut client,
            WorkOp::Write {
                remote: w,
                data: data.clone(),
                imm: None,
            },
            CompletionKind::Write,
        );
        post(
            &mut client,
            WorkOp::Read {
                remote: r,
                len: WRITE_LEN as u32,
            },
            CompletionKind::Read(data),
        );
        post(
            &mut client,
            WorkOp::AtomicWrite {
                remote: f,
                value: 0u64.to_le_bytes(),
            },
            CompletionKind::AtomicWrite,
        );
        post(
            &mut client,
            WorkOp::FetchAdd { remote: a1, add: 7 },
            CompletionKind::Atomic(0),
        );
        post(
            &mut client,
            WorkOp::CompareSwap {
                remote: f,
                compare: 7,
                swap: 10,
            },
            CompletionKind::Atomic(7),
        );
        post(
            &mut client,
            WorkOp::AtomicWrite {
                remote: aw,
                value: *b"placed!!",
            },
            CompletionKind::AtomicWrite,
        );
        post(
            &mut client,
            WorkOp::persist(p, WRITE_LEN as u32),
            CompletionKind::Flush,
        );
    }
    let done = client.run(Duration::from_secs(30)).expect("completions");
    let got: Vec<_> = done.iter().map(|c| (c.status, c.kind.clone())).collect();
    let want: Vec<_> = expected
        .into_iter()
        .map(|k| (WcStatus::Success, k))
        .collect();
    assert!(
        got == want,
        "completions differ:\n got {got:?}\nwant {want:?}"
    );
    // A key the device did not hand out is refused without touching memory.
    let entry = &layout.entries()[0];
    let mut bad = client.remote(entry.region.0, entry.start.get());
    bad.rkey = bad.rkey.wrapping_add(1);
    client
        .qp
        .post(WorkRequest::new(
            999,
            WorkOp::Read {
                remote: bad,
                len: 8,
            },
        ))
        .expect("post");
    let refused = client.run(Duration::from_secs(30)).expect("completion");
    assert_eq!(refused[0].status, WcStatus::RemoteAccessError);
    println!("roce-client-ok {} work requests", got.len() + 1);
}

const LANE_CHILD_ENV: &str = "PF_ROCE_LANE_CHILD";
const LANE: u8 = 1;
const FIRST_ATOMIC: u64 = 500;
const IN_DOUBT_AT: u64 = 0x20_000;

/// An RDMA atomic in doubt is asked again on another device with the
/// identity its queue pair's device gave it (lane, number), and the server
/// answers it from its record instead of applying it twice.
#[test]
fn an_rdma_atomic_asked_again_through_another_device_runs_once() {
    let veth =
        VethNamespace::create("pflane", "10.252.0").expect("network namespace (root needed)");
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = FabricSpec::new()
        .server("A", &[("A1", "4MiB")])
        .device("F")
        .device("G")
        .client("c0")
        .roce_port(
            "F",
            RoceSpec {
                interface: veth.host.clone(),
                control_ip: "10.252.0.254".to_owned(),
                roce_ip: "10.252.0.1".to_owned(),
            },
        );
    let config = spec.write(dir.path(), "topology.toml", &mut Ports::new());
    let _servers = testkit::pmem_servers(&config, &["A"], dir.path());
    let roce_device = testkit::fabric_device(&config, "F", &[])
        .unwrap_or_else(|e| panic!("fabric-device F did not start:\n{e}"));
    let tcp_device = testkit::fabric_device(&config, "G", &[])
        .unwrap_or_else(|e| panic!("fabric-device G did not start:\n{e}"));
    roce_device.wait_links_up(1);
    tcp_device.wait_links_up(1);

    // Two FETCH_ADDs of 1 over RDMA through F: numbers 500 and 501 on lane 1.
    let exe = std::env::current_exe().expect("test binary");
    let out = Command::new("ip")
        .args(["netns", "exec", &veth.ns])
        .arg(&exe)
        .args([
            "--exact",
            "roce_lane_client_process",
            "--ignored",
            "--nocapture",
        ])
        .env(
            LANE_CHILD_ENV,
            format!("{};{}", roce_device.addr("port.p0"), config.display()),
        )
        .output()
        .expect("client process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("roce-lane-ok"),
        "client failed:\n{stdout}\n{}\ndevice:\n{}",
        String::from_utf8_lossy(&out.stderr),
        roce_device.stderr_so_far()
    );

    let entry = layout(&config).entries()[0].clone();
    let word = Target::Pmem(PmemAddr(entry.start.get() + IN_DOUBT_AT));
    let mut conn = Conn::connect(tcp_device.addr("port.p0"));
    conn.hello("c0");
    let key = conn.region_key(entry.region.0);
    let read = |conn: &mut Conn| {
        let data = conn.call(Repr::read(word, key, 8)).data;
        u64::from_le_bytes(data.try_into().expect("8 bytes"))
    };
    let fetch_add = |conn: &mut Conn, lane: u8, seq: u64| {
        let once = proto::request::ExactlyOnce::on_lane(lane, seq);
        conn.call(Repr::fetch_add(word, key, 1).with_exactly_once(once.client, seq))
            .value
    };
    assert_eq!(read(&mut conn), 2);
    // Both RDMA atomics asked again through G: answered from the record.
    assert_eq!(fetch_add(&mut conn, LANE, FIRST_ATOMIC), 0);
    assert_eq!(fetch_add(&mut conn, LANE, FIRST_ATOMIC + 1), 1);
    assert_eq!(read(&mut conn), 2, "nothing applied twice");
    // The next number on the lane, and the same number on another lane, are new.
    assert_eq!(fetch_add(&mut conn, LANE, FIRST_ATOMIC + 2), 2);
    assert_eq!(fetch_add(&mut conn, LANE + 1, FIRST_ATOMIC), 3);
    assert_eq!(read(&mut conn), 4);
}

/// The RoCE client of the test above, started inside the namespace.
#[test]
#[ignore = "the RoCE client process that an_rdma_atomic_asked_again_through_another_device_runs_once starts"]
fn roce_lane_client_process() {
    let Ok(args) = std::env::var(LANE_CHILD_ENV) else {
        return;
    };
    let (control, config) = args.split_once(';').expect("control;config");
    let entry = layout(&PathBuf::from(config)).entries()[0].clone();
    let mut conn = Conn::connect(control.parse().expect("control address"));
    conn.hello("c0");
    let local: Ipv4Addr = "10.252.0.2".parse().expect("ip");
    let mut client = RawRoceClient::connect_with_lane(
        &mut conn,
        local,
        0x43,
        Some(proto::qp::AtomicSeq {
            lane: LANE,
            first: FIRST_ATOMIC,
        }),
    )
    .expect("queue pair");
    let remote = client.remote(entry.region.0, entry.start.get() + IN_DOUBT_AT);
    for id in 1..=2 {
        client
            .qp
            .post(WorkRequest::new(id, WorkOp::FetchAdd { remote, add: 1 }))
            .expect("post");
    }
    let done = client.run(Duration::from_secs(30)).expect("completions");
    let got: Vec<_> = done.iter().map(|c| (c.status, c.kind.clone())).collect();
    assert_eq!(
        got,
        [
            (WcStatus::Success, CompletionKind::Atomic(0)),
            (WcStatus::Success, CompletionKind::Atomic(1)),
        ]
    );
    println!("roce-lane-ok");
}
