//! The lock-free allocator over the shared virtual address space: extents
//! and slabs claimed with COMPARE_SWAP, recorded in the page table in PMEM,
//! with a fresh key on every allocation so that a freed one's key is
//! invalid on release.
//!
//! All allocator state lives in PMEM ([`topology::meta`] says where,
//! [`records`] how it is encoded) and every client changes it only with
//! one-sided READ, WRITE_PERSIST, COMPARE_SWAP and FETCH_ADD through the
//! fabric: no daemon takes part and no client waits for another.
//!
//! # Ordering, and why a crash never corrupts a live allocation
//!
//! A large allocation of `n` extents, in this order:
//! 1. FETCH_ADD the superblock cursor by `n`; COMPARE_SWAP each of the `n`
//!    page-table entries there from FREE to RESERVED (owned by this client).
//! 2. Per extent: COMPARE_SWAP a zero bit of a region's free-extent bitmap
//!    to one (the extent is now exclusively this allocation's), then store a
//!    fresh key in the region's extent key table (the server enforces it
//!    from now on; the old key, if any, was already rotated to 0 on free).
//! 3. One WRITE_PERSIST of the `n` entries: PMEM address, key, size; tails
//!    already LIVE, the head still RESERVED.
//! 4. COMPARE_SWAP the head RESERVED → LIVE: the commit point.
//!
//! Every step is durable before the next starts (atomics carry the persist
//! flag, writes are WRITE_PERSIST). A client killed before step 4 leaves
//! RESERVED entries and set bits that no LIVE head references: exactly what
//! `scrub` reclaims. A LIVE head is never touched by anyone but a `free`
//! that first wins its COMPARE_SWAP LIVE → FREEING.
//!
//! Freeing reverses it: head LIVE → FREEING, then per extent key → 0 (every
//! stale translation now gets ACCESS_DENIED) before its bitmap bit is
//! cleared (so a new owner's key can never be overwritten), then the entries
//! → FREE. A crash mid-free leaves FREEING, which scrub completes.
//!
//! Small allocations follow the same claim-then-commit rule inside a slab
//! (see the `slab` module); named objects inside the name directory (see `names`).

mod blocking;
mod error;
mod extents;
mod names;
pub use crate::records;
mod regions;
mod scrub;
mod slab;

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use proto::request::Operation;
use topology::region_header::{RegionState, word};
use topology::{
    AccessKey, MetaLayout, PmemAddr, RegionIndex, RegionMeta, ServerId, SocketId, VirtAddr,
};

pub use blocking::BlockingAllocator;
pub use error::AllocError;
pub use names::NamedObject;
pub use regions::{CLAIM_TIMEOUT_SECS, Growth};
pub use scrub::{RegionUsage, ScrubReport, Usage};

use crate::error::PoolError;
use crate::pool::AsyncPool;
use records::{Classes, EntryKind, EntryState, PtEntry, sb};

/// Where the extents of a large allocation go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Placement {
    /// Round-robin across servers, extent by extent.
    #[default]
    RoundRobin,
    /// Only on this server.
    Server(ServerId),
    /// Only on this socket of this server.
    Socket(ServerId, SocketId),
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::RoundRobin => write!(f, "any server"),
            Self::Server(s) => write!(f, "server {s}"),
            Self::Socket(s, k) => write!(f, "server {s} socket {k}"),
        }
    }
}

/// Client-side caches of PMEM words: guesses for COMPARE_SWAP (a wrong
/// guess costs one more round trip, never correctness).
#[derive(Debug, Default)]
struct Guesses {
    /// Free-extent bitmap words by region.
    bitmaps: HashMap<RegionIndex, Vec<u64>>,
    /// Slab page-table entries by page-table index.
    slabs: HashMap<u64, PtEntry>,
    /// Slab header words by page-table index.
    headers: HashMap<u64, u64>,
    /// Slab bitmap words by (page-table index, byte offset in the slab).
    bits: HashMap<(u64, u64), u64>,
    /// The slab this client takes objects from, per class.
    current: HashMap<u32, u64>,
}

