//! The allocator's records in PMEM and their encodings: the superblock,
//! page-table entries, name-directory entries, extent keys, slab headers and
//! the slab size classes. Pure functions; [`crate::meta`] says where each
//! lives. Clients (which change the records) and servers (which check who
//! changes them) share this one encoding.
//!
//! Every record that changes state has a 64-bit control word that clients
//! update only with COMPARE_SWAP, so two clients can never both win the same
//! transition. Page-table entries, name-directory entries and extent keys
//! carry the topology index of the client that owns them.

use crate::addr::{AccessKey, RegionIndex};
use crate::meta::{self, MetaLayout, RegionMeta};

/// "PFPOOL01": the superblock of a formatted pool.
pub const POOL_MAGIC: u64 = u64::from_le_bytes(*b"PFPOOL01");
/// "PFREGN01": the first word of a region header (whether it is formatted is
/// its state word: [`crate::region_header`]).
pub const REGION_MAGIC: u64 = u64::from_le_bytes(*b"PFREGN01");
/// The metadata format this code reads and writes (2: owners in extent keys
/// and name entries; 3: slab extents marked in their keys, slabs kept per
/// client; 4: region headers formatted one by one with a state word, the
/// superblock records the metadata's geometry instead of the layout digest).
pub const FORMAT_VERSION: u64 = 4;

/// Superblock byte offsets.
pub mod sb {
    /// [`super::POOL_MAGIC`], written last by format.
    pub const MAGIC: u64 = 0;
    /// [`super::FORMAT_VERSION`].
    pub const VERSION: u64 = 8;
    /// The extent size.
    pub const EXTENT: u64 = 16;
    /// Page-table entries.
    pub const ENTRIES: u64 = 24;
    /// Name-directory entries.
    pub const NAMES: u64 = 32;
    /// PMEM start address of the metadata region.
    pub const META_START: u64 = 40;
    /// Leading extents of the metadata region the metadata reserves.
    pub const META_RESERVED: u64 = 48;
    /// Regions whose headers the pool's format wrote (later ones are
    /// formatted as the pool grows; their headers say so).
    pub const REGIONS: u64 = 56;
    /// The virtual-extent cursor, advanced with FETCH_ADD.
    pub const CURSOR: u64 = 72;
    /// Unix seconds of the format.
    pub const FORMATTED_AT: u64 = 80;
    /// Slab hints: [`super::HINT_WAYS`] words per size class, each the
    /// page-table index + 1 of a slab with room (0 = none).
    pub const HINTS: u64 = 128;
    /// Bytes of the fixed part.
    pub const FIXED_LEN: u64 = 72;
}

/// Slab hints per size class (clients spread over them).
pub const HINT_WAYS: u64 = 4;
/// The smallest slab class: 64 bytes.
pub const MIN_CLASS_SHIFT: u32 = 6;
/// Most size classes (the superblock has room for this many hints).
pub const MAX_CLASSES: u32 = 32;

/// Bytes of a page-table entry.
pub const PT_ENTRY_LEN: u64 = meta::PAGE_TABLE_ENTRY_LEN;

/// A page-table entry's (or slab's) life cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryState {
    /// Unused.
    Free = 0,
    /// Claimed by an allocation in progress.
    Reserved = 1,
    /// Holds a completed allocation.
    Live = 2,
    /// Its allocation is being freed.
    Freeing = 3,
}

/// What a live page-table entry maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// The first extent of a large allocation.
    Head = 0,
    /// A further extent of a large allocation.
    Tail = 1,
    /// An extent cut into small objects of one size class.
    Slab = 2,
}

/// The control word of a page-table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Control {
    /// Where in its life cycle the entry is.
    pub state: EntryState,
    /// What it maps.
    pub kind: EntryKind,
    /// The topology index of the client that allocated it.
    pub owner: u16,
    /// Bumped on every claim, so a compare-and-swap never mistakes a reused
    /// entry for the one it read.
    pub generation: u32,
}

impl Control {
    /// The word.
    pub fn encode(self) -> u64 {
        (self.state as u64)
            | (self.kind as u64) << 8
            | u64::from(self.owner) << 16
            | u64::from(self.generation) << 32
    }

