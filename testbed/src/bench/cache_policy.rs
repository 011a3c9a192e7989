//! The server's cache policy under a mixed load: small hot READs and
//! WRITEs at queue depth 1 beside a stream of bulk WRITEs, with the bulk
//! writes sent as a pool with [`ServerCache::Cached`] sends them (ordinary
//! stores on the server) and as one with [`ServerCache::Auto`] does
//! (non-temporal stores from [`NON_TEMPORAL_FROM`] bytes on, so 64 KiB
//! writes bypass the server's CPU cache). The small operations ask for
//! the cache under either policy; what changes is whether the bulk
//! stream pushes their lines out of it.
//!
//! Everything goes through the fabric device. The two policies alternate
//! in interleaved rounds (the order flipping every round); each round
//! gives the ratio Auto ÷ Cached of the small operations' p99.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use pmem_client::ServerCache;
use pmem_client::pool::NON_TEMPORAL_FROM;
use serde::{Deserialize, Serialize};

use super::client::{self, BenchOp, Pipelining, Shape};
use super::rounds::{RatioSpread, pair};
use super::{Paths, Plan};

/// The tracked ratio of the small READs' p99, Auto ÷ Cached.
pub const READ_P99_RATIO: &str = "cache_auto_over_cached_small_read_p99";
/// The tracked ratio of the small WRITEs' p99, Auto ÷ Cached.
pub const WRITE_P99_RATIO: &str = "cache_auto_over_cached_small_write_p99";

/// Bytes of a small operation.
const SMALL: u32 = 64;
/// The hot range the small operations walk, from the region's start.
const HOT_SPAN: u64 = 4096;
/// Bytes of a bulk WRITE: the size from which `Auto` asks for non-temporal
/// stores.
const BULK: u32 = NON_TEMPORAL_FROM as u32;
/// Bulk WRITEs in flight on their connection (a sliding window).
const BULK_DEPTH: usize = 4;

/// The two policies compared, the baseline first.
const POLICIES: [ServerCache; 2] = [ServerCache::Cached, ServerCache::Auto];

/// One policy's figures: medians over the rounds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PolicyFigures {
    /// `cached` or `auto`.
    pub policy: String,
    /// Whether the bulk WRITEs carried the NON_TEMPORAL flag.
    pub bulk_non_temporal: bool,
    /// Small READ round trip, p50 µs.
    pub read_p50_us: f64,
    /// Small READ round trip, p99 µs.
    pub read_p99_us: f64,
    /// Small WRITE round trip, p50 µs.
    pub write_p50_us: f64,
    /// Small WRITE round trip, p99 µs.
    pub write_p99_us: f64,
    /// The bulk stream's bytes per second.
    pub bulk_bytes_per_s: f64,
}

/// The case's figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CachePolicyCost {
    /// Bytes of each small READ and WRITE.
    pub small_size: u32,
    /// Bytes the small operations walk over, from the region's start.
    pub hot_span: u64,
    /// Bytes of each bulk WRITE.
    pub bulk_size: u32,
    /// Bulk WRITEs in flight.
    pub bulk_depth: usize,
    /// Bytes the bulk WRITEs walk over, so they do not hit the same lines.
    pub bulk_span: u64,
    /// Rounds, each measuring both policies.
    pub rounds: usize,
    /// `cached`, then `auto`.
    pub policies: Vec<PolicyFigures>,
    /// Each round's small READ p99, Auto ÷ Cached.
    pub read_p99_ratio_per_round: Vec<f64>,
    /// Each round's small WRITE p99, Auto ÷ Cached.
    pub write_p99_ratio_per_round: Vec<f64>,
}

/// One policy's figures of one round.
#[derive(Debug, Clone, Copy)]
struct Sample {
    read: (f64, f64),
    write: (f64, f64),
    bulk_bytes_per_s: f64,
}

