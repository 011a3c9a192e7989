//! MAP: the PMEM address map, answering MAP_REQUEST (whose body is empty).
//!
//! ```text
//! 0..32   digest       [u8; 32] of the topology layout
//! 32..40  extent_size  u64
//! 40..44  count        u32 entries
//! 44..48  reserved     zero
//! 48..    entries      count × 32 bytes; nothing follows:
//!           0..8   start   u64 PmemAddr
//!           8..16  len     u64
//!           16..20 region  u32 RegionIndex
//!           20..22 server  u16
//!           22..24 socket  u16
//!           24..32 key     u64 region key, 0 when not given
//! ```
//!
//! Region keys are made by the server that holds the region and are not
//! part of the topology. A MAP carries the key of a region only to a peer
//! that may use it: a server gives a fabric device the keys of all its
//! regions and a client those of the regions its grants reach; a fabric
//! device gives a client the keys it learnt from the servers, again only
//! for the client's regions. Everywhere else the key is 0, which opens
//! nothing.

use crate::error::{Error, Result};
use crate::le;
use crate::view::{len_as_announced, len_at_least, wire_view};
use crate::{AccessKey, PmemAddr, RegionIndex};

/// Byte ranges of a MAP body.
pub mod field {
    use crate::{Field, Rest};

    /// Layout digest.
    pub const DIGEST: Field = 0..32;
    /// Extent size.
    pub const EXTENT_SIZE: Field = 32..40;
    /// Number of entries.
    pub const COUNT: Field = 40..44;
    /// Reserved, zero.
    pub const RESERVED: Field = 44..48;
    /// The entries.
    pub const ENTRIES: Rest = 48..;

    /// Byte ranges inside one entry.
    pub mod entry {
        use crate::Field;

        /// First PMEM address.
        pub const START: Field = 0..8;
        /// Length in bytes.
        pub const LEN: Field = 8..16;
        /// Region index.
        pub const REGION: Field = 16..20;
        /// Server number.
        pub const SERVER: Field = 20..22;
        /// CPU socket of the region on its server.
        pub const SOCKET: Field = 22..24;
        /// Region key, 0 when not given.
        pub const KEY: Field = 24..32;
    }
}

/// Length of the fixed part of a MAP body.
pub const HEADER_LEN: usize = 48;
/// Length of one entry.
pub const ENTRY_LEN: usize = 32;

wire_view! {
    /// A read/write view of a MAP body.
    pub struct Packet;
    error: Error;
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks that the fixed part is there and `count` entries fill the rest exactly.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        len_at_least(len, HEADER_LEN)?;
        let expected = HEADER_LEN as u64 + u64::from(self.entry_count()) * ENTRY_LEN as u64;
        let expected = usize::try_from(expected).unwrap_or(usize::MAX);
        len_as_announced(len, expected, "map body")
    }

    /// The layout digest.
    pub fn digest(&self) -> [u8; 32] {
        let mut digest = [0; 32];
        digest.copy_from_slice(&self.buffer.as_ref()[field::DIGEST]);
        digest
    }

    /// The extent size.
    pub fn extent_size(&self) -> u64 {
        le::u64_at(&self.buffer.as_ref()[field::EXTENT_SIZE])
    }

    /// The number of entries the body announces.
    pub fn entry_count(&self) -> u32 {
        le::u32_at(&self.buffer.as_ref()[field::COUNT])
    }

    /// The reserved bytes (zero when well formed).
    pub fn reserved(&self) -> u32 {
        le::u32_at(&self.buffer.as_ref()[field::RESERVED])
    }

    /// Entry `index`, or `None` past the end of the buffer.
    pub fn entry(&self, index: usize) -> Option<MapEntry> {
        let start = HEADER_LEN.checked_add(index.checked_mul(ENTRY_LEN)?)?;
        let raw = self
            .buffer
            .as_ref()
            .get(start..start.checked_add(ENTRY_LEN)?)?;
        Some(MapEntry {
            start: PmemAddr(le::u64_at(&raw[field::entry::START])),
            len: le::u64_at(&raw[field::entry::LEN]),
            region: RegionIndex(le::u32_at(&raw[field::entry::REGION])),
            server: le::u16_at(&raw[field::entry::SERVER]),
            socket: le::u16_at(&raw[field::entry::SOCKET]),
            key: AccessKey(le::u64_at(&raw[field::entry::KEY])),
        })
    }

    /// The entries in order (as many whole entries as the buffer holds).
    pub fn entries(&self) -> impl Iterator<Item = MapEntry> + '_ {
        (0..).map_while(|i| self.entry(i))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the layout digest.
    pub fn set_digest(&mut self, value: &[u8; 32]) {
        self.buffer.as_mut()[field::DIGEST].copy_from_slice(value);
    }

    /// Sets the extent size.
    pub fn set_extent_size(&mut self, value: u64) {
        le::put_u64(&mut self.buffer.as_mut()[field::EXTENT_SIZE], value);
    }

    /// Sets the number of entries.
    pub fn set_entry_count(&mut self, value: u32) {
        le::put_u32(&mut self.buffer.as_mut()[field::COUNT], value);
    }

    /// Zeroes the reserved bytes.
    pub fn clear_reserved(&mut self) {
        self.buffer.as_mut()[field::RESERVED].fill(0);
    }

    /// Writes entry `index`; the buffer must reach past it.
    pub fn set_entry(&mut self, index: usize, entry: &MapEntry) {
        let start = HEADER_LEN + index * ENTRY_LEN;
        let raw = &mut self.buffer.as_mut()[start..start + ENTRY_LEN];
        le::put_u64(&mut raw[field::entry::START], entry.start.0);
        le::put_u64(&mut raw[field::entry::LEN], entry.len);
        le::put_u32(&mut raw[field::entry::REGION], entry.region.0);
        le::put_u16(&mut raw[field::entry::SERVER], entry.server);
        le::put_u16(&mut raw[field::entry::SOCKET], entry.socket);
        le::put_u64(&mut raw[field::entry::KEY], entry.key.get());
    }
}

