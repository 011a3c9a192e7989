//! The testbed: brings whole pmem-fabric topologies up on one machine, drives
//! and breaks them, and checks topology files.

pub mod summary;

/// The default topology (`configs/default.toml`), embedded so the testbed runs
/// with no file at hand.
pub const DEFAULT_TOPOLOGY: &str = include_str!("../../configs/default.toml");

/// The name the embedded default topology goes by in messages.
pub const DEFAULT_TOPOLOGY_NAME: &str = "<embedded configs/default.toml>";
