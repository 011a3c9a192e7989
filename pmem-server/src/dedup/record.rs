//! What the exactly-once window remembers of one atomic, and the checks
//! that tie a record to its request and to its place in the window file.
//! A leaf: the table, the file and the stale marks all build on it.

/// Results remembered per exactly-once identity (the window).
pub const WINDOW: usize = 4096;

/// Which request a recorded result belongs to: a 64-bit digest of the
/// operation, the word it targets and its operands. A retry of the same
/// request has the same digest; another request under a recorded
/// (client, lane, seq) does not, and is never answered from the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestDigest(pub u64);

impl RequestDigest {
    /// The digest of an exactly-once atomic: its opcode, the word's region
    /// and offset, and its two operands (the compare value of a
    /// COMPARE_SWAP, 0 for a FETCH_ADD).
    pub fn of(opcode: u8, region: u32, offset: u64, compare: u64, operand: u64) -> Self {
        let mut bytes = [0u8; 32];
        bytes[0] = opcode;
        bytes[4..8].copy_from_slice(&region.to_le_bytes());
        bytes[8..16].copy_from_slice(&offset.to_le_bytes());
        bytes[16..24].copy_from_slice(&compare.to_le_bytes());
        bytes[24..32].copy_from_slice(&operand.to_le_bytes());
        RequestDigest(checksum(&bytes))
    }
}

/// A result in the window: the value the atomic returned, and the digest
/// of the request that produced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    /// The atomic's result (the word before it).
    pub value: u64,
    /// The request it answers.
    pub digest: RequestDigest,
}

/// A 64-bit check over `bytes` that is never 0, so an all-zero (cleared
/// or never written) record never passes it. It catches torn and damaged
/// records, not tampering: whoever can write the file can also recompute it.
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0x243f_6a88_85a3_08d3;
    for chunk in bytes.chunks(8) {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        h ^= u64::from_le_bytes(word);
        h = (h ^ (h >> 31)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= h >> 29;
    }
    h | 1
}

/// [`checksum`] over a list of words.
pub fn checksum_words(words: &[u64]) -> u64 {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    checksum(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_of_a_request_changes_its_digest() {
        let base = RequestDigest::of(0x14, 1, 64, 0, 1);
        for other in [
            RequestDigest::of(0x13, 1, 64, 0, 1),
            RequestDigest::of(0x14, 2, 64, 0, 1),
            RequestDigest::of(0x14, 1, 72, 0, 1),
            RequestDigest::of(0x14, 1, 64, 5, 1),
            RequestDigest::of(0x14, 1, 64, 0, 2),
        ] {
            assert_ne!(base, other);
        }
        assert_eq!(base, RequestDigest::of(0x14, 1, 64, 0, 1));
    }

    #[test]
    fn no_checksum_is_zero() {
        assert_ne!(checksum(&[0; 32]), 0);
        assert_ne!(checksum_words(&[]), 0);
    }
}
