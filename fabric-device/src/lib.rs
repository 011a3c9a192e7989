//! fabric-device: the switch/proxy daemon of one switch node. It holds the PMEM address map and forwards each
//! one-sided request to the server that owns the address, over the link on
//! the region's CPU socket when that link is up.
//!
//! - [`map`]: the device's snapshot of the topology (links, routes, clients).
//! - [`forward`]: the sans-IO forwarding core.
//! - [`deadline`]: its request deadlines, in a FIFO.
//! - [`reconnect`]: when each server link is (re)connected, sans-IO.
//! - [`driver`]: the event loop that moves bytes between sockets and the core.
//! - [`metrics`]: what `/metrics` exports.

pub mod cli;
pub mod deadline;
pub mod driver;
pub mod forward;
pub mod idmap;
pub mod map;
pub mod metrics;
pub mod reconnect;
pub mod roce;
pub mod roce_metrics;
