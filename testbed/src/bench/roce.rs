//! `testbed bench-roce`: the fabric device's cost per operation on its
//! RoCEv2 port next to its TCP port, measured on this host.
//!
//! A pmem-server and a fabric device run as processes, started from the
//! testbed's own binary as every testbed fabric is (`crate::fabric::launch`);
//! the device's port has a RoCEv2 side on a veth pair whose other end sits
//! in a network namespace. The RoCE load comes from the RC requester of `proto` over raw
//! IPv4 sockets in that namespace (`testkit::roce::RawRoceClient`), the TCP
//! load from a plain protocol connection, both with the same operations,
//! sizes and batches, in interleaved rounds (TCP, RoCE, TCP, RoCE, …). The
//! device's CPU time per operation comes from `/proc`; each round gives a
//! RoCE ÷ TCP ratio, and the report gives the median and the spread.
//! Needs root (namespaces, raw sockets).

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use proto::hello::Role;
use proto::request::Target;
use proto::roce::rc::{WcStatus, WorkOp, WorkRequest};
use serde::{Deserialize, Serialize};
use testkit::netns::VethNamespace;
use testkit::roce::RawRoceClient;
use testkit::{Conn, FabricSpec, RoceSpec};
use topology::secrets::{Principal, read_key};
use topology::{Layout, LayoutEntry, PmemAddr};

use crate::bench::client::{BenchConn, BenchOp, Pipelining, Shape, latency, pipelined};
use crate::bench::device_cpu_split;
use crate::bench::peers::cpu_seconds;
use crate::fabric::launch::{DaemonKind, Fabric, Keys, LaunchOptions};
use crate::fabric::loopback::loopback_topology;
use crate::report::LatencyHistogram;

/// How long and how hard each measurement runs.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct RocePlan {
    /// Length of each throughput measurement.
    pub seconds: f64,
    /// Interleaved rounds (TCP then RoCE, per operation).
    pub rounds: usize,
    /// Operations in flight per batch.
    pub depth: usize,
    /// Operations timed one at a time for latency, per system and operation.
    pub samples: usize,
    /// The frame path of the device's RoCEv2 port.
    #[serde(default)]
    pub roce_io: RocePath,
    /// How long the device busy-polls after its last event
    /// (`fabric-device --busy-poll-us`); 0: it sleeps whenever nothing
    /// is waiting, so each arrival after a pause costs it a wake-up.
    #[serde(default)]
    pub busy_poll_us: u64,
}

/// The frame path of the device's RoCEv2 port (`fabric-device --roce-io`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RocePath {
    /// An AF_XDP socket fed by an XDP program, the device's default.
    #[default]
    Xdp,
    /// Rings shared with the kernel (PACKET_MMAP).
    PacketRing,
    /// recvmmsg/sendmmsg on the packet socket.
    Socket,
}

impl RocePath {
    /// The name `fabric-device --roce-io` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            RocePath::Xdp => "xdp",
            RocePath::PacketRing => "packet-ring",
            RocePath::Socket => "socket",
        }
    }
}

impl std::str::FromStr for RocePath {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "xdp" => Ok(RocePath::Xdp),
            "packet-ring" => Ok(RocePath::PacketRing),
            "socket" => Ok(RocePath::Socket),
            _ => Err(format!(
                "unknown RoCE frame path {s:?}: use xdp, packet-ring or socket"
            )),
        }
    }
}

impl RocePlan {
    /// The full measurement, or a short smoke run.
    pub fn new(quick: bool, rounds: Option<usize>) -> Self {
        let (seconds, default_rounds, samples) = if quick {
            (0.2, 2, 200)
        } else {
            (2.0, 5, 5_000)
        };
        RocePlan {
            seconds,
            rounds: rounds.unwrap_or(default_rounds).max(1),
            depth: 16,
            samples,
            roce_io: RocePath::default(),
            busy_poll_us: 0,
        }
    }
}

/// The operations compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RoceOp {
    /// 64-byte READ.
    Read64,
    /// 4 KiB WRITE.
    Write4k,
    /// 8-byte FETCH_ADD.
    FetchAdd,
}

impl RoceOp {
    const ALL: [RoceOp; 3] = [RoceOp::Read64, RoceOp::Write4k, RoceOp::FetchAdd];

    fn name(self) -> &'static str {
        match self {
            RoceOp::Read64 => "64 B READ",
            RoceOp::Write4k => "4 KiB WRITE",
            RoceOp::FetchAdd => "8 B FETCH_ADD",
        }
    }
}

