//! Virtual → PMEM translation, and the translation cache in front of it.
//!
//! The virtual address space is identical on every client of a pool. It
//! is divided into fixed-size extents; a [`Translator`] maps each extent to
//! a PMEM extent and the key requests for it carry. [`StaticTranslator`] is
//! the backing the topology implies: the regions' extents laid end to end
//! in layout order from [`VIRT_BASE`]. The allocator's page table, which
//! lives in PMEM, is not a `Translator`: looking an extent up there is a
//! READ through the fabric, so the pool walks it itself (asynchronously)
//! when the TLB misses, and caches what it finds here.

use std::collections::HashMap;
use std::sync::Mutex;

use topology::{AccessKey, Layout, PmemAddr, RegionIndex, VirtAddr};

/// Where the shared virtual address space starts (1 TiB): far from the PMEM
/// addresses, so one mistaken for the other is never valid.
pub const VIRT_BASE: u64 = 1 << 40;

/// One virtual extent's mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Translation {
    /// First virtual address of the extent.
    pub vbase: VirtAddr,
    /// Extent length in bytes.
    pub len: u64,
    /// PMEM address the extent starts at.
    pub pmem: PmemAddr,
    /// Key requests for the extent carry.
    pub key: AccessKey,
    /// The region holding the extent.
    pub region: RegionIndex,
}

impl Translation {
    /// The PMEM address of `vaddr`, which must lie in this extent.
    pub fn pmem_of(&self, vaddr: VirtAddr) -> PmemAddr {
        PmemAddr(self.pmem.get() + (vaddr.get() - self.vbase.get()))
    }

    /// Bytes from `vaddr` to the end of the extent.
    pub fn remaining(&self, vaddr: VirtAddr) -> u64 {
        self.vbase.get() + self.len - vaddr.get()
    }
}

/// A virtual address with no mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("virtual address {0} is not mapped")]
pub struct Unmapped(pub VirtAddr);

/// Maps virtual extents to PMEM extents.
pub trait Translator: Send + Sync + std::fmt::Debug {
    /// The mapping of the extent holding `vaddr`.
    fn translate(&self, vaddr: VirtAddr) -> Result<Translation, Unmapped>;

    /// The extent size.
    fn extent_size(&self) -> u64;
}

/// The static virtual space of a topology: every region's extents, in
/// layout order, laid end to end from [`VIRT_BASE`].
#[derive(Debug, Clone)]
pub struct StaticTranslator {
    extent: u64,
    /// (virtual start, PMEM start, length, key, region), ascending.
    spans: Vec<(u64, u64, u64, AccessKey, RegionIndex)>,
    /// One past the highest virtual address ever given (withdrawn regions
    /// included): where regions a later map adds go.
    high_water: u64,
}

impl StaticTranslator {
    /// The static space of `layout`.
    pub fn new(layout: &Layout) -> Self {
        let mut next = VIRT_BASE;
        let spans = layout
            .entries()
            .iter()
            .map(|e| {
                let span = (next, e.start.get(), e.len, e.key, e.region);
                next += e.len;
                span
            })
            .collect();
        Self {
            extent: layout.extent_size().max(1),
            spans,
            high_water: next,
        }
    }

    /// The static space of `layout`, a later epoch of this one's map:
    /// every region this space has keeps its virtual range (found by its
    /// PMEM range, which never moves), a withdrawn region's range stays
    /// unmapped, and regions new to `layout` are laid end to end after
    /// the highest virtual address this space ever gave.
    pub fn follow(&self, layout: &Layout) -> Self {
        let mut next = self.end().get().max(self.high_water);
        let mut spans: Vec<_> = layout
            .entries()
            .iter()
            .map(|e| {
                let known = self
                    .spans
                    .iter()
                    .find(|s| s.1 == e.start.get() && s.2 == e.len);
                match known {
                    Some(&(v, ..)) => (v, e.start.get(), e.len, e.key, e.region),
                    None => {
                        let span = (next, e.start.get(), e.len, e.key, e.region);
                        next += e.len;
                        span
                    }
                }
            })
            .collect();
        spans.sort_unstable_by_key(|s| s.0);
        Self {
            extent: self.extent,
            spans,
            high_water: next,
        }
    }

    /// The virtual range `[start, end)` of each region, in virtual order.
    pub fn region_ranges(&self) -> impl Iterator<Item = (RegionIndex, VirtAddr, u64)> + '_ {
        self.spans
            .iter()
            .map(|&(v, _, len, _, region)| (region, VirtAddr(v), len))
    }

    /// One past the last mapped virtual address.
    pub fn end(&self) -> VirtAddr {
        VirtAddr(self.spans.last().map_or(VIRT_BASE, |s| s.0 + s.2))
    }
}

impl Translator for StaticTranslator {
    fn translate(&self, vaddr: VirtAddr) -> Result<Translation, Unmapped> {
        let v = vaddr.get();
        let at = self.spans.partition_point(|s| s.0 <= v);
        let &(vstart, pstart, len, key, region) =
            self.spans.get(at.wrapping_sub(1)).ok_or(Unmapped(vaddr))?;
        let offset = v - vstart;
        if offset >= len {
            return Err(Unmapped(vaddr));
        }
        let extent_offset = offset - offset % self.extent;
        Ok(Translation {
            vbase: VirtAddr(vstart + extent_offset),
            len: self.extent.min(len - extent_offset),
            pmem: PmemAddr(pstart + extent_offset),
            key,
            region,
        })
    }