    /// The control word `word`, if its state and kind are known.
    pub fn decode(word: u64) -> Option<Self> {
        let state = match word & 0xff {
            0 => EntryState::Free,
            1 => EntryState::Reserved,
            2 => EntryState::Live,
            3 => EntryState::Freeing,
            _ => return None,
        };
        let kind = match (word >> 8) & 0xff {
            0 => EntryKind::Head,
            1 => EntryKind::Tail,
            2 => EntryKind::Slab,
            _ => return None,
        };
        Some(Self {
            state,
            kind,
            owner: (word >> 16) as u16,
            generation: (word >> 32) as u32,
        })
    }

    /// This word in another state.
    pub fn with_state(self, state: EntryState) -> Self {
        Self { state, ..self }
    }
}

/// One page-table entry: virtual extent → PMEM extent + key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtEntry {
    /// The control word.
    pub control: Control,
    /// PMEM address of the extent (0 while unset).
    pub pmem: u64,
    /// The key the extent's server enforces.
    pub key: AccessKey,
    /// Head: requested size (bits 0–47) and name slot + 1 (bits 48–63);
    /// tail: head index (bits 0–31) and head generation (bits 32–63);
    /// slab: its size class.
    pub info: u64,
}

impl PtEntry {
    /// The 32 bytes of the entry.
    pub fn encode(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        for (i, w) in [self.control.encode(), self.pmem, self.key.get(), self.info]
            .into_iter()
            .enumerate()
        {
            out[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        out
    }

    /// The entry in `bytes` (at least 32), if its control word is valid.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let word = |i: usize| word_at(bytes, i * 8);
        Some(Self {
            control: Control::decode(word(0)?)?,
            pmem: word(1)?,
            key: AccessKey(word(2)?),
            info: word(3)?,
        })
    }

    /// A head's requested size.
    pub fn size(&self) -> u64 {
        self.info & ((1 << 48) - 1)
    }

    /// A head's name-directory slot, if it backs a named object.
    pub fn name_slot(&self) -> Option<u64> {
        (self.info >> 48).checked_sub(1)
    }

    /// A head's info word.
    pub fn head_info(size: u64, name_slot: Option<u64>) -> u64 {
        (size & ((1 << 48) - 1)) | name_slot.map_or(0, |s| (s + 1) << 48)
    }

    /// A tail's info word, naming its head.
    pub fn tail_info(head: u64, generation: u32) -> u64 {
        (head & 0xffff_ffff) | u64::from(generation) << 32
    }

    /// A tail's head (index, generation).
    pub fn tail_head(&self) -> (u64, u32) {
        (self.info & 0xffff_ffff, (self.info >> 32) as u32)
    }
}

/// The little-endian word at byte `at` of `bytes`.
pub fn word_at(bytes: &[u8], at: usize) -> Option<u64> {
    let b: [u8; 8] = bytes.get(at..at + 8)?.try_into().ok()?;
    Some(u64::from_le_bytes(b))
}

/// The slab size classes of an extent size: powers of two from 64 bytes to
/// a quarter extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classes {
    extent: u64,
    count: u32,
}

impl Classes {
    /// The classes of extents of `extent` bytes.
    pub fn new(extent: u64) -> Self {
        let top = (extent / 4).max(1).ilog2();
        let count = (top + 1).saturating_sub(MIN_CLASS_SHIFT).min(MAX_CLASSES);
        Self { extent, count }
    }

    /// How many classes there are.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The class an allocation of `size` bytes comes from, or `None` when it
    /// takes whole extents.
    pub fn class_of(&self, size: u64) -> Option<u32> {
        let shift = size.max(1).next_power_of_two().ilog2().max(MIN_CLASS_SHIFT);
        let class = shift - MIN_CLASS_SHIFT;
        (class < self.count).then_some(class)
    }

    /// The shape of a slab of `class`.
    pub fn slab(&self, class: u32) -> SlabShape {
        SlabShape::new(self.extent, 1 << (class + MIN_CLASS_SHIFT))
    }
}

/// Where things are inside one slab extent.
///
/// ```text
/// | header word | … | claimed bitmap | live bitmap | pad | object 0 | object 1 | …
/// 0             64
/// ```
/// A bit of the claimed bitmap is taken by COMPARE_SWAP; the live bit is set
/// once the allocation is complete. Claimed but not live is an allocation
/// cut short by a crash, which scrub reclaims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlabShape {
    /// Object size.
    pub object: u64,
    /// Objects in the slab.
    pub slots: u64,
    /// Words of each bitmap.
    pub words: u64,
    /// Offset of the first object.
    pub data: u64,
}

