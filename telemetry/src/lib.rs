//! Metrics and the admin endpoint of the pmem-fabric daemons.
//!
//! - Hot paths update [`Counter`], [`Gauge`], [`GaugeF64`] and [`Histogram`] values
//!   with relaxed atomics only; no lock is taken once a caller holds the `Arc`.
//!   The first three wrap `prometheus-client`'s metrics.
//! - A [`Registry`] names them (alone or as a labelled [`Family`]), adds metrics
//!   computed at scrape time, and renders them with `prometheus-client` in the
//!   Prometheus text exposition format, version 0.0.4. Names are validated, and
//!   HELP texts are written as given.
//! - An [`AdminServer`] serves that text on `/metrics`, next to `/healthz`, with
//!   `tiny_http` on threads of its own; [`http_get`] is the `ureq` client tests,
//!   pmemctl and the testbed use, and [`promtool_check`] lints rendered text with
//!   `promtool check metrics`.
//! - [`logging::init`] sends the daemons' `tracing` events to stderr, as text
//!   or JSON, inside a root span naming the daemon and its id.
//!
//! # Map of the crate
//!
//! | module | what it holds |
//! |---|---|
//! | `admin` | the admin HTTP endpoint: `/metrics` and `/healthz` |
//! | `client` | the blocking HTTP GET client and a metric sum over scraped text |
//! | `error` | [`RegistryError`]: why a metric was refused |
//! | `family` | labelled families of metrics ([`Family`], [`CounterTable`]) |
//! | [`logging`] | `tracing` to stderr as text or JSON; [`error_chain`] |
//! | `metric` | the metric values: counters, gauges, histograms |
//! | `process` | the process's own CPU and memory metrics |
//! | `promtool` | `promtool check metrics` over rendered text |
//! | `registry` | the registry that names, validates and renders the metrics |
//!
//! # Example
//!
//! ```
//! use telemetry::{Histogram, Registry};
//!
//! let registry = Registry::new();
//! let ops = registry.counter_family("pmem_ops_total", "Operations served.", &["op", "status"])?;
//! let latency = registry.histogram(
//!     "pmem_op_duration_seconds",
//!     "Time to serve one operation.",
//!     Histogram::latency_buckets(),
//! )?;
//!
//! // Resolve the labelled child once, outside the hot path, then only touch atomics.
//! let read_ok = ops.with(&["READ", "OK"]);
//! read_ok.inc();
//! latency.observe(0.000_3);
//!
//! assert!(registry.render().contains("pmem_ops_total{op=\"READ\",status=\"OK\"} 1\n"));
//! # Ok::<(), telemetry::RegistryError>(())
//! ```

mod admin;
mod client;
mod error;
mod family;
pub mod logging;
mod metric;
mod process;
mod promtool;
mod registry;

pub use admin::{AdminError, AdminServer, Health, HealthCheck, METRICS_CONTENT_TYPE};
pub use client::{http_get, metric_sum};
pub use error::RegistryError;
pub use family::{CounterTable, Family};
pub use logging::error_chain;
pub use metric::{Counter, Gauge, GaugeF64, Histogram, Metric};
pub use process::{cpu_seconds, register_process_metrics, thread_cpu_time};
pub use promtool::promtool_check;
pub use registry::{Registry, SampleFn};

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks for reading. Nothing here panics while holding a lock, and the data
/// behind every lock stays consistent even if a caller's callback did, so a
/// poisoned lock is used as is.
pub(crate) fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

/// Locks for writing; see [`read`] about poisoning.
pub(crate) fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}
