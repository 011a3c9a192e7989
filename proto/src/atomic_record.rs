//! The record of a decided atomic that an ATOMIC_WRITE may carry (flag
//! RECORDED): which COMPARE_SWAP, FETCH_ADD or exactly-once ATOMIC_WRITE
//! the stored word is the outcome of, and what it returned.
//!
//! A replicated region's owner device decides such an atomic at one copy and writes the word it left to the other copies with
//! ATOMIC_WRITE under the client's exactly-once identity. With the record,
//! each of those copies also remembers the atomic in its exactly-once
//! window (its digest from the fields below, and its result), so a retry of
//! the same atomic reaching that copy later — once it decides for the
//! region — is answered from the window instead of applied again. Only a
//! fabric device sends it; a server refuses it from a client.
//!
//! ```text
//! 0      operation u8: the atomic's opcode, COMPARE_SWAP (0x13), FETCH_ADD
//!                  (0x14) or ATOMIC_WRITE (0x1D)
//! 1..8   reserved zero
//! 8..16  compare   u64: the COMPARE_SWAP's compare value; zero for the others
//! 16..24 operand   u64: the swap or add value, or the value stored
//! 24..32 result    u64: what the atomic returned (the word before it)
//! ```
//!
//! The record is the request's payload; the word to store is the
//! request's operand, as for any ATOMIC_WRITE, and the word's place is the
//! request's target.

use crate::error::{Error, Result};
use crate::le;
use crate::opcode::Opcode;

/// Bytes of a record.
pub const RECORD_LEN: usize = 32;

/// A decided COMPARE_SWAP, FETCH_ADD or ATOMIC_WRITE, as an ATOMIC_WRITE
/// carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicRecord {
    /// [`Opcode::CompareSwap`], [`Opcode::FetchAdd`] or
    /// [`Opcode::AtomicWrite`].
    pub operation: Opcode,
    /// The compare value of a COMPARE_SWAP; zero for the others.
    pub compare: u64,
    /// The swap or add value, or the value stored.
    pub operand: u64,
    /// What the atomic returned: the word before it.
    pub result: u64,
}

impl AtomicRecord {
    /// The record of `operation` (COMPARE_SWAP, FETCH_ADD or ATOMIC_WRITE;
    /// [`Self::parse`] refuses any other) with its operands and result; the
    /// compare value of anything but a COMPARE_SWAP is dropped (it means
    /// nothing).
    pub fn new(operation: Opcode, compare: u64, operand: u64, result: u64) -> Self {
        let compare = match operation {
            Opcode::CompareSwap => compare,
            _ => 0,
        };
        Self {
            operation,
            compare,
            operand,
            result,
        }
    }

    /// Parses a record; refuses another length, an operation other than
    /// COMPARE_SWAP, FETCH_ADD or ATOMIC_WRITE, reserved bytes that are not
    /// zero, and a compare value on anything but a COMPARE_SWAP.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        if bytes.len() != RECORD_LEN {
            return Err(Error::LengthMismatch {
                what: "atomic record",
                expected: RECORD_LEN,
                got: bytes.len(),
            });
        }
        let operation = match Opcode::from(bytes[0]) {
            op @ (Opcode::CompareSwap | Opcode::FetchAdd | Opcode::AtomicWrite) => op,
            _ => {
                return Err(Error::ReservedBits {
                    what: "operation of an atomic record",
                    value: bytes[0].into(),
                });
            }
        };
        if bytes[1..8].iter().any(|&b| b != 0) {
            return Err(Error::ReservedBits {
                what: "atomic record reserved bytes",
                value: le::u64_at(&bytes[0..8]) >> 8,
            });
        }
        let compare = le::u64_at(&bytes[8..16]);
        if operation != Opcode::CompareSwap && compare != 0 {
            return Err(Error::ReservedBits {
                what: "compare value of a recorded FETCH_ADD or ATOMIC_WRITE",
                value: compare,
            });
        }
        Ok(Self {
            operation,
            compare,
            operand: le::u64_at(&bytes[16..24]),
            result: le::u64_at(&bytes[24..32]),
        })
    }

    /// The record's bytes.
    pub fn to_bytes(&self) -> [u8; RECORD_LEN] {
        let mut out = [0u8; RECORD_LEN];
        out[0] = self.operation.into();
        out[8..16].copy_from_slice(&self.compare.to_le_bytes());
        out[16..24].copy_from_slice(&self.operand.to_le_bytes());
        out[24..32].copy_from_slice(&self.result.to_le_bytes());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_has_this_byte_layout() {
        let record = AtomicRecord::new(Opcode::CompareSwap, 5, 6, 0x0102);
        let bytes = record.to_bytes();
        #[rustfmt::skip]
        let expected: [u8; RECORD_LEN] = [
            0x13, 0, 0, 0, 0, 0, 0, 0,
            5, 0, 0, 0, 0, 0, 0, 0,
            6, 0, 0, 0, 0, 0, 0, 0,
            0x02, 0x01, 0, 0, 0, 0, 0, 0,
        ];
        assert_eq!(bytes, expected);
        assert_eq!(AtomicRecord::parse(&bytes).unwrap(), record);
    }

    #[test]
    fn a_fetch_add_or_atomic_write_records_no_compare_value() {
        for operation in [Opcode::FetchAdd, Opcode::AtomicWrite] {
            let record = AtomicRecord::new(operation, 99, 1, 7);
            assert_eq!(record.compare, 0);
            assert_eq!(AtomicRecord::parse(&record.to_bytes()).unwrap(), record);
            let mut bytes = record.to_bytes();
            bytes[8] = 1;
            assert!(
                matches!(AtomicRecord::parse(&bytes), Err(Error::ReservedBits { .. })),
                "{operation:?}"
            );
        }
    }

    #[test]
    fn other_operations_lengths_and_reserved_bytes_are_refused() {
        let good = AtomicRecord::new(Opcode::FetchAdd, 0, 1, 2).to_bytes();
        for opcode in [0x10u8, 0x12, 0x00, 0xFF] {
            let mut bytes = good;
            bytes[0] = opcode;
            assert!(
                matches!(AtomicRecord::parse(&bytes), Err(Error::ReservedBits { .. })),
                "{opcode:#x}"
            );
        }
        let mut reserved = good;
        reserved[3] = 1;
        assert!(matches!(
            AtomicRecord::parse(&reserved),
            Err(Error::ReservedBits { .. })
        ));
        assert!(matches!(
            AtomicRecord::parse(&good[..31]),
            Err(Error::LengthMismatch { .. })
        ));
    }
}
