//! A server on etcd follows the cluster map while it runs: a thread takes
//! each new map from the watcher, refuses requests for the regions the map
//! no longer places on this server (UNMAPPED; their files stay on disk: a
//! map change never deletes data), serves them again when a later map puts
//! them back, and records the epoch in its liveness record and metrics and
//! in the executor, which fences connections by it.
//!
//! With `--secrets` it also takes the principals from each new map: a fabric
//! device the map adds may connect (its key read from the keys' folder), one
//! it removes no longer may, and each client's grants and wiring are the
//! map's. Secrets never come from etcd, only who exists.
//!
//! Each new map also bounds the exactly-once windows: a client's RNIC wired
//! to an added device brings its lane, a client the map adds its number;
//! and names the owner device of each replicated region, the only device
//! whose changes a copy takes; a map that deposes an owner destroys its
//! queue pairs first (`qp_fence`).
//!
//! Regions a new map adds to this server are not served until it restarts
//! (their files are created at start).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use control::{MapUpdate, MapWatch, Registration};
use topology::{Layout, RegionId, ServerId, Topology};
use tracing::{info, warn};

use crate::exec::Executor;

/// How often the thread looks whether it was told to stop.
const STOP_CHECK: Duration = Duration::from_millis(250);

/// The thread that applies new maps; stopped when dropped.
#[derive(Debug)]
pub struct MapFollower {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MapFollower {
    /// Applies every map `watch` hands over to `executor`, the regions of
    /// server `server`, starting from `epoch`; `registration` records the
    /// epoch.
    pub fn start(
        server: ServerId,
        executor: Arc<Executor>,
        watch: MapWatch,
        registration: Option<Registration>,
        epoch: u64,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        executor.metrics().map.epoch.set(epoch as i64);
        executor.set_epoch(epoch);
        let span = tracing::Span::current();
        let thread = std::thread::Builder::new()
            .name("map-follow".to_owned())
            .spawn(move || {
                let _logs_as_the_daemon = span.entered();
                let mut running = epoch;
                while !stopping.load(Ordering::Relaxed) {
                    if let Some(update) = watch.wait(STOP_CHECK) {
                        apply(&server, &executor, &update, running);
                        running = update.version.epoch;
                        if let Some(registration) = &registration {
                            registration.set_epoch(running);
                        }
                    }
                }
                // The liveness record goes with the registration, here.
                drop(registration);
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for MapFollower {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The regions `topology` places a copy of on `server`: its own and the
/// backups its replica sets put there.
fn placed_on(topology: &Topology, server: &ServerId) -> BTreeSet<RegionId> {
    topology
        .replica_sets()
        .into_iter()
        .filter(|set| set.on(server).is_some())
        .map(|set| set.region)
        .collect()
}

/// Withdraws the served regions `update` no longer places here and serves
/// again those it places here again, logging each change.
fn apply(server: &ServerId, executor: &Executor, update: &MapUpdate, running: u64) {
    let epoch = update.version.epoch;
    let placed = placed_on(&update.topology, server);
    if update.topology.server(server).is_none() {
        warn!("map epoch={epoch} no longer names server {server}: every region is refused");
    }
    for region in executor.regions() {
        let id = &region.entry.region_id;
        let withdrawn = !placed.contains(id);
        if !executor.set_withdrawn(region.entry.region, withdrawn, epoch) {
            continue;
        }
        if withdrawn {
            warn!(
                "map epoch={epoch} no longer places region {id} on this server: its requests \
                 are refused UNMAPPED; its file is kept"
            );
        } else {
            info!("map epoch={epoch} places region {id} on this server again: serving it");
        }
    }
    follow_principals(executor, &update.topology, epoch);
    follow_identities(executor, &update.topology, epoch);
    let deposed = executor.follow_owners(&update.replica_sets);
    if !deposed.is_empty() {
        // Before the server runs the epoch (and so confirms it to the new
        // owner), nothing of the old owner's may reach memory over RDMA.
        let closed = executor.qp_fence().fence(epoch, &deposed);
        info!(
            "map epoch={epoch} gives regions held here to new owners (deposed: {}): {closed} \
             queue pairs of connections at older epochs or of the deposed owners destroyed",
            deposed.join(", ")
        );
    }
    // Connections are judged against the new epoch once its regions and
    // principals are.
    executor.set_epoch(epoch);
    executor.metrics().map.applied(update);
    info!("map epoch={epoch} applied (was epoch={running})");
}

/// Keeps exactly-once windows for the identities the map at `epoch` names,
/// and says when the window file has no room for all of them.
fn follow_identities(executor: &Executor, topology: &Topology, epoch: u64) {
    let (named, room) = executor.follow_identities(topology);
    if let Some(room) = room.filter(|&room| named > room) {
        warn!(
            "map epoch={epoch} names {named} exactly-once identities (clients and their \
             RNICs); the window file has room for {room}: atomics of identities beyond it are \
             refused until this server restarts, which grows the file"
        );
    }
}

/// With `--secrets`: admits the principals of the map at `epoch` (see
/// [`Executor::follow_principals`]) and says which devices came and went.
fn follow_principals(executor: &Executor, topology: &Topology, epoch: u64) {
    let layout = match Layout::new(topology) {
        Ok(layout) => layout,
        Err(e) => {
            warn!(
                "map epoch={epoch}: cannot lay the map out ({}); the principals of the last \
                 map stay",
                telemetry::logging::error_chain(&e)
            );
            return;
        }
    };
    let followed = match executor.follow_principals(topology, &layout, epoch) {
        None => return,
        Some(Ok(followed)) => followed,
        Some(Err(e)) => {
            warn!(
                "map epoch={epoch}: cannot read the principals' keys ({}); the principals of \
                 the last map stay",
                telemetry::logging::error_chain(&e)
            );
            return;
        }
    };
    let dir = followed.dir.display();
    for device in followed.added() {
        info!("map epoch={epoch}: fabric device {device} may connect (its key from {dir})");
    }
    for device in followed.revoked() {
        warn!(
            "map epoch={epoch}: fabric device {device} is no longer in the map: its key is \
             dropped; its open links are answered STALE_MAP, nothing runs for them"
        );
    }
    for (device, why) in &followed.unreadable {
        warn!(
            "map epoch={epoch}: fabric device {device} cannot connect: {}",
            telemetry::logging::error_chain(why)
        );
    }
}
