//! Following the cluster map in etcd: reading it at the opening, a
//! [`MapWatch`] for new epochs, applying each one without dropping
//! requests in flight, catching up when a device says it runs a newer
//! epoch, and telling every connection the epoch the pool moved to.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, Weak};
use std::time::{Duration, Instant};

use control::{
    CREDENTIALS_ENV, ControlPlane, Credentials, Endpoints, MapSource, MapVersion, MapWatch,
    REREAD_PERIOD, ReplicaSetRecord, WatchObserver,
};
use telemetry::logging::error_chain;
use tokio::sync::Notify;
use topology::{Layout, Topology};

use crate::conn::EpochAnswer;
use crate::error::OpenError;
use crate::paths::{PathId, PathTable};

use super::epoch::{Epoch, check_growth, server_moves};
use super::{Inner, lock};

/// How long a request that met a newer epoch waits for the watcher to
/// bring it before the pool reads the map from etcd itself.
const WATCH_GRACE: Duration = Duration::from_millis(500);
/// How long one MAP_EPOCH or MAP_REQUEST on a live connection may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// How often at most a connection is told a new epoch before its device
/// is left to the requests' own handling.
const MOVE_ON_TRIES: u32 = 60;
/// The longest pause between two of those tries.
const MOVE_ON_MAX_PAUSE: Duration = Duration::from_secs(1);
/// How often a retired path looks whether its last request is done.
const RETIRE_CHECK: Duration = Duration::from_millis(20);

/// The etcd credentials to use: `given`, else the file
/// `$PMEM_FABRIC_ETCD_CREDENTIALS` names, else none.
fn credentials_or_env(given: Option<Credentials>) -> Result<Option<Credentials>, OpenError> {
    match (given, std::env::var_os(CREDENTIALS_ENV)) {
        (Some(given), _) => Ok(Some(given)),
        (None, Some(path)) => Ok(Some(Credentials::read(Path::new(&path))?)),
        (None, None) => Ok(None),
    }
}

/// A map as the pool applies it: the topology, the replicated regions'
/// records (their owner devices) and the epoch.
pub(super) struct MapRead {
    /// The topology.
    pub topology: Topology,
    /// The replicated regions' records.
    pub replica_sets: Vec<ReplicaSetRecord>,
    /// Its epoch.
    pub epoch: u64,
}

/// The pool's map as etcd holds it now, validated, with its version.
async fn read_map(
    endpoints: &Endpoints,
    pool: &str,
    credentials: Option<&Credentials>,
) -> Result<(MapRead, MapVersion), control::ControlError> {
    let mut plane = ControlPlane::connect(endpoints, pool, credentials).await?;
    let map = plane.read_map().await?;
    let topology = map.map.topology_at(&plane.keys().map())?;
    let version = MapVersion {
        epoch: map.map.epoch,
        revision: map.revision,
    };
    let read = MapRead {
        topology,
        replica_sets: map.map.replica_sets,
        epoch: version.epoch,
    };
    Ok((read, version))
}

/// Reads pool `pool`'s map for an opening: the map, where it came from
/// (for the watch and later reads), its version.
pub(super) async fn read_map_from(
    endpoints: Endpoints,
    pool: String,
    credentials: Option<Credentials>,
) -> Result<(MapRead, MapSource, MapVersion), OpenError> {
    let credentials = credentials_or_env(credentials)?;
    let (read, version) = read_map(&endpoints, &pool, credentials.as_ref())
        .await
        .map_err(|source| OpenError::Etcd {
            pool: pool.clone(),
            source,
        })?;
    tracing::info!(
        "map of pool {pool} at epoch {} from etcd ({endpoints})",
        version.epoch
    );
    let source = MapSource::Etcd {
        endpoints,
        pool,
        credentials,
    };
    Ok((read, source, version))
}

/// Wakes the pool's follower when the watcher has a new map.
struct WakeFollower(Arc<Notify>);

impl WatchObserver for WakeFollower {
    fn update_ready(&self) {
        self.0.notify_one();
    }
}

/// Maps read from etcd by a request that met a newer epoch, for the
/// follower to apply.
pub(super) type DirectMaps = tokio::sync::mpsc::UnboundedSender<MapRead>;

