//! Where the allocator's metadata lives in PMEM: a pure function of the
//! topology, like the [`Layout`](crate::Layout) it extends.
//!
//! With `[pool.allocator]`, every region keeps its first extent for a region
//! header: a free-extent bitmap (one bit per extent, set = allocated) and an
//! extent key table (one 64-bit key per extent, 0 = not allocated). Servers
//! read the key table from their own mapping to decide which key an extent
//! accepts; clients claim bits and install keys with one-sided atomics.
//!
//! The metadata region keeps further extents for the pool metadata:
//!
//! ```text
//! metadata region: | region header | superblock | page table | name directory | … data extents
//! other regions:   | region header | … data extents
//! ```
//!
//! All words are little-endian u64; every table starts 64-byte aligned. A
//! region header begins with fixed words (identity and format state, see
//! [`crate::region_header`]) before its bitmap.
//!
//! The superblock, page table and name directory are sized once, at format:
//! regions appended later (a pool gaining servers) bring their own headers
//! but no page-table entries, so a pool meant to grow sets
//! `page_table_entries` with room for them and keeps every allocator setting
//! as it was at format.

use crate::addr::{AccessKey, PmemAddr, RegionIndex};
use crate::ids::RegionId;
use crate::model::AllocatorConfig;
use crate::region_place::LayoutEntry;

/// Bytes at the start of a region header before its bitmap.
pub const REGION_HEADER_LEN: u64 = 64;
/// Bytes of the pool superblock.
pub const SUPERBLOCK_LEN: u64 = 4096;
/// Bytes of one page-table entry (four words).
pub const PAGE_TABLE_ENTRY_LEN: u64 = 32;
/// Bytes of one name-directory entry (four words and the name).
pub const NAME_ENTRY_LEN: u64 = 128;
/// Name-directory entries when the topology does not say.
pub const DEFAULT_NAMES: u64 = 256;
/// Most name-directory entries (a page-table entry records a slot in 16 bits).
pub const MAX_NAMES: u64 = 65_535;
/// Page-table entries per data extent when the topology does not say (of
/// the extents at hand: the default changes as regions are added).
pub const DEFAULT_PAGE_TABLE_FACTOR: u64 = 4;

/// Why the allocator's metadata cannot be laid out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    /// The named metadata region is not in the layout.
    #[error("metadata region {0} does not exist")]
    UnknownRegion(RegionId),
    /// A region has too many extents for its header to fit in one extent.
    #[error(
        "region {region} has {extents} extents; its bitmap and key table need {needed} bytes, more than one extent ({extent} bytes)"
    )]
    HeaderTooLarge {
        /// The region.
        region: RegionId,
        /// Its extents.
        extents: u64,
        /// Bytes the header needs.
        needed: u64,
        /// The extent size.
        extent: u64,
    },
    /// The pool metadata does not fit in the metadata region.
    #[error(
        "pool metadata needs {needed} extents of region {region} (header, superblock, {entries} page-table entries, {names} names) but it has {extents}"
    )]
    MetadataTooLarge {
        /// The metadata region.
        region: RegionId,
        /// Extents needed, region header included.
        needed: u64,
        /// Extents the region has.
        extents: u64,
        /// Page-table entries asked for.
        entries: u64,
        /// Name entries asked for.
        names: u64,
    },
    /// A count outside what the format can hold.
    #[error("{what} is {value}; it must be between 1 and {max}")]
    BadCount {
        /// Which setting.
        what: &'static str,
        /// The value given.
        value: u64,
        /// The largest allowed.
        max: u64,
    },
}

/// One region's place in the allocator's metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionMeta {
    /// The region's index.
    pub region: RegionIndex,
    /// First PMEM address of the region.
    pub start: PmemAddr,
    /// Extents in the region, reserved ones included.
    pub extents: u64,
    /// Leading extents reserved for metadata (never allocated).
    pub reserved: u64,
    /// The region key: it opens the reserved extents and unallocated ones.
    pub key: AccessKey,
}

impl RegionMeta {
    /// Region offset of the free-extent bitmap.
    pub const fn bitmap_offset(&self) -> u64 {
        REGION_HEADER_LEN
    }