/// One system's figures for one operation in one round.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Measured {
    /// Operations per second through the device.
    pub ops_per_s: f64,
    /// The device's CPU time per operation, in µs.
    pub device_us_per_op: f64,
    /// The same without the event-loop turns that busy polled and found
    /// nothing (`fabric_device_idle_poll_seconds_total`): the CPU that
    /// forwarded. Equal to the whole when the device does not poll.
    #[serde(default)]
    pub device_busy_us_per_op: f64,
}

/// One round of one operation: TCP and RoCE side by side.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct RoundFigures {
    /// The operation.
    pub op: RoceOp,
    /// Over the TCP port.
    pub tcp: Measured,
    /// Over the RoCEv2 port.
    pub roce: Measured,
}

/// Median and spread of a figure over the rounds.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Spread {
    /// The median.
    pub median: f64,
    /// The smallest value.
    pub min: f64,
    /// The largest value.
    pub max: f64,
}

impl Spread {
    fn of(values: Vec<f64>) -> Spread {
        let (median, min, max) = crate::stats::spread(&values);
        Spread { median, min, max }
    }
}

/// The summary of one operation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpSummary {
    /// The operation.
    pub op: RoceOp,
    /// Device CPU per op on RoCE ÷ on TCP, per round.
    pub device_cpu_ratio: Spread,
    /// The same for the device's busy CPU (without idle polling).
    pub device_busy_cpu_ratio: Spread,
    /// Device µs of CPU per op over TCP.
    pub tcp_device_us_per_op: Spread,
    /// Device µs of CPU per op over RoCE.
    pub roce_device_us_per_op: Spread,
    /// Device µs of busy CPU per op over TCP.
    pub tcp_device_busy_us_per_op: Spread,
    /// Device µs of busy CPU per op over RoCE.
    pub roce_device_busy_us_per_op: Spread,
    /// Operations per second over TCP.
    pub tcp_ops_per_s: Spread,
    /// Operations per second over RoCE.
    pub roce_ops_per_s: Spread,
    /// Latency at queue depth 1 over TCP: p50 and p99 in µs.
    pub tcp_latency_us: (u64, u64),
    /// Latency at queue depth 1 over RoCE: p50 and p99 in µs.
    pub roce_latency_us: (u64, u64),
}

/// Everything `bench-roce` measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RoceBenchReport {
    /// How it was measured.
    pub plan: RocePlan,
    /// Every round's raw figures.
    pub rounds: Vec<RoundFigures>,
    /// Per operation: medians and spreads.
    pub summary: Vec<OpSummary>,
    /// Median over the operations of the device CPU ratio RoCE ÷ TCP (target ≤ 1.0).
    pub roce_device_cpu_per_op_over_tcp: f64,
    /// The same for the device's busy CPU; equal to the above when the
    /// device does not poll.
    pub roce_device_busy_cpu_per_op_over_tcp: f64,
}

const SUBNET: &str = "10.238.3";
const COUNTER_AT: u64 = 0x1000;

/// The longest the TCP latency samples of one operation may take: the
/// plan's count of samples ends it well before.
const TCP_LATENCY_LIMIT: Duration = Duration::from_secs(120);

/// The fabric under measurement.
struct Setup {
    /// Dropped first: the daemons stop before their namespace and files go.
    _fabric: Fabric,
    veth: VethNamespace,
    _dir: tempfile::TempDir,
    /// The device's client-facing port (its TCP listener).
    device_port: SocketAddr,
    device_pid: u32,
    /// The device's admin endpoint (its `/metrics`).
    device_admin: SocketAddr,
    region: LayoutEntry,
    /// Client c0's key, proven on every control connection.
    client_key: [u8; 32],
}

