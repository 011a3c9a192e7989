//! Mapping region files and making ranges of them durable.
//!
//! A PMEM region is one file, mapped whole by [`PmemMap::open`]. How stores
//! become durable depends on the [`PersistMode`] the mapping ends up in:
//!
//! - [`PersistMode::Dax`]: the file is mapped with
//!   `MAP_SHARED_VALIDATE | MAP_SYNC`, which only a DAX filesystem accepts.
//!   Stores go to persistent memory through the CPU cache; [`PmemMap::persist`]
//!   writes the cache lines back (CLWB, else CLFLUSHOPT, else CLFLUSH) and
//!   fences (SFENCE). No system call on the data path.
//! - [`PersistMode::DevDax`]: a region in a device DAX character device,
//!   mapped by [`PmemMap::open_device_dax`] with plain `MAP_SHARED` (device
//!   DAX is always synchronous); persisted like `Dax`.
//! - [`PersistMode::Msync`]: an ordinary shared mapping (page cache);
//!   [`PmemMap::persist`] is msync(2) with `MS_SYNC` over the pages covering
//!   the range. This is what runs on machines without DAX.
//! - [`PersistMode::Libpmem`] (build feature `libpmem`): libpmem maps the file
//!   and persists with `pmem_persist` where `pmem_is_pmem` says the mapping is
//!   persistent memory, with `pmem_msync` elsewhere.
//! - [`PersistMode::Emulated`] (tests only): a private mapping in an
//!   emulated persistence domain; [`PmemMap::persist`] writes the cache lines
//!   of the range into the file, so the file holds exactly what a power cut
//!   would leave (see [`PowerDomain`]).
//!
//! [`PersistPolicy`] chooses: `auto` takes DAX when the file supports it and
//! msync otherwise; `dax`, `msync` and `libpmem` force one mechanism and fail
//! rather than fall back.
//!
//! Stores follow the region's [`CachePolicy`](topology::CachePolicy):
//! `write-back` copies normally; `non-temporal` streams the aligned middle
//! around the cache (see `nt`) and fences.
//!
//! # Concurrency contract
//!
//! A [`PmemMap`] is shared by every connection thread serving its region, and
//! (like RDMA memory) by every client of it: concurrent reads, writes,
//! persists and atomics on one mapping are normal.
//!
//! - No `&[u8]` or `&mut [u8]` into the mapping is ever created or handed
//!   out. Bytes move only by raw-pointer copies (`ptr::copy_nonoverlapping`,
//!   streaming stores) between the mapping and caller-owned buffers, after a
//!   bounds check with checked arithmetic; nothing outside the mapping is
//!   touched.
//! - Two requests that write, or write and read, the same bytes at the same
//!   time race: a reader may see a mix of old and new bytes, and overlapping
//!   writes may interleave at any granularity. Ordering such requests is the
//!   application's business, exactly as with one-sided RDMA. The bytes are
//!   file-backed shared memory that other processes may map as well, so the
//!   server treats them like device memory and never assumes they are stable.
//! - COMPARE_SWAP, FETCH_ADD and ATOMIC_WRITE go through
//!   [`PmemMap::atomic_u64`], i.e. the CPU's atomic instructions on the
//!   mapped word; they are atomic with respect to each other. Mixing them with
//!   plain writes of the same word is the same kind of race as above.
//! - Durability is per range and not ordered across threads: a
//!   [`PmemMap::persist`] makes durable whatever the range holds when the
//!   flush runs, including other threads' stores that happen to be visible.
//!   An atomic's result is durable once the word is persisted.
//! - The file must not be truncated while it is mapped.

mod cacheline;
mod dax;
mod emulated;
mod error;
#[cfg(feature = "libpmem")]
mod libpmem;
mod map;
mod nt;
mod policy;

#[cfg(test)]
mod tests;

pub use emulated::{POWER_CUT_EXIT, PowerDomain};
pub use error::PersistError;
pub use map::PmemMap;
pub use policy::{PersistMode, PersistPolicy};
