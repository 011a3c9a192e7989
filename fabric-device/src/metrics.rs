//! What the fabric device exports on `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proto::request::Operation;
use proto::{Opcode, Status};
use telemetry::{Counter, CounterTable, Family, Gauge, Histogram, Registry, RegistryError};

use crate::ids::LinkClass;
/// One frame in this many has its time inside the device measured: two
/// clock reads and a histogram update per frame cost more than the rest of
/// the bookkeeping.
pub const DEVICE_TIME_SAMPLE: u64 = 16;

/// Status codes whose counters are cached; rarer ones are looked up each time.
const STATUS_SLOTS: usize = 16;

/// Counters, gauges and histograms of one fabric device.
#[derive(Debug)]
pub struct DeviceMetrics {
    requests: CounterTable<{ Operation::ALL.len() }, STATUS_SLOTS>,
    /// Bytes of frames forwarded to servers.
    pub bytes_to_servers: Arc<Counter>,
    /// Bytes of frames relayed back to clients.
    pub bytes_to_clients: Arc<Counter>,
    /// Time from a frame fully read to its forward (or reply) written,
    /// for one frame in [`DEVICE_TIME_SAMPLE`].
    pub device_time: Arc<Histogram>,
    /// Frames seen, to pick the ones whose device time is measured.
    frames: AtomicU64,
    /// Time from forwarding a request to its response arriving.
    pub server_rtt: Arc<Histogram>,
    /// Requests forwarded and not yet answered.
    pub in_flight: Arc<Gauge>,
    /// Client connections open (HELLO or not).
    pub clients: Arc<Gauge>,
    /// Frames from clients that could not be parsed.
    pub malformed_frames: Arc<Counter>,
    /// Region keys asked again of a server after it refused a request.
    pub key_refreshes: Arc<Counter>,
    /// Client requests the device refused STALE_MAP itself.
    pub stale_map: Arc<Counter>,
    /// Region keys asked of a server on verbs on schedule.
    pub key_polls: Arc<Counter>,
    /// Bytes of requests held while they arrive, over all connections.
    pub request_bytes_held: Arc<Gauge>,
    /// Times a connection was not read because its next large frame did
    /// not fit the request budgets.
    pub request_budget_waits: Arc<Counter>,
    links_up: Arc<Family<Gauge>>,
    bulk_links_up: Arc<Family<Gauge>>,
    /// Regions in the current map.
    pub map_regions: Arc<Gauge>,
    /// Successful and refused reloads.
    pub reloads: Arc<Family<Counter>>,
    /// Following the map in etcd: epoch, time to apply, watch restarts,
    /// etcd errors.
    pub map: Arc<control::MapMetrics>,
    /// Client connections the device closed or refused, by reason.
    pub connections_closed: Arc<Family<Counter>>,
    /// HELLOs refused, by reason.
    pub hello_refused: Arc<Family<Counter>>,
    /// Requests for replicated regions this device does not own, answered
    /// NOT_OWNER.
    pub not_owner: Arc<Counter>,
    /// Writes (and atomics' words) sent to copies of replicated regions, by
    /// server and copy role.
    pub copy_writes: Arc<Family<Counter>>,
    /// Copies this device stopped using (marked offline).
    pub copies_offline: Arc<Counter>,
    /// Atomics of replicated regions sent to their deciding copy.
    pub atomics_decided: Arc<Counter>,
    /// Decided words written to the other copies of replicated regions.
    pub atomics_applied: Arc<Counter>,
    /// Blocks whose checksums a resync compared on two copies.
    pub resync_blocks_compared: Arc<Counter>,
    /// Blocks a resync copied to a syncing copy.
    pub resync_blocks_copied: Arc<Counter>,
    /// Bytes a resync copied to a syncing copy.
    pub resync_bytes_copied: Arc<Counter>,
    /// Copies of regions this device owns that are syncing.
    pub copies_syncing: Arc<Gauge>,
    /// Resyncs that ended with their copy serving.
    pub resyncs_finished: Arc<Counter>,
    /// Resyncs stopped before their copy served (each starts again from
    /// the first block).
    pub resyncs_stopped: Arc<Counter>,
    /// A resync's requests sent again after a server refused them
    /// STALE_MAP.
    pub resync_stale_resends: Arc<Counter>,
    /// Blocks the current pass of a region's resync has compared.
    pub resync_blocks_done: Arc<Family<Gauge>>,
    /// Blocks of a region being resynced.
    pub resync_blocks_total: Arc<Family<Gauge>>,
    /// Client requests refused because they carried an atomic's record,
    /// which only devices send.
    pub records_refused: Arc<Counter>,
    /// CPU nanoseconds of event-loop turns that spun (busy polling) and
    /// found no event.
    idle_poll_ns: Arc<AtomicU64>,
}