    /// Words of the free-extent bitmap.
    pub const fn bitmap_words(&self) -> u64 {
        self.extents.div_ceil(64)
    }

    /// Region offset of the extent key table.
    pub const fn key_table_offset(&self) -> u64 {
        (REGION_HEADER_LEN + self.bitmap_words() * 8).next_multiple_of(64)
    }

    /// Region offset of extent `extent`'s key word.
    pub const fn key_offset(&self, extent: u64) -> u64 {
        self.key_table_offset() + extent * 8
    }

    /// Bytes the region header occupies.
    pub const fn header_len(&self) -> u64 {
        self.key_table_offset() + self.extents * 8
    }

    /// PMEM address of region offset `offset`.
    pub const fn at(&self, offset: u64) -> PmemAddr {
        PmemAddr(self.start.get() + offset)
    }

    /// Extents that can be allocated.
    pub const fn data_extents(&self) -> u64 {
        self.extents - self.reserved
    }
}

/// The allocator's metadata layout of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaLayout {
    extent: u64,
    meta_region: RegionIndex,
    superblock: PmemAddr,
    page_table_entries: u64,
    names: u64,
    regions: Vec<RegionMeta>,
}

impl MetaLayout {
    /// The metadata layout of `entries` (a layout's entries, in region-index
    /// order) with extent size `extent`, as `config` asks.
    pub fn new(
        extent: u64,
        entries: &[LayoutEntry],
        config: &AllocatorConfig,
    ) -> Result<Self, MetaError> {
        let extent = extent.max(1);
        let mut regions: Vec<RegionMeta> = entries
            .iter()
            .map(|e| RegionMeta {
                region: e.region,
                start: e.start,
                extents: e.len / extent,
                reserved: 1,
                key: e.key,
            })
            .collect();
        for (meta, entry) in regions.iter().zip(entries) {
            if meta.header_len() > extent || meta.extents == 0 {
                return Err(MetaError::HeaderTooLarge {
                    region: entry.region_id.clone(),
                    extents: meta.extents,
                    needed: meta.header_len(),
                    extent,
                });
            }
        }
        let meta_index = match &config.metadata_region {
            Some(id) => entries
                .iter()
                .position(|e| &e.region_id == id)
                .ok_or_else(|| MetaError::UnknownRegion(id.clone()))?,
            None => 0,
        };
        let Some(meta_entry) = entries.get(meta_index) else {
            return Err(MetaError::UnknownRegion(RegionId::from("(none)")));
        };
        let data_extents: u64 = regions.iter().map(|r| r.extents - 1).sum();
        let page_table_entries = config.page_table_entries.unwrap_or_else(|| {
            (data_extents * DEFAULT_PAGE_TABLE_FACTOR)
                .max(64)
                .next_multiple_of(64)
        });
        let max_entries = u64::from(u32::MAX);
        if page_table_entries == 0 || page_table_entries > max_entries {
            return Err(MetaError::BadCount {
                what: "page_table_entries",
                value: page_table_entries,
                max: max_entries,
            });
        }
        let names = config.names.unwrap_or(DEFAULT_NAMES);
        if names == 0 || names > MAX_NAMES {
            return Err(MetaError::BadCount {
                what: "names",
                value: names,
                max: MAX_NAMES,
            });
        }
        let pool_bytes =
            SUPERBLOCK_LEN + page_table_entries * PAGE_TABLE_ENTRY_LEN + names * NAME_ENTRY_LEN;
        let reserved = 1 + pool_bytes.div_ceil(extent);
        let meta = &mut regions[meta_index];
        if reserved >= meta.extents {
            return Err(MetaError::MetadataTooLarge {
                region: meta_entry.region_id.clone(),
                needed: reserved,
                extents: meta.extents,
                entries: page_table_entries,
                names,
            });
        }
        meta.reserved = reserved;
        Ok(Self {
            extent,
            meta_region: meta.region,
            superblock: meta.at(extent),
            page_table_entries,
            names,
            regions,
        })
    }

    /// The extent size.
    pub fn extent_size(&self) -> u64 {
        self.extent
    }

    /// The region holding the pool metadata.
    pub fn meta_region(&self) -> &RegionMeta {
        &self.regions[self.meta_region.0 as usize]
    }

