//! A requester queue pair (the client's RNIC) talks RC to the gateway; the
//! gateway forwards through a real forwarding core to simulated servers
//! that execute the device's requests on sparse memory.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proto::frame::Header;
use proto::request::{Operation, Target};
use proto::roce::rc::{CompletionKind, Path, RemoteAddr, WcStatus, WorkOp, WorkRequest};
use proto::{AccessKey, Message, response};
use topology::{EnvOverrides, Topology};

use super::*;
use crate::forward::{ForwarderConfig, LinkAction};
use crate::map::DeviceMap;
use crate::metrics::DeviceMetrics;

const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 2);
const DEVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 1);
const RKEY: u32 = 0xA11CE;

fn topology() -> Topology {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/default.toml");
    Topology::load_with(path, &EnvOverrides::None).expect("default topology")
}

/// The key the simulated servers give region `region` in their MAP.
fn server_key(region: u32) -> u64 {
    0x5EC0_0000 + u64::from(region)
}

/// The servers behind every link: region → sparse bytes.
#[derive(Default)]
struct Servers {
    memory: HashMap<(u32, u64), u8>,
    executed: usize,
    /// The exactly-once identity of every request executed, in order.
    identities: Vec<Option<proto::request::ExactlyOnce>>,
}

impl Servers {
    /// Executes one forwarded request (head + payload) and returns the response frame.
    fn execute(&mut self, frame: &[u8]) -> Vec<u8> {
        let (message, tag) = proto::parse_frame(frame).expect("forwarded frame");
        let Message::Request(req) = message else {
            panic!("not a request")
        };
        let Target::Region(at) = req.target else {
            panic!("the device forwards region-addressed requests")
        };
        if req.key != AccessKey(server_key(at.region.0)) {
            return proto::error_reply(req.operation.opcode(), tag, Status::AccessDenied).to_vec();
        }
        self.executed += 1;
        self.identities.push(req.exactly_once);
        let byte = |m: &HashMap<(u32, u64), u8>, i: u64| {
            m.get(&(at.region.0, at.offset + i)).copied().unwrap_or(0)
        };
        let word = |m: &HashMap<(u32, u64), u8>| {
            u64::from_le_bytes(std::array::from_fn(|i| byte(m, i as u64)))
        };
        let store = |m: &mut HashMap<(u32, u64), u8>, bytes: &[u8]| {
            for (i, b) in bytes.iter().enumerate() {
                m.insert((at.region.0, at.offset + i as u64), *b);
            }
        };
        let (kind, value, data) = match req.operation {
            Operation::Read => {
                let data: Vec<u8> = (0..u64::from(req.length))
                    .map(|i| byte(&self.memory, i))
                    .collect();
                (response::ResponseKind::ReadResponse, 0, data)
            }
            Operation::Write | Operation::WritePersist => {
                store(&mut self.memory, req.payload);
                (response::ResponseKind::Acknowledge, 0, Vec::new())
            }
            Operation::FetchAdd => {
                let old = word(&self.memory);
                store(
                    &mut self.memory,
                    &old.wrapping_add(req.operand).to_le_bytes(),
                );
                (response::ResponseKind::AtomicAcknowledge, old, Vec::new())
            }
            Operation::CompareSwap => {
                let old = word(&self.memory);
                if old == req.compare {
                    store(&mut self.memory, &req.operand.to_le_bytes());
                }
                (response::ResponseKind::AtomicAcknowledge, old, Vec::new())
            }
            Operation::AtomicWrite => {
                store(&mut self.memory, &req.operand.to_le_bytes());
                (response::ResponseKind::Acknowledge, 0, Vec::new())
            }
            Operation::Flush => (response::ResponseKind::Acknowledge, 0, Vec::new()),
        };
        Message::Response(response::Repr {
            kind,
            status: Status::Ok,
            value,
            payload: &data,
        })
        .encode_to_vec(tag)
        .expect("response")
    }
}

struct Bench {
    fwd: Forwarder,
    gateway: RoceGateway,
    servers: Servers,
    client: QueuePair,
    now: Instant,
    start: PmemAddr,
    /// Chance in 1/1000 that the hop loses a datagram, either way.
    loss_per_mille: u64,
    rng: u64,
}

impl Bench {
    /// A client QP to the gateway; with `grant`, R_Key [`RKEY`] stands for
    /// the first region (whose key the device learns from its server).
    fn new(grant: bool) -> Self {
        Self::with_atomics(grant, None)
    }

