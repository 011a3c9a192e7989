//! Memory a tenant gets is its own: this server checks every change to the
//! allocator records it holds (see [`topology::records`]) against the
//! record's owner, and zeroes an extent's bytes when a key is installed on
//! it, so a client speaking the protocol directly can skip neither.
//!
//! The rules, per record word (`who` is the client a request is for: the
//! client itself on a direct authenticated connection, the ON_BEHALF number
//! a proven device stamps):
//! - **page-table and name-directory control words**: a FREE word may
//!   become a word owned by `who` (a claim for itself) or stay FREE; a word
//!   owned by someone changes only by its owner, to FREE or to another
//!   word it still owns.
//! - **their other words** change only while the control word is FREE or
//!   owned by `who`.
//! - **extent keys**: 0 may become a key naming `who` as owner
//!   ([`topology::records::owned_key`]), and then the extent is zeroed
//!   before the key goes in; an installed key changes only by its owner.
//! - **free-extent bitmaps**: anyone may set a bit (claim an extent); a bit
//!   is cleared only once its extent's key is 0 (released), never for the
//!   reserved extents and the padding past the last extent.
//! - **slab headers**: in an extent whose key marks a slab
//!   ([`topology::records::slab_key`]), the header word and both bitmaps
//!   change only by the key's owner, so only the owner takes or frees the
//!   slab's small objects (each client keeps slabs of its own). The objects
//!   themselves are data, written by whoever holds the key.
//!
//! Without authentication the server does not know who asks: every change
//! is let through (extents are still zeroed). Operators never reach this
//! point (the gate refuses their data requests). Changes that touch a
//! record are serialised by one lock per server, so a check and the change
//! it admits see the same words.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use proto::request::{self, Operation};
use topology::records::{self, Classes, Control, EntryState, NameControl, NameState, RecordWord};
use topology::{Layout, MetaLayout, RegionMeta};

use crate::gate::Session;
use crate::metrics::ServerMetrics;
use crate::region_file::HEADER_LEN;
use crate::served_region::ServedRegion;

/// Whom a request is for, as far as this server can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asker {
    /// No authentication: anyone.
    Unknown,
    /// The client with this topology number.
    Client(u32),
}

impl Asker {
    /// The asker of a request with `on_behalf` from `session`'s peer.
    pub fn of(session: &Session, on_behalf: Option<u32>) -> Self {
        match (session, on_behalf) {
            (Session::ProvenClient { number }, _) => Self::Client(*number),
            (Session::ProvenDevice { .. }, Some(number)) => Self::Client(number),
            _ => Self::Unknown,
        }
    }

    /// Whether this asker may change what `owner` owns.
    fn owns(self, owner: u16) -> bool {
        match self {
            Self::Unknown => true,
            Self::Client(number) => number == u32::from(owner),
        }
    }
}

/// Why a change to a record is refused (the label of
/// `pmem_server_denied_requests_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The record belongs to another client.
    NotOwner,
    /// The new word is not a record (an unknown state).
    BadRecord,
    /// A bitmap bit of an extent that still has a key, or of a reserved
    /// extent, would be cleared.
    ExtentInUse,
}

impl Refusal {
    /// The metric label.
    pub fn reason(self) -> &'static str {
        match self {
            Self::NotOwner => "not_owner",
            Self::BadRecord => "bad_record",
            Self::ExtentInUse => "extent_in_use",
        }
    }
}

/// The owner checks and zeroing of one server's allocator records.
#[derive(Debug)]
pub struct Tenancy {
    meta: Option<MetaLayout>,
    extent: u64,
    classes: Classes,
    /// Held while a change that touches a record is checked and applied.
    serial: Mutex<()>,
    metrics: Arc<ServerMetrics>,
}

/// One record word a request would change.
#[derive(Debug, Clone, Copy)]
struct Change {
    word: RecordWord,
    /// Region offset of the word.
    offset: u64,
    old: u64,
    new: u64,
}

