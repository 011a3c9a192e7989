//! What a pool counts about itself and shows of its paths.

use std::sync::atomic::AtomicU64;

/// Counters a client keeps about itself.
#[derive(Debug, Default)]
pub struct Stats {
    /// Requests sent (first attempts).
    pub requests: AtomicU64,
    /// Attempts re-sent after a path failed.
    pub retries: AtomicU64,
    /// Requests that completed on another path than their first.
    pub failovers: AtomicU64,
    /// Paths reconnected by the prober.
    pub reconnects: AtomicU64,
    /// Region keys learnt again after a server refused a rotated one.
    pub key_refreshes: AtomicU64,
    /// New epochs of the cluster map the pool moved to.
    pub map_epochs: AtomicU64,
    /// New maps the pool refused (it stayed on its epoch).
    pub maps_refused: AtomicU64,
    /// Requests a device answered STALE_MAP with a newer epoch than the
    /// pool's: the pool caught up and sent them again.
    pub stale_newer: AtomicU64,
    /// Requests a device answered STALE_MAP with an older epoch (or the
    /// same, on a connection that had said an older one): sent again on
    /// another path or later.
    pub stale_behind: AtomicU64,
}

/// A snapshot of [`Stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Requests sent.
    pub requests: u64,
    /// Attempts re-sent after a path failed.
    pub retries: u64,
    /// Requests that completed on another path than their first.
    pub failovers: u64,
    /// Paths reconnected.
    pub reconnects: u64,
    /// Region keys learnt again after a server refused a rotated one.
    pub key_refreshes: u64,
    /// New epochs of the cluster map the pool moved to.
    pub map_epochs: u64,
    /// New maps refused (the pool stayed on its epoch).
    pub maps_refused: u64,
    /// Requests answered STALE_MAP with a newer epoch, sent again after
    /// catching up.
    pub stale_newer: u64,
    /// Requests answered STALE_MAP by a device behind, sent again on
    /// another path or later.
    pub stale_behind: u64,
}

/// One path as `pmemctl map` shows it.
#[derive(Debug, Clone)]
pub struct PathStatus {
    /// The RNIC.
    pub rnic: String,
    /// `tcp` or `roce`.
    pub transport: &'static str,
    /// The fabric device and its address.
    pub device: String,
    /// Where it connects.
    pub device_addr: String,
    /// Up or down (a retired path is down).
    pub up: bool,
    /// The map no longer wires it: it takes no new requests and is closed
    /// once its last one is done.
    pub retired: bool,
    /// Requests outstanding on it.
    pub outstanding: usize,
}
