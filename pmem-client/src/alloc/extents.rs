//! Whole extents: virtual runs in the page table, PMEM extents in the
//! regions' free-extent bitmaps, keys in the regions' extent key tables.

use topology::{AccessKey, PmemAddr, RegionIndex, RegionMeta};

use super::records::{self, Control, EntryKind, EntryState, PtEntry, sb};
use super::{AllocError, Allocator, Placement};
use crate::translate::Translation;

/// Tries of the page-table cursor before giving up on finding a free run.
const CURSOR_TRIES: u32 = 64;

/// One PMEM extent claimed for an allocation.
#[derive(Debug, Clone, Copy)]
pub(super) struct Claimed {
    pub(super) region: RegionIndex,
    pub(super) extent: u64,
    pub(super) key: AccessKey,
}

impl Allocator {
    /// Allocates `ceil(size / extent)` whole extents and commits them under
    /// a run of page-table entries; returns the head's index. `kind` is
    /// [`EntryKind::Head`] or [`EntryKind::Slab`] (one extent, `size` then
    /// is its class, and the caller has initialised it via `init`).
    pub(super) async fn alloc_extents(
        &self,
        size: u64,
        placement: &Placement,
        kind: EntryKind,
        name_slot: Option<u64>,
    ) -> Result<u64, AllocError> {
        self.alloc_extents_then(size, placement, kind, name_slot, |_, _| async { Ok(()) })
            .await
    }

    /// [`Self::alloc_extents`], running `init` on the claimed extents
    /// before the commit (a slab writes its header there).
    pub(super) async fn alloc_extents_then<F, Fut>(
        &self,
        size: u64,
        placement: &Placement,
        kind: EntryKind,
        name_slot: Option<u64>,
        init: F,
    ) -> Result<u64, AllocError>
    where
        F: FnOnce(u64, Vec<Claimed>) -> Fut,
        Fut: std::future::Future<Output = Result<(), AllocError>>,
    {
        self.follow_layout(false).await?;
        let extent = self.meta.extent_size();
        let n = if kind == EntryKind::Slab {
            1
        } else {
            size.div_ceil(extent)
        };
        let (head, controls) = self.reserve_run(n, kind).await?;
        let mut claimed = Vec::with_capacity(n as usize);
        let turn = self
            .round_robin
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        for j in 0..n {
            match self.claim_extent(placement, turn + j, kind).await {
                Ok(Some(c)) => claimed.push(c),
                outcome => {
                    self.abandon(head, &controls, &claimed).await;
                    outcome?;
                    return Err(AllocError::OutOfMemory {
                        size,
                        placement: placement.to_string(),
                    });
                }
            }
        }
        let info = match kind {
            EntryKind::Slab => size,
            _ => PtEntry::head_info(size, name_slot),
        };
        let entries: Vec<PtEntry> = controls
            .iter()
            .zip(&claimed)
            .enumerate()
            .map(|(j, (control, c))| PtEntry {
                control: if j == 0 {
                    *control
                } else {
                    control.with_state(EntryState::Live)
                },
                pmem: self.extent_addr(c).map_or(0, PmemAddr::get),
                key: c.key,
                info: if j == 0 {
                    info
                } else {
                    PtEntry::tail_info(head, controls[0].generation)
                },
            })
            .collect();
        let bytes: Vec<u8> = entries.iter().flat_map(PtEntry::encode).collect();
        let written = async {
            init(head, claimed.clone()).await?;
            self.write(self.meta.page_table_entry(head), self.meta_key(), &bytes)
                .await?;
            self.set_control(head, controls[0], controls[0].with_state(EntryState::Live))
                .await
        };
        if let Err(e) = written.await {
            self.abandon(head, &controls, &claimed).await;
            return Err(e);
        }
        for (j, e) in entries.iter().enumerate() {
            self.install(head + j as u64, e);
        }
        Ok(head)
    }