impl Tenancy {
    /// The checks for `layout`'s allocator records (none without an allocator).
    pub fn new(layout: &Layout, metrics: Arc<ServerMetrics>) -> Self {
        Self {
            meta: layout.meta().cloned(),
            extent: layout.extent_size().max(1),
            classes: Classes::new(layout.extent_size().max(1)),
            serial: Mutex::new(()),
            metrics,
        }
    }

    /// Admits `req` (already checked for bounds and key) at `offset` of
    /// `region` for `who`, or refuses it with ACCESS_DENIED. A request that
    /// changes a record is admitted with a guard to hold until it has run;
    /// an extent whose key it installs is zeroed first.
    pub fn admit(
        &self,
        who: Asker,
        region: &ServedRegion,
        offset: u64,
        req: &request::Repr<'_>,
    ) -> Result<Option<MutexGuard<'_, ()>>, proto::Status> {
        let Some(meta) = &self.meta else {
            return Ok(None);
        };
        if !req.operation.changes_memory() {
            return Ok(None);
        }
        let len = u64::from(req.span_len());
        let index = region.entry.region;
        let Some(region_meta) = meta.region(index) else {
            return Ok(None);
        };
        let words = Words { region };
        let slabs = self.slab_extents(region_meta, &words, offset, len);
        if slabs.is_empty() && !records::touches_records(meta, index, offset, len) {
            return Ok(None);
        }
        let held = self.serial.lock().unwrap_or_else(PoisonError::into_inner);
        // Under the lock: the keys read before it may have changed.
        for extent in self.slab_extents(region_meta, &words, offset, len) {
            let slab = Slab {
                start: extent * self.extent,
                key: words.at(region_meta.key_offset(extent)),
                header: words.at(extent * self.extent),
            };
            if let Err(refusal) = slab_header(who, &self.classes, &slab, offset, len) {
                self.metrics.denied.with(&[refusal.reason()]).inc();
                return Err(proto::Status::AccessDenied);
            }
        }
        let changes = changes(meta, &words, req, offset);
        let mut zero = Vec::new();
        for change in &changes {
            match check(who, meta, region_meta, &words, &changes, change) {
                Ok(true) => zero.push(change.word),
                Ok(false) => {}
                Err(refusal) => {
                    self.metrics.denied.with(&[refusal.reason()]).inc();
                    return Err(proto::Status::AccessDenied);
                }
            }
        }
        for word in zero {
            if let RecordWord::ExtentKey(extent) = word {
                self.zero_extent(region, extent)?;
            }
        }
        Ok(Some(held))
    }

    /// The slab extents (by their keys now) among the non-reserved extents
    /// `[offset, offset + len)` touches.
    fn slab_extents(
        &self,
        region: &RegionMeta,
        words: &Words<'_>,
        offset: u64,
        len: u64,
    ) -> Vec<u64> {
        let first = (offset / self.extent).max(region.reserved);
        let last = ((offset + len.max(1) - 1) / self.extent).min(region.extents.saturating_sub(1));
        (first..=last)
            .filter(|&extent| records::key_is_slab(words.at(region.key_offset(extent))))
            .collect()
    }

    /// Writes zeros over extent `extent` of `region`, durably.
    fn zero_extent(&self, region: &ServedRegion, extent: u64) -> Result<(), proto::Status> {
        const CHUNK: usize = 64 << 10;
        static ZEROS: [u8; CHUNK] = [0; CHUNK];
        let start = extent
            .checked_mul(self.extent)
            .and_then(|at| at.checked_add(HEADER_LEN))
            .ok_or(proto::Status::OutOfBounds)?;
        let end = start + self.extent;
        if end > HEADER_LEN + region.file.data_len() {
            return Err(proto::Status::OutOfBounds);
        }
        let map = &region.file.map;
        let mut at = start;
        while at < end {
            let n = CHUNK.min((end - at) as usize);
            map.write(at as usize, &ZEROS[..n], topology::CachePolicy::NonTemporal)
                .map_err(|_| proto::Status::IoError)?;
            at += n as u64;
        }
        map.persist(start as usize, self.extent as usize)
            .map_err(|_| proto::Status::IoError)?;
        self.metrics.extents_zeroed.inc();
        Ok(())
    }
}