    /// Every region's metadata, by region index.
    pub fn regions(&self) -> &[RegionMeta] {
        &self.regions
    }

    /// One region's metadata.
    pub fn region(&self, region: RegionIndex) -> Option<&RegionMeta> {
        self.regions.get(region.0 as usize)
    }

    /// Records `key` as the key of `region`; `false` when there is no such region.
    pub(crate) fn set_key(&mut self, region: RegionIndex, key: AccessKey) -> bool {
        match self.regions.get_mut(region.0 as usize) {
            Some(meta) => {
                meta.key = key;
                true
            }
            None => false,
        }
    }

    /// PMEM address of the superblock.
    pub fn superblock(&self) -> PmemAddr {
        self.superblock
    }

    /// Entries of the page table (virtual extents of the shared space).
    pub fn page_table_entries(&self) -> u64 {
        self.page_table_entries
    }

    /// PMEM address of page-table entry `index`.
    pub fn page_table_entry(&self, index: u64) -> PmemAddr {
        PmemAddr(self.superblock.get() + SUPERBLOCK_LEN + index * PAGE_TABLE_ENTRY_LEN)
    }

    /// Entries of the name directory.
    pub fn names(&self) -> u64 {
        self.names
    }

    /// PMEM address of name-directory entry `index`.
    pub fn name_entry(&self, index: u64) -> PmemAddr {
        PmemAddr(self.page_table_entry(self.page_table_entries).get() + index * NAME_ENTRY_LEN)
    }

    /// Feeds everything that shapes the metadata into a digest.
    pub(crate) fn digest_into(&self, hash: &mut impl sha2::Digest) {
        hash.update(b"pmem-fabric/allocator/v1\0");
        hash.update(u64::from(self.meta_region.0).to_le_bytes());
        hash.update(self.page_table_entries.to_le_bytes());
        hash.update(self.names.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EnvOverrides, Layout, Topology};

    fn default_with(config: AllocatorConfig) -> Result<Layout, crate::LayoutError> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/default.toml");
        let mut t = Topology::load_with(path, &EnvOverrides::None).unwrap();
        t.pool.allocator = Some(config);
        Layout::new(&t)
    }

    #[test]
    fn tables_do_not_overlap_and_fit_their_region() {
        let layout = default_with(AllocatorConfig::default()).unwrap();
        let meta = layout.meta().unwrap();
        let first = &meta.regions()[0];
        // 4 regions of 32 extents: 124 data extents, 4 page-table entries each.
        assert_eq!(meta.page_table_entries(), 512);
        assert_eq!(first.bitmap_words(), 1);
        assert_eq!(first.key_table_offset(), 128);
        assert_eq!(first.header_len(), 128 + 32 * 8);
        assert_eq!(meta.superblock(), first.at(2 << 20));
        assert_eq!(
            meta.name_entry(0).get(),
            meta.superblock().get() + SUPERBLOCK_LEN + 512 * PAGE_TABLE_ENTRY_LEN
        );
        // 4 KiB + 16 KiB + 32 KiB fit one extent after the region header.
        assert_eq!(first.reserved, 2);
        assert!(meta.regions()[1..].iter().all(|r| r.reserved == 1));
    }

    #[test]
    fn the_allocator_changes_the_digest() {
        let plain = {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/default.toml");
            Layout::new(&Topology::load_with(path, &EnvOverrides::None).unwrap()).unwrap()
        };
        let alloc = default_with(AllocatorConfig::default()).unwrap();
        let more_names = default_with(AllocatorConfig {
            names: Some(512),
            ..AllocatorConfig::default()
        })
        .unwrap();
        assert_ne!(plain.digest(), alloc.digest());
        assert_ne!(alloc.digest(), more_names.digest());
    }

    #[test]
    fn metadata_that_does_not_fit_is_refused() {
        let err = default_with(AllocatorConfig {
            page_table_entries: Some(4 << 20),
            ..AllocatorConfig::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("pool metadata needs"), "{err}");
        let err = default_with(AllocatorConfig {
            metadata_region: Some(RegionId::from("nope")),
            ..AllocatorConfig::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
    }
}
