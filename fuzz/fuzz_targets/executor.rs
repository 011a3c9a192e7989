//! pmem-server's executor (`Executor::handle_frame`, what a server does with
//! every frame a peer sends) on scratch region files, with and without
//! authentication, with and without an allocator's per-extent keys.
//!
//! Steps are requests built from fields (with the region's real key or
//! another, in bounds or not, exactly-once or not, on behalf of a client or
//! not) or any frame or bytes. For every step:
//!
//! - nothing panics, and the executor fails (closing the connection) only
//!   for a frame whose header breaks framing;
//! - what it writes back is whole frames that parse, each with the tag of
//!   the frame it answers;
//! - before a peer has proven its key on a gated server, nothing is
//!   answered with success, no data and no MAP;
//! - an admitted request gets exactly one response, of the kind its
//!   operation takes, with data only for a successful READ and then as much
//!   as asked for;
//! - a successful WRITE reads back, and an exactly-once atomic sent again
//!   (a retry) gets the same answer.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use pmem_fabric_fuzz::frames::{Piece, sent_frames};
use pmem_fabric_fuzz::handshake::{self, Tamper, Who};
use pmem_fabric_fuzz::scratch::{self, REGIONS, Scratch, Setup};
use pmem_server::{Flow, Session};
use proto::frame::Header;
use proto::hello::{self, Capabilities};
use proto::request::{self, Operation, Target};
use proto::{AccessKey, Message, PmemAddr, RegionIndex, RegionOffset, ResponseKind, Status};

#[derive(Debug, Arbitrary)]
struct Input {
    setup: Setup,
    /// On a gated server: who opens the connection first (an untouched
    /// opening), or nobody (the steps meet the gate).
    who: Option<Who>,
    steps: Vec<Step>,
}

#[derive(Debug, Arbitrary)]
enum Step {
    Request(Spec),
    /// A HELLO naming this principal (its role and name), as a connector
    /// starts its opening: the gate's challenge follows.
    Hello {
        who: Who,
        tag: u64,
    },
    Piece(Piece),
}

#[derive(Debug, Clone, Copy, Arbitrary)]
enum Op {
    Read,
    Write,
    WritePersist,
    Flush,
    CompareSwap,
    FetchAdd,
    AtomicWrite,
}

impl From<Op> for Operation {
    fn from(op: Op) -> Operation {
        match op {
            Op::Read => Operation::Read,
            Op::Write => Operation::Write,
            Op::WritePersist => Operation::WritePersist,
            Op::Flush => Operation::Flush,
            Op::CompareSwap => Operation::CompareSwap,
            Op::FetchAdd => Operation::FetchAdd,
            Op::AtomicWrite => Operation::AtomicWrite,
        }
    }
}

/// Where in the region.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum Offset {
    /// A byte in the first 64 KiB.
    Near(u16),
    /// An 8-byte word in the first 512 KiB.
    Word(u16),
    /// This many bytes before the region's end.
    FromEnd(u16),
    /// Anywhere at all.
    Any(u64),
}

#[derive(Debug, Clone, Copy, Arbitrary)]
enum KeyChoice {
    /// The region's key as it is now.
    Region,
    /// Any other.
    Other(u64),
}

#[derive(Debug, Arbitrary)]
struct Spec {
    tag: u64,
    op: Op,
    /// Region index modulo `REGIONS + 1` (the last names no region).
    region: u8,
    /// Address by PMEM address instead of region offset.
    by_pmem: bool,
    offset: Offset,
    key: KeyChoice,
    /// READ / FLUSH length.
    length: u16,
    /// WRITE data.
    data: Vec<u8>,
    operand: u64,
    compare: u64,
    persist: bool,
    non_temporal: bool,
    exactly_once: Option<(u32, u64)>,
    on_behalf: Option<u32>,
    /// Send it again right after (a retry).
    twice: bool,
}

impl Spec {
    fn request<'a>(&'a self, server: &Scratch) -> request::Repr<'a> {
        let index = u32::from(self.region) % (REGIONS + 1);
        let region_len = server
            .exec()
            .region(RegionIndex(index))
            .map_or(0, |r| r.entry.len);
        let offset = match self.offset {
            Offset::Near(at) => u64::from(at),
            Offset::Word(word) => u64::from(word) * 8,
            Offset::FromEnd(back) => region_len.wrapping_sub(back.into()),
            Offset::Any(at) => at,
        };
        let target = if self.by_pmem {
            Target::Pmem(PmemAddr(server.region_start(index).wrapping_add(offset)))
        } else {
            Target::Region(RegionOffset::new(RegionIndex(index), offset))
        };
        let key = match self.key {
            KeyChoice::Region => server.region_key(index),
            KeyChoice::Other(key) => AccessKey(key),
        };
        let op = Operation::from(self.op);
        let mut repr = match op {
            Operation::Read => request::Repr::read(target, key, self.length.into()),
            Operation::Write => request::Repr::write(target, key, &self.data),
            Operation::WritePersist => request::Repr::write_persist(target, key, &self.data),
            Operation::Flush => request::Repr::flush(target, key, self.length.into()),
            Operation::CompareSwap => {
                request::Repr::compare_swap(target, key, self.compare, self.operand)
            }
            Operation::FetchAdd => request::Repr::fetch_add(target, key, self.operand),
            Operation::AtomicWrite => request::Repr::atomic_write(target, key, self.operand),
        };
        if let Some((client, seq)) = self.exactly_once {
            repr = repr.with_exactly_once(client, seq);
        }
        repr.on_behalf = self.on_behalf;
        repr.persist = self.persist;
        repr.non_temporal = self.non_temporal;
        repr
    }
}

