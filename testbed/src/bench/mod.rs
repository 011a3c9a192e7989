//! `testbed bench`: pmem-fabric measured against the network floor and
//! against what users would pick instead, in one run on one machine. Every
//! figure that matters is a ratio of two numbers taken by the same command.

pub mod auth;
pub mod cache_policy;
pub mod census;
pub mod client;
pub mod memory;
pub mod open_files;
pub mod peers;
pub mod replicated;
pub mod roce;
pub mod rounds;
mod summary;
pub mod waiting;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use proto::request::Target;
use serde::{Deserialize, Serialize};
use testkit::FabricSpec;
use topology::secrets::{Principal, read_key};
use topology::{Layout, Topology};

use crate::fabric::launch::{DaemonKind, Fabric, LaunchOptions};
use crate::fabric::loopback::loopback_topology;
use crate::report::{LatencyHistogram, OpStats, RunReport};
use client::{BenchConn, BenchOp, Pipelining, Shape};
use peers::{Quantiles, RedisConfig, RedisResult, RedisServer};
pub use summary::markdown;
use waiting::Waiting;

/// How long and how hard each measurement runs.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Plan {
    /// Length of each timed measurement.
    pub seconds: f64,
    /// Most latency samples per case.
    pub samples: usize,
    /// Client connections for throughput (same for redis).
    pub clients: usize,
    /// Requests in flight per connection (redis pipeline).
    pub depth: usize,
    /// Client counts for the throughput curve.
    pub client_steps: [usize; 3],
    /// Requests redis-benchmark sends per test.
    pub redis_requests: u64,
    /// The fabric device's `--busy-poll-us`: how long it keeps polling its
    /// sockets after the last event before it sleeps. A switch node has a
    /// core of its own to spin on; here the spinning device shares two
    /// vCPUs with the client and the server and still wins, because a
    /// sleeping vCPU on this VM takes tens of microseconds to wake.
    #[serde(default)]
    pub device_busy_poll_us: u64,
    /// Idle client connections opened, with their key proven, to measure
    /// the device's memory per connection (`--idle-connections`).
    #[serde(default)]
    pub idle_connections: usize,
    /// Rounds of every tracked ratio, the main pass included (see
    /// [`rounds`]).
    #[serde(default)]
    pub rounds: usize,
}

impl Plan {
    /// Long enough to cover a WRITE_PERSIST's disk wait (~125 µs here) with
    /// room to spare: 100 µs already gains most of the throughput, 1 ms
    /// also the persist latency.
    const DEVICE_BUSY_POLL_US: u64 = 1000;

    /// The full bench, or the short smoke run.
    pub fn new(quick: bool) -> Self {
        if quick {
            Self {
                seconds: 0.3,
                samples: 2_000,
                clients: 2,
                depth: 8,
                client_steps: [1, 2, 2],
                redis_requests: 20_000,
                device_busy_poll_us: Self::DEVICE_BUSY_POLL_US,
                idle_connections: 100,
                rounds: 2,
            }
        } else {
            Self {
                seconds: 3.0,
                samples: 50_000,
                clients: 4,
                depth: 16,
                client_steps: [1, 2, 4],
                redis_requests: 400_000,
                device_busy_poll_us: Self::DEVICE_BUSY_POLL_US,
                idle_connections: 10_000,
                rounds: 5,
            }
        }
    }

    fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.seconds)
    }

    /// The flags of every bench fabric device: busy polling, and room for
    /// the idle connections, all opened as one client.
    fn device_args(&self) -> Vec<String> {
        let connections = (self.idle_connections + 16).to_string();
        vec![
            "--busy-poll-us".into(),
            self.device_busy_poll_us.to_string(),
            "--max-clients".into(),
            connections.clone(),
            "--max-connections-per-client".into(),
            connections,
        ]
    }
}

/// What the command line changes in the plan.
#[derive(Debug, Clone, Copy, Default)]
pub struct Overrides {
    /// Rounds of every ratio (`--rounds`).
    pub rounds: Option<usize>,
    /// Idle client connections for the memory figure
    /// (`--idle-connections`).
    pub idle_connections: Option<usize>,
}

