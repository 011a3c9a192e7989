//! PING and PONG: an opaque 8-byte value (e.g. the send time) that PONG
//! echoes. ROTATE_KEY and MAP_EPOCH carry one 8-byte word in the same shape.
//!
//! ```text
//! 0..8  value  u64
//! ```

use crate::error::{Error, Result};
use crate::le;
use crate::view::wire_view;

/// Byte ranges of a PING / PONG body.
pub mod field {
    use crate::Field;

    /// The opaque value.
    pub const VALUE: Field = 0..8;
}

/// Length of a PING / PONG body.
pub const HEADER_LEN: usize = 8;

wire_view! {
    /// A read/write view of a PING / PONG body.
    pub struct Packet;
    error: Error;
    exactly: HEADER_LEN, "ping body";
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The opaque value.
    pub fn value(&self) -> u64 {
        le::u64_at(&self.buffer.as_ref()[field::VALUE])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the opaque value.
    pub fn set_value(&mut self, value: u64) {
        le::put_u64(&mut self.buffer.as_mut()[field::VALUE], value);
    }
}

/// A parsed PING / PONG body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// The opaque value.
    pub value: u64,
}

impl Repr {
    /// Parses a PING / PONG body.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            value: packet.value(),
        })
    }

    /// Length of the body this value encodes to.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes this value into a body of [`HEADER_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_value(self.value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BYTES: [u8; 8] = [0xEF, 0xCD, 0xAB, 0x89, 0x67, 0x45, 0x23, 0x01];
    const REPR: Repr = Repr {
        value: 0x0123_4567_89AB_CDEF,
    };

    #[test]
    fn construct() {
        let mut bytes = [0u8; 8];
        Packet::new_unchecked(&mut bytes[..]).set_value(0x0123_4567_89AB_CDEF);
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn deconstruct() {
        let packet = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(packet.value(), 0x0123_4567_89AB_CDEF);
    }

    #[test]
    fn parse() {
        let packet = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(Repr::parse(&packet), Ok(REPR));
    }

    #[test]
    fn emit() {
        let mut bytes = [0u8; 8];
        assert_eq!(REPR.buffer_len(), 8);
        REPR.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn rejects_wrong_length() {
        assert_eq!(
            Packet::new_checked(&BYTES[..7]),
            Err(Error::Truncated { needed: 8, got: 7 })
        );
        assert_eq!(
            Packet::new_checked(&[0u8; 9][..]),
            Err(Error::LengthMismatch {
                what: "ping body",
                expected: 8,
                got: 9
            })
        );
    }
}
