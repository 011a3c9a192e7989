//! How the device numbers its RoCE queue pairs, and the random numbers they
//! start from. The gateway's queue pairs (toward clients) and the uplinks'
//! (toward servers) share one 24-bit QP number space, split in two ranges.

use std::time::Instant;

/// The gateway's first QP number for client queue pairs; numbers below are
/// left free.
pub const GATEWAY_QPN_FIRST: u32 = 0x100;
/// QP numbers of the device's requester queue pairs toward servers; client
/// queue pairs of the gateway stay below.
pub const QPN_BASE: u32 = 0xF0_0000;

/// 32 random bits from the operating system (starting PSNs, R_Keys).
pub(crate) fn random_u32() -> u32 {
    let mut bytes = [0u8; 4];
    // The OS source does not fail on Linux once booted; if it ever did, the
    // key would be a guessable zero-based value, so fall back to the
    // process's randomly seeded hasher rather than a constant.
    if getrandom::fill(&mut bytes).is_err() {
        use std::hash::{BuildHasher, RandomState};
        return RandomState::new().hash_one(Instant::now()) as u32;
    }
    u32::from_le_bytes(bytes)
}