    /// Frees the large allocation whose LIVE head is `entry` at `head`.
    pub(super) async fn free_extents(&self, head: u64, entry: PtEntry) -> Result<(), AllocError> {
        let freeing = entry.control.with_state(EntryState::Freeing);
        let vaddr = records::vbase_of(&self.meta, head);
        if let Err(AllocError::Corrupt { .. }) =
            self.set_control(head, entry.control, freeing).await
        {
            return Err(AllocError::DoubleFree { vaddr });
        }
        let n = match entry.control.kind {
            EntryKind::Slab => 1,
            _ => entry.size().div_ceil(self.meta.extent_size()).max(1),
        };
        let mut entries = vec![entry];
        if n > 1 {
            let at = self.meta.page_table_entry(head + 1);
            let len = ((n - 1) * records::PT_ENTRY_LEN) as u32;
            let bytes = self.read(at, self.meta_key(), len).await?;
            entries.extend(bytes.chunks(32).filter_map(PtEntry::decode));
        }
        for (j, e) in entries.iter().enumerate() {
            self.pool
                .invalidate_translation(records::vbase_of(&self.meta, head + j as u64));
            if let Some((region, extent)) = self.extent_of(e.pmem) {
                self.release_extent(region, extent, e.key).await?;
            }
        }
        if n > 1 {
            let cleared: Vec<u8> = entries[1..]
                .iter()
                .flat_map(|e| free_entry(e.control).encode())
                .collect();
            self.write(
                self.meta.page_table_entry(head + 1),
                self.meta_key(),
                &cleared,
            )
            .await?;
        }
        self.set_control(head, freeing, freeing.with_state(EntryState::Free))
            .await
    }

    /// Claims `n` consecutive FREE page-table entries as RESERVED; returns
    /// the first index and the claimed control words.
    async fn reserve_run(
        &self,
        n: u64,
        kind: EntryKind,
    ) -> Result<(u64, Vec<Control>), AllocError> {
        let total = self.meta.page_table_entries();
        let cursor = self.meta.superblock();
        for _ in 0..CURSOR_TRIES {
            let at = self
                .fetch_add(PmemAddr(cursor.get() + sb::CURSOR), self.meta_key(), n)
                .await?;
            let start = at % total;
            if start + n > total {
                continue;
            }
            let len = (n * records::PT_ENTRY_LEN) as u32;
            let bytes = self
                .read(self.meta.page_table_entry(start), self.meta_key(), len)
                .await?;
            let mut claimed = Vec::with_capacity(n as usize);
            for (j, chunk) in bytes.chunks(32).enumerate() {
                let Some(found) = PtEntry::decode(chunk).map(|e| e.control) else {
                    break;
                };
                if found.state != EntryState::Free {
                    break;
                }
                let mine = Control {
                    state: EntryState::Reserved,
                    kind: if j == 0 { kind } else { EntryKind::Tail },
                    owner: self.owner,
                    generation: found.generation.wrapping_add(1).max(1),
                };
                if self
                    .set_control(start + j as u64, found, mine)
                    .await
                    .is_err()
                {
                    break;
                }
                claimed.push(mine);
            }
            if claimed.len() as u64 == n {
                return Ok((start, claimed));
            }
            for (j, c) in claimed.iter().enumerate() {
                let _ = self
                    .set_control(start + j as u64, *c, free_entry(*c).control)
                    .await;
            }
        }
        Err(AllocError::PageTableFull {
            extents: n,
            entries: total,
        })
    }

    /// Undoes a reservation that did not complete: extents released, entries
    /// FREE. Best effort: what fails here is left for scrub.
    async fn abandon(&self, head: u64, controls: &[Control], claimed: &[Claimed]) {
        for c in claimed {
            let _ = self.release_extent(c.region, c.extent, c.key).await;
        }
        let cleared: Vec<u8> = controls
            .iter()
            .flat_map(|c| free_entry(c.with_state(EntryState::Reserved)).encode())
            .collect();
        let _ = self
            .write(self.meta.page_table_entry(head), self.meta_key(), &cleared)
            .await;
    }

    /// COMPARE_SWAP of entry `index`'s control word; anything but `from`
    /// there is reported as corrupt (a lost race the caller handles).
    pub(super) async fn set_control(
        &self,
        index: u64,
        from: Control,
        to: Control,
    ) -> Result<(), AllocError> {
        let at = self.meta.page_table_entry(index);
        let old = self
            .cas(at, self.meta_key(), from.encode(), to.encode())
            .await?;
        if old == from.encode() {
            Ok(())
        } else {
            Err(AllocError::Corrupt {
                what: format!("page-table entry {index} changed under this client"),
            })
        }
    }