impl Setup {
    /// Brings the fabric up the way every testbed command does
    /// ([`Fabric::start`]: the daemons run from this very binary as
    /// `testbed daemon …`, so a copy of it outside the source tree runs
    /// the bench), with the device's port given a RoCEv2 side on a veth
    /// pair into a fresh namespace.
    fn start(plan: &RocePlan) -> anyhow::Result<Setup> {
        let veth = VethNamespace::create("pfbench", SUBNET)
            .context("creating the network namespace (bench-roce needs root)")?;
        let dir = tempfile::tempdir().context("make a temporary folder for the fabric")?;
        let spec = FabricSpec::new()
            .server("A", &[("A1", "64MiB")])
            .device("F")
            .client("c0")
            .roce_port(
                "F",
                RoceSpec {
                    interface: veth.host.clone(),
                    control_ip: veth.addr(254).to_string(),
                    roce_ip: veth.addr(1).to_string(),
                },
            );
        let topology = loopback_topology(&spec, "bench-roce", None)?;
        let mut options = LaunchOptions::new(dir.path().join("data"), dir.path().join("run"))?;
        // Fresh keys, as on every testbed fabric: the control connection
        // proves c0's.
        options.keys = Keys::Fresh;
        options.device_args = vec![
            "--roce-io".to_owned(),
            plan.roce_io.as_str().to_owned(),
            "--busy-poll-us".to_owned(),
            plan.busy_poll_us.to_string(),
        ];
        let fabric = Fabric::start(&topology, options).context("bring the bench-roce fabric up")?;
        let secrets = fabric.secrets().context("the fabric's keys")?;
        let client_key = read_key(secrets, Principal::Client("c0"))?;
        let device_port = fabric
            .ready_field(DaemonKind::FabricDevice, "F", "port.p0")
            .context("the fabric device's ready line gives no port.p0")?
            .parse()
            .context("the fabric device's port.p0 is not an address")?;
        let device_pid = fabric
            .pid(DaemonKind::FabricDevice, "F")
            .context("no fabric device process")?;
        let device_admin = fabric.admin(DaemonKind::FabricDevice, "F")?;
        let mut region = Layout::new(&fabric.topology)?.entries()[0].clone();
        region.key = BenchConn::open(device_port, "c0", Some(client_key))
            .and_then(|mut conn| conn.region_key(region.region))
            .context("ask the fabric device for region A1's key")?;
        Ok(Setup {
            _fabric: fabric,
            veth,
            _dir: dir,
            device_port,
            device_pid,
            device_admin,
            region,
            client_key,
        })
    }

    /// A measuring connection to the device's port, as client c0.
    fn tcp_client(&self) -> anyhow::Result<BenchConn> {
        BenchConn::open(self.device_port, "c0", Some(self.client_key)).with_context(|| {
            format!(
                "client c0 connects to the fabric device at {}",
                self.device_port
            )
        })
    }

    /// A protocol connection to the device's port, as client c0: the RoCE
    /// client's control connection (QP_CONNECT).
    fn control(&self) -> anyhow::Result<Conn> {
        let mut conn = Conn::connect_timeout(self.device_port, testkit::IO_TIMEOUT)
            .with_context(|| format!("connect to the fabric device at {}", self.device_port))?;
        conn.authenticate(Role::Client, "c0", self.client_key)
            .context("client c0 proves its key to the fabric device")?;
        Ok(conn)
    }

    /// The device's CPU seconds so far: from `/proc`, and from its
    /// `/metrics` the CPU and the part of it spent polling idle.
    fn device_cpu(&self) -> anyhow::Result<DeviceCpu> {
        let (cpu, idle_poll) = device_cpu_split(self.device_admin)
            .context("read the fabric device's CPU from its /metrics")?;
        Ok(DeviceCpu {
            proc: cpu_seconds(self.device_pid)?,
            cpu,
            idle_poll,
        })
    }
}

/// One reading of the device's CPU seconds.
#[derive(Debug, Clone, Copy)]
struct DeviceCpu {
    /// From `/proc` (whole ticks).
    proc: f64,
    /// From `/metrics` (exact to the microsecond).
    cpu: f64,
    /// The part of `cpu` spent in turns that polled and found nothing.
    idle_poll: f64,
}

/// The device request for `op` (TCP).
fn tcp_shape(op: RoceOp, region: &LayoutEntry) -> Shape {
    let at = |off: u64| Target::Pmem(PmemAddr(region.start.get() + off));
    match op {
        RoceOp::Read64 => Shape::new(BenchOp::Read, at(0), region.key, 64),
        RoceOp::Write4k => Shape::new(BenchOp::Write, at(0x10_000), region.key, 4096),
        RoceOp::FetchAdd => Shape::new(BenchOp::FetchAdd, at(COUNTER_AT), region.key, 8),
    }
}

/// The work request for `op` (RoCE).
fn roce_op(op: RoceOp, client: &RawRoceClient, region: &LayoutEntry, data: &[u8]) -> WorkOp {
    let at = |off: u64| client.remote(region.region.0, region.start.get() + off);
    match op {
        RoceOp::Read64 => WorkOp::Read {
            remote: at(0),
            len: 64,
        },
        RoceOp::Write4k => WorkOp::Write {
            remote: at(0x10_000),
            data: data.to_vec(),
            imm: None,
        },
        RoceOp::FetchAdd => WorkOp::FetchAdd {
            remote: at(COUNTER_AT),
            add: 1,
        },
    }
}

