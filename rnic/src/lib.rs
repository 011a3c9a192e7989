//! What both ends of pmem-fabric's verbs transport need from an RDMA NIC
//! (or the kernel's Soft-RoCE, rxe).
//!
//! - [`device`]: opening a device by name (or the first) and the port's
//!   RoCE v2 GID for an IPv4 address.
//! - [`rc`]: an RC queue pair brought from RESET to RTS against a peer's
//!   [`proto::qp::Endpoint`].
//! - [`mr`]: memory registered at an I/O virtual address of the caller's
//!   choosing.
//! - `error`: [`RnicError`], what goes wrong opening a device and bringing
//!   a queue pair up.
//!
//! Built on `sideway`, which loads `libibverbs.so.1` at run time: building
//! needs no rdma-core (only cmake and libclang for its bindings), and
//! running without it, or without a device, fails with
//! [`RnicError::NoLibrary`] / [`RnicError::NoDevice`].

pub mod device;
mod error;
pub mod mr;
pub mod rc;

pub use device::{PortInfo, device_names, ipv4_gid, mtu_bytes, mtu_from_bytes, open, port_info};
pub use error::RnicError;