/// One pmem-fabric latency case.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LatencyCase {
    /// `direct` or `fabric`.
    pub path: String,
    /// Operation.
    pub op: String,
    /// Bytes.
    pub size: u32,
    /// The round trips.
    pub quantiles: Quantiles,
    /// Whether the bench client polled its socket for the responses
    /// ([`Waiting::Spin`]) instead of sleeping in a blocking read.
    #[serde(default)]
    pub client_spins: bool,
    /// pmem-server CPU seconds per million operations.
    #[serde(default)]
    pub server_cpu_s_per_million: Option<f64>,
    /// fabric-device CPU seconds per million operations (fabric path only).
    #[serde(default)]
    pub device_cpu_s_per_million: Option<f64>,
}

/// One throughput or bandwidth figure.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RateCase {
    /// `direct`, `fabric` or `redis`.
    pub system: String,
    /// Operation.
    pub op: String,
    /// Bytes per operation.
    pub size: u64,
    /// Connections.
    pub clients: usize,
    /// In flight per connection.
    pub depth: usize,
    /// Operations per second.
    pub ops_per_s: f64,
    /// Bytes per second.
    pub bytes_per_s: f64,
    /// Server (pmem-server or redis-server) CPU seconds per million
    /// operations.
    pub server_cpu_s_per_million: Option<f64>,
    /// fabric-device CPU seconds per million operations (fabric path only).
    pub device_cpu_s_per_million: Option<f64>,
    /// The same without the event-loop turns that busy polled and found no
    /// event (`fabric_device_idle_poll_seconds_total`): the CPU that
    /// forwarded.
    #[serde(default)]
    pub device_busy_cpu_s_per_million: Option<f64>,
}

/// Everything `testbed bench` measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchReport {
    /// Short smoke run or the full bench.
    pub quick: bool,
    /// How it ran.
    pub plan: Plan,
    /// CPUs of the machine.
    pub cpus: usize,
    /// sockperf ping-pong round trips by message size, unpinned: the
    /// scheduler places client and server as it places the fabric's
    /// processes, so this is the floor the ratios use.
    pub floor_rtt: BTreeMap<u32, Quantiles>,
    /// sockperf 64 B with client and server pinned to the same CPU: the
    /// floor without a cross-CPU wake-up (for context; on this VM a wake-up
    /// of an idle CPU costs tens of microseconds).
    pub floor_rtt_same_cpu: Quantiles,
    /// sockperf 64 B with both ends polling their sockets
    /// (`--nonblocked`): the floor without wake-ups, for the device spins.
    #[serde(default)]
    pub floor_rtt_spinning: Option<Quantiles>,
    /// iperf3, one stream, bytes per second.
    pub floor_bw_bytes_per_s: f64,
    /// pmem-fabric round trips at queue depth 1.
    pub latency: Vec<LatencyCase>,
    /// Throughput and bandwidth of every system.
    pub rates: Vec<RateCase>,
    /// redis GET/SET and redis-aof SET results.
    pub redis: Vec<RedisResult>,
    /// The fabric device's resident memory per idle client connection.
    #[serde(default)]
    pub device_memory: Option<memory::ConnectionMemory>,
    /// What authentication (`--secrets`) costs per connection and per
    /// request.
    #[serde(default)]
    pub authentication: Option<auth::AuthCost>,
    /// Small hot operations beside bulk writes, the bulk writes asking
    /// for the server's cache or not.
    #[serde(default)]
    pub cache_policy: Option<cache_policy::CachePolicyCost>,
    /// A region with two copies against one.
    #[serde(default)]
    pub replication: Option<replicated::ReplicationCost>,
    /// The tracked ratios, by name: each the median over the rounds.
    pub ratios: BTreeMap<String, f64>,
    /// Each tracked ratio over the rounds: median, spread, every round.
    #[serde(default)]
    pub ratio_spread: BTreeMap<String, rounds::RatioSpread>,
    /// For each round after the main pass, who had the CPUs during its
    /// 64 B round trips and floors: a round whose CPUs never slept has
    /// round trips without wake-ups.
    #[serde(default)]
    pub round_census: Vec<Vec<census::Census>>,
}

/// Where a bench run's files went.
#[derive(Debug, Clone)]
pub struct BenchFiles {
    /// `report.json`.
    pub json: PathBuf,
    /// `report.md`.
    pub markdown: PathBuf,
    /// `latency_cdf.svg`.
    pub latency_cdf: PathBuf,
    /// `throughput_vs_clients.svg`.
    pub throughput: PathBuf,
}

