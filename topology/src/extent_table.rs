//! The extent table: O(1) address lookup for dense layouts.
//!
//! One 8-byte slot per extent between the lowest region start and the highest
//! region end says which region holds that extent and which of the region's
//! extents it is, so a lookup reads exactly one slot and never the region's
//! [`LayoutEntry`]: the offset inside the region follows from the slot and
//! the address alone.
//!
//! Tables of 2 MiB and more live in anonymous memory aligned to 2 MiB and
//! advised for transparent huge pages. A table for 1,000,000 regions is about
//! 20 MiB; on 4 KiB pages random lookups over it miss the TLB on almost every
//! access (about 5,000 pages against a TLB of 1,500 entries), on 2 MiB pages
//! it takes about ten TLB entries.

use std::fmt;
use std::num::NonZeroU64;

use memmap2::{Advice, MmapMut, MmapOptions};

use crate::region_place::LayoutEntry;

/// How an offset from the table's base becomes a slot number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// The extent size is `1 << shift`.
    Shift(u32),
    /// Any other extent size.
    Divide(NonZeroU64),
}

/// One extent's slot: 0 for a hole, otherwise the region index + 1 in the
/// high 32 bits and the extent's position inside its region in the low 32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot(u64);

impl Slot {
    /// A slot for extent `nth` of region `region`.
    fn new(region: u32, nth: u32) -> Self {
        Self(((u64::from(region) + 1) << 32) | u64::from(nth))
    }

    /// The region index and the extent's position in it, or `None` for a hole.
    pub(crate) fn get(self) -> Option<(u32, u32)> {
        let region = (self.0 >> 32).checked_sub(1)?;
        Some((region as u32, self.0 as u32))
    }
}

/// The region of every extent between the lowest region start and the
/// highest region end: derived state of a dense layout.
#[derive(Clone)]
pub(crate) struct ExtentTable {
    /// The address of slot 0: the lowest region start.
    pub(crate) base: u64,
    /// Slot number of `addr` is `(addr - base) / extent_size`.
    pub(crate) step: Step,
    extent_size: u64,
    slots: SlotStore,
}

impl fmt::Debug for ExtentTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExtentTable")
            .field("base", &self.base)
            .field("step", &self.step)
            .field("slots", &self.len())
            .field("huge", &matches!(self.slots, SlotStore::Huge { .. }))
            .finish()
    }
}

impl ExtentTable {
    /// The most slots a table may have (256 MiB of slots, a span of 64 TiB
    /// with 2 MiB extents).
    const MAX_SLOTS: u64 = 32 << 20;
    /// A table may span at most this many times the extents its regions
    /// cover, plus [`Self::SLACK_SLOTS`] …
    const SPARSITY: u64 = 4;
    /// … so that small layouts with a few holes get one too.
    const SLACK_SLOTS: u64 = 1024;

    /// The table of `entries` (valid, non-overlapping, renumbered), or
    /// `None` when some region is not extent-aligned relative to the lowest
    /// start or has more than `u32::MAX` extents, or the layout is too sparse
    /// or too large for a table.
    pub(crate) fn build(extent_size: u64, entries: &[LayoutEntry]) -> Option<Self> {
        let size = NonZeroU64::new(extent_size)?;
        let base = entries.iter().map(|e| e.start.get()).min()?;
        let end = entries.iter().map(LayoutEntry::end).max()?;
        let mut covered = 0u64;
        for e in entries {
            if (e.start.get() - base) % extent_size != 0 || e.len % extent_size != 0 {
                return None;
            }
            u32::try_from(e.len / extent_size).ok()?;
            covered = covered.saturating_add(e.len / extent_size);
        }
        // Exact: `end` is the end of an aligned region.
        let span = (end - base) / extent_size;
        let limit = covered
            .saturating_mul(Self::SPARSITY)
            .saturating_add(Self::SLACK_SLOTS)
            .min(Self::MAX_SLOTS);
        if span > limit {
            return None;
        }
        let mut slots = SlotStore::zeroed(usize::try_from(span).ok()?);
        for e in entries {
            let first = usize::try_from((e.start.get() - base) / extent_size).ok()?;
            let count = u32::try_from(e.len / extent_size).ok()?;
            for nth in 0..count {
                // Region indices are below `u32::MAX` (checked by `from_entries`).
                slots.set(first + nth as usize, Slot::new(e.region.0, nth));
            }
        }
        let step = if size.is_power_of_two() {
            Step::Shift(size.trailing_zeros())
        } else {
            Step::Divide(size)
        };
        Some(Self {
            base,
            step,
            extent_size,
            slots,
        })
    }

