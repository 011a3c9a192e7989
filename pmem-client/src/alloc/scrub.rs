//! `df` and `scrub`: what the pool holds, and reclaiming what crashed
//! clients left half-done.
//!
//! Scrub reconciles the three records that describe every allocation — the
//! page table, the regions' bitmaps and key tables, the slab headers — and
//! the name directory. What a LIVE head (or LIVE slab) references is kept
//! and repaired if a bit or key is missing; everything else that is not
//! FREE is an allocation cut short and is reclaimed. Run it when no client
//! is in the middle of allocating (after a crash, like fsck): an allocation
//! in progress looks exactly like one cut short.
//!
//! With authentication, the servers let a client change only its own
//! records (see `docs/security.md`), so a client's scrub completes its own
//! crashed work (a client restarted under the same identity) and what no
//! client owns; records of other clients that it may not change are
//! counted in [`ScrubReport::left_to_owners`] and left for their owners.

use std::collections::{HashMap, HashSet};

use topology::{PmemAddr, RegionMeta, VirtAddr};

use super::extents::free_entry;
use super::records::{self, EntryKind, EntryState, NameEntry, NameState, PtEntry, SlabHeader, sb};
use super::slab::usable_bits;
use super::{AllocError, Allocator, never_free_bits};

/// Capacity of one region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionUsage {
    /// The server holding it.
    pub server: String,
    /// The region.
    pub region: String,
    /// Extents that can be allocated.
    pub extents: u64,
    /// Of those, allocated (whole, or as slabs).
    pub used: u64,
}

impl RegionUsage {
    /// Extents free.
    pub fn free(&self) -> u64 {
        self.extents - self.used.min(self.extents)
    }
}

/// What the pool holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// The extent size.
    pub extent_size: u64,
    /// Per region, in region order.
    pub regions: Vec<RegionUsage>,
    /// Live slabs.
    pub slabs: u64,
    /// Objects handed out from them.
    pub slab_objects: u64,
    /// Bytes of those objects.
    pub slab_bytes: u64,
}

impl Usage {
    /// Extents free over the whole pool.
    pub fn free_extents(&self) -> u64 {
        self.regions.iter().map(RegionUsage::free).sum()
    }

    /// Extents that can be allocated over the whole pool.
    pub fn total_extents(&self) -> u64 {
        self.regions.iter().map(|r| r.extents).sum()
    }
}

/// What a scrub found and reclaimed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubReport {
    /// Page-table entries of allocations cut short, set FREE.
    pub entries_reclaimed: u64,
    /// PMEM extents marked allocated that no live allocation holds.
    pub extents_reclaimed: u64,
    /// Extent keys left installed on unallocated extents, cleared.
    pub keys_cleared: u64,
    /// Bits or keys a live allocation was missing, restored.
    pub repaired: u64,
    /// Slab objects claimed but never completed, reclaimed.
    pub slab_objects_reclaimed: u64,
    /// Slab headers whose count was off, corrected.
    pub slab_counts_fixed: u64,
    /// Empty or half-retired slabs whose extent was freed.
    pub slabs_retired: u64,
    /// Name entries of objects never completed or gone, cleared.
    pub names_reclaimed: u64,
    /// Slab hints naming no live slab, cleared.
    pub hints_cleared: u64,
    /// Records of other clients that needed repair but that the servers
    /// let only their owners change: left for the owners' scrub.
    pub left_to_owners: u64,
}

impl ScrubReport {
    /// Whether the pool was already consistent.
    pub fn is_clean(&self) -> bool {
        *self == Self::default()
    }
}

