//! The PMEM address layout: where every region sits in the flat PMEM space.
//!
//! The layout is a pure function of the topology. Regions are taken in config
//! order; a region with an explicit `address` sits there, every other region is
//! placed at the next address aligned to the pool's region alignment that does
//! not collide with an explicitly placed one. Daemons and clients that read the
//! same file derive the same layout and compare [`Layout::digest`] to be sure.

use sha2::{Digest, Sha256};

use crate::addr::{AccessKey, PmemAddr, RegionIndex, RegionOffset};
use crate::extent_table::ExtentTable;
use crate::ids::RegionId;
use crate::meta::MetaLayout;
use crate::model::Topology;
pub use crate::region_place::{LayoutEntry, Location};

/// A layout that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// Two regions claim overlapping PMEM addresses.
    #[error("region {first} and region {second} overlap in PMEM address space")]
    Overlap {
        /// The region that starts first.
        first: RegionId,
        /// The region that overlaps it.
        second: RegionId,
    },
    /// A region would extend past the end of the 64-bit address space.
    #[error("region {region} does not fit below the end of the 64-bit PMEM address space")]
    Overflow {
        /// The region that does not fit.
        region: RegionId,
    },
    /// More items than the wire format can number.
    #[error("too many {what}: {count} (at most {max})")]
    TooMany {
        /// What there are too many of.
        what: &'static str,
        /// How many there are.
        count: usize,
        /// The most the wire format can number.
        max: usize,
    },
    /// The allocator's metadata cannot be laid out.
    #[error("allocator metadata: {0}")]
    Allocator(#[from] crate::meta::MetaError),
}

/// The PMEM address map of a pool.
///
/// [`Layout::lookup`] is O(1) for dense layouts: when every region starts a
/// whole number of extents from the lowest start and is a whole number of
/// extents long (always so for a validated topology), and the regions cover
/// about a quarter of the span they sit in (with some slack for small
/// layouts), the layout keeps an extent table (see
/// `extent_table.rs`) with one 8-byte slot per extent of that span:
/// which region holds the extent and which of its extents it is. That costs
/// 8 bytes per extent (per 2 MiB with the default extent size): about 22 MB
/// for 1,000,000 regions of 1–4 extents, and never more than 256 MiB (32 Mi
/// slots). Other layouts are looked up by binary search over the sorted
/// start addresses, in O(log n).
///
/// Two layouts are equal when their extent size and entries are; everything
/// else is derived from those.
#[derive(Debug, Clone)]
pub struct Layout {
    extent_size: u64,
    /// Entries indexed by `RegionIndex`.
    entries: Vec<LayoutEntry>,
    /// Start addresses sorted ascending, parallel to `by_start`.
    starts: Vec<u64>,
    /// Region indices in address order.
    by_start: Vec<u32>,
    /// The region of every extent, for dense layouts.
    table: Option<ExtentTable>,
    digest: [u8; 32],
    /// Where the allocator's metadata lives, for pools with an allocator.
    meta: Option<MetaLayout>,
}

impl PartialEq for Layout {
    fn eq(&self, other: &Self) -> bool {
        // `starts`, `by_start`, `table` and `digest` are functions of these.
        self.extent_size == other.extent_size
            && self.entries == other.entries
            && self.meta == other.meta
    }
}

impl Eq for Layout {}

/// Rounds `value` up to a multiple of `align` (a power of two or any non-zero
/// value), or `None` on overflow.
fn align_up(value: u64, align: u64) -> Option<u64> {
    if align <= 1 {
        return Some(value);
    }
    let rem = value % align;
    if rem == 0 {
        Some(value)
    } else {
        value.checked_add(align - rem)
    }
}

/// A region that does not fit below the end of the 64-bit address space.
#[derive(Debug)]
pub(crate) struct RegionOverflow(pub(crate) RegionId);

