//! The device's queue pair toward a server, against a sans-IO RC responder
//! over memory standing in for the server's RNIC.

use std::net::Ipv4Addr;
use std::time::Instant;

use proto::qp::{self, Accept, Endpoint, caps};
use proto::request::{self, ExactlyOnce, Target};
use proto::roce::rc::{BufferMemory, Path, QpConfig, QueuePair};
use proto::roce::{Datagram, Psn};
use proto::{AccessKey, Message, RegionIndex, RegionOffset, Status};

use super::{QP_CONNECT_TAG, Uplinks};
use crate::forward::{FORWARD_HEAD_LEN, LinkId};

const DEVICE: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 101);
const SERVER: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 3);
const LINK: LinkId = LinkId(7);
const RKEY: u32 = 0x2ee;
const KEY: AccessKey = AccessKey(0x5eed);

/// The device's uplink, up against a responder over 64 KiB of memory.
struct Rig {
    uplinks: Uplinks,
    server: QueuePair,
    memory: BufferMemory,
    /// FLUSH datagrams the device sent, as they went.
    flushes: Vec<Vec<u8>>,
}

impl Rig {
    fn new(caps: u64) -> Rig {
        let mut uplinks = Uplinks::new();
        let connect = uplinks.start(LINK, 0, DEVICE, 1024, 0);
        let (message, tag) = proto::parse_frame(&connect).expect("QP_CONNECT parses");
        assert_eq!(tag, QP_CONNECT_TAG);
        let Message::QpConnect(connect) = message else {
            panic!("not a QP_CONNECT: {message:?}");
        };
        assert_eq!(connect.epoch, None, "on a topology file it says no epoch");
        let device = connect.endpoint;
        let ours = Endpoint {
            qpn: 0x12,
            psn: 0x3456,
            ip: SERVER,
            mtu: 1024,
        };
        let mut config = QpConfig::new(
            ours.qpn,
            device.qpn,
            Path {
                local_ip: SERVER,
                remote_ip: DEVICE,
                src_port: 0xC000,
                dscp: 0,
                ttl: 64,
            },
        );
        config.send_psn = Psn::new(ours.psn);
        config.recv_psn = Psn::new(device.psn);
        let server = QueuePair::new(config).expect("server QP");
        let table = qp::encode_rkeys(&[(0, RKEY)]);
        let accept = Accept::new(ours, &table).expect("accept").with_caps(caps);
        uplinks.accepted(LINK, &accept).expect("accepted");
        uplinks.set_region(LINK, RegionIndex(0), KEY, 64 << 10);
        Rig {
            uplinks,
            server,
            memory: BufferMemory::new(0, RKEY, 64 << 10),
            flushes: Vec::new(),
        }
    }

    /// Moves datagrams both ways until neither side has any.
    fn pump(&mut self) {
        let now = Instant::now();
        let mut buf = Vec::new();
        loop {
            let mut moved = false;
            while self.uplinks.poll_transmit(0, now, &mut buf) {
                moved = true;
                if buf[28] == u8::from(proto::roce::Opcode::Flush) {
                    self.flushes.push(buf.clone());
                }
                // A responder checking the standard ICRC takes what the
                // standard allows; an rxe-style FLUSH is checked apart.
                self.server.handle_datagram(now, &buf);
                self.server.execute_with(&mut self.memory);
            }
            while self.server.poll_transmit(now, &mut buf) {
                moved = true;
                let d = Datagram::new_checked(&buf).expect("the server's datagram");
                self.uplinks.handle_datagram(now, &d);
            }
            if !moved {
                return;
            }
        }
    }

    /// Offers `req` (tag `tag`) as the core would; whether the queue pair
    /// took it.
    fn offer(&mut self, req: request::Repr<'_>, tag: u64) -> bool {
        let frame = Message::Request(req).encode_to_vec(tag).expect("encode");
        let (head, payload) = frame.split_at(FORWARD_HEAD_LEN);
        self.uplinks.try_post(LINK, head, payload)
    }

    /// The next answer, as (tag, status, payload).
    fn answer(&mut self) -> (u64, Status, Vec<u8>) {
        let (link, frame) = self.uplinks.poll_answer().expect("an answer");
        assert_eq!(link, LINK);
        let (message, tag) = proto::parse_frame(&frame).expect("the answer parses");
        let Message::Response(r) = message else {
            panic!("not a response: {message:?}");
        };
        (tag, r.status, r.payload.to_vec())
    }
}

fn at(offset: u64) -> Target {
    Target::Region(RegionOffset {
        region: RegionIndex(0),
        offset,
    })
}

