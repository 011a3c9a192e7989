//! Property tests over whole frames: emit→parse is the identity, arbitrary
//! bytes never panic, accepted frames re-encode to the same bytes, and the
//! decoder frames any split of a valid stream identically, whether the bytes
//! are fed or read from a reader.

use std::collections::VecDeque;
use std::io::{self, Read};

use proptest::prelude::*;
use proto::AccessKey;
use proto::decoder::{ReadError, ReadOutcome};
use proto::frame::{self, HEADER_LEN, MAX_DATA_LEN};
use proto::hello::{self, Capabilities, Role};
use proto::map::{self, MapEntry};
use proto::request::{self, ExactlyOnce, Operation, Target};
use proto::response::{self, ResponseKind};
use proto::{
    Error, FrameDecoder, Message, Opcode, PmemAddr, RegionIndex, RegionOffset, Status, parse_frame,
    reply_to_malformed,
};

/// An owned description of a message, from which a borrowing `Message` is built.
#[derive(Debug, Clone)]
enum Spec {
    Request {
        operation: Operation,
        target: Target,
        key: u64,
        length: u32,
        exactly_once: Option<ExactlyOnce>,
        persist: bool,
        non_temporal: bool,
        operand: u64,
        compare: u64,
        payload: Vec<u8>,
    },
    Response {
        kind: ResponseKind,
        status: Status,
        value: u64,
        payload: Vec<u8>,
    },
    Hello {
        version: u16,
        role: Role,
        capabilities: Capabilities,
        name: String,
    },
    MapRequest,
    Map(map::Repr),
    Ping(u64),
    Pong(u64),
}

impl Spec {
    fn message(&self) -> Message<'_> {
        match self {
            Spec::Request {
                operation,
                target,
                key,
                length,
                exactly_once,
                persist,
                non_temporal,
                operand,
                compare,
                payload,
            } => Message::Request(request::Repr {
                operation: *operation,
                target: *target,
                key: AccessKey(*key),
                length: *length,
                exactly_once: *exactly_once,
                on_behalf: None,
                persist: *persist,
                non_temporal: *non_temporal,
                operand: *operand,
                compare: *compare,
                payload,
            }),
            Spec::Response {
                kind,
                status,
                value,
                payload,
            } => Message::Response(response::Repr {
                kind: *kind,
                status: *status,
                value: *value,
                payload,
            }),
            Spec::Hello {
                version,
                role,
                capabilities,
                name,
            } => Message::Hello(hello::Repr {
                version: *version,
                role: *role,
                capabilities: *capabilities,
                name,
            }),
            Spec::MapRequest => Message::MapRequest,
            Spec::Map(repr) => Message::Map(repr.clone()),
            Spec::Ping(v) => Message::Ping(*v),
            Spec::Pong(v) => Message::Pong(*v),
        }
    }
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        any::<u64>().prop_map(|a| Target::Pmem(PmemAddr(a))),
        (any::<u32>(), any::<u64>())
            .prop_map(|(r, o)| Target::Region(RegionOffset::new(RegionIndex(r), o))),
    ]
}

fn request() -> impl Strategy<Value = Spec> {
    (
        proptest::sample::select(Operation::ALL.to_vec()),
        target(),
        any::<u64>(),
        any::<u32>(),
        proptest::option::of(
            (any::<u32>(), any::<u64>()).prop_map(|(client, seq)| ExactlyOnce { client, seq }),
        ),
        any::<(bool, bool)>(),
        any::<(u64, u64)>(),
        proptest::collection::vec(any::<u8>(), 0..4096),
    )
        .prop_map(
            |(operation, target, key, length, exactly_once, flags, values, payload)| {
                let (length, payload) = match operation {
                    Operation::Write | Operation::WritePersist => (payload.len() as u32, payload),
                    Operation::Read => (length % (MAX_DATA_LEN + 1), Vec::new()),
                    Operation::Flush => (length, Vec::new()),
                    _ => (request::ATOMIC_LEN, Vec::new()),
                };
                Spec::Request {
                    operation,
                    target,
                    key,
                    length,
                    exactly_once,
                    persist: flags.0,
                    non_temporal: flags.1,
                    operand: values.0,
                    compare: values.1,
                    payload,
                }
            },
        )
}