/// Start addresses for every region in config order, or the first region that
/// does not fit. Explicitly placed regions keep their address; the others go
/// to the next aligned address that collides with no explicit region.
pub(crate) fn place_regions(topology: &Topology) -> Result<Vec<u64>, RegionOverflow> {
    let align = topology.pool.alignment();
    let mut explicit: Vec<(u64, u64)> = topology
        .regions()
        .filter_map(|p| {
            let start = p.region.address?;
            Some((start, start.saturating_add(p.region.size.bytes())))
        })
        .collect();
    explicit.sort_unstable();

    let mut cursor = topology.pool.base_address;
    let mut starts = Vec::new();
    for place in topology.regions() {
        let region = place.region;
        let len = region.size.bytes();
        let overflow = || RegionOverflow(region.id.clone());
        if let Some(start) = region.address {
            start.checked_add(len).ok_or_else(overflow)?;
            starts.push(start);
            continue;
        }
        let mut start = align_up(cursor, align).ok_or_else(overflow)?;
        loop {
            let end = start.checked_add(len).ok_or_else(overflow)?;
            match explicit.iter().find(|&&(s, e)| start < e && s < end) {
                Some(&(_, e)) => start = align_up(e, align).ok_or_else(overflow)?,
                None => break,
            }
        }
        cursor = start + len;
        starts.push(start);
    }
    Ok(starts)
}

impl Layout {
    /// The MAP message of this layout (what MAP_REQUEST is answered
    /// with): its digest, extent size and every region in region-index
    /// order.
    pub fn to_map(&self) -> proto::map::Repr {
        proto::map::Repr {
            digest: self.digest(),
            extent_size: self.extent_size(),
            entries: self
                .entries()
                .iter()
                .map(|e| proto::map::MapEntry {
                    start: e.start,
                    len: e.len,
                    region: e.region,
                    server: e.server_index,
                    socket: e.socket_index,
                    key: e.key,
                })
                .collect(),
        }
    }

    /// The layout of a topology.
    pub fn new(topology: &Topology) -> Result<Self, LayoutError> {
        if topology.servers.len() > usize::from(u16::MAX) {
            return Err(LayoutError::TooMany {
                what: "servers",
                count: topology.servers.len(),
                max: usize::from(u16::MAX),
            });
        }
        let starts = place_regions(topology)
            .map_err(|RegionOverflow(region)| LayoutError::Overflow { region })?;
        let mut entries = Vec::with_capacity(starts.len());
        for (start, place) in starts.into_iter().zip(topology.regions()) {
            let server_index = topology
                .servers
                .iter()
                .position(|s| std::ptr::eq(s, place.server))
                .unwrap_or_default();
            let socket_index = place
                .server
                .sockets
                .iter()
                .position(|s| std::ptr::eq(s, place.socket))
                .unwrap_or_default();
            let region = place.region;
            entries.push(LayoutEntry {
                start: PmemAddr(start),
                len: region.size.bytes(),
                region: RegionIndex(0),
                region_id: region.id.clone(),
                server: place.server.id.clone(),
                server_index: u16::try_from(server_index).unwrap_or(u16::MAX),
                socket: place.socket.id.clone(),
                socket_index: u16::try_from(socket_index).unwrap_or(u16::MAX),
                device: place.device.id.clone(),
                key: AccessKey::NONE,
                cache: region.cache,
            });
        }
        let layout = Self::from_entries(topology.pool.extent_size.bytes(), entries)?;
        match &topology.pool.allocator {
            Some(config) => {
                let meta = MetaLayout::new(layout.extent_size, &layout.entries, config)?;
                Ok(layout.with_meta(meta))
            }
            None => Ok(layout),
        }
    }

    /// This layout with the allocator's metadata at `meta`; the digest
    /// covers it, so daemons and clients agree on it too.
    pub fn with_meta(mut self, meta: MetaLayout) -> Self {
        let mut hash = Sha256::new();
        hash.update(self.digest);
        meta.digest_into(&mut hash);
        self.digest = hash.finalize().into();
        self.meta = Some(meta);
        self
    }

    /// The allocator's metadata layout, if the pool has an allocator.
    pub fn meta(&self) -> Option<&MetaLayout> {
        self.meta.as_ref()
    }

