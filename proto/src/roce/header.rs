//! The parts every fixed-size RoCE header view shares.

/// Defines `Packet<T>` for a fixed-size header (a `wire_view`) and its
/// `check_len`: at least `HEADER_LEN` bytes; extra bytes belong to what
/// follows.
macro_rules! fixed_header {
    ($what:literal) => {
        $crate::view::wire_view! {
            /// A read/write view of the header at the start of a buffer.
            pub struct Packet;
            error: $crate::roce::Error;
        }

        impl<T: AsRef<[u8]>> Packet<T> {
            /// Checks that the buffer holds at least [`HEADER_LEN`] bytes.
            pub fn check_len(&self) -> $crate::roce::Result<()> {
                let got = self.buffer.as_ref().len();
                if got < HEADER_LEN {
                    return Err($crate::roce::error::truncated($what, HEADER_LEN, got));
                }
                Ok(())
            }
        }
    };
}

pub(crate) use fixed_header;

/// Reads a big-endian integer of 1..=8 bytes.
pub(crate) fn be_uint(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0, |acc, &b| (acc << 8) | u64::from(b))
}

/// Writes `value` as a big-endian integer filling `bytes` (1..=8 bytes).
pub(crate) fn put_be_uint(bytes: &mut [u8], value: u64) {
    let len = bytes.len();
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = (value >> (8 * (len - 1 - i))) as u8;
    }
}
