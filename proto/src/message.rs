//! Whole frames: every message kind in one enum, parsing and emitting a frame,
//! and the error replies a daemon sends for frames it cannot serve.

use crate::error::{Error, Result};
use crate::frame::{self, HEADER_LEN, Header, MAX_BODY_LEN};
use crate::opcode::Opcode;
use crate::request::{self, Operation};
use crate::response::{self, ResponseKind};
use crate::status::Status;
use crate::{RegionIndex, auth, block_sums, hello, map, ping, qp, scrub};

/// Any message of the protocol: the body of one frame, typed by its opcode.
///
/// The frame's tag travels beside it (see [`parse_frame`], [`Message::emit`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Message<'a> {
    /// A one-sided operation; the opcode is `operation.opcode()`.
    Request(request::Repr<'a>),
    /// An answer to a request; the opcode is `kind.opcode()`.
    Response(response::Repr<'a>),
    /// Connection handshake.
    Hello(hello::Repr<'a>),
    /// Ask for the address map (empty body).
    MapRequest,
    /// The address map.
    Map(map::Repr),
    /// Liveness probe with an opaque value.
    Ping(u64),
    /// Answer to a PING, echoing its value.
    Pong(u64),
    /// Set up a RoCEv2 queue pair with the client's end.
    QpConnect(qp::Connect),
    /// The device's end of a new queue pair and its R_Keys.
    QpAccept(qp::Accept<'a>),
    /// The listener's nonce for the connecting principal to prove.
    AuthChallenge([u8; auth::NONCE_LEN]),
    /// A proof of knowing the connecting principal's key.
    AuthProof(auth::Proof),
    /// Replace the key of the region with this index; answered with an
    /// ACKNOWLEDGE. Only an operator may ask.
    RotateKey(RegionIndex),
    /// Check a run of a region's blocks against their recorded checksums;
    /// answered with a SCRUB_REPORT (or an ACKNOWLEDGE with an error).
    /// Only an operator may ask.
    Scrub(scrub::Repr),
    /// What a SCRUB found.
    ScrubReport(scrub::Report),
    /// The epoch of the cluster map the connecting peer runs from now on
    /// (0: it follows no map). Answered with an ACKNOWLEDGE whose value is
    /// the listener's epoch: `OK` when the listener's is not newer,
    /// `STALE_MAP` when it is.
    MapEpoch(u64),
    /// Ask for the checksums of a run of a region copy's blocks as they are
    /// now; answered with a BLOCK_SUMS_REPORT (or an ACKNOWLEDGE with an
    /// error). Only an operator or a fabric device may ask.
    BlockSums(block_sums::Repr),
    /// The checksums a BLOCK_SUMS asked for.
    BlockSumsReport(block_sums::Report),
}

impl<'a> Message<'a> {
    /// The frame opcode of this message.
    pub fn opcode(&self) -> Opcode {
        match self {
            Message::Request(r) => r.operation.opcode(),
            Message::Response(r) => r.kind.opcode(),
            Message::Hello(_) => Opcode::Hello,
            Message::MapRequest => Opcode::MapRequest,
            Message::Map(_) => Opcode::Map,
            Message::Ping(_) => Opcode::Ping,
            Message::Pong(_) => Opcode::Pong,
            Message::QpConnect(_) => Opcode::QpConnect,
            Message::QpAccept(_) => Opcode::QpAccept,
            Message::AuthChallenge(_) => Opcode::AuthChallenge,
            Message::AuthProof(_) => Opcode::AuthProof,
            Message::RotateKey(_) => Opcode::RotateKey,
            Message::Scrub(_) => Opcode::Scrub,
            Message::ScrubReport(_) => Opcode::ScrubReport,
            Message::MapEpoch(_) => Opcode::MapEpoch,
            Message::BlockSums(_) => Opcode::BlockSums,
            Message::BlockSumsReport(_) => Opcode::BlockSumsReport,
        }
    }

    /// Whether a listener receives this message from the peer that
    /// connected to it ([`Opcode::listener_receives`]); a listener drops
    /// the others (answers only a listener sends) unanswered.
    pub fn listener_receives(&self) -> bool {
        self.opcode().listener_receives()
    }

    /// Parses a frame's body according to its opcode (checking the frame
    /// first, so an unchecked packet is fine too).
    ///
    /// An unknown opcode gives [`Error::UnknownOpcode`] with the frame's tag;
    /// answer it with [`unsupported_reply`]. Any other error leaves the
    /// stream framed: answer with [`reply_to_malformed`] and carry on.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(frame: &frame::Packet<&'a T>) -> Result<Message<'a>> {
        frame.check_len()?;
        let body = frame.body();
        let opcode = frame.opcode();
        if let Some(operation) = Operation::from_opcode(opcode) {
            let packet = request::Packet::new_checked(body)?;
            return request::Repr::parse(&packet, operation).map(Message::Request);
        }
        if let Some(kind) = ResponseKind::from_opcode(opcode) {
            let packet = response::Packet::new_checked(body)?;
            return response::Repr::parse(&packet, kind).map(Message::Response);
        }
        match opcode {
            Opcode::Hello => {
                hello::Repr::parse(&hello::Packet::new_checked(body)?).map(Message::Hello)
            }
            Opcode::MapRequest if body.is_empty() => Ok(Message::MapRequest),
            Opcode::MapRequest => Err(Error::LengthMismatch {
                what: "map request body",
                expected: 0,
                got: body.len(),
            }),
            Opcode::Map => map::Repr::parse(&map::Packet::new_checked(body)?).map(Message::Map),
            Opcode::Ping => Ok(Message::Ping(
                ping::Repr::parse(&ping::Packet::new_checked(body)?)?.value,
            )),
            Opcode::Pong => Ok(Message::Pong(
                ping::Repr::parse(&ping::Packet::new_checked(body)?)?.value,
            )),
            Opcode::QpConnect => qp::Connect::parse(body).map(Message::QpConnect),
            Opcode::QpAccept => qp::Accept::parse(body).map(Message::QpAccept),
            Opcode::AuthChallenge => auth::parse_challenge(body).map(Message::AuthChallenge),
            Opcode::AuthProof => auth::Proof::parse(body).map(Message::AuthProof),
            Opcode::RotateKey => {
                let region = ping::Repr::parse(&ping::Packet::new_checked(body)?)?.value;
                u32::try_from(region)
                    .map(|r| Message::RotateKey(RegionIndex(r)))
                    .map_err(|_| Error::ReservedBits {
                        what: "rotate key region high bits",
                        value: region >> 32,
                    })
            }
            Opcode::Scrub => {
                scrub::Repr::parse(&scrub::Packet::new_checked(body)?).map(Message::Scrub)
            }
            Opcode::ScrubReport => scrub::Report::parse(&scrub::ReportPacket::new_checked(body)?)
                .map(Message::ScrubReport),
            Opcode::MapEpoch => Ok(Message::MapEpoch(
                ping::Repr::parse(&ping::Packet::new_checked(body)?)?.value,
            )),
            Opcode::BlockSums => block_sums::Repr::parse(&block_sums::Packet::new_checked(body)?)
                .map(Message::BlockSums),
            Opcode::BlockSumsReport => {
                block_sums::Report::parse(&block_sums::ReportPacket::new_checked(body)?)
                    .map(Message::BlockSumsReport)
            }
            other => Err(Error::UnknownOpcode {
                opcode: other.into(),
                tag: frame.tag(),
            }),
        }
    }

    /// Length of the body this message encodes to.
    pub fn body_len(&self) -> usize {
        match self {
            Message::Request(r) => r.buffer_len(),
            Message::Response(r) => r.buffer_len(),
            Message::Hello(h) => h.buffer_len(),
            Message::MapRequest => 0,
            Message::Map(m) => m.buffer_len(),
            Message::Ping(_) | Message::Pong(_) | Message::RotateKey(_) | Message::MapEpoch(_) => {
                ping::HEADER_LEN
            }
            Message::QpConnect(c) => c.buffer_len(),
            Message::QpAccept(a) => a.buffer_len(),
            Message::AuthChallenge(_) => auth::NONCE_LEN,
            Message::AuthProof(_) => auth::PROOF_LEN,
            Message::Scrub(s) => s.buffer_len(),
            Message::ScrubReport(r) => r.buffer_len(),
            Message::BlockSums(b) => b.buffer_len(),
            Message::BlockSumsReport(r) => r.buffer_len(),
        }
    }

    /// Length of the frame this message encodes to, header included.
    pub fn frame_len(&self) -> usize {
        HEADER_LEN + self.body_len()
    }

    /// Checks that this message encodes to a frame [`Message::parse`] accepts:
    /// the per-message rules and the body limit [`MAX_BODY_LEN`].
    pub fn check(&self) -> Result<()> {
        match self {
            Message::Request(r) => r.check()?,
            Message::Response(r) => r.check()?,
            Message::Hello(h) => h.check()?,
            Message::Scrub(s) => s.check()?,
            Message::BlockSums(b) => b.check()?,
            Message::BlockSumsReport(r) => r.check()?,
            Message::MapRequest
            | Message::Map(_)
            | Message::Ping(_)
            | Message::Pong(_)
            | Message::QpConnect(_)
            | Message::QpAccept(_)
            | Message::AuthChallenge(_)
            | Message::AuthProof(_)
            | Message::RotateKey(_)
            | Message::MapEpoch(_)
            | Message::ScrubReport(_) => {}
        }
        let body_len = self.body_len();
        if body_len > MAX_BODY_LEN as usize {
            return Err(Error::Oversize {
                claimed: body_len as u64,
                limit: MAX_BODY_LEN.into(),
            });
        }
        Ok(())
    }

    /// Writes this message as one frame with `tag` at the start of `buf`;
    /// returns the frame length.
    ///
    /// Fails without writing if [`Message::check`] fails or `buf` is shorter
    /// than [`Message::frame_len`] (`Truncated`).
    pub fn emit(&self, tag: u64, buf: &mut [u8]) -> Result<usize> {
        self.check()?;
        let len = self.frame_len();
        let got = buf.len();
        let Some(buf) = buf.get_mut(..len) else {
            return Err(Error::Truncated { needed: len, got });
        };
        let header = Header {
            opcode: self.opcode(),
            // `check` bounded the body by MAX_BODY_LEN, a u32.
            body_len: u32::try_from(self.body_len()).unwrap_or(u32::MAX),
            tag,
        };
        let (head, body) = buf.split_at_mut(HEADER_LEN);
        header.emit(&mut frame::Packet::new_unchecked(head));
        match self {
            Message::Request(r) => r.emit(&mut request::Packet::new_unchecked(body)),
            Message::Response(r) => r.emit(&mut response::Packet::new_unchecked(body)),
            Message::Hello(h) => h.emit(&mut hello::Packet::new_unchecked(body)),
            Message::MapRequest => {}
            Message::Map(m) => m.emit(&mut map::Packet::new_unchecked(body)),
            Message::Ping(value) | Message::Pong(value) | Message::MapEpoch(value) => {
                ping::Repr { value: *value }.emit(&mut ping::Packet::new_unchecked(body))
            }
            Message::QpConnect(c) => c.emit(body),
            Message::QpAccept(a) => a.emit(body),
            Message::AuthChallenge(nonce) => body.copy_from_slice(nonce),
            Message::AuthProof(proof) => proof.emit(body),
            Message::RotateKey(region) => ping::Repr {
                value: u64::from(region.0),
            }
            .emit(&mut ping::Packet::new_unchecked(body)),
            Message::Scrub(s) => s.emit(&mut scrub::Packet::new_unchecked(body)),
            Message::ScrubReport(r) => r.emit(&mut scrub::ReportPacket::new_unchecked(body)),
            Message::BlockSums(b) => b.emit(&mut block_sums::Packet::new_unchecked(body)),
            Message::BlockSumsReport(r) => {
                r.emit(&mut block_sums::ReportPacket::new_unchecked(body))
            }
        }
        Ok(len)
    }

    /// Appends this message as one frame with `tag` to `out` (e.g. a
    /// connection's send buffer); leaves `out` unchanged on error.
    pub fn encode_into(&self, tag: u64, out: &mut Vec<u8>) -> Result<()> {
        self.check()?;
        let at = out.len();
        out.resize(at + self.frame_len(), 0);
        let result = self.emit(tag, &mut out[at..]).map(drop);
        if result.is_err() {
            out.truncate(at);
        }
        result
    }

    /// This message as one frame with `tag`, in a new vector.
    pub fn encode_to_vec(&self, tag: u64) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.encode_into(tag, &mut out)?;
        Ok(out)
    }
}

/// Parses a buffer holding exactly one frame into its message and tag.
///
/// Header errors (`Truncated`, `BadMagic`, `BadVersion`, `Oversize`) come
/// first; bytes past the frame the header announces are a `LengthMismatch`;
/// then the body is parsed by [`Message::parse`].
pub fn parse_frame(buf: &[u8]) -> Result<(Message<'_>, u64)> {
    let frame = frame::Packet::new_checked(buf)?;
    if frame.frame_len() != buf.len() {
        return Err(Error::LengthMismatch {
            what: "frame",
            expected: frame.frame_len(),
            got: buf.len(),
        });
    }
    let message = Message::parse(&frame)?;
    Ok((message, frame.tag()))
}

/// Length of the frames built by [`error_reply`].
pub const ERROR_REPLY_LEN: usize = HEADER_LEN + response::HEADER_LEN;

/// The response to a request (or control message) with `opcode` and `tag`
/// that failed with `status`.
///
/// The opcode is `opcode.response_opcode()`: READ_RESPONSE for READ,
/// ATOMIC_ACKNOWLEDGE for COMPARE_SWAP / FETCH_ADD, ACKNOWLEDGE otherwise; no
/// value, no data.
pub fn error_response(opcode: Opcode, status: Status) -> Message<'static> {
    Message::Response(response::Repr::error(opcode, status))
}

