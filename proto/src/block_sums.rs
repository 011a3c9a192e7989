//! BLOCK_SUMS and BLOCK_SUMS_REPORT: a peer asks a server for the checksums
//! of a run of a region copy's blocks as the bytes are now, and the server
//! answers with one checksum per block. Two copies of a region are compared
//! block by block this way without moving their bytes: only the blocks
//! whose checksums differ need copying.
//!
//! BLOCK_SUMS body (the layout of a SCRUB body):
//!
//! ```text
//! 0..4   region  u32 region index
//! 4..8   blocks  u32 how many blocks, 1..=MAX_BLOCKS
//! 8..16  first   u64 index of the first block
//! ```
//!
//! BLOCK_SUMS_REPORT body:
//!
//! ```text
//! 0..24  head       region, block_len, first (the first block summed),
//!                   total (module `block_report`)
//! 24..28 count      u32 checksums listed after this header
//! 28..32 reserved   zero
//! 32..   sum        u64 checksum of each block from `first`, count times
//! ```
//!
//! A checksum is never 0. A BLOCK_SUMS the server refuses (the peer is
//! neither an operator nor a fabric device, no such region, blocks outside
//! it, a block it cannot read) is answered with an ACKNOWLEDGE carrying the
//! status.

use crate::block_report::{self, HEAD_LEN, Head};
use crate::error::{Error, Result};
use crate::le;
use crate::view::wire_view;

pub use crate::block_run::{HEADER_LEN, Packet, field};
pub use crate::limits::MAX_BLOCK_SUMS as MAX_BLOCKS;

/// A parsed BLOCK_SUMS body: a run of at most [`MAX_BLOCKS`] blocks.
pub type Repr = crate::block_run::Repr<MAX_BLOCKS>;

/// Byte ranges of a BLOCK_SUMS_REPORT body's fixed part after its head
/// ([`block_report::field`]).
pub mod report_field {
    use crate::Field;

    /// Checksums listed.
    pub const COUNT: Field = 24..28;
    /// Zero.
    pub const RESERVED: Field = 28..32;
}

/// Length of a BLOCK_SUMS_REPORT body's fixed part.
pub const REPORT_HEADER_LEN: usize = 32;
const _: () = assert!(report_field::COUNT.start == HEAD_LEN);

wire_view! {
    /// A read/write view of a BLOCK_SUMS_REPORT body.
    pub struct ReportPacket;
    error: Error;
}

impl<T: AsRef<[u8]>> ReportPacket<T> {
    /// Checks that the body holds the fixed part and exactly the checksums
    /// its count announces.
    pub fn check_len(&self) -> Result<()> {
        block_report::check_len(
            self.buffer.as_ref(),
            REPORT_HEADER_LEN,
            report_field::COUNT,
            "block sums report body",
        )
    }

    fn u32_field(&self, field: crate::Field) -> u32 {
        le::u32_at(&self.buffer.as_ref()[field])
    }

    /// Which blocks the report speaks of.
    pub fn head(&self) -> Head {
        Head::read(self.buffer.as_ref())
    }

    /// Checksums listed.
    pub fn count(&self) -> u32 {
        self.u32_field(report_field::COUNT)
    }

    /// The reserved word (zero).
    pub fn reserved(&self) -> u32 {
        self.u32_field(report_field::RESERVED)
    }

    /// The checksum of block `first + i` (`i < count`).
    pub fn sum(&self, i: usize) -> u64 {
        block_report::word(self.buffer.as_ref(), REPORT_HEADER_LEN, i)
    }
}

/// A parsed BLOCK_SUMS_REPORT body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Report {
    /// The region, its block length and size, and the first block summed.
    pub head: Head,
    /// The checksum of each block from `head.first` on, as its bytes were
    /// when the server read them.
    pub sums: Vec<u64>,
}

impl Report {
    /// Parses a checked packet; a reserved word other than zero or more
    /// checksums than [`MAX_BLOCKS`] is refused.
    pub fn parse<T: AsRef<[u8]>>(packet: &ReportPacket<T>) -> Result<Self> {
        let reserved = packet.reserved();
        if reserved != 0 {
            return Err(Error::ReservedBits {
                what: "block sums report reserved word",
                value: reserved.into(),
            });
        }
        if packet.count() > MAX_BLOCKS {
            return Err(Error::LengthMismatch {
                what: "block sums report count",
                expected: MAX_BLOCKS as usize,
                got: packet.count() as usize,
            });
        }
        Ok(Self {
            head: packet.head(),
            sums: (0..packet.count() as usize)
                .map(|i| packet.sum(i))
                .collect(),
        })
    }

    /// Checks the number of checksums.
    pub fn check(&self) -> Result<()> {
        if self.sums.len() > MAX_BLOCKS as usize {
            return Err(Error::LengthMismatch {
                what: "block sums report count",
                expected: MAX_BLOCKS as usize,
                got: self.sums.len(),
            });
        }
        Ok(())
    }

