//! What can go wrong talking to the control plane.

use crate::credentials::{CREDENTIALS_ENV, CredentialsError};
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
    /// etcd has authentication on and no credentials were given.
    #[error(
        "etcd at {endpoints} has authentication on and this connection gave no credentials: pass \
         --etcd-credentials FILE (or set ${CREDENTIALS_ENV}), a file holding one line \
         `user:password`, mode 600: the pool's operator's (operator.etcd) to change the map or \
         intents, a daemon's own (<role>.<name>.etcd) to run it"
    )]
    NeedsCredentials {
        /// The endpoints asked.
        endpoints: Endpoints,
    },
    /// etcd refused the user and password given.
    #[error(
        "etcd at {endpoints} refused user {user}: wrong user name or password (check the \
         credentials file given with --etcd-credentials or ${CREDENTIALS_ENV})"
    )]
    AuthFailed {
        /// The endpoints asked.
        endpoints: Endpoints,
        /// The user given.
        user: String,
        /// etcd's answer.
        #[source]
        source: etcd_client::Error,
    },
    /// Credentials were given to an etcd without authentication.
    #[error(
        "etcd at {endpoints} does not have authentication on, but credentials (user {user}) \
         were given: set it up (`testbed up --control etcd` does, or see docs/control-plane.md) \
         or connect without --etcd-credentials"
    )]
    AuthNotEnabled {
        /// The endpoints asked.
        endpoints: Endpoints,
        /// The user given.
        user: String,
    },
    /// The user may not do what was asked.
    #[error(
        "etcd user {user} may not make this {what} (key {key}): only the pool's operator may \
         change the map and the intents, and a daemon may write its own liveness key only \
         (etcd: permission denied)"
    )]
    PermissionDenied {
        /// The user (`(none)` without credentials).
        user: String,
        /// What was asked.
        what: &'static str,
        /// The key it touched.
        key: String,
    },
    /// Setting up a pool's users found a root user already there.
    #[error(
        "etcd at {endpoints} has a root user already (its authentication was set up before): \
         give root's credentials to add this pool's users"
    )]
    AlreadySecured {
        /// The endpoints asked.
        endpoints: Endpoints,
    },
    /// Setting up one user or its role failed.
    #[error("etcd {what} of user {user} failed")]
    UserSetup {
        /// The user.
        user: String,
        /// The step.
        what: &'static str,
        /// Why.
        #[source]
        source: etcd_client::Error,
    },
    /// A credentials file cannot be used.
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
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
    /// A new map whose epoch is not the next after the one it replaces.
    #[error(
        "a change of the map at epoch {based_on} must write epoch {}, not {epoch}; nothing \
         was written",
        based_on + 1
    )]
    EpochNotNext {
        /// The epoch of the map replaced.
        based_on: u64,
        /// The epoch of the map given.
        epoch: u64,
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
    /// A copy's state cannot change as asked (the edit's own refusal).
    #[error("the copy of region {region} on server {server} cannot be marked {state}")]
    MarkRefused {
        /// The region.
        region: String,
        /// The server holding the copy.
        server: String,
        /// The state asked for.
        state: crate::replica_state::ReplicaState,
        /// Why.
        #[source]
        source: Box<crate::edit::EditError>,
    },
    /// A replica set changed since its caller read it: nothing was written.
    #[error(
        "region {region}'s replica set is at version {current}, not {expected} as read: its \
         copies or owner changed meanwhile and nothing was written; read the map again and \
         decide anew"
    )]
    ReplicaSetMoved {
        /// The region.
        region: String,
        /// The version the caller read.
        expected: u64,
        /// The version the map holds.
        current: u64,
    },
    /// The client's runtime or thread could not start.
    #[error("cannot start the etcd client's runtime")]
    Runtime {
        /// Why.
        #[source]
        source: std::io::Error,
    },
}