    /// A layout from explicit entries (their `region` field is renumbered to
    /// their position). Used for synthetic maps, e.g. lookup benchmarks.
    pub fn from_entries(
        extent_size: u64,
        mut entries: Vec<LayoutEntry>,
    ) -> Result<Self, LayoutError> {
        let max = u32::MAX as usize;
        if entries.len() > max {
            return Err(LayoutError::TooMany {
                what: "regions",
                count: entries.len(),
                max,
            });
        }
        for (i, entry) in entries.iter_mut().enumerate() {
            entry.region = RegionIndex(i as u32);
            if entry.start.get().checked_add(entry.len).is_none() {
                return Err(LayoutError::Overflow {
                    region: entry.region_id.clone(),
                });
            }
        }
        let mut by_start: Vec<u32> = (0..entries.len() as u32).collect();
        by_start.sort_by_key(|&i| entries[i as usize].start);
        for pair in by_start.windows(2) {
            let (a, b) = (&entries[pair[0] as usize], &entries[pair[1] as usize]);
            if b.start.get() < a.end() {
                return Err(LayoutError::Overlap {
                    first: a.region_id.clone(),
                    second: b.region_id.clone(),
                });
            }
        }
        let starts = by_start
            .iter()
            .map(|&i| entries[i as usize].start.get())
            .collect();
        let digest = Self::compute_digest(extent_size, &entries);
        let table = ExtentTable::build(extent_size, &entries);
        Ok(Self {
            extent_size,
            entries,
            starts,
            by_start,
            table,
            digest,
            meta: None,
        })
    }

    fn compute_digest(extent_size: u64, entries: &[LayoutEntry]) -> [u8; 32] {
        let mut hash = Sha256::new();
        hash.update(b"pmem-fabric/layout/v1\0");
        hash.update(extent_size.to_le_bytes());
        hash.update((entries.len() as u64).to_le_bytes());
        for e in entries {
            hash.update(e.start.get().to_le_bytes());
            hash.update(e.len.to_le_bytes());
            hash.update(e.region.0.to_le_bytes());
            for name in [e.region_id.as_str(), e.server.as_str(), e.socket.as_str()] {
                hash.update((name.len() as u64).to_le_bytes());
                hash.update(name.as_bytes());
            }
        }
        hash.finalize().into()
    }