/// The bench fabric: one server with one 256 MiB region, one fabric
/// device, one client, on free loopback ports.
pub(crate) fn bench_topology() -> anyhow::Result<Topology> {
    let spec = FabricSpec::new()
        .extent_size("2MiB")
        .server("S", &[("R", "256MiB")])
        .device("F")
        .client("c");
    loopback_topology(&spec, "bench", None)
}

/// The daemons' process ids: (pmem-server, fabric device).
pub(crate) type Pids = (Option<u32>, Option<u32>);

/// The two ways into the fabric.
#[derive(Debug, Clone, Copy)]
struct Paths {
    direct: SocketAddr,
    fabric: SocketAddr,
    /// The fabric device's admin endpoint (its `/metrics`).
    device_admin: SocketAddr,
    /// Client `c`'s key, which both daemons ask it to prove.
    key: Option<[u8; 32]>,
}

impl Paths {
    fn connect(&self, path: &str) -> anyhow::Result<BenchConn> {
        Ok(match (path, self.key) {
            ("direct", None) => BenchConn::connect(self.direct, None)?,
            ("direct", key) => BenchConn::open(self.direct, "c", key)?,
            (_, key) => BenchConn::open(self.fabric, "c", key)?,
        })
    }
}

/// Runs the whole bench and writes its report into `out`.
pub fn run(
    quick: bool,
    overrides: Overrides,
    out: &Path,
) -> anyhow::Result<(BenchReport, BenchFiles)> {
    let mut plan = Plan::new(quick);
    if let Some(rounds) = overrides.rounds {
        plan.rounds = rounds.max(1);
    }
    if let Some(connections) = overrides.idle_connections {
        plan.idle_connections = connections.max(1);
    }
    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    peers::require_tools(peers::TOOLS)?;
    // Before any daemon starts: they inherit the limit.
    open_files::allow_connections(plan.idle_connections)?;
    let floors = Floors::measure(&plan)?;

    // pmem-fabric: region files and redis files share the filesystem of `out`.
    let topology = bench_topology()?;
    let layout = Layout::new(&topology)?;
    let region = &layout.entries()[0];
    let (fabric, paths, pids) = start_fabric(&plan, &topology, out)?;
    // Before any traffic, so freed buffers of earlier connections do not
    // hide what new ones cost.
    let device_memory = match pids.1 {
        Some(device) => Some(memory::connection_memory(
            &paths,
            device,
            plan.idle_connections,
        )?),
        None => None,
    };
    let key = paths.connect("fabric")?.region_key(region.region)?;
    let shape = |op, size: u32| Shape::new(op, Target::Pmem(region.start), key, size);
    let (latency, histograms) = latencies(&plan, &paths, pids, &shape)?;
    let mut steps: Vec<usize> = plan.client_steps.to_vec();
    steps.dedup();
    let mut rates = fabric_rates(&plan, &paths, pids, &shape, &steps)?;

    let server = RedisServer::start(&RedisConfig {
        aof_always: false,
        dir: out.join("redis"),
    })?;
    let aof = RedisServer::start(&RedisConfig {
        aof_always: true,
        dir: out.join("redis-aof"),
    })?;
    let redis = redis_runs(&plan, (&server, &aof), &steps, &mut rates)?;
    // The ratios again, in interleaved rounds, with everything running.
    let more_rounds = rounds::measure(
        &plan,
        &rounds::Systems {
            paths: &paths,
            pids,
            shape: &shape,
            redis: &server,
            redis_aof: &aof,
        },
        plan.rounds.saturating_sub(1),
    )
    .context("the ratios' rounds")?;
    drop((aof, server));
    let cache_policy = Some(
        cache_policy::measure(&plan, &paths, &shape, region.len)
            .context("the server cache policy's case")?,
    );
    let replication = Some(
        replicated::measure(
            &plan,
            replicated::Unreplicated {
                paths: &paths,
                pids,
                shape: &shape,
            },
            out,
        )
        .context("the replicated region's case")?,
    );
    drop(fabric);
    let authentication = Some(auth::measure(&plan, out).context("authentication cost")?);

    let mut report = BenchReport {
        quick,
        plan,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        floor_rtt: floors.rtt,
        floor_rtt_same_cpu: floors.rtt_same_cpu,
        floor_rtt_spinning: Some(floors.rtt_spinning),
        floor_bw_bytes_per_s: floors.bw_bytes_per_s,
        latency,
        rates,
        redis,
        device_memory,
        authentication,
        cache_policy,
        replication,
        ratios: BTreeMap::new(),
        ratio_spread: BTreeMap::new(),
        round_census: more_rounds.census,
    };
    set_ratios(&mut report, &more_rounds.values);
    let files = write(out, &report, &histograms)?;
    Ok((report, files))
}