    /// As [`Bench::new`], with the queue pair's atomics numbered as `atomics` says.
    fn with_atomics(grant: bool, atomics: Option<AtomicSeq>) -> Self {
        Self::with_epoch(grant, atomics, ConnEpoch::default())
    }

    /// As [`Bench::with_atomics`], the queue pair running map epoch `epoch`.
    fn with_epoch(grant: bool, atomics: Option<AtomicSeq>, epoch: ConnEpoch) -> Self {
        let topology = topology();
        let map = DeviceMap::new(&topology, &"A".into()).expect("map");
        let entry = map.layout.entries()[0].clone();
        let rkeys = if grant {
            vec![(RKEY, entry.region)]
        } else {
            Vec::new()
        };
        let metrics =
            Arc::new(DeviceMetrics::new(Arc::new(telemetry::Registry::new())).expect("metrics"));
        let mut fwd = Forwarder::new(map, ForwarderConfig::default(), metrics);
        let links: Vec<LinkId> = fwd.links().map(|(id, _)| id).collect();
        for link in links {
            let sent = fwd.link_connected(link);
            let server = fwd.link_target(link).expect("key").server.to_string();
            let tags: Vec<u64> = split(&sent)
                .iter()
                .map(|f| Header::parse(f).expect("hdr").tag)
                .collect();
            let hello = Message::Hello(proto::hello::Repr {
                version: proto::PROTOCOL_VERSION,
                role: proto::hello::Role::Server,
                capabilities: proto::hello::Capabilities::NONE,
                name: &server,
            })
            .encode_to_vec(tags[0])
            .expect("hello");
            fwd.link_frame(link, &hello, Instant::now());
            let mut map = fwd.map().layout.to_map();
            for entry in &mut map.entries {
                entry.key = AccessKey(server_key(entry.region.0));
            }
            let map = Message::Map(map).encode_to_vec(tags[1]).expect("map");
            fwd.link_frame(link, &map, Instant::now());
        }
        let device_path = Path {
            local_ip: DEVICE_IP,
            remote_ip: CLIENT_IP,
            src_port: 50000,
            dscp: 0,
            ttl: 64,
        };
        let mut gateway = RoceGateway::new();
        let mut device_cfg = QpConfig::new(0, 0x77, device_path);
        device_cfg.recv_psn = proto::roce::Psn::new(1000);
        let qpn = gateway
            .open(
                &mut fwd,
                QpSetup {
                    client: "c1".into(),
                    config: device_cfg,
                    rkeys,
                    atomics,
                    epoch,
                },
            )
            .expect("open");
        let mut client_cfg = QpConfig::new(
            0x77,
            qpn,
            Path {
                local_ip: CLIENT_IP,
                remote_ip: DEVICE_IP,
                src_port: 50001,
                dscp: 0,
                ttl: 64,
            },
        );
        client_cfg.send_psn = proto::roce::Psn::new(1000);
        let client = QueuePair::new(client_cfg).expect("client qp");
        Bench {
            fwd,
            gateway,
            servers: Servers::default(),
            client,
            now: Instant::now(),
            start: entry.start,
            loss_per_mille: 0,
            rng: 0x9E37_79B9_7F4A_7C15,
        }
    }

    /// Whether the link loses the next datagram.
    fn lose(&mut self) -> bool {
        // xorshift64: seeded, so every run loses the same datagrams.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % 1000 < self.loss_per_mille
    }

    fn remote(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            va: self.start.get() + offset,
            rkey: RKEY,
        }
    }

    /// Runs until the client has nothing outstanding.
    fn run(&mut self) -> Vec<proto::roce::rc::Completion> {
        let mut buf = Vec::new();
        let mut done = Vec::new();
        for _ in 0..10_000 {
            while self.client.poll_transmit(self.now, &mut buf) {
                if self.lose() {
                    continue;
                }
                let mut to_links = Vec::new();
                self.gateway.handle_datagram(
                    self.now,
                    &buf,
                    &mut self.fwd,
                    |link, head, payload, _| {
                        to_links.push((link, [head, payload].concat()));
                    },
                );
                for (link, frame) in to_links {
                    let answer = self.servers.execute(&frame);
                    if let LinkAction::Deliver {
                        conn,
                        head,
                        payload,
                    } = self.fwd.link_frame(link, &answer, self.now)
                    {
                        assert!(self.gateway.deliver(conn, &head, payload));
                    }
                }
            }
            while self.gateway.poll_transmit(self.now, &mut buf) {
                if !self.lose() {
                    self.client.handle_datagram(self.now, &buf);
                }
            }
            while let Some(c) = self.client.poll_completion() {
                done.push(c);
            }
            if self.client.outstanding() == 0 {
                return done;
            }
            self.now += Duration::from_millis(10);
            self.client.handle_timeout(self.now);
            self.gateway.handle_timeout(self.now);
        }
        panic!("no end: {done:?}");
    }
}

