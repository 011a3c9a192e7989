//! A replicated region against an unreplicated one: a second bench fabric
//! whose region has two copies (`[pool] replicas = 2`: servers `S` and
//! `T`, each holding the other's region as a backup; device `F` owns both
//! and links to both), beside the main bench fabric (one server, one
//! copy). In interleaved rounds, each pair measured back to back with the
//! order flipping every round:
//!
//! - 4 KiB WRITE_PERSIST p50 at queue depth 1: the owner device writes
//!   every copy in parallel and answers when all have answered;
//! - 64 B READ throughput, pipelined as the other throughput figures: the
//!   owner spreads reads over the serving copies.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use proto::request::Target;
use serde::{Deserialize, Serialize};
use testkit::FabricSpec;
use topology::{Layout, Topology};

use super::client::{self, BenchOp, Pipelining, Shape};
use super::rounds::{RatioSpread, pair};
use super::{Paths, Pids, Plan, rate, ways_in};
use crate::fabric::launch::{Fabric, LaunchOptions};
use crate::fabric::loopback::loopback_topology;

/// The tracked ratio of WRITE_PERSIST p50, two copies ÷ one.
pub const PERSIST_RATIO: &str = "replicated_persist_p50_over_unreplicated";
/// The tracked ratio of READ throughput, two copies ÷ one.
pub const READ_RATIO: &str = "replicated_read_tput_over_unreplicated";

/// Copies of the replicated fabric's region.
const REPLICAS: u64 = 2;

/// The case's figures: medians over the rounds, and each round's ratios.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplicationCost {
    /// Copies of the replicated region.
    pub replicas: u64,
    /// Rounds, each measuring both fabrics.
    pub rounds: usize,
    /// 4 KiB WRITE_PERSIST p50 µs, one copy.
    pub persist_p50_us_unreplicated: f64,
    /// The same with every copy written.
    pub persist_p50_us_replicated: f64,
    /// 64 B READ operations per second, one copy.
    pub read_ops_per_s_unreplicated: f64,
    /// The same, reads spread over the copies.
    pub read_ops_per_s_replicated: f64,
    /// Each round's WRITE_PERSIST p50, replicated ÷ unreplicated.
    pub persist_p50_ratio_per_round: Vec<f64>,
    /// Each round's READ throughput, replicated ÷ unreplicated.
    pub read_tput_ratio_per_round: Vec<f64>,
}

/// The main bench fabric, the unreplicated side.
pub(super) struct Unreplicated<'a> {
    pub(super) paths: &'a Paths,
    pub(super) pids: Pids,
    pub(super) shape: &'a dyn Fn(BenchOp, u32) -> Shape,
}

/// The replicated bench fabric: servers `S` (region `R`, the one measured)
/// and `T` (region `U`), two copies of each, device `F`, client `c`, on
/// free loopback ports.
pub(crate) fn replicated_topology() -> anyhow::Result<Topology> {
    let spec = FabricSpec::new()
        .extent_size("2MiB")
        .server("S", &[("R", "64MiB")])
        .server("T", &[("U", "8MiB")])
        .device("F")
        .client("c");
    loopback_topology(&spec, "bench-replicated", Some(REPLICAS))
}

/// Brings the replicated fabric up next to `unreplicated` (under
/// `out/replicated`) and measures both in `plan.rounds` interleaved
/// rounds.
pub(super) fn measure(
    plan: &Plan,
    unreplicated: Unreplicated<'_>,
    out: &Path,
) -> anyhow::Result<ReplicationCost> {
    let topology = replicated_topology()?;
    let layout = Layout::new(&topology)?;
    let region = &layout.entries()[0];
    let dir = out.join("replicated");
    let mut launch = LaunchOptions::new(dir.join("data"), dir.join("run"))?;
    launch.device_args = plan.device_args();
    let fabric =
        Fabric::start(&topology, launch).context("bring the replicated bench fabric up")?;
    let (paths, pids) = ways_in(&fabric)?;
    let key = paths.connect("fabric")?.region_key(region.region)?;
    let shape = |op, size| Shape::new(op, Target::Pmem(region.start), key, size);

    let duration = Duration::from_secs_f64(plan.seconds / 2.0);
    let persist_p50 = |paths: &Paths, shape: Shape| -> anyhow::Result<f64> {
        let mut conn = paths.connect("fabric")?;
        let h = client::latency(&mut conn, &shape, 200, duration, plan.samples)?;
        Ok(h.quantile(0.5) as f64)
    };
    let read_rate = |paths: &Paths, pids: Pids, shape: Shape| -> anyhow::Result<f64> {
        let window = (plan.depth, Pipelining::Batches);
        let r = rate(
            paths,
            "fabric",
            &shape,
            plan.clients,
            window,
            duration,
            pids,
        )?;
        Ok(r.ops_per_s)
    };
    let one = |op, size| (unreplicated.shape)(op, size);
    let rounds = plan.rounds.max(1);
    let (mut persist, mut reads) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let flip = round % 2 == 1;
        let p = pair(
            flip,
            || persist_p50(unreplicated.paths, one(BenchOp::WritePersist, 4096)),
            || persist_p50(&paths, shape(BenchOp::WritePersist, 4096)),
        )
        .with_context(|| format!("round {}: WRITE_PERSIST 4 KiB", round + 1))?;
        let r = pair(
            flip,
            || {
                read_rate(
                    unreplicated.paths,
                    unreplicated.pids,
                    one(BenchOp::Read, 64),
                )
            },
            || read_rate(&paths, pids, shape(BenchOp::Read, 64)),
        )
        .with_context(|| format!("round {}: READ 64 B throughput", round + 1))?;
        persist.push(p);
        reads.push(r);
    }
    drop(fabric);
    let median = |values: &[(f64, f64)], side: fn(&(f64, f64)) -> f64| {
        RatioSpread::of(values.iter().map(side).collect()).median
    };
    let ratios =
        |values: &[(f64, f64)]| -> Vec<f64> { values.iter().map(|(one, two)| two / one).collect() };
    Ok(ReplicationCost {
        replicas: REPLICAS,
        rounds,
        persist_p50_us_unreplicated: median(&persist, |v| v.0),
        persist_p50_us_replicated: median(&persist, |v| v.1),
        read_ops_per_s_unreplicated: median(&reads, |v| v.0),
        read_ops_per_s_replicated: median(&reads, |v| v.1),
        persist_p50_ratio_per_round: ratios(&persist),
        read_tput_ratio_per_round: ratios(&reads),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_measured_region_has_a_copy_on_each_server() {
        let topology = replicated_topology().expect("a valid topology");
        assert!(topology.is_replicated());
        let sets = topology.replica_sets();
        let r = sets
            .iter()
            .find(|set| set.region.as_str() == "R")
            .expect("region R");
        let servers: Vec<&str> = r.replicas.iter().map(|c| c.server.as_str()).collect();
        assert_eq!(servers, ["S", "T"]);
        let layout = Layout::new(&topology).expect("layout");
        assert_eq!(layout.entries()[0].region_id.as_str(), "R");
    }
}