/// The network floors: sockperf round trips (64 B and 4 KiB, 64 B on one
/// CPU, 64 B with both ends polling) and one iperf3 stream.
struct Floors {
    rtt: BTreeMap<u32, Quantiles>,
    rtt_same_cpu: Quantiles,
    rtt_spinning: Quantiles,
    bw_bytes_per_s: f64,
}

impl Floors {
    fn measure(plan: &Plan) -> anyhow::Result<Floors> {
        let rtt = [64u32, 4096]
            .into_iter()
            .map(|size| Ok((size, peers::sockperf_rtt(size as usize, plan.duration())?)))
            .collect::<anyhow::Result<_>>()?;
        Ok(Floors {
            rtt,
            rtt_same_cpu: peers::sockperf_rtt_pinned(64, plan.duration(), 0, 0)?.quantiles,
            rtt_spinning: peers::sockperf_rtt_spinning(64, plan.duration())?.quantiles,
            bw_bytes_per_s: peers::iperf3_bandwidth(plan.duration())?,
        })
    }
}

/// Starts the bench fabric; its two ways in and the daemons' pids
/// (server, device).
fn start_fabric(
    plan: &Plan,
    topology: &Topology,
    out: &Path,
) -> anyhow::Result<(Fabric, Paths, Pids)> {
    let mut launch = LaunchOptions::new(out.join("data"), out.join("run"))?;
    launch.device_args = plan.device_args();
    let fabric = Fabric::start(topology, launch).context("bring the bench fabric up")?;
    let (paths, pids) = ways_in(&fabric)?;
    Ok((fabric, paths, pids))
}

/// A bench fabric's ways in (server `S`'s NIC `n0`, device `F`'s port
/// `p0`, as client `c`) and the pids of `S` and `F`.
fn ways_in(fabric: &Fabric) -> anyhow::Result<(Paths, Pids)> {
    let addr = |kind, id, field| -> anyhow::Result<SocketAddr> {
        fabric
            .ready_field(kind, id, field)
            .and_then(|a| a.parse().ok())
            .with_context(|| format!("no {field} address"))
    };
    let paths = Paths {
        direct: addr(DaemonKind::PmemServer, "S", "nic.n0")?,
        fabric: addr(DaemonKind::FabricDevice, "F", "port.p0")?,
        device_admin: fabric.admin(DaemonKind::FabricDevice, "F")?,
        key: match fabric.secrets() {
            Some(dir) => Some(read_key(dir, Principal::Client("c"))?),
            None => None,
        },
    };
    let pids = (
        fabric.pid(DaemonKind::PmemServer, "S"),
        fabric.pid(DaemonKind::FabricDevice, "F"),
    );
    Ok((paths, pids))
}

