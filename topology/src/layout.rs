//! The PMEM address layout: where every region sits in the flat PMEM space.
//!
//! The layout is a pure function of the topology. Regions are taken in config
//! order; a region with an explicit `address` sits there, every other region is
//! placed at the next address aligned to the pool's region alignment that does
//! not collide with an explicitly placed one. Daemons and clients that read the
//! same file derive the same layout and compare [`Layout::digest`] to be sure.

use sha2::{Digest, Sha256};

use crate::addr::{PmemAddr, RegionIndex, RegionOffset};
use crate::ids::{PmemDeviceId, RegionId, ServerId, SocketId};
use crate::model::{CachePolicy, Topology};

/// One region's place in the PMEM address space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutEntry {
    /// First PMEM address of the region.
    pub start: PmemAddr,
    /// Length of the region in bytes.
    pub len: u64,
    /// The region's wire-level index (its position in config order).
    pub region: RegionIndex,
    /// The region's id.
    pub region_id: RegionId,
    /// The server that owns the region.
    pub server: ServerId,
    /// The owning server's position in config order.
    pub server_index: u16,
    /// The socket the region's device is attached to.
    pub socket: SocketId,
    /// The socket's position within its server.
    pub socket_index: u16,
    /// The PMEM device the region is carved from.
    pub device: PmemDeviceId,
    /// The protection key requests for this region must carry.
    pub key: u64,
    /// The region's cache policy.
    pub cache: CachePolicy,
}

impl LayoutEntry {
    /// One past the last PMEM address of the region.
    pub fn end(&self) -> u64 {
        self.start.get() + self.len
    }

    /// Whether `addr` falls inside the region.
    pub fn contains(&self, addr: PmemAddr) -> bool {
        addr.get() >= self.start.get() && addr.get() - self.start.get() < self.len
    }
}

/// Where a PMEM address lands: the owning region and the offset inside it.
#[derive(Debug, Clone, Copy)]
pub struct Location<'a> {
    /// The region holding the address.
    pub entry: &'a LayoutEntry,
    /// The address as the owning server sees it.
    pub offset: RegionOffset,
}

impl Location<'_> {
    /// The server that owns the address.
    pub fn server(&self) -> &ServerId {
        &self.entry.server
    }

    /// The socket whose PMEM holds the address.
    pub fn socket(&self) -> &SocketId {
        &self.entry.socket
    }

    /// Bytes from the address to the end of its region.
    pub fn remaining(&self) -> u64 {
        self.entry.len - self.offset.offset
    }
}

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
}

/// The PMEM address map of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    extent_size: u64,
    /// Entries indexed by `RegionIndex`.
    entries: Vec<LayoutEntry>,
    /// Start addresses sorted ascending, parallel to `by_start`.
    starts: Vec<u64>,
    /// Region indices in address order.
    by_start: Vec<u32>,
    digest: [u8; 32],
}

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

/// The default key of a region: derived from the pool name and region id so
/// that every reader of the same topology agrees on it.
pub fn derived_key(pool: &str, region: &RegionId) -> u64 {
    let mut hash = Sha256::new();
    hash.update(b"pmem-fabric/region-key/v1\0");
    hash.update(pool.as_bytes());
    hash.update([0]);
    hash.update(region.as_str().as_bytes());
    let out = hash.finalize();
    let mut key = [0u8; 8];
    key.copy_from_slice(&out[..8]);
    u64::from_le_bytes(key)
}

impl Layout {
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
                key: region
                    .key
                    .unwrap_or_else(|| derived_key(&topology.pool.name, &region.id)),
                cache: region.cache,
            });
        }
        Self::from_entries(topology.pool.extent_size.bytes(), entries)
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
        Ok(Self {
            extent_size,
            entries,
            starts,
            by_start,
            digest,
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

    /// Finds the region holding `addr`, in O(log n).
    pub fn lookup(&self, addr: PmemAddr) -> Option<Location<'_>> {
        let pos = self.starts.partition_point(|&s| s <= addr.get());
        let index = *self.by_start.get(pos.checked_sub(1)?)?;
        let entry = &self.entries[index as usize];
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
    use crate::load::EnvOverrides;

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
    fn keys_are_derived_or_explicit() {
        let mut t = default_topology();
        let layout = Layout::new(&t).unwrap();
        let derived = layout.entries()[0].key;
        assert_eq!(derived, derived_key("default", &"PA.1".into()));
        assert_ne!(derived, layout.entries()[1].key);
        t.servers[0].sockets[0].devices[0].regions[0].key = Some(42);
        assert_eq!(Layout::new(&t).unwrap().entries()[0].key, 42);
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