    /// Length of the body.
    pub fn buffer_len(&self) -> usize {
        REPORT_HEADER_LEN + self.sums.len() * 8
    }

    /// Writes the body into `packet`, sized with [`Report::buffer_len`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut ReportPacket<T>) {
        let buf = packet.buffer.as_mut();
        self.head.write(buf);
        let count = block_report::count_of(&self.sums);
        le::put_u32(&mut buf[report_field::COUNT], count);
        le::put_u32(&mut buf[report_field::RESERVED], 0);
        block_report::put_words(buf, REPORT_HEADER_LEN, &self.sums);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ASK: [u8; 16] = [
        0x03, 0, 0, 0, // region 3
        0x10, 0, 0, 0, // 16 blocks
        0x20, 0, 0, 0, 0, 0, 0, 0, // from block 32
    ];

    #[test]
    fn block_sums_bytes() {
        let repr = Repr::parse(&Packet::new_checked(&ASK[..]).unwrap()).unwrap();
        assert_eq!(
            repr,
            Repr {
                region: 3,
                first: 32,
                blocks: 16
            }
        );
        let mut buf = [0u8; HEADER_LEN];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, ASK);
    }

    #[test]
    fn block_counts_are_bounded() {
        let mut zero = ASK;
        zero[4] = 0;
        assert!(Repr::parse(&Packet::new_checked(&zero[..]).unwrap()).is_err());
        let mut many = ASK;
        many[4..8].copy_from_slice(&(MAX_BLOCKS + 1).to_le_bytes());
        assert!(Repr::parse(&Packet::new_checked(&many[..]).unwrap()).is_err());
        assert!(Packet::new_checked(&ASK[..15]).is_err());
        let mut long = ASK.to_vec();
        long.push(0);
        assert!(Packet::new_checked(&long[..]).is_err());
    }

    const REPORT: [u8; 48] = [
        0x01, 0, 0, 0, // region 1
        0x00, 0, 0x01, 0, // 64 KiB blocks
        0x04, 0, 0, 0, 0, 0, 0, 0, // from block 4
        0x40, 0, 0, 0, 0, 0, 0, 0, // 64 blocks
        0x02, 0, 0, 0, // 2 checksums
        0x00, 0, 0, 0, // reserved
        0x11, 0x22, 0, 0, 0x01, 0, 0, 0, // block 4
        0x33, 0x44, 0, 0, 0x01, 0, 0, 0, // block 5
    ];

    #[test]
    fn report_bytes() {
        let report = Report::parse(&ReportPacket::new_checked(&REPORT[..]).unwrap()).unwrap();
        assert_eq!(
            report,
            Report {
                head: Head {
                    region: 1,
                    block_len: 65536,
                    first: 4,
                    total: 64,
                },
                sums: vec![0x1_0000_2211, 0x1_0000_4433],
            }
        );
        assert_eq!(report.buffer_len(), REPORT.len());
        let mut buf = [0u8; 48];
        report.emit(&mut ReportPacket::new_unchecked(&mut buf[..]));
        assert_eq!(buf, REPORT);
    }

    #[test]
    fn reports_that_lie_are_refused() {
        // A count the body does not hold, or more than it announces.
        assert!(ReportPacket::new_checked(&REPORT[..40]).is_err());
        let mut lying = REPORT;
        lying[24] = 0xFF;
        assert!(ReportPacket::new_checked(&lying[..]).is_err());
        let mut short = REPORT;
        short[24] = 1;
        assert!(ReportPacket::new_checked(&short[..]).is_err());
        // A reserved word that is not zero.
        let mut reserved = REPORT;
        reserved[29] = 1;
        let packet = ReportPacket::new_checked(&reserved[..]).unwrap();
        assert!(Report::parse(&packet).is_err());
        // More checksums than one request may ask for.
        let too_many = Report {
            sums: vec![1; MAX_BLOCKS as usize + 1],
            ..Report::default()
        };
        assert!(too_many.check().is_err());
        let mut buf = vec![0u8; too_many.buffer_len()];
        too_many.emit(&mut ReportPacket::new_unchecked(&mut buf[..]));
        let packet = ReportPacket::new_checked(&buf[..]).unwrap();
        assert!(Report::parse(&packet).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // Every prefix of every header with every count byte.
        for len in 0..=REPORT.len() {
            for count in [0u8, 1, 2, 3, 0xFF] {
                let mut bytes = REPORT[..len].to_vec();
                if len > 24 {
                    bytes[24] = count;
                }
                if let Ok(packet) = ReportPacket::new_checked(&bytes[..]) {
                    let _ = Report::parse(&packet);
                }
                if let Ok(packet) = Packet::new_checked(&bytes[..]) {
                    let _ = Repr::parse(&packet);
                }
            }
        }
    }
}
