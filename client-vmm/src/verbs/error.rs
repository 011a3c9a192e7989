//! What goes wrong in the verbs transport: one variant per failing verbs
//! call (named in the message), plus the control exchange and completions.

use std::net::Ipv4Addr;
use std::time::Duration;

use proto::Status;
use sideway::ibverbs::completion::{
    CreateCompletionQueueError, PollCompletionQueueError, WorkCompletionStatus,
};
use sideway::ibverbs::device::{GetDeviceListError, OpenDeviceError};
use sideway::ibverbs::device_context::{
    AllocateProtectionDomainError, QueryDeviceError, QueryPortError,
};
use sideway::ibverbs::memory_region::RegisterMemoryRegionError;
use sideway::ibverbs::queue_pair::{CreateQueuePairError, ModifyQueuePairError, PostSendError};

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
    /// `libibverbs.so.1` could not be loaded at run time.
    #[error(
        "ibv_get_device_list: libibverbs.so.1 is not loadable \
         (install libibverbs1 and ibverbs-providers)"
    )]
    NoLibrary(#[source] GetDeviceListError),
    /// `ibv_get_device_list` failed otherwise.
    #[error("ibv_get_device_list")]
    GetDeviceList(#[source] GetDeviceListError),
    /// The list is empty.
    #[error("no RDMA device: is rdma_rxe loaded (rdma link add) / is an RNIC present")]
    NoDevice,
    /// The device asked for is not in the list.
    #[error("no RDMA device named {name:?} (present: {present})")]
    UnknownDevice {
        /// The name asked for.
        name: String,
        /// The devices there are, comma separated.
        present: String,
    },
    /// `ibv_open_device` failed.
    #[error("ibv_open_device {device}")]
    OpenDevice {
        /// The device.
        device: String,
        /// Why.
        #[source]
        source: OpenDeviceError,
    },
    /// `ibv_query_device_ex` failed.
    #[error("ibv_query_device_ex {device}")]
    QueryDevice {
        /// The device.
        device: String,
        /// Why.
        #[source]
        source: QueryDeviceError,
    },
    /// `ibv_query_port` failed.
    #[error("ibv_query_port {device} port {port}")]
    QueryPort {
        /// The device.
        device: String,
        /// The port.
        port: u8,
        /// Why.
        #[source]
        source: QueryPortError,
    },
    /// The port is not ACTIVE.
    #[error("{device} port {port} is {state} (not ACTIVE): is its netdev up?")]
    PortDown {
        /// The device.
        device: String,
        /// The port.
        port: u8,
        /// Its state.
        state: String,
    },
    /// No GID of the port is the IPv4-mapped address of the local IP with
    /// type RoCE v2 (`ibv_query_gid_ex` over the table).
    #[error(
        "ibv_query_gid_ex: {device} port {port} has no RoCE v2 GID ::ffff:{ip} \
         (GIDs: {seen}); is {ip} configured on the netdev the device is bound to?"
    )]
    NoGid {
        /// The device.
        device: String,
        /// The port.
        port: u8,
        /// The local IP.
        ip: Ipv4Addr,
        /// The GIDs seen, `index=gid/type`.
        seen: String,
    },
    /// `ibv_alloc_pd` failed.
    #[error("ibv_alloc_pd")]
    AllocPd(#[source] AllocateProtectionDomainError),
    /// `ibv_create_cq` failed.
    #[error("ibv_create_cq")]
    CreateCq(#[source] CreateCompletionQueueError),
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
    /// `ibv_create_qp` failed.
    #[error("ibv_create_qp (RC)")]
    CreateQp(#[source] CreateQueuePairError),
    /// The QP_CONNECT / QP_ACCEPT exchange failed.
    #[error("QP set-up over the control connection")]
    Control(#[source] ControlError),
    /// The device offered a path MTU verbs cannot express.
    #[error("the device offered path MTU {0}, not one of 256, 512, 1024, 2048, 4096")]
    BadMtu(u16),
    /// `ibv_modify_qp` to `state` failed.
    #[error("ibv_modify_qp to {state}")]
    ModifyQp {
        /// The target state.
        state: &'static str,
        /// Why.
        #[source]
        source: ModifyQueuePairError,
    },
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
