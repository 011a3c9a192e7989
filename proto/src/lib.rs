//! The pmem-fabric wire format.
//!
//! Zero-copy views (`Packet`) and parsed representations (`Repr`) of every
//! message, in the style of smoltcp's `wire` module, plus a sans-IO
//! [`FrameDecoder`] that splits a byte stream into frames. No sockets here.
//!
//! # Contract
//!
//! Untrusted bytes enter only through `Packet::new_checked` (or the helpers
//! built on it: [`parse_frame`], [`Message::parse`], [`FrameDecoder`]). Once
//! `new_checked` succeeds, no accessor of that packet panics, and a `Repr`
//! parsed from it borrows its payload instead of copying it. Nothing in this
//! crate panics on malformed input; every rejection is an [`Error`].
//! `Packet::new_unchecked` and the setters are for buffers the caller sized
//! (with `Repr::buffer_len`) and may panic on a short buffer.
//!
//! # Wire format
//!
//! All integers are little-endian. A connection carries frames back to back;
//! every frame is a 16-byte header and a body ([`frame`]):
//!
//! ```text
//! 0..2   magic     b"PF" (0x50 0x46)
//! 2      version   1
//! 3      opcode    u8 (Opcode)
//! 4..8   body_len  u32, bytes after the header, at most MAX_BODY_LEN
//! 8..16  tag       u64 request id; responses echo it; control messages carry one too
//! ```
//!
//! [`frame::MAX_BODY_LEN`] (16 MiB + 64) is part of the format: a header
//! claiming more is rejected from the header alone, before anything is
//! buffered or allocated, and the connection is closed. It leaves room for
//! [`frame::MAX_DATA_LEN`] (16 MiB) of data behind a fixed body part.
//!
//! Opcodes ([`Opcode`]) reuse the IBTA RC numbers where one exists, so a
//! RoCEv2 gateway can map them one to one; the rest use the
//! manufacturer-specific range:
//!
//! | opcode | value | body |
//! |---|---|---|
//! | WRITE | 0x0A | [`request`] + data |
//! | READ | 0x0C | [`request`] |
//! | READ_RESPONSE | 0x10 | [`response`] + data |
//! | ACKNOWLEDGE | 0x11 | [`response`] |
//! | ATOMIC_ACKNOWLEDGE | 0x12 | [`response`] (old value) |
//! | COMPARE_SWAP | 0x13 | [`request`] |
//! | FETCH_ADD | 0x14 | [`request`] |
//! | FLUSH | 0x1C | [`request`] |
//! | ATOMIC_WRITE | 0x1D | [`request`] (+ an [`atomic_record`] with RECORDED, from a fabric device) |
//! | WRITE_PERSIST | 0xC0 | [`request`] + data |
//! | HELLO | 0xE0 | [`hello`] |
//! | MAP_REQUEST | 0xE1 | empty |
//! | MAP | 0xE2 | [`map`] |
//! | PING | 0xE3 | [`ping`] |
//! | PONG | 0xE4 | [`ping`] |
//! | QP_CONNECT | 0xE5 | [`qp`] (a RoCEv2 queue pair's end) |
//! | QP_ACCEPT | 0xE6 | [`qp`] (the device's end and R_Keys) |
//! | AUTH_CHALLENGE | 0xE7 | [`auth`] (the listener's nonce) |
//! | AUTH_PROOF | 0xE8 | [`auth`] (an HMAC proof) |
//! | ROTATE_KEY | 0xE9 | one u64: the region index (below 2³²) |
//! | SCRUB | 0xEA | [`scrub`] (a run of a region's blocks) |
//! | SCRUB_REPORT | 0xEB | [`scrub`] (what the scrub found) |
//! | MAP_EPOCH | 0xEC | one u64: the cluster map's epoch the sender runs |
//! | BLOCK_SUMS | 0xED | [`block_sums`] (a run of a region copy's blocks) |
//! | BLOCK_SUMS_REPORT | 0xEE | [`block_sums`] (their checksums now) |
//!
//! Request body, 56 bytes then the payload ([`request`]):
//!
//! ```text
//! 0      flags    u8: bit0 PERSIST, bit1 REGION_ADDRESSED, bit2 EXACTLY_ONCE,
//!                 bit3 NON_TEMPORAL, bit4 ON_BEHALF, bit5 RECORDED; other bits zero
//! 1..4   reserved zero
//! 4..8   region   u32 (REGION_ADDRESSED; else zero and addr is a PmemAddr)
//! 8..16  addr     u64
//! 16..24 key      u64
//! 24..28 length   u32 (8 for atomics; at most MAX_DATA_LEN for READ/WRITE)
//! 28..32 client   u32 (EXACTLY_ONCE; else zero)
//! 32..40 seq      u64 (EXACTLY_ONCE; else zero)
//! 40..48 operand  u64 swap / add / store value
//! 48..56 compare  u64 compare value of COMPARE_SWAP
//! 56..   payload  WRITE / WRITE_PERSIST: exactly `length` bytes; an ATOMIC_WRITE
//!                 with RECORDED: a 32-byte [`atomic_record`]; others none
//! ```
//!
//! Response body, 16 bytes then the payload ([`response`]):
//!
//! ```text
//! 0..2   status   u16 (Status)
//! 2..8   reserved zero
//! 8..16  value    u64 old value for COMPARE_SWAP / FETCH_ADD, else 0
//! 16..   payload  READ_RESPONSE data; none for acknowledgements
//! ```
//!
//! HELLO body ([`hello`]): `0..2` version u16 (highest spoken), `2` role u8,
//! `3` reserved, `4..12` capabilities u64, `12..14` name_len u16 (≤ 255),
//! `14..` UTF-8 name. The peer answers with its own HELLO and the same tag,
//! or with an ACKNOWLEDGE carrying `UNKNOWN_CLIENT` or `VERSION_MISMATCH`.
//!
//! MAP body ([`map`]): `0..32` digest, `32..40` extent_size u64, `40..44`
//! count u32, `44..48` reserved, then `count` entries of 32 bytes (start u64,
//! len u64, region u32, server u16, socket u16, key u64: 0 when the sender
//! does not give it) and nothing else.
//!
//! PING / PONG body ([`ping`]): one opaque u64 that PONG echoes.
//!
//! Reserved bytes, undefined flag bits and fields a clear flag disables must
//! be zero; so every frame this crate accepts re-encodes to the same bytes.
//!
//! # Map of the crate
//!
//! | module | what it holds |
//! |---|---|
//! | [`addr`] | the address newtypes: virtual, PMEM, region offset, access key |
//! | [`atomic_record`] | the record of a decided atomic an ATOMIC_WRITE may carry (RECORDED) |
//! | [`auth`] | the challenge–response that proves who is at the other end |
//! | `code` | what the one-byte opcodes share: conversions and `Display` (private) |
//! | [`decoder`] | the sans-IO frame decoder that splits a byte stream into frames |
//! | [`error`] | why bytes are not a frame this crate accepts |
//! | [`fence`] | fencing by map epoch: who answers STALE_MAP, and with what |
//! | [`frame`] | the 16-byte frame header |
//! | [`hello`] | HELLO: version, role, capabilities, name |
//! | `le` | little-endian field access (private) |
//! | [`limits`] | the protocol's versions and size limits, each stated once |
//! | [`block_run`] | a run of a region's blocks, the body SCRUB and BLOCK_SUMS share |
//! | [`block_report`] | the head SCRUB_REPORT and BLOCK_SUMS_REPORT share, and their lists of words |
//! | [`block_sums`] | BLOCK_SUMS and BLOCK_SUMS_REPORT |
//! | [`map`] | MAP: the PMEM address map |
//! | [`message`] | every message kind in one enum; parsing, emitting, error replies |
//! | [`opcode`] | the frame opcodes, one line per operation |
//! | [`opening`] | the sans-IO opening of a connection from the connecting side |
//! | [`ping`] | PING and PONG |
//! | [`qp`] | QP_CONNECT and QP_ACCEPT: setting up a RoCEv2 queue pair |
//! | [`request`] | the bodies of the seven one-sided requests |
//! | [`response`] | the bodies of the three responses |
//! | [`roce`] | RoCEv2 headers, datagrams, ICRC and the RC queue pair |
//! | [`scrub`] | SCRUB and SCRUB_REPORT |
//! | [`status`] | the status every response carries |
//! | `view` | what every wire view shares: `wire_view!` and the size checks (private) |
//!
//! # Errors on a connection
//!
//! A frame whose header is bad ([`Error::breaks_framing`]) ends the
//! connection: the stream cannot be framed any more. A frame with a good
//! header and a bad body, or an unknown opcode, is answered with an error
//! response carrying its tag ([`reply_to_malformed`], [`unsupported_reply`],
//! [`error_reply`]) and the connection carries on.

pub mod addr;
pub mod atomic_record;
pub mod auth;
pub mod block_report;
pub mod block_run;
pub mod block_sums;
mod code;
pub mod decoder;
pub mod error;
pub mod fence;
pub mod frame;
pub mod hello;
mod le;
pub mod limits;
pub mod map;
pub mod message;
pub mod opcode;
pub mod opening;
pub mod ping;
pub mod qp;
pub mod request;
pub mod response;
pub mod roce;
pub mod scrub;
pub mod status;
mod view;

pub use addr::{AccessKey, PmemAddr, RegionIndex, RegionOffset, VirtAddr};
pub use decoder::{FrameDecoder, ReadError, ReadOutcome};
pub use error::{Error, Result};
pub use limits::PROTOCOL_VERSION;
pub use message::{
    ERROR_REPLY_LEN, Message, error_reply, error_response, parse_frame, reply_to_malformed,
    unsupported_reply,
};
pub use opcode::Opcode;
pub use request::{ExactlyOnce, Operation, Target};
pub use response::ResponseKind;
pub use status::Status;

/// A byte range of a fixed-width field.
pub type Field = core::ops::Range<usize>;
/// The byte range from a field to the end of the buffer.
pub type Rest = core::ops::RangeFrom<usize>;