/// Splits concatenated frames.
fn split(mut bytes: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let header = Header::parse(bytes).expect("header");
        let len = proto::frame::HEADER_LEN + header.body_len as usize;
        out.push(&bytes[..len]);
        bytes = &bytes[len..];
    }
    out
}

#[test]
fn rdma_operations_reach_the_owning_server_through_the_device() {
    let mut bench = Bench::new(true);
    let data: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    let ops = [
        WorkOp::Write {
            remote: bench.remote(0x100),
            data: data.clone(),
            imm: None,
        },
        WorkOp::Read {
            remote: bench.remote(0x100),
            len: 3000,
        },
        WorkOp::FetchAdd {
            remote: bench.remote(0x2000),
            add: 5,
        },
        WorkOp::CompareSwap {
            remote: bench.remote(0x2000),
            compare: 5,
            swap: 9,
        },
        WorkOp::AtomicWrite {
            remote: bench.remote(0x2008),
            value: *b"ATOMIC!!",
        },
        WorkOp::persist(bench.remote(0x100), 3000),
        WorkOp::Read {
            remote: bench.remote(0x2000),
            len: 16,
        },
    ];
    for (i, op) in ops.into_iter().enumerate() {
        bench
            .client
            .post(WorkRequest::new(i as u64, op))
            .expect("post");
    }
    let done = bench.run();
    let kinds: Vec<_> = done.iter().map(|c| (c.status, c.kind.clone())).collect();
    let mut tail = 9u64.to_le_bytes().to_vec();
    tail.extend_from_slice(b"ATOMIC!!");
    assert_eq!(
        kinds,
        [
            (WcStatus::Success, CompletionKind::Write),
            (WcStatus::Success, CompletionKind::Read(data)),
            (WcStatus::Success, CompletionKind::Atomic(0)),
            (WcStatus::Success, CompletionKind::Atomic(5)),
            (WcStatus::Success, CompletionKind::AtomicWrite),
            (WcStatus::Success, CompletionKind::Flush),
            (WcStatus::Success, CompletionKind::Read(tail)),
        ]
    );
    // The 3-packet WRITE (one device request: the responder hands a
    // message's packets to memory together), READ, 2 atomics, atomic
    // write, flush, READ.
    assert_eq!(bench.servers.executed, 7);
}

#[test]
fn an_unknown_rkey_is_a_remote_access_error_that_never_reaches_a_server() {
    let mut bench = Bench::new(false);
    bench
        .client
        .post(WorkRequest::new(
            1,
            WorkOp::Read {
                remote: bench.remote(0),
                len: 8,
            },
        ))
        .expect("post");
    let done = bench.run();
    assert_eq!(done[0].status, WcStatus::RemoteAccessError);
    assert_eq!(bench.servers.executed, 0);
    assert_eq!(bench.gateway.counters().bad_rkeys, 1);
}

#[test]
fn a_queue_pair_set_up_before_the_device_moved_to_a_newer_epoch_is_refused() {
    let mut epoch = ConnEpoch::default();
    epoch.said(4);
    let mut bench = Bench::with_epoch(true, None, epoch);
    let read = |bench: &mut Bench, id| {
        let remote = bench.remote(0);
        bench
            .client
            .post(WorkRequest::new(id, WorkOp::Read { remote, len: 8 }))
            .expect("post");
        bench.run()
    };
    // At the device's own epoch the queue pair is served.
    let _ = bench.fwd.set_epoch(4);
    assert_eq!(read(&mut bench, 1)[0].status, WcStatus::Success);
    assert_eq!(bench.servers.executed, 1);
    // Once the device runs a newer map, the queue pair's requests are
    // refused (STALE_MAP in the core, a NAK that breaks the queue pair)
    // and nothing reaches a server.
    let _ = bench.fwd.set_epoch(5);
    assert_eq!(
        read(&mut bench, 2)[0].status,
        WcStatus::RemoteOperationalError
    );
    assert_eq!(bench.servers.executed, 1);
}

#[test]
fn an_address_outside_the_pool_is_refused_by_the_core() {
    let mut bench = Bench::new(true);
    bench
        .client
        .post(WorkRequest::new(
            1,
            WorkOp::Read {
                remote: RemoteAddr {
                    va: u64::MAX - 64,
                    rkey: RKEY,
                },
                len: 8,
            },
        ))
        .expect("post");
    let done = bench.run();
    assert_eq!(done[0].status, WcStatus::RemoteAccessError);
    assert_eq!(bench.servers.executed, 0);
}