/// The allocator of one client: a handle on a connected [`AsyncPool`]
/// whose topology has `[pool.allocator]`.
#[derive(Debug)]
pub struct Allocator {
    pool: AsyncPool,
    meta: MetaLayout,
    classes: Classes,
    owner: u16,
    /// Which of the per-class slab hints this client prefers.
    way: u64,
    rng: Mutex<u64>,
    round_robin: AtomicU64,
    guesses: Mutex<Guesses>,
    /// The regions allocations may go to, following the pool's layout.
    candidates: Mutex<regions::Candidates>,
    ops: AtomicU64,
}

impl Allocator {
    /// The allocator of `pool`; the pool must be formatted, with the
    /// metadata geometry of `pool`'s topology. Regions the layout has gained
    /// since the format are taken up on the first allocation (or
    /// [`Self::refresh`]).
    pub async fn attach(pool: AsyncPool) -> Result<Self, AllocError> {
        let this = Self::new(pool)?;
        this.check_superblock().await?;
        Ok(this)
    }

    /// Writes empty metadata over the pool: every extent free, no names.
    /// Refuses a formatted pool unless `force`.
    pub async fn format(pool: AsyncPool, force: bool) -> Result<Self, AllocError> {
        let this = Self::new(pool)?;
        if !force && this.read_word(this.meta.superblock(), sb::MAGIC).await? == records::POOL_MAGIC
        {
            return Err(AllocError::AlreadyFormatted {
                pool: this.pool_name(),
            });
        }
        this.write_metadata().await?;
        Ok(this)
    }

    fn new(pool: AsyncPool) -> Result<Self, AllocError> {
        let Some(meta) = pool.layout().meta().cloned() else {
            return Err(AllocError::NoAllocator {
                pool: pool.pool_name().to_owned(),
            });
        };
        let seed = seed();
        Ok(Self {
            classes: Classes::new(meta.extent_size()),
            owner: pool.client_index(),
            way: seed % records::HINT_WAYS,
            rng: Mutex::new(seed),
            round_robin: AtomicU64::new(seed >> 8),
            guesses: Mutex::new(Guesses::default()),
            candidates: Mutex::new(regions::Candidates::default()),
            ops: AtomicU64::new(0),
            meta,
            pool,
        })
    }

    /// The pool underneath.
    pub fn pool(&self) -> &AsyncPool {
        &self.pool
    }

    /// One-sided operations this allocator has issued (for cost figures).
    pub fn ops_issued(&self) -> u64 {
        self.ops.load(Ordering::Relaxed)
    }

    /// Allocates `size` bytes anywhere (round-robin across servers). The
    /// allocation is durable when this returns (a crash after it keeps it;
    /// one before it leaves at most what `scrub` reclaims) and its memory
    /// reads as zeroes.
    pub async fn alloc(&self, size: u64) -> Result<VirtAddr, AllocError> {
        self.alloc_with(size, &Placement::RoundRobin).await
    }

    /// Allocates `size` bytes placed as `placement` asks. Sizes up to a
    /// quarter extent come from slabs (whose extents follow the placement
    /// only when they are created); larger ones take whole extents.
    pub async fn alloc_with(
        &self,
        size: u64,
        placement: &Placement,
    ) -> Result<VirtAddr, AllocError> {
        self.alloc_inner(size, placement, None).await
    }

    async fn alloc_inner(
        &self,
        size: u64,
        placement: &Placement,
        name_slot: Option<u64>,
    ) -> Result<VirtAddr, AllocError> {
        if size == 0 {
            return Err(AllocError::ZeroSize);
        }
        match (self.classes.class_of(size), name_slot) {
            (Some(class), None) => self.alloc_small(class, placement).await,
            _ => {
                let head = self
                    .alloc_extents(size, placement, EntryKind::Head, name_slot)
                    .await?;
                Ok(records::vbase_of(&self.meta, head))
            }
        }
    }