impl SlabShape {
    /// Offset of the claimed bitmap.
    pub const CLAIMED: u64 = 64;

    fn new(extent: u64, object: u64) -> Self {
        let mut slots = extent / object;
        loop {
            let words = slots.div_ceil(64);
            let data = (Self::CLAIMED + 2 * words * 8).next_multiple_of(object);
            if data + slots * object <= extent || slots == 0 {
                return Self {
                    object,
                    slots,
                    words,
                    data,
                };
            }
            slots -= 1;
        }
    }

    /// Offset of the live bitmap.
    pub fn live(&self) -> u64 {
        Self::CLAIMED + self.words * 8
    }

    /// Offset of object `slot`.
    pub fn object_at(&self, slot: u64) -> u64 {
        self.data + slot * self.object
    }

    /// The slot of the object at `offset`, if one starts there.
    pub fn slot_at(&self, offset: u64) -> Option<u64> {
        let rel = offset.checked_sub(self.data)?;
        (rel % self.object == 0 && rel / self.object < self.slots).then_some(rel / self.object)
    }
}

/// A slab's header word: state (bits 0–7), class (8–15), objects handed
/// out or being handed out (32–63).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlabHeader {
    /// ACTIVE while objects may be taken, RETIRING once empty and leaving.
    pub retiring: bool,
    /// Its size class.
    pub class: u32,
    /// Objects reserved.
    pub used: u32,
}

impl SlabHeader {
    /// The word.
    pub fn encode(self) -> u64 {
        (if self.retiring { 2 } else { 1 })
            | u64::from(self.class & 0xff) << 8
            | u64::from(self.used) << 32
    }

    /// The header in `word`, if it is one.
    pub fn decode(word: u64) -> Option<Self> {
        let retiring = match word & 0xff {
            1 => false,
            2 => true,
            _ => return None,
        };
        Some(Self {
            retiring,
            class: ((word >> 8) & 0xff) as u32,
            used: (word >> 32) as u32,
        })
    }
}

/// A name-directory entry's life cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameState {
    /// Unused.
    Free = 0,
    /// Being created.
    Claiming = 1,
    /// A named object.
    Live = 2,
    /// Being removed.
    Removing = 3,
}

/// Bytes of a name the directory holds.
pub const MAX_NAME_LEN: usize = (meta::NAME_ENTRY_LEN - 32) as usize;

/// One name-directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameEntry {
    /// Life cycle.
    pub state: NameState,
    /// Bumped on every claim.
    pub generation: u8,
    /// The topology index of the client that created it (it alone may
    /// remove or change it).
    pub owner: u16,
    /// Hash of the name (in the control word, so a claim carries it).
    pub hash: u32,
    /// The object's virtual address.
    pub vaddr: u64,
    /// Its size.
    pub size: u64,
    /// The name.
    pub name: String,
}

/// The parts of a name entry's control word: state (bits 0–7), generation
/// (8–15), owner (16–31), name hash (32–63).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NameControl {
    /// Life cycle.
    pub state: NameState,
    /// Bumped on every claim.
    pub generation: u8,
    /// The owning client's topology index.
    pub owner: u16,
    /// Hash of the name.
    pub hash: u32,
}

impl NameControl {
    /// The word.
    pub fn encode(self) -> u64 {
        (self.state as u64)
            | u64::from(self.generation) << 8
            | u64::from(self.owner) << 16
            | u64::from(self.hash) << 32
    }

    /// The control word `word`, if its state is known.
    pub fn decode(word: u64) -> Option<Self> {
        let state = match word & 0xff {
            0 => NameState::Free,
            1 => NameState::Claiming,
            2 => NameState::Live,
            3 => NameState::Removing,
            _ => return None,
        };
        Some(Self {
            state,
            generation: (word >> 8) as u8,
            owner: (word >> 16) as u16,
            hash: (word >> 32) as u32,
        })
    }
}

impl NameEntry {
    /// The control word.
    pub fn control(&self) -> u64 {
        NameControl {
            state: self.state,
            generation: self.generation,
            owner: self.owner,
            hash: self.hash,
        }
        .encode()
    }