    /// Finds the region holding `addr`: in O(1) for dense layouts (one
    /// table load), in O(log n) otherwise (see [`Layout`]).
    #[inline]
    pub fn lookup(&self, addr: PmemAddr) -> Option<Location<'_>> {
        match &self.table {
            Some(table) => {
                let (index, offset) = table.locate(addr.get())?;
                // Only the entry's address, not the entry, is needed here.
                let entry = self.entries.get(index as usize)?;
                Some(Location {
                    entry,
                    offset: RegionOffset::new(RegionIndex(index), offset),
                })
            }
            None => self.locate(self.search(addr.get())?, addr),
        }
    }

    /// The index of the region with the highest start at or below `addr`
    /// (which may end before `addr`), by binary search.
    fn search(&self, addr: u64) -> Option<u32> {
        let pos = self.starts.partition_point(|&s| s <= addr);
        self.by_start.get(pos.checked_sub(1)?).copied()
    }

    /// `addr` inside region `index`, if the region holds it.
    #[inline]
    fn locate(&self, index: u32, addr: PmemAddr) -> Option<Location<'_>> {
        let entry = self.entries.get(index as usize)?;
        let offset = addr.checked_offset_from(entry.start)?;
        (offset < entry.len).then_some(Location {
            entry,
            offset: RegionOffset::new(entry.region, offset),
        })
    }

    /// The PMEM address of a region offset, if the region has that offset.
    pub fn pmem_addr(&self, at: RegionOffset) -> Option<PmemAddr> {
        let entry = self.entry(at.region)?;
        (at.offset < entry.len).then(|| PmemAddr(entry.start.get() + at.offset))
    }

    /// The entry of a region by its wire index.
    pub fn entry(&self, region: RegionIndex) -> Option<&LayoutEntry> {
        self.entries.get(region.0 as usize)
    }

    /// Records `key` as the key of `region` (in its entry and the
    /// allocator's metadata); `false` when there is no such region. The
    /// digest does not change: keys are not part of it.
    pub fn set_key(&mut self, region: RegionIndex, key: AccessKey) -> bool {
        let Some(entry) = self.entries.get_mut(region.0 as usize) else {
            return false;
        };
        entry.key = key;
        if let Some(meta) = &mut self.meta {
            meta.set_key(region, key);
        }
        true
    }

    /// The keys a MAP gives, recorded for every region it names with a
    /// non-zero key; returns how many were recorded.
    pub fn learn_keys(&mut self, map: &proto::map::Repr) -> usize {
        map.entries
            .iter()
            .filter(|e| !e.key.is_none() && self.set_key(e.region, e.key))
            .count()
    }

    /// The entry of a region by its id.
    pub fn entry_by_id(&self, id: &RegionId) -> Option<&LayoutEntry> {
        self.entries.iter().find(|e| &e.region_id == id)
    }

    /// All entries, in region-index (config) order.
    pub fn entries(&self) -> &[LayoutEntry] {
        &self.entries
    }

    /// All entries in ascending address order.
    pub fn entries_by_address(&self) -> impl Iterator<Item = &LayoutEntry> {
        self.by_start.iter().map(|&i| &self.entries[i as usize])
    }

    /// The pool's extent size.
    pub fn extent_size(&self) -> u64 {
        self.extent_size
    }

    /// A digest of the layout that every reader of the same topology shares.
    pub fn digest(&self) -> [u8; 32] {
        self.digest
    }

    /// The digest as lowercase hex.
    pub fn digest_hex(&self) -> String {
        self.digest.iter().map(|b| format!("{b:02x}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extent_table::Step;
    use crate::load::EnvOverrides;
    use crate::model::CachePolicy;

    fn default_topology() -> Topology {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/default.toml");
        Topology::load_with(path, &EnvOverrides::None).unwrap()
    }

    #[test]
    fn default_layout_is_packed_in_config_order() {
        let layout = Layout::new(&default_topology()).unwrap();
        let summary: Vec<_> = layout
            .entries()
            .iter()
            .map(|e| {
                (
                    e.region_id.as_str(),
                    e.start.get(),
                    e.server.as_str(),
                    e.socket.as_str(),
                )
            })
            .collect();
        let mib64 = 64 << 20;
        let base = 1 << 32;
        assert_eq!(
            summary,
            vec![
                ("PA.1", base, "A", "0"),
                ("PA.2", base + mib64, "A", "1"),
                ("PB.1", base + 2 * mib64, "B", "0"),
                ("PB.2", base + 3 * mib64, "B", "1"),
            ]
        );
        assert_eq!(layout.entries()[3].server_index, 1);
        assert_eq!(layout.entries()[3].socket_index, 1);
    }

    #[test]
    fn lookup_finds_region_offset_and_socket() {
        let layout = Layout::new(&default_topology()).unwrap();
        let addr = PmemAddr((1 << 32) + (64 << 20) * 3 + 0x1234);
        let at = layout.lookup(addr).unwrap();
        assert_eq!(at.server().as_str(), "B");
        assert_eq!(at.socket().as_str(), "1");
        assert_eq!(at.offset, RegionOffset::new(RegionIndex(3), 0x1234));
        assert!(layout.lookup(PmemAddr(0)).is_none());
        assert!(layout.lookup(PmemAddr((1 << 32) + (256 << 20))).is_none());
        assert!(layout.lookup(PmemAddr(u64::MAX)).is_none());
    }

    /// The digest is part of the protocol: daemons and clients built from
    /// different versions must agree on it for the same file.
    #[test]
    fn default_digest_is_stable() {
        let layout = Layout::new(&default_topology()).unwrap();
        assert_eq!(layout.digest_hex(), GOLDEN_DEFAULT_DIGEST);
    }

    const GOLDEN_DEFAULT_DIGEST: &str =
        "f64e82930f5142dd27a3c5ade5f0a45d5542bea21ae56893fdada6318c058449";

    #[test]
    fn keys_start_unknown_and_are_learnt_from_a_map() {
        let mut layout = Layout::new(&default_topology()).unwrap();
        assert!(layout.entries().iter().all(|e| e.key.is_none()));
        let digest = layout.digest();
        let mut map = layout.to_map();
        map.entries[1].key = AccessKey(42);
        map.entries.push(proto::map::MapEntry {
            region: RegionIndex(999),
            key: AccessKey(7),
            ..map.entries[0]
        });
        assert_eq!(layout.learn_keys(&map), 1);
        assert_eq!(layout.entries()[1].key, AccessKey(42));
        assert_eq!(layout.to_map().entries[1].key, AccessKey(42));
        assert_eq!(layout.entries()[0].key, AccessKey::NONE);
        assert_eq!(layout.digest(), digest);
    }

    const MIB2: u64 = 2 << 20;

    /// A synthetic entry (`region` is renumbered by `from_entries`).
    fn entry(start: u64, len: u64) -> LayoutEntry {
        LayoutEntry {
            start: PmemAddr(start),
            len,
            region: RegionIndex(0),
            region_id: RegionId::new(format!("R{start:x}+{len:x}")),
            server: "S".into(),
            server_index: 0,
            socket: "0".into(),
            socket_index: 0,
            device: "d".into(),
            key: AccessKey::NONE,
            cache: CachePolicy::WriteBack,
        }
    }

    fn layout(extent: u64, spans: &[(u64, u64)]) -> Layout {
        Layout::from_entries(extent, spans.iter().map(|&(s, l)| entry(s, l)).collect()).unwrap()
    }

    /// `(region, offset)` by each path there is, checked to agree with each
    /// other and with a scan of every entry.
    fn look(layout: &Layout, addr: u64) -> Option<(u32, u64)> {
        let scan = layout
            .entries()
            .iter()
            .find(|e| addr >= e.start.get() && addr - e.start.get() < e.len)
            .map(|e| (e.region.0, addr - e.start.get()));
        let pair = |l: Option<Location<'_>>| l.map(|l| (l.offset.region.0, l.offset.offset));
        let at = PmemAddr(addr);
        let searched = pair(layout.search(addr).and_then(|i| layout.locate(i, at)));
        assert_eq!(searched, scan, "binary search at {addr:#x}");
        if let Some(table) = &layout.table {
            assert_eq!(table.locate(addr), scan, "extent table at {addr:#x}");
        }
        assert_eq!(pair(layout.lookup(at)), scan, "lookup at {addr:#x}");
        scan
    }

    #[test]
    fn topologies_get_an_extent_table() {
        let layout = Layout::new(&default_topology()).unwrap();
        let table = layout.table.as_ref().unwrap();
        assert_eq!(table.base, 1 << 32);
        assert_eq!(table.step, Step::Shift(21));
        assert_eq!(table.len(), 4 * 32);
        assert_eq!(table.slot(0).and_then(|s| s.get()), Some((0, 0)));
        assert_eq!(table.slot(4 * 32 - 1).and_then(|s| s.get()), Some((3, 31)));
    }

    #[test]
    fn table_lookup_handles_holes_and_edges() {
        let base = 1 << 32;
        // Regions 0 and 1 with a two-extent hole between them, region 2 right
        // after region 1; config order differs from address order.
        let layout = layout(
            MIB2,
            &[
                (base + 5 * MIB2, MIB2),
                (base, 3 * MIB2),
                (base + 6 * MIB2, 2 * MIB2),
            ],
        );
        assert!(layout.table.is_some());
        assert_eq!(look(&layout, base), Some((1, 0)));
        assert_eq!(look(&layout, base + 3 * MIB2 - 1), Some((1, 3 * MIB2 - 1)));
        assert_eq!(
            look(&layout, base + 3 * MIB2),
            None,
            "first byte of the hole"
        );
        assert_eq!(
            look(&layout, base + 5 * MIB2 - 1),
            None,
            "last byte of the hole"
        );
        assert_eq!(look(&layout, base + 5 * MIB2), Some((0, 0)));
        assert_eq!(look(&layout, base + 6 * MIB2 - 1), Some((0, MIB2 - 1)));
        assert_eq!(look(&layout, base + 6 * MIB2), Some((2, 0)));
        assert_eq!(look(&layout, base + 8 * MIB2 - 1), Some((2, 2 * MIB2 - 1)));
        assert_eq!(look(&layout, base + 8 * MIB2), None, "one past the end");
        assert_eq!(look(&layout, base + 100 * MIB2), None);
        assert_eq!(look(&layout, base - 1), None, "below the lowest start");
        assert_eq!(look(&layout, 0), None);
        assert_eq!(look(&layout, u64::MAX), None);
    }

    #[test]
    fn table_reaches_the_top_of_the_address_space() {
        // The highest region ends at u64::MAX, the highest end there can be;
        // the base is not extent-aligned, only the offsets from it are.
        let base = u64::MAX - 3 * MIB2;
        let layout = layout(MIB2, &[(base, MIB2), (base + 2 * MIB2, MIB2)]);
        assert_eq!(layout.table.as_ref().unwrap().len(), 3);
        assert_eq!(look(&layout, base), Some((0, 0)));
        assert_eq!(look(&layout, base + MIB2), None);
        assert_eq!(look(&layout, u64::MAX - 1), Some((1, MIB2 - 1)));
        assert_eq!(look(&layout, u64::MAX), None);
        assert_eq!(look(&layout, base - 1), None);
    }

    #[test]
    fn other_extent_sizes_divide() {
        let layout = layout(3000, &[(10_000, 6000), (19_000, 3000)]);
        let table = layout.table.as_ref().unwrap();
        assert!(matches!(table.step, Step::Divide(d) if d.get() == 3000));
        assert_eq!(table.regions(), [1, 1, 0, 2]);
        for (addr, want) in [
            (9_999, None),
            (10_000, Some((0, 0))),
            (15_999, Some((0, 5999))),
            (16_000, None),
            (18_999, None),
            (19_000, Some((1, 0))),
            (21_999, Some((1, 2999))),
            (22_000, None),
        ] {
            assert_eq!(look(&layout, addr), want, "at {addr}");
        }
    }

    #[test]
    fn large_tables_sit_on_huge_pages_and_clone() {
        // 300,001 slots of 8 bytes: past the 2 MiB where tables leave the heap.
        let extent = 4096;
        let base = 1 << 40;
        let first = 200_000 * extent;
        let second = base + first + extent;
        let layout = layout(extent, &[(base, first), (second, 100_000 * extent)]);
        let table = layout.table.as_ref().unwrap();
        assert_eq!(table.len(), 300_001);
        assert!(table.on_huge_boundary());
        let copy = layout.clone();
        assert!(copy.table.as_ref().unwrap().on_huge_boundary());
        for l in [&layout, &copy] {
            assert_eq!(look(l, base), Some((0, 0)));
            assert_eq!(look(l, base + first - 1), Some((0, first - 1)));
            assert_eq!(look(l, base + first), None, "the one-extent hole");
            assert_eq!(
                look(l, second + 12_345 * extent + 7),
                Some((1, 12_345 * extent + 7))
            );
            assert_eq!(look(l, second + 100_000 * extent), None, "one past the end");
        }
        // Small tables stay on the heap.
        let small = Layout::new(&default_topology()).unwrap();
        assert!(!small.table.as_ref().unwrap().on_huge_boundary());
    }

    #[test]
    fn unaligned_sparse_or_empty_layouts_use_binary_search() {
        let base = 1 << 32;
        // A start that is not a whole number of extents from the lowest.
        let unaligned = layout(MIB2, &[(base, MIB2), (base + MIB2 + 4096, MIB2)]);
        // A length that is not a whole number of extents.
        let short = layout(MIB2, &[(base, MIB2 - 1), (base + MIB2, MIB2)]);
        // Two extents 1 TiB apart.
        let sparse = layout(MIB2, &[(base, MIB2), (base + (1 << 40), MIB2)]);
        let no_extent = layout(0, &[(base, MIB2)]);
        let empty = layout(MIB2, &[]);
        for layout in [&unaligned, &short, &sparse, &no_extent, &empty] {
            assert!(layout.table.is_none(), "{layout:?}");
        }
        assert_eq!(look(&unaligned, base + MIB2 + 4095), None);
        assert_eq!(
            look(&unaligned, base + 2 * MIB2 + 4095),
            Some((1, MIB2 - 1))
        );
        assert_eq!(look(&short, base + MIB2 - 1), None);
        assert_eq!(look(&sparse, base + (1 << 40) - 1), None);
        assert_eq!(look(&sparse, base + (1 << 40)), Some((1, 0)));
        assert_eq!(look(&no_extent, base + MIB2 - 1), Some((0, MIB2 - 1)));
        assert_eq!(look(&empty, base), None);
        // Up to the slack, holes do not matter.
        let holey = layout(MIB2, &[(base, MIB2), (base + 1024 * MIB2, MIB2)]);
        assert_eq!(holey.table.as_ref().unwrap().len(), 1025);
    }

    #[test]
    fn empty_regions_take_no_extents() {
        let base = 1 << 32;
        let layout = layout(
            MIB2,
            &[
                (base, 0),
                (base, MIB2),
                (base + MIB2, 0),
                (base + 3 * MIB2, 0),
            ],
        );
        assert_eq!(layout.table.as_ref().unwrap().regions(), [2, 0, 0]);
        assert_eq!(look(&layout, base), Some((1, 0)));
        assert_eq!(look(&layout, base + MIB2), None);
        assert_eq!(look(&layout, base + 3 * MIB2), None);
    }

    #[test]
    fn equality_ignores_derived_state() {
        let a = Layout::new(&default_topology()).unwrap();
        assert_eq!(a, a.clone());
        let mut entries = a.entries().to_vec();
        entries[0].key = AccessKey(entries[0].key.get() ^ 1);
        let rekeyed = Layout::from_entries(a.extent_size(), entries).unwrap();
        assert_eq!(a.digest(), rekeyed.digest());
        assert_ne!(a, rekeyed);
        let other_extent = Layout::from_entries(4096, a.entries().to_vec()).unwrap();
        assert_ne!(a, other_extent);
        assert!(
            !format!("{a:?}").contains("slots: ["),
            "the table is summarised"
        );
    }

    proptest::proptest! {
        /// Synthetic layouts, dense, unaligned and sparse, with extents a
        /// power of two or not, in shuffled config order: the table (when
        /// there is one), binary search and a linear scan agree everywhere
        /// near a region edge and at random addresses.
        #[test]
        fn both_paths_agree_with_a_scan(
            extent in proptest::prop_oneof![proptest::strategy::Just(4096u64), 2u64..5000],
            base in 0u64..(1 << 44),
            kind in 0u8..3,
            shape in proptest::collection::vec((0u64..4, 0u64..6), 2..40),
            order in proptest::collection::vec(proptest::num::usize::ANY, 40),
            probes in proptest::collection::vec(proptest::num::u64::ANY, 16),
        ) {
            // kind 0: dense and aligned (some regions empty); 1: lengths one
            // byte past whole extents; 2: aligned with a 1 Mi-extent gap in
            // the middle.
            let mut cursor = base;
            let mut spans = Vec::new();
            for (i, &(gap, extents)) in shape.iter().enumerate() {
                cursor += gap * extent;
                if kind == 2 && i == shape.len() / 2 {
                    cursor += (1 << 20) * extent;
                }
                let len = extents * extent + u64::from(kind == 1);
                spans.push((cursor, len));
                // An empty region may not share its start with a later one.
                cursor += if len == 0 { extent } else { len };
            }
            for (i, &j) in order.iter().enumerate().take(spans.len()) {
                let len = spans.len();
                spans.swap(i, j % len);
            }
            let layout = layout(extent, &spans);
            proptest::prop_assert_eq!(layout.table.is_some(), kind == 0);
            let mut addrs = probes;
            for &(start, len) in &spans {
                addrs.extend([start.wrapping_sub(1), start, start + len / 2]);
                addrs.extend([(start + len).wrapping_sub(1), start + len]);
            }
            for addr in addrs {
                look(&layout, addr);
            }
        }
    }

    #[test]
    fn from_entries_rejects_overlap() {
        let layout = Layout::new(&default_topology()).unwrap();
        let mut entries = layout.entries().to_vec();
        entries[1].start = PmemAddr(entries[0].start.get() + 4096);
        assert!(matches!(
            Layout::from_entries(2 << 20, entries),
            Err(LayoutError::Overlap { .. })
        ));
    }
}