/// Starts following the map from `version` (what the pool opened on);
/// `direct` hands over what [`Inner::ensure_epoch`] reads itself.
pub(super) fn start(
    inner: &Arc<Inner>,
    source: &MapSource,
    version: MapVersion,
    direct: tokio::sync::mpsc::UnboundedReceiver<MapRead>,
) -> Result<(), OpenError> {
    let ready = Arc::new(Notify::new());
    let observer = Arc::new(WakeFollower(Arc::clone(&ready)));
    let watch = source
        .watch(Some(version), REREAD_PERIOD, observer)
        .map_err(|source| OpenError::Etcd {
            pool: inner.pool_name.clone(),
            source,
        })?;
    if let Some(watch) = watch {
        tokio::spawn(follow_loop(Arc::downgrade(inner), watch, ready, direct));
    }
    Ok(())
}

/// Applies what the watcher (or a request, [`DirectMaps`]) hands over
/// until the pool is dropped.
async fn follow_loop(
    pool: Weak<Inner>,
    watch: MapWatch,
    ready: Arc<Notify>,
    mut direct: tokio::sync::mpsc::UnboundedReceiver<MapRead>,
) {
    loop {
        // Woken by the watcher or a request; the pause only notices a
        // dropped pool.
        let read = tokio::select! {
            () = ready.notified() => None,
            read = direct.recv() => read,
            () = tokio::time::sleep(Duration::from_secs(1)) => None,
        };
        let Some(inner) = pool.upgrade() else { break };
        if let Some(read) = read {
            inner.apply_map(read).await;
        }
        if let Some(update) = watch.latest() {
            let read = MapRead {
                topology: update.topology,
                replica_sets: update.replica_sets,
                epoch: update.version.epoch,
            };
            inner.apply_map(read).await;
        }
    }
    // Stopping the watcher joins its thread: not on a runtime worker.
    let _ = tokio::task::spawn_blocking(move || drop(watch)).await;
}

