//! The 16-byte frame header that precedes every message body.
//!
//! ```text
//! 0..2   magic     b"PF"
//! 2      version   1
//! 3      opcode    see Opcode
//! 4..8   body_len  u32, bytes after the header, at most MAX_BODY_LEN
//! 8..16  tag       u64 request id; responses echo it
//! ```

use crate::error::{Error, Result};
use crate::le;
use crate::opcode::Opcode;
use crate::view::wire_view;

/// Byte ranges of the frame header.
pub mod field {
    use crate::{Field, Rest};

    /// Magic bytes `PF`.
    pub const MAGIC: Field = 0..2;
    /// Protocol version.
    pub const VERSION: usize = 2;
    /// Opcode.
    pub const OPCODE: usize = 3;
    /// Body length in bytes.
    pub const BODY_LEN: Field = 4..8;
    /// Request id.
    pub const TAG: Field = 8..16;
    /// The body.
    pub const BODY: Rest = 16..;
}

/// Length of the frame header.
pub const HEADER_LEN: usize = 16;
/// The two bytes every frame starts with.
pub const MAGIC: [u8; 2] = *b"PF";
pub use crate::limits::{FRAME_VERSION as VERSION, MAX_BODY_LEN, MAX_DATA_LEN};
/// Largest frame, header included.
pub const MAX_FRAME_LEN: usize = HEADER_LEN + MAX_BODY_LEN as usize;

wire_view! {
    /// A read/write view of one frame (header and body) in a byte buffer.
    ///
    /// The buffer may extend past the frame; [`Packet::frame_len`] says where it ends.
    pub struct Packet;
    error: Error;
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks the header (see [`Header::parse`]) and that the buffer holds
    /// the whole body it announces.
    pub fn check_len(&self) -> Result<()> {
        let data = self.buffer.as_ref();
        let header = Header::parse(data)?;
        if data.len() < header.frame_len() {
            return Err(Error::Truncated {
                needed: header.frame_len(),
                got: data.len(),
            });
        }
        Ok(())
    }

    /// The magic bytes.
    pub fn magic(&self) -> [u8; 2] {
        let data = self.buffer.as_ref();
        [data[0], data[1]]
    }

    /// The protocol version byte.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }

    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        Opcode::from(self.buffer.as_ref()[field::OPCODE])
    }

    /// The body length the header announces.
    pub fn body_len(&self) -> u32 {
        le::u32_at(&self.buffer.as_ref()[field::BODY_LEN])
    }

    /// The request id.
    pub fn tag(&self) -> u64 {
        le::u64_at(&self.buffer.as_ref()[field::TAG])
    }

    /// Header plus body length.
    pub fn frame_len(&self) -> usize {
        HEADER_LEN + self.body_len() as usize
    }

    /// The header fields.
    pub fn header(&self) -> Header {
        Header {
            opcode: self.opcode(),
            body_len: self.body_len(),
            tag: self.tag(),
        }
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
    /// The body: exactly `body_len` bytes after the header.
    pub fn body(&self) -> &'a [u8] {
        let end = self.frame_len();
        &self.buffer.as_ref()[HEADER_LEN..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the magic bytes.
    pub fn set_magic(&mut self, value: [u8; 2]) {
        self.buffer.as_mut()[field::MAGIC].copy_from_slice(&value);
    }

    /// Sets the protocol version byte.
    pub fn set_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::VERSION] = value;
    }

    /// Sets the opcode.
    pub fn set_opcode(&mut self, value: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = value.into();
    }

    /// Sets the body length.
    pub fn set_body_len(&mut self, value: u32) {
        le::put_u32(&mut self.buffer.as_mut()[field::BODY_LEN], value);
    }

    /// Sets the request id.
    pub fn set_tag(&mut self, value: u64) {
        le::put_u64(&mut self.buffer.as_mut()[field::TAG], value);
    }

    /// The body, mutably: `body_len` bytes after the header.
    pub fn body_mut(&mut self) -> &mut [u8] {
        let end = self.frame_len();
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

/// The parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    /// What the body is.
    pub opcode: Opcode,
    /// Bytes after the header.
    pub body_len: u32,
    /// Request id; a response echoes its request's.
    pub tag: u64,
}

impl Header {
    /// Parses and checks the header in the first [`HEADER_LEN`] bytes of
    /// `bytes`; the body need not be there.
    ///
    /// Rejects a short buffer (`Truncated`), a wrong magic (`BadMagic`), a
    /// wrong version (`BadVersion`) and a body claim above [`MAX_BODY_LEN`]
    /// (`Oversize`). An unknown opcode is not an error here.
    pub fn parse(bytes: &[u8]) -> Result<Header> {
        Self::parse_with_limit(bytes, MAX_BODY_LEN)
    }