    /// Claims a free PMEM extent on round-robin turn `turn` for an entry of
    /// `kind` (see [`Self::claim_extent_in_candidates`]); when the candidates
    /// are full, takes up the current layout (regions another client was
    /// formatting, or the layout changed meanwhile) and tries once more.
    async fn claim_extent(
        &self,
        placement: &Placement,
        turn: u64,
        kind: EntryKind,
    ) -> Result<Option<Claimed>, AllocError> {
        if let Some(claimed) = self
            .claim_extent_in_candidates(placement, turn, kind)
            .await?
        {
            return Ok(Some(claimed));
        }
        let growth = self.follow_layout(true).await?;
        if growth.formatted.is_empty() && growth.joined.is_empty() {
            return Ok(None);
        }
        self.claim_extent_in_candidates(placement, turn, kind).await
    }

    /// Claims a free PMEM extent of the candidates. Its key goes in with
    /// COMPARE_SWAP from 0: the server holding it zeroes the extent's bytes
    /// as the key is installed (a previous owner's data never reaches the
    /// new one). A slab's key says so, and the server then lets only this
    /// client change the slab's header.
    async fn claim_extent_in_candidates(
        &self,
        placement: &Placement,
        turn: u64,
        kind: EntryKind,
    ) -> Result<Option<Claimed>, AllocError> {
        for region in self.candidates(placement, turn)? {
            if let Some(extent) = self.claim_in(region).await? {
                let key = self.fresh_key(kind == EntryKind::Slab);
                let meta = self.region(region)?;
                let at = meta.at(meta.key_offset(extent));
                let old = self.cas(at, meta.key, 0, key.get()).await?;
                if old != 0 && old != key.get() {
                    return Err(AllocError::Corrupt {
                        what: format!(
                            "extent {extent} of region {}: key installed on a free extent (run `pmemctl scrub`)",
                            region.0
                        ),
                    });
                }
                return Ok(Some(Claimed {
                    region,
                    extent,
                    key,
                }));
            }
        }
        Ok(None)
    }

    /// Regions to try on round-robin turn `turn`, best first: the turn's
    /// server, then the next ones; within a server its regions in turn.
    /// Only regions of the current layout whose header is formatted.
    fn candidates(&self, placement: &Placement, turn: u64) -> Result<Vec<RegionIndex>, AllocError> {
        let layout = self.pool.layout();
        let usable: Vec<bool> = {
            let c = self.lock_candidates();
            layout
                .entries()
                .iter()
                .map(|e| c.is_usable(e.start))
                .collect()
        };
        let servers: Vec<u16> = {
            let mut s: Vec<u16> = layout.entries().iter().map(|e| e.server_index).collect();
            s.sort_unstable();
            s.dedup();
            s
        };
        let matches = |e: &&topology::LayoutEntry| match placement {
            Placement::RoundRobin => true,
            Placement::Server(s) => &e.server == s,
            Placement::Socket(s, k) => &e.server == s && &e.socket == k,
        };
        if !layout.entries().iter().any(|e| matches(&e)) {
            return Err(AllocError::BadPlacement(format!(
                "the pool has no region on {placement}"
            )));
        }
        let first = servers
            .get((turn % servers.len().max(1) as u64) as usize)
            .copied();
        let mut out: Vec<(u16, u64, RegionIndex)> = layout
            .entries()
            .iter()
            .filter(matches)
            .filter(|e| usable.get(e.region.0 as usize).copied().unwrap_or(false))
            .map(|e| {
                let distance = (u64::from(e.server_index) + servers.len() as u64
                    - u64::from(first.unwrap_or(0)))
                    % servers.len().max(1) as u64;
                let spread = (u64::from(e.region.0) + turn / servers.len().max(1) as u64)
                    % layout.entries().len() as u64;
                (distance as u16, spread, e.region)
            })
            .collect();
        out.sort_unstable();
        Ok(out.into_iter().map(|(_, _, r)| r).collect())
    }