/// Round trips at queue depth 1 of every operation on both paths, with
/// the daemons' CPU per operation; the histograms by case name.
fn latencies(
    plan: &Plan,
    paths: &Paths,
    pids: Pids,
    shape: &dyn Fn(BenchOp, u32) -> Shape,
) -> anyhow::Result<(Vec<LatencyCase>, BTreeMap<String, LatencyHistogram>)> {
    let mut latency = Vec::new();
    let mut histograms = BTreeMap::new();
    for path in ["direct", "fabric"] {
        let mut conn = paths.connect(path)?;
        for (op, size) in [
            (BenchOp::Read, 64),
            (BenchOp::Read, 4096),
            (BenchOp::Write, 64),
            (BenchOp::Write, 4096),
            (BenchOp::WritePersist, 64),
            (BenchOp::WritePersist, 4096),
            (BenchOp::CompareSwap, 8),
        ] {
            let meter = CpuMeter::start(path, pids, paths.device_admin);
            let h = client::latency(
                &mut conn,
                &shape(op, size),
                200,
                plan.duration(),
                plan.samples,
            )?;
            // The 200 warm-up round trips count too: they cost the same.
            let cpu = meter.per_million(h.count() + 200);
            latency.push(LatencyCase {
                path: path.to_owned(),
                op: op.name().to_owned(),
                size,
                quantiles: Quantiles::from_histogram(&h),
                client_spins: false,
                server_cpu_s_per_million: cpu.server,
                device_cpu_s_per_million: cpu.device,
            });
            histograms.insert(format!("{path} {} {size} B", op.name()), h);
        }
        // The same 64 B READ with the client polling for its response:
        // what the client's own wake-up adds to a round trip.
        conn.set_waiting(Waiting::Spin)?;
        let meter = CpuMeter::start(path, pids, paths.device_admin);
        let h = client::latency(
            &mut conn,
            &shape(BenchOp::Read, 64),
            200,
            plan.duration(),
            plan.samples,
        )?;
        let cpu = meter.per_million(h.count() + 200);
        latency.push(LatencyCase {
            path: path.to_owned(),
            op: BenchOp::Read.name().to_owned(),
            size: 64,
            quantiles: Quantiles::from_histogram(&h),
            client_spins: true,
            server_cpu_s_per_million: cpu.server,
            device_cpu_s_per_million: cpu.device,
        });
        histograms.insert(format!("{path} READ 64 B, client spinning"), h);
    }
    Ok((latency, histograms))
}

/// Throughput (64 B, pipelined in batches, for each client count of
/// `steps` on READ) and bandwidth (1 MiB, a window of 4) on both paths.
fn fabric_rates(
    plan: &Plan,
    paths: &Paths,
    pids: Pids,
    shape: &dyn Fn(BenchOp, u32) -> Shape,
    steps: &[usize],
) -> anyhow::Result<Vec<RateCase>> {
    let mut rates = Vec::new();
    for path in ["direct", "fabric"] {
        for (op, size, depth, how) in [
            (BenchOp::Read, 64, plan.depth, Pipelining::Batches),
            (BenchOp::Write, 64, plan.depth, Pipelining::Batches),
            (BenchOp::Read, 1 << 20, 4, Pipelining::Window),
            (BenchOp::Write, 1 << 20, 4, Pipelining::Window),
        ] {
            let client_counts = if size == 64 && op == BenchOp::Read {
                steps.to_vec()
            } else if size == 64 {
                vec![plan.clients]
            } else {
                vec![1]
            };
            for clients in client_counts {
                rates.push(rate(
                    paths,
                    path,
                    &shape(op, size),
                    clients,
                    (depth, how),
                    plan.duration(),
                    pids,
                )?);
            }
        }
    }
    Ok(rates)
}

/// redis GET (each client count of `steps`) and SET, and redis-aof SET
/// 4 KiB at queue depth 1; the GET and SET rates join `rates`.
fn redis_runs(
    plan: &Plan,
    (server, aof): (&RedisServer, &RedisServer),
    steps: &[usize],
    rates: &mut Vec<RateCase>,
) -> anyhow::Result<Vec<RedisResult>> {
    let mut redis = Vec::new();
    for test in ["GET", "SET"] {
        let counts = if test == "GET" {
            steps.to_vec()
        } else {
            vec![plan.clients]
        };
        for clients in counts {
            let r =
                peers::redis_benchmark(server, test, 64, clients, plan.depth, plan.redis_requests)?;
            rates.push(RateCase {
                system: "redis".into(),
                op: test.into(),
                size: 64,
                clients,
                depth: plan.depth,
                ops_per_s: r.ops_per_s,
                bytes_per_s: r.ops_per_s * 64.0,
                server_cpu_s_per_million: r.server_cpu_s_per_million,
                device_cpu_s_per_million: None,
                device_busy_cpu_s_per_million: None,
            });
            redis.push(r);
        }
    }
    let aof_requests = (plan.samples as u64).min(20_000);
    redis.push(peers::redis_benchmark(
        aof,
        "SET",
        4096,
        1,
        1,
        aof_requests,
    )?);
    Ok(redis)
}

/// Each tracked ratio over the rounds: the main pass is the first round,
/// `more_rounds` the rest, except for the ratios with rounds of their own
/// ([`own_rounds`]); the tracked value is the median.
fn set_ratios(report: &mut BenchReport, more_rounds: &BTreeMap<String, Vec<f64>>) {
    let own = own_rounds(report);
    for (name, first) in ratios(report) {
        let values = match own.get(&name) {
            Some(values) => values.clone(),
            None => std::iter::once(first)
                .chain(more_rounds.get(&name).into_iter().flatten().copied())
                .collect(),
        };
        let spread = rounds::RatioSpread::of(values);
        report.ratios.insert(name.clone(), spread.median);
        report.ratio_spread.insert(name, spread);
    }
}

