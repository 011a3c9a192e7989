//! The blocking facade: each call runs on the pool's runtime and waits.

use topology::{ClientId, Layout, Topology, VirtAddr};

use crate::error::{OpenError, PoolError};

use super::{AsyncPool, Batch, Completion, PathStatus, Pool, PoolBuilder, StatsSnapshot};

impl Pool {
    /// Connects `client` with default options (blocking).
    pub fn connect(topology: Topology, client: impl Into<ClientId>) -> Result<Self, OpenError> {
        AsyncPool::builder(topology, client).connect()
    }

    /// A builder with options.
    pub fn builder(topology: Topology, client: impl Into<ClientId>) -> PoolBuilder {
        AsyncPool::builder(topology, client)
    }

    /// Runs `future` (for example an [`Allocator`](crate::Allocator) call)
    /// on the pool's runtime and waits for it.
    pub fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// The async handle, sharing this pool's connections.
    pub fn handle(&self) -> &AsyncPool {
        &self.pool
    }

    /// Reads `len` bytes at `vaddr`.
    pub fn read(&self, vaddr: VirtAddr, len: u64) -> Result<Vec<u8>, PoolError> {
        self.runtime.block_on(self.pool.read(vaddr, len))
    }

    /// Writes `data` at `vaddr`.
    pub fn write(&self, vaddr: VirtAddr, data: &[u8]) -> Result<(), PoolError> {
        self.runtime.block_on(self.pool.write(vaddr, data))
    }

    /// Writes `data` at `vaddr`, returning once durable.
    pub fn write_persist(&self, vaddr: VirtAddr, data: &[u8]) -> Result<(), PoolError> {
        self.runtime.block_on(self.pool.write_persist(vaddr, data))
    }

    /// Makes `len` bytes at `vaddr` durable.
    pub fn flush(&self, vaddr: VirtAddr, len: u64) -> Result<(), PoolError> {
        self.runtime.block_on(self.pool.flush(vaddr, len))
    }

    /// Compare-and-swap; returns the old value.
    pub fn compare_and_swap(&self, vaddr: VirtAddr, old: u64, new: u64) -> Result<u64, PoolError> {
        self.runtime
            .block_on(self.pool.compare_and_swap(vaddr, old, new))
    }

    /// Fetch-and-add; returns the old value.
    pub fn fetch_add(&self, vaddr: VirtAddr, delta: u64) -> Result<u64, PoolError> {
        self.runtime.block_on(self.pool.fetch_add(vaddr, delta))
    }

    /// Atomic 8-byte store.
    pub fn atomic_write(&self, vaddr: VirtAddr, value: u64) -> Result<(), PoolError> {
        self.runtime.block_on(self.pool.atomic_write(vaddr, value))
    }

    /// Waits for everything issued before it.
    pub fn fence(&self) {
        self.runtime.block_on(self.pool.fence());
    }

    /// Runs a batch and waits once.
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

    /// The layout in use.
    pub fn layout(&self) -> &Layout {
        self.pool.layout()
    }
}
