//! The device's queue pair toward a server, against a sans-IO RC responder
//! over memory standing in for the server's RNIC: the work requests the
//! core's decision (`forward::decide`) names, posted and completed.

use std::net::Ipv4Addr;
use std::time::Instant;

use proto::qp::{self, Accept, Endpoint, caps};
use proto::request::{self, Target};
use proto::roce::rc::{BufferMemory, Path, QpConfig, QueuePair, WcStatus};
use proto::roce::{Datagram, Psn};
use proto::{AccessKey, Message, RegionIndex, RegionOffset, Status};

use super::{Completed, Posting, QP_CONNECT_TAG, Uplinks};
use crate::forward::{LinkId, Offload, RequestFields, decide, failure_status};

const DEVICE: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 101);
const SERVER: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 3);
const LINK: LinkId = LinkId(7);
const RKEY: u32 = 0x2ee;
const KEY: AccessKey = AccessKey(0x5eed);

/// The region's length as the core knows it.
const REGION_LEN: u64 = 64 << 10;

/// The device's uplink, up against a responder over 64 KiB of memory.
struct Rig {
    uplinks: Uplinks,
    /// What the server's queue pair can do.
    caps: u64,
    /// The region's length the core decides by.
    region_len: u64,
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
        Rig {
            uplinks,
            caps,
            region_len: REGION_LEN,
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

    /// The work requests the core chooses for `req` (tag `tag`).
    fn decide(&self, req: &request::Repr<'_>, tag: u64) -> Option<Offload> {
        let Target::Region(at) = req.target else {
            panic!("region-addressed requests only");
        };
        let fields = RequestFields::forwarded(req, at, tag);
        decide(&fields, KEY, self.region_len, RKEY, self.caps)
    }

    /// Posts `req` (tag `tag`) as the core would have it carried; whether
    /// the queue pair took it.
    fn offer(&mut self, req: request::Repr<'_>, tag: u64) -> bool {
        let Some(work) = self.decide(&req, tag) else {
            return false;
        };
        self.uplinks.post(LINK, &work, req.payload) == Posting::Posted
    }

    /// The next request that ended, as (tag, status, data).
    fn answer(&mut self) -> (u64, Status, Vec<u8>) {
        let Completed { link, tag, outcome } = self.uplinks.poll_completed().expect("an answer");
        assert_eq!(link, LINK);
        match outcome {
            Ok(data) => (tag, Status::Ok, data),
            Err(status) => (tag, failure_status(status), Vec::new()),
        }
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
    assert_eq!(answers[1].0, 13);
    assert_eq!(answers[1].1, Status::Ok);
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
fn a_persistent_atomic_write_stores_then_flushes_its_eight_bytes() {
    let mut rig = Rig::new(caps::FLUSH_PERSISTENT | caps::ATOMIC_WRITE);
    let store = request::Repr {
        persist: true,
        ..request::Repr::atomic_write(at(64), KEY, 0x0102_0304)
    };
    assert!(rig.offer(store, 4));
    rig.pump();
    assert_eq!(rig.answer(), (4, Status::Ok, vec![]));
    assert_eq!(&rig.memory.bytes[64..72], &0x0102_0304u64.to_le_bytes());
    assert_eq!(rig.memory.flushed, [(64, 8)]);
}

/// A refusal of the server's RNIC (it registered less than the map says)
/// is the request's answer, and breaks the queue pair: its link must
/// reconnect, and meanwhile nothing more is posted on it.
#[test]
fn a_refusal_answers_the_request_and_breaks_the_queue_pair() {
    let mut rig = Rig::new(caps::FLUSH_PERSISTENT);
    rig.region_len = 1 << 30;
    assert!(rig.uplinks.take_broken().is_empty());
    assert!(rig.offer(request::Repr::read(at(1 << 20), KEY, 8), 5));
    rig.pump();
    assert_eq!(rig.answer().1, Status::OutOfBounds);
    let broken = rig.uplinks.take_broken();
    assert_eq!(broken.len(), 1, "{broken:?}");
    assert_eq!(broken[0], (LINK, WcStatus::RemoteAccessError));
    let read = request::Repr::read(at(0), KEY, 8);
    let work = rig.decide(&read, 6).expect("RDMA would carry it");
    assert_eq!(rig.uplinks.room(LINK, &work), Posting::NotCarried);
    assert_eq!(rig.uplinks.post(LINK, &work, &[]), Posting::NotCarried);
    assert!(rig.uplinks.poll_completed().is_none());
}

/// Whether there is room is asked without posting; a link without a queue
/// pair carries nothing; what is in flight is counted until it completes.
#[test]
fn room_and_in_flight_follow_the_send_queue() {
    let mut rig = Rig::new(caps::FLUSH_PERSISTENT);
    let write = request::Repr::write(at(8), KEY, b"copy");
    let work = rig.decide(&write, 3).expect("RDMA carries it");
    assert_eq!(rig.uplinks.room(LINK, &work), Posting::Posted);
    assert_eq!(
        rig.uplinks.room(LinkId(8), &work),
        Posting::NotCarried,
        "no queue pair on that link"
    );
    assert_eq!(rig.uplinks.in_flight(LINK), 0);
    assert_eq!(rig.uplinks.post(LINK, &work, b"copy"), Posting::Posted);
    assert_eq!(rig.uplinks.in_flight(LINK), 1);
    assert_eq!(rig.uplinks.counters().posted, 1);
    rig.pump();
    assert_eq!(rig.answer(), (3, Status::Ok, vec![]));
    assert_eq!(rig.uplinks.in_flight(LINK), 0);
    assert_eq!(&rig.memory.bytes[8..12], b"copy");
    // A full send queue: RDMA would carry it, but not now.
    let read = rig
        .decide(&request::Repr::read(at(0), KEY, 8), 4)
        .expect("RDMA carries it");
    let mut posted = 0;
    while rig.uplinks.post(LINK, &read, &[]) == Posting::Posted {
        posted += 1;
        assert!(posted < 100_000, "the send queue never filled");
    }
    assert_eq!(rig.uplinks.room(LINK, &read), Posting::Full);
    rig.uplinks.sent_on_control(LINK);
    assert_eq!(rig.uplinks.counters().on_control, 1);
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
            assert!(rig.uplinks.poll_completed().is_none());
            return;
        }
    }
    panic!("the queue pair never gave up");
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
