//! The parts every fixed-size RoCE header view shares.

/// Defines `Packet<T>` for a fixed-size header: `new_unchecked`, `new_checked`
/// (at least `HEADER_LEN` bytes; extra bytes belong to what follows),
/// `check_len` and `into_inner`.
macro_rules! fixed_header {
    ($what:literal) => {
        /// A read/write view of the header at the start of a buffer.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct Packet<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> Packet<T> {
            /// Wraps a buffer without checks; accessors panic if it is short.
            pub const fn new_unchecked(buffer: T) -> Self {
                Packet { buffer }
            }

            /// Wraps a buffer after [`Packet::check_len`]; no accessor panics afterwards.
            pub fn new_checked(buffer: T) -> $crate::roce::Result<Self> {
                let packet = Self::new_unchecked(buffer);
                packet.check_len()?;
                Ok(packet)
            }

            /// Checks that the buffer holds at least [`HEADER_LEN`] bytes.
            pub fn check_len(&self) -> $crate::roce::Result<()> {
                let got = self.buffer.as_ref().len();
                if got < HEADER_LEN {
                    return Err($crate::roce::error::truncated($what, HEADER_LEN, got));
                }
                Ok(())
            }

            /// Returns the underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
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
