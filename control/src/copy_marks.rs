//! A copy of a replicated region marked in the map by a daemon whose loop
//! is not async (the fabric device that owns the region: `offline` after
//! the copy stopped answering, `syncing` when its server is back, `serving`
//! once it is up to date), in one transaction, read again and retried when
//! someone changed the map meanwhile.

use crate::edit::EditError;
use crate::replica_state::ReplicaState;
use crate::{ControlError, ControlPlane, Credentials, Endpoints};

/// Attempts at most when the map keeps changing under the edit.
const ATTEMPTS: usize = 5;

/// What marking a copy did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyMarked {
    /// The map now says `offline`, at this epoch.
    Written {
        /// The map's new epoch.
        epoch: u64,
    },
    /// The map already said `offline` (another device or an operator).
    AlreadyOffline,
}

/// What marking a copy with a given state did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateMarked {
    /// The map now says the state, at this epoch.
    Written {
        /// The map's new epoch.
        epoch: u64,
    },
    /// The map already said it (another device or an operator).
    Already,
}

/// Why a copy could not be marked.
#[derive(Debug, thiserror::Error)]
pub enum MarkCopyError {
    /// etcd refused or could not be reached (the user may lack the right to
    /// write the map, for instance).
    #[error("cannot mark the copy of region {region} on server {server} {state} in etcd")]
    Control {
        /// The region.
        region: String,
        /// The copy's server.
        server: String,
        /// The state asked for.
        state: ReplicaState,
        /// Why.
        #[source]
        source: Box<ControlError>,
    },
    /// The map refuses the change (the last serving copy, a region that is
    /// not replicated there).
    #[error("the map refuses to mark the copy of region {region} on server {server} {state}")]
    Edit {
        /// The region.
        region: String,
        /// The copy's server.
        server: String,
        /// The state asked for.
        state: ReplicaState,
        /// Why.
        #[source]
        source: Box<EditError>,
    },
}

/// Marks `region`'s copy on `server` offline in pool `pool`'s map (as the
/// etcd user of `credentials` when given); blocks until written or refused.
pub fn mark_copy_offline(
    endpoints: &Endpoints,
    pool: &str,
    credentials: Option<&Credentials>,
    region: &str,
    server: &str,
) -> Result<CopyMarked, MarkCopyError> {
    let marked = mark_copy_state(
        endpoints,
        pool,
        credentials,
        region,
        server,
        ReplicaState::Offline,
    )?;
    Ok(match marked {
        StateMarked::Written { epoch } => CopyMarked::Written { epoch },
        StateMarked::Already => CopyMarked::AlreadyOffline,
    })
}

/// Marks `region`'s copy on `server` with `state` in pool `pool`'s map (as
/// the etcd user of `credentials` when given), in one transaction checked
/// against the replica set's version; blocks until written or refused.
pub fn mark_copy_state(
    endpoints: &Endpoints,
    pool: &str,
    credentials: Option<&Credentials>,
    region: &str,
    server: &str,
    state: ReplicaState,
) -> Result<StateMarked, MarkCopyError> {
    let control = |source| MarkCopyError::Control {
        region: region.to_owned(),
        server: server.to_owned(),
        state,
        source: Box::new(source),
    };
    let runtime = crate::blocking::runtime().map_err(control)?;
    runtime.block_on(async {
        let mut plane = ControlPlane::connect(endpoints, pool, credentials)
            .await
            .map_err(control)?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let read = plane.read_map().await.map_err(control)?;
            let version = read.map.replica_set(region).map_or(0, |r| r.version);
            match plane.mark_copy(region, server, state, version).await {
                Ok(epoch) => return Ok(StateMarked::Written { epoch }),
                // Someone changed the record between the read and the edit.
                Err(ControlError::ReplicaSetMoved { .. }) if attempt < ATTEMPTS => continue,
                Err(ControlError::MarkRefused { source, .. }) => {
                    return match *source {
                        EditError::Unchanged { .. } => Ok(StateMarked::Already),
                        source => Err(MarkCopyError::Edit {
                            region: region.to_owned(),
                            server: server.to_owned(),
                            state,
                            source: Box::new(source),
                        }),
                    };
                }
                Err(e) => return Err(control(e)),
            }
        }
    })
}

/// The states of the replicated regions' copies in pool `pool`'s map now
/// (as the etcd user of `credentials` when given), with the map's epoch:
/// what a daemon starting on the control plane applies before serving.
pub fn read_copy_states(
    endpoints: &Endpoints,
    pool: &str,
    credentials: Option<&Credentials>,
) -> Result<(Vec<crate::ReplicaSetRecord>, u64), ControlError> {
    let runtime = crate::blocking::runtime()?;
    runtime.block_on(async {
        let mut plane = ControlPlane::connect(endpoints, pool, credentials).await?;
        let read = plane.read_map().await?;
        Ok((read.map.replica_sets, read.map.epoch))
    })
}