impl Inner {
    /// Moves the pool to the map `read` (its epoch, topology and the owner
    /// devices of replicated regions), unless it already runs that epoch
    /// or a newer one. Refused, with one log line, when the map moves or
    /// resizes a region, or leaves this client without paths: the pool
    /// stays on its epoch. True when the pool runs that epoch or newer
    /// afterwards.
    pub(super) async fn apply_map(self: &Arc<Self>, read: MapRead) -> bool {
        let MapRead {
            topology,
            replica_sets,
            epoch: number,
        } = read;
        let _applying = self.applying.lock().await;
        let current = self.epoch();
        if number <= current.number {
            return true;
        }
        let refuse = |why: String| {
            self.stats.maps_refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "client {}: refusing epoch {number} of pool {}'s map: {why}; staying on epoch {}",
                self.client,
                self.pool_name,
                current.number
            );
            false
        };
        let layout = match Layout::new(&topology) {
            Ok(layout) => layout,
            Err(e) => return refuse(error_chain(&e)),
        };
        if let Err(e) = check_growth(&current.layout, &layout) {
            return refuse(e.to_string());
        }
        let mut fresh = match PathTable::new(&topology, &layout, &self.client, self.options.paths) {
            Ok(fresh) => fresh,
            Err(e) => return refuse(e.to_string()),
        };
        fresh.set_owners(&replica_sets);
        let moves = server_moves(&current.layout, &layout);
        let regions = (current.layout.entries().len(), layout.entries().len());
        let (next, followed) = {
            // The table and the snapshot change together: a request never
            // sees a path of the new table without its slot.
            let mut table = lock(&self.table);
            let followed = table.follow(fresh, moves, Instant::now());
            let next = Arc::new(current.next(
                number,
                layout,
                self.custom_translator.as_ref(),
                table.paths().len(),
            ));
            *self.epoch.write().unwrap_or_else(PoisonError::into_inner) = Arc::clone(&next);
            (next, followed)
        };
        self.tlb.clear();
        self.stats.map_epochs.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            "client {}: following epoch {number} of pool {}'s map ({} regions, was {}; paths \
             added {}, retired {})",
            self.client,
            self.pool_name,
            regions.1,
            regions.0,
            followed.added.len(),
            followed.retired.len()
        );
        self.applied.notify_waiters();
        for &path in &followed.retired {
            tokio::spawn(Arc::clone(self).retire_when_idle(path));
        }
        // New paths, and (path, server) marks the new map made due, are
        // probed now.
        self.prober.notify_one();
        let staying: Vec<PathId> = (0..next.slots.len())
            .map(PathId)
            .filter(|p| !followed.added.contains(p) && !followed.retired.contains(p))
            .collect();
        for path in staying {
            tokio::spawn(Arc::clone(self).move_on(path, Arc::clone(&next)));
        }
        true
    }

    /// Waits until the pool runs epoch `at_least` or newer, at most until
    /// `deadline`; true when it does.
    async fn wait_epoch(&self, at_least: u64, deadline: tokio::time::Instant) -> bool {
        loop {
            let applied = self.applied.notified();
            if self.epoch().number >= at_least {
                return true;
            }
            if tokio::time::timeout_at(deadline, applied).await.is_err() {
                return self.epoch().number >= at_least;
            }
        }
    }

    /// Brings the pool to epoch `at_least` or newer: waits briefly for the
    /// watcher, then reads the map from etcd and has the follower apply
    /// it. True when it runs such an epoch afterwards (false on a file, or
    /// when the map was refused).
    pub(super) async fn ensure_epoch(&self, at_least: u64) -> bool {
        let now = tokio::time::Instant::now();
        if self.wait_epoch(at_least, now + WATCH_GRACE).await {
            return true;
        }
        let (
            Some(MapSource::Etcd {
                endpoints,
                pool,
                credentials,
            }),
            Some(direct),
        ) = (&self.etcd, &self.direct)
        else {
            return false;
        };
        match read_map(endpoints, pool, credentials.as_ref()).await {
            Ok((read, _)) => {
                if direct.send(read).is_ok() {
                    let deadline = tokio::time::Instant::now() + WATCH_GRACE;
                    return self.wait_epoch(at_least, deadline).await;
                }
            }
            Err(e) => tracing::warn!(
                "client {}: a device runs map epoch {at_least}, and reading it from etcd \
                 ({endpoints}) failed: {}",
                self.client,
                error_chain(&e)
            ),
        }
        self.epoch().number >= at_least
    }

    /// Says the pool's epoch on `path`'s connection again (after a
    /// STALE_MAP): the device's answer, `None` when there is no live
    /// connection to say it on (a new one says it at its opening).
    pub(super) async fn say_epoch_on(&self, path: PathId) -> Option<EpochAnswer> {
        let link = self.conn(path)?;
        link.tcp()?
            .say_epoch(self.epoch().number, ASK_TIMEOUT)
            .await
    }

    /// Tells `path`'s connection that the pool runs `epoch` now, and once
    /// its device runs it too, learns the keys of the regions it brought
    /// (the device's MAP). A device still behind is asked again with
    /// backoff. Ends early when a newer epoch takes over or the connection
    /// goes (a new one says the epoch at its opening).
    async fn move_on(self: Arc<Self>, path: PathId, epoch: Arc<Epoch>) {
        let mut pause = Duration::from_millis(20);
        for _ in 0..MOVE_ON_TRIES {
            if self.epoch().number != epoch.number {
                return;
            }
            let Some(link) = self.conn(path) else { return };
            // A RoCE link's queue pair runs the epoch it was set up at:
            // a device on a newer one refuses its requests, which breaks
            // it, and the pool sets up a new one at its own epoch.
            let Some(conn) = link.tcp() else { return };
            match conn.say_epoch(epoch.number, ASK_TIMEOUT).await {
                None => return,
                Some(EpochAnswer::Newer(theirs)) => {
                    self.ensure_epoch(theirs).await;
                    return;
                }
                Some(EpochAnswer::Runs(theirs)) if theirs < epoch.number => {}
                Some(_) => match conn.request_map(ASK_TIMEOUT).await {
                    None => return,
                    // An unfenced device runs the same map once its
                    // layout's digest is the pool's.
                    Some(map) if map.digest == epoch.layout.digest() => {
                        epoch.region_keys.learn(&map);
                        return;
                    }
                    Some(_) => {}
                },
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MOVE_ON_MAX_PAUSE);
        }
        tracing::warn!(
            "client {}: {} did not move to map epoch {} in time; requests it cannot serve are \
             sent elsewhere",
            self.client,
            self.path_name(path),
            epoch.number
        );
    }

    /// Closes `path`, which the map no longer wires, once its last request
    /// is done (unless a later epoch wires it again meanwhile).
    async fn retire_when_idle(self: Arc<Self>, path: PathId) {
        loop {
            {
                let table = lock(&self.table);
                if !table.is_retired(path) {
                    return;
                }
                if table.outstanding(path) == 0 {
                    break;
                }
            }
            tokio::time::sleep(RETIRE_CHECK).await;
        }
        if let Some(slot) = self.slot(path) {
            let mut slot = lock(&slot);
            slot.generation += 1;
            slot.conn = None;
        }
        tracing::info!(
            "client {}: closed {}, which the map no longer wires",
            self.client,
            self.path_name(path)
        );
    }
}
