//! The server's metrics, resolved once so the data path only touches atomics.

use std::sync::Arc;
use std::time::Duration;

use proto::Status;
use proto::request::Operation;
use telemetry::{Counter, CounterTable, Family, Gauge, Histogram, Registry, RegistryError};

/// Status codes whose counters are cached; rarer ones are looked up each time.
const STATUS_SLOTS: usize = 16;

/// Counters and histograms of one pmem-server.
#[derive(Debug)]
pub struct ServerMetrics {
    registry: Arc<Registry>,
    ops: CounterTable<{ Operation::ALL.len() }, STATUS_SLOTS>,
    latency: [Arc<Histogram>; Operation::ALL.len()],
    /// Payload bytes received in WRITE / WRITE_PERSIST requests.
    pub bytes_in: Arc<Counter>,
    /// RDMA queue pairs set up by fabric devices and still open.
    pub queue_pairs: Arc<Gauge>,
    /// Payload bytes sent in READ responses.
    pub bytes_out: Arc<Counter>,
    /// Requests being executed right now.
    pub in_flight: Arc<Gauge>,
    /// Open data connections.
    pub connections: Arc<Gauge>,
    /// Data connections accepted since start.
    pub connections_total: Arc<Counter>,
    /// Connections refused because the limit was reached.
    pub connections_refused: Arc<Counter>,
    /// Connections closed because the peer stayed silent, by reason
    /// (`hello_timeout`, `idle`).
    pub connections_closed: Arc<Family<Counter>>,
    /// Frames that could not be parsed.
    pub malformed_frames: Arc<Counter>,
    /// Exactly-once atomics answered from the window instead of applied.
    pub replays: Arc<Counter>,
    /// Exactly-once requests refused, by reason.
    pub exactly_once_refused: Arc<Family<Counter>>,
    /// Connections refused at the gate (`--secrets`), by reason.
    pub auth_failures: Arc<Family<Counter>>,
    /// Requests of authenticated peers refused ACCESS_DENIED for their
    /// client's grants, by reason.
    pub denied: Arc<Family<Counter>>,
    /// Blocks scrubbed, by region and result (`verified`, `recorded`,
    /// `unwatched`, `mismatch`).
    pub scrubbed_blocks: Arc<Family<Counter>>,
    /// Blocks whose current checksum was sent (BLOCK_SUMS), by region.
    pub summed_blocks: Arc<Family<Counter>>,
    /// Extents zeroed as a key was installed on them (allocations).
    pub extents_zeroed: Arc<Counter>,
    /// WRITE and WRITE_PERSIST requests stored with non-temporal stores
    /// because they asked for it (the NON_TEMPORAL flag).
    pub non_temporal_writes: Arc<Counter>,
    /// Following the map in etcd: epoch, time to apply, watch restarts,
    /// etcd errors.
    pub map: Arc<control::MapMetrics>,
    /// Requests refused UNMAPPED because the map no longer places their
    /// region on this server.
    pub withdrawn_refused: Arc<Counter>,
    /// Requests refused STALE_MAP: their connection runs another map epoch.
    pub stale_map: Arc<Counter>,
    /// Changes of a replicated region refused NOT_OWNER: the fabric device
    /// is not the region's owner in the server's map.
    pub not_owner: Arc<Counter>,
}