    /// The whole entry.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; meta::NAME_ENTRY_LEN as usize];
        let name = self.name.as_bytes();
        let len = name.len().min(MAX_NAME_LEN);
        for (i, w) in [self.control(), self.vaddr, self.size, len as u64]
            .into_iter()
            .enumerate()
        {
            out[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        out[32..32 + len].copy_from_slice(&name[..len]);
        out
    }

    /// The entry in `bytes`, if it decodes.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let control = NameControl::decode(word_at(bytes, 0)?)?;
        let len = (word_at(bytes, 24)? as usize).min(MAX_NAME_LEN);
        let name = String::from_utf8_lossy(bytes.get(32..32 + len)?).into_owned();
        Some(Self {
            state: control.state,
            generation: control.generation,
            owner: control.owner,
            hash: control.hash,
            vaddr: word_at(bytes, 8)?,
            size: word_at(bytes, 16)?,
            name,
        })
    }
}

/// An extent key as the allocator installs it on a whole-extent
/// allocation: the owner's topology index plus one in the top 16 bits, bit
/// 47 clear and 47 random bits, so the server holding the key table knows
/// whose extent it is.
pub fn owned_key(owner: u16, random: u64) -> AccessKey {
    AccessKey((u64::from(owner) + 1) << 48 | (random & KEY_RANDOM_MASK))
}

/// The key of a slab extent: an [`owned_key`] with [`KEY_SLAB`] set, so
/// the server holding it lets only the owner change the slab's header and
/// bitmaps ([`slab_header_len`]).
pub fn slab_key(owner: u16, random: u64) -> AccessKey {
    AccessKey(owned_key(owner, random).get() | KEY_SLAB)
}

/// The bit of an extent key that marks a slab extent.
pub const KEY_SLAB: u64 = 1 << 47;

/// The random bits of an extent key.
pub const KEY_RANDOM_MASK: u64 = KEY_SLAB - 1;

/// Whether the extent whose key word is `word` is a slab.
pub fn key_is_slab(word: u64) -> bool {
    key_owner(word).is_some() && word & KEY_SLAB != 0
}

/// How many bytes at the start of a slab extent are its header and
/// bitmaps, given the slab's header word `header`: those of its class, or
/// when the word names no class, those of the smallest class (the most any
/// slab has).
pub fn slab_header_len(classes: &Classes, header: u64) -> u64 {
    let class = SlabHeader::decode(header)
        .map(|h| h.class)
        .filter(|&c| c < classes.count())
        .unwrap_or(0);
    let shape = classes.slab(class);
    shape.live() + shape.words * 8
}

/// The owner of the extent whose key word is `word`: `None` for 0 (not
/// allocated) and for a word that names no owner.
pub fn key_owner(word: u64) -> Option<u16> {
    u16::try_from((word >> 48).checked_sub(1)?).ok()
}

/// An allocator record word whose changes the server holding it checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordWord {
    /// The control word of page-table entry `.0`.
    EntryControl(u64),
    /// Another word of page-table entry `.0`.
    EntryBody(u64),
    /// The control word of name-directory entry `.0`.
    NameControl(u64),
    /// Another word of name-directory entry `.0`.
    NameBody(u64),
    /// Word `.0` of the region's free-extent bitmap.
    Bitmap(u64),
    /// The key word of the region's extent `.0`.
    ExtentKey(u64),
}

/// Where a region's checked records are: the bitmap and key table of its
/// header, and in the metadata region the page table and name directory.
fn record_spans(layout: &MetaLayout, region: &RegionMeta) -> [(u64, u64); 2] {
    let header = (region.bitmap_offset(), region.header_len());
    let pool = if region.region == layout.meta_region().region {
        let start = layout.page_table_entry(0).get() - region.start.get();
        let end = layout.name_entry(layout.names()).get() - region.start.get();
        (start, end)
    } else {
        (0, 0)
    };
    [header, pool]
}

/// Whether `[offset, offset + len)` of `region` overlaps a checked record.
pub fn touches_records(layout: &MetaLayout, region: RegionIndex, offset: u64, len: u64) -> bool {
    let Some(meta) = layout.region(region) else {
        return false;
    };
    let end = offset.saturating_add(len.max(1));
    record_spans(layout, meta)
        .iter()
        .any(|&(start, stop)| offset < stop && start < end)
}