    /// Frees the allocation starting at `vaddr`, durably once it returns.
    /// Its keys are rotated: any
    /// client still holding its translation gets a use-after-free error.
    /// Only the client that allocated it may free it (the servers check it
    /// too, with authentication): a small object lives in a slab of the
    /// client that took it.
    pub async fn free(&self, vaddr: VirtAddr) -> Result<(), AllocError> {
        let index = records::vextent_of(&self.meta, vaddr).ok_or(AllocError::InvalidFree {
            vaddr,
            reason: "outside the allocator's virtual space",
        })?;
        if let Some(slab) = self.cached_slab(index) {
            match self.free_small(vaddr, index, &slab).await {
                Err(AllocError::Pool(PoolError::AccessDenied { .. })) => self.forget_slab(index),
                done => return done,
            }
        }
        let entry = self.read_entry(index).await?;
        match (entry.control.state, entry.control.kind) {
            (EntryState::Live, EntryKind::Slab) if entry.control.owner != self.owner => {
                Err(AllocError::NotOwner {
                    what: format!("the small object at {vaddr}"),
                    owner: entry.control.owner,
                })
            }
            (EntryState::Live, EntryKind::Slab) => {
                self.remember_slab(index, entry);
                self.free_small(vaddr, index, &entry).await
            }
            (EntryState::Live, EntryKind::Head) if entry.name_slot().is_some() => {
                Err(AllocError::InvalidFree {
                    vaddr,
                    reason: "it is a named object; remove it by name",
                })
            }
            (EntryState::Live, EntryKind::Head) if entry.control.owner != self.owner => {
                Err(AllocError::NotOwner {
                    what: format!("the allocation at {vaddr}"),
                    owner: entry.control.owner,
                })
            }
            (EntryState::Live, EntryKind::Head)
                if vaddr == records::vbase_of(&self.meta, index) =>
            {
                self.free_extents(index, entry).await
            }
            (EntryState::Live, _) => Err(AllocError::InvalidFree {
                vaddr,
                reason: "inside an allocation, not at its start",
            }),
            (EntryState::Free | EntryState::Freeing, _) if entry.control.generation > 0 => {
                Err(AllocError::DoubleFree { vaddr })
            }
            _ => Err(AllocError::InvalidFree {
                vaddr,
                reason: "not allocated",
            }),
        }
    }

    /// The superblock matches this topology's metadata geometry.
    async fn check_superblock(&self) -> Result<(), AllocError> {
        let bytes = self
            .read(
                self.meta.superblock(),
                self.meta_key(),
                sb::FIXED_LEN as u32,
            )
            .await?;
        check_superblock(&self.pool_name(), &bytes, &self.meta)
    }

    /// Writes region headers, an empty page table and name directory, and
    /// the superblock last (its magic makes the pool formatted).
    async fn write_metadata(&self) -> Result<(), AllocError> {
        let key = self.meta_key();
        self.write(self.meta.superblock(), key, &[0u8; 8]).await?;
        let layout = self.pool.layout();
        for region in self.meta.regions() {
            let image = region_header_image(region, RegionState::Formatted);
            self.write(region.start, region.key, &image).await?;
        }
        let tables_len = (self.meta.name_entry(self.meta.names()).get()
            - self.meta.page_table_entry(0).get()) as usize;
        self.write(self.meta.page_table_entry(0), key, &vec![0u8; tables_len])
            .await?;
        let mut block = vec![0u8; topology::meta::SUPERBLOCK_LEN as usize];
        let put = |block: &mut Vec<u8>, at: u64, value: u64| {
            block[at as usize..at as usize + 8].copy_from_slice(&value.to_le_bytes());
        };
        put(&mut block, sb::VERSION, records::FORMAT_VERSION);
        put(&mut block, sb::EXTENT, self.meta.extent_size());
        put(&mut block, sb::ENTRIES, self.meta.page_table_entries());
        put(&mut block, sb::NAMES, self.meta.names());
        put(&mut block, sb::FORMATTED_AT, unix_now());
        put(
            &mut block,
            sb::META_START,
            self.meta.meta_region().start.get(),
        );
        put(
            &mut block,
            sb::META_RESERVED,
            self.meta.meta_region().reserved,
        );
        put(&mut block, sb::REGIONS, self.meta.regions().len() as u64);
        self.write(self.meta.superblock(), key, &block).await?;
        self.store(self.meta.superblock(), key, records::POOL_MAGIC)
            .await?;
        *self.lock_guesses() = Guesses::default();
        *self.lock_candidates() = regions::Candidates::all_of(layout);
        Ok(())
    }

    fn pool_name(&self) -> String {
        self.pool.pool_name().to_owned()
    }