#[test]
fn write_persist_is_a_write_then_a_persistent_flush_of_its_bytes() {
    let mut rig = Rig::new(caps::FLUSH_PERSISTENT);
    let data = vec![0xAB; 3000];
    let req = request::Repr {
        operation: request::Operation::WritePersist,
        persist: true,
        ..request::Repr::write(at(4096), KEY, &data)
    };
    assert!(rig.offer(req, 11));
    rig.pump();
    assert_eq!(rig.answer(), (11, Status::Ok, vec![]));
    assert_eq!(&rig.memory.bytes[4096..7096], &data[..]);
    assert_eq!(rig.memory.flushed, [(4096, 3000)]);

    // A READ comes back with the bytes, a FLUSH flushes.
    assert!(rig.offer(request::Repr::read(at(4096), KEY, 16), 12));
    assert!(rig.offer(request::Repr::flush(at(0), KEY, 64), 13));
    rig.pump();
    let mut answers = [rig.answer(), rig.answer()];
    answers.sort_by_key(|a| a.0);
    assert_eq!(answers[0], (12, Status::Ok, vec![0xAB; 16]));
    assert_eq!(answers[1], (13, Status::Ok, vec![]));
    assert_eq!(rig.memory.flushed, [(4096, 3000), (0, 64)]);
}

#[test]
fn without_flush_a_write_is_made_durable_by_reading_after_it() {
    let mut rig = Rig::new(0);
    let req = request::Repr {
        operation: request::Operation::WritePersist,
        persist: true,
        ..request::Repr::write(at(0), KEY, b"apm")
    };
    assert!(rig.offer(req, 1));
    rig.pump();
    assert_eq!(rig.answer(), (1, Status::Ok, vec![]));
    assert_eq!(&rig.memory.bytes[..3], b"apm");
    assert!(rig.memory.flushed.is_empty(), "no FLUSH without the cap");
    assert!(rig.flushes.is_empty());
    // Nor does the queue pair carry ATOMIC_WRITE without its cap.
    let store = request::Repr::atomic_write(at(64), KEY, 9);
    assert!(!rig.offer(store, 2));
}

#[test]
fn what_rdma_cannot_check_or_number_stays_on_the_control_connection() {
    let mut rig = Rig::new(caps::FLUSH_PERSISTENT | caps::ATOMIC_WRITE);
    // Another key (an allocation's, or a wrong one): the server checks it.
    assert!(!rig.offer(request::Repr::read(at(0), AccessKey(1), 8), 1));
    // Exactly-once atomics: the server keeps their window.
    let cas = request::Repr {
        exactly_once: Some(ExactlyOnce::on_lane(0, 5)),
        ..request::Repr::compare_swap(at(64), KEY, 0, 1)
    };
    assert!(!rig.offer(cas, 2));
    // A region the server gave no R_Key for.
    let elsewhere = Target::Region(RegionOffset {
        region: RegionIndex(3),
        offset: 0,
    });
    assert!(!rig.offer(request::Repr::read(elsewhere, KEY, 8), 3));
    assert_eq!(rig.uplinks.counters().on_control, 3);
    // ATOMIC_WRITE goes, and its persistent form flushes its 8 bytes.
    let store = request::Repr {
        persist: true,
        ..request::Repr::atomic_write(at(64), KEY, 0x0102_0304)
    };
    assert!(rig.offer(store, 4));
    rig.pump();
    assert_eq!(rig.answer(), (4, Status::Ok, vec![]));
    assert_eq!(&rig.memory.bytes[64..72], &0x0102_0304u64.to_le_bytes());
    assert_eq!(rig.memory.flushed, [(64, 8)]);
    // What the RNIC would refuse is left to the server: beyond the region,
    // a misaligned atomic.
    assert!(!rig.offer(request::Repr::read(at(64 << 10), KEY, 8), 5));
    assert!(!rig.offer(request::Repr::atomic_write(at(65), KEY, 1), 5));
    // A refusal all the same (the server registered less than the layout
    // says): its answer, and the queue pair is in the error state, so its
    // link must reconnect; meanwhile requests stay on the control
    // connection.
    rig.uplinks.set_region(LINK, RegionIndex(0), KEY, 1 << 30);
    assert!(rig.uplinks.take_broken().is_empty());
    assert!(rig.offer(request::Repr::read(at(1 << 20), KEY, 8), 5));
    rig.pump();
    assert_eq!(rig.answer().1, Status::OutOfBounds);
    let broken = rig.uplinks.take_broken();
    assert_eq!(broken.len(), 1, "{broken:?}");
    assert_eq!(broken[0].0, LINK);
    assert!(!rig.offer(request::Repr::read(at(0), KEY, 8), 6));
    assert!(rig.uplinks.poll_answer().is_none());
}