/// Measures both policies in `plan.rounds` interleaved rounds on the
/// fabric path of `paths`, in a region of `region_len` bytes whose
/// requests `shape` makes.
pub(super) fn measure(
    plan: &Plan,
    paths: &Paths,
    shape: &dyn Fn(BenchOp, u32) -> Shape,
    region_len: u64,
) -> anyhow::Result<CachePolicyCost> {
    // The bulk stream walks the region's upper half, the hot range sits
    // at its start.
    let bulk_span = (region_len / 2).max(u64::from(BULK));
    let bulk_at = region_len - bulk_span;
    let rounds = plan.rounds.max(1);
    let duration = Duration::from_secs_f64(plan.seconds / 2.0);
    let mut samples: [Vec<Sample>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        let one = |policy: ServerCache| {
            one_policy(plan, paths, shape, (bulk_at, bulk_span), policy, duration)
                .with_context(|| format!("round {} with the {policy} policy", round + 1))
        };
        let (cached, auto) = pair(round % 2 == 1, || one(POLICIES[0]), || one(POLICIES[1]))?;
        samples[0].push(cached);
        samples[1].push(auto);
    }
    let ratio_per_round = |p99: fn(&Sample) -> f64| -> Vec<f64> {
        samples[0]
            .iter()
            .zip(&samples[1])
            .map(|(cached, auto)| p99(auto) / p99(cached))
            .collect()
    };
    let policies = POLICIES
        .iter()
        .zip(&samples)
        .map(|(policy, rounds)| {
            let median =
                |f: fn(&Sample) -> f64| RatioSpread::of(rounds.iter().map(f).collect()).median;
            PolicyFigures {
                policy: policy.name().to_owned(),
                bulk_non_temporal: policy.non_temporal(u64::from(BULK), NON_TEMPORAL_FROM),
                read_p50_us: median(|s| s.read.0),
                read_p99_us: median(|s| s.read.1),
                write_p50_us: median(|s| s.write.0),
                write_p99_us: median(|s| s.write.1),
                bulk_bytes_per_s: median(|s| s.bulk_bytes_per_s),
            }
        })
        .collect();
    Ok(CachePolicyCost {
        small_size: SMALL,
        hot_span: HOT_SPAN,
        bulk_size: BULK,
        bulk_depth: BULK_DEPTH,
        bulk_span,
        rounds,
        policies,
        read_p99_ratio_per_round: ratio_per_round(|s| s.read.1),
        write_p99_ratio_per_round: ratio_per_round(|s| s.write.1),
    })
}

/// One round of `policy`: the bulk stream starts on a connection of its
/// own, the small READs then WRITEs are timed for `duration` each beside
/// it, then the stream stops.
fn one_policy(
    plan: &Plan,
    paths: &Paths,
    shape: &dyn Fn(BenchOp, u32) -> Shape,
    (bulk_at, bulk_span): (u64, u64),
    policy: ServerCache,
    duration: Duration,
) -> anyhow::Result<Sample> {
    let small = |op| Shape {
        spread: HOT_SPAN,
        non_temporal: policy.non_temporal(u64::from(SMALL), NON_TEMPORAL_FROM),
        ..shape(op, SMALL)
    };
    let base = shape(BenchOp::Write, BULK);
    let bulk = Shape {
        target: match base.target {
            proto::request::Target::Pmem(start) => proto::request::Target::Pmem(start + bulk_at),
            other => other,
        },
        spread: bulk_span,
        non_temporal: policy.non_temporal(u64::from(BULK), NON_TEMPORAL_FROM),
        ..base
    };
    let mut bulk_conn = paths.connect("fabric")?;
    let mut small_conn = paths.connect("fabric")?;
    let running = AtomicBool::new(true);
    std::thread::scope(|s| -> anyhow::Result<Sample> {
        let stream = s.spawn(|| {
            client::pipelined_while(
                &mut bulk_conn,
                &bulk,
                BULK_DEPTH,
                Pipelining::Window,
                &|| running.load(Ordering::Relaxed),
            )
        });
        let timed = (|| -> anyhow::Result<_> {
            let mut quantiles = |op| -> anyhow::Result<(f64, f64)> {
                let h = client::latency(&mut small_conn, &small(op), 200, duration, plan.samples)?;
                Ok((h.quantile(0.5) as f64, h.quantile(0.99) as f64))
            };
            Ok((quantiles(BenchOp::Read)?, quantiles(BenchOp::Write)?))
        })();
        running.store(false, Ordering::Relaxed);
        let streamed = stream
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the bulk stream's thread panicked")));
        let (read, write) = timed?;
        let (ops, took) = streamed.context("the bulk WRITE stream")?;
        Ok(Sample {
            read,
            write,
            bulk_bytes_per_s: ops as f64 * f64::from(BULK) / took.as_secs_f64().max(1e-9),
        })
    })
}