/// Runs batches of `depth` TCP requests for `seconds`; returns ops/s.
fn tcp_load(setup: &Setup, plan: &RocePlan, op: RoceOp) -> anyhow::Result<f64> {
    let mut conn = setup.tcp_client()?;
    let (ops, took) = pipelined(
        &mut conn,
        &tcp_shape(op, &setup.region),
        plan.depth,
        Pipelining::Batches,
        Duration::from_secs_f64(plan.seconds),
    )
    .with_context(|| format!("{} over TCP", op.name()))?;
    Ok(ops as f64 / took.as_secs_f64())
}

/// Runs batches of `depth` RoCE work requests for `seconds` from inside the
/// namespace; returns ops/s.
fn roce_load(setup: &Setup, plan: &RocePlan, op: RoceOp, data: &[u8]) -> anyhow::Result<f64> {
    with_roce_client(setup, |client| {
        let start = Instant::now();
        let mut ops = 0u64;
        let mut id = 0;
        while start.elapsed().as_secs_f64() < plan.seconds {
            for _ in 0..plan.depth {
                id += 1;
                let work = roce_op(op, client, &setup.region, data);
                client.qp.post(WorkRequest::new(id, work))?;
            }
            check(client.run(Duration::from_secs(10))?, op)?;
            ops += plan.depth as u64;
        }
        Ok(ops as f64 / start.elapsed().as_secs_f64())
    })
}

fn check(done: Vec<proto::roce::rc::Completion>, op: RoceOp) -> anyhow::Result<()> {
    match done.iter().find(|c| c.status != WcStatus::Success) {
        Some(c) => bail!("{}: RoCE work request ended {:?}", op.name(), c.status),
        None => Ok(()),
    }
}

/// Runs `body` on a thread inside the namespace with a fresh queue pair.
fn with_roce_client<T: Send>(
    setup: &Setup,
    body: impl FnOnce(&mut RawRoceClient) -> anyhow::Result<T> + Send,
) -> anyhow::Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                setup.veth.enter_on_this_thread()?;
                let mut control = setup.control()?;
                let mut client = RawRoceClient::connect(&mut control, setup.veth.addr(2), 0x500)?;
                body(&mut client)
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the RoCE load thread panicked"))?
    })
}

/// Latency at queue depth 1: p50 and p99 in µs, TCP then RoCE.
fn latencies(
    setup: &Setup,
    plan: &RocePlan,
    op: RoceOp,
    data: &[u8],
) -> anyhow::Result<((u64, u64), (u64, u64))> {
    let tcp = latency(
        &mut setup.tcp_client()?,
        &tcp_shape(op, &setup.region),
        0,
        TCP_LATENCY_LIMIT,
        plan.samples,
    )
    .with_context(|| format!("{} over TCP, one at a time", op.name()))?;
    let roce = with_roce_client(setup, |client| {
        let mut h = LatencyHistogram::new();
        for id in 0..plan.samples as u64 {
            let work = roce_op(op, client, &setup.region, data);
            let started = Instant::now();
            client.qp.post(WorkRequest::new(id, work))?;
            check(client.run(Duration::from_secs(10))?, op)?;
            h.record_duration(started.elapsed());
        }
        Ok(h)
    })?;
    let q = |h: &LatencyHistogram| (h.quantile(0.5), h.quantile(0.99));
    Ok((q(&tcp), q(&roce)))
}