impl Allocator {
    /// Capacity used and free per region, and slab occupancy.
    pub async fn usage(&self) -> Result<Usage, AllocError> {
        self.follow_layout(false).await?;
        let layout = self.pool.layout();
        let mut regions = Vec::new();
        for region in &self.usable_regions() {
            let words = self.read_bitmap(region).await?;
            let used: u64 = words
                .iter()
                .enumerate()
                .map(|(w, word)| {
                    u64::from((word & !never_free_bits(region, w as u64)).count_ones())
                })
                .sum();
            let entry = layout.entry(region.region);
            regions.push(RegionUsage {
                server: entry.map_or_else(String::new, |e| e.server.to_string()),
                region: entry.map_or_else(String::new, |e| e.region_id.to_string()),
                extents: region.data_extents(),
                used,
            });
        }
        let (mut slabs, mut slab_objects, mut slab_bytes) = (0, 0, 0);
        for (_, entry) in self.live_slabs(&self.read_page_table().await?) {
            let word = self.slab_word(&entry, 0).await?;
            if let Some(h) = SlabHeader::decode(word) {
                slabs += 1;
                slab_objects += u64::from(h.used);
                slab_bytes += u64::from(h.used) * self.classes.slab(h.class).object;
            }
        }
        Ok(Usage {
            extent_size: self.meta.extent_size(),
            regions,
            slabs,
            slab_objects,
            slab_bytes,
        })
    }

    /// Reclaims what allocations cut short left behind; see the module docs.
    pub async fn scrub(&self) -> Result<ScrubReport, AllocError> {
        self.check_superblock().await?;
        let mut report = ScrubReport::default();
        let table = self.read_page_table().await?;
        let dir = self.read_directory().await?;
        // Slabs first: an empty or retiring one is freed like any allocation.
        for (index, entry) in self.live_slabs(&table) {
            let scrubbed = self.scrub_slab(index, &entry, &mut report).await;
            report.left_to_owners += refused(scrubbed)?;
        }
        let table = self.read_page_table().await?;
        let live = self.live_allocations(&table, &dir);
        // Entries not part of a live allocation go back to FREE.
        let mut held: HashMap<u64, u64> = HashMap::new();
        for (i, entry) in table.iter().enumerate() {
            let i = i as u64;
            if live.contains_key(&i) {
                held.insert(entry.pmem, entry.key.get());
                continue;
            }
            if entry.control.state != EntryState::Free {
                let from = entry.control;
                match self.set_control(i, from, free_entry(from).control).await {
                    Ok(()) => report.entries_reclaimed += 1,
                    Err(e) if is_refusal(&e) => report.left_to_owners += 1,
                    // Changed under this scrub: not cut short after all.
                    Err(_) => {}
                }
            }
        }
        self.scrub_regions(&held, &mut report).await?;
        self.scrub_names(&dir, &table, &live, &mut report).await?;
        self.scrub_hints(&table, &mut report).await?;
        *self.lock_guesses() = super::Guesses::default();
        Ok(report)
    }

    /// Page-table index → head index of every entry of a live allocation.
    fn live_allocations(&self, table: &[PtEntry], dir: &[NameEntry]) -> HashMap<u64, u64> {
        let extent = self.meta.extent_size();
        let mut live = HashMap::new();
        for (i, head) in table.iter().enumerate() {
            let i = i as u64;
            if head.control.state != EntryState::Live {
                continue;
            }
            match head.control.kind {
                EntryKind::Slab => {
                    live.insert(i, i);
                }
                EntryKind::Head => {
                    if let Some(slot) = head.name_slot() {
                        let named = dir.get(slot as usize).is_some_and(|e| {
                            e.state == NameState::Live
                                && e.vaddr == records::vbase_of(&self.meta, i).get()
                        });
                        if !named {
                            continue;
                        }
                    }
                    let n = head.size().div_ceil(extent).max(1);
                    for j in 0..n {
                        let linked = j == 0
                            || table.get((i + j) as usize).is_some_and(|t| {
                                t.control.kind == EntryKind::Tail
                                    && t.tail_head() == (i, head.control.generation)
                            });
                        if linked {
                            live.insert(i + j, i);
                        }
                    }
                }
                EntryKind::Tail => {}
            }
        }
        live
    }

