//! The FLUSH extended transport header (FETH), 4 bytes (IBTA 1.5 memory
//! placement extensions): what a FLUSH makes durable.
//!
//! ```text
//! 0..4  reserved (bits 31..6), selectivity level (bits 5..4),
//!       placement type (bits 3..0)
//! ```

use core::fmt;

use super::header::{be_uint, fixed_header, put_be_uint};

/// Byte ranges of the FETH.
pub mod field {
    use crate::Field;

    /// The whole 32-bit word.
    pub const WORD: Field = 0..4;
}

/// Length of the FETH.
pub const HEADER_LEN: usize = 4;

/// Placement type bit: make the range globally visible.
pub const PLACEMENT_GLOBAL: u8 = 0x1;
/// Placement type bit: make the range persistent.
pub const PLACEMENT_PERSISTENT: u8 = 0x2;
/// Selectivity level: the range the RETH names.
pub const SELECT_RANGE: u8 = 0;
/// Selectivity level: the whole memory region of the R_Key.
pub const SELECT_REGION: u8 = 1;

fixed_header!("FETH");

impl<T: AsRef<[u8]>> Packet<T> {
    fn word(&self) -> u32 {
        be_uint(&self.buffer.as_ref()[field::WORD]) as u32
    }

    /// The placement type bits.
    pub fn placement(&self) -> u8 {
        (self.word() & 0xF) as u8
    }

    /// The selectivity level.
    pub fn selectivity(&self) -> u8 {
        ((self.word() >> 4) & 0x3) as u8
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets placement type and selectivity level; reserved bits become zero.
    pub fn set_fields(&mut self, placement: u8, selectivity: u8) {
        let word = u32::from(placement & 0xF) | (u32::from(selectivity & 0x3) << 4);
        put_be_uint(&mut self.buffer.as_mut()[field::WORD], word.into());
    }
}

/// A parsed FETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Placement type bits ([`PLACEMENT_GLOBAL`], [`PLACEMENT_PERSISTENT`]).
    pub placement: u8,
    /// Selectivity level ([`SELECT_RANGE`], [`SELECT_REGION`]).
    pub selectivity: u8,
}

impl Repr {
    /// Parses an FETH.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> super::Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            placement: packet.placement(),
            selectivity: packet.selectivity(),
        })
    }

    /// Length of the header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_fields(self.placement, self.selectivity);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "FETH placement={:#x} selectivity={}",
            self.placement, self.selectivity
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_emit() {
        let repr = Repr {
            placement: PLACEMENT_PERSISTENT,
            selectivity: SELECT_REGION,
        };
        let mut bytes = [0xFFu8; 4];
        repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, [0, 0, 0, 0x12]);
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Ok(repr)
        );
    }
}