/// Runs the whole comparison.
pub fn run(plan: RocePlan, out: &Path) -> anyhow::Result<RoceBenchReport> {
    let setup = Setup::start(&plan)?;
    let data = vec![0xA5u8; 4096];
    let mut rounds = Vec::new();
    for _ in 0..plan.rounds {
        for op in RoceOp::ALL {
            let measure = |load: &dyn Fn() -> anyhow::Result<f64>| -> anyhow::Result<Measured> {
                let before = setup.device_cpu()?;
                let started = Instant::now();
                let ops_per_s = load()?;
                let elapsed = started.elapsed().as_secs_f64();
                let after = setup.device_cpu()?;
                let per_op = |seconds: f64| seconds * 1e6 / (ops_per_s * elapsed).max(1.0);
                Ok(Measured {
                    ops_per_s,
                    device_us_per_op: per_op(after.proc - before.proc),
                    device_busy_us_per_op: per_op(
                        (after.cpu - before.cpu) - (after.idle_poll - before.idle_poll),
                    ),
                })
            };
            let tcp = measure(&|| tcp_load(&setup, &plan, op))?;
            let roce = measure(&|| roce_load(&setup, &plan, op, &data))?;
            rounds.push(RoundFigures { op, tcp, roce });
        }
    }
    let mut summary = Vec::new();
    for op in RoceOp::ALL {
        let of = |f: fn(&RoundFigures) -> f64| {
            Spread::of(rounds.iter().filter(|r| r.op == op).map(f).collect())
        };
        let (tcp_latency_us, roce_latency_us) = latencies(&setup, &plan, op, &data)?;
        summary.push(OpSummary {
            op,
            device_cpu_ratio: of(|r| r.roce.device_us_per_op / r.tcp.device_us_per_op),
            device_busy_cpu_ratio: of(|r| {
                r.roce.device_busy_us_per_op / r.tcp.device_busy_us_per_op
            }),
            tcp_device_us_per_op: of(|r| r.tcp.device_us_per_op),
            roce_device_us_per_op: of(|r| r.roce.device_us_per_op),
            tcp_device_busy_us_per_op: of(|r| r.tcp.device_busy_us_per_op),
            roce_device_busy_us_per_op: of(|r| r.roce.device_busy_us_per_op),
            tcp_ops_per_s: of(|r| r.tcp.ops_per_s),
            roce_ops_per_s: of(|r| r.roce.ops_per_s),
            tcp_latency_us,
            roce_latency_us,
        });
    }
    let over_ops =
        |ratio: fn(&OpSummary) -> f64| Spread::of(summary.iter().map(ratio).collect()).median;
    let report = RoceBenchReport {
        plan,
        rounds,
        roce_device_cpu_per_op_over_tcp: over_ops(|s| s.device_cpu_ratio.median),
        roce_device_busy_cpu_per_op_over_tcp: over_ops(|s| s.device_busy_cpu_ratio.median),
        summary,
    };
    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let json = out.join("roce-bench.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("write {}", json.display()))?;
    std::fs::write(out.join("roce-bench.md"), markdown(&report))
        .with_context(|| format!("write {}", out.display()))?;
    Ok(report)
}

/// The report as a Markdown table.
pub fn markdown(report: &RoceBenchReport) -> String {
    let polling = match report.plan.busy_poll_us {
        0 => "the device does not busy-poll".to_owned(),
        us => format!("the device busy-polls for {us} µs after each event"),
    };
    let mut text = format!(
        "# Fabric device: RoCEv2 port vs TCP port\n\n{} interleaved rounds of {:.1} s per \
         system and operation, batches of {}; RoCE frame path `{}`; {polling}. Device CPU \
         from /proc; busy CPU from its /metrics, without the turns that polled and found \
         nothing. Medians, (min–max).\n\n\
         | operation | device µs/op TCP | device µs/op RoCE | RoCE ÷ TCP | busy µs/op TCP | busy µs/op RoCE | busy RoCE ÷ TCP | ops/s TCP | ops/s RoCE | p50/p99 µs TCP | p50/p99 µs RoCE |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        report.plan.rounds,
        report.plan.seconds,
        report.plan.depth,
        report.plan.roce_io.as_str()
    );
    for s in &report.summary {
        let f = |x: &Spread, digits: usize| {
            format!("{:.d$} ({:.d$}–{:.d$})", x.median, x.min, x.max, d = digits)
        };
        text.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {}/{} | {}/{} |\n",
            s.op.name(),
            f(&s.tcp_device_us_per_op, 2),
            f(&s.roce_device_us_per_op, 2),
            f(&s.device_cpu_ratio, 2),
            f(&s.tcp_device_busy_us_per_op, 2),
            f(&s.roce_device_busy_us_per_op, 2),
            f(&s.device_busy_cpu_ratio, 2),
            f(&s.tcp_ops_per_s, 0),
            f(&s.roce_ops_per_s, 0),
            s.tcp_latency_us.0,
            s.tcp_latency_us.1,
            s.roce_latency_us.0,
            s.roce_latency_us.1,
        ));
    }
    text.push_str(&format!(
        "\n`roce_device_cpu_per_op_over_tcp` (median over the operations): **{:.2}** (target ≤ 1.0)\n\
         `roce_device_busy_cpu_per_op_over_tcp` (the same, busy CPU): **{:.2}**\n",
        report.roce_device_cpu_per_op_over_tcp, report.roce_device_busy_cpu_per_op_over_tcp
    ));
    text
}