    /// Bits and keys against what live allocations hold.
    async fn scrub_regions(
        &self,
        held: &HashMap<u64, u64>,
        report: &mut ScrubReport,
    ) -> Result<(), AllocError> {
        let extent = self.meta.extent_size();
        self.follow_layout(false).await?;
        for region in &self.usable_regions() {
            let words = self.read_bitmap(region).await?;
            let keys = self
                .read(
                    region.at(region.key_table_offset()),
                    region.key,
                    (region.extents * 8) as u32,
                )
                .await?;
            for e in region.reserved..region.extents {
                let pmem = region.at(e * extent).get();
                let bit = words
                    .get((e / 64) as usize)
                    .is_some_and(|w| w & 1 << (e % 64) != 0);
                let key = records::word_at(&keys, (e * 8) as usize).unwrap_or_default();
                let key_at = region.at(region.key_offset(e));
                let (want_key, want_bit) = match held.get(&pmem) {
                    Some(&expected) => (expected, true),
                    None => (0, false),
                };
                if key != want_key {
                    let swapped = self.cas(key_at, region.key, key, want_key).await;
                    match swapped {
                        // Changed under this scrub: someone is at work there.
                        Ok(old) if old != key => continue,
                        Ok(_) if want_key == 0 => report.keys_cleared += 1,
                        Ok(_) => report.repaired += 1,
                        Err(crate::PoolError::AccessDenied { .. }) => {
                            // Not this client's extent: its bit stays too.
                            report.left_to_owners += 1;
                            continue;
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                if bit != want_bit {
                    let flipped = self.flip_bit(region, e, want_bit).await;
                    match refused(flipped)? {
                        1 => report.left_to_owners += 1,
                        _ if want_bit => report.repaired += 1,
                        _ => report.extents_reclaimed += 1,
                    }
                }
            }
        }
        Ok(())
    }

    /// Sets or clears bit `e` of `region`'s bitmap.
    async fn flip_bit(&self, region: &RegionMeta, e: u64, set: bool) -> Result<(), AllocError> {
        let at = region.at(region.bitmap_offset() + (e / 64) * 8);
        let mask = 1u64 << (e % 64);
        let mut current = records::word_at(&self.read(at, region.key, 8).await?, 0).unwrap_or(0);
        loop {
            let next = if set { current | mask } else { current & !mask };
            let old = self.cas(at, region.key, current, next).await?;
            if old == current {
                return Ok(());
            }
            current = old;
        }
    }

    /// One live slab: half-claimed objects, its count, retire when empty.
    async fn scrub_slab(
        &self,
        index: u64,
        entry: &PtEntry,
        report: &mut ScrubReport,
    ) -> Result<(), AllocError> {
        let class = entry.info as u32;
        let shape = self.classes.slab(class);
        let bytes = self
            .read(
                PmemAddr(entry.pmem),
                entry.key,
                (shape.live() + shape.words * 8) as u32,
            )
            .await?;
        let word = |at: u64| records::word_at(&bytes, at as usize).unwrap_or_default();
        let header_word = word(0);
        let Some(header) = SlabHeader::decode(header_word) else {
            // Never initialised: the creator died before its commit could
            // matter; free the extent.
            report.slabs_retired += 1;
            return self.free_extents(index, *entry).await;
        };
        let mut live_count = 0u64;
        for w in 0..shape.words {
            let usable = usable_bits(&shape, w);
            let claimed = word(records::SlabShape::CLAIMED + w * 8);
            let live = word(shape.live() + w * 8) & usable;
            live_count += u64::from(live.count_ones());
            let orphans = claimed & usable & !live;
            if orphans != 0 {
                let at = PmemAddr(entry.pmem + records::SlabShape::CLAIMED + w * 8);
                if self.cas(at, entry.key, claimed, claimed & !orphans).await? == claimed {
                    report.slab_objects_reclaimed += u64::from(orphans.count_ones());
                }
            }
        }
        if header.retiring || live_count == 0 {
            let retiring = SlabHeader {
                retiring: true,
                used: 0,
                ..header
            };
            self.cas(
                PmemAddr(entry.pmem),
                entry.key,
                header_word,
                retiring.encode(),
            )
            .await?;
            report.slabs_retired += 1;
            return self.free_extents(index, *entry).await;
        }
        if u64::from(header.used) != live_count {
            let fixed = SlabHeader {
                used: live_count as u32,
                ..header
            };
            if self
                .cas(PmemAddr(entry.pmem), entry.key, header_word, fixed.encode())
                .await?
                == header_word
            {
                report.slab_counts_fixed += 1;
            }
        }
        Ok(())
    }

    /// Name entries whose object is not (or no longer) a live allocation.
    async fn scrub_names(
        &self,
        dir: &[NameEntry],
        table: &[PtEntry],
        live: &HashMap<u64, u64>,
        report: &mut ScrubReport,
    ) -> Result<(), AllocError> {
        for (slot, e) in dir.iter().enumerate() {
            if e.state == NameState::Free {
                continue;
            }
            let head = records::vextent_of(&self.meta, VirtAddr(e.vaddr));
            let backed = e.state == NameState::Live
                && head.is_some_and(|h| {
                    live.get(&h) == Some(&h)
                        && table.get(h as usize).and_then(PtEntry::name_slot) == Some(slot as u64)
                });
            if !backed {
                let free = NameEntry {
                    state: NameState::Free,
                    ..e.clone()
                };
                let at = self.meta.name_entry(slot as u64);
                match self
                    .cas(at, self.meta_key(), e.control(), free.control())
                    .await
                {
                    Ok(old) if old == e.control() => report.names_reclaimed += 1,
                    Ok(_) => {}
                    Err(crate::PoolError::AccessDenied { .. }) => report.left_to_owners += 1,
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    /// Hints naming a slab that is not live (or of another class).
    async fn scrub_hints(
        &self,
        table: &[PtEntry],
        report: &mut ScrubReport,
    ) -> Result<(), AllocError> {
        let slabs: HashSet<(u64, u64)> = self
            .live_slabs(table)
            .into_iter()
            .map(|(i, e)| (i + 1, e.info))
            .collect();
        let ways = u64::from(self.classes.count()) * records::HINT_WAYS;
        let at = PmemAddr(self.meta.superblock().get() + sb::HINTS);
        let bytes = self.read(at, self.meta_key(), (ways * 8) as u32).await?;
        for way in 0..ways {
            let hint = records::word_at(&bytes, (way * 8) as usize).unwrap_or_default();
            let class = way / records::HINT_WAYS;
            if hint != 0 && !slabs.contains(&(hint, class)) {
                let slot = PmemAddr(at.get() + way * 8);
                if self.cas(slot, self.meta_key(), hint, 0).await? == hint {
                    report.hints_cleared += 1;
                }
            }
        }
        Ok(())
    }

    /// Every page-table entry, read now.
    async fn read_page_table(&self) -> Result<Vec<PtEntry>, AllocError> {
        let len = self.meta.page_table_entries() * records::PT_ENTRY_LEN;
        let bytes = self
            .read(self.meta.page_table_entry(0), self.meta_key(), len as u32)
            .await?;
        bytes
            .chunks(records::PT_ENTRY_LEN as usize)
            .enumerate()
            .map(|(i, chunk)| {
                PtEntry::decode(chunk).ok_or_else(|| AllocError::Corrupt {
                    what: format!("page-table entry {i}"),
                })
            })
            .collect()
    }

    fn live_slabs(&self, table: &[PtEntry]) -> Vec<(u64, PtEntry)> {
        table
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                e.control.state == EntryState::Live && e.control.kind == EntryKind::Slab
            })
            .map(|(i, e)| (i as u64, *e))
            .collect()
    }

    async fn slab_word(&self, entry: &PtEntry, offset: u64) -> Result<u64, AllocError> {
        let bytes = self
            .read(PmemAddr(entry.pmem + offset), entry.key, 8)
            .await?;
        Ok(records::word_at(&bytes, 0).unwrap_or_default())
    }
}

/// Whether `e` is a server's refusal to let this client change a record.
fn is_refusal(e: &AllocError) -> bool {
    matches!(e, AllocError::Pool(crate::PoolError::AccessDenied { .. }))
}

/// 1 for a refused repair (counted, scrub goes on), 0 for a done one; any
/// other failure stops the scrub.
fn refused(outcome: Result<(), AllocError>) -> Result<u64, AllocError> {
    match outcome {
        Ok(()) => Ok(0),
        Err(e) if is_refusal(&e) => Ok(1),
        Err(e) => Err(e),
    }
}
