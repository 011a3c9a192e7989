//! What can go wrong talking to the control plane.

use crate::endpoints::Endpoints;

/// A control-plane failure.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// No endpoint answered.
    #[error("cannot reach etcd at {endpoints} (tried every endpoint)")]
    Unreachable {
        /// The endpoints tried.
        endpoints: Endpoints,
        /// The client's last error.
        #[source]
        source: etcd_client::Error,
    },
    /// A request to etcd failed.
    #[error("etcd {what} failed")]
    Etcd {
        /// What was asked.
        what: &'static str,
        /// Why.
        #[source]
        source: etcd_client::Error,
    },
    /// The pool has no map in etcd yet.
    #[error("etcd has no map at {key}; load one with `pmemctl cluster init --from FILE`")]
    NoMap {
        /// The map's key.
        key: String,
    },
    /// `init` found a map already there.
    #[error(
        "etcd already holds a map at {key} (epoch {epoch}); change it with `pmemctl cluster \
         apply`, not init"
    )]
    AlreadyInitialized {
        /// The map's key.
        key: String,
        /// Its epoch.
        epoch: u64,
    },
    /// Someone changed the map since it was read: nothing was written.
    #[error(
        "the map changed meanwhile: this change was made against epoch {expected}, the map is \
         now at epoch {current}; nothing was written. Read it again and retry"
    )]
    Conflict {
        /// The epoch the change was based on.
        expected: u64,
        /// The epoch etcd holds now.
        current: u64,
    },
    /// The map's document is not JSON of the expected shape.
    #[error("etcd key {key}: not a cluster map document")]
    BadDocument {
        /// The key.
        key: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The map's topology does not load or validate.
    #[error("{source_name}: invalid cluster map: {why}")]
    InvalidMap {
        /// Where it came from (key and epoch).
        source_name: String,
        /// What is wrong, every problem named.
        why: String,
    },
    /// The topology names a pool that cannot be a key prefix.
    #[error("pool name {name:?} cannot name an etcd prefix (it holds a '/' or is empty)")]
    BadPoolName {
        /// The name.
        name: String,
    },
    /// The client's runtime or thread could not start.
    #[error("cannot start the etcd client's runtime")]
    Runtime {
        /// Why.
        #[source]
        source: std::io::Error,
    },
}