/// One mapped range of the PMEM address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MapEntry {
    /// First PMEM address of the range.
    pub start: PmemAddr,
    /// Length in bytes.
    pub len: u64,
    /// The region holding it.
    pub region: RegionIndex,
    /// The server owning the region.
    pub server: u16,
    /// The CPU socket the region's device hangs off.
    pub socket: u16,
    /// The region key, or [`AccessKey::NONE`] when the sender does not give it.
    pub key: AccessKey,
}

/// A parsed MAP body.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// Digest of the layout, compared across daemons and clients.
    pub digest: [u8; 32],
    /// Extent size of the virtual address space.
    pub extent_size: u64,
    /// The mapped ranges.
    pub entries: Vec<MapEntry>,
}

impl Repr {
    /// Parses a MAP body; rejects non-zero reserved bytes (`ReservedBits`).
    ///
    /// Allocates one `MapEntry` per entry; the count is bounded by the body
    /// length, itself bounded by the frame header check.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        if packet.reserved() != 0 {
            return Err(Error::ReservedBits {
                what: "map reserved bytes",
                value: packet.reserved().into(),
            });
        }
        Ok(Repr {
            digest: packet.digest(),
            extent_size: packet.extent_size(),
            entries: packet.entries().collect(),
        })
    }

    /// The key this MAP gives for `region`: [`AccessKey::NONE`] when it
    /// names no such region or does not give its key.
    pub fn key(&self, region: RegionIndex) -> AccessKey {
        self.entries
            .iter()
            .find(|e| e.region == region)
            .map_or(AccessKey::NONE, |e| e.key)
    }

    /// Length of the body this value encodes to.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.entries.len() * ENTRY_LEN
    }

    /// Writes this value into a body of at least [`Repr::buffer_len`] bytes.
    ///
    /// More than `u32::MAX` entries cannot be framed; [`crate::Message::emit`]
    /// rejects them through the body length limit long before.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_digest(&self.digest);
        packet.set_extent_size(self.extent_size);
        packet.set_entry_count(u32::try_from(self.entries.len()).unwrap_or(u32::MAX));
        packet.clear_reserved();
        for (index, entry) in self.entries.iter().enumerate() {
            packet.set_entry(index, entry);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Digest 0x00..0x1F, extent 2 MiB, two entries.
    fn bytes() -> Vec<u8> {
        let mut bytes: Vec<u8> = (0..32).collect();
        bytes.extend_from_slice(&[0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00]); // extent_size
        bytes.extend_from_slice(&[0x02, 0x00, 0x00, 0x00]); // count
        bytes.extend_from_slice(&[0x00, 0x00, 0x00, 0x00]); // reserved
        bytes.extend_from_slice(&[
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // start 0
            0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00, // len 1 GiB
            0x00, 0x00, 0x00, 0x00, // region 0
            0x00, 0x00, // server 0
            0x01, 0x00, // socket 1
            0xEF, 0xCD, 0xAB, 0x89, 0x67, 0x45, 0x23, 0x01, // key
        ]);
        bytes.extend_from_slice(&[
            0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00, // start 1 GiB
            0x00, 0x00, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00, // len 2 GiB
            0x05, 0x00, 0x00, 0x00, // region 5
            0x02, 0x01, // server 0x102
            0x00, 0x00, // socket 0
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // key not given
        ]);
        bytes
    }

    fn repr() -> Repr {
        let mut digest = [0u8; 32];
        for (i, b) in digest.iter_mut().enumerate() {
            *b = i as u8;
        }
        Repr {
            digest,
            extent_size: 2 << 20,
            entries: vec![
                MapEntry {
                    start: PmemAddr(0),
                    len: 1 << 30,
                    region: RegionIndex(0),
                    server: 0,
                    socket: 1,
                    key: AccessKey(0x0123_4567_89AB_CDEF),
                },
                MapEntry {
                    start: PmemAddr(1 << 30),
                    len: 2 << 30,
                    region: RegionIndex(5),
                    server: 0x102,
                    socket: 0,
                    key: AccessKey::NONE,
                },
            ],
        }
    }

    #[test]
    fn key_of_a_region_is_none_when_not_given_or_unknown() {
        let map = Repr {
            digest: [0; 32],
            extent_size: 1 << 20,
            entries: vec![MapEntry {
                start: PmemAddr(1 << 30),
                len: 1 << 20,
                region: RegionIndex(3),
                server: 0,
                socket: 0,
                key: AccessKey(9),
            }],
        };
        assert_eq!(map.key(RegionIndex(3)), AccessKey(9));
        assert_eq!(map.key(RegionIndex(4)), AccessKey::NONE);
    }

    #[test]
    fn construct() {
        let repr = repr();
        let mut bytes = vec![0xFFu8; 112];
        let mut packet = Packet::new_unchecked(&mut bytes[..]);
        packet.set_digest(&repr.digest);
        packet.set_extent_size(2 << 20);
        packet.set_entry_count(2);
        packet.clear_reserved();
        packet.set_entry(0, &repr.entries[0]);
        packet.set_entry(1, &repr.entries[1]);
        assert_eq!(bytes, self::bytes());
    }

    #[test]
    fn deconstruct() {
        let bytes = bytes();
        let packet = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(packet.digest(), repr().digest);
        assert_eq!(packet.extent_size(), 2 << 20);
        assert_eq!(packet.entry_count(), 2);
        assert_eq!(packet.reserved(), 0);
        assert_eq!(packet.entry(1), Some(repr().entries[1]));
        assert_eq!(packet.entry(2), None);
        assert_eq!(packet.entry(usize::MAX), None);
        assert_eq!(packet.entries().count(), 2);
    }

    #[test]
    fn parse() {
        let bytes = bytes();
        let packet = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(Repr::parse(&packet).unwrap(), repr());
    }

    #[test]
    fn emit() {
        let repr = repr();
        assert_eq!(repr.buffer_len(), 112);
        let mut bytes = vec![0xFFu8; 112];
        repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, self::bytes());
    }

    fn parse_bytes(bytes: &[u8]) -> Result<Repr> {
        Repr::parse(&Packet::new_checked(bytes)?)
    }

    #[test]
    fn rejects_count_not_matching_body() {
        let bytes = bytes();
        assert_eq!(
            parse_bytes(&bytes[..111]),
            Err(Error::LengthMismatch {
                what: "map body",
                expected: 112,
                got: 111
            })
        );
        let mut lying = bytes.clone();
        lying[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            parse_bytes(&lying),
            Err(Error::LengthMismatch {
                what: "map body",
                expected: 48 + 32 * u32::MAX as usize,
                got: 112
            })
        );
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(matches!(
            parse_bytes(&extra),
            Err(Error::LengthMismatch { got: 113, .. })
        ));
        assert_eq!(
            parse_bytes(&bytes[..47]),
            Err(Error::Truncated {
                needed: 48,
                got: 47
            })
        );
        let mut reserved = bytes;
        reserved[46] = 1;
        assert!(matches!(
            parse_bytes(&reserved),
            Err(Error::ReservedBits { value: 0x10000, .. })
        ));
    }

    #[test]
    fn empty_map() {
        let repr = Repr::default();
        let mut bytes = vec![0u8; repr.buffer_len()];
        repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(parse_bytes(&bytes), Ok(repr));
    }
}
