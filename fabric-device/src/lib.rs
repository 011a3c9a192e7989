//! fabric-device: the switch/proxy daemon of one switch node. It holds the PMEM address map and forwards each
//! one-sided request to the server that owns the address, over the link on
//! the region's CPU socket when that link is up.
//!
//! - `map`: the device's snapshot of the topology (links, routes, clients).
//! - `forward`: the sans-IO forwarding core.
//! - `deadline`: its request deadlines, in a FIFO.
//! - `reconnect`: when each server link is (re)connected, sans-IO.
//! - `request_budget`: the bytes of requests held while they arrive, per
//!   client and in total.
//! - `uplink`: RC queue pairs toward servers on verbs, which carry READ,
//!   WRITE, FLUSH and ATOMIC_WRITE to the server's RNIC.
//! - `driver`: the event loop that moves bytes between sockets and the core.
//! - `metrics`: what `/metrics` exports.
//!
//! The crate's public API is [`cli`] (the daemon's command line and `main`);
//! the rest is its own (`cargo doc --document-private-items` shows it).

pub mod cli;
pub(crate) mod deadline;
pub(crate) mod driver;
pub(crate) mod forward;
pub(crate) mod idmap;
pub(crate) mod ids;
pub(crate) mod link_tags;
pub(crate) mod map;
pub(crate) mod metrics;
pub(crate) mod qp_numbering;
pub(crate) mod reconnect;
pub(crate) mod request_budget;
pub(crate) mod roce;
pub(crate) mod roce_metrics;
pub(crate) mod uplink;
