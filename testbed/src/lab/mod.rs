//! The RDMA lab: clients that run inside QEMU guests whose stock Linux
//! kernel provides the RDMA stack (Soft-RoCE, `rdma_rxe`) and whose stock
//! rdma-core provides the verbs library, while the pmem-servers and fabric
//! devices run on this host.
//!
//! The shell scripts in the repository's `lab/` folder do the parts that are
//! plain system administration: `image.sh` builds the guest image from
//! Debian packages, `net.sh` makes the lab's network namespace (a bridge,
//! `vh0` with the control address 10.77.0.100, `vh1`/`vh2` for the fabric
//! devices' RoCEv2 ports) and `guest.sh` boots one guest on the bridge,
//! runs one command in it with host folders shared at the same paths, and
//! exits with the command's status.
//!
//! [`LabNet::enter`] brings the namespace up and moves the calling thread
//! into it, so the daemons, the host-side checks and the guests' QEMU
//! processes started from that thread afterwards all live in the lab.
//!
//! - [`net`]: the lab's namespace, its scripts, the command that boots a guest.
//! - [`guest`]: the one helper our own guests share (work folder, media, power cut).
//! - [`raw_client`]: the lab's one blocking raw-protocol client.
//! - [`counters`]: what the guests and daemons counted, for the reports.
//! - [`guest_server`]: a PMEM server of a lab fabric in a guest of its own.
//! - [`power_cut`]: `testbed power-cut`, real power cuts of such a guest.
//! - [`persist_bench`]: `testbed bench-persist`, one durable write in an NVDIMM guest.
//! - [`verbs_bench`]: `testbed bench-verbs`, a server's CPU on verbs next to TCP.

pub mod counters;
pub mod guest;
pub mod guest_server;
pub mod net;
pub mod persist_bench;
pub mod power_cut;
pub mod raw_client;
pub mod verbs_bench;

pub use net::{GuestStorage, LabError, LabNet};
