//! What a daemon that follows the map exports on `/metrics`: the epoch it
//! runs, how long applying a change took, watch restarts and etcd errors.
//! Both daemons register the same four under names of their own
//! (`fabric_device_map_epoch`, `pmem_server_map_epoch`, …), given whole
//! so that each daemon's metrics module names every metric it exports.

use std::sync::Arc;

use telemetry::{Counter, Gauge, Histogram, Registry, RegistryError};

use crate::watch::{MapUpdate, WatchObserver};

/// The map-following metrics of one daemon.
#[derive(Debug)]
pub struct MapMetrics {
    /// The epoch of the map the daemon runs (0: a file, no epoch).
    pub epoch: Arc<Gauge>,
    /// Time from the watcher learning of a map to the daemon running it.
    pub apply_seconds: Arc<Histogram>,
    /// Watches set up again after etcd was lost or a compaction.
    pub watch_restarts: Arc<Counter>,
    /// Requests to etcd that failed.
    pub etcd_errors: Arc<Counter>,
}

/// The names a daemon gives the four metrics.
#[derive(Debug, Clone, Copy)]
pub struct MapMetricNames {
    /// The epoch gauge (`…_map_epoch`).
    pub epoch: &'static str,
    /// The apply-time histogram (`…_map_apply_seconds`).
    pub apply_seconds: &'static str,
    /// The watch restarts counter (`…_map_watch_restarts_total`).
    pub watch_restarts: &'static str,
    /// The etcd errors counter (`…_etcd_errors_total`).
    pub etcd_errors: &'static str,
}

impl MapMetrics {
    /// Registers the metrics under `names` in `registry`.
    pub fn register(registry: &Registry, names: MapMetricNames) -> Result<Self, RegistryError> {
        Ok(Self {
            epoch: registry.gauge(
                names.epoch,
                "Epoch of the cluster map this daemon runs (0: a topology file, no epoch).",
            )?,
            apply_seconds: registry.histogram(
                names.apply_seconds,
                "Time from the watcher learning of a new map in etcd to the daemon running it.",
                Histogram::latency_buckets(),
            )?,
            watch_restarts: registry.counter(
                names.watch_restarts,
                "Watches of the map set up again, after etcd was lost or the watch fell behind \
                 a compaction.",
            )?,
            etcd_errors: registry.counter(
                names.etcd_errors,
                "Requests to etcd by the map watcher that failed (etcd unreachable, a watch \
                 broken).",
            )?,
        })
    }

    /// Records that `update` now runs.
    pub fn applied(&self, update: &MapUpdate) {
        self.epoch.set(update.version.epoch as i64);
        self.apply_seconds
            .observe(update.seen.elapsed().as_secs_f64());
    }

    /// An observer for [`crate::MapWatch`] that counts restarts and errors
    /// here and calls `wake` when a new map waits.
    pub fn observer(self: &Arc<Self>, wake: Box<dyn Fn() + Send + Sync>) -> Arc<dyn WatchObserver> {
        Arc::new(Observer {
            metrics: Arc::clone(self),
            wake,
        })
    }
}

/// Counts into [`MapMetrics`] and wakes the daemon's loop.
struct Observer {
    metrics: Arc<MapMetrics>,
    wake: Box<dyn Fn() + Send + Sync>,
}

impl WatchObserver for Observer {
    fn update_ready(&self) {
        (self.wake)();
    }

    fn watch_restarted(&self) {
        self.metrics.watch_restarts.inc();
    }

    fn etcd_error(&self) {
        self.metrics.etcd_errors.inc();
    }
}