/// The checked record word at 8-byte-aligned `offset` of `region`, if any.
pub fn record_word(layout: &MetaLayout, region: RegionIndex, offset: u64) -> Option<RecordWord> {
    let meta = layout.region(region)?;
    let within = |start: u64, len: u64| offset.checked_sub(start).filter(|rel| *rel < len);
    if let Some(rel) = within(meta.bitmap_offset(), meta.bitmap_words() * 8) {
        return Some(RecordWord::Bitmap(rel / 8));
    }
    if let Some(rel) = within(meta.key_table_offset(), meta.extents * 8) {
        return Some(RecordWord::ExtentKey(rel / 8));
    }
    if meta.region != layout.meta_region().region {
        return None;
    }
    let table = layout.page_table_entry(0).get() - meta.start.get();
    let entries = layout.page_table_entries();
    if let Some(rel) = within(table, entries * meta::PAGE_TABLE_ENTRY_LEN) {
        let (entry, word) = (
            rel / meta::PAGE_TABLE_ENTRY_LEN,
            rel % meta::PAGE_TABLE_ENTRY_LEN,
        );
        return Some(if word == 0 {
            RecordWord::EntryControl(entry)
        } else {
            RecordWord::EntryBody(entry)
        });
    }
    let names = layout.name_entry(0).get() - meta.start.get();
    let rel = within(names, layout.names() * meta::NAME_ENTRY_LEN)?;
    let (slot, word) = (rel / meta::NAME_ENTRY_LEN, rel % meta::NAME_ENTRY_LEN);
    Some(if word == 0 {
        RecordWord::NameControl(slot)
    } else {
        RecordWord::NameBody(slot)
    })
}