impl ServerMetrics {
    /// Registers the server's metrics in `registry`.
    pub fn new(registry: Arc<Registry>) -> Result<Self, RegistryError> {
        let r = &registry;
        let ops = r.counter_family(
            "pmem_server_operations_total",
            "One-sided operations executed, by operation and status.",
            &["op", "status"],
        )?;
        let latency_family = r.histogram_family(
            "pmem_server_operation_duration_seconds",
            "Time to execute one operation, persistence included.",
            &["op"],
            Histogram::latency_buckets(),
        )?;
        let latency = Operation::ALL.map(|op| latency_family.with(&[&op.to_string()]));
        Ok(Self {
            bytes_in: r.counter(
                "pmem_server_received_bytes_total",
                "Payload bytes received in WRITE and WRITE_PERSIST requests.",
            )?,
            bytes_out: r.counter(
                "pmem_server_sent_bytes_total",
                "Payload bytes sent in READ responses.",
            )?,
            in_flight: r.gauge("pmem_server_in_flight_requests", "Requests being executed.")?,
            connections: r.gauge("pmem_server_connections", "Open data connections.")?,
            queue_pairs: r.gauge(
                "pmem_server_queue_pairs",
                "RDMA queue pairs fabric devices set up on verbs NICs, open now.",
            )?,
            connections_total: r.counter(
                "pmem_server_accepted_connections_total",
                "Data connections accepted.",
            )?,
            connections_refused: r.counter(
                "pmem_server_refused_connections_total",
                "Data connections refused because --max-connections proven connections (all, \
                 with --insecure) were open.",
            )?,
            connections_closed: r.counter_family(
                "pmem_server_connections_closed_total",
                "Data connections the server closed, by reason: hello_timeout (not proven, or \
                 without --secrets no frame, in time), idle (the peer stayed silent), \
                 unframeable (a bad frame header, or with --secrets a frame larger than 4 KiB \
                 before the peer proved its key), unproven_evicted (the oldest unproven \
                 connection, for a new one past --max-unproven).",
                &["reason"],
            )?,
            malformed_frames: r.counter(
                "pmem_server_malformed_frames_total",
                "Frames that could not be parsed.",
            )?,
            replays: r.counter(
                "pmem_server_exactly_once_replays_total",
                "Exactly-once atomics answered from the result window instead of applied again.",
            )?,
            exactly_once_refused: r.counter_family(
                "pmem_server_exactly_once_refused_total",
                "Exactly-once atomics refused before running, by reason: unknown_identity (not a \
                 client and lane of the topology), foreign_identity (another client's number than \
                 the proven peer's, or the client a device acts for), conflict (a recorded \
                 identity reused by a different request), reserved_seq, window_full.",
                &["reason"],
            )?,
            auth_failures: r.counter_family(
                "pmem_server_auth_failures_total",
                "Connections closed because the peer did not prove its key (with --secrets), \
                 by reason: unknown principal, bad proof, anything sent before the proof, or \
                 revoked (a fabric device proven before that a new map no longer names).",
                &["reason"],
            )?,
            denied: r.counter_family(
                "pmem_server_denied_requests_total",
                "Requests refused ACCESS_DENIED, by reason: bad_key (a key that is not the \
                 region's or the extent's), not_operator (a key rotation asked by someone \
                 else), and with --secrets when the client they are for has no grant for the \
                 range: not_granted, unknown_client, no_client (a device that did not say \
                 whom it forwards for), on_behalf_from_client, operator (operators rotate \
                 keys, they do not touch data), not_operator_or_device (block checksums asked by a \
                 client), record_from_client (an ATOMIC_WRITE carrying an atomic's record, \
                 which only fabric devices send); and changes to the allocator's records: \
                 not_owner (another client's record), extent_in_use (a bitmap bit of a \
                 keyed or reserved extent), bad_record (a word that is no record).",
                &["reason"],
            )?,
            scrubbed_blocks: r.counter_family(
                "pmem_server_scrubbed_blocks_total",
                "Region blocks checked by checksum scrubs (pmemctl scrub --checksums), by region \
                 and result: verified (matched its checksum), recorded (checksum recorded: first \
                 scrub since start, or written since), unwatched (written over RDMA, not \
                 checked), mismatch (changed without a write the server saw).",
                &["region", "result"],
            )?,
            summed_blocks: r.counter_family(
                "pmem_server_summed_blocks_total",
                "Region blocks whose checksum was computed now and sent to an operator or a \
                 fabric device comparing copies of a replicated region (BLOCK_SUMS), by region.",
                &["region"],
            )?,
            extents_zeroed: r.counter(
                "pmem_server_extents_zeroed_total",
                "Extents zeroed as an allocation installed its key on them.",
            )?,
            non_temporal_writes: r.counter(
                "pmem_server_non_temporal_writes_total",
                "WRITE and WRITE_PERSIST requests stored with non-temporal stores, around the \
                 CPU cache, because the client asked for it (NON_TEMPORAL flag).",
            )?,
            map: Arc::new(control::MapMetrics::register(
                r,
                control::MapMetricNames {
                    epoch: "pmem_server_map_epoch",
                    apply_seconds: "pmem_server_map_apply_seconds",
                    watch_restarts: "pmem_server_map_watch_restarts_total",
                    etcd_errors: "pmem_server_etcd_errors_total",
                },
            )?),
            withdrawn_refused: r.counter(
                "pmem_server_withdrawn_region_requests_total",
                "Requests refused UNMAPPED because the cluster map no longer places their \
                 region on this server (its file is kept).",
            )?,
            stale_map: r.counter(
                "pmem_server_stale_map_total",
                "Requests refused STALE_MAP, not executed: their connection said an older map \
                 epoch than the server's, or a newer one and the server does not serve the \
                 region.",
            )?,
            not_owner: r.counter(
                "pmem_server_not_owner_total",
                "Changes of a copy of a replicated region refused NOT_OWNER, not executed: the \
                 fabric device that sent them (proven by its key) is not the region's owner in \
                 the server's map (an owner another device has taken over from).",
            )?,
            latency,
            ops: CounterTable::new(ops),
            registry,
        })
    }

    /// The registry the metrics live in.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Records one executed operation.
    pub fn record(&self, op: Operation, status: Status, elapsed: Duration) {
        let code = usize::from(u16::from(status));
        self.ops
            .inc(op.index(), code, || [op.to_string(), status.to_string()]);
        self.latency[op.index()].observe_duration(elapsed);
    }
}
