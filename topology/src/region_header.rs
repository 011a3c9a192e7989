//! The fixed words at the start of a region header (before its bitmap, see
//! [`crate::meta`]) and the region's format state.
//!
//! A pool grows by regions appended to its layout, and a new region's header
//! is formatted by the first client that sees it, not by the pool's format.
//! The state word says how far that got; clients change it only with
//! COMPARE_SWAP, so two clients never both format one region:
//!
//! ```text
//! anything else ──CAS──▶ formatting (owner, since) ──CAS──▶ FORMATTED
//!                              │ stale claim: CAS to a new claim ▲
//!                              └─────────────────────────────────┘
//! ```
//!
//! Between the claim and [`FORMATTED`] the claimant writes the rest of the
//! header (magic, geometry, bitmap with the never-free bits set, an empty key
//! table). Nothing is allocated from a region before it reads [`FORMATTED`],
//! so writing those bytes again is harmless: a client that finds a claim
//! older than the claim timeout (its claimant crashed or stalled) takes it
//! over with a claim of its own and formats the header again.
//!
//! Servers do not read these words: they read the key table, which stays
//! where [`crate::meta::RegionMeta::key_table_offset`] says.

/// Byte offsets of the fixed words (all little-endian u64).
pub mod word {
    /// [`crate::records::REGION_MAGIC`].
    pub const MAGIC: u64 = 0;
    /// The region's index when its header was formatted (informational).
    pub const INDEX: u64 = 8;
    /// Extents in the region, reserved ones included.
    pub const EXTENTS: u64 = 16;
    /// Leading extents reserved for metadata.
    pub const RESERVED: u64 = 24;
    /// The format state ([`super::RegionState`]).
    pub const STATE: u64 = 32;
    /// The region's PMEM start address: with [`EXTENTS`], its identity.
    pub const START: u64 = 40;
    /// Bytes of the fixed words a client reads to learn the state.
    pub const FIXED_LEN: u64 = 48;
}

// The fixed words end before the bitmap.
const _: () = assert!(word::START + 8 <= word::FIXED_LEN);
const _: () = assert!(word::FIXED_LEN <= crate::meta::REGION_HEADER_LEN);

/// The state word of a formatted header ("PFRGFMTD").
pub const FORMATTED: u64 = u64::from_le_bytes(*b"PFRGFMTD");

/// The top 16 bits of a formatting claim.
const CLAIM_TAG: u64 = 0xC1A1;

/// Where a region header is in its format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionState {
    /// Formatted: the region may be allocated from.
    Formatted,
    /// Client `owner` claimed it at unix second `since` and is formatting it.
    Formatting {
        /// The claimant's topology index.
        owner: u16,
        /// Unix seconds of the claim.
        since: u32,
    },
    /// Never formatted (zeroes on a new region, or anything unrecognised).
    Unformatted,
}

impl RegionState {
    /// The state a state word records.
    pub fn decode(word: u64) -> Self {
        if word == FORMATTED {
            Self::Formatted
        } else if word >> 48 == CLAIM_TAG {
            Self::Formatting {
                owner: (word >> 32) as u16,
                since: word as u32,
            }
        } else {
            Self::Unformatted
        }
    }

    /// The state word of this state ([`Self::Unformatted`] is 0).
    pub fn encode(self) -> u64 {
        match self {
            Self::Formatted => FORMATTED,
            Self::Formatting { owner, since } => {
                CLAIM_TAG << 48 | u64::from(owner) << 32 | u64::from(since)
            }
            Self::Unformatted => 0,
        }
    }

    /// The claim of client `owner` at unix second `now` (seconds past 2106
    /// saturate).
    pub fn claim(owner: u16, now: u64) -> Self {
        Self::Formatting {
            owner,
            since: u32::try_from(now).unwrap_or(u32::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_words_round_trip_and_zero_is_unformatted() {
        for state in [
            RegionState::Formatted,
            RegionState::claim(7, 1_800_000_000),
            RegionState::Unformatted,
        ] {
            assert_eq!(RegionState::decode(state.encode()), state);
        }
        assert_eq!(RegionState::decode(0), RegionState::Unformatted);
        assert_eq!(
            RegionState::decode(crate::records::REGION_MAGIC),
            RegionState::Unformatted
        );
        assert_eq!(
            RegionState::claim(1, u64::MAX),
            RegionState::Formatting {
                owner: 1,
                since: u32::MAX
            }
        );
    }
}