    fn meta_key(&self) -> AccessKey {
        self.meta.meta_region().key
    }

    /// Region `region` of the pool's current layout.
    fn region(&self, region: RegionIndex) -> Result<RegionMeta, AllocError> {
        let layout = self.pool.layout();
        layout
            .meta()
            .and_then(|meta| meta.region(region))
            .copied()
            .ok_or_else(|| AllocError::Corrupt {
                what: format!("region index {} is not in the pool's layout", region.0),
            })
    }

    fn lock_guesses(&self) -> std::sync::MutexGuard<'_, Guesses> {
        self.guesses
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A fresh extent key naming this client as its owner
    /// ([`records::owned_key`], or [`records::slab_key`] for a slab).
    fn fresh_key(&self, slab: bool) -> AccessKey {
        if slab {
            records::slab_key(self.owner, self.random())
        } else {
            records::owned_key(self.owner, self.random())
        }
    }

    /// 64 random bits (splitmix64 over a seed from the OS).
    fn random(&self) -> u64 {
        let mut state = self
            .rng
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    // One-sided operations on metadata, counted.

    async fn read(&self, at: PmemAddr, key: AccessKey, len: u32) -> Result<Vec<u8>, PoolError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        self.pool.pmem_read(at, key, len).await
    }

    async fn read_word(&self, at: PmemAddr, offset: u64) -> Result<u64, PoolError> {
        let at = PmemAddr(at.get() + offset);
        let bytes = self.read(at, self.meta_key(), 8).await?;
        Ok(records::word_at(&bytes, 0).unwrap_or_default())
    }

    async fn write(&self, at: PmemAddr, key: AccessKey, data: &[u8]) -> Result<(), PoolError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        self.pool.pmem_write(at, key, data).await
    }

    async fn cas(
        &self,
        at: PmemAddr,
        key: AccessKey,
        old: u64,
        new: u64,
    ) -> Result<u64, PoolError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        self.pool
            .pmem_atomic(at, key, Operation::CompareSwap, new, old)
            .await
    }

    async fn fetch_add(&self, at: PmemAddr, key: AccessKey, delta: u64) -> Result<u64, PoolError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        self.pool
            .pmem_atomic(at, key, Operation::FetchAdd, delta, 0)
            .await
    }

    async fn store(&self, at: PmemAddr, key: AccessKey, value: u64) -> Result<(), PoolError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        self.pool
            .pmem_atomic(at, key, Operation::AtomicWrite, value, 0)
            .await
            .map(drop)
    }

    /// Page-table entry `index`, read now.
    async fn read_entry(&self, index: u64) -> Result<PtEntry, AllocError> {
        let at = self.meta.page_table_entry(index);
        let bytes = self
            .read(at, self.meta_key(), records::PT_ENTRY_LEN as u32)
            .await?;
        PtEntry::decode(&bytes).ok_or_else(|| AllocError::Corrupt {
            what: format!("page-table entry {index}"),
        })
    }
}

/// A region header as formatting writes it: magic, index, extents,
/// reserved, `state`, start address; the bitmap with reserved extents and
/// the bits past the last extent set; an empty key table.
fn region_header_image(region: &RegionMeta, state: RegionState) -> Vec<u8> {
    let mut out = vec![0u8; region.header_len() as usize];
    for (at, w) in [
        (word::MAGIC, records::REGION_MAGIC),
        (word::INDEX, u64::from(region.region.0)),
        (word::EXTENTS, region.extents),
        (word::RESERVED, region.reserved),
        (word::STATE, state.encode()),
        (word::START, region.start.get()),
    ] {
        let at = at as usize;
        out[at..at + 8].copy_from_slice(&w.to_le_bytes());
    }
    for word in 0..region.bitmap_words() {
        let at = (region.bitmap_offset() + word * 8) as usize;
        out[at..at + 8].copy_from_slice(&never_free_bits(region, word).to_le_bytes());
    }
    out
}

/// The bits of bitmap word `word` that are never free: reserved extents and
/// the padding past the region's last extent.
fn never_free_bits(region: &RegionMeta, word: u64) -> u64 {
    (0..64)
        .filter(|bit| {
            let extent = word * 64 + bit;
            extent < region.reserved || extent >= region.extents
        })
        .fold(0, |acc, bit| acc | 1 << bit)
}

