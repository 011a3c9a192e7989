//! Frames built from fuzz input, and what proto promises about every frame:
//! a frame that parses re-encodes to the very same bytes; one that does not
//! is answered (if at all) with an error reply that parses and echoes its tag.

use arbitrary::Arbitrary;
use proto::frame::{self, HEADER_LEN, Header};
use proto::{Message, Opcode, parse_frame, reply_to_malformed};

/// One piece of what a peer sends on a connection.
#[derive(Debug, Clone, Arbitrary)]
pub enum Piece {
    /// A good header (magic, version, the body's length) around any body,
    /// so the fuzzer reaches the body parsers without finding the header.
    Framed {
        /// Opcode byte, known or not.
        opcode: u8,
        /// The frame's tag.
        tag: u64,
        /// The body.
        body: Vec<u8>,
    },
    /// Any bytes: a bad header, part of a frame, noise.
    Raw(Vec<u8>),
}

impl Piece {
    /// Appends the piece's bytes to `out`.
    pub fn append_to(&self, out: &mut Vec<u8>) {
        match self {
            Piece::Framed { opcode, tag, body } => {
                framed(Opcode::from(*opcode), *tag, body, out);
            }
            Piece::Raw(bytes) => out.extend_from_slice(bytes),
        }
    }

    /// The piece's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.append_to(&mut out);
        out
    }
}

/// Appends a frame of `opcode` and `tag` around `body` to `out`, with a
/// header that is good whatever the body (its length saturates at `u32::MAX`).
pub fn framed(opcode: Opcode, tag: u64, body: &[u8], out: &mut Vec<u8>) {
    let at = out.len();
    out.resize(at + HEADER_LEN, 0);
    Header {
        opcode,
        body_len: u32::try_from(body.len()).unwrap_or(u32::MAX),
        tag,
    }
    .emit(&mut frame::Packet::new_unchecked(&mut out[at..]));
    out.extend_from_slice(body);
}

/// Checks what proto promises about one received frame (`frame` holds
/// exactly what a decoder handed out, or any bytes):
///
/// - a frame that parses is a message that checks and encodes to the very
///   same bytes (reserved bits are zero, unknown values are kept);
/// - a frame that does not parse gets no reply when its header is broken,
///   and otherwise at most an error reply that parses, answers its opcode
///   and echoes its tag.
///
/// # Panics
///
/// When a promise is broken: that is the finding.
pub fn check_frame(frame: &[u8]) {
    match parse_frame(frame) {
        Ok((message, tag)) => {
            message
                .check()
                .unwrap_or_else(|e| panic!("parsed {message:?} does not check: {e}"));
            let again = message
                .encode_to_vec(tag)
                .unwrap_or_else(|e| panic!("parsed {message:?} does not encode: {e}"));
            assert_eq!(again, frame, "{message:?} re-encodes to other bytes");
        }
        Err(error) => {
            let reply = reply_to_malformed(frame, &error);
            if error.breaks_framing() {
                assert!(reply.is_none(), "a broken header is answered: {error}");
            }
            if let Some(reply) = reply {
                let header = Header::parse(frame).expect("only a frame with a header is answered");
                let (answer, tag) = parse_frame(&reply)
                    .unwrap_or_else(|e| panic!("the reply to {error} does not parse: {e}"));
                assert_eq!(tag, header.tag, "the reply to {error} has another tag");
                assert_eq!(
                    answer.opcode(),
                    header.opcode.response_opcode(),
                    "the reply to {error} answers another opcode"
                );
                assert!(matches!(answer, Message::Response(_)), "{answer:?}");
            }
        }
    }
}

/// Splits `bytes` (what a peer wrote) into whole frames.
///
/// # Panics
///
/// When `bytes` is not a sequence of whole frames with good headers, each
/// of which parses: a daemon or the opening wrote something its peer cannot
/// read.
pub fn sent_frames(bytes: &[u8]) -> Vec<&[u8]> {
    let mut frames = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let header = Header::parse(rest).unwrap_or_else(|e| panic!("sent bytes do not frame: {e}"));
        assert!(
            rest.len() >= header.frame_len(),
            "sent a partial frame: {header:?} with {} bytes",
            rest.len()
        );
        let (frame, tail) = rest.split_at(header.frame_len());
        if let Err(e) = parse_frame(frame) {
            panic!("sent a frame that does not parse ({header:?}): {e}");
        }
        frames.push(frame);
        rest = tail;
    }
    frames
}
