//! The atomic acknowledge extended transport header (AtomicAckETH), 8 bytes:
//! the value the target held before an atomic operation.
//!
//! ```text
//! 0..8  original remote data
//! ```

use super::header::{be_uint, fixed_header, put_be_uint};

/// Byte ranges of the AtomicAckETH.
pub mod field {
    use crate::Field;

    /// The original remote data.
    pub const ORIG: Field = 0..8;
}

/// Length of the AtomicAckETH.
pub const HEADER_LEN: usize = 8;

fixed_header!("AtomicAckETH");

impl<T: AsRef<[u8]>> Packet<T> {
    /// The value the target held before the operation.
    pub fn original(&self) -> u64 {
        be_uint(&self.buffer.as_ref()[field::ORIG])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the original value.
    pub fn set_original(&mut self, value: u64) {
        put_be_uint(&mut self.buffer.as_mut()[field::ORIG], value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_endian_value() {
        let bytes = [1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(
            Packet::new_checked(&bytes[..]).unwrap().original(),
            0x0102_0304_0506_0708
        );
        let mut out = [0u8; 8];
        Packet::new_unchecked(&mut out[..]).set_original(0x0102_0304_0506_0708);
        assert_eq!(out, bytes);
        assert!(Packet::new_checked(&bytes[..7]).is_err());
    }
}
