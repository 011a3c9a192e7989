//! Immediate data (ImmDt) and the invalidate header (IETH): one 32-bit word each.
//!
//! ```text
//! 0..4  immediate data, or the R_Key to invalidate
//! ```

use super::header::{be_uint, fixed_header, put_be_uint};

/// Byte ranges of the word.
pub mod field {
    use crate::Field;

    /// The 32-bit value.
    pub const VALUE: Field = 0..4;
}

/// Length of ImmDt and of IETH.
pub const HEADER_LEN: usize = 4;

fixed_header!("ImmDt/IETH");

impl<T: AsRef<[u8]>> Packet<T> {
    /// The 32-bit value.
    pub fn value(&self) -> u32 {
        be_uint(&self.buffer.as_ref()[field::VALUE]) as u32
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the 32-bit value.
    pub fn set_value(&mut self, value: u32) {
        put_be_uint(&mut self.buffer.as_mut()[field::VALUE], value.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_endian_word() {
        let mut bytes = [0u8; 4];
        Packet::new_unchecked(&mut bytes[..]).set_value(0xDEAD_BEEF);
        assert_eq!(bytes, [0xDE, 0xAD, 0xBE, 0xEF]);
        assert_eq!(
            Packet::new_checked(&bytes[..]).unwrap().value(),
            0xDEAD_BEEF
        );
    }
}
