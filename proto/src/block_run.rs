//! A run of a region's blocks, the body of the requests that ask a server
//! about blocks (SCRUB, BLOCK_SUMS):
//!
//! ```text
//! 0..4   region  u32 region index
//! 4..8   blocks  u32 how many blocks, 1..=MAX (each request's own limit)
//! 8..16  first   u64 index of the first block
//! ```

use crate::error::{Error, Result};
use crate::le;
use crate::view::wire_view;

/// Byte ranges of a run's body.
pub mod field {
    use crate::Field;

    /// The region index.
    pub const REGION: Field = 0..4;
    /// How many blocks.
    pub const BLOCKS: Field = 4..8;
    /// The first block.
    pub const FIRST: Field = 8..16;
}

/// Length of a run's body.
pub const HEADER_LEN: usize = 16;

wire_view! {
    /// A read/write view of a run's body.
    pub struct Packet;
    error: Error;
    exactly: HEADER_LEN, "block run body";
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The region index.
    pub fn region(&self) -> u32 {
        le::u32_at(&self.buffer.as_ref()[field::REGION])
    }

    /// How many blocks.
    pub fn blocks(&self) -> u32 {
        le::u32_at(&self.buffer.as_ref()[field::BLOCKS])
    }

    /// The first block.
    pub fn first(&self) -> u64 {
        le::u64_at(&self.buffer.as_ref()[field::FIRST])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the region index.
    pub fn set_region(&mut self, value: u32) {
        le::put_u32(&mut self.buffer.as_mut()[field::REGION], value);
    }

    /// Sets how many blocks.
    pub fn set_blocks(&mut self, value: u32) {
        le::put_u32(&mut self.buffer.as_mut()[field::BLOCKS], value);
    }

    /// Sets the first block.
    pub fn set_first(&mut self, value: u64) {
        le::put_u64(&mut self.buffer.as_mut()[field::FIRST], value);
    }
}

/// A parsed run of at most `MAX` blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr<const MAX: u32> {
    /// The region index.
    pub region: u32,
    /// The first block.
    pub first: u64,
    /// How many blocks, 1..=`MAX`.
    pub blocks: u32,
}

impl<const MAX: u32> Repr<MAX> {
    /// Parses a checked packet; a block count of 0 or above `MAX` is
    /// refused.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self> {
        let repr = Self {
            region: packet.region(),
            first: packet.first(),
            blocks: packet.blocks(),
        };
        repr.check()?;
        Ok(repr)
    }

    /// Checks the block count.
    pub fn check(&self) -> Result<()> {
        if self.blocks == 0 || self.blocks > MAX {
            return Err(Error::LengthMismatch {
                what: "block count of a run",
                expected: MAX as usize,
                got: self.blocks as usize,
            });
        }
        Ok(())
    }

    /// Length of the body.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the body into `packet`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_region(self.region);
        packet.set_blocks(self.blocks);
        packet.set_first(self.first);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_goes_round_and_its_count_is_bounded() {
        let run = Repr::<8> {
            region: 3,
            first: 1 << 40,
            blocks: 8,
        };
        let mut buf = [0u8; HEADER_LEN];
        run.emit(&mut Packet::new_unchecked(&mut buf[..]));
        let packet = Packet::new_checked(&buf[..]).expect("checked");
        assert_eq!(Repr::<8>::parse(&packet), Ok(run));
        assert!(Repr::<7>::parse(&packet).is_err(), "above the limit");
        let empty = Repr::<8> { blocks: 0, ..run };
        empty.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert!(Repr::<8>::parse(&Packet::new_checked(&buf[..]).expect("checked")).is_err());
        assert!(Packet::new_checked(&buf[..HEADER_LEN - 1]).is_err());
    }
}
