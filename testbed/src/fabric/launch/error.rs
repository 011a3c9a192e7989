//! Why a fabric could not be brought up or managed.

use super::DaemonKind;
use crate::fabric::etcd::EtcdControlError;
use crate::fabric::membership::MembershipError;
use crate::fabric::netns;
use crate::lab::LabError;
use crate::lab::guest_server::GuestServerError;

/// Why a fabric could not be brought up or managed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The topology has problems.
    #[error("{0}")]
    Topology(#[from] topology::ValidationErrors),
    /// Network namespaces could not be set up.
    #[error("cannot set up network namespaces")]
    Netns(#[from] netns::NetnsError),
    /// The RDMA lab could not be set up.
    #[error("cannot set up the RDMA lab")]
    Lab(#[from] LabError),
    /// A server cannot run in a lab guest.
    #[error(transparent)]
    GuestServer(#[from] GuestServerError),
    /// A file or process operation failed.
    #[error("I/O failed")]
    Io(#[source] std::io::Error),
    /// The effective topology could not be written.
    #[error("cannot write the effective topology")]
    Serialize(#[from] toml::ser::Error),
    /// The control plane (etcd) could not be brought up.
    #[error("cannot bring the control plane up")]
    Etcd(#[from] EtcdControlError),
    /// etcd is not reachable from lab guests.
    #[error(
        "--control etcd runs with --net loopback or --net netns (lab guests do not reach the \
         run's etcd)"
    )]
    EtcdNeedsLoopback,
    /// A daemon can be held back from the first map only on etcd.
    #[error(
        "holding a {} back from the first map needs --control etcd (the file map cannot change \
         under the workload)", .0.program()
    )]
    HoldBackNeedsEtcd(DaemonKind),
    /// The servers refuse a device added to the map under them.
    #[error(
        "fabric device {id} was added to the map but the servers refuse its links \
         (UNKNOWN_CLIENT in {log}): each pmem-server must follow the map (one built before \
         servers took principals from new maps knows a device only after its restart) and \
         find the device's key in its --secrets folder (its log says which it could not read)"
    )]
    AddedDeviceRefused {
        /// The device.
        id: String,
        /// Its log.
        log: String,
    },
    /// The first map could not be made, or a membership change failed.
    #[error(transparent)]
    Membership(#[from] MembershipError),
    /// The principals' keys could not be made.
    #[error("cannot make the principals' keys")]
    Keys(#[from] topology::secrets::SecretError),
    /// A daemon exited or stayed silent instead of reporting ready.
    #[error("{kind} {id} did not start: {why} (log: {log})", kind = .kind.program())]
    NotReady {
        /// Which daemon.
        kind: DaemonKind,
        /// Its id.
        id: String,
        /// What happened.
        why: String,
        /// Its log file.
        log: String,
    },
    /// No such link in this fabric (or not in netns mode).
    #[error("no link {0:?} in this fabric (links are cut only with --net netns)")]
    UnknownLink(String),
    /// No such daemon in this fabric.
    #[error("no {kind} {id} in this fabric", kind = .kind.program())]
    Unknown {
        /// Which daemon.
        kind: DaemonKind,
        /// Its id.
        id: String,
    },
    /// The pool's allocator could not be attached to or formatted.
    #[error("pool {pool:?}: cannot prepare the allocator as client {client}: {why}")]
    Allocator {
        /// The pool's name.
        pool: String,
        /// The client that tried.
        client: String,
        /// What went wrong, with its causes.
        why: String,
    },
}