    fn extent_size(&self) -> u64 {
        self.extent
    }
}

/// A cache of extent translations in front of a [`Translator`]: filled on a
/// miss, invalidated when a server says a translation is stale.
#[derive(Debug)]
pub struct Tlb {
    entries: Mutex<HashMap<u64, Translation>>,
    capacity: usize,
    extent: u64,
}

impl Tlb {
    /// A cache of up to `capacity` extents of size `extent`.
    pub fn new(extent: u64, capacity: usize) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
            extent: extent.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Translation>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The translation of `vaddr`'s extent, from the cache or `backing`.
    pub fn translate(
        &self,
        backing: &dyn Translator,
        vaddr: VirtAddr,
    ) -> Result<Translation, Unmapped> {
        let extent = vaddr.get() / self.extent;
        if let Some(t) = self.lock().get(&extent) {
            return Ok(*t);
        }
        let t = backing.translate(vaddr)?;
        let mut entries = self.lock();
        if entries.len() >= self.capacity {
            entries.clear();
        }
        entries.insert(extent, t);
        Ok(t)
    }

    /// The cached translation of `vaddr`'s extent, if any.
    pub fn get(&self, vaddr: VirtAddr) -> Option<Translation> {
        self.lock().get(&(vaddr.get() / self.extent)).copied()
    }

    /// Caches `t` (replacing what was cached for its extent).
    pub fn insert(&self, t: Translation) {
        let mut entries = self.lock();
        if entries.len() >= self.capacity {
            entries.clear();
        }
        entries.insert(t.vbase.get() / self.extent, t);
    }

    /// Drops the cached translation of `vaddr`'s extent.
    pub fn invalidate(&self, vaddr: VirtAddr) {
        self.lock().remove(&(vaddr.get() / self.extent));
    }

    /// Drops every cached translation (the map moved to a new epoch).
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Cached extents.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use topology::{EnvOverrides, Topology};

    fn layout() -> Layout {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/default.toml");
        Layout::new(&Topology::load_with(path, &EnvOverrides::None).unwrap()).unwrap()
    }

    #[test]
    fn regions_are_laid_end_to_end_in_layout_order() {
        let layout = layout();
        let t = StaticTranslator::new(&layout);
        let mib64 = 64 << 20;
        // The last byte of region 0 and the first of region 1 are adjacent.
        let a = t.translate(VirtAddr(VIRT_BASE + mib64 - 1)).unwrap();
        let b = t.translate(VirtAddr(VIRT_BASE + mib64)).unwrap();
        assert_eq!(a.region, RegionIndex(0));
        assert_eq!(b.region, RegionIndex(1));
        assert_eq!(
            a.pmem_of(VirtAddr(VIRT_BASE + mib64 - 1)).get(),
            layout.entries()[0].end() - 1
        );
        assert_eq!(b.pmem, layout.entries()[1].start);
        assert_eq!(b.key, layout.entries()[1].key);
        assert_eq!(a.len, 2 << 20, "one extent");
        assert_eq!(a.remaining(VirtAddr(VIRT_BASE + mib64 - 1)), 1);
        assert_eq!(t.end(), VirtAddr(VIRT_BASE + 4 * mib64));
        assert_eq!(
            t.translate(VirtAddr(VIRT_BASE - 1)),
            Err(Unmapped(VirtAddr(VIRT_BASE - 1)))
        );
        assert!(t.translate(t.end()).is_err());
        assert!(t.translate(VirtAddr(u64::MAX)).is_err());
    }

    #[test]
    fn every_extent_translates_consistently() {
        let layout = layout();
        let t = StaticTranslator::new(&layout);
        let mut v = VIRT_BASE;
        while v < t.end().get() {
            let tr = t.translate(VirtAddr(v + 12345)).unwrap();
            assert_eq!(tr.vbase, VirtAddr(v));
            let entry = layout.lookup(tr.pmem).unwrap();
            assert_eq!(entry.entry.region, tr.region);
            assert!(tr.pmem.get() + tr.len <= entry.entry.end());
            v += tr.len;
        }
    }

    #[test]
    fn tlb_caches_and_invalidates() {
        #[derive(Debug)]
        struct Counting(StaticTranslator, std::sync::atomic::AtomicUsize);
        impl Translator for Counting {
            fn translate(&self, vaddr: VirtAddr) -> Result<Translation, Unmapped> {
                self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                self.0.translate(vaddr)
            }
            fn extent_size(&self) -> u64 {
                self.0.extent_size()
            }
        }
        let backing = Counting(StaticTranslator::new(&layout()), Default::default());
        let tlb = Tlb::new(2 << 20, 2);
        let misses = || backing.1.load(std::sync::atomic::Ordering::SeqCst);
        tlb.translate(&backing, VirtAddr(VIRT_BASE)).unwrap();
        tlb.translate(&backing, VirtAddr(VIRT_BASE + 100)).unwrap();
        assert_eq!(misses(), 1, "same extent: one miss");
        tlb.invalidate(VirtAddr(VIRT_BASE + 5));
        tlb.translate(&backing, VirtAddr(VIRT_BASE)).unwrap();
        assert_eq!(misses(), 2, "refilled after invalidation");
        for i in 1..4 {
            tlb.translate(&backing, VirtAddr(VIRT_BASE + i * (2 << 20)))
                .unwrap();
        }
        assert!(tlb.len() <= 2, "bounded");
    }
}
