//! What goes wrong opening an RDMA device and bringing a queue pair up:
//! one variant per failing verbs call, named in the message.

use std::net::Ipv4Addr;

use sideway::ibverbs::completion::CreateCompletionQueueError;
use sideway::ibverbs::device::{GetDeviceListError, OpenDeviceError};
use sideway::ibverbs::device_context::{
    AllocateProtectionDomainError, QueryDeviceError, QueryPortError,
};
use sideway::ibverbs::queue_pair::{CreateQueuePairError, ModifyQueuePairError};

/// Why the RDMA device or a queue pair on it cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RnicError {
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
    /// `ibv_create_qp` failed.
    #[error("ibv_create_qp (RC)")]
    CreateQp(#[source] CreateQueuePairError),
    /// The peer offered a path MTU verbs cannot express.
    #[error("the peer offered path MTU {0}, not one of 256, 512, 1024, 2048, 4096")]
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
    /// Registering memory with the RNIC failed (`ibv_reg_mr_iova2`).
    #[error("ibv_reg_mr of {len} bytes ({what})")]
    RegMr {
        /// What was registered.
        what: String,
        /// Its length.
        len: usize,
        /// Why (errno).
        #[source]
        source: std::io::Error,
    },
}
