//! The protocol's version numbers and size limits, each stated once.
//!
//! Every limit here is part of the wire format: a peer that exceeds one is
//! refused, whatever its own build allows. The modules that parse the
//! messages re-export the limits that concern them (`frame::MAX_DATA_LEN`,
//! `hello::PROTOCOL_VERSION`, …), so either path names the same constant.

/// The frame format version in every frame header (byte 2).
pub const FRAME_VERSION: u8 = 1;

/// The protocol version every daemon and client of this build speaks (in
/// HELLO); a peer announcing a lower one is refused with `VERSION_MISMATCH`.
pub const PROTOCOL_VERSION: u16 = 1;

/// Largest data transfer in one frame: WRITE payload, READ length, READ
/// response data.
pub const MAX_DATA_LEN: u32 = 16 << 20;

/// Largest body a frame may claim: room for [`MAX_DATA_LEN`] plus the fixed
/// part of a request or response body.
pub const MAX_BODY_LEN: u32 = MAX_DATA_LEN + 64;

/// Operand width of the 8-byte atomics, and the `length` they carry.
pub const ATOMIC_LEN: u32 = 8;

/// Longest peer name in a HELLO, in bytes.
pub const MAX_NAME_LEN: usize = 255;

/// The most blocks one SCRUB may ask for.
pub const MAX_SCRUB_BLOCKS: u32 = 1024;

/// The most blocks one BLOCK_SUMS may ask for (its answer: 8 bytes each).
pub const MAX_BLOCK_SUMS: u32 = 1024;

/// Most R_Key entries a QP_ACCEPT may carry.
pub const MAX_RKEYS: usize = 1 << 16;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_data_transfer_fits_a_frame_body() {
        assert_eq!(MAX_DATA_LEN, 16 * 1024 * 1024);
        assert_eq!(MAX_BODY_LEN, 16 * 1024 * 1024 + 64);
    }
}