/// Each copy of a replicated region has one region index and a key of
/// its own server's: a link's queue pair carries a request with the key of
/// the copy on its server, and leaves another copy's key to the server.
#[test]
fn a_link_carries_the_key_of_its_own_servers_copy() {
    let mut rig = Rig::new(caps::FLUSH_PERSISTENT);
    let elsewhere = LinkId(8);
    let backup_key = AccessKey(0xBAC);
    rig.uplinks
        .set_region(elsewhere, RegionIndex(0), backup_key, 64 << 10);
    // The key another server gave for its copy does not open this one.
    assert!(!rig.offer(request::Repr::read(at(0), backup_key, 8), 1));
    assert!(rig.offer(request::Repr::read(at(0), KEY, 8), 2));
    rig.pump();
    assert_eq!(rig.answer().0, 2);
    // What it would do, asked without posting; and what is in flight.
    let frame = Message::Request(request::Repr::write(at(8), KEY, b"copy"))
        .encode_to_vec(3)
        .expect("encode");
    let (head, payload) = frame.split_at(FORWARD_HEAD_LEN);
    assert_eq!(
        rig.uplinks.would_carry(LINK, head, payload),
        super::Posting::Posted
    );
    assert_eq!(
        rig.uplinks.would_carry(elsewhere, head, payload),
        super::Posting::NotCarried,
        "no queue pair on that link"
    );
    assert_eq!(rig.uplinks.in_flight(LINK), 0);
    assert!(rig.uplinks.try_post(LINK, head, payload));
    assert_eq!(rig.uplinks.in_flight(LINK), 1);
    rig.pump();
    assert_eq!(rig.answer(), (3, Status::Ok, vec![]));
    assert_eq!(rig.uplinks.in_flight(LINK), 0);
    assert_eq!(&rig.memory.bytes[8..12], b"copy");
}

#[test]
fn toward_rxe_a_flush_carries_rxes_icrc() {
    let mut rig = Rig::new(caps::FLUSH_PERSISTENT | caps::RXE_FLUSH_ICRC);
    assert!(rig.offer(request::Repr::flush(at(0), KEY, 64), 1));
    rig.pump();
    let flush = rig.flushes.first().expect("a FLUSH went out");
    let body = &flush[..flush.len() - 4];
    let carried = u32::from_le_bytes(flush[flush.len() - 4..].try_into().expect("4 bytes"));
    assert_eq!(
        proto::roce::icrc::ipv4_rxe_flush(body, 20),
        Some(carried),
        "rxe's variant"
    );
    // A standard responder drops it (rxe drops the standard one).
    assert!(rig.memory.flushed.is_empty());
}

#[test]
fn a_request_the_transport_lost_is_left_to_the_core_and_the_link_reconnects() {
    let mut rig = Rig::new(caps::FLUSH_PERSISTENT);
    assert!(rig.offer(request::Repr::write(at(0), KEY, b"lost"), 1));
    // The server is gone: every datagram is lost, the retries run out.
    let start = Instant::now();
    let mut buf = Vec::new();
    for step in 1..=64u64 {
        let now = start + std::time::Duration::from_secs(step);
        while rig.uplinks.poll_transmit(0, now, &mut buf) {}
        rig.uplinks.handle_timeout(now);
        if !rig.uplinks.take_broken().is_empty() {
            // No answer from here: the core fails the request when the
            // link goes down, as one the client may send elsewhere.
            assert!(rig.uplinks.poll_answer().is_none());
            return;
        }
    }
    panic!("the queue pair never gave up");
}

/// A pool with an allocator keeps every request on the servers' CPUs,
/// where per-extent keys and record owners are checked; a pool without
/// one goes one-sided.
#[test]
fn only_a_pool_without_an_allocator_goes_one_sided() {
    let load = |name: &str| {
        let path = format!("{}/../configs/{name}", env!("CARGO_MANIFEST_DIR"));
        topology::Topology::load_with(&path, &topology::EnvOverrides::None).expect("topology")
    };
    let plain = topology::Layout::new(&load("default.toml")).expect("layout");
    assert!(super::one_sided(&plain));
    let with_allocator = topology::Layout::new(&load("alloc.toml")).expect("layout");
    assert!(!super::one_sided(&with_allocator));
}

#[test]
fn a_qp_connect_says_the_epoch_the_device_runs() {
    // A server that fenced queue pairs at a newer epoch (a takeover)
    // refuses it: a deposed owner gets no new queue pair.
    let mut uplinks = Uplinks::new();
    let frame = uplinks.start(LINK, 0, DEVICE, 1024, 7);
    let (message, _) = proto::parse_frame(&frame).expect("QP_CONNECT parses");
    let Message::QpConnect(connect) = message else {
        panic!("not a QP_CONNECT: {message:?}");
    };
    assert_eq!(connect.epoch, Some(7));
}
