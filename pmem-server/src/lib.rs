//! pmem-server: exports the PMEM regions of one server and executes one-sided
//! operations on them durably.
//!
//! - [`persist`]: mapping region files (DAX with `MAP_SYNC` and cache-line
//!   write-back, `msync`, or libpmem) and making ranges durable.
//! - [`region_file`]: the on-disk region files and their headers.
//! - [`devices`]: where each PMEM device keeps its regions (the data
//!   directory, a directory of its own, or device DAX) and its NUMA node.
//! - `exec`: executing READ, WRITE, WRITE_PERSIST, FLUSH and the atomics,
//!   with key and bounds checks.
//! - `dedup` and `dedup_store`: the exactly-once window for retried
//!   atomics, kept in a mapped file so it survives a restart.
//! - `tenancy`: who may change the allocator's records (their owners), and
//!   zeroing an extent as a key is installed on it.
//! - `conn` and [`server`]: connections, listeners and the daemon's life.
//! - `metrics`: what `/metrics` exports.
//! - `verbs` (feature `verbs`): regions registered with a NIC's RNIC and
//!   queue pairs for fabric devices, so they reach memory without this
//!   process.
//!
//! The public API is what a user or a test needs: [`cli`] (the daemon),
//! [`RunningServer`] and [`OpenedServer`] with their [`ServerConfig`],
//! [`persist`], [`region_file`] and [`devices`]; the rest is the crate's own.

pub mod cli;
pub(crate) mod conn;
pub(crate) mod dedup;
pub(crate) mod dedup_store;
pub mod devices;
pub(crate) mod exec;
pub(crate) mod gate;
pub(crate) mod metrics;
pub(crate) mod numa;
pub mod persist;
pub mod region_file;
pub mod server;
pub(crate) mod stale_marks;
pub(crate) mod tenancy;
#[cfg(feature = "verbs")]
pub mod verbs;

pub use conn::Timeouts;
pub use exec::{Executor, Flow};
pub use gate::Session;
pub use server::{OpenedServer, RunningServer, ServerConfig, ServerError};
