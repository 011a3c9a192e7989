//! What the answers about a run of blocks (SCRUB_REPORT, BLOCK_SUMS_REPORT)
//! share: the head that says which blocks they speak of, and the list of
//! u64 words (one per block) each report ends with.
//!
//! ```text
//! 0..4   region     u32 region index
//! 4..8   block_len  u32 bytes per block
//! 8..16  first      u64 index of the first block of the run
//! 16..24 total      u64 blocks in the region
//! 24..   the report's own fields up to its fixed length, then `count`
//!        u64 words
//! ```

use crate::Field;
use crate::error::Result;
use crate::le;
use crate::view::{len_at_least, len_exactly};

/// Byte ranges of the head.
pub mod field {
    use crate::Field;

    /// The region index.
    pub const REGION: Field = 0..4;
    /// Bytes per block.
    pub const BLOCK_LEN: Field = 4..8;
    /// The first block of the run.
    pub const FIRST: Field = 8..16;
    /// Blocks in the region.
    pub const TOTAL: Field = 16..24;
}

/// Length of the head.
pub const HEAD_LEN: usize = 24;

/// The head of a report: which region, how its blocks are cut, where the
/// run starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Head {
    /// The region index.
    pub region: u32,
    /// Bytes per block.
    pub block_len: u32,
    /// The first block of the run.
    pub first: u64,
    /// Blocks in the region.
    pub total: u64,
}

impl Head {
    /// Reads the head at the start of `body` (at least [`HEAD_LEN`] bytes).
    pub(crate) fn read(body: &[u8]) -> Self {
        Self {
            region: le::u32_at(&body[field::REGION]),
            block_len: le::u32_at(&body[field::BLOCK_LEN]),
            first: le::u64_at(&body[field::FIRST]),
            total: le::u64_at(&body[field::TOTAL]),
        }
    }

    /// Writes the head at the start of `body` (at least [`HEAD_LEN`] bytes).
    pub(crate) fn write(&self, body: &mut [u8]) {
        le::put_u32(&mut body[field::REGION], self.region);
        le::put_u32(&mut body[field::BLOCK_LEN], self.block_len);
        le::put_u64(&mut body[field::FIRST], self.first);
        le::put_u64(&mut body[field::TOTAL], self.total);
    }
}

/// Checks that `body` holds a fixed part of `fixed_len` bytes and then
/// exactly as many u64 words as the u32 at `count` announces.
pub(crate) fn check_len(
    body: &[u8],
    fixed_len: usize,
    count: Field,
    what: &'static str,
) -> Result<()> {
    len_at_least(body.len(), fixed_len)?;
    let words = le::u32_at(&body[count]) as usize;
    let expected = words.saturating_mul(8).saturating_add(fixed_len);
    len_exactly(body.len(), expected, what)
}

/// The `i`th u64 word after a fixed part of `fixed_len` bytes.
pub(crate) fn word(body: &[u8], fixed_len: usize, i: usize) -> u64 {
    let at = fixed_len + i * 8;
    le::u64_at(&body[at..at + 8])
}

/// Writes `words` after a fixed part of `fixed_len` bytes.
pub(crate) fn put_words(body: &mut [u8], fixed_len: usize, words: &[u64]) {
    for (i, value) in words.iter().enumerate() {
        let at = fixed_len + i * 8;
        le::put_u64(&mut body[at..at + 8], *value);
    }
}

/// The number of `words` as the u32 a report's count field carries.
pub(crate) fn count_of(words: &[u64]) -> u32 {
    u32::try_from(words.len()).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_goes_round_at_its_offsets() {
        let head = Head {
            region: 7,
            block_len: 4096,
            first: 1 << 33,
            total: 3,
        };
        let mut body = [0u8; HEAD_LEN];
        head.write(&mut body);
        assert_eq!(body[0], 7);
        assert_eq!(&body[4..8], &4096u32.to_le_bytes());
        assert_eq!(&body[8..16], &(1u64 << 33).to_le_bytes());
        assert_eq!(body[16], 3);
        assert_eq!(Head::read(&body), head);
    }

    #[test]
    fn the_words_must_be_as_many_as_the_count_says() {
        // A fixed part of 28 bytes, its count at 24..28, then the words.
        let mut body = vec![0u8; 28 + 16];
        body[24] = 2;
        put_words(&mut body, 28, &[5, 9]);
        assert!(check_len(&body, 28, 24..28, "test report").is_ok());
        assert_eq!((word(&body, 28, 0), word(&body, 28, 1)), (5, 9));
        assert!(check_len(&body[..36], 28, 24..28, "test report").is_err());
        assert!(check_len(&body[..27], 28, 24..28, "test report").is_err());
        body[24] = 0xFF;
        assert!(check_len(&body, 28, 24..28, "test report").is_err());
    }
}
