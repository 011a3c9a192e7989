//! The memory side of a responder: what it asks to be executed, and a
//! plain in-process implementation.
//!
//! The responder never touches memory itself. It hands out
//! [`Execution`]s (`poll_execution`) and takes their results back
//! (`complete_execution`), so a backend may answer at once (a mapped region
//! file, a test buffer: [`RemoteMemory`]) or later (a request forwarded to
//! a PMEM server).

use crate::roce::aeth::NakCode;

/// One operation on the responder's memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryOp {
    /// Read `len` bytes.
    Read {
        /// Start.
        va: u64,
        /// Remote key.
        rkey: u32,
        /// Bytes.
        len: u32,
    },
    /// Write one packet's worth of a WRITE message.
    Write {
        /// Where this packet's bytes go.
        va: u64,
        /// Remote key.
        rkey: u32,
        /// The bytes.
        data: Vec<u8>,
    },
    /// Compare and swap an aligned 8-byte word; returns the original.
    CompareSwap {
        /// Target.
        va: u64,
        /// Remote key.
        rkey: u32,
        /// Expected value.
        compare: u64,
        /// New value.
        swap: u64,
    },
    /// Fetch and add on an aligned 8-byte word; returns the original.
    FetchAdd {
        /// Target.
        va: u64,
        /// Remote key.
        rkey: u32,
        /// Addend.
        add: u64,
    },
    /// Store 8 bytes (in memory order) so that no reader sees a torn value.
    AtomicWrite {
        /// Target.
        va: u64,
        /// Remote key.
        rkey: u32,
        /// The bytes.
        value: [u8; 8],
    },
    /// Make a range durable (or globally visible, per `placement`).
    Flush {
        /// Start.
        va: u64,
        /// Remote key.
        rkey: u32,
        /// Bytes.
        len: u32,
        /// FETH placement type bits.
        placement: u8,
        /// FETH selectivity level.
        selectivity: u8,
    },
}

/// A memory operation the responder needs done, with the ticket that
/// `complete_execution` must quote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execution {
    /// Identifies this execution to the responder.
    pub ticket: u64,
    /// What to do.
    pub op: MemoryOp,
}

/// The result of a successful memory operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryReply {
    /// A write, flush or atomic write is done.
    Done,
    /// The bytes read.
    Read(Vec<u8>),
    /// The word's original value (COMPARE_SWAP, FETCH_ADD).
    Atomic(u64),
}

/// Why a memory operation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum AccessError {
    /// No region has this key.
    #[error("unknown remote key")]
    BadKey,
    /// The range is not inside the key's region, or an atomic is misaligned.
    #[error("range outside the region or misaligned")]
    OutOfBounds,
    /// The key does not grant this kind of access.
    #[error("access not granted")]
    NotPermitted,
    /// The backend failed (a server is unreachable, a flush failed).
    #[error("memory backend failed")]
    Failed,
}

impl AccessError {
    /// The NAK that reports this error to the requester.
    pub fn nak_code(self) -> NakCode {
        match self {
            AccessError::BadKey | AccessError::OutOfBounds | AccessError::NotPermitted => {
                NakCode::RemoteAccessError
            }
            AccessError::Failed => NakCode::RemoteOperationalError,
        }
    }
}

/// A memory backend that answers every operation at once.
pub trait RemoteMemory {
    /// Executes one operation.
    fn execute(&mut self, op: &MemoryOp) -> Result<MemoryReply, AccessError>;
}

/// A registered buffer: one region of plain process memory with an
/// address, a key and access rights. Atomics are plain read-modify-write:
/// the responder is single-threaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferMemory {
    /// Address of the first byte.
    pub base: u64,
    /// The region's key.
    pub rkey: u32,
    /// Whether remote writes and atomics are allowed.
    pub writable: bool,
    /// The bytes.
    pub bytes: Vec<u8>,
    /// Ranges flushed so far, in order (for tests that check persistence requests).
    pub flushed: Vec<(u64, u32)>,
}

impl BufferMemory {
    /// A writable region of `len` zero bytes at `base` with key `rkey`.
    pub fn new(base: u64, rkey: u32, len: usize) -> Self {
        BufferMemory {
            base,
            rkey,
            writable: true,
            bytes: vec![0; len],
            flushed: Vec::new(),
        }
    }

