//! Small allocations: objects of one power-of-two class cut from a slab
//! extent, claimed with COMPARE_SWAP. Each client takes objects only from
//! slabs of its own (the slab's key marks it a slab and names its owner,
//! and the server lets only the owner change its header and bitmaps), so
//! only the client that took an object frees it.
//!
//! Taking an object:
//! 1. COMPARE_SWAP the slab header's `used` count up by one while the slab
//!    is ACTIVE and not full: a seat is reserved, so a clear bit exists.
//! 2. COMPARE_SWAP a clear bit of the claimed bitmap to one: the object is
//!    this client's alone. Its bytes are zeroed (one WRITE): a previous
//!    object there may have left its data.
//! 3. FETCH_ADD the same bit into the live bitmap (the bit is ours and
//!    clear, so the add cannot carry): the commit point.
//!
//! A crash after 1 leaves `used` above the live count; after 2, a claimed
//! bit that is not live. Scrub recomputes `used` from the live bitmap and
//! clears claimed-but-not-live bits. Freeing clears the live bit with
//! COMPARE_SWAP (only one freer can win), then the claimed bit, then `used`;
//! the client that brings `used` to zero retires the slab (ACTIVE → RETIRING
//! with COMPARE_SWAP, so no reservation can sneak in) and frees its extent,
//! which rotates its key.

use topology::{AccessKey, PmemAddr, VirtAddr};

use super::records::{self, EntryKind, PtEntry, SlabHeader, SlabShape, sb};
use super::{AllocError, Allocator, Placement};
use crate::error::PoolError;

/// Slabs tried before a small allocation gives up.
const SLAB_TRIES: u32 = 16;

impl Allocator {
    /// Takes an object of `class`.
    pub(super) async fn alloc_small(
        &self,
        class: u32,
        placement: &Placement,
    ) -> Result<VirtAddr, AllocError> {
        for _ in 0..SLAB_TRIES {
            let slab = match self.slab_for(class).await? {
                Some(slab) => slab,
                None => return self.new_slab(class, placement).await,
            };
            let entry = match self.cached_slab(slab) {
                Some(entry) => entry,
                None => {
                    let entry = self.read_entry(slab).await?;
                    if entry.control.state != records::EntryState::Live
                        || entry.control.kind != EntryKind::Slab
                        || entry.info != u64::from(class)
                    {
                        self.drop_hint(class, slab).await?;
                        continue;
                    }
                    if entry.control.owner != self.owner {
                        // Another client's slab (a hint way shared with
                        // it): only its owner takes objects there.
                        self.lock_guesses().current.remove(&class);
                        return self.new_slab(class, placement).await;
                    }
                    self.remember_slab(slab, entry);
                    entry
                }
            };
            match self.take_object(slab, &entry, class).await {
                Ok(Some(vaddr)) => return Ok(vaddr),
                Ok(None) | Err(AllocError::Pool(PoolError::AccessDenied { .. })) => {
                    // Full, retiring, or freed under us (its key rotated).
                    self.forget_slab(slab);
                    self.drop_hint(class, slab).await?;
                }
                Err(e) => return Err(e),
            }
        }
        self.new_slab(class, placement).await
    }

    /// The slab this client should try for `class`: its current one, or the
    /// superblock's hint.
    async fn slab_for(&self, class: u32) -> Result<Option<u64>, AllocError> {
        if let Some(&slab) = self.lock_guesses().current.get(&class) {
            return Ok(Some(slab));
        }
        let hint = self
            .read_word(self.meta.superblock(), self.hint_offset(class))
            .await?;
        let slab = hint.checked_sub(1);
        if let Some(slab) = slab {
            self.lock_guesses().current.insert(class, slab);
        }
        Ok(slab)
    }

    fn hint_offset(&self, class: u32) -> u64 {
        sb::HINTS + (u64::from(class) * records::HINT_WAYS + self.way) * 8
    }