/// The ratios whose cases run interleaved rounds of their own (two
/// fabrics side by side, or two policies on one), each round's value in
/// round order; empty for a case that was not measured.
fn own_rounds(report: &BenchReport) -> BTreeMap<String, Vec<f64>> {
    let auth = report.authentication.as_ref();
    let cache = report.cache_policy.as_ref();
    let replication = report.replication.as_ref();
    let rounds = |values: Option<&Vec<f64>>| values.cloned().unwrap_or_default();
    BTreeMap::from([
        (
            "authenticated_read_p50_over_plain".to_owned(),
            rounds(auth.map(|a| &a.read_ratio_per_round)),
        ),
        (
            cache_policy::READ_P99_RATIO.to_owned(),
            rounds(cache.map(|c| &c.read_p99_ratio_per_round)),
        ),
        (
            cache_policy::WRITE_P99_RATIO.to_owned(),
            rounds(cache.map(|c| &c.write_p99_ratio_per_round)),
        ),
        (
            replicated::PERSIST_RATIO.to_owned(),
            rounds(replication.map(|r| &r.persist_p50_ratio_per_round)),
        ),
        (
            replicated::READ_RATIO.to_owned(),
            rounds(replication.map(|r| &r.read_tput_ratio_per_round)),
        ),
    ])
}

/// Operations per second of `clients` connections with `depth` in flight
/// each, pipelined as `how` says, and the daemons' CPU time per million
/// operations.
fn rate(
    paths: &Paths,
    path: &str,
    shape: &Shape,
    clients: usize,
    (depth, how): (usize, Pipelining),
    duration: Duration,
    daemons: Pids,
) -> anyhow::Result<RateCase> {
    let mut conns = (0..clients)
        .map(|_| paths.connect(path))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let meter = CpuMeter::start(path, daemons, paths.device_admin);
    let results: Vec<std::io::Result<(u64, Duration)>> = std::thread::scope(|s| {
        let handles: Vec<_> = conns
            .iter_mut()
            .map(|conn| s.spawn(move || client::pipelined(conn, shape, depth, how, duration)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("bench thread panicked")))
            })
            .collect()
    });
    let mut ops = 0;
    let mut elapsed = Duration::ZERO;
    for result in results {
        let (n, took) = result?;
        ops += n;
        elapsed = elapsed.max(took);
    }
    let cpu = meter.per_million(ops);
    let ops_per_s = ops as f64 / elapsed.as_secs_f64().max(1e-9);
    Ok(RateCase {
        system: path.to_owned(),
        op: shape.op.name().to_owned(),
        size: u64::from(shape.size),
        clients,
        depth,
        ops_per_s,
        bytes_per_s: ops_per_s * f64::from(shape.size),
        server_cpu_s_per_million: cpu.server,
        device_cpu_s_per_million: cpu.device,
        device_busy_cpu_s_per_million: cpu.device_busy,
    })
}

/// The CPU time the daemons (pmem-server, and the fabric device on the
/// fabric path) spend on one measurement.
struct CpuMeter {
    server: Option<(u32, f64)>,
    device: Option<(u32, f64)>,
    /// The device's admin endpoint and what its `/metrics` said at the
    /// start (see [`device_cpu_split`]).
    device_split: Option<(SocketAddr, (f64, f64))>,
}

/// CPU seconds per million operations of one measurement.
struct CpuPerMillion {
    server: Option<f64>,
    device: Option<f64>,
    /// The device's, without its idle polling.
    device_busy: Option<f64>,
}

impl CpuMeter {
    /// Starts counting for `path` with the daemons' pids `(server, device)`
    /// and the device's admin endpoint.
    fn start(path: &str, (server, device): Pids, device_admin: SocketAddr) -> Self {
        let reading = |pid: Option<u32>| {
            let pid = pid?;
            Some((pid, peers::cpu_seconds(pid).ok()?))
        };
        let fabric = path == "fabric";
        Self {
            server: reading(server),
            device: reading(device.filter(|_| fabric)),
            device_split: fabric
                .then(|| Some((device_admin, device_cpu_split(device_admin)?)))
                .flatten(),
        }
    }

