//! pmem-client: the client side of pmem-fabric. Applications read, write and run atomics on one shared virtual
//! address space; the library translates virtual addresses to PMEM
//! addresses, picks the RNIC and fabric device for each request, and fails
//! over when a path dies.
//!
//! - [`translate`]: the virtual space, the [`Translator`] trait and the TLB.
//! - [`paths`]: the sans-IO path table: choice, health, probes, retries.
//! - [`conn`]: one path's TCP connection to its fabric device.
//! - `link`: a path's live link, its TCP connection or the verbs
//!   transport, behind one face.
//! - [`pool`]: the application API: [`AsyncPool`], [`Pool`] and [`Batch`].
//! - [`alloc`]: the lock-free allocator and named objects, all in PMEM
//!   ([`Allocator`], and [`BlockingAllocator`] for blocking code).
//! - [`records`]: how the allocator's metadata is encoded in PMEM (the
//!   pool reads its page-table entries too, so neither depends on the
//!   other for it).
//! - [`error`]: what goes wrong, said precisely.
//! - [`operator`]: what operators ask of the servers (rotating region keys).
//! - `verbs` (feature `verbs`): RDMA through a real RNIC (or rxe) to a
//!   fabric device's RoCEv2 port.
//!
//! `docs/client-library.md` says what each operation makes durable and
//! why the API looks as it does; its example is compiled as a doctest.
//!
//! ```no_run
//! use pmem_client::{Pool, VIRT_BASE};
//! use topology::{Topology, VirtAddr};
//!
//! let topology = Topology::load("configs/default.toml")?;
//! let pool = Pool::connect(topology, "c1")?;
//! let at = VirtAddr(VIRT_BASE);
//! pool.write_persist(at, b"hello")?;
//! assert_eq!(pool.read(at, 5)?, b"hello");
//! let before = pool.fetch_add(VirtAddr(VIRT_BASE + 64), 1)?;
//! # let _ = before;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod alloc;
pub mod conn;
pub mod error;
mod link;
pub mod operator;
pub mod paths;
pub mod pool;
pub mod records;
pub mod translate;
#[cfg(feature = "verbs")]
pub mod verbs;

pub use alloc::{AllocError, Allocator, BlockingAllocator, Growth, Placement};
pub use error::{Address, NoPathToOwner, OpenError, OwnerNotFound, PoolError};
pub use pool::{
    AsyncPool, Batch, BatchOp, Completion, Pool, PoolBuilder, PoolOptions, ServerCache,
};
pub use translate::{StaticTranslator, Translator, VIRT_BASE};

/// The guide `docs/client-library.md`, here so that its example is
/// compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../../docs/client-library.md")]
pub struct ClientLibraryGuide;

pub use telemetry::logging::error_chain;
