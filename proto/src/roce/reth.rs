//! The RDMA extended transport header (RETH), 16 bytes: where in the
//! responder's memory a READ, WRITE, FLUSH or ATOMIC_WRITE goes.
//!
//! ```text
//! 0..8    virtual address
//! 8..12   R_Key
//! 12..16  DMA length
//! ```

use core::fmt;

use super::header::{be_uint, fixed_header, put_be_uint};

/// Byte ranges of the RETH.
pub mod field {
    use crate::Field;

    /// Remote virtual address.
    pub const VA: Field = 0..8;
    /// Remote key.
    pub const RKEY: Field = 8..12;
    /// Length of the whole message in bytes.
    pub const DMA_LEN: Field = 12..16;
}

/// Length of the RETH.
pub const HEADER_LEN: usize = 16;

fixed_header!("RETH");

impl<T: AsRef<[u8]>> Packet<T> {
    /// The remote virtual address.
    pub fn va(&self) -> u64 {
        be_uint(&self.buffer.as_ref()[field::VA])
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        be_uint(&self.buffer.as_ref()[field::RKEY]) as u32
    }

    /// The length of the whole message.
    pub fn dma_len(&self) -> u32 {
        be_uint(&self.buffer.as_ref()[field::DMA_LEN]) as u32
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

    /// Sets the length of the whole message.
    pub fn set_dma_len(&mut self, len: u32) {
        put_be_uint(&mut self.buffer.as_mut()[field::DMA_LEN], len.into());
    }
}

/// A parsed RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length of the whole message.
    pub dma_len: u32,
}

impl Repr {
    /// Parses a RETH.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> super::Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            va: packet.va(),
            rkey: packet.rkey(),
            dma_len: packet.dma_len(),
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
        packet.set_dma_len(self.dma_len);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RETH va={:#x} rkey={:#x} len={}",
            self.va, self.rkey, self.dma_len
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BYTES: [u8; 16] = [
        0x00, 0x00, 0x55, 0x55, 0x12, 0x34, 0x50, 0x00, 0x00, 0x00, 0x1A, 0x2B, 0x00, 0x00, 0x10,
        0x00,
    ];
    const REPR: Repr = Repr {
        va: 0x5555_1234_5000,
        rkey: 0x1A2B,
        dma_len: 4096,
    };

    #[test]
    fn parse_and_emit() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(Repr::parse(&p), Ok(REPR));
        let mut out = [0u8; 16];
        REPR.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, BYTES);
        assert!(Packet::new_checked(&BYTES[..15]).is_err());
        assert_eq!(
            REPR.to_string(),
            "RETH va=0x555512345000 rkey=0x1a2b len=4096"
        );
    }
}