    /// CPU seconds per million of `ops` operations since the start.
    fn per_million(&self, ops: u64) -> CpuPerMillion {
        let per_million = |seconds: f64| seconds / ops.max(1) as f64 * 1e6;
        let since = |start: Option<(u32, f64)>| {
            let (pid, before) = start?;
            Some(peers::cpu_seconds(pid).ok()? - before)
        };
        let busy = self.device_split.and_then(|(admin, (cpu, idle))| {
            let (cpu_after, idle_after) = device_cpu_split(admin)?;
            Some((cpu_after - cpu) - (idle_after - idle))
        });
        CpuPerMillion {
            server: since(self.server).map(per_million),
            device: since(self.device).map(per_million),
            device_busy: busy.map(per_million),
        }
    }
}

/// A device's CPU seconds and the part of them it spent busy polling
/// without finding an event, from one scrape of its `/metrics` (both
/// exact to the microsecond; `/proc`'s CPU time counts in ticks).
pub fn device_cpu_split(admin: SocketAddr) -> Option<(f64, f64)> {
    let (status, text) = telemetry::http_get(admin, "/metrics", Duration::from_secs(2)).ok()?;
    (status == 200).then_some(())?;
    let metric = |name| telemetry::metric_sum(&text, name, "");
    Some((
        metric("process_cpu_seconds_total")?,
        metric("fabric_device_idle_poll_seconds_total")?,
    ))
}

/// The ratios the project tracks, each a measurement over a floor or a peer.
pub fn ratios(report: &BenchReport) -> BTreeMap<String, f64> {
    // The cases with a sleeping client, as every floor's client sleeps.
    let case = |path: &str, op: &str, size: u32| {
        report
            .latency
            .iter()
            .find(|c| c.path == path && c.op == op && c.size == size && !c.client_spins)
    };
    let p50 = |path: &str, op: &str, size: u32| {
        case(path, op, size).map_or(f64::NAN, |c| c.quantiles.p50_us)
    };
    let rate = |system: &str, op: &str, size: u64, clients: usize| {
        report
            .rates
            .iter()
            .find(|r| r.system == system && r.op == op && r.size == size && r.clients == clients)
            .map_or(f64::NAN, |r| r.ops_per_s)
    };
    let floor = report.floor_rtt.get(&64).map_or(f64::NAN, |q| q.p50_us);
    let clients = report.plan.clients;
    let redis_aof = report
        .redis
        .iter()
        .find(|r| r.test == "SET" && r.value_size == 4096 && r.clients == 1)
        .map_or(f64::NAN, |r| r.latency.p50_us);
    let mib = (1u64 << 20) as f64;
    let p99 = |path: &str, op: &str, size: u32| {
        case(path, op, size).map_or(f64::NAN, |c| c.quantiles.p99_us)
    };
    let floor_p99 = report.floor_rtt.get(&64).map_or(f64::NAN, |q| q.p99_us);
    let spinning = report.floor_rtt_spinning;
    let (spin_p50, spin_p99) = spinning.map_or((f64::NAN, f64::NAN), |q| (q.p50_us, q.p99_us));
    let read_rate = |system: &str| {
        report
            .rates
            .iter()
            .find(|r| r.system == system && r.size == 64 && r.clients == clients)
            .filter(|r| r.op == "READ" || r.op == "GET")
    };
    let cpu = |r: Option<&RateCase>, device: bool| {
        r.and_then(|r| match device {
            true => r.device_cpu_s_per_million,
            false => r.server_cpu_s_per_million,
        })
        .unwrap_or(f64::NAN)
    };
    let fabric_read = read_rate("fabric");
    let mut ratios = BTreeMap::from([
        (
            "fabric_p99_over_floor_p99".into(),
            p99("fabric", "READ", 64) / floor_p99,
        ),
        (
            "direct_p99_over_floor_p99".into(),
            p99("direct", "READ", 64) / floor_p99,
        ),
        (
            "fabric_p50_over_spinning_floor".into(),
            p50("fabric", "READ", 64) / spin_p50,
        ),
        (
            "fabric_p99_over_spinning_floor_p99".into(),
            p99("fabric", "READ", 64) / spin_p99,
        ),
        (
            "direct_p50_over_spinning_floor".into(),
            p50("direct", "READ", 64) / spin_p50,
        ),
        (
            "direct_p99_over_spinning_floor_p99".into(),
            p99("direct", "READ", 64) / spin_p99,
        ),
        // CPU seconds per million operations are CPU µs per operation.
        ("device_cpu_us_per_op".into(), cpu(fabric_read, true)),
        (
            "device_busy_cpu_us_per_op".into(),
            fabric_read
                .and_then(|r| r.device_busy_cpu_s_per_million)
                .unwrap_or(f64::NAN),
        ),
        (
            "fabric_cpu_per_op_over_redis".into(),
            (cpu(fabric_read, false) + cpu(fabric_read, true)) / cpu(read_rate("redis"), false),
        ),
        (
            "fabric_p50_over_floor_rtt".into(),
            p50("fabric", "READ", 64) / floor,
        ),
        (
            "direct_p50_over_floor_rtt".into(),
            p50("direct", "READ", 64) / floor,
        ),
        (
            "fabric_tput_over_redis".into(),
            rate("fabric", "READ", 64, clients) / rate("redis", "GET", 64, clients),
        ),
        (
            "fabric_bw_over_floor_bw".into(),
            rate("fabric", "READ", 1 << 20, 1) * mib / report.floor_bw_bytes_per_s,
        ),
        (
            "direct_bw_over_floor_bw".into(),
            rate("direct", "READ", 1 << 20, 1) * mib / report.floor_bw_bytes_per_s,
        ),
        (
            "fabric_persist_p50_over_redis_aof".into(),
            p50("fabric", "WRITE_PERSIST", 4096) / redis_aof,
        ),
    ]);
    for (name, values) in own_rounds(report) {
        ratios.insert(name, rounds::RatioSpread::of(values).median);
    }
    ratios
}

