//! The pmem-fabric control plane: the cluster's map and membership in etcd.
//!
//! With `--etcd` (or a `[control]` section naming endpoints) the daemons,
//! `pmemctl` and the client library take the fabric's shape from etcd
//! instead of a file copied to every host. Everything lives under one
//! prefix per pool ([`Keys`]):
//!
//! - the **cluster map** ([`ClusterMap`]): the topology (servers, sockets,
//!   regions and their placement, NICs, devices, clients, grants) with an
//!   **epoch** that every change bumps. A change is one etcd transaction
//!   that compares the map's revision, so two operators never clobber each
//!   other: the loser gets [`ControlError::Conflict`] naming the epoch.
//! - **liveness** ([`Member`]): each daemon holds a lease-bound key with its
//!   address and the incarnation of its process; the key vanishes when the
//!   lease is not kept alive.
//! - the operator's **intent** per server and device ([`Intent`]): active,
//!   draining, removed.
//!
//! Secrets (principals' keys, region keys) never go into etcd.
//!
//! Who may write what is etcd's own business: with authentication on,
//! only the pool's operator may change the map and the intents, and each
//! daemon may write its own liveness key only ([`access`]); everyone
//! connects with [`Credentials`] read from an owner-only file.
//!
//! Modules:
//!
//! - [`endpoints`]: the `--etcd` list.
//! - [`credentials`]: an etcd user's credentials file.
//! - [`access`]: the pool's etcd users and roles.
//! - [`keys`]: the key layout under the pool's prefix.
//! - [`map`]: the map document and its validation.
//! - [`member`]: liveness and intent records.
//! - [`edit`]: the operator's changes as edits of the map's topology.
//! - [`drain`]: a server's copies moved elsewhere, one map change a step.
//! - [`plane`]: the etcd client: reading and changing the map, registering
//!   liveness.
//! - [`registration`]: the same for daemons without async code: the map at
//!   start, liveness from a thread.
//! - [`replica_state`]: the states of replicated regions' copies, their
//!   owner and version.
//! - [`copy_marks`]: a replicated region's copy marked offline, syncing or
//!   serving by the fabric device that owns the region, from a loop that
//!   is not async.
//! - [`ownership`]: a region's owner taken over by a surviving fabric
//!   device.
//! - [`deciding`]: the deciding role moved off a copy whose server turned
//!   out dead just after a takeover kept it deciding.
//! - [`watch`]: following the map while a daemon runs.
//! - [`follow_metrics`]: what a daemon following the map exports.
//! - `map_flags` (feature `clap`): the daemons' flags that name the map's
//!   source.
//! - [`error`]: what can go wrong talking to the control plane.
//! - `blocking`: the runtime the blocking entry points run their calls on.

pub mod access;
mod blocking;
pub mod copy_marks;
pub mod credentials;
pub mod deciding;
pub mod drain;
pub mod edit;
pub mod endpoints;
pub mod error;
pub mod follow_metrics;
pub mod keys;
pub mod map;
#[cfg(feature = "clap")]
pub mod map_flags;
pub mod member;
pub mod ownership;
pub mod plane;
pub mod registration;
pub mod replica_state;
pub mod watch;

pub use credentials::{CREDENTIALS_ENV, Credentials, CredentialsError};
pub use endpoints::Endpoints;
pub use error::ControlError;
pub use follow_metrics::{MapMetricNames, MapMetrics};
pub use keys::Keys;
pub use map::{ClusterMap, VersionedMap};
#[cfg(feature = "clap")]
pub use map_flags::MapFlags;
pub use member::{Intent, Member, Role};
pub use plane::{ControlPlane, Liveness};
pub use registration::{MapSource, MapSourceError, Registration, load_map};
pub use replica_state::{CopyRecord, ReplicaSetRecord, ReplicaState};
pub use watch::{MapUpdate, MapVersion, MapWatch, Quiet, REREAD_PERIOD, WatchObserver};
