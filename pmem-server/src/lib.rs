//! pmem-server: exports the PMEM regions of one server and executes one-sided
//! operations on them durably.
//!
//! - [`persist`]: mapping region files (DAX with `MAP_SYNC` and cache-line
//!   write-back, `msync`, or libpmem) and making ranges durable.
//! - [`region_file`]: the on-disk region files and their headers.
//! - [`exec`]: executing READ, WRITE, WRITE_PERSIST, FLUSH and the atomics,
//!   with key and bounds checks.
//! - [`dedup`] and [`dedup_store`]: the exactly-once window for retried
//!   atomics, kept in a mapped file so it survives a restart.
//! - [`conn`] and [`server`]: connections, listeners and the daemon's life.
//! - [`metrics`]: what `/metrics` exports.

pub mod cli;
pub mod conn;
pub mod dedup;
pub mod dedup_store;
pub mod exec;
pub mod gate;
pub mod metrics;
pub mod persist;
pub mod region_file;
pub mod server;
pub mod stale_marks;

pub use server::{OpenedServer, RunningServer, ServerConfig, ServerError};