/// Writes report.json, report.md and the plots.
fn write(
    out: &Path,
    report: &BenchReport,
    histograms: &BTreeMap<String, LatencyHistogram>,
) -> anyhow::Result<BenchFiles> {
    let files = BenchFiles {
        json: out.join("report.json"),
        markdown: out.join("report.md"),
        latency_cdf: out.join("latency_cdf.svg"),
        throughput: out.join("throughput_vs_clients.svg"),
    };
    std::fs::write(&files.json, serde_json::to_string_pretty(report)?)
        .with_context(|| format!("write {}", files.json.display()))?;
    std::fs::write(&files.markdown, markdown(report))
        .with_context(|| format!("write {}", files.markdown.display()))?;
    // The run report's CDF plot draws one curve per named series.
    let series = RunReport {
        run_id: "bench".into(),
        command: "bench".into(),
        topology: "<bench topology>".into(),
        workload: "latency at queue depth 1".into(),
        clients: vec!["c".into()],
        started_unix_ms: 0,
        duration_s: 0.0,
        ops: histograms
            .iter()
            .filter(|(name, _)| name.contains(" 64 B") || name.contains("4096"))
            .map(|(name, h)| {
                (
                    name.clone(),
                    OpStats {
                        count: h.count(),
                        errors: 0,
                        bytes: 0,
                        latency: h.clone(),
                    },
                )
            })
            .collect(),
        timeline: Default::default(),
        faults: Vec::new(),
        verification: Default::default(),
        notes: Vec::new(),
        roce: None,
        ..Default::default()
    };
    std::fs::write(&files.latency_cdf, crate::report::latency_cdf_svg(&series))
        .with_context(|| format!("write {}", files.latency_cdf.display()))?;
    let curve = |system: &str, op: &str| -> Vec<(f64, f64)> {
        report
            .rates
            .iter()
            .filter(|r| r.system == system && r.op == op && r.size == 64)
            .map(|r| (r.clients as f64, r.ops_per_s))
            .collect()
    };
    let chart = crate::report::xy_chart(
        "64 B throughput against clients",
        "clients",
        "operations per second",
        &[
            ("pmem-fabric (fabric path) READ", curve("fabric", "READ")),
            ("pmem-fabric (direct) READ", curve("direct", "READ")),
            ("redis GET", curve("redis", "GET")),
        ],
    );
    std::fs::write(&files.throughput, chart)
        .with_context(|| format!("write {}", files.throughput.display()))?;
    Ok(files)
}
