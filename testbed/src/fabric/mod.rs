//! A whole fabric on one machine: every daemon of a topology as a real
//! process, on loopback or in network namespaces, its map from the topology
//! file or from a real etcd, kept up, changed and measured.
//!
//! - [`launch`]: the daemons started, watched, killed, restarted, stopped.
//! - [`daemon_kind`]: which daemon a process is (pmem-server, fabric-device).
//! - [`netns`]: one network namespace per host, links as veth pairs.
//! - [`etcd`]: the fabric on the control plane (`--control etcd`).
//! - [`membership`]: a daemon held back from the first map, added or removed later.
//! - [`epochs`]: each daemon's (and worker's) map epoch sampled over a run.
//! - [`map_follow`]: `testbed map-follow`, the time every daemon takes to run an epoch.
//! - [`supervise`]: `testbed up` watching and restarting its daemons; its control socket.
//! - [`advice`]: what to do after a failed start, in the words of the command.
//! - [`loopback`]: the benches' small fabrics, every listener on a free loopback port.
//! - [`keys`]: `testbed keygen`, a fresh key for every principal.
//! - [`prometheus`]: a real Prometheus scraping every daemon.
//! - [`summary`]: `testbed validate`'s summary and `up`'s endpoint table.

pub mod advice;
pub mod daemon_kind;
pub mod epochs;
pub mod etcd;
pub mod keys;
pub mod launch;
pub mod loopback;
pub mod map_follow;
pub mod membership;
pub mod netns;
pub mod prometheus;
pub mod summary;
pub mod supervise;