fn response() -> impl Strategy<Value = Spec> {
    (
        proptest::sample::select(ResponseKind::ALL.to_vec()),
        any::<u16>().prop_map(Status::from),
        any::<u64>(),
        proptest::collection::vec(any::<u8>(), 0..4096),
    )
        .prop_map(|(kind, status, value, mut payload)| {
            if kind != ResponseKind::ReadResponse {
                payload.clear();
            }
            Spec::Response {
                kind,
                status,
                value,
                payload,
            }
        })
}

fn hello() -> impl Strategy<Value = Spec> {
    (
        any::<u16>(),
        any::<u8>().prop_map(Role::from),
        any::<u64>().prop_map(Capabilities),
        // At most 60 characters of at most 4 bytes: within the 255-byte limit.
        "\\PC{0,60}",
    )
        .prop_map(|(version, role, capabilities, name)| Spec::Hello {
            version,
            role,
            capabilities,
            name,
        })
}

fn map() -> impl Strategy<Value = Spec> {
    let entry = (
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        any::<u16>(),
        any::<u16>(),
        any::<u64>(),
    )
        .prop_map(|(start, len, region, server, socket, key)| MapEntry {
            start: PmemAddr(start),
            len,
            region: RegionIndex(region),
            server,
            socket,
            key: AccessKey(key),
        });
    (
        any::<[u8; 32]>(),
        any::<u64>(),
        proptest::collection::vec(entry, 0..64),
    )
        .prop_map(|(digest, extent_size, entries)| {
            Spec::Map(map::Repr {
                digest,
                extent_size,
                entries,
            })
        })
}

fn spec() -> impl Strategy<Value = Spec> {
    prop_oneof![
        3 => request(),
        2 => response(),
        1 => hello(),
        1 => Just(Spec::MapRequest),
        1 => map(),
        1 => any::<u64>().prop_map(Spec::Ping),
        1 => any::<u64>().prop_map(Spec::Pong),
    ]
}

/// Asserts that `bytes` either fails to parse or re-encodes to itself.
fn assert_canonical(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Ok((message, tag)) = parse_frame(bytes) {
        let again = message.encode_to_vec(tag);
        prop_assert_eq!(again.as_deref(), Ok(bytes));
    }
    Ok(())
}

/// Feeds `chunks` through a decoder, draining after every feed.
fn decode(decoder: &mut FrameDecoder, chunks: &[&[u8]]) -> (Vec<Vec<u8>>, Option<Error>) {
    let mut frames = Vec::new();
    for chunk in chunks {
        let mut chunk = *chunk;
        loop {
            let used = match decoder.feed(chunk) {
                Ok(used) => used,
                Err(_) => {
                    // Drain what was completed before the bad header.
                    loop {
                        match decoder.next_frame() {
                            Ok(Some(frame)) => frames.push(frame.to_vec()),
                            Ok(None) => unreachable!("a failed decoder ends with its error"),
                            Err(e) => return (frames, Some(e)),
                        }
                    }
                }
            };
            chunk = &chunk[used..];
            while let Ok(Some(frame)) = decoder.next_frame() {
                frames.push(frame.to_vec());
            }
            assert!(decoder.buffered() <= decoder.capacity_limit());
            if chunk.is_empty() {
                break;
            }
        }
    }
    (frames, None)
}

/// Cuts `bytes` at the given (sorted, deduplicated) positions.
fn split<'a>(bytes: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut pieces = Vec::new();
    let mut at = 0;
    for cut in cuts {
        pieces.push(&bytes[at..cut]);
        at = cut;
    }
    pieces.push(&bytes[at..]);
    pieces
}

/// A reader handing out `pieces` in order, at most one piece (or what fits)
/// per read, optionally returning `WouldBlock` before each read that has
/// something; then the end of the stream.
struct Pieces<'a> {
    pieces: VecDeque<&'a [u8]>,
    would_block: bool,
    blocked: bool,
}

impl<'a> Pieces<'a> {
    fn new(pieces: Vec<&'a [u8]>, would_block: bool) -> Self {
        Pieces {
            pieces: pieces.into_iter().filter(|p| !p.is_empty()).collect(),
            would_block,
            blocked: false,
        }
    }
}

