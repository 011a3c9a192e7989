//! The atomic extended transport header (AtomicETH), 28 bytes: target and
//! operands of COMPARE_SWAP and FETCH_ADD.
//!
//! ```text
//! 0..8    virtual address (8-byte aligned)
//! 8..12   R_Key
//! 12..20  swap value (COMPARE_SWAP) or addend (FETCH_ADD)
//! 20..28  compare value (COMPARE_SWAP; ignored by FETCH_ADD)
//! ```

use core::fmt;

use super::header::{be_uint, fixed_header, put_be_uint};

/// Byte ranges of the AtomicETH.
pub mod field {
    use crate::Field;

    /// Remote virtual address.
    pub const VA: Field = 0..8;
    /// Remote key.
    pub const RKEY: Field = 8..12;
    /// Swap value or addend.
    pub const SWAP_ADD: Field = 12..20;
    /// Compare value.
    pub const COMPARE: Field = 20..28;
}

/// Length of the AtomicETH.
pub const HEADER_LEN: usize = 28;

fixed_header!("AtomicETH");

impl<T: AsRef<[u8]>> Packet<T> {
    /// The remote virtual address.
    pub fn va(&self) -> u64 {
        be_uint(&self.buffer.as_ref()[field::VA])
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        be_uint(&self.buffer.as_ref()[field::RKEY]) as u32
    }

    /// The swap value (COMPARE_SWAP) or addend (FETCH_ADD).
    pub fn swap_add(&self) -> u64 {
        be_uint(&self.buffer.as_ref()[field::SWAP_ADD])
    }

    /// The compare value.
    pub fn compare(&self) -> u64 {
        be_uint(&self.buffer.as_ref()[field::COMPARE])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the remote virtual address.
    pub fn set_va(&mut self, va: u64) {
        put_be_uint(&mut self.buffer.as_mut()[field::VA], va);
    }

    /// Sets the remote key.
    pub fn set_rkey(&mut self, rkey: u32) {
        put_be_uint(&mut self.buffer.as_mut()[field::RKEY], rkey.into());
    }

    /// Sets the swap value or addend.
    pub fn set_swap_add(&mut self, value: u64) {
        put_be_uint(&mut self.buffer.as_mut()[field::SWAP_ADD], value);
    }

    /// Sets the compare value.
    pub fn set_compare(&mut self, value: u64) {
        put_be_uint(&mut self.buffer.as_mut()[field::COMPARE], value);
    }
}

/// A parsed AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap value or addend.
    pub swap_add: u64,
    /// Compare value.
    pub compare: u64,
}

impl Repr {
    /// Parses an AtomicETH.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> super::Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            va: packet.va(),
            rkey: packet.rkey(),
            swap_add: packet.swap_add(),
            compare: packet.compare(),
        })
    }

    /// Length of the header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_va(self.va);
        packet.set_rkey(self.rkey);
        packet.set_swap_add(self.swap_add);
        packet.set_compare(self.compare);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "AtomicETH va={:#x} rkey={:#x} swap/add={:#x} compare={:#x}",
            self.va, self.rkey, self.swap_add, self.compare
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_emit() {
        let repr = Repr {
            va: 0x1000,
            rkey: 0xABCD,
            swap_add: 0x0102_0304_0506_0708,
            compare: 7,
        };
        let mut bytes = [0u8; 28];
        repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(&bytes[..8], &[0, 0, 0, 0, 0, 0, 0x10, 0]);
        assert_eq!(&bytes[8..12], &[0, 0, 0xAB, 0xCD]);
        assert_eq!(&bytes[12..20], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&bytes[20..], &[0, 0, 0, 0, 0, 0, 0, 7]);
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Ok(repr)
        );
        assert!(Packet::new_checked(&bytes[..27]).is_err());
    }
}
