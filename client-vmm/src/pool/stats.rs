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
    /// Up or down.
    pub up: bool,
    /// Requests outstanding on it.
    pub outstanding: usize,
}
