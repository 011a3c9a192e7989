//! A verbs transport: RDMA READ, WRITE and atomics on the pool through a
//! real RNIC (or the kernel's rxe), with an RC queue pair that a fabric
//! device terminates.
//!
//! Set-up rides the control connection ([`Control`]: HELLO as the client,
//! optionally MAP to check the layout digest): [`VerbsQp::connect`] opens
//! the RDMA device, picks the port's RoCE v2 GID for the local IPv4 address
//! (`::ffff:a.b.c.d`), creates PD, CQ, an RC QP and one registered buffer,
//! sends QP_CONNECT with this end and moves the QP through INIT → RTR → RTS
//! with the device's QPN, PSN, GID and path MTU from QP_ACCEPT. Work
//! requests then carry a PMEM address of the pool and the R_Key the device
//! gave for the region.
//!
//! Built on `sideway` (feature `verbs`), which loads `libibverbs.so.1` at
//! run time: building needs no rdma-core (only cmake and libclang for its
//! bindings), and running without it (or without a device) fails
//! with [`RnicError::NoLibrary`] / [`RnicError::NoDevice`]. sideway 0.4
//! builds READ, WRITE, FETCH_ADD and COMPARE_SWAP work requests; it names
//! ATOMIC_WRITE and FLUSH only as opcode and flag constants, with no way
//! to post them, so this transport has neither.
//!
//! ```no_run
//! use pmem_client::verbs::{Control, VerbsQp};
//! use std::time::Duration;
//!
//! let mut control = Control::connect(
//!     "10.77.0.100:7100".parse()?,
//!     "c1",
//!     None,
//!     Duration::from_secs(5),
//! )?;
//! let mut qp = VerbsQp::connect(&mut control, None, "10.77.0.2".parse()?)?;
//! qp.write(0, 0x1000, b"hello")?;
//! assert_eq!(qp.read(0, 0x1000, 5)?, b"hello");
//! let old = qp.fetch_add(0, 0x2000, 1)?;
//! # let _ = old;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod buffer;
mod control;
mod counters;
mod error;
pub(crate) mod link;
mod qp;

pub use control::{Control, QpAccept};
pub use counters::{HwCounter, SYSFS_INFINIBAND, hw_counters};
pub use error::{ControlError, VerbsError};
pub use qp::{Completion, Op, VerbsOptions, VerbsQp};
pub use rnic::{RnicError, device_names, ipv4_gid, mtu_bytes, mtu_from_bytes};
pub use sideway::ibverbs::completion::WorkCompletionStatus;