    /// [`Header::parse`] with a body limit of `min(limit, MAX_BODY_LEN)`.
    pub fn parse_with_limit(bytes: &[u8], limit: u32) -> Result<Header> {
        if bytes.len() < HEADER_LEN {
            return Err(Error::Truncated {
                needed: HEADER_LEN,
                got: bytes.len(),
            });
        }
        let packet = Packet::new_unchecked(bytes);
        if packet.magic() != MAGIC {
            return Err(Error::BadMagic {
                got: packet.magic(),
            });
        }
        if packet.version() != VERSION {
            return Err(Error::BadVersion {
                got: packet.version(),
            });
        }
        let limit = limit.min(MAX_BODY_LEN);
        if packet.body_len() > limit {
            return Err(Error::Oversize {
                claimed: packet.body_len().into(),
                limit: limit.into(),
            });
        }
        Ok(packet.header())
    }

    /// Header plus body length.
    pub const fn frame_len(&self) -> usize {
        HEADER_LEN + self.body_len as usize
    }

    /// Writes magic, version and these fields into the first [`HEADER_LEN`]
    /// bytes of the packet's buffer.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_magic(MAGIC);
        packet.set_version(VERSION);
        packet.set_opcode(self.opcode);
        packet.set_body_len(self.body_len);
        packet.set_tag(self.tag);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A PING frame header, tag 0x0102030405060708, body of 8 bytes.
    const BYTES: [u8; 24] = [
        0x50, 0x46, 0x01, 0xE3, // magic, version, opcode
        0x08, 0x00, 0x00, 0x00, // body_len
        0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, // tag
        0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0xFF, 0x00, 0x11, // body
    ];

    const HEADER: Header = Header {
        opcode: Opcode::Ping,
        body_len: 8,
        tag: 0x0102_0304_0506_0708,
    };

    #[test]
    fn construct() {
        let mut bytes = [0u8; 24];
        let mut packet = Packet::new_unchecked(&mut bytes[..]);
        packet.set_magic(MAGIC);
        packet.set_version(1);
        packet.set_opcode(Opcode::Ping);
        packet.set_body_len(8);
        packet.set_tag(0x0102_0304_0506_0708);
        packet
            .body_mut()
            .copy_from_slice(&[0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0xFF, 0x00, 0x11]);
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn deconstruct() {
        let packet = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(packet.magic(), *b"PF");
        assert_eq!(packet.version(), 1);
        assert_eq!(packet.opcode(), Opcode::Ping);
        assert_eq!(packet.body_len(), 8);
        assert_eq!(packet.tag(), 0x0102_0304_0506_0708);
        assert_eq!(packet.frame_len(), 24);
        assert_eq!(packet.body(), &BYTES[16..]);
    }

    #[test]
    fn parse() {
        assert_eq!(Header::parse(&BYTES).unwrap(), HEADER);
        // The body need not be present for the header alone.
        assert_eq!(Header::parse(&BYTES[..16]).unwrap(), HEADER);
        assert_eq!(HEADER.frame_len(), 24);
    }

    #[test]
    fn emit() {
        let mut bytes = BYTES;
        bytes[..16].fill(0);
        HEADER.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn buffer_may_extend_past_the_frame() {
        let mut long = BYTES.to_vec();
        long.extend_from_slice(b"next frame");
        let packet = Packet::new_checked(&long[..]).unwrap();
        assert_eq!(packet.body(), &BYTES[16..]);
        assert_eq!(packet.into_inner().len(), 34);
    }

    #[test]
    fn rejects_short_buffer() {
        assert_eq!(
            Header::parse(&BYTES[..15]),
            Err(Error::Truncated {
                needed: 16,
                got: 15
            })
        );
        assert_eq!(
            Packet::new_checked(&BYTES[..20]),
            Err(Error::Truncated {
                needed: 24,
                got: 20
            })
        );
    }

    #[test]
    fn rejects_bad_magic_and_version() {
        let mut bytes = BYTES;
        bytes[1] = b'X';
        assert_eq!(
            Packet::new_checked(&bytes[..]),
            Err(Error::BadMagic { got: *b"PX" })
        );
        let mut bytes = BYTES;
        bytes[2] = 2;
        assert_eq!(
            Packet::new_checked(&bytes[..]),
            Err(Error::BadVersion { got: 2 })
        );
    }

    #[test]
    fn rejects_oversize_claim_from_the_header_alone() {
        let mut bytes = BYTES;
        bytes[4..8].copy_from_slice(&(MAX_BODY_LEN + 1).to_le_bytes());
        let expected = Error::Oversize {
            claimed: u64::from(MAX_BODY_LEN) + 1,
            limit: MAX_BODY_LEN.into(),
        };
        assert_eq!(Header::parse(&bytes[..16]), Err(expected.clone()));
        assert_eq!(Packet::new_checked(&bytes[..]), Err(expected));
        // The largest legal claim passes the header check.
        bytes[4..8].copy_from_slice(&MAX_BODY_LEN.to_le_bytes());
        assert_eq!(
            Header::parse(&bytes[..16]).map(|h| h.body_len),
            Ok(MAX_BODY_LEN)
        );
        assert_eq!(
            Header::parse_with_limit(&bytes[..16], 1000),
            Err(Error::Oversize {
                claimed: MAX_BODY_LEN.into(),
                limit: 1000
            })
        );
    }

    #[test]
    fn unknown_opcode_is_not_a_header_error() {
        let mut bytes = BYTES;
        bytes[3] = 0x99;
        let packet = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(packet.opcode(), Opcode::Unknown(0x99));
    }
}