/// The current words of one served region.
struct Words<'a> {
    region: &'a ServedRegion,
}

impl Words<'_> {
    /// The word at region offset `offset` now (0 if it cannot be read,
    /// which bounds checks already exclude).
    fn at(&self, offset: u64) -> u64 {
        usize::try_from(HEADER_LEN + offset)
            .ok()
            .and_then(|at| self.region.file.map.atomic_u64(at).ok())
            .map_or(0, |word| word.load(Ordering::Acquire))
    }
}

/// The record words `req` would change, with their old and new values.
fn changes(
    meta: &MetaLayout,
    words: &Words<'_>,
    req: &request::Repr<'_>,
    offset: u64,
) -> Vec<Change> {
    let index = words.region.entry.region;
    let mut out = Vec::new();
    match req.operation {
        Operation::CompareSwap | Operation::FetchAdd | Operation::AtomicWrite => {
            let word =
                records::record_word(meta, index, offset).filter(|_| offset.is_multiple_of(8));
            if let Some(word) = word {
                let old = words.at(offset);
                let new = match req.operation {
                    Operation::CompareSwap if old == req.compare => req.operand,
                    Operation::CompareSwap => old,
                    Operation::FetchAdd => old.wrapping_add(req.operand),
                    _ => req.operand,
                };
                out.push(Change {
                    word,
                    offset,
                    old,
                    new,
                });
            }
        }
        _ => {
            let end = offset + req.payload.len() as u64;
            let mut at = offset - offset % 8;
            while at < end {
                if let Some(word) = records::record_word(meta, index, at) {
                    let old = words.at(at);
                    let mut bytes = old.to_le_bytes();
                    for (i, byte) in bytes.iter_mut().enumerate() {
                        let pos = at + i as u64;
                        if pos >= offset && pos < end {
                            *byte = req.payload[(pos - offset) as usize];
                        }
                    }
                    out.push(Change {
                        word,
                        offset: at,
                        old,
                        new: u64::from_le_bytes(bytes),
                    });
                }
                at += 8;
            }
        }
    }
    out
}

/// Whether `who` may make `change`; `Ok(true)` when it installs a key on an
/// extent, which must then be zeroed. `all` are the request's other changes
/// (a bitmap bit may be cleared by the write that also clears its key).
fn check(
    who: Asker,
    meta: &MetaLayout,
    region: &RegionMeta,
    words: &Words<'_>,
    all: &[Change],
    change: &Change,
) -> Result<bool, Refusal> {
    if change.old == change.new {
        return Ok(false);
    }
    match change.word {
        RecordWord::EntryControl(_) => entry_control(who, change.old, change.new).map(|()| false),
        RecordWord::NameControl(_) => name_control(who, change.old, change.new).map(|()| false),
        RecordWord::EntryBody(entry) => {
            let control = words.at(meta.page_table_entry(entry).get() - region.start.get());
            let holder = Control::decode(control).map(Holder::of_entry);
            holder
                .is_none_or(|h| h.admits(who))
                .then_some(false)
                .ok_or(Refusal::NotOwner)
        }
        RecordWord::NameBody(slot) => {
            let control = words.at(meta.name_entry(slot).get() - region.start.get());
            let holder = NameControl::decode(control).map(Holder::of_name);
            holder
                .is_none_or(|h| h.admits(who))
                .then_some(false)
                .ok_or(Refusal::NotOwner)
        }
        RecordWord::ExtentKey(extent) => {
            extent_key(who, extent < region.reserved, change.old, change.new)
        }
        RecordWord::Bitmap(word) => {
            let key_after = |extent: u64| {
                let offset = region.key_offset(extent);
                all.iter()
                    .find(|c| c.offset == offset)
                    .map_or_else(|| words.at(offset), |c| c.new)
            };
            bitmap(region, word, change.old, change.new, key_after).map(|()| false)
        }
    }
}