impl Read for Pieces<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(piece) = self.pieces.front_mut() else {
            return Ok(0);
        };
        if self.would_block && !self.blocked {
            self.blocked = true;
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.blocked = false;
        let n = piece.len().min(buf.len());
        buf[..n].copy_from_slice(&piece[..n]);
        *piece = &piece[n..];
        if piece.is_empty() {
            self.pieces.pop_front();
        }
        Ok(n)
    }
}

/// Reads `reader` through a decoder to its end, retrying on `WouldBlock`;
/// drains after every read if `drain_each`, else only when the decoder is
/// full or the reader blocks (like an event loop). Returns the frames and the
/// framing error, if any.
fn read_through(
    decoder: &mut FrameDecoder,
    reader: &mut impl Read,
    max: usize,
    drain_each: bool,
) -> (Vec<Vec<u8>>, Option<Error>) {
    let mut frames = Vec::new();
    loop {
        let outcome = decoder.read_from(reader, max);
        assert!(decoder.buffered() <= decoder.capacity_limit());
        let drain = drain_each || !matches!(outcome, Ok(ReadOutcome::Data(_)));
        let mut error = None;
        if drain {
            loop {
                match decoder.next_frame() {
                    Ok(Some(frame)) => frames.push(frame.to_vec()),
                    Ok(None) => break,
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
        }
        match outcome {
            Ok(ReadOutcome::Data(n)) => assert!(n >= 1 && n <= max.max(1)),
            Ok(ReadOutcome::Full) => assert!(!drain_each, "full although drained"),
            Ok(ReadOutcome::Eof) => return (frames, error),
            Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(ReadError::Io(e)) => panic!("{e}"),
            Err(ReadError::Framing(e)) => {
                assert_eq!(error.as_ref(), Some(&e));
                return (frames, Some(e));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn emit_then_parse_is_identity(spec in spec(), tag in any::<u64>()) {
        let message = spec.message();
        let bytes = message.encode_to_vec(tag).unwrap();
        prop_assert_eq!(bytes.len(), message.frame_len());
        let mut exact = vec![0u8; message.frame_len()];
        prop_assert_eq!(message.emit(tag, &mut exact), Ok(bytes.len()));
        prop_assert_eq!(&exact, &bytes);
        prop_assert_eq!(parse_frame(&bytes), Ok((message, tag)));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_frame(&bytes);
        assert_canonical(&bytes)?;
        let mut decoder = FrameDecoder::new();
        let _ = decode(&mut decoder, &[&bytes]);
    }

    #[test]
    fn arbitrary_bodies_never_panic(
        opcode in any::<u8>(),
        tag in any::<u64>(),
        body in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        let mut bytes = vec![0u8; HEADER_LEN + body.len()];
        frame::Header { opcode: Opcode::from(opcode), body_len: body.len() as u32, tag }
            .emit(&mut frame::Packet::new_unchecked(&mut bytes[..]));
        bytes[HEADER_LEN..].copy_from_slice(&body);
        match parse_frame(&bytes) {
            Ok((message, parsed_tag)) => {
                prop_assert_eq!(parsed_tag, tag);
                prop_assert_eq!(message.opcode(), Opcode::from(opcode));
                assert_canonical(&bytes)?;
            }
            Err(error) => {
                prop_assert!(!error.breaks_framing());
                if let Some(reply) = reply_to_malformed(&bytes, &error) {
                    let (reply, reply_tag) = parse_frame(&reply).unwrap();
                    prop_assert_eq!(reply_tag, tag);
                    let Message::Response(reply) = reply else {
                        panic!("error reply is not a response");
                    };
                    prop_assert_eq!(reply.status, error.status());
                    prop_assert_eq!(reply.kind.opcode(), Opcode::from(opcode).response_opcode());
                }
            }
        }
    }

    #[test]
    fn mutated_frames_never_panic(
        spec in spec(),
        tag in any::<u64>(),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
        cut in any::<usize>(),
    ) {
        let mut bytes = spec.message().encode_to_vec(tag).unwrap();
        for (at, value) in flips {
            let len = bytes.len();
            bytes[at % len] ^= value;
        }
        assert_canonical(&bytes)?;
        let truncated = &bytes[..cut % (bytes.len() + 1)];
        assert_canonical(truncated)?;
        let mut decoder = FrameDecoder::new();
        let _ = decode(&mut decoder, &[&bytes]);
    }

    #[test]
    fn decoder_frames_any_split_identically(
        specs in proptest::collection::vec(spec(), 1..8),
        cuts in proptest::collection::vec(any::<usize>(), 0..16),
    ) {
        let frames: Vec<Vec<u8>> = specs
            .iter()
            .enumerate()
            .map(|(tag, spec)| spec.message().encode_to_vec(tag as u64).unwrap())
            .collect();
        let stream = frames.concat();
        let mut decoder = FrameDecoder::new();
        let (decoded, error) = decode(&mut decoder, &split(&stream, &cuts));
        prop_assert_eq!(error, None);
        prop_assert_eq!(decoded, frames);
        prop_assert_eq!(decoder.buffered(), 0);
    }

    #[test]
    fn decoder_survives_arbitrary_chunks(
        bytes in proptest::collection::vec(any::<u8>(), 0..2048),
        cuts in proptest::collection::vec(any::<usize>(), 0..16),
        max_body_len in 0u32..1024,
    ) {
        // Start with a valid frame so the fuzzed tail gets past the magic sometimes.
        let mut stream = Message::Ping(1).encode_to_vec(1).unwrap();
        stream.extend_from_slice(&bytes);
        let mut decoder = FrameDecoder::with_max_body_len(max_body_len);
        let (frames, error) = decode(&mut decoder, &split(&stream, &cuts));
        for frame in &frames {
            prop_assert!(frame.len() <= HEADER_LEN + max_body_len as usize);
            prop_assert!(frame::Header::parse(frame).is_ok());
        }
        if let Some(error) = error {
            prop_assert!(error.breaks_framing());
        }
    }

    #[test]
    fn read_from_frames_any_split_like_feed(
        specs in proptest::collection::vec(spec(), 1..8),
        cuts in proptest::collection::vec(any::<usize>(), 0..16),
        max in prop_oneof![1usize..64, 64usize..100_000, Just(256 * 1024)],
        would_block in any::<bool>(),
        drain_each in any::<bool>(),
    ) {
        let frames: Vec<Vec<u8>> = specs
            .iter()
            .enumerate()
            .map(|(tag, spec)| spec.message().encode_to_vec(tag as u64).unwrap())
            .collect();
        let stream = frames.concat();
        let mut fed = FrameDecoder::new();
        let (by_feed, error) = decode(&mut fed, &split(&stream, &cuts));
        prop_assert_eq!(error, None);
        let mut read = FrameDecoder::new();
        let mut reader = Pieces::new(split(&stream, &cuts), would_block);
        let (by_read, error) = read_through(&mut read, &mut reader, max, drain_each);
        prop_assert_eq!(error, None);
        prop_assert_eq!(&by_read, &by_feed);
        prop_assert_eq!(&by_read, &frames);
        prop_assert_eq!(read.buffered(), 0);
    }

    #[test]
    fn read_from_matches_feed_on_arbitrary_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..2048),
        cuts in proptest::collection::vec(any::<usize>(), 0..16),
        max_body_len in 0u32..1024,
        max in prop_oneof![1usize..64, 64usize..4096, Just(256 * 1024)],
        would_block in any::<bool>(),
        drain_each in any::<bool>(),
    ) {
        // A few valid frames first, so the fuzzed tail gets past the magic sometimes.
        let mut stream = Message::Ping(1).encode_to_vec(1).unwrap();
        stream.extend(Message::MapRequest.encode_to_vec(2).unwrap());
        stream.extend(Message::Pong(3).encode_to_vec(3).unwrap());
        stream.extend_from_slice(&bytes);
        let mut fed = FrameDecoder::with_max_body_len(max_body_len);
        let by_feed = decode(&mut fed, &split(&stream, &cuts));
        let mut read = FrameDecoder::with_max_body_len(max_body_len);
        let mut reader = Pieces::new(split(&stream, &cuts), would_block);
        let by_read = read_through(&mut read, &mut reader, max, drain_each);
        prop_assert_eq!(&by_read, &by_feed);
        prop_assert_eq!(read.error(), by_read.1.as_ref());
        if by_read.1.is_some() {
            prop_assert!(read.buffered() <= HEADER_LEN);
        }
    }
}
