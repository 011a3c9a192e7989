//! The tracked ratios measured again in interleaved rounds: each round
//! measures both sides of every ratio back to back (the order alternating
//! from round to round) and computes the ratio from that round's two
//! figures, so a machine whose speed drifts between rounds moves both sides
//! alike. The report gives each ratio's median over the rounds and its
//! spread (lowest and highest).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::census::{self, Census};
use super::client::{self, BenchOp, Pipelining, Shape};
use super::peers::{self, RedisServer};
use super::{Paths, Pids, Plan, rate};

/// One ratio over the rounds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RatioSpread {
    /// The median of the per-round values: what the target applies to.
    pub median: f64,
    /// The lowest round.
    pub min: f64,
    /// The highest round.
    pub max: f64,
    /// Every round's value, in round order (the first is the main pass).
    pub rounds: Vec<f64>,
}

impl RatioSpread {
    /// The spread of `values` (NaN fields for none).
    pub fn of(values: Vec<f64>) -> RatioSpread {
        let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        let (median, min, max) = crate::stats::spread(&finite);
        RatioSpread {
            median,
            min,
            max,
            rounds: values,
        }
    }
}

/// What the rounds need: the running fabric and redis servers.
pub(super) struct Systems<'a> {
    pub(super) paths: &'a Paths,
    pub(super) pids: Pids,
    pub(super) shape: &'a dyn Fn(BenchOp, u32) -> Shape,
    pub(super) redis: &'a RedisServer,
    pub(super) redis_aof: &'a RedisServer,
}

/// What the rounds measured.
pub(super) struct Rounds {
    /// Each ratio's per-round values, by name.
    pub(super) values: BTreeMap<String, Vec<f64>>,
    /// Per round, who had the CPUs during its round trips and floors.
    pub(super) census: Vec<Vec<Census>>,
}

/// Runs `rounds` more rounds of every ratio's two measurements.
pub(super) fn measure(plan: &Plan, systems: &Systems<'_>, rounds: usize) -> anyhow::Result<Rounds> {
    let duration = Duration::from_secs_f64(plan.seconds / 2.0);
    let mut out = Rounds {
        values: BTreeMap::new(),
        census: Vec::new(),
    };
    for round in 0..rounds {
        let flip = round % 2 == 1;
        let (values, census) = one_round(plan, systems, duration, flip)?;
        for (name, value) in values {
            out.values.entry(name).or_default().push(value);
        }
        out.census.push(census);
    }
    Ok(out)
}

/// Both sides of a ratio, measured back to back: ours first unless
/// `flip`.
pub(super) fn pair<A, B>(
    flip: bool,
    ours: impl FnOnce() -> anyhow::Result<A>,
    theirs: impl FnOnce() -> anyhow::Result<B>,
) -> anyhow::Result<(A, B)> {
    if flip {
        let t = theirs()?;
        Ok((ours()?, t))
    } else {
        let o = ours()?;
        Ok((o, theirs()?))
    }
}

/// A ratio's name and its value in one round.
type Ratio = (String, f64);