impl DeviceMetrics {
    /// Registers the device's metrics in `registry`.
    pub fn new(registry: Arc<Registry>) -> Result<Self, RegistryError> {
        let r = &registry;
        let idle_poll_ns = Arc::new(AtomicU64::new(0));
        let idle = Arc::clone(&idle_poll_ns);
        r.register_fn_counter(
            "fabric_device_idle_poll_seconds_total",
            "CPU time the event loop spent busy polling (--busy-poll-us) in turns that found \
             no event: a spinning device uses a whole CPU, and this is the part of it that \
             waited (process_cpu_seconds_total minus this is the CPU that forwarded).",
            &[],
            Box::new(move || vec![(vec![], idle.load(Ordering::Relaxed) as f64 / 1e9)]),
        )?;
        Ok(Self {
            idle_poll_ns,
            requests: CounterTable::new(r.counter_family(
                "fabric_device_requests_total",
                "One-sided requests answered to clients, by operation and status.",
                &["op", "status"],
            )?),
            bytes_to_servers: r.counter(
                "fabric_device_forwarded_bytes_to_servers_total",
                "Bytes of request frames forwarded to PMEM servers.",
            )?,
            bytes_to_clients: r.counter(
                "fabric_device_forwarded_bytes_to_clients_total",
                "Bytes of response frames relayed back to clients.",
            )?,
            device_time: r.histogram(
                "fabric_device_processing_seconds",
                "Time a frame spends inside the device, from fully read to written on (one frame in 16).",
                Histogram::latency_buckets(),
            )?,
            server_rtt: r.histogram(
                "fabric_device_server_round_trip_seconds",
                "Time from forwarding a request to a server to its response arriving.",
                Histogram::latency_buckets(),
            )?,
            in_flight: r.gauge(
                "fabric_device_in_flight_requests",
                "Requests forwarded to servers and not yet answered.",
            )?,
            clients: r.gauge(
                "fabric_device_connected_clients",
                "Client connections open.",
            )?,
            malformed_frames: r.counter(
                "fabric_device_malformed_frames_total",
                "Frames from clients that could not be parsed.",
            )?,
            request_bytes_held: r.gauge(
                "fabric_device_request_bytes_held",
                "Bytes of requests the device holds while they arrive (read, or announced by a frame it admitted, and not yet handed on).",
            )?,
            request_budget_waits: r.counter(
                "fabric_device_request_budget_waits_total",
                "Times a client connection was not read because its next large request did not fit its client's or the device's request budget.",
            )?,
            key_polls: r.counter(
                "fabric_device_key_polls_total",
                "Times the device asked a server on verbs for its region keys on schedule (its \
                 RNIC executes the device's requests, so no refusal says a key was rotated).",
            )?,
            key_refreshes: r.counter(
                "fabric_device_key_refreshes_total",
                "Times the device asked a server for its region keys again after the server refused a request (a key may have been rotated).",
            )?,
            stale_map: r.counter(
                "fabric_device_stale_map_total",
                "Client requests the device refused STALE_MAP itself (nothing forwarded): the \
                 connection said an older map epoch than the device's, or a newer one and the \
                 device's map lacks the address. STALE_MAP answers relayed from servers are \
                 in fabric_device_requests_total.",
            )?,
            links_up: r.gauge_family(
                "fabric_device_link_up",
                "1 when the link to a server NIC is up and agrees with the map, else 0.",
                &["server", "nic"],
            )?,
            bulk_links_up: r.gauge_family(
                "fabric_device_bulk_link_up",
                "1 when the bulk lane (requests of 64 KiB and more) to a server NIC is up, else 0.",
                &["server", "nic"],
            )?,
            frames: AtomicU64::new(0),
            map_regions: r.gauge(
                "fabric_device_map_regions",
                "Regions in the device's current address map.",
            )?,
            reloads: r.counter_family(
                "fabric_device_reloads_total",
                "Topology reloads (SIGHUP, or a new map epoch from etcd), by result.",
                &["result"],
            )?,
            map: Arc::new(control::MapMetrics::register(
                r,
                control::MapMetricNames {
                    epoch: "fabric_device_map_epoch",
                    apply_seconds: "fabric_device_map_apply_seconds",
                    watch_restarts: "fabric_device_map_watch_restarts_total",
                    etcd_errors: "fabric_device_etcd_errors_total",
                },
            )?),
            connections_closed: r.counter_family(
                "fabric_device_connections_closed_total",
                "Client connections the device closed or refused, by reason: hello_timeout (no \
                 HELLO, or with --secrets no proof, in time), idle, unframeable, draining, \
                 too_many_clients (--max-clients proven), unproven_evicted (the oldest unproven \
                 connection, for a new one past --max-unproven), too_many_unproven.",
                &["reason"],
            )?,
            hello_refused: r.counter_family(
                "fabric_device_hello_refused_total",
                "Client HELLOs refused (and their connections closed), by reason: a client \
                 the topology does not name, a second HELLO naming another client, or a \
                 client already at its connection cap.",
                &["reason"],
            )?,
            not_owner: r.counter(
                "fabric_device_not_owner_total",
                "Requests for replicated regions another device owns, answered NOT_OWNER.",
            )?,
            copy_writes: r.counter_family(
                "fabric_device_replica_writes_total",
                "Writes and atomics' decided words sent to copies of replicated regions, by \
                 server and copy role (primary or backup).",
                &["server", "role"],
            )?,
            copies_offline: r.counter(
                "fabric_device_copies_marked_offline_total",
                "Copies of replicated regions this device stopped using: their server's links \
                 went down, a request timed out, or they refused a change the others made.",
            )?,
            atomics_decided: r.counter(
                "fabric_device_replicated_atomics_decided_total",
                "COMPARE_SWAP and FETCH_ADD of replicated regions sent to their deciding copy.",
            )?,
            atomics_applied: r.counter(
                "fabric_device_replicated_atomics_applied_total",
                "Decided words of atomics written to the other copies (ATOMIC_WRITE).",
            )?,
            resync_blocks_compared: r.counter(
                "fabric_device_resync_blocks_compared_total",
                "Blocks (64 KiB) whose checksums a resync compared on the deciding copy and \
                 a syncing copy (BLOCK_SUMS).",
            )?,
            resync_blocks_copied: r.counter(
                "fabric_device_resync_blocks_copied_total",
                "Blocks a resync found different and copied from the deciding copy to a \
                 syncing copy.",
            )?,
            resync_bytes_copied: r.counter(
                "fabric_device_resync_bytes_copied_total",
                "Bytes a resync copied to syncing copies (paced by --resync-rate).",
            )?,
            copies_syncing: r.gauge(
                "fabric_device_copies_syncing",
                "Copies of the replicated regions this device owns that are syncing (take \
                 writes, answer no reads until resynced).",
            )?,
            resyncs_finished: r.counter(
                "fabric_device_resyncs_finished_total",
                "Resyncs that ended with their copy marked serving.",
            )?,
            resyncs_stopped: r.counter(
                "fabric_device_resyncs_stopped_total",
                "Resyncs stopped before their copy served (a copy lost, a request failed or \
                 refused); each starts again from the first block.",
            )?,
            resync_stale_resends: r.counter(
                "fabric_device_resync_stale_resends_total",
                "A resync's requests sent again after a server refused them STALE_MAP, once it \
                 confirmed this device's map epoch.",
            )?,
            resync_blocks_done: r.gauge_family(
                "fabric_device_resync_blocks_done",
                "Blocks the current pass of a region's resync has compared (progress: this \
                 over fabric_device_resync_blocks).",
                &["region"],
            )?,
            resync_blocks_total: r.gauge_family(
                "fabric_device_resync_blocks",
                "Blocks of a region whose copy this device resyncs.",
                &["region"],
            )?,
            records_refused: r.counter(
                "fabric_device_recorded_atomics_refused_total",
                "Client ATOMIC_WRITEs refused ACCESS_DENIED because they carried an atomic's \
                 record (RECORDED): only a fabric device records an atomic at a copy.",
            )?,
        })
    }

