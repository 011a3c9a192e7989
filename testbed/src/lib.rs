//! The testbed: brings whole pmem-fabric topologies up on one machine, drives
//! and breaks them, and checks topology files.
//!
//! - [`launch`]: every daemon of a topology as a real process (loopback or
//!   one network namespace per host, [`netns`]), its map from the topology
//!   file or from a real etcd ([`etcd`]).
//! - [`daemon_kind`]: which daemon a process is (pmem-server, fabric-device).
//! - [`demo`]: `testbed demo`'s topology (one server's regions kept twice)
//!   and its faults (a device's death, then a server's).
//! - [`freeze`]: the `freeze-server` fault: a server stopped past its
//!   lease, let go once its copies are out of service.
//! - [`membership`]: a daemon held back from the first map on etcd, to
//!   add under the workload; the device that can be removed.
//! - [`epochs`]: each daemon's (and worker's) map epoch sampled over a run.
//! - [`first_use`]: a worker on etcd watching its pool's epoch and the first
//!   request served by each region a new epoch brings.
//! - [`map_follow`]: `testbed map-follow`, the time every daemon takes to
//!   run a new epoch.
//! - [`workload`]: what a client worker does and how it verifies.
//! - [`run`]: `run`, `demo` and `chaos`: fabric, workers, faults, report.
//! - [`report`]: `report.json`, `report.md` and the plots.
//! - [`replica_copies`]: after a run on a replicated topology, every
//!   serving copy of every region compared byte for byte.
//! - [`prometheus`]: a real Prometheus scraping every daemon.
//! - [`summary`]: `testbed validate`'s summary.
//! - [`supervise`]: `testbed up` watching, reporting and restarting its
//!   daemons, and its control socket.
//! - [`advice`]: what to do after a failed start, in the words of the
//!   command that failed.
//! - [`bench`](mod@bench): `testbed bench`, pmem-fabric against the network floor and
//!   redis, its peers and rounds; [`stats`]: the one median and quantile of
//!   every report.
//! - [`roce_bench`], [`verbs_bench`], [`persist_bench`]: `bench-roce`,
//!   `bench-verbs` and `bench-persist`, each a cost the main bench cannot
//!   see (the device's RoCEv2 port, a server's CPU on verbs, a durable write).
//! - [`lab`]: the RDMA lab (QEMU guests with a stock Linux RDMA stack);
//!   [`guest_server`]: a PMEM server in a guest of its own; [`power_cut`]:
//!   real power cuts of such a guest.
//! - [`linearizability`]: a register workload's history decided by an
//!   existing checker.
//! - [`keys`]: `testbed keygen`, a fresh key for every principal.

pub mod advice;
pub mod bench;
pub mod daemon_kind;
pub mod demo;
pub mod epochs;
pub mod etcd;
pub mod first_use;
pub mod freeze;
pub mod guest_server;
pub mod keys;
pub mod lab;
pub mod launch;
pub mod linearizability;
pub mod map_follow;
pub mod membership;
pub mod netns;
pub mod persist_bench;
pub mod power_cut;
pub mod prometheus;
pub mod replica_copies;
pub mod report;
pub mod roce_bench;
pub mod run;
pub mod stats;
pub mod summary;
pub mod supervise;
pub mod verbs_bench;
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
    net: launch::NetMode,
) -> Result<topology::Topology, topology::LoadError> {
    match (file, net) {
        (None, launch::NetMode::Lab) => topology::Topology::from_toml_str(
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