    /// The region index holding `addr` and the offset of `addr` inside that
    /// region, if any region holds it.
    #[inline]
    pub(crate) fn locate(&self, addr: u64) -> Option<(u32, u64)> {
        let rel = addr.checked_sub(self.base)?;
        let (slot, within) = match self.step {
            Step::Shift(shift) => (rel >> shift, rel & ((1 << shift) - 1)),
            Step::Divide(size) => (rel / size, rel % size),
        };
        let (region, nth) = self.slots.get(usize::try_from(slot).ok()?)?.get()?;
        Some((region, u64::from(nth) * self.extent_size + within))
    }

    /// How many slots the table has.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Slot `i`.
    #[cfg(test)]
    pub(crate) fn slot(&self, i: usize) -> Option<Slot> {
        self.slots.get(i)
    }

    /// Whether the slots sit in huge-page-advised memory, slot 0 on a 2 MiB
    /// boundary.
    #[cfg(test)]
    pub(crate) fn on_huge_boundary(&self) -> bool {
        match &self.slots {
            SlotStore::Heap(_) => false,
            SlotStore::Huge { map, first, .. } => {
                (map.as_ptr() as usize + first).is_multiple_of(HUGE_PAGE)
            }
        }
    }

    /// The region index + 1 of every slot, 0 for holes: a compact picture of
    /// the table for tests.
    #[cfg(test)]
    pub(crate) fn regions(&self) -> Vec<u32> {
        (0..self.len())
            .map(|i| {
                self.slots
                    .get(i)
                    .and_then(Slot::get)
                    .map_or(0, |(r, _)| r + 1)
            })
            .collect()
    }
}

/// The size of a transparent huge page on x86-64 and most arm64 kernels.
const HUGE_PAGE: usize = 2 << 20;

/// Where the slots live: on the heap for small tables, in anonymous memory
/// advised for huge pages for large ones.
enum SlotStore {
    Heap(Box<[u64]>),
    Huge {
        map: MmapMut,
        /// Byte offset of slot 0 in `map` (the first 2 MiB boundary).
        first: usize,
        len: usize,
    },
}

impl SlotStore {
    /// `len` empty slots (at most [`ExtentTable::MAX_SLOTS`]).
    fn zeroed(len: usize) -> Self {
        let bytes = len.saturating_mul(8);
        if bytes < HUGE_PAGE {
            return Self::Heap(vec![0; len].into_boxed_slice());
        }
        // Without an anonymous mapping, fall back to the heap, which will
        // most likely fail the same way, but let the allocator say so.
        Self::huge(len, bytes).unwrap_or_else(|_| Self::Heap(vec![0; len].into_boxed_slice()))
    }

    /// Anonymous memory for `len` slots starting on a 2 MiB boundary and
    /// advised for transparent huge pages. Anonymous memory reads as zeros.
    fn huge(len: usize, bytes: usize) -> std::io::Result<Self> {
        let map = MmapOptions::new()
            .len(bytes.saturating_add(HUGE_PAGE))
            .map_anon()?;
        let addr = map.as_ptr() as usize;
        let first = addr.next_multiple_of(HUGE_PAGE) - addr;
        // Only a hint: without THP the table works the same on small pages.
        let _ = map.advise(Advice::HugePage);
        Ok(Self::Huge { map, first, len })
    }

    fn len(&self) -> usize {
        match self {
            Self::Heap(slots) => slots.len(),
            Self::Huge { len, .. } => *len,
        }
    }

    #[inline]
    fn get(&self, i: usize) -> Option<Slot> {
        match self {
            Self::Heap(slots) => slots.get(i).copied().map(Slot),
            Self::Huge { map, first, len } => {
                if i >= *len {
                    return None;
                }
                let at = first + i * 8;
                let bytes = map.get(at..at + 8)?;
                Some(Slot(u64::from_ne_bytes(bytes.try_into().ok()?)))
            }
        }
    }

    fn set(&mut self, i: usize, slot: Slot) {
        match self {
            Self::Heap(slots) => slots[i] = slot.0,
            Self::Huge { map, first, .. } => {
                let at = *first + i * 8;
                map[at..at + 8].copy_from_slice(&slot.0.to_ne_bytes());
            }
        }
    }
}

impl Clone for SlotStore {
    fn clone(&self) -> Self {
        let len = self.len();
        let mut copy = Self::zeroed(len);
        for i in 0..len {
            if let Some(slot) = self.get(i) {
                copy.set(i, slot);
            }
        }
        copy
    }
}
