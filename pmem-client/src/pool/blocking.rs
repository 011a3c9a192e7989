//! The blocking facade: each call runs on the pool's runtime and waits.

use std::sync::Arc;

use topology::{ClientId, Layout, Topology, VirtAddr};

use crate::alloc::{AllocError, BlockingAllocator};
use crate::error::{OpenError, PoolError};

use super::{
    AsyncPool, Batch, Completion, PathStatus, Pool, PoolBuilder, ServerCache, StatsSnapshot,
};

impl Pool {
    /// Connects `client` with default options (blocking).
    pub fn connect(topology: Topology, client: impl Into<ClientId>) -> Result<Self, OpenError> {
        AsyncPool::builder(topology, client).connect()
    }

    /// A builder with options.
    pub fn builder(topology: Topology, client: impl Into<ClientId>) -> PoolBuilder {
        AsyncPool::builder(topology, client)
    }

    /// Runs `future` (any call of the async API) on the pool's runtime and
    /// waits for it.
    pub fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// The async handle, sharing this pool's connections.
    pub fn handle(&self) -> &AsyncPool {
        &self.pool
    }

    /// The runtime the blocking calls run on, shared with a
    /// [`BlockingAllocator`].
    pub(crate) fn runtime(&self) -> &Arc<tokio::runtime::Runtime> {
        &self.runtime
    }

    /// The allocator of this pool, for blocking code; the pool must be
    /// formatted (see [`BlockingAllocator::format`]).
    pub fn allocator(&self) -> Result<BlockingAllocator, AllocError> {
        BlockingAllocator::attach(self)
    }

    /// Reads `len` bytes at `vaddr`: what every write and atomic
    /// acknowledged before it left there, durable or not
    /// ([`AsyncPool::read`]).
    pub fn read(&self, vaddr: VirtAddr, len: u64) -> Result<Vec<u8>, PoolError> {
        self.runtime.block_on(self.pool.read(vaddr, len))
    }

    /// Reads `buf.len()` bytes at `vaddr` into `buf`, as [`read`](Self::read).
    pub fn read_into(&self, vaddr: VirtAddr, buf: &mut [u8]) -> Result<(), PoolError> {
        self.runtime.block_on(self.pool.read_into(vaddr, buf))
    }

    /// Reads the 8-byte little-endian word at `vaddr` (a plain READ, not an
    /// atomic load).
    pub fn read_u64(&self, vaddr: VirtAddr) -> Result<u64, PoolError> {
        self.runtime.block_on(self.pool.read_u64(vaddr))
    }

    /// Writes `data` at `vaddr`. Visible to every later read once this
    /// returns, but **not durable** until a [`flush`](Self::flush) of the
    /// range; [`write_persist`](Self::write_persist) does both.
    pub fn write(&self, vaddr: VirtAddr, data: &[u8]) -> Result<(), PoolError> {
        self.runtime.block_on(self.pool.write(vaddr, data))
    }

    /// [`write`](Self::write) with `cache` instead of the pool's
    /// [`ServerCache`] policy.
    pub fn write_with_cache(
        &self,
        vaddr: VirtAddr,
        data: &[u8],
        cache: ServerCache,
    ) -> Result<(), PoolError> {
        self.runtime
            .block_on(self.pool.write_with_cache(vaddr, data, cache))
    }

    /// Writes `value` as 8 little-endian bytes at `vaddr` (a plain WRITE:
    /// not atomic, **not durable** until a [`flush`](Self::flush)).
    pub fn write_u64(&self, vaddr: VirtAddr, value: u64) -> Result<(), PoolError> {
        self.runtime.block_on(self.pool.write_u64(vaddr, value))
    }

    /// Writes `data` at `vaddr`, returning once it is durable (WRITE_PERSIST).
    pub fn write_persist(&self, vaddr: VirtAddr, data: &[u8]) -> Result<(), PoolError> {
        self.runtime.block_on(self.pool.write_persist(vaddr, data))
    }

    /// [`write_persist`](Self::write_persist) with `cache` instead of the
    /// pool's [`ServerCache`] policy.
    pub fn write_persist_with_cache(
        &self,
        vaddr: VirtAddr,
        data: &[u8],
        cache: ServerCache,
    ) -> Result<(), PoolError> {
        self.runtime
            .block_on(self.pool.write_persist_with_cache(vaddr, data, cache))
    }

    /// Makes `len` bytes at `vaddr` durable: whatever they hold when the
    /// server runs the FLUSH, so every write and atomic that returned
    /// before this call.
    pub fn flush(&self, vaddr: VirtAddr, len: u64) -> Result<(), PoolError> {
        self.runtime.block_on(self.pool.flush(vaddr, len))
    }

    /// Compare-and-swap of the aligned word at `vaddr`, as std's
    /// `compare_exchange`: `Ok(previous)` when it swapped, `Err(actual)`
    /// when the word did not hold `current`. Exactly once; **not durable**
    /// until a [`flush`](Self::flush) of the word, unless the pool was built
    /// with [`persistent_atomics`](PoolBuilder::persistent_atomics).
    pub fn compare_and_swap(
        &self,
        vaddr: VirtAddr,
        current: u64,
        new: u64,
    ) -> Result<Result<u64, u64>, PoolError> {
        self.runtime
            .block_on(self.pool.compare_and_swap(vaddr, current, new))
    }

    /// Fetch-and-add on the aligned word at `vaddr`; returns the old value.
    /// Exactly once; **not durable** until a [`flush`](Self::flush) of the
    /// word (unless `persistent_atomics`).
    pub fn fetch_add(&self, vaddr: VirtAddr, delta: u64) -> Result<u64, PoolError> {
        self.runtime.block_on(self.pool.fetch_add(vaddr, delta))
    }

    /// Atomic store into the aligned word at `vaddr`; **not durable** until
    /// a [`flush`](Self::flush) of the word (unless `persistent_atomics`).
    pub fn atomic_write(&self, vaddr: VirtAddr, value: u64) -> Result<(), PoolError> {
        self.runtime.block_on(self.pool.atomic_write(vaddr, value))
    }

    /// Waits for everything issued before it.
    pub fn fence(&self) {
        self.runtime.block_on(self.pool.fence());
    }

    /// Runs a batch and waits once; its operations run concurrently, in no
    /// order ([`Batch`]).
    pub fn submit(&self, batch: Batch) -> Vec<Result<Completion, PoolError>> {
        self.runtime.block_on(self.pool.submit(batch))
    }

    /// Every path and how it is doing.
    pub fn paths(&self) -> Vec<PathStatus> {
        self.pool.paths()
    }

    /// The client's counters.
    pub fn stats(&self) -> StatsSnapshot {
        self.pool.stats()
    }

    /// The virtual range of every region.
    pub fn regions(&self) -> Vec<(String, VirtAddr, u64)> {
        self.pool.regions()
    }

    /// The layout in use now (see [`AsyncPool::layout`]).
    pub fn layout(&self) -> Arc<Layout> {
        self.pool.layout()
    }

    /// The epoch of the cluster map in use now (see
    /// [`AsyncPool::map_epoch`]).
    pub fn map_epoch(&self) -> u64 {
        self.pool.map_epoch()
    }
}
