//! The allocator for blocking code: each call runs the async
//! [`Allocator`]'s on the pool's runtime and waits.

use std::sync::Arc;

use tokio::runtime::Runtime;
use topology::VirtAddr;

use super::{AllocError, Allocator, NamedObject, Placement, ScrubReport, Usage};
use crate::pool::Pool;

/// The allocator of one client, for blocking code: what [`Allocator`] does,
/// each call waiting for its result. It shares the [`Pool`]'s connections
/// and runtime and may outlive the `Pool` value it came from.
///
/// Every call that changes the pool (alloc, free, remove, format, scrub)
/// is durable when it returns: the allocator's records are written with
/// WRITE_PERSIST and atomics that persist their word.
#[derive(Debug)]
pub struct BlockingAllocator {
    runtime: Arc<Runtime>,
    allocator: Allocator,
}

impl BlockingAllocator {
    /// The allocator of `pool`, which must be formatted and whose topology
    /// must have `[pool.allocator]`.
    pub fn attach(pool: &Pool) -> Result<Self, AllocError> {
        let runtime = Arc::clone(pool.runtime());
        let allocator = runtime.block_on(Allocator::attach(pool.handle().clone()))?;
        Ok(Self { runtime, allocator })
    }

    /// Writes empty metadata over `pool`: every extent free, no names.
    /// Refuses a formatted pool unless `force` (which frees everything).
    pub fn format(pool: &Pool, force: bool) -> Result<Self, AllocError> {
        let runtime = Arc::clone(pool.runtime());
        let allocator = runtime.block_on(Allocator::format(pool.handle().clone(), force))?;
        Ok(Self { runtime, allocator })
    }

    /// The async allocator underneath (for [`Pool::block_on`] or async code).
    pub fn as_async(&self) -> &Allocator {
        &self.allocator
    }

    /// Allocates `size` bytes anywhere (round-robin across servers); see
    /// [`Allocator::alloc`].
    pub fn alloc(&self, size: u64) -> Result<VirtAddr, AllocError> {
        self.runtime.block_on(self.allocator.alloc(size))
    }

    /// Allocates `size` bytes placed as `placement` asks.
    pub fn alloc_with(&self, size: u64, placement: &Placement) -> Result<VirtAddr, AllocError> {
        self.runtime
            .block_on(self.allocator.alloc_with(size, placement))
    }

    /// Allocates `size` bytes under `name`, visible to every client, anywhere.
    pub fn alloc_named(&self, name: &str, size: u64) -> Result<VirtAddr, AllocError> {
        self.runtime
            .block_on(self.allocator.alloc_named(name, size))
    }

    /// Allocates `size` bytes under `name`, placed as `placement` asks.
    pub fn alloc_named_with(
        &self,
        name: &str,
        size: u64,
        placement: &Placement,
    ) -> Result<VirtAddr, AllocError> {
        self.runtime
            .block_on(self.allocator.alloc_named_with(name, size, placement))
    }

    /// Frees the allocation starting at `vaddr`; see [`Allocator::free`].
    pub fn free(&self, vaddr: VirtAddr) -> Result<(), AllocError> {
        self.runtime.block_on(self.allocator.free(vaddr))
    }

    /// The named object `name`: where it starts and its size.
    pub fn open(&self, name: &str) -> Result<(VirtAddr, u64), AllocError> {
        self.runtime.block_on(self.allocator.open(name))
    }

    /// Every named object, in directory order.
    pub fn list(&self) -> Result<Vec<NamedObject>, AllocError> {
        self.runtime.block_on(self.allocator.list())
    }

    /// Removes the named object `name` and frees its memory (only its
    /// creator may).
    pub fn remove(&self, name: &str) -> Result<(), AllocError> {
        self.runtime.block_on(self.allocator.remove(name))
    }

    /// Capacity used and free per region, and slab occupancy.
    pub fn usage(&self) -> Result<Usage, AllocError> {
        self.runtime.block_on(self.allocator.usage())
    }

    /// Reclaims what allocations cut short by a crash left behind; run it
    /// while no client is allocating.
    pub fn scrub(&self) -> Result<ScrubReport, AllocError> {
        self.runtime.block_on(self.allocator.scrub())
    }

    /// Returns this client's empty slabs to the pool (see
    /// [`Allocator::trim`]).
    pub fn trim(&self) -> Result<(), AllocError> {
        self.runtime.block_on(self.allocator.trim())
    }
}
