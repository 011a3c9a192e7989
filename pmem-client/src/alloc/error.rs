//! What goes wrong when allocating, said precisely.

use topology::VirtAddr;

use crate::error::PoolError;

/// An allocator operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    /// The topology has no `[pool.allocator]`.
    #[error("pool {pool:?} has no allocator: add a [pool.allocator] table to its topology")]
    NoAllocator {
        /// The pool's name.
        pool: String,
    },
    /// The pool's metadata has not been written yet.
    #[error("pool {pool:?} is not formatted (run `pmemctl format`)")]
    NotFormatted {
        /// The pool's name.
        pool: String,
    },
    /// The superblock or a region header was written for another geometry.
    #[error("pool {pool:?} was formatted differently: {what}; reformat it or use its topology")]
    FormatMismatch {
        /// The pool's name.
        pool: String,
        /// What differs.
        what: String,
    },
    /// The superblock is of a metadata format this client does not read.
    #[error(
        "pool {pool:?} was formatted with metadata format version {found}, and this client reads only version {}; \
         reformat it with `pmemctl format --force` (which frees everything in it) or open it with the release that formatted it",
        crate::records::FORMAT_VERSION
    )]
    OtherFormatVersion {
        /// The pool's name.
        pool: String,
        /// The version its superblock records.
        found: u64,
    },
    /// The pool is formatted and `--force` was not given.
    #[error("pool {pool:?} is already formatted; formatting again frees everything in it")]
    AlreadyFormatted {
        /// The pool's name.
        pool: String,
    },
    /// No free space for the allocation where the placement allows.
    #[error("out of memory: no room for {size} bytes ({placement})")]
    OutOfMemory {
        /// Bytes asked for.
        size: u64,
        /// Where they could have gone.
        placement: String,
    },
    /// Every page-table entry near the cursor is in use.
    #[error(
        "the page table has no run of {extents} free virtual extents among its {entries} entries; \
         its size is fixed at format: free allocations, or format the pool again with a larger \
         page_table_entries in [pool.allocator]"
    )]
    PageTableFull {
        /// Extents asked for.
        extents: u64,
        /// Entries of the page table.
        entries: u64,
    },
    /// A zero-byte allocation.
    #[error("cannot allocate zero bytes")]
    ZeroSize,
    /// `free` of an address that is not the start of a live allocation.
    #[error("{vaddr}: not the start of an allocation ({reason})")]
    InvalidFree {
        /// The address.
        vaddr: VirtAddr,
        /// Why.
        reason: &'static str,
    },
    /// `free` of an allocation already freed.
    #[error("{vaddr}: double free")]
    DoubleFree {
        /// The address.
        vaddr: VirtAddr,
    },
    /// `free` or `remove` of another client's allocation or named object.
    #[error("{what} belongs to client number {owner}; only its owner may free or remove it")]
    NotOwner {
        /// The allocation or object.
        what: String,
        /// The owner's topology index.
        owner: u16,
    },
    /// A named object of this name exists (or is being created).
    #[error("a named object {0:?} already exists")]
    NameExists(String),
    /// No named object of this name.
    #[error("no named object {0:?}")]
    NameNotFound(String),
    /// A name that is empty or too long.
    #[error("name {name:?} must be 1 to {max} bytes")]
    BadName {
        /// The name.
        name: String,
        /// The longest allowed.
        max: usize,
    },
    /// Every name-directory entry is taken.
    #[error("the name directory is full ({0} entries)")]
    NamesFull(u64),
    /// A placement naming a server or socket the pool does not have.
    #[error("placement: {0}")]
    BadPlacement(String),
    /// Metadata that does not decode: the pool is damaged (run `pmemctl scrub`).
    #[error("damaged metadata at {what}")]
    Corrupt {
        /// Which record.
        what: String,
    },
    /// The pool operation underneath failed.
    #[error(transparent)]
    Pool(#[from] PoolError),
}