/// Checks a superblock's fixed part (`bytes`) against the metadata geometry
/// `meta` of this topology: formatted, in this format version, with the same
/// extent size, page table, name directory and metadata region.
fn check_superblock(pool: &str, bytes: &[u8], meta: &MetaLayout) -> Result<(), AllocError> {
    let word = |at: u64| records::word_at(bytes, at as usize).unwrap_or_default();
    if word(sb::MAGIC) != records::POOL_MAGIC {
        return Err(AllocError::NotFormatted {
            pool: pool.to_owned(),
        });
    }
    if word(sb::VERSION) != records::FORMAT_VERSION {
        return Err(AllocError::OtherFormatVersion {
            pool: pool.to_owned(),
            found: word(sb::VERSION),
        });
    }
    let recorded = [
        sb::EXTENT,
        sb::ENTRIES,
        sb::NAMES,
        sb::META_START,
        sb::META_RESERVED,
    ];
    for ((what, expected), at) in regions::geometry(meta).into_iter().zip(recorded) {
        let found = word(at);
        if found != expected {
            return Err(AllocError::FormatMismatch {
                pool: pool.to_owned(),
                what: regions::geometry_advice(what, found, expected),
            });
        }
    }
    Ok(())
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A seed for keys: 8 bytes from the OS, mixed with the time and pid.
fn seed() -> u64 {
    use std::io::Read;
    let mut bytes = [0u8; 8];
    let os = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map(|()| u64::from_le_bytes(bytes))
        .unwrap_or_default();
    let time = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    os ^ time.rotate_left(17) ^ u64::from(std::process::id()).rotate_left(40)
}

#[cfg(test)]
mod tests {
    use super::*;
    use topology::{AllocatorConfig, EnvOverrides, Layout, Topology};

    fn meta(page_table_entries: Option<u64>) -> MetaLayout {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/default.toml");
        let mut t = Topology::load_with(path, &EnvOverrides::None).expect("topology");
        t.pool.allocator = Some(AllocatorConfig {
            page_table_entries,
            ..AllocatorConfig::default()
        });
        Layout::new(&t)
            .expect("layout")
            .meta()
            .expect("meta")
            .clone()
    }

    /// The fixed part of the superblock format writes for `meta`.
    fn superblock(meta: &MetaLayout, version: u64) -> Vec<u8> {
        let mut block = vec![0u8; sb::FIXED_LEN as usize];
        for (at, value) in [
            (sb::MAGIC, records::POOL_MAGIC),
            (sb::VERSION, version),
            (sb::EXTENT, meta.extent_size()),
            (sb::ENTRIES, meta.page_table_entries()),
            (sb::NAMES, meta.names()),
            (sb::META_START, meta.meta_region().start.get()),
            (sb::META_RESERVED, meta.meta_region().reserved),
        ] {
            block[at as usize..at as usize + 8].copy_from_slice(&value.to_le_bytes());
        }
        block
    }

    #[test]
    fn a_superblock_of_this_geometry_and_version_is_accepted() {
        let meta = meta(Some(512));
        let block = superblock(&meta, records::FORMAT_VERSION);
        assert!(check_superblock("p", &block, &meta).is_ok());
        let err = check_superblock("p", &[0; 72], &meta).unwrap_err();
        assert!(matches!(err, AllocError::NotFormatted { .. }), "{err}");
    }

    #[test]
    fn an_older_format_version_is_refused_by_number() {
        let meta = meta(None);
        let block = superblock(&meta, 3);
        let err = check_superblock("p", &block, &meta).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("formatted with metadata format version 3")
                && message.contains(&format!("reads only version {}", records::FORMAT_VERSION)),
            "{message}"
        );
    }

    #[test]
    fn a_page_table_of_another_size_is_refused_naming_the_setting() {
        let formatted = meta(Some(512));
        let block = superblock(&formatted, records::FORMAT_VERSION);
        let err = check_superblock("p", &block, &meta(Some(1024))).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("page-table entries 512 at format, this topology gives 1024")
                && message.contains("set page_table_entries = 512"),
            "{message}"
        );
    }
}
