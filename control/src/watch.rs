//! Following the cluster map while a daemon runs, without async code in
//! the daemon: a thread with a small runtime of its own watches the map's
//! key and hands every new valid map to the daemon's event loop.
//!
//! - The watch continues from the last revision the daemon knows, so no
//!   change is missed between reading the map at start and watching it.
//! - A watch that fell behind a compaction (etcd no longer has the
//!   revisions it needs), or was lost with its connection, is replaced by
//!   a fresh read of the map and a new watch from there; a periodic
//!   re-read is the safety net for anything else.
//! - A map that does not parse or validate, or whose epoch does not
//!   advance, is refused: the daemon keeps the last valid map and the
//!   refusal is logged once per bad revision (key, epoch, problem).
//! - etcd unreachable: the daemon keeps serving on the map it has; the
//!   watcher reconnects with backoff and says so once when it loses etcd
//!   and once when it is back, never once per attempt.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use etcd_client::EventType;
use telemetry::logging::error_chain;
use topology::Topology;

use crate::credentials::Credentials;
use crate::endpoints::Endpoints;
use crate::error::ControlError;
use crate::keys::Keys;
use crate::map::ClusterMap;
use crate::plane::ControlPlane;

/// How often the map is read again even though the watch said nothing.
pub const REREAD_PERIOD: Duration = Duration::from_secs(30);
/// The first wait before reaching etcd again; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(250);
/// The longest wait between two attempts to reach etcd.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How often the watcher looks whether it was told to stop.
const STOP_CHECK: Duration = Duration::from_millis(100);

/// Which map a daemon runs: its epoch and the etcd revision it was
/// written at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapVersion {
    /// The map's epoch.
    pub epoch: u64,
    /// The etcd `mod_revision` of the map's key.
    pub revision: i64,
}

/// A new map, loaded and validated, for the daemon to apply.
#[derive(Debug, Clone)]
pub struct MapUpdate {
    /// The topology.
    pub topology: Topology,
    /// The states of replicated regions' copies (empty when none is).
    pub replica_sets: Vec<crate::replica_state::ReplicaSetRecord>,
    /// Its epoch and revision.
    pub version: MapVersion,
    /// When the watcher learnt of it (the start of "time to apply").
    pub seen: Instant,
}

/// What the watcher tells the daemon besides new maps; every method
/// defaults to nothing.
pub trait WatchObserver: Send + Sync {
    /// A new map is waiting in [`MapWatch::latest`]: wake the event loop.
    fn update_ready(&self) {}
    /// A watch was set up again (after etcd was lost, or after it fell
    /// behind a compaction).
    fn watch_restarted(&self) {}
    /// A request to etcd failed (etcd unreachable, a watch broken).
    fn etcd_error(&self) {}
}

/// An observer that wants nothing but new maps.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quiet;

impl WatchObserver for Quiet {}

/// The thread that follows one pool's map; stopped when dropped.
#[derive(Debug)]
pub struct MapWatch {
    updates: mpsc::Receiver<MapUpdate>,
    stop: Arc<AtomicBool>,
    /// Set by [`MapWatch::reread_now`], taken by the watcher.
    reread: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MapWatch {
    /// Follows the map of pool `pool` at `endpoints` (as the etcd user of
    /// `credentials` when given) from after `from` (what the daemon runs),
    /// re-reading it every `reread`.
    pub fn start(
        endpoints: Endpoints,
        pool: &str,
        credentials: Option<Credentials>,
        from: MapVersion,
        reread: Duration,
        observer: Arc<dyn WatchObserver>,
    ) -> Result<Self, ControlError> {
        let (sender, updates) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let reread_asked = Arc::new(AtomicBool::new(false));
        let mut follower = Follower {
            keys: Keys::of(pool),
            pool: pool.to_owned(),
            endpoints,
            credentials,
            applied: from,
            seen_revision: from.revision,
            refused_revision: 0,
            lost: false,
            reread,
            sender,
            observer,
            stop: Arc::clone(&stop),
            reread_asked: Arc::clone(&reread_asked),
        };
        // The watcher logs under the daemon's span (its name and id).
        let span = tracing::Span::current();
        let thread = std::thread::Builder::new()
            .name("etcd-map-watch".to_owned())
            .spawn(move || span.in_scope(|| follower.run()))
            .map_err(|source| ControlError::Runtime { source })?;
        Ok(Self {
            updates,
            stop,
            reread: reread_asked,
            thread: Some(thread),
        })
    }

    /// Asks the watcher to read the map now rather than wait for the next
    /// watch event or periodic re-read: the daemon learnt from a peer that
    /// a newer epoch exists. A newer valid map then comes through
    /// [`MapWatch::latest`] as any other; asking again before the read is
    /// done asks once.
    pub fn reread_now(&self) {
        self.reread.store(true, Ordering::Relaxed);
    }

    /// The newest map waiting, if any (older ones waiting are skipped: a
    /// daemon only needs the latest).
    pub fn latest(&self) -> Option<MapUpdate> {
        self.updates.try_iter().last()
    }

    /// Waits up to `limit` for a new map, then returns the newest waiting.
    pub fn wait(&self, limit: Duration) -> Option<MapUpdate> {
        let first = self.updates.recv_timeout(limit).ok()?;
        Some(self.latest().unwrap_or(first))
    }
}

impl Drop for MapWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Returns once `stop` is set.
async fn until_stopped(stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(STOP_CHECK).await;
    }
}