    fn range(&self, va: u64, rkey: u32, len: u64) -> Result<core::ops::Range<usize>, AccessError> {
        if rkey != self.rkey {
            return Err(AccessError::BadKey);
        }
        let start = va.checked_sub(self.base).ok_or(AccessError::OutOfBounds)?;
        let end = start.checked_add(len).ok_or(AccessError::OutOfBounds)?;
        if end > self.bytes.len() as u64 {
            return Err(AccessError::OutOfBounds);
        }
        Ok(start as usize..end as usize)
    }

    fn word(&mut self, va: u64, rkey: u32) -> Result<&mut [u8], AccessError> {
        if !va.is_multiple_of(8) {
            return Err(AccessError::OutOfBounds);
        }
        let range = self.writable_range(va, rkey, 8)?;
        Ok(&mut self.bytes[range])
    }

    fn writable_range(
        &self,
        va: u64,
        rkey: u32,
        len: u64,
    ) -> Result<core::ops::Range<usize>, AccessError> {
        let range = self.range(va, rkey, len)?;
        if !self.writable {
            return Err(AccessError::NotPermitted);
        }
        Ok(range)
    }
}

fn load(word: &[u8]) -> u64 {
    let mut raw = [0; 8];
    raw.copy_from_slice(word);
    u64::from_ne_bytes(raw)
}

impl RemoteMemory for BufferMemory {
    fn execute(&mut self, op: &MemoryOp) -> Result<MemoryReply, AccessError> {
        match *op {
            MemoryOp::Read { va, rkey, len } => {
                let range = self.range(va, rkey, len.into())?;
                Ok(MemoryReply::Read(self.bytes[range].to_vec()))
            }
            MemoryOp::Write { va, rkey, ref data } => {
                let range = self.writable_range(va, rkey, data.len() as u64)?;
                self.bytes[range].copy_from_slice(data);
                Ok(MemoryReply::Done)
            }
            MemoryOp::CompareSwap {
                va,
                rkey,
                compare,
                swap,
            } => {
                let word = self.word(va, rkey)?;
                let old = load(word);
                if old == compare {
                    word.copy_from_slice(&swap.to_ne_bytes());
                }
                Ok(MemoryReply::Atomic(old))
            }
            MemoryOp::FetchAdd { va, rkey, add } => {
                let word = self.word(va, rkey)?;
                let old = load(word);
                word.copy_from_slice(&old.wrapping_add(add).to_ne_bytes());
                Ok(MemoryReply::Atomic(old))
            }
            MemoryOp::AtomicWrite { va, rkey, value } => {
                self.word(va, rkey)?.copy_from_slice(&value);
                Ok(MemoryReply::Done)
            }
            MemoryOp::Flush { va, rkey, len, .. } => {
                self.range(va, rkey, len.into())?;
                self.flushed.push((va, len));
                Ok(MemoryReply::Done)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_checks_key_bounds_alignment_and_rights() {
        let mut m = BufferMemory::new(0x1000, 7, 64);
        let read = |va, rkey, len| MemoryOp::Read { va, rkey, len };
        assert_eq!(m.execute(&read(0x1000, 8, 1)), Err(AccessError::BadKey));
        assert_eq!(m.execute(&read(0xFFF, 7, 1)), Err(AccessError::OutOfBounds));
        assert_eq!(
            m.execute(&read(0x1030, 7, 17)),
            Err(AccessError::OutOfBounds)
        );
        assert_eq!(
            m.execute(&read(u64::MAX, 7, 2)),
            Err(AccessError::OutOfBounds)
        );
        let add = MemoryOp::FetchAdd {
            va: 0x1004,
            rkey: 7,
            add: 1,
        };
        assert_eq!(m.execute(&add), Err(AccessError::OutOfBounds));
        let add = MemoryOp::FetchAdd {
            va: 0x1008,
            rkey: 7,
            add: 5,
        };
        assert_eq!(m.execute(&add), Ok(MemoryReply::Atomic(0)));
        assert_eq!(m.execute(&add), Ok(MemoryReply::Atomic(5)));
        let cas = MemoryOp::CompareSwap {
            va: 0x1008,
            rkey: 7,
            compare: 10,
            swap: 99,
        };
        assert_eq!(m.execute(&cas), Ok(MemoryReply::Atomic(10)));
        assert_eq!(m.execute(&cas), Ok(MemoryReply::Atomic(99)));
        m.writable = false;
        assert_eq!(m.execute(&add), Err(AccessError::NotPermitted));
        assert_eq!(
            AccessError::Failed.nak_code(),
            NakCode::RemoteOperationalError
        );
    }
}