    /// Adds the CPU time of event-loop turns that spun and found no event.
    pub fn add_idle_poll(&self, turn: Duration) {
        let ns = u64::try_from(turn.as_nanos()).unwrap_or(u64::MAX);
        self.idle_poll_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The up/down gauge of the `lane` link to `server`'s `nic`.
    pub fn link_up(&self, server: &str, nic: &str, lane: LinkClass) -> Arc<Gauge> {
        match lane {
            LinkClass::Main => self.links_up.with(&[server, nic]),
            LinkClass::Bulk => self.bulk_links_up.with(&[server, nic]),
        }
    }

    /// Records a request answered with `status`.
    pub fn record(&self, request: Opcode, status: Status) {
        let row = Operation::from_opcode(request).map_or(usize::MAX, Operation::index);
        let code = usize::from(u16::from(status));
        self.requests
            .inc(row, code, || [request.to_string(), status.to_string()]);
    }

    /// The start time of a frame whose device time is to be measured (one in
    /// [`DEVICE_TIME_SAMPLE`]), or `None`.
    pub fn start_timing(&self) -> Option<Instant> {
        let n = self.frames.fetch_add(1, Ordering::Relaxed);
        n.is_multiple_of(DEVICE_TIME_SAMPLE).then(Instant::now)
    }

    /// Records time spent inside the device.
    pub fn observe_device_time(&self, elapsed: Duration) {
        self.device_time.observe_duration(elapsed);
    }
}