/// Why a watch session ended.
enum Ended {
    /// Told to stop, or nobody listens any more.
    Stopped,
    /// The watch fell behind a compaction: read the map again.
    Compacted(i64),
}

/// The watcher thread's state.
struct Follower {
    keys: Keys,
    pool: String,
    endpoints: Endpoints,
    credentials: Option<Credentials>,
    /// The map the daemon runs (or was handed last).
    applied: MapVersion,
    /// The newest store revision the watch has seen: the next watch starts
    /// after it.
    seen_revision: i64,
    /// The last revision refused, so it is logged once.
    refused_revision: i64,
    /// etcd is lost: said once, and once more when it is back.
    lost: bool,
    reread: Duration,
    sender: mpsc::Sender<MapUpdate>,
    observer: Arc<dyn WatchObserver>,
    stop: Arc<AtomicBool>,
    /// The daemon asked for a read of the map now.
    reread_asked: Arc<AtomicBool>,
}

impl Follower {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn run(&mut self) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => {
                tracing::error!(
                    "cannot start the map watcher ({}); this daemon will not follow changes of \
                     the map",
                    error_chain(&e)
                );
                return;
            }
        };
        runtime.block_on(self.follow());
    }

    /// Sessions one after the other, with backoff after failures, until
    /// told to stop.
    async fn follow(&mut self) {
        let mut backoff = MIN_BACKOFF;
        let mut first = true;
        let mut reread_now = false;
        while !self.stopping() {
            if !first {
                self.observer.watch_restarted();
            }
            first = false;
            // Stop at once, even in the middle of reaching an etcd that
            // does not answer.
            let stop = Arc::clone(&self.stop);
            let outcome = tokio::select! {
                outcome = self.session(reread_now) => outcome,
                () = until_stopped(&stop) => return,
            };
            match outcome {
                Ok(Ended::Stopped) => return,
                Ok(Ended::Compacted(compacted)) => {
                    tracing::warn!(
                        "the map watch on etcd fell behind a compaction (revision {} is gone, \
                         etcd keeps from {compacted}); reading the map again",
                        self.seen_revision + 1
                    );
                    reread_now = true;
                    backoff = MIN_BACKOFF;
                }
                Err(e) => {
                    self.observer.etcd_error();
                    if !self.lost {
                        self.lost = true;
                        tracing::warn!(
                            "lost the map watch on etcd ({}): {}; serving on epoch {} and \
                             reconnecting with backoff (up to {MAX_BACKOFF:?})",
                            self.endpoints,
                            error_chain(&e),
                            self.applied.epoch
                        );
                    }
                    // After an outage the watch resumes from the last
                    // revision seen; a compaction meanwhile is caught there.
                    reread_now = false;
                    self.pause(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// Sleeps `how_long`, or less when told to stop.
    async fn pause(&self, how_long: Duration) {
        let until = Instant::now() + how_long;
        while !self.stopping() && Instant::now() < until {
            tokio::time::sleep(STOP_CHECK.min(until - Instant::now())).await;
        }
    }

    /// One connection: read the map first when asked to, then watch from
    /// the last revision seen until the watch ends.
    async fn session(&mut self, reread_now: bool) -> Result<Ended, ControlError> {
        let mut plane =
            ControlPlane::connect(&self.endpoints, &self.pool, self.credentials.as_ref()).await?;
        if reread_now && self.reread_map(&mut plane).await? {
            return Ok(Ended::Stopped);
        }
        let mut stream = plane.watch_map(self.seen_revision + 1).await?;
        if self.lost {
            self.lost = false;
            tracing::info!(
                "following the map on etcd again ({}), from revision {}",
                self.endpoints,
                self.seen_revision + 1
            );
        }
        let mut next_reread = Instant::now() + self.reread;
        loop {
            if self.stopping() {
                return Ok(Ended::Stopped);
            }
            let asked = self.reread_asked.swap(false, Ordering::Relaxed);
            if asked || Instant::now() >= next_reread {
                next_reread = Instant::now() + self.reread;
                if self.reread_map(&mut plane).await? {
                    return Ok(Ended::Stopped);
                }
            }
            let message = tokio::select! {
                message = stream.message() => message,
                () = tokio::time::sleep(STOP_CHECK) => continue,
            };
            let response = message
                .map_err(|source| ControlError::Etcd {
                    what: "watch of the map",
                    source,
                })?
                .ok_or_else(|| ControlError::Etcd {
                    what: "watch of the map",
                    source: etcd_client::Error::WatchError("etcd ended the watch".to_owned()),
                })?;
            if response.compact_revision() > 0 {
                return Ok(Ended::Compacted(response.compact_revision()));
            }
            if response.canceled() {
                return Err(ControlError::Etcd {
                    what: "watch of the map",
                    source: etcd_client::Error::WatchError(format!(
                        "etcd cancelled the watch: {}",
                        response.cancel_reason()
                    )),
                });
            }
            for event in response.events() {
                let Some(kv) = event.kv() else { continue };
                let revision = kv.mod_revision();
                match event.event_type() {
                    EventType::Put => {
                        if self.consider(kv.value(), revision) {
                            return Ok(Ended::Stopped);
                        }
                    }
                    EventType::Delete => self.refuse(
                        revision,
                        format_args!("the map was deleted (revision {revision})"),
                    ),
                }
                self.seen_revision = self.seen_revision.max(revision);
            }
            if let Some(header) = response.header() {
                self.seen_revision = self.seen_revision.max(header.revision());
            }
        }
    }

    /// Reads the map and considers it; true when nobody listens any more.
    async fn reread_map(&mut self, plane: &mut ControlPlane) -> Result<bool, ControlError> {
        let (kv, revision) = plane.fetch_map().await?;
        let gone = match kv {
            Some((value, mod_revision)) => self.consider(&value, mod_revision),
            None => {
                self.refuse(revision, format_args!("there is no map any more"));
                false
            }
        };
        self.seen_revision = self.seen_revision.max(revision);
        Ok(gone)
    }

    /// Hands the map written at `revision` to the daemon if it is new and
    /// valid; refuses it otherwise. True when nobody listens any more.
    fn consider(&mut self, value: &[u8], revision: i64) -> bool {
        if revision <= self.applied.revision || revision == self.refused_revision {
            return false;
        }
        let key = self.keys.map();
        let map: ClusterMap = match serde_json::from_slice(value) {
            Ok(map) => map,
            Err(e) => {
                self.refuse(
                    revision,
                    format_args!("not a cluster map document ({e}) at revision {revision}"),
                );
                return false;
            }
        };
        let topology = match map.topology_at(&key) {
            Ok(topology) => topology,
            Err(e) => {
                self.refuse(revision, format_args!("{e} (revision {revision})"));
                return false;
            }
        };
        let running = self.applied.epoch;
        if map.epoch <= running {
            self.refuse(
                revision,
                format_args!(
                    "epoch {} at revision {revision} does not advance past epoch {running}",
                    map.epoch
                ),
            );
            return false;
        }
        let version = MapVersion {
            epoch: map.epoch,
            revision,
        };
        let update = MapUpdate {
            topology,
            replica_sets: map.replica_sets,
            version,
            seen: Instant::now(),
        };
        if self.sender.send(update).is_err() {
            return true;
        }
        self.applied = version;
        self.observer.update_ready();
        false
    }

    /// Logs once why the map at `revision` is not followed.
    fn refuse(&mut self, revision: i64, why: std::fmt::Arguments<'_>) {
        if revision == self.refused_revision {
            return;
        }
        self.refused_revision = revision;
        tracing::warn!(
            "refusing the map at etcd {}: {why}; keeping epoch {}",
            self.keys.map(),
            self.applied.epoch
        );
    }
}