/// [`error_response`] encoded as a frame with `tag`, without allocating.
pub fn error_reply(opcode: Opcode, tag: u64, status: Status) -> [u8; ERROR_REPLY_LEN] {
    let mut out = [0; ERROR_REPLY_LEN];
    let (head, body) = out.split_at_mut(HEADER_LEN);
    let header = Header {
        opcode: opcode.response_opcode(),
        body_len: response::HEADER_LEN as u32,
        tag,
    };
    header.emit(&mut frame::Packet::new_unchecked(head));
    response::Repr::error(opcode, status).emit(&mut response::Packet::new_unchecked(body));
    out
}

/// The ACKNOWLEDGE with `UNSUPPORTED` answering [`Error::UnknownOpcode`].
pub fn unsupported_reply(opcode: u8, tag: u64) -> [u8; ERROR_REPLY_LEN] {
    error_reply(Opcode::from(opcode), tag, Status::Unsupported)
}

/// The reply to a frame that failed to parse with `error`, if one is due.
///
/// `frame` is the frame's bytes (as the decoder yielded them). Gives the
/// error response with [`Error::status`] (`UNSUPPORTED` for an unknown
/// opcode, `BAD_REQUEST` for a malformed body) and the frame's tag. Gives
/// `None` when the header itself is broken ([`Error::breaks_framing`]: close
/// the connection instead) and for responses and PONGs, which are never
/// answered.
pub fn reply_to_malformed(frame: &[u8], error: &Error) -> Option<[u8; ERROR_REPLY_LEN]> {
    if error.breaks_framing() {
        return None;
    }
    let header = Header::parse(frame).ok()?;
    if header.opcode.is_response() || header.opcode == Opcode::Pong {
        return None;
    }
    Some(error_reply(header.opcode, header.tag, error.status()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Target;
    use crate::{AccessKey, PmemAddr, RegionIndex, RegionOffset, block_report};

    // READ of 4096 bytes at PMEM address 0x2000, key 9, tag 77.
    const READ_FRAME: [u8; 72] = [
        0x50, 0x46, 0x01, 0x0C, // magic, version, READ
        0x38, 0x00, 0x00, 0x00, // body_len 56
        0x4D, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // tag 77
        0x00, 0x00, 0x00, 0x00, // flags, reserved
        0x00, 0x00, 0x00, 0x00, // region
        0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // addr
        0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // key
        0x00, 0x10, 0x00, 0x00, // length
        0x00, 0x00, 0x00, 0x00, // client
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // seq
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // operand
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // compare
    ];

    fn read() -> Message<'static> {
        Message::Request(request::Repr::read(
            Target::Pmem(PmemAddr(0x2000)),
            AccessKey(9),
            4096,
        ))
    }

    #[test]
    fn parse_and_emit_a_request_frame() {
        assert_eq!(parse_frame(&READ_FRAME), Ok((read(), 77)));
        assert_eq!(read().encode_to_vec(77).unwrap(), READ_FRAME);
        let mut buf = [0u8; 100];
        assert_eq!(read().emit(77, &mut buf), Ok(72));
        assert_eq!(buf[..72], READ_FRAME);
    }

    #[test]
    fn ping_map_request_and_pong_frames() {
        let ping = [
            0x50, 0x46, 0x01, 0xE3, 0x08, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, //
            0x2A, 0, 0, 0, 0, 0, 0, 0,
        ];
        assert_eq!(parse_frame(&ping), Ok((Message::Ping(42), 1)));
        let mut pong = ping;
        pong[3] = 0xE4;
        assert_eq!(Message::Pong(42).encode_to_vec(1).unwrap(), pong);
        let map_request = [0x50, 0x46, 0x01, 0xE1, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(parse_frame(&map_request), Ok((Message::MapRequest, 5)));
        assert_eq!(Message::MapRequest.encode_to_vec(5).unwrap(), map_request);
    }

    #[test]
    fn rotate_key_frames_name_a_region_below_two_to_the_32() {
        let mut rotate = [
            0x50, 0x46, 0x01, 0xE9, 0x08, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, //
            0x07, 0, 0, 0, 0, 0, 0, 0,
        ];
        let message = Message::RotateKey(RegionIndex(7));
        assert_eq!(parse_frame(&rotate), Ok((message.clone(), 3)));
        assert_eq!(message.encode_to_vec(3).unwrap(), rotate);
        rotate[20] = 1;
        assert!(matches!(
            parse_frame(&rotate),
            Err(Error::ReservedBits { value: 1, .. })
        ));
    }

    #[test]
    fn scrub_and_report_frames_round_trip() {
        let ask = Message::Scrub(scrub::Repr {
            region: 4,
            first: 1,
            blocks: 1024,
        });
        let frame = ask.encode_to_vec(9).unwrap();
        assert_eq!(&frame[..4], [0x50, 0x46, 0x01, 0xEA]);
        assert_eq!(parse_frame(&frame), Ok((ask, 9)));
        let report = Message::ScrubReport(scrub::Report {
            head: block_report::Head {
                region: 4,
                block_len: 65536,
                first: 1,
                total: 2048,
            },
            verified: 1000,
            recorded: 23,
            unwatched: 0,
            mismatches: vec![77],
        });
        let frame = report.encode_to_vec(9).unwrap();
        assert_eq!(frame[3], 0xEB);
        assert_eq!(parse_frame(&frame), Ok((report, 9)));
        // A SCRUB asking for too many blocks is not emitted.
        let too_many = Message::Scrub(scrub::Repr {
            region: 4,
            first: 0,
            blocks: scrub::MAX_BLOCKS + 1,
        });
        assert!(too_many.encode_to_vec(1).is_err());
    }

    #[test]
    fn block_sums_and_report_frames_round_trip() {
        let ask = Message::BlockSums(block_sums::Repr {
            region: 2,
            first: 5,
            blocks: 3,
        });
        let frame = ask.encode_to_vec(4).unwrap();
        assert_eq!(&frame[..4], [0x50, 0x46, 0x01, 0xED]);
        assert_eq!(parse_frame(&frame), Ok((ask, 4)));
        let report = Message::BlockSumsReport(block_sums::Report {
            head: block_report::Head {
                region: 2,
                block_len: 65536,
                first: 5,
                total: 16,
            },
            sums: vec![1 << 32, 7 | 1 << 32, 9 | 1 << 32],
        });
        let frame = report.encode_to_vec(4).unwrap();
        assert_eq!(frame[3], 0xEE);
        assert_eq!(parse_frame(&frame), Ok((report, 4)));
        // Runs longer than the limit are neither asked for nor answered.
        let too_many = Message::BlockSums(block_sums::Repr {
            region: 2,
            first: 0,
            blocks: block_sums::MAX_BLOCKS + 1,
        });
        assert!(too_many.encode_to_vec(1).is_err());
        let too_long = Message::BlockSumsReport(block_sums::Report {
            sums: vec![1; block_sums::MAX_BLOCKS as usize + 1],
            ..block_sums::Report::default()
        });
        assert!(too_long.encode_to_vec(1).is_err());
    }

    #[test]
    fn rejects_lying_body_len() {
        // Longer than the buffer.
        assert_eq!(
            parse_frame(&READ_FRAME[..71]),
            Err(Error::Truncated {
                needed: 72,
                got: 71
            })
        );
        // Shorter than the buffer.
        let mut extra = READ_FRAME.to_vec();
        extra.push(0);
        assert_eq!(
            parse_frame(&extra),
            Err(Error::LengthMismatch {
                what: "frame",
                expected: 72,
                got: 73
            })
        );
        // Shorter than the request's fixed part.
        let mut short = READ_FRAME[..16 + 40].to_vec();
        short[4] = 40;
        assert_eq!(
            parse_frame(&short),
            Err(Error::Truncated {
                needed: 56,
                got: 40
            })
        );
        // A MAP_REQUEST with a body.
        let mut map_request = READ_FRAME;
        map_request[3] = 0xE1;
        assert!(matches!(
            parse_frame(&map_request),
            Err(Error::LengthMismatch {
                what: "map request body",
                ..
            })
        ));
    }

    #[test]
    fn unknown_opcode_is_answered_unsupported() {
        let mut frame = READ_FRAME;
        frame[3] = 0x99;
        let error = parse_frame(&frame).unwrap_err();
        assert_eq!(
            error,
            Error::UnknownOpcode {
                opcode: 0x99,
                tag: 77
            }
        );
        let Error::UnknownOpcode { opcode, tag } = error else {
            unreachable!()
        };
        let reply = unsupported_reply(opcode, tag);
        let (message, reply_tag) = parse_frame(&reply).unwrap();
        assert_eq!(reply_tag, 77);
        assert_eq!(
            message,
            Message::Response(response::Repr::ack(Status::Unsupported))
        );
        assert_eq!(reply_to_malformed(&frame, &error), Some(reply));
    }

    #[test]
    fn error_reply_matches_the_request() {
        let reply = error_reply(Opcode::Read, 5, Status::OutOfBounds);
        let (message, tag) = parse_frame(&reply).unwrap();
        assert_eq!(tag, 5);
        assert_eq!(message, error_response(Opcode::Read, Status::OutOfBounds));
        assert_eq!(message.opcode(), Opcode::ReadResponse);
        assert_eq!(
            error_response(Opcode::Read, Status::OutOfBounds)
                .encode_to_vec(5)
                .unwrap(),
            reply
        );
        let reply = error_reply(Opcode::FetchAdd, 6, Status::AccessDenied);
        assert_eq!(
            parse_frame(&reply).unwrap().0.opcode(),
            Opcode::AtomicAcknowledge
        );
        let reply = error_reply(Opcode::Hello, 7, Status::VersionMismatch);
        assert_eq!(
            parse_frame(&reply),
            Ok((
                Message::Response(response::Repr::ack(Status::VersionMismatch)),
                7
            ))
        );
    }

    #[test]
    fn malformed_bodies_get_bad_request() {
        let mut frame = READ_FRAME;
        frame[16] = 0x80; // an undefined flag bit
        let error = parse_frame(&frame).unwrap_err();
        assert!(matches!(error, Error::ReservedBits { .. }));
        let reply = reply_to_malformed(&frame, &error).unwrap();
        assert_eq!(
            parse_frame(&reply),
            Ok((error_response(Opcode::Read, Status::BadRequest), 77))
        );
        // Broken headers and responses are not answered.
        let mut bad = READ_FRAME;
        bad[0] = 0;
        let error = parse_frame(&bad).unwrap_err();
        assert_eq!(reply_to_malformed(&bad, &error), None);
        let mut response = READ_FRAME;
        response[3] = 0x11;
        let error = parse_frame(&response).unwrap_err();
        assert_eq!(reply_to_malformed(&response, &error), None);
    }

    #[test]
    fn parse_checks_unchecked_frames() {
        let short = frame::Packet::new_unchecked(&READ_FRAME[..40]);
        assert_eq!(
            Message::parse(&short),
            Err(Error::Truncated {
                needed: 72,
                got: 40
            })
        );
        let checked = frame::Packet::new_checked(&READ_FRAME[..]).unwrap();
        assert_eq!(Message::parse(&checked), Ok(read()));
    }

    #[test]
    fn emit_checks_before_writing() {
        let mut buf = [0xEEu8; 71];
        assert_eq!(
            read().emit(1, &mut buf),
            Err(Error::Truncated {
                needed: 72,
                got: 71
            })
        );
        assert!(buf.iter().all(|&b| b == 0xEE));
        let inconsistent = Message::Request(request::Repr {
            length: 3,
            ..request::Repr::write(
                Target::Region(RegionOffset::new(RegionIndex(1), 0)),
                AccessKey::NONE,
                b"ab",
            )
        });
        let mut out = vec![1, 2, 3];
        assert!(matches!(
            inconsistent.encode_into(1, &mut out),
            Err(Error::LengthMismatch { .. })
        ));
        assert_eq!(out, [1, 2, 3]);
        let huge = vec![0u8; MAX_BODY_LEN as usize];
        let too_long = Message::Response(response::Repr::read_data(&huge));
        assert!(matches!(
            too_long.encode_to_vec(1),
            Err(Error::DataTooLong { .. })
        ));
        let too_many = Message::Map(map::Repr {
            entries: vec![
                map::MapEntry {
                    start: PmemAddr(0),
                    len: 0,
                    region: RegionIndex(0),
                    server: 0,
                    socket: 0,
                    key: AccessKey::NONE,
                };
                MAX_BODY_LEN as usize / map::ENTRY_LEN + 1
            ],
            ..map::Repr::default()
        });
        assert!(matches!(
            too_many.encode_to_vec(1),
            Err(Error::Oversize { .. })
        ));
    }

    #[test]
    fn largest_write_fits_one_frame() {
        let data = vec![0xA5u8; crate::frame::MAX_DATA_LEN as usize];
        let write = Message::Request(request::Repr::write_persist(
            Target::Pmem(PmemAddr(0)),
            AccessKey(1),
            &data,
        ));
        let frame = write.encode_to_vec(3).unwrap();
        let (parsed, tag) = parse_frame(&frame).unwrap();
        assert_eq!((parsed, tag), (write, 3));
    }
}