/// One frame to the executor, checked; `admitted` says whether the peer
/// may be answered (no authentication, or it proved its key). Returns the
/// replies' bytes and whether the connection goes on.
fn send(server: &Scratch, session: &mut Session, admitted: bool, frame: &[u8]) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let flow = server.exec().handle_frame(session, frame, &mut out);
    let parsed = proto::parse_frame(frame);
    let breaks = matches!(&parsed, Err(e) if e.breaks_framing());
    assert_eq!(flow.is_err(), breaks, "{flow:?} for {parsed:?}");
    let header = Header::parse(frame).ok();
    let replies = sent_frames(&out);
    for reply in &replies {
        let (message, tag) = proto::parse_frame(reply).expect("sent_frames parsed it");
        if let Some(header) = header {
            assert_eq!(tag, header.tag, "a reply with another tag: {message:?}");
        }
        if !admitted {
            let nothing_given = match &message {
                Message::Response(r) => r.status != Status::Ok && r.payload.is_empty(),
                Message::Hello(_) | Message::AuthChallenge(_) | Message::AuthProof(_) => true,
                _ => false,
            };
            assert!(nothing_given, "answered before the proof: {message:?}");
        }
    }
    if let (Ok((Message::Request(req), _)), true) = (&parsed, admitted) {
        assert_eq!(
            replies.len(),
            1,
            "{req:?} answered with {} frames",
            replies.len()
        );
        let Ok((Message::Response(response), _)) = proto::parse_frame(replies[0]) else {
            panic!("{req:?} not answered with a response");
        };
        assert_eq!(
            response.kind,
            ResponseKind::answering(req.operation.opcode())
        );
        if response.status == Status::Ok && req.operation == Operation::Read {
            assert_eq!(response.payload.len(), req.length as usize, "{req:?}");
        } else {
            assert!(response.payload.is_empty(), "{req:?}: {response:?}");
        }
    }
    let goes_on = matches!(flow, Ok(Flow::Continue));
    (out, goes_on)
}

/// The status and payload of the one response in `out`.
fn answer(out: &[u8]) -> (Status, Vec<u8>) {
    match proto::parse_frame(out) {
        Ok((Message::Response(r), _)) => (r.status, r.payload.to_vec()),
        other => panic!("not one response: {other:?}"),
    }
}

fuzz_target!(|input: Input| {
    let server = scratch::scratch(input.setup);
    // Only the opening proves a peer: the steps cannot forge a proof.
    let admitted = match (input.setup, input.who) {
        (Setup::Open | Setup::Allocator, _) => true,
        (Setup::Gated, who) => who.is_some_and(Who::holds_a_known_key),
    };
    let mut session = match (input.setup, input.who) {
        (Setup::Gated, Some(who)) => {
            let outcome = handshake::play(
                server.exec(),
                who,
                false,
                [5; 32],
                &mut std::iter::empty::<Tamper>(),
            );
            if outcome.closed {
                return;
            }
            assert_eq!(outcome.session.admits(), admitted, "{who:?}");
            outcome.session
        }
        _ => server.exec().new_session(),
    };
    for step in &input.steps {
        let (frame, spec) = match step {
            Step::Request(spec) => {
                let req = spec.request(server);
                let Ok(frame) = Message::Request(req).encode_to_vec(spec.tag) else {
                    continue;
                };
                (frame, Some((spec, req)))
            }
            Step::Hello { who, tag } => {
                let (role, name, _) = who.credentials();
                let hello = Message::Hello(hello::Repr {
                    version: proto::PROTOCOL_VERSION,
                    role,
                    capabilities: Capabilities::NONE,
                    name,
                });
                (hello.encode_to_vec(*tag).expect("a HELLO encodes"), None)
            }
            Step::Piece(piece) => (piece.to_bytes(), None),
        };
        let (out, goes_on) = send(server, &mut session, admitted, &frame);
        if !goes_on {
            return;
        }
        let Some((spec, req)) = spec.filter(|_| admitted) else {
            continue;
        };
        let (status, _) = answer(&out);
        let once = req.exactly_once.is_some()
            && matches!(req.operation, Operation::CompareSwap | Operation::FetchAdd);
        if spec.twice && once {
            let (again, _) = send(server, &mut session, admitted, &frame);
            assert_eq!(
                again, out,
                "a retried exactly-once {req:?} got another answer"
            );
        }
        if status == Status::Ok && req.operation.carries_payload() {
            let read = request::Repr {
                on_behalf: req.on_behalf,
                ..request::Repr::read(req.target, req.key, req.length)
            };
            let frame = Message::Request(read)
                .encode_to_vec(spec.tag)
                .expect("a READ of what was written encodes");
            let (out, _) = send(server, &mut session, admitted, &frame);
            if let (Status::Ok, data) = answer(&out) {
                assert_eq!(data, req.payload, "{req:?} does not read back");
            }
        }
    }
});