/// The 32-bit FNV-1a hash of a name.
pub fn name_hash(name: &str) -> u32 {
    name.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_words_round_trip() {
        let c = Control {
            state: EntryState::Freeing,
            kind: EntryKind::Slab,
            owner: 7,
            generation: 0xdead_beef,
        };
        assert_eq!(Control::decode(c.encode()), Some(c));
        assert_eq!(Control::decode(0x04), None);
        let e = PtEntry {
            control: c,
            pmem: 1 << 32,
            key: AccessKey(42),
            info: PtEntry::head_info(5 << 20, Some(3)),
        };
        let back = PtEntry::decode(&e.encode()).unwrap();
        assert_eq!(back, e);
        assert_eq!(back.size(), 5 << 20);
        assert_eq!(back.name_slot(), Some(3));
        assert_eq!(PtEntry::decode(&[0; 31]), None);
    }

    fn default_meta() -> MetaLayout {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/default.toml");
        let mut t = crate::Topology::load_with(path, &crate::EnvOverrides::None).unwrap();
        t.pool.allocator = Some(crate::AllocatorConfig::default());
        crate::Layout::new(&t).unwrap().meta().unwrap().clone()
    }

    #[test]
    fn record_words_are_found_where_meta_puts_them() {
        let meta = default_meta();
        let (first, second) = (meta.regions()[0], meta.regions()[1]);
        let rel = |at: crate::PmemAddr| at.get() - first.start.get();
        let r0 = first.region;
        assert_eq!(record_word(&meta, r0, 64), Some(RecordWord::Bitmap(0)));
        assert_eq!(
            record_word(&meta, r0, first.key_offset(3)),
            Some(RecordWord::ExtentKey(3))
        );
        let entry = rel(meta.page_table_entry(7));
        assert_eq!(
            record_word(&meta, r0, entry),
            Some(RecordWord::EntryControl(7))
        );
        assert_eq!(
            record_word(&meta, r0, entry + 24),
            Some(RecordWord::EntryBody(7))
        );
        let name = rel(meta.name_entry(2));
        assert_eq!(
            record_word(&meta, r0, name),
            Some(RecordWord::NameControl(2))
        );
        assert_eq!(
            record_word(&meta, r0, name + 120),
            Some(RecordWord::NameBody(2))
        );
        // The superblock, data extents, and other regions' pool offsets are
        // not checked records.
        assert_eq!(record_word(&meta, r0, rel(meta.superblock())), None);
        assert_eq!(record_word(&meta, r0, 5 << 21), None);
        assert_eq!(record_word(&meta, second.region, entry), None);
        assert!(touches_records(&meta, r0, entry - 8, 16));
        assert!(!touches_records(&meta, r0, 5 << 21, 4096));
        assert!(!touches_records(&meta, r0, rel(meta.superblock()), 8));
        assert!(touches_records(&meta, second.region, 0, 4096));
        assert!(!touches_records(&meta, second.region, entry, 8));
    }

    #[test]
    fn extent_keys_name_their_owner() {
        let key = owned_key(7, u64::MAX);
        assert_eq!(key_owner(key.get()), Some(7));
        assert_eq!(key.get() & KEY_RANDOM_MASK, KEY_RANDOM_MASK);
        assert_eq!(key_owner(owned_key(0, 0).get()), Some(0));
        assert_ne!(owned_key(0, 0).get(), 0);
        assert_eq!(key_owner(0), None);
        assert_eq!(key_owner(42), None);
        assert!(!key_is_slab(owned_key(7, u64::MAX).get()));
        let slab = slab_key(7, u64::MAX);
        assert!(key_is_slab(slab.get()));
        assert_eq!(key_owner(slab.get()), Some(7));
        assert!(!key_is_slab(KEY_SLAB), "a key naming no owner is no slab");
    }

    #[test]
    fn a_slab_header_spans_its_class_bitmaps_or_the_largest_when_unknown() {
        let classes = Classes::new(2 << 20);
        let word = |class| {
            SlabHeader {
                retiring: false,
                class,
                used: 3,
            }
            .encode()
        };
        // 64-byte objects: 32,639 slots after the header, two bitmaps of
        // 510 words each.
        assert_eq!(slab_header_len(&classes, word(0)), 64 + 2 * 510 * 8);
        // 512 KiB objects: 4 slots, two one-word bitmaps.
        assert_eq!(slab_header_len(&classes, word(13)), 64 + 2 * 8);
        assert_eq!(slab_header_len(&classes, 0), 64 + 2 * 510 * 8);
        assert_eq!(slab_header_len(&classes, word(200)), 64 + 2 * 510 * 8);
    }

    #[test]
    fn classes_run_from_64_bytes_to_a_quarter_extent() {
        let c = Classes::new(2 << 20);
        assert_eq!(c.count(), 14);
        assert_eq!(c.class_of(1), Some(0));
        assert_eq!(c.class_of(64), Some(0));
        assert_eq!(c.class_of(65), Some(1));
        assert_eq!(c.class_of(512 << 10), Some(13));
        assert_eq!(c.class_of((512 << 10) + 1), None);
    }

    #[test]
    fn slab_objects_follow_both_bitmaps_and_fit_the_extent() {
        let c = Classes::new(2 << 20);
        for class in 0..c.count() {
            let s = c.slab(class);
            assert!(s.slots >= 3, "class {class}: {s:?}");
            assert!(s.words * 64 >= s.slots);
            assert!(s.data >= s.live() + s.words * 8);
            assert_eq!(s.data % s.object, 0);
            assert!(s.object_at(s.slots) <= 2 << 20);
            assert_eq!(s.slot_at(s.object_at(2)), Some(2));
            assert_eq!(s.slot_at(s.object_at(2) + 1), None);
        }
        let small = c.slab(0);
        // 2 MiB less the header and two 510-word bitmaps, in 64 B objects.
        assert_eq!((small.slots, small.words, small.data), (32_639, 510, 8256));
    }

    #[test]
    fn names_and_slab_headers_round_trip() {
        let n = NameEntry {
            state: NameState::Live,
            generation: 9,
            owner: 5,
            hash: name_hash("orders"),
            vaddr: 1 << 40,
            size: 100,
            name: "orders".into(),
        };
        assert_eq!(NameEntry::decode(&n.encode()), Some(n.clone()));
        let control = NameControl::decode(n.control()).unwrap();
        assert_eq!((control.owner, control.generation), (5, 9));
        let h = SlabHeader {
            retiring: false,
            class: 3,
            used: 17,
        };
        assert_eq!(SlabHeader::decode(h.encode()), Some(h));
        assert_eq!(SlabHeader::decode(0), None);
    }
}