    /// Reserves a seat in `slab` and claims an object; `None` when the slab
    /// is full or retiring.
    async fn take_object(
        &self,
        slab: u64,
        entry: &PtEntry,
        class: u32,
    ) -> Result<Option<VirtAddr>, AllocError> {
        let shape = self.classes.slab(class);
        let base = PmemAddr(entry.pmem);
        let mut guess = self.lock_guesses().headers.get(&slab).copied();
        loop {
            let current = match guess {
                Some(word) => word,
                None => self.read_slab_word(base, entry.key, 0).await?,
            };
            let Some(header) = SlabHeader::decode(current) else {
                return Ok(None);
            };
            if header.retiring || u64::from(header.used) >= shape.slots {
                self.lock_guesses().headers.insert(slab, current);
                return Ok(None);
            }
            let next = SlabHeader {
                used: header.used + 1,
                ..header
            }
            .encode();
            let old = self.cas(base, entry.key, current, next).await?;
            if old == current {
                self.lock_guesses().headers.insert(slab, next);
                break;
            }
            guess = Some(old);
        }
        let slot = self.claim_slot(slab, entry, &shape).await?;
        let object = PmemAddr(entry.pmem + shape.object_at(slot));
        self.write(object, entry.key, &vec![0u8; shape.object as usize])
            .await?;
        let (word, bit) = (slot / 64, slot % 64);
        let live = PmemAddr(entry.pmem + shape.live() + word * 8);
        self.fetch_add(live, entry.key, 1 << bit).await?;
        Ok(Some(VirtAddr(
            records::vbase_of(&self.meta, slab).get() + shape.object_at(slot),
        )))
    }

    /// Claims a clear bit of the claimed bitmap (one exists: a seat is held).
    async fn claim_slot(
        &self,
        slab: u64,
        entry: &PtEntry,
        shape: &SlabShape,
    ) -> Result<u64, AllocError> {
        // A random word to start from, so claimers spread out.
        let start = self.random() % shape.words;
        for step in 0..shape.words * 4 {
            let w = (start + step) % shape.words;
            let offset = SlabShape::CLAIMED + w * 8;
            let at = PmemAddr(entry.pmem + offset);
            let cached = self.lock_guesses().bits.get(&(slab, offset)).copied();
            let mut current = match cached {
                Some(word) => word,
                None => {
                    self.read_slab_word(PmemAddr(entry.pmem), entry.key, offset)
                        .await?
                }
            };
            let usable = usable_bits(shape, w);
            // A cached guess that looks full may be stale (another client
            // freed an object since): look at the word itself before passing it.
            if cached.is_some() && !current & usable == 0 {
                current = self
                    .read_slab_word(PmemAddr(entry.pmem), entry.key, offset)
                    .await?;
            }
            while !current & usable != 0 {
                let bit = (!current & usable).trailing_zeros() as u64;
                let old = self.cas(at, entry.key, current, current | 1 << bit).await?;
                if old == current {
                    self.lock_guesses()
                        .bits
                        .insert((slab, offset), current | 1 << bit);
                    return Ok(w * 64 + bit);
                }
                current = old;
            }
            self.lock_guesses().bits.insert((slab, offset), current);
        }
        Err(AllocError::Corrupt {
            what: format!("slab at page-table entry {slab}: seat held but no clear bit"),
        })
    }