/// One round: every ratio's value, and the censuses of its round trips
/// and floors.
fn one_round(
    plan: &Plan,
    s: &Systems<'_>,
    duration: Duration,
    flip: bool,
) -> anyhow::Result<(Vec<Ratio>, Vec<Census>)> {
    let samples = plan.samples;
    let census = RefCell::new(Vec::new());
    // `f()`, with who had the CPUs meanwhile kept as `what`.
    let counted = |what: &str, f: &dyn Fn() -> anyhow::Result<(f64, f64)>| {
        let (out, taken) = census::around(what, f);
        census.borrow_mut().push(taken);
        out
    };
    // (p50, p99) of round trips at queue depth 1.
    let quantiles = |path: &str, op, size| -> anyhow::Result<(f64, f64)> {
        let mut conn = s.paths.connect(path)?;
        let h = client::latency(&mut conn, &(s.shape)(op, size), 200, duration, samples)?;
        Ok((h.quantile(0.5) as f64, h.quantile(0.99) as f64))
    };
    let p50 = |path: &str, op, size| Ok(quantiles(path, op, size)?.0);
    let read_64 = |path: &str| quantiles(path, BenchOp::Read, 64);
    let rate_of = |path: &str, op, size, clients, window| {
        rate(
            s.paths,
            path,
            &(s.shape)(op, size),
            clients,
            window,
            duration,
            s.pids,
        )
    };
    let ops = |path: &str, op, size, clients, window| -> anyhow::Result<f64> {
        Ok(rate_of(path, op, size, clients, window)?.ops_per_s)
    };
    // A sockperf floor's 64 B (p50, p99).
    type Sockperf = fn(usize, Duration) -> Result<peers::SockperfRun, peers::PeerError>;
    let floor = |run: Sockperf| -> anyhow::Result<(f64, f64)> {
        let q = run(64, duration)?.quantiles;
        Ok((q.p50_us, q.p99_us))
    };
    let mut out = Vec::new();

    // Both paths' 64 B READ round trips and both floors (sleeping and
    // spinning), all four back to back.
    let ((fabric, direct), (sleeping, spinning)) = pair(
        flip,
        || {
            Ok((
                counted("fabric READ 64 B", &|| read_64("fabric"))?,
                counted("direct READ 64 B", &|| read_64("direct"))?,
            ))
        },
        || {
            Ok((
                counted("sockperf 64 B", &|| floor(peers::sockperf_rtt_run))?,
                counted("sockperf 64 B spinning", &|| {
                    floor(peers::sockperf_rtt_spinning)
                })?,
            ))
        },
    )?;
    for (path, (p50, p99)) in [("fabric", fabric), ("direct", direct)] {
        out.push((format!("{path}_p50_over_floor_rtt"), p50 / sleeping.0));
        out.push((format!("{path}_p99_over_floor_p99"), p99 / sleeping.1));
        out.push((format!("{path}_p50_over_spinning_floor"), p50 / spinning.0));
        out.push((
            format!("{path}_p99_over_spinning_floor_p99"),
            p99 / spinning.1,
        ));
    }

    let batches = (plan.depth, Pipelining::Batches);
    let requests = plan.redis_requests / 2;
    let (fabric, redis) = pair(
        flip,
        || rate_of("fabric", BenchOp::Read, 64, plan.clients, batches),
        || {
            Ok(peers::redis_benchmark(
                s.redis,
                "GET",
                64,
                plan.clients,
                plan.depth,
                requests,
            )?)
        },
    )?;
    out.push((
        "fabric_tput_over_redis".to_owned(),
        fabric.ops_per_s / redis.ops_per_s,
    ));
    let nan = f64::NAN;
    let device_cpu = fabric.device_cpu_s_per_million.unwrap_or(nan);
    let daemons_cpu = fabric.server_cpu_s_per_million.unwrap_or(nan) + device_cpu;
    out.push(("device_cpu_us_per_op".to_owned(), device_cpu));
    out.push((
        "device_busy_cpu_us_per_op".to_owned(),
        fabric.device_busy_cpu_s_per_million.unwrap_or(nan),
    ));
    out.push((
        "fabric_cpu_per_op_over_redis".to_owned(),
        daemons_cpu / redis.server_cpu_s_per_million.unwrap_or(nan),
    ));

    let mib = (1u64 << 20) as f64;
    let window = (4, Pipelining::Window);
    let floor_bw = || Ok(peers::iperf3_bandwidth(duration)?);
    for path in ["fabric", "direct"] {
        let (bw, floor_bw) = pair(
            flip,
            || Ok(ops(path, BenchOp::Read, 1 << 20, 1, window)? * mib),
            floor_bw,
        )?;
        out.push((format!("{path}_bw_over_floor_bw"), bw / floor_bw));
    }

    let aof_requests = (plan.samples as u64).min(20_000) / 2;
    let (persist, aof) = pair(
        flip,
        || p50("fabric", BenchOp::WritePersist, 4096),
        || {
            let r = peers::redis_benchmark(s.redis_aof, "SET", 4096, 1, 1, aof_requests)?;
            Ok(r.latency.p50_us)
        },
    )?;
    out.push((
        "fabric_persist_p50_over_redis_aof".to_owned(),
        persist / aof,
    ));
    Ok((out, census.into_inner()))
}
