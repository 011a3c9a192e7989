//! SCRUB and SCRUB_REPORT: an operator asks a server to check a run of a
//! region's blocks against the checksums it recorded, and the server says
//! what it found.
//!
//! SCRUB body:
//!
//! ```text
//! 0..4   region  u32 region index
//! 4..8   blocks  u32 how many blocks, 1..=MAX_BLOCKS
//! 8..16  first   u64 index of the first block
//! ```
//!
//! SCRUB_REPORT body:
//!
//! ```text
//! 0..24  head       region, block_len, first (the first block scrubbed),
//!                   total (module `block_report`)
//! 24..28 verified   u32 blocks whose checksum matched
//! 28..32 recorded   u32 blocks whose checksum was recorded (first scrub,
//!                       or written since)
//! 32..36 unwatched  u32 blocks not checked: written where the server
//!                       does not see it (RDMA)
//! 36..40 count      u32 mismatching blocks listed after this header
//! 40..   block      u64 index of each mismatching block, count times
//! ```
//!
//! A SCRUB the server refuses (not an operator, no such region, blocks
//! outside it) is answered with an ACKNOWLEDGE carrying the status.

use crate::block_report::{self, HEAD_LEN, Head};
use crate::error::{Error, Result};
use crate::le;
use crate::view::wire_view;

pub use crate::block_run::{HEADER_LEN, Packet, field};
pub use crate::limits::MAX_SCRUB_BLOCKS as MAX_BLOCKS;

/// A parsed SCRUB body: a run of at most [`MAX_BLOCKS`] blocks.
pub type Repr = crate::block_run::Repr<MAX_BLOCKS>;

/// Byte ranges of a SCRUB_REPORT body's fixed part after its head
/// ([`block_report::field`]).
pub mod report_field {
    use crate::Field;

    /// Blocks verified.
    pub const VERIFIED: Field = 24..28;
    /// Blocks recorded.
    pub const RECORDED: Field = 28..32;
    /// Blocks not checked.
    pub const UNWATCHED: Field = 32..36;
    /// Mismatching blocks listed.
    pub const COUNT: Field = 36..40;
}

/// Length of a SCRUB_REPORT body's fixed part.
pub const REPORT_HEADER_LEN: usize = 40;
const _: () = assert!(report_field::VERIFIED.start == HEAD_LEN);

wire_view! {
    /// A read/write view of a SCRUB_REPORT body.
    pub struct ReportPacket;
    error: Error;
}

impl<T: AsRef<[u8]>> ReportPacket<T> {
    /// Checks that the body holds the fixed part and exactly the blocks
    /// its count announces.
    pub fn check_len(&self) -> Result<()> {
        block_report::check_len(
            self.buffer.as_ref(),
            REPORT_HEADER_LEN,
            report_field::COUNT,
            "scrub report body",
        )
    }

    fn u32_field(&self, field: crate::Field) -> u32 {
        le::u32_at(&self.buffer.as_ref()[field])
    }

    /// Which blocks the report speaks of.
    pub fn head(&self) -> Head {
        Head::read(self.buffer.as_ref())
    }

    /// Blocks verified.
    pub fn verified(&self) -> u32 {
        self.u32_field(report_field::VERIFIED)
    }

    /// Blocks recorded.
    pub fn recorded(&self) -> u32 {
        self.u32_field(report_field::RECORDED)
    }

    /// Blocks not checked.
    pub fn unwatched(&self) -> u32 {
        self.u32_field(report_field::UNWATCHED)
    }

    /// Mismatching blocks listed.
    pub fn count(&self) -> u32 {
        self.u32_field(report_field::COUNT)
    }

    /// The index of the `i`th mismatching block (`i < count`).
    pub fn mismatch(&self, i: usize) -> u64 {
        block_report::word(self.buffer.as_ref(), REPORT_HEADER_LEN, i)
    }
}

