//! Little-endian integer access on byte slices of the exact width.
//!
//! Callers pass `&data[field::X]` with a constant range of the right width, so
//! the width check inside `copy_from_slice` cannot fail for them.

pub(crate) fn u16_at(bytes: &[u8]) -> u16 {
    let mut raw = [0; 2];
    raw.copy_from_slice(bytes);
    u16::from_le_bytes(raw)
}

pub(crate) fn u32_at(bytes: &[u8]) -> u32 {
    let mut raw = [0; 4];
    raw.copy_from_slice(bytes);
    u32::from_le_bytes(raw)
}

pub(crate) fn u64_at(bytes: &[u8]) -> u64 {
    let mut raw = [0; 8];
    raw.copy_from_slice(bytes);
    u64::from_le_bytes(raw)
}

pub(crate) fn put_u16(bytes: &mut [u8], value: u16) {
    bytes.copy_from_slice(&value.to_le_bytes());
}

pub(crate) fn put_u32(bytes: &mut [u8], value: u32) {
    bytes.copy_from_slice(&value.to_le_bytes());
}

pub(crate) fn put_u64(bytes: &mut [u8], value: u64) {
    bytes.copy_from_slice(&value.to_le_bytes());
}
