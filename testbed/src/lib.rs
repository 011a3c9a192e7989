//! The testbed: brings whole pmem-fabric topologies up on one machine, drives
//! and breaks them, and checks topology files. Its modules, by job:
//!
//! - [`fabric`]: a topology's daemons as real processes (loopback, namespaces, etcd).
//! - [`run`]: `run`, `demo` and `chaos`: fabric, workers, faults, report.
//! - [`workload`]: what a client worker does and how it verifies.
//! - [`report`]: `report.json`, `report.md` and the plots.
//! - [`linearizability`]: a register workload's history decided by an existing checker.
//! - [`bench`](mod@bench): `testbed bench` (its peers and rounds) and `bench-roce`.
//! - [`lab`]: the RDMA lab (QEMU guests with a stock RDMA stack) and what runs in it.
//! - [`stats`]: the one median and quantile of every report.
//! - [`cli`]: the command line, one function per command (`main.rs` only dispatches).

pub mod bench;
pub mod cli;
pub mod fabric;
pub mod lab;
pub mod linearizability;
pub mod report;
pub mod run;
pub mod stats;
pub mod workload;

/// The default topology (`configs/default.toml`), embedded so the testbed runs
/// with no file at hand.
pub const DEFAULT_TOPOLOGY: &str = include_str!("../../configs/default.toml");

/// The name the embedded default topology goes by in messages.
pub const DEFAULT_TOPOLOGY_NAME: &str = "<embedded configs/default.toml>";

/// The RDMA lab's topology (`configs/lab.toml`), the default with `--net lab`.
pub const LAB_TOPOLOGY: &str = include_str!("../../configs/lab.toml");

/// The name the embedded lab topology goes by in messages.
pub const LAB_TOPOLOGY_NAME: &str = "<embedded configs/lab.toml>";

/// `topology` with `[pool] replicas = copies` (every region's copies,
/// placed by the topology's rule), validated again; an error naming every
/// problem when the fabric cannot hold that many copies.
pub fn with_replicas(
    mut topology: topology::Topology,
    copies: u64,
) -> anyhow::Result<topology::Topology> {
    topology.pool.replicas = Some(copies);
    topology.validate().map_err(|errors| {
        anyhow::anyhow!(
            "--replicas {copies}: {} cannot hold {copies} copies of every region:\n{errors}",
            topology.source
        )
    })?;
    Ok(topology)
}

/// Loads `file`, or the embedded topology for `net` (the lab's in lab mode,
/// the default one otherwise), with environment overrides.
pub fn load_topology_on(
    file: Option<&std::path::Path>,
    net: fabric::launch::NetMode,
) -> Result<topology::Topology, topology::LoadError> {
    match (file, net) {
        (None, fabric::launch::NetMode::Lab) => topology::Topology::from_toml_str(
            LAB_TOPOLOGY_NAME,
            LAB_TOPOLOGY,
            &topology::EnvOverrides::Process,
        ),
        _ => load_topology(file),
    }
}

/// Loads `file`, or the embedded default topology, with environment
/// overrides.
pub fn load_topology(
    file: Option<&std::path::Path>,
) -> Result<topology::Topology, topology::LoadError> {
    match file {
        Some(path) => topology::Topology::load(path),
        None => topology::Topology::from_toml_str(
            DEFAULT_TOPOLOGY_NAME,
            DEFAULT_TOPOLOGY,
            &topology::EnvOverrides::Process,
        ),
    }
}