/// A parsed SCRUB_REPORT body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Report {
    /// The region, its block length and size, and the first block scrubbed.
    pub head: Head,
    /// Blocks whose checksum matched.
    pub verified: u32,
    /// Blocks whose checksum was recorded.
    pub recorded: u32,
    /// Blocks not checked: written where the server does not see it.
    pub unwatched: u32,
    /// The index of each block whose bytes no longer match its checksum.
    pub mismatches: Vec<u64>,
}

impl Report {
    /// Parses a checked packet.
    pub fn parse<T: AsRef<[u8]>>(packet: &ReportPacket<T>) -> Result<Self> {
        Ok(Self {
            head: packet.head(),
            verified: packet.verified(),
            recorded: packet.recorded(),
            unwatched: packet.unwatched(),
            mismatches: (0..packet.count() as usize)
                .map(|i| packet.mismatch(i))
                .collect(),
        })
    }

    /// Length of the body.
    pub fn buffer_len(&self) -> usize {
        REPORT_HEADER_LEN + self.mismatches.len() * 8
    }

    /// Writes the body into `packet`, sized with [`Report::buffer_len`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut ReportPacket<T>) {
        let buf = packet.buffer.as_mut();
        self.head.write(buf);
        le::put_u32(&mut buf[report_field::VERIFIED], self.verified);
        le::put_u32(&mut buf[report_field::RECORDED], self.recorded);
        le::put_u32(&mut buf[report_field::UNWATCHED], self.unwatched);
        let count = block_report::count_of(&self.mismatches);
        le::put_u32(&mut buf[report_field::COUNT], count);
        block_report::put_words(buf, REPORT_HEADER_LEN, &self.mismatches);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRUB: [u8; 16] = [
        0x02, 0, 0, 0, // region 2
        0x40, 0, 0, 0, // 64 blocks
        0x80, 0, 0, 0, 0, 0, 0, 0, // from block 128
    ];

    #[test]
    fn scrub_bytes() {
        let repr = Repr::parse(&Packet::new_checked(&SCRUB[..]).unwrap()).unwrap();
        assert_eq!(
            repr,
            Repr {
                region: 2,
                first: 128,
                blocks: 64
            }
        );
        let mut buf = [0u8; HEADER_LEN];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, SCRUB);
    }

    #[test]
    fn scrub_block_counts_are_bounded() {
        let mut zero = SCRUB;
        zero[4] = 0;
        assert!(Repr::parse(&Packet::new_checked(&zero[..]).unwrap()).is_err());
        let mut many = SCRUB;
        many[4..8].copy_from_slice(&(MAX_BLOCKS + 1).to_le_bytes());
        assert!(Repr::parse(&Packet::new_checked(&many[..]).unwrap()).is_err());
        assert!(Packet::new_checked(&SCRUB[..15]).is_err());
    }

    #[test]
    fn report_bytes() {
        let bytes: [u8; 56] = [
            0x01, 0, 0, 0, // region 1
            0x00, 0, 0x01, 0, // 64 KiB blocks
            0x00, 0, 0, 0, 0, 0, 0, 0, // from block 0
            0x40, 0, 0, 0, 0, 0, 0, 0, // 64 blocks
            0x3D, 0, 0, 0, // 61 verified
            0x01, 0, 0, 0, // 1 recorded
            0x00, 0, 0, 0, // 0 unwatched
            0x02, 0, 0, 0, // 2 mismatches
            0x05, 0, 0, 0, 0, 0, 0, 0, // block 5
            0x3F, 0, 0, 0, 0, 0, 0, 0, // block 63
        ];
        let report = Report::parse(&ReportPacket::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(
            report,
            Report {
                head: Head {
                    region: 1,
                    block_len: 65536,
                    first: 0,
                    total: 64,
                },
                verified: 61,
                recorded: 1,
                unwatched: 0,
                mismatches: vec![5, 63],
            }
        );
        assert_eq!(report.buffer_len(), bytes.len());
        let mut buf = [0u8; 56];
        report.emit(&mut ReportPacket::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes);
        // A count the body does not hold.
        assert!(ReportPacket::new_checked(&bytes[..48]).is_err());
        let mut lying = bytes;
        lying[36] = 0xFF;
        assert!(ReportPacket::new_checked(&lying[..]).is_err());
    }
}
