//! Test support for pmem-fabric: tests that run the real daemons.
//!
//! - `binaries`: [`binary`], the path of a workspace binary, built on
//!   demand, for tests of one package that run another package's daemon
//!   (taken as built when [`PREBUILT_VAR`] says the caller built them all).
//! - `daemon`: [`Daemon`], a spawned daemon, ready once it printed its
//!   `ready key=value …` line; signalled, terminated, killed when dropped,
//!   its stderr always collected and waited on, its metrics read.
//! - `launch`: the daemons' command lines ([`pmem_server`],
//!   [`fabric_device`]), admin endpoints on ephemeral ports, `--insecure`
//!   unless the test gives `--secrets`; [`pmem_server_on_etcd_spec`] and
//!   [`fabric_device_on_etcd_spec`] for daemons that take their map from
//!   etcd.
//! - `conn`: [`Conn`], a raw protocol client, with [`at`], [`key`],
//!   [`layout`] and [`file_bytes`] to address regions and check their files.
//! - `fabric`: topology files: [`write_topology`] (one server on ephemeral
//!   ports), [`FabricSpec`] (several servers, devices and clients on fixed
//!   [`Ports`]) and [`one_then_two_servers`] (a map that grows by a server).
//! - `etcd`: [`Etcd`], a real etcd member (or a cluster of several) on ports
//!   and a data directory of its own, for the control plane; `etcdctl` as
//!   root once its authentication is on.
//! - [`netns`]: a network namespace joined to the host by a veth pair.
//! - [`roce`]: a RoCEv2 client for tests and load.
//! - `lock`: [`open_lock_file`], [`try_lock_exclusive`] and
//!   [`lock_exclusive`], `flock(2)` claims that other processes respect and
//!   that end with their holder.
//! - `imports`: [`assert_no_import_cycles`], a crate's test that no two of
//!   its modules import each other ([`import_cycles`] lists the pairs).
//!
//! ```no_run
//! use proto::Status;
//! use proto::request::Repr;
//! use testkit::{Conn, at, key, pmem_server, write_topology};
//!
//! let dir = tempfile::tempdir().expect("temp dir");
//! let config = write_topology(dir.path(), &[("R1", "4MiB")]);
//! let server = pmem_server(&config, "S", &dir.path().join("data"), &[])
//!     .unwrap_or_else(|stderr| panic!("pmem-server did not start:\n{stderr}"));
//! let mut conn = Conn::connect(server.addr("nic.n0"));
//! assert_eq!(conn.hello("c").data, b"S");
//! let reply = conn.call(Repr::write_persist(at(0, 0), key(server.addr("nic.n0"), 0), b"hello"));
//! assert_eq!(reply.status, Status::Ok);
//! let (status, _stderr) = server.terminate();
//! assert!(status.success());
//! ```

mod binaries;
mod conn;
mod daemon;
mod etcd;
mod fabric;
mod imports;
mod launch;
mod lock;
pub mod netns;
pub mod roce;

pub use binaries::{PREBUILT_VAR, binary, binary_in};
pub use conn::{
    Conn, IO_TIMEOUT, PROTOCOL_VERSION, REGION_FILE_HEADER_LEN, Reply, at, file_bytes, key, layout,
};
pub use daemon::{
    Daemon, DaemonSpec, LOG_TIMEOUT, READY_TIMEOUT, TERMINATE_TIMEOUT, parse_ready_line,
};
pub use etcd::Etcd;
pub use fabric::{
    FabricSpec, Ports, RoceSpec, default_topology_with, free_loopback_port, one_then_two_servers,
    try_free_loopback_port, write_topology,
};
pub use imports::{
    Import, ImportCycle, ImportScanError, assert_no_import_cycles, describe_cycles, import_cycles,
};
pub use launch::{
    EMULATED_POWER_CUT_EXIT, PMEM_SERVER_PERSISTENCE_VAR, fabric_device,
    fabric_device_on_etcd_spec, fabric_device_spec, fabric_device_with, pmem_server,
    pmem_server_on_etcd_spec, pmem_server_spec, pmem_server_with, pmem_servers,
};
pub use lock::{lock_exclusive, open_lock_file, try_lock_exclusive};
