//! Work requests a consumer posts and the completions it gets back.

use crate::roce::feth;

/// Where in the remote peer's memory an operation goes: the `{addr, len, rkey}`
/// triple of RDMA, as a plain value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteAddr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key of the memory region.
    pub rkey: u32,
}

/// What a send-queue work request does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkOp {
    /// RDMA READ of `len` bytes.
    Read {
        /// Source.
        remote: RemoteAddr,
        /// Bytes to read.
        len: u32,
    },
    /// RDMA WRITE, optionally with immediate data.
    Write {
        /// Destination.
        remote: RemoteAddr,
        /// Bytes to write.
        data: Vec<u8>,
        /// Immediate data, consuming a receive at the peer.
        imm: Option<u32>,
    },
    /// SEND into the peer's next posted receive.
    Send {
        /// The message.
        data: Vec<u8>,
        /// Immediate data.
        imm: Option<u32>,
    },
    /// 8-byte compare and swap; completes with the original value.
    CompareSwap {
        /// Target (8-byte aligned).
        remote: RemoteAddr,
        /// Expected value.
        compare: u64,
        /// New value.
        swap: u64,
    },
    /// 8-byte fetch and add; completes with the original value.
    FetchAdd {
        /// Target (8-byte aligned).
        remote: RemoteAddr,
        /// Addend.
        add: u64,
    },
    /// 8-byte write placed atomically (IBTA 1.5); the bytes go as given.
    AtomicWrite {
        /// Target (8-byte aligned).
        remote: RemoteAddr,
        /// The 8 bytes, in memory order.
        value: [u8; 8],
    },
    /// Makes a range persistent or globally visible (IBTA 1.5).
    Flush {
        /// Start of the range.
        remote: RemoteAddr,
        /// Length of the range.
        len: u32,
        /// [`feth::PLACEMENT_PERSISTENT`] and/or [`feth::PLACEMENT_GLOBAL`].
        placement: u8,
    },
}

impl WorkOp {
    /// A FLUSH that makes a range persistent.
    pub fn persist(remote: RemoteAddr, len: u32) -> Self {
        WorkOp::Flush {
            remote,
            len,
            placement: feth::PLACEMENT_PERSISTENT,
        }
    }
}

/// A send-queue work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkRequest {
    /// The consumer's id; the completion carries it back.
    pub wr_id: u64,
    /// What to do.
    pub op: WorkOp,
    /// Start only once every earlier READ and atomic has completed, so
    /// that a READ retried after loss cannot see this request's effect.
    pub fence: bool,
}

impl WorkRequest {
    /// An unfenced work request.
    pub fn new(wr_id: u64, op: WorkOp) -> Self {
        WorkRequest {
            wr_id,
            op,
            fence: false,
        }
    }
}

/// How a work request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcStatus {
    /// Done.
    Success,
    /// The responder refused the key, the range or the access (NAK remote access error).
    RemoteAccessError,
    /// The responder found the request invalid (NAK invalid request).
    RemoteInvalidRequest,
    /// The responder could not complete it (NAK remote operational error).
    RemoteOperationalError,
    /// No acknowledge after the configured number of retransmissions.
    RetryExceeded,
    /// The responder stayed not-ready after the configured number of RNR retries.
    RnrRetryExceeded,
    /// Not executed: the queue pair went to the error state before it.
    Flushed,
}

/// What a completion carries besides its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompletionKind {
    /// A SEND finished.
    Send,
    /// A WRITE finished.
    Write,
    /// A READ finished with the bytes read (empty unless successful).
    Read(Vec<u8>),
    /// COMPARE_SWAP or FETCH_ADD finished with the original value.
    Atomic(u64),
    /// An ATOMIC_WRITE finished.
    AtomicWrite,
    /// A FLUSH finished.
    Flush,
    /// A receive was consumed by an incoming SEND (or WRITE with immediate).
    Recv {
        /// The message (empty for a WRITE with immediate).
        data: Vec<u8>,
        /// Immediate data, if the sender gave some.
        imm: Option<u32>,
    },
}

/// A work completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The work request's id.
    pub wr_id: u64,
    /// How it ended.
    pub status: WcStatus,
    /// What it carries.
    pub kind: CompletionKind,
}
