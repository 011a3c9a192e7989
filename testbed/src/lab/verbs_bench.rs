//! `testbed bench-verbs`: a PMEM server's own CPU per operation when the
//! fabric devices reach its regions over RDMA, next to when they reach them
//! over TCP, measured in the RDMA lab.
//!
//! The fabric of `configs/lab-verbs.toml` comes up (server S in a guest of
//! its own, device DAX region S1 behind a `verbs` NIC, fsdax region S0
//! behind a `tcp` NIC; the devices on the host). A client on the host
//! sends the same batches of READ, WRITE and WRITE_PERSIST to one region
//! and then the other, in interleaved rounds (TCP, RDMA, TCP, RDMA, …; the
//! order flips every round). The server's CPU time is its process's own,
//! as the guest's kernel accounts it (`process_cpu_seconds_total`), read
//! before and after each measurement; a measurement without operations
//! gives what reading it costs, which is taken off. The guests run under
//! emulation, so times are long, but both paths pay the same rate: the
//! ratio is the figure.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use pmem_client::AsyncPool;
use serde::{Deserialize, Serialize};
use topology::VirtAddr;

use crate::fabric::launch::{DaemonKind, Fabric, LaunchOptions, NetMode};
use crate::stats::median;

/// The lab topology measured, as built into the binary.
const TOPOLOGY: &str = include_str!("../../../configs/lab-verbs.toml");
/// The client that sends the load.
const CLIENT: &str = "c1";
/// Operations in flight.
const DEPTH: usize = 16;
/// Bytes per READ / WRITE.
const SIZE: usize = 256;

/// How long each measurement runs.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct VerbsPlan {
    /// Operations per measurement.
    pub ops: usize,
    /// Interleaved rounds.
    pub rounds: usize,
}

impl VerbsPlan {
    /// The full measurement, or a short smoke run.
    pub fn new(quick: bool, rounds: Option<usize>) -> Self {
        let (ops, default_rounds) = if quick { (300, 2) } else { (6_000, 5) };
        VerbsPlan {
            ops,
            rounds: rounds.unwrap_or(default_rounds).max(1),
        }
    }
}

/// One measurement.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Measurement {
    /// `tcp`, `rdma` or `idle`.
    pub path: String,
    /// The round.
    pub round: usize,
    /// Operations the client completed.
    pub ops: u64,
    /// Requests the server executed itself meanwhile.
    pub server_ops: u64,
    /// The server process's CPU time meanwhile, µs.
    pub server_cpu_us: f64,
    /// Wall time, s.
    pub seconds: f64,
}

/// The report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VerbsReport {
    /// What ran.
    pub plan: VerbsPlan,
    /// Every measurement, in order.
    pub measurements: Vec<Measurement>,
    /// Median server CPU per million operations on the TCP path, s (the
    /// cost of reading the CPU time taken off).
    pub tcp_cpu_s_per_million: f64,
    /// The same on the RDMA path.
    pub rdma_cpu_s_per_million: f64,
    /// Median of the per-round RDMA ÷ TCP ratios.
    pub rdma_over_tcp: f64,
    /// Smallest and largest per-round ratio.
    pub ratio_spread: (f64, f64),
    /// Server-executed requests per operation on each path (medians).
    pub server_ops_per_op: (f64, f64),
}

/// Brings the lab fabric up, measures, writes `report.json` and
/// `report.md` under `out`.
pub fn run(plan: VerbsPlan, out: &Path) -> anyhow::Result<VerbsReport> {
    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let topology = topology::Topology::from_toml_str(
        "configs/lab-verbs.toml",
        TOPOLOGY,
        &topology::EnvOverrides::Process,
    )
    .context("the built-in lab-verbs topology")?;
    let mut options = LaunchOptions::new(out.join("data"), out.join("run"))?;
    options.net = NetMode::Lab;
    let fabric = Fabric::start(&topology, options).context("bring the lab fabric up")?;
    let admin = fabric.admin(DaemonKind::PmemServer, "S")?;
    let scrape = move || -> anyhow::Result<(f64, u64)> {
        let (_, text) = telemetry::http_get(admin, "/metrics", Duration::from_secs(10))
            .context("scrape the server")?;
        let cpu = telemetry::metric_sum(&text, "process_cpu_seconds_total", "")
            .context("no process_cpu_seconds_total")?;
        let ops = telemetry::metric_sum(&text, "pmem_server_operations_total", "").unwrap_or(0.0);
        Ok((cpu * 1e6, ops as u64))
    };
    let measurements = fabric
        .as_client(CLIENT, |pool| async move {
            let regions = pool.regions();
            let base = |region: &str| {
                regions
                    .iter()
                    .find(|(id, _, _)| id == region)
                    .map(|(_, at, _)| at.get())
                    .ok_or_else(|| format!("no region {region}"))
            };
            let (tcp_at, rdma_at) = (base("S0")?, base("S1")?);
            let mut out = Vec::new();
            // Warm both paths (queue pairs up, translations cached).
            load(&pool, tcp_at, 64).await?;
            load(&pool, rdma_at, 64).await?;
            for round in 0..plan.rounds {
                let mut order = [("tcp", tcp_at), ("rdma", rdma_at), ("idle", 0)];
                if round % 2 == 1 {
                    order.swap(0, 1);
                }
                // The idle measurement lasts as long as the RDMA one, so
                // it takes off the scrapes and the server's background
                // work over the same time.
                let mut rdma_took = Duration::from_millis(200);
                for (path, at) in order {
                    let (cpu0, ops0) = scrape().map_err(|e| format!("{e:#}"))?;
                    let started = Instant::now();
                    let ops = if path == "idle" {
                        tokio::time::sleep(rdma_took).await;
                        0
                    } else {
                        load(&pool, at, plan.ops).await?
                    };
                    if path == "rdma" {
                        rdma_took = started.elapsed();
                    }
                    let seconds = started.elapsed().as_secs_f64();
                    let (cpu1, ops1) = scrape().map_err(|e| format!("{e:#}"))?;
                    out.push(Measurement {
                        path: path.to_owned(),
                        round,
                        ops,
                        server_ops: ops1.saturating_sub(ops0),
                        server_cpu_us: cpu1 - cpu0,
                        seconds,
                    });
                }
            }
            Ok(out)
        })
        .map_err(|e| anyhow::anyhow!("the load failed: {e}"))?;
    drop(fabric);

    let report = summarize(plan, measurements)?;
    std::fs::write(
        out.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    std::fs::write(out.join("report.md"), markdown(&report))?;
    Ok(report)
}

/// Sends `ops` operations (READ, WRITE, WRITE_PERSIST in turn, `SIZE`
/// bytes each, `DEPTH` at a time) to the 1 MiB at `at`; returns how many
/// completed.
async fn load(pool: &AsyncPool, at: u64, ops: usize) -> Result<u64, String> {
    let tasks: Vec<_> = (0..DEPTH)
        .map(|t| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let data = vec![0x5A; SIZE];
                let mut done = 0u64;
                for i in (t..ops).step_by(DEPTH) {
                    let addr = VirtAddr(at + ((i * SIZE) % (1 << 20)) as u64);
                    match i % 3 {
                        0 => pool.read(addr, SIZE as u64).await.map(drop),
                        1 => pool.write(addr, &data).await,
                        _ => pool.write_persist(addr, &data).await,
                    }
                    .map_err(|e| pmem_client::error_chain(&e))?;
                    done += 1;
                }
                Ok::<u64, String>(done)
            })
        })
        .collect();
    let mut done = 0;
    for task in tasks {
        done += task.await.map_err(|e| e.to_string())??;
    }
    Ok(done)
}