/// A slab extent as its server holds it.
#[derive(Debug, Clone, Copy)]
struct Slab {
    /// Region offset of the extent.
    start: u64,
    /// Its key word (marked a slab).
    key: u64,
    /// Its header word.
    header: u64,
}

/// Whether `who` may change `[offset, offset + len)` where it overlaps the
/// header and bitmaps of `slab`: only the slab's owner may.
fn slab_header(
    who: Asker,
    classes: &Classes,
    slab: &Slab,
    offset: u64,
    len: u64,
) -> Result<(), Refusal> {
    let header = records::slab_header_len(classes, slab.header);
    let overlaps = offset < slab.start + header && offset + len > slab.start;
    match records::key_owner(slab.key) {
        Some(owner) if overlaps && !who.owns(owner) => Err(Refusal::NotOwner),
        _ => Ok(()),
    }
}

/// A control word as the owner rule sees it: FREE (nobody's), or owned.
#[derive(Debug, Clone, Copy)]
struct Holder {
    free: bool,
    owner: u16,
}

impl Holder {
    fn of_entry(c: Control) -> Self {
        Self {
            free: c.state == EntryState::Free,
            owner: c.owner,
        }
    }

    fn of_name(c: NameControl) -> Self {
        Self {
            free: c.state == NameState::Free,
            owner: c.owner,
        }
    }

    /// Whether `who` may have a record in this state, or change it.
    fn admits(self, who: Asker) -> bool {
        self.free || who.owns(self.owner)
    }
}

/// A control word from `old` to `new` (`None`: not a record); an old word
/// that is not a record (damage) may be repaired by anyone.
fn control_change(who: Asker, old: Option<Holder>, new: Option<Holder>) -> Result<(), Refusal> {
    let new = new.ok_or(Refusal::BadRecord)?;
    let allowed = old.is_none_or(|h| h.admits(who)) && new.admits(who);
    allowed.then_some(()).ok_or(Refusal::NotOwner)
}

/// A page-table control word from `old` to `new`.
fn entry_control(who: Asker, old: u64, new: u64) -> Result<(), Refusal> {
    let holder = |word| Control::decode(word).map(Holder::of_entry);
    control_change(who, holder(old), holder(new))
}

/// A name-directory control word from `old` to `new`.
fn name_control(who: Asker, old: u64, new: u64) -> Result<(), Refusal> {
    let holder = |word| NameControl::decode(word).map(Holder::of_name);
    control_change(who, holder(old), holder(new))
}

/// An extent key word from `old` to `new`; `Ok(true)` when a key is
/// installed on an unkeyed extent (zero it first).
fn extent_key(who: Asker, reserved: bool, old: u64, new: u64) -> Result<bool, Refusal> {
    if reserved {
        // The server never reads these; only 0 keeps them meaningless.
        return if new == 0 {
            Ok(false)
        } else {
            Err(Refusal::ExtentInUse)
        };
    }
    let owner_ok = |word: u64| match (records::key_owner(word), who) {
        (_, Asker::Unknown) => true,
        (Some(owner), who) => who.owns(owner),
        (None, _) => false,
    };
    if old != 0 && !owner_ok(old) {
        return Err(Refusal::NotOwner);
    }
    if new != 0 && !owner_ok(new) {
        return Err(Refusal::NotOwner);
    }
    Ok(old == 0)
}

/// Bitmap word `word` of `region` from `old` to `new`, where `key_after`
/// is each extent's key once the request has run.
fn bitmap(
    region: &RegionMeta,
    word: u64,
    old: u64,
    new: u64,
    key_after: impl Fn(u64) -> u64,
) -> Result<(), Refusal> {
    let cleared = old & !new;
    for bit in 0..64 {
        if cleared & 1 << bit == 0 {
            continue;
        }
        let extent = word * 64 + bit;
        if extent < region.reserved || extent >= region.extents || key_after(extent) != 0 {
            return Err(Refusal::ExtentInUse);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
