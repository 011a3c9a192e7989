//! Several operations submitted together.

use topology::VirtAddr;

/// Several operations submitted together with [`AsyncPool::submit`](super::AsyncPool::submit).
#[derive(Debug, Default, Clone)]
pub struct Batch {
    pub(super) ops: Vec<BatchOp>,
}

/// One operation of a [`Batch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOp {
    /// Read `len` bytes.
    Read {
        /// Where.
        vaddr: VirtAddr,
        /// How many bytes.
        len: u64,
    },
    /// Write `data`, durably when `persist`.
    Write {
        /// Where.
        vaddr: VirtAddr,
        /// What.
        data: Vec<u8>,
        /// Acknowledge only once durable.
        persist: bool,
    },
    /// Make `len` bytes durable.
    Flush {
        /// Where.
        vaddr: VirtAddr,
        /// How many bytes.
        len: u64,
    },
    /// Compare-and-swap an 8-byte word.
    CompareAndSwap {
        /// Where.
        vaddr: VirtAddr,
        /// Expected value.
        old: u64,
        /// New value.
        new: u64,
    },
    /// Fetch-and-add on an 8-byte word.
    FetchAdd {
        /// Where.
        vaddr: VirtAddr,
        /// What to add.
        delta: u64,
    },
    /// Store an 8-byte word atomically.
    AtomicWrite {
        /// Where.
        vaddr: VirtAddr,
        /// What.
        value: u64,
    },
}

/// The result of one batch operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// Data read.
    Data(Vec<u8>),
    /// Done, nothing to return.
    Done,
    /// The old value of an atomic.
    Old(u64),
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an operation.
    pub fn push(&mut self, op: BatchOp) -> &mut Self {
        self.ops.push(op);
        self
    }

    /// Adds a read.
    pub fn read(&mut self, vaddr: VirtAddr, len: u64) -> &mut Self {
        self.push(BatchOp::Read { vaddr, len })
    }

    /// Adds a write.
    pub fn write(&mut self, vaddr: VirtAddr, data: impl Into<Vec<u8>>) -> &mut Self {
        self.push(BatchOp::Write {
            vaddr,
            data: data.into(),
            persist: false,
        })
    }

    /// Adds a durable write.
    pub fn write_persist(&mut self, vaddr: VirtAddr, data: impl Into<Vec<u8>>) -> &mut Self {
        self.push(BatchOp::Write {
            vaddr,
            data: data.into(),
            persist: true,
        })
    }

    /// Adds a fetch-and-add.
    pub fn fetch_add(&mut self, vaddr: VirtAddr, delta: u64) -> &mut Self {
        self.push(BatchOp::FetchAdd { vaddr, delta })
    }

    /// Operations in the batch.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}
