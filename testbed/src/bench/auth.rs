//! What authentication costs: two bench fabrics side by side, one whose
//! daemons run with `--secrets` (every connection opens with the HMAC
//! challenge–response, as on every other testbed fabric) and one whose
//! daemons run `--insecure`, measured in interleaved rounds.
//!
//! Two figures: the time to open a client connection to the device (TCP
//! connect, HELLO, and with keys the challenge, both proofs), and the
//! round trip of a 64-byte READ on an open connection, where requests are
//! the same bytes either way.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use proto::request::Target;
use serde::{Deserialize, Serialize};
use topology::secrets::{Principal, read_key};
use topology::{Layout, Topology};

use super::client::{self, BenchConn, BenchOp, Shape};
use super::rounds::RatioSpread;
use super::{Plan, bench_topology};
use crate::fabric::launch::{DaemonKind, Fabric, Keys, LaunchOptions};

/// Fewest interleaved rounds of each measurement (more when the plan asks).
const MIN_ROUNDS: usize = 3;

/// Medians over the rounds, in microseconds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AuthCost {
    /// Rounds per figure (each alternates the two fabrics).
    pub rounds: usize,
    /// Connections opened per round and fabric.
    pub opens_per_round: usize,
    /// p50 time to open a connection: TCP connect and HELLO.
    pub open_plain_p50_us: f64,
    /// p50 time to open one with the challenge and proofs as well.
    pub open_authenticated_p50_us: f64,
    /// p50 round trip of a 64-byte READ, unauthenticated fabric.
    pub read_plain_p50_us: f64,
    /// The same on the authenticated fabric.
    pub read_authenticated_p50_us: f64,
    /// Each round's authenticated ÷ unauthenticated READ p50 (the two
    /// measured back to back), in round order; the tracked ratio is their
    /// median.
    #[serde(default)]
    pub read_ratio_per_round: Vec<f64>,
}

/// One of the two fabrics.
struct Side {
    fabric: Fabric,
    port: SocketAddr,
    key: Option<[u8; 32]>,
    shape: Shape,
}

impl Side {
    fn start(out: &Path, name: &str, plan: &Plan, authenticate: bool) -> anyhow::Result<Side> {
        let topology: Topology = bench_topology()?;
        let layout = Layout::new(&topology)?;
        let region = &layout.entries()[0];
        let dir = out.join(name);
        let mut launch = LaunchOptions::new(dir.join("data"), dir.join("run"))?;
        launch.device_args = vec![
            "--busy-poll-us".into(),
            plan.device_busy_poll_us.to_string(),
            "--max-connections-per-client".into(),
            "4096".into(),
        ];
        if !authenticate {
            launch.keys = Keys::Insecure;
        }
        let fabric = Fabric::start(&topology, launch)
            .with_context(|| format!("bring the {name} bench fabric up"))?;
        let key = match fabric.secrets() {
            Some(secrets) => Some(read_key(secrets, Principal::Client("c"))?),
            None => None,
        };
        let port = fabric
            .ready_field(DaemonKind::FabricDevice, "F", "port.p0")
            .and_then(|a| a.parse().ok())
            .context("no device port address")?;
        let region_key = BenchConn::open(port, "c", key)?.region_key(region.region)?;
        Ok(Side {
            fabric,
            port,
            key,
            shape: Shape::new(BenchOp::Read, Target::Pmem(region.start), region_key, 64),
        })
    }

    /// p50 of `count` connection openings, in µs.
    fn opens(&self, count: usize) -> anyhow::Result<f64> {
        let mut times = Vec::with_capacity(count);
        for _ in 0..count {
            let started = Instant::now();
            let conn = BenchConn::open(self.port, "c", self.key)?;
            times.push(started.elapsed());
            drop(conn);
        }
        let micros = times.iter().map(|t| t.as_secs_f64() * 1e6).collect();
        Ok(RatioSpread::of(micros).median)
    }

    /// p50 of 64-byte READ round trips for `duration`, in µs.
    fn reads(&self, plan: &Plan, duration: Duration) -> anyhow::Result<f64> {
        let mut conn = BenchConn::open(self.port, "c", self.key)?;
        let h = client::latency(&mut conn, &self.shape, 200, duration, plan.samples)?;
        Ok(h.quantile(0.5) as f64)
    }
}

/// Measures both fabrics in `ROUNDS` interleaved rounds.
pub fn measure(plan: &Plan, out: &Path) -> anyhow::Result<AuthCost> {
    let plain = Side::start(out, "auth-off", plan, false)?;
    let authenticated = Side::start(out, "auth-on", plan, true)?;
    let opens = if plan.seconds < 1.0 { 100 } else { 400 };
    let duration = Duration::from_secs_f64(plan.seconds / 2.0);
    let (mut open_plain, mut open_auth, mut read_plain, mut read_auth) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let rounds = plan.rounds.max(MIN_ROUNDS);
    for round in 0..rounds {
        // Alternate which side goes first, so drift hits both alike.
        let sides = match round % 2 {
            0 => [(&plain, false), (&authenticated, true)],
            _ => [(&authenticated, true), (&plain, false)],
        };
        for (side, auth) in sides {
            let open = side.opens(opens)?;
            let read = side.reads(plan, duration)?;
            if auth {
                open_auth.push(open);
                read_auth.push(read);
            } else {
                open_plain.push(open);
                read_plain.push(read);
            }
        }
    }
    drop((plain.fabric, authenticated.fabric));
    let read_ratio_per_round: Vec<f64> = read_auth
        .iter()
        .zip(&read_plain)
        .map(|(auth, plain)| auth / plain)
        .collect();
    Ok(AuthCost {
        read_ratio_per_round,
        rounds,
        opens_per_round: opens,
        open_plain_p50_us: RatioSpread::of(open_plain).median,
        open_authenticated_p50_us: RatioSpread::of(open_auth).median,
        read_plain_p50_us: RatioSpread::of(read_plain).median,
        read_authenticated_p50_us: RatioSpread::of(read_auth).median,
    })
}