/// Per-round figures, with the cost of the two scrapes (the idle
/// measurement of the same round) taken off.
fn summarize(plan: VerbsPlan, measurements: Vec<Measurement>) -> anyhow::Result<VerbsReport> {
    let mut tcp = Vec::new();
    let mut rdma = Vec::new();
    let mut ratios = Vec::new();
    let mut per_op = (Vec::new(), Vec::new());
    for round in 0..plan.rounds {
        let find = |path: &str| {
            measurements
                .iter()
                .find(|m| m.round == round && m.path == path)
        };
        let (Some(t), Some(r), Some(idle)) = (find("tcp"), find("rdma"), find("idle")) else {
            bail!("round {round} is incomplete");
        };
        let cost =
            |m: &Measurement| (m.server_cpu_us - idle.server_cpu_us).max(0.0) / m.ops.max(1) as f64;
        // µs per operation = s per million operations.
        let (t_cost, r_cost) = (cost(t), cost(r));
        tcp.push(t_cost);
        rdma.push(r_cost);
        ratios.push(r_cost / t_cost.max(f64::MIN_POSITIVE));
        per_op.0.push(t.server_ops as f64 / t.ops.max(1) as f64);
        per_op.1.push(r.server_ops as f64 / r.ops.max(1) as f64);
    }
    let spread = (
        ratios.iter().copied().fold(f64::INFINITY, f64::min),
        ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    );
    Ok(VerbsReport {
        plan,
        tcp_cpu_s_per_million: median(&tcp),
        rdma_cpu_s_per_million: median(&rdma),
        rdma_over_tcp: median(&ratios),
        ratio_spread: spread,
        server_ops_per_op: (median(&per_op.0), median(&per_op.1)),
        measurements,
    })
}

/// The report as Markdown.
pub fn markdown(report: &VerbsReport) -> String {
    let mut text = format!(
        "# A PMEM server's CPU per operation: RDMA next to TCP\n\n\
         Server S in a lab guest (emulated NVDIMMs, rxe), fabric devices on the host; \
         READ, WRITE and WRITE_PERSIST of {SIZE} B, {DEPTH} in flight, {} operations per \
         measurement, {} interleaved rounds. CPU time is the server process's own, as the \
         guest accounts it, less what reading it costs (an idle measurement per round).\n\n\
         | path | server CPU per million operations (median) | requests the server executed per operation |\n\
         |---|---:|---:|\n\
         | TCP (fsdax region S0) | {:.1} s | {:.2} |\n\
         | RDMA (device DAX region S1) | {:.3} s | {:.2} |\n\n\
         RDMA ÷ TCP: **{:.4}** (rounds {:.4} to {:.4}); target: under 0.01.\n\n",
        report.plan.ops,
        report.plan.rounds,
        report.tcp_cpu_s_per_million,
        report.server_ops_per_op.0,
        report.rdma_cpu_s_per_million,
        report.server_ops_per_op.1,
        report.rdma_over_tcp,
        report.ratio_spread.0,
        report.ratio_spread.1,
    );
    text.push_str("| round | path | ops | server ops | server CPU µs | seconds |\n|---:|---|---:|---:|---:|---:|\n");
    for m in &report.measurements {
        text.push_str(&format!(
            "| {} | {} | {} | {} | {:.0} | {:.2} |\n",
            m.round, m.path, m.ops, m.server_ops, m.server_cpu_us, m.seconds
        ));
    }
    text
}