    /// Creates a slab of `class` holding one object for this client, and
    /// makes it this client's current slab and its hint.
    async fn new_slab(&self, class: u32, placement: &Placement) -> Result<VirtAddr, AllocError> {
        let shape = self.classes.slab(class);
        let extent = self.meta.extent_size();
        let slab = self
            .alloc_extents_then(
                u64::from(class),
                placement,
                EntryKind::Slab,
                None,
                |_, claimed| async move {
                    let Some(c) = claimed.first() else {
                        return Ok(());
                    };
                    let meta = self.region(c.region)?;
                    let mut init = vec![0u8; (shape.live() + shape.words * 8) as usize];
                    let header = SlabHeader {
                        retiring: false,
                        class,
                        used: 1,
                    };
                    init[..8].copy_from_slice(&header.encode().to_le_bytes());
                    for w in 0..shape.words {
                        let claimed = !usable_bits(&shape, w) | u64::from(w == 0);
                        let at = (SlabShape::CLAIMED + w * 8) as usize;
                        init[at..at + 8].copy_from_slice(&claimed.to_le_bytes());
                    }
                    let live = shape.live() as usize;
                    init[live..live + 8].copy_from_slice(&1u64.to_le_bytes());
                    self.write(meta.at(c.extent * extent), c.key, &init).await?;
                    Ok(())
                },
            )
            .await?;
        let entry = self.read_entry(slab).await?;
        self.remember_slab(slab, entry);
        {
            let mut guesses = self.lock_guesses();
            guesses.current.insert(class, slab);
            guesses.headers.insert(
                slab,
                SlabHeader {
                    retiring: false,
                    class,
                    used: 1,
                }
                .encode(),
            );
        }
        let hint = PmemAddr(self.meta.superblock().get() + self.hint_offset(class));
        let old = self
            .read_word(self.meta.superblock(), self.hint_offset(class))
            .await?;
        self.cas(hint, self.meta_key(), old, slab + 1).await?;
        Ok(VirtAddr(
            records::vbase_of(&self.meta, slab).get() + shape.object_at(0),
        ))
    }

    /// Frees the object at `vaddr` in the slab at page-table entry `slab`.
    pub(super) async fn free_small(
        &self,
        vaddr: VirtAddr,
        slab: u64,
        entry: &PtEntry,
    ) -> Result<(), AllocError> {
        let class = entry.info as u32;
        let shape = self.classes.slab(class);
        let offset = vaddr.get() - records::vbase_of(&self.meta, slab).get();
        let slot = shape.slot_at(offset).ok_or(AllocError::InvalidFree {
            vaddr,
            reason: "not the start of a small object",
        })?;
        let (w, bit) = (slot / 64, slot % 64);
        let live_off = shape.live() + w * 8;
        let live = PmemAddr(entry.pmem + live_off);
        // A cached word is only a guess; only the server's answer can say
        // the bit is clear (a double free).
        let mut current = self
            .lock_guesses()
            .bits
            .get(&(slab, live_off))
            .copied()
            .unwrap_or(0)
            | 1 << bit;
        loop {
            let old = self
                .cas(live, entry.key, current, current & !(1 << bit))
                .await?;
            if old == current {
                self.lock_guesses()
                    .bits
                    .insert((slab, live_off), current & !(1 << bit));
                break;
            }
            if old & 1 << bit == 0 {
                return Err(AllocError::DoubleFree { vaddr });
            }
            current = old;
        }
        // The claimed bit is ours and set: subtracting clears exactly it.
        let claimed_off = SlabShape::CLAIMED + w * 8;
        let claimed = PmemAddr(entry.pmem + claimed_off);
        self.fetch_add(claimed, entry.key, (1u64 << bit).wrapping_neg())
            .await?;
        self.lock_guesses().bits.remove(&(slab, claimed_off));
        let base = PmemAddr(entry.pmem);
        let before = self
            .fetch_add(base, entry.key, (1u64 << 32).wrapping_neg())
            .await?;
        let after = before.wrapping_sub(1 << 32);
        self.lock_guesses().headers.insert(slab, after);
        // The slab this client takes objects of its class from stays even
        // when empty, so taking and freeing one object does not create and
        // retire a slab (and zero its extent) each time; see `trim`.
        let current = self.lock_guesses().current.get(&class) == Some(&slab);
        if let Some(header) = SlabHeader::decode(after)
            && header.used == 0
            && !header.retiring
            && !current
        {
            self.retire(slab, entry, after).await?;
        }
        Ok(())
    }

