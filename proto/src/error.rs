//! The error type shared by every message family.

use crate::limits::{FRAME_VERSION, MAX_DATA_LEN, MAX_NAME_LEN};
use crate::status::Status;

/// Why bytes could not be parsed as (or a value could not be emitted as) a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The buffer ends before the structure it should hold.
    #[error("truncated: {needed} bytes needed, {got} available")]
    Truncated {
        /// Bytes the structure needs.
        needed: usize,
        /// Bytes that were there.
        got: usize,
    },
    /// The frame does not start with `PF`.
    #[error("bad frame magic {got:02x?}, expected \"PF\"")]
    BadMagic {
        /// The two bytes found instead.
        got: [u8; 2],
    },
    /// The frame header carries a protocol version this crate does not speak.
    #[error("unsupported frame version {got}, expected {expected}", expected = FRAME_VERSION)]
    BadVersion {
        /// The version byte found.
        got: u8,
    },
    /// The frame header claims a body longer than the limit.
    #[error("frame body of {claimed} bytes exceeds the limit of {limit} bytes")]
    Oversize {
        /// The claimed (or, when emitting, the actual) body length.
        claimed: u64,
        /// The limit in force: [`crate::limits::MAX_BODY_LEN`] or a decoder's lower one.
        limit: u64,
    },
    /// A length field disagrees with the bytes actually present.
    #[error("{what} is {got} bytes, expected {expected}")]
    LengthMismatch {
        /// Which length: "write payload", "map body", ...
        what: &'static str,
        /// The length the fields imply.
        expected: usize,
        /// The length found.
        got: usize,
    },
    /// A reserved field or flag bit, or a field its flag disables, is not zero.
    #[error("reserved bits set in {what}: {value:#x}")]
    ReservedBits {
        /// Which field.
        what: &'static str,
        /// Its offending value.
        value: u64,
    },
    /// A well-formed frame carries an opcode this crate does not know.
    ///
    /// Answer it with [`crate::unsupported_reply`].
    #[error("unknown opcode {opcode:#04x} in frame with tag {tag}")]
    UnknownOpcode {
        /// The opcode byte.
        opcode: u8,
        /// The frame's tag, for the reply.
        tag: u64,
    },
    /// A data length (READ/WRITE length, READ response payload) above [`MAX_DATA_LEN`].
    #[error("data length {len} exceeds the limit of {limit} bytes", limit = MAX_DATA_LEN)]
    DataTooLong {
        /// The length asked for.
        len: u64,
    },
    /// A HELLO name longer than [`MAX_NAME_LEN`] bytes.
    #[error("peer name is {len} bytes, the limit is {limit}", limit = MAX_NAME_LEN)]
    NameTooLong {
        /// The name's length in bytes.
        len: usize,
    },
    /// A HELLO name that is not valid UTF-8.
    #[error("peer name is not valid UTF-8 (valid up to byte {valid_up_to})")]
    NameNotUtf8 {
        /// Length of the valid UTF-8 prefix.
        valid_up_to: usize,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = core::result::Result<T, Error>;

impl Error {
    /// Whether the byte stream can no longer be split into frames after this
    /// error: the connection must be closed.
    ///
    /// That is the case for a bad magic, a bad version and an oversize claim,
    /// which are found in the frame header itself.
    pub fn breaks_framing(&self) -> bool {
        matches!(
            self,
            Error::BadMagic { .. } | Error::BadVersion { .. } | Error::Oversize { .. }
        )
    }

    /// The status to answer a frame that failed to parse with this error.
    pub fn status(&self) -> Status {
        match self {
            Error::UnknownOpcode { .. } => Status::Unsupported,
            Error::BadVersion { .. } => Status::VersionMismatch,
            _ => Status::BadRequest,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::MAX_BODY_LEN;

    #[test]
    fn messages_name_the_problem() {
        let e = Error::Oversize {
            claimed: 1 << 30,
            limit: MAX_BODY_LEN as u64,
        };
        assert_eq!(
            e.to_string(),
            "frame body of 1073741824 bytes exceeds the limit of 16777280 bytes"
        );
        assert_eq!(
            Error::BadMagic { got: *b"GE" }.to_string(),
            "bad frame magic [47, 45], expected \"PF\""
        );
        assert_eq!(
            Error::BadVersion { got: 7 }.to_string(),
            "unsupported frame version 7, expected 1"
        );
        assert!(e.breaks_framing());
        assert!(!Error::DataTooLong { len: 1 }.breaks_framing());
    }

    #[test]
    fn statuses() {
        assert_eq!(
            Error::UnknownOpcode { opcode: 1, tag: 2 }.status(),
            Status::Unsupported
        );
        assert_eq!(
            Error::BadVersion { got: 2 }.status(),
            Status::VersionMismatch
        );
        assert_eq!(
            Error::ReservedBits {
                what: "flags",
                value: 0x80
            }
            .status(),
            Status::BadRequest
        );
    }
}
