//! fabric-device: the switch/proxy daemon of one switch node. It holds the PMEM address map and forwards each
//! one-sided request to the server that owns the address, over the link on
//! the region's CPU socket when that link is up.
//!
//! Its modules, one line each:
//!
//! - `cli`: the daemon's command line and `main`.
//! - `ids`: the ids the modules share (client connection, server link, lane).
//! - `link_tags`: every tag of the device's own messages on a server link.
//! - `idmap`: a hash map for the core's small integer ids.
//! - `map`: the device's snapshot of the topology (links, routes, clients).
//! - `forward`: the sans-IO forwarding core, one submodule per concern.
//! - `deadline`: its request deadlines, in a FIFO.
//! - `housekeeping`: when work once done on every loop turn is due (a
//!   mark, a deadline, a bounded fallback).
//! - `request_budget`: the bytes of requests held while they arrive, per
//!   client and in total.
//! - `reconnect`: when each server link is (re)connected, sans-IO.
//! - `resync`: bringing a `syncing` copy of a replicated region up to date,
//!   sans-IO (the walk over its blocks and the copies' pace), driven by the
//!   forwarding core's replication.
//! - `succession`: who takes over a dead owner's replicated regions, and
//!   when a probed device counts as dead, sans-IO.
//! - `rdma`: the RoCEv2 ports' side: the gateway for clients' queue pairs,
//!   the uplinks to servers on verbs, their metrics and QP numbering.
//! - `metrics`: what `/metrics` exports of the forwarding core.
//! - `driver`: the event loop that moves bytes between sockets and the core.
//!
//! The crate's public API is [`cli`] (the daemon's command line and `main`);
//! the rest is its own (`cargo doc --document-private-items` shows it).

pub mod cli;
pub(crate) mod deadline;
pub(crate) mod driver;
pub(crate) mod forward;
pub(crate) mod housekeeping;
pub(crate) mod idmap;
pub(crate) mod ids;
pub(crate) mod link_tags;
pub(crate) mod map;
pub(crate) mod metrics;
pub(crate) mod rdma;
pub(crate) mod reconnect;
pub(crate) mod request_budget;
pub(crate) mod resync;
pub(crate) mod succession;