    /// Returns this client's empty slabs to the pool: the one per size
    /// class it keeps even when empty. For a client about to end; the same
    /// client's scrub retires them too.
    pub async fn trim(&self) -> Result<(), AllocError> {
        let current: Vec<(u32, u64)> = self.lock_guesses().current.drain().collect();
        for (_, slab) in current {
            let Some(entry) = self.cached_slab(slab) else {
                continue;
            };
            let word = match self
                .read_slab_word(PmemAddr(entry.pmem), entry.key, 0)
                .await
            {
                Ok(word) => word,
                // Freed meanwhile (its key rotated): nothing to return.
                Err(AllocError::Pool(PoolError::AccessDenied { .. })) => {
                    self.forget_slab(slab);
                    continue;
                }
                Err(e) => return Err(e),
            };
            if let Some(header) = SlabHeader::decode(word)
                && header.used == 0
                && !header.retiring
            {
                self.retire(slab, &entry, word).await?;
            }
        }
        Ok(())
    }

    /// Retires an empty slab: RETIRING (no seat can be taken any more), its
    /// hints dropped, its extent freed.
    async fn retire(&self, slab: u64, entry: &PtEntry, empty: u64) -> Result<(), AllocError> {
        let Some(header) = SlabHeader::decode(empty) else {
            return Ok(());
        };
        let retiring = SlabHeader {
            retiring: true,
            ..header
        }
        .encode();
        if self
            .cas(PmemAddr(entry.pmem), entry.key, empty, retiring)
            .await?
            != empty
        {
            // Someone took a seat meanwhile: the slab lives on.
            return Ok(());
        }
        self.forget_slab(slab);
        self.drop_hint(header.class, slab).await?;
        self.free_extents(slab, *entry).await
    }

    /// Clears every hint of `class` that names `slab`, and this client's
    /// current slab if it is `slab`.
    async fn drop_hint(&self, class: u32, slab: u64) -> Result<(), AllocError> {
        {
            let mut guesses = self.lock_guesses();
            if guesses.current.get(&class) == Some(&slab) {
                guesses.current.remove(&class);
            }
        }
        let row = sb::HINTS + u64::from(class) * records::HINT_WAYS * 8;
        let at = PmemAddr(self.meta.superblock().get() + row);
        let bytes = self
            .read(at, self.meta_key(), (records::HINT_WAYS * 8) as u32)
            .await?;
        for way in 0..records::HINT_WAYS {
            if records::word_at(&bytes, (way * 8) as usize) == Some(slab + 1) {
                let hint = PmemAddr(at.get() + way * 8);
                self.cas(hint, self.meta_key(), slab + 1, 0).await?;
            }
        }
        Ok(())
    }

    async fn read_slab_word(
        &self,
        base: PmemAddr,
        key: AccessKey,
        offset: u64,
    ) -> Result<u64, AllocError> {
        let bytes = self.read(PmemAddr(base.get() + offset), key, 8).await?;
        Ok(records::word_at(&bytes, 0).unwrap_or_default())
    }

    /// The cached page-table entry of a slab.
    pub(super) fn cached_slab(&self, slab: u64) -> Option<PtEntry> {
        self.lock_guesses().slabs.get(&slab).copied()
    }

    pub(super) fn remember_slab(&self, slab: u64, entry: PtEntry) {
        self.lock_guesses().slabs.insert(slab, entry);
    }

    /// Drops everything cached about a slab.
    pub(super) fn forget_slab(&self, slab: u64) {
        let mut guesses = self.lock_guesses();
        guesses.slabs.remove(&slab);
        guesses.headers.remove(&slab);
        guesses.bits.retain(|(s, _), _| *s != slab);
        guesses.current.retain(|_, s| *s != slab);
    }
}

/// The bits of bitmap word `w` that stand for objects (the rest, past the
/// last object, are kept set in the claimed bitmap).
pub(super) fn usable_bits(shape: &SlabShape, w: u64) -> u64 {
    let first = w * 64;
    match shape.slots.saturating_sub(first) {
        0 => 0,
        n if n >= 64 => u64::MAX,
        n => (1u64 << n) - 1,
    }
}