    /// Claims one clear bit of `region`'s free-extent bitmap.
    async fn claim_in(&self, region: RegionIndex) -> Result<Option<u64>, AllocError> {
        let meta = self.region(region)?;
        let mut fresh = false;
        loop {
            let cached = self.lock_guesses().bitmaps.get(&region).cloned();
            let mut words = match cached {
                Some(words) => words,
                None => {
                    fresh = true;
                    self.read_bitmap(&meta).await?
                }
            };
            for w in 0..words.len() {
                while words[w] != u64::MAX {
                    let bit = (!words[w]).trailing_zeros() as u64;
                    let at = meta.at(meta.bitmap_offset() + w as u64 * 8);
                    let old = self
                        .cas(at, meta.key, words[w], words[w] | 1 << bit)
                        .await?;
                    if old == words[w] {
                        words[w] |= 1 << bit;
                        self.lock_guesses().bitmaps.insert(region, words);
                        return Ok(Some(w as u64 * 64 + bit));
                    }
                    words[w] = old;
                }
            }
            let mut guesses = self.lock_guesses();
            if fresh {
                guesses.bitmaps.insert(region, words);
                return Ok(None);
            }
            guesses.bitmaps.remove(&region);
        }
    }

    pub(super) async fn read_bitmap(&self, meta: &RegionMeta) -> Result<Vec<u64>, AllocError> {
        let bytes = self
            .read(
                meta.at(meta.bitmap_offset()),
                meta.key,
                (meta.bitmap_words() * 8) as u32,
            )
            .await?;
        Ok(bytes
            .chunks(8)
            .map(|c| records::word_at(c, 0).unwrap_or(u64::MAX))
            .collect())
    }

    /// Returns extent `extent` of `region`, whose key was `key`, to its
    /// bitmap: key to 0 first (stale translations are refused from here on),
    /// then the bit cleared. An extent that already holds another key is
    /// someone else's now and is left alone.
    pub(super) async fn release_extent(
        &self,
        region: RegionIndex,
        extent: u64,
        key: AccessKey,
    ) -> Result<(), AllocError> {
        let meta = self.region(region)?;
        let old = self
            .cas(meta.at(meta.key_offset(extent)), meta.key, key.get(), 0)
            .await?;
        if old != key.get() && old != 0 {
            return Ok(());
        }
        let (w, bit) = (extent / 64, extent % 64);
        let at = meta.at(meta.bitmap_offset() + w * 8);
        // The cached word is a guess; the bit is expected set.
        let mut guess = self
            .lock_guesses()
            .bitmaps
            .get(&region)
            .and_then(|words| words.get(w as usize).copied())
            .unwrap_or(0)
            | 1 << bit;
        loop {
            let old = self.cas(at, meta.key, guess, guess & !(1 << bit)).await?;
            if old == guess || old & 1 << bit == 0 {
                // Cleared now, or already clear (an earlier attempt got
                // through before a failover).
                guess = old & !(1 << bit);
                break;
            }
            guess = old;
        }
        if let Some(words) = self.lock_guesses().bitmaps.get_mut(&region)
            && let Some(word) = words.get_mut(w as usize)
        {
            *word = guess;
        }
        Ok(())
    }

    /// The PMEM address of a claimed extent.
    fn extent_addr(&self, c: &Claimed) -> Option<PmemAddr> {
        let meta = self.region(c.region).ok()?;
        Some(meta.at(c.extent * self.meta.extent_size()))
    }

    /// The (region, extent) of a PMEM extent address.
    pub(super) fn extent_of(&self, pmem: u64) -> Option<(RegionIndex, u64)> {
        let layout = self.pool.layout();
        let at = layout.lookup(PmemAddr(pmem))?;
        Some((at.offset.region, at.offset.offset / self.meta.extent_size()))
    }

    /// Caches the translation of a just-committed entry in the pool's TLB.
    fn install(&self, index: u64, e: &PtEntry) {
        if let Some((region, _)) = self.extent_of(e.pmem) {
            self.pool.install_translation(Translation {
                vbase: records::vbase_of(&self.meta, index),
                len: self.meta.extent_size(),
                pmem: PmemAddr(e.pmem),
                key: e.key,
                region,
            });
        }
    }
}

/// The FREE entry that follows `control` (same generation, nothing mapped).
pub(super) fn free_entry(control: Control) -> PtEntry {
    PtEntry {
        control: Control {
            state: EntryState::Free,
            kind: EntryKind::Head,
            owner: 0,
            generation: control.generation,
        },
        pmem: 0,
        key: AccessKey::NONE,
        info: 0,
    }
}
