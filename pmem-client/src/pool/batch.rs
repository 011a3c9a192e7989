//! Several operations submitted together.
//!
//! A batch's operations run concurrently and complete in any order; their
//! results come back in the batch's order. Nothing orders one operation of
//! a batch after another: a FLUSH in the same batch as a WRITE of its range
//! may run before it. Use `write_persist`, or flush in a later batch.

use topology::VirtAddr;

/// Several operations submitted together with [`AsyncPool::submit`](super::AsyncPool::submit).
#[derive(Debug, Default, Clone)]
pub struct Batch {
    pub(super) ops: Vec<BatchOp>,
}

/// One operation of a [`Batch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOp {
    /// Read `len` bytes: [`Completion::Data`].
    Read {
        /// Where.
        vaddr: VirtAddr,
        /// How many bytes.
        len: u64,
    },
    /// Write `data` ([`Completion::Done`]); durable when `persist`
    /// (WRITE_PERSIST), else only after a later FLUSH of the range.
    Write {
        /// Where.
        vaddr: VirtAddr,
        /// What.
        data: Vec<u8>,
        /// Acknowledge only once durable.
        persist: bool,
    },
    /// Make `len` bytes durable: what they hold when the FLUSH runs
    /// ([`Completion::Done`]).
    Flush {
        /// Where.
        vaddr: VirtAddr,
        /// How many bytes.
        len: u64,
    },
    /// Compare-and-swap an 8-byte word, exactly once
    /// ([`Completion::CompareAndSwap`]); not durable without a later FLUSH
    /// (unless the pool has `persistent_atomics`).
    CompareAndSwap {
        /// Where (8-byte aligned).
        vaddr: VirtAddr,
        /// The value the word must hold for the swap.
        current: u64,
        /// New value.
        new: u64,
    },
    /// Fetch-and-add on an 8-byte word, exactly once ([`Completion::Old`]);
    /// not durable without a later FLUSH
    /// (unless the pool has `persistent_atomics`).
    FetchAdd {
        /// Where (8-byte aligned).
        vaddr: VirtAddr,
        /// What to add.
        delta: u64,
    },
    /// Store an 8-byte word atomically ([`Completion::Done`]); not durable
    /// without a later FLUSH (unless the pool has `persistent_atomics`).
    AtomicWrite {
        /// Where (8-byte aligned).
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
    /// The old value of a fetch-and-add.
    Old(u64),
    /// A compare-and-swap's outcome, as std's `compare_exchange`:
    /// `Ok(previous)` when it swapped, `Err(actual)` when it did not.
    CompareAndSwap(Result<u64, u64>),
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

    /// Adds a write (durable only after a later FLUSH).
    pub fn write(&mut self, vaddr: VirtAddr, data: impl Into<Vec<u8>>) -> &mut Self {
        self.push(BatchOp::Write {
            vaddr,
            data: data.into(),
            persist: false,
        })
    }

    /// Adds a durable write (WRITE_PERSIST).
    pub fn write_persist(&mut self, vaddr: VirtAddr, data: impl Into<Vec<u8>>) -> &mut Self {
        self.push(BatchOp::Write {
            vaddr,
            data: data.into(),
            persist: true,
        })
    }

    /// Adds a FLUSH of `len` bytes at `vaddr`.
    pub fn flush(&mut self, vaddr: VirtAddr, len: u64) -> &mut Self {
        self.push(BatchOp::Flush { vaddr, len })
    }

    /// Adds a compare-and-swap of the word at `vaddr`: `new` if it holds
    /// `current`.
    pub fn compare_and_swap(&mut self, vaddr: VirtAddr, current: u64, new: u64) -> &mut Self {
        self.push(BatchOp::CompareAndSwap {
            vaddr,
            current,
            new,
        })
    }

    /// Adds a fetch-and-add.
    pub fn fetch_add(&mut self, vaddr: VirtAddr, delta: u64) -> &mut Self {
        self.push(BatchOp::FetchAdd { vaddr, delta })
    }

    /// Adds an atomic store of `value` into the word at `vaddr`.
    pub fn atomic_write(&mut self, vaddr: VirtAddr, value: u64) -> &mut Self {
        self.push(BatchOp::AtomicWrite { vaddr, value })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_add_the_operations_they_name_in_order() {
        let at = VirtAddr(0x1_0000_0000);
        let mut batch = Batch::new();
        batch
            .read(at, 16)
            .write(at, b"ab".to_vec())
            .write_persist(at + 8, *b"cd")
            .flush(at, 64)
            .compare_and_swap(at + 16, 1, 2)
            .fetch_add(at + 24, 3)
            .atomic_write(at + 32, 4);
        assert_eq!(
            batch.ops,
            [
                BatchOp::Read { vaddr: at, len: 16 },
                BatchOp::Write {
                    vaddr: at,
                    data: b"ab".to_vec(),
                    persist: false
                },
                BatchOp::Write {
                    vaddr: at + 8,
                    data: b"cd".to_vec(),
                    persist: true
                },
                BatchOp::Flush { vaddr: at, len: 64 },
                BatchOp::CompareAndSwap {
                    vaddr: at + 16,
                    current: 1,
                    new: 2
                },
                BatchOp::FetchAdd {
                    vaddr: at + 24,
                    delta: 3
                },
                BatchOp::AtomicWrite {
                    vaddr: at + 32,
                    value: 4
                },
            ]
        );
        assert_eq!(batch.len(), 7);
        assert!(Batch::new().is_empty());
    }
}
