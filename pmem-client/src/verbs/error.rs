//! What goes wrong in the verbs transport: one variant per failing verbs
//! call (named in the message), plus the control exchange and completions.

use std::time::Duration;

use proto::Status;
use sideway::ibverbs::completion::{PollCompletionQueueError, WorkCompletionStatus};
use sideway::ibverbs::memory_region::RegisterMemoryRegionError;
use sideway::ibverbs::queue_pair::PostSendError;

use crate::conn::ConnectError;

/// Why the control exchange for a queue pair failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Connecting, HELLO or MAP failed.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// Sending QP_CONNECT or reading the answer failed.
    #[error("{addr}: QP_CONNECT exchange")]
    Io {
        /// The device port.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The device refused the queue pair.
    #[error("{addr}: the fabric device refused QP_CONNECT: {status}")]
    Refused {
        /// The device port.
        addr: String,
        /// What it answered.
        status: Status,
    },
    /// The device answered something that is not a QP_ACCEPT for our tag.
    #[error("{addr}: unexpected answer to QP_CONNECT: {what}")]
    Protocol {
        /// The device port.
        addr: String,
        /// What arrived.
        what: String,
    },
}

/// Why the verbs transport failed.
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    /// Opening or querying the RDMA device, or bringing the queue pair up.
    #[error(transparent)]
    Rnic(#[from] rnic::RnicError),
    /// The local buffer could not be allocated.
    #[error("cannot allocate a {0}-byte local buffer")]
    Buffer(usize),
    /// `ibv_reg_mr` failed.
    #[error("ibv_reg_mr of {len} bytes")]
    RegMr {
        /// The buffer length.
        len: usize,
        /// Why.
        #[source]
        source: RegisterMemoryRegionError,
    },
    /// The QP_CONNECT / QP_ACCEPT exchange failed.
    #[error("QP set-up over the control connection")]
    Control(#[source] ControlError),
    /// The device handed out no R_Key for the region.
    #[error("the device handed out no R_Key for region {0}")]
    UnknownRegion(u32),
    /// The request finds no room in the local buffer (beside the slots of
    /// outstanding requests).
    #[error("no room for {op} of {len} bytes in the {buffer}-byte local buffer")]
    TooLong {
        /// The operation.
        op: &'static str,
        /// Its length.
        len: usize,
        /// The buffer's length.
        buffer: usize,
    },
    /// An atomic's remote address is not 8-byte aligned.
    #[error("{op} at {addr:#x}: atomics need an 8-byte aligned address")]
    Misaligned {
        /// The operation.
        op: &'static str,
        /// The address.
        addr: u64,
    },
    /// The send queue is full.
    #[error("the send queue is full ({0} work requests outstanding)")]
    QueueFull(usize),
    /// The queue pair cannot post this operation (its RNIC or provider did
    /// not accept it among the queue pair's send operations).
    #[error("this queue pair cannot post {0}")]
    Unsupported(&'static str),
    /// `ibv_post_send` failed.
    #[error("ibv_post_send {op}")]
    PostSend {
        /// The operation.
        op: &'static str,
        /// Why.
        #[source]
        source: PostSendError,
    },
    /// `ibv_poll_cq` failed.
    #[error("ibv_poll_cq")]
    PollCq(#[source] PollCompletionQueueError),
    /// A work request completed with an error status.
    #[error("{op} (wr_id {wr_id}) completed with {status:?} (vendor error {vendor_err:#x})")]
    Completion {
        /// The operation.
        op: &'static str,
        /// Its work request id.
        wr_id: u64,
        /// The completion status.
        status: WorkCompletionStatus,
        /// The provider's detail.
        vendor_err: u32,
    },
    /// A completion arrived for a work request we did not post.
    #[error("completion for unknown wr_id {0}")]
    StrayCompletion(u64),
    /// Completions did not arrive in time.
    #[error("{outstanding} work requests still outstanding after {waited:?}")]
    Timeout {
        /// How many.
        outstanding: usize,
        /// How long we waited.
        waited: Duration,
    },
}
