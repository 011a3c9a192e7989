//! pmem-server: exports the PMEM regions of one server and executes one-sided
//! operations on them durably.
//!
//! - [`persist`]: mapping region files (DAX with `MAP_SYNC` and cache-line
//!   write-back, `msync`, or libpmem) and making ranges durable.
//! - [`region_file`]: the on-disk region files and their headers.
//! - `region_format`: the region header's fixed facts (magic, version,
//!   length).
//! - [`devices`]: where each PMEM device keeps its regions (the data
//!   directory, a directory of its own, or device DAX) and its NUMA node.
//! - `exec`: executing READ, WRITE, WRITE_PERSIST, FLUSH and the atomics,
//!   with key and bounds checks; fencing connections by the map epoch they
//!   said.
//! - `served_region`: one region as the server serves it (entry, mapped
//!   file, current key).
//! - `dedup`: the exactly-once window for retried atomics, bound to the
//!   request that recorded each result and kept in a self-checking mapped
//!   file so it survives a restart.
//! - `identities`: which identities a map names and the room the exactly-once
//!   file keeps for them.
//! - [`block_sums`]: checksums of the regions' blocks, recorded and verified
//!   when an operator asks (`pmemctl scrub --checksums`).
//! - `scrub`: answering SCRUB (a run of blocks checked against their
//!   checksums) and BLOCK_SUMS (their checksums as they are now).
//! - [`sums_file`]: the block checksums kept across a clean restart.
//! - [`held`]: the regions a server holds, its own and the backup copies
//!   of replicated regions the topology places on it.
//! - [`missing`]: which absent regions may be created empty at start.
//! - `tenancy`: who may change the allocator's records (their owners), and
//!   zeroing an extent as a key is installed on it.
//! - `conn`: one data connection: reading frames, executing them, writing
//!   the replies, with its admission.
//! - `live`: the live data connections and a handle on each, so shutdown or
//!   an eviction can end them.
//! - [`server`]: the running server: region files, listeners on every NIC,
//!   the admin endpoint, an orderly shutdown.
//! - [`cli`]: the `pmem-server` command line.
//! - `gate`: with `--secrets`, who may talk to this server and for which
//!   clients a fabric device may act.
//! - `numa`: keeping a NIC's threads on the NUMA node of its socket's PMEM.
//! - `follow`: on etcd, following the cluster map while the server runs.
//! - `metrics`: what `/metrics` exports.
//! - `verbs` (feature `verbs`): regions registered with a NIC's RNIC and
//!   queue pairs for fabric devices, so they reach memory without this
//!   process.
//! - `qp_fence`: queue pairs bound to the map epoch their connection said,
//!   destroyed when a takeover deposes its owner.
//!
//! The public API is what a user or a test needs: [`cli`] (the daemon),
//! [`RunningServer`] and [`OpenedServer`] with their [`ServerConfig`],
//! [`persist`], [`region_file`] and [`devices`]; the rest is the crate's own.

pub mod block_sums;
pub mod cli;
pub(crate) mod conn;
pub(crate) mod dedup;
pub mod devices;
pub(crate) mod exec;
pub(crate) mod follow;
pub(crate) mod gate;
pub mod held;
pub(crate) mod identities;
pub(crate) mod live;
pub(crate) mod metrics;
pub mod missing;
pub(crate) mod numa;
pub mod persist;
pub(crate) mod qp_fence;
pub mod region_file;
mod region_format;
pub(crate) mod scrub;
pub(crate) mod served_region;
pub mod server;
pub mod sums_file;
pub(crate) mod tenancy;
#[cfg(feature = "verbs")]
pub mod verbs;

pub use conn::Timeouts;
pub use exec::{Executor, Flow};
pub use gate::Session;
pub use server::{OpenedServer, RunningServer, ServerConfig, ServerError};