#[test]
fn datagrams_for_unknown_queue_pairs_are_dropped_and_counted() {
    let mut bench = Bench::new(false);
    let mut stray = QueuePair::new(QpConfig::new(
        0x78,
        0xABCDE,
        Path {
            local_ip: CLIENT_IP,
            remote_ip: DEVICE_IP,
            src_port: 1,
            dscp: 0,
            ttl: 64,
        },
    ))
    .expect("qp");
    stray
        .post(WorkRequest::new(
            1,
            WorkOp::Read {
                remote: bench.remote(0),
                len: 8,
            },
        ))
        .expect("post");
    let mut buf = Vec::new();
    assert!(stray.poll_transmit(bench.now, &mut buf));
    bench
        .gateway
        .handle_datagram(bench.now, &buf, &mut bench.fwd, |_, _, _, _| {
            panic!("nothing may be forwarded")
        });
    assert_eq!(bench.gateway.counters().unknown_qp, 1);
    bench
        .gateway
        .handle_datagram(bench.now, &[0u8; 40], &mut bench.fwd, |_, _, _, _| {});
    assert_eq!(bench.gateway.counters().malformed, 1);
}

#[test]
fn atomics_through_a_lossy_hop_are_applied_once() {
    let mut bench = Bench::new(true);
    bench.loss_per_mille = 100;
    let mut expected = 0u64;
    for i in 0..200u64 {
        let op = if i % 5 == 4 {
            WorkOp::Read {
                remote: bench.remote(0x3000),
                len: 8,
            }
        } else {
            expected += i;
            WorkOp::FetchAdd {
                remote: bench.remote(0x3000),
                add: i,
            }
        };
        bench.client.post(WorkRequest::new(i, op)).expect("post");
        if bench.client.outstanding() >= 16 {
            for c in bench.run() {
                assert_eq!(c.status, WcStatus::Success, "{c:?}");
            }
        }
    }
    for c in bench.run() {
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
    }
    bench
        .client
        .post(WorkRequest::new(
            999,
            WorkOp::Read {
                remote: bench.remote(0x3000),
                len: 8,
            },
        ))
        .expect("post");
    let last = bench.run();
    assert_eq!(
        last[0].kind,
        CompletionKind::Read(expected.to_le_bytes().to_vec())
    );
    let retransmitted = bench.client.counters().retransmissions;
    let duplicates: u64 = bench.gateway.qp_counters().map(|(_, c)| c.duplicates).sum();
    assert!(retransmitted > 0 && duplicates > 0, "the hop lost nothing");
}

#[test]
fn atomics_of_a_queue_pair_with_a_lane_are_numbered_in_order_once_each() {
    let mut bench = Bench::with_atomics(
        true,
        Some(AtomicSeq {
            lane: 2,
            first: 1_000,
        }),
    );
    bench.loss_per_mille = 150;
    for i in 0..60u64 {
        let op = match i % 3 {
            0 => WorkOp::FetchAdd {
                remote: bench.remote(0x4000),
                add: 1,
            },
            1 => WorkOp::Write {
                remote: bench.remote(0x4100),
                data: vec![i as u8; 16],
                imm: None,
            },
            _ => WorkOp::CompareSwap {
                remote: bench.remote(0x4008),
                compare: 0,
                swap: 0,
            },
        };
        bench.client.post(WorkRequest::new(i, op)).expect("post");
        if i % 8 == 7 {
            bench.run();
        }
    }
    bench.run();
    let numbered: Vec<_> = bench.servers.identities.iter().flatten().collect();
    assert_eq!(numbered.len(), 40, "every atomic once, nothing else");
    for (k, once) in numbered.iter().enumerate() {
        assert_eq!(once.lane(), 2);
        assert_eq!(once.seq, 1_000 + k as u64, "arrival order, no gaps");
        // The client number (0: "c1" is the first client) is stamped by the core.
        assert_eq!(once.client & proto::request::CLIENT_NUMBER_MASK, 0);
    }
}

#[test]
fn atomics_of_a_queue_pair_without_a_lane_are_not_exactly_once() {
    let mut bench = Bench::new(true);
    bench
        .client
        .post(WorkRequest::new(
            1,
            WorkOp::FetchAdd {
                remote: bench.remote(0x4000),
                add: 1,
            },
        ))
        .expect("post");
    bench.run();
    assert_eq!(bench.servers.identities, [None]);
}
