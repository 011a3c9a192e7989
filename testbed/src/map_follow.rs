//! `testbed map-follow`: how long every daemon of a fabric on etcd takes to
//! run a new map epoch. The operator writes the map again, unchanged, at
//! the next epoch (a change each daemon must follow, nothing else); from
//! the moment the write returns, one thread per daemon asks its
//! `/metrics` for its epoch until it shows the new one. A report, not a
//! test: the figures depend on the machine and its load, and each is late
//! by up to one scrape of `/metrics`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use topology::Topology;

use crate::epochs::epoch_in;
use crate::etcd::Control;
use crate::launch::{Fabric, LaunchOptions, NetMode};

/// How long one daemon may take to reach an epoch before the measurement
/// gives up.
const FOLLOW_LIMIT: Duration = Duration::from_secs(60);

/// What to measure on.
#[derive(Debug, Clone)]
pub struct FollowPlan {
    /// Loopback or namespaces.
    pub net: NetMode,
    /// etcd members.
    pub members: usize,
    /// How many map changes.
    pub changes: usize,
    /// Logs, etcd data and region files go here.
    pub run_dir: PathBuf,
}

/// The times of every change.
#[derive(Debug, Clone, Default)]
pub struct FollowReport {
    /// Per change: from the write returning until the last daemon ran the
    /// new epoch, in milliseconds.
    pub all_ms: Vec<f64>,
    /// Per daemon (`fabric-device A`): the same for it alone.
    pub per_daemon_ms: BTreeMap<String, Vec<f64>>,
}

/// The median and the largest of `values` (0 for none).
pub fn p50_max(values: &[f64]) -> (f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let p50 = if sorted.is_empty() {
        0.0
    } else {
        sorted[(sorted.len() - 1) / 2]
    };
    (p50, sorted.last().copied().unwrap_or(0.0))
}

impl FollowReport {
    /// The figures as text: every daemon reaching the epoch, then each
    /// daemon alone.
    pub fn text(&self) -> String {
        let (p50, max) = p50_max(&self.all_ms);
        let mut out = format!(
            "every daemon on the new epoch: {} changes, p50 {p50:.1} ms, max {max:.1} ms\n",
            self.all_ms.len()
        );
        for (daemon, times) in &self.per_daemon_ms {
            let (p50, max) = p50_max(times);
            out.push_str(&format!("  {daemon}: p50 {p50:.1} ms, max {max:.1} ms\n"));
        }
        out
    }
}

/// Brings `topology` up on a fresh etcd and times `plan.changes` map
/// changes.
pub fn measure(topology: &Topology, plan: &FollowPlan) -> anyhow::Result<FollowReport> {
    let mut options = LaunchOptions::new(plan.run_dir.join("data"), plan.run_dir.clone())?;
    options.net = plan.net;
    options.control = Control::Etcd {
        members: plan.members,
    };
    options.format = true;
    let fabric = Fabric::start(topology, options).context("bring the fabric up on etcd")?;
    let etcd = fabric.etcd().context("the fabric has no etcd")?;
    let daemons: Vec<(String, std::net::SocketAddr)> = fabric
        .endpoints()
        .into_iter()
        .filter_map(|e| Some((format!("{} {}", e.kind.program(), e.id), e.admin.parse().ok()?)))
        .collect();
    let mut report = FollowReport::default();
    for _ in 0..plan.changes {
        let epoch = etcd.bump_epoch().context("change the map")?;
        let written = Instant::now();
        let times = std::thread::scope(|scope| {
            let waits: Vec<_> = daemons
                .iter()
                .map(|(name, admin)| {
                    scope.spawn(move || (name.clone(), await_epoch(*admin, epoch, written)))
                })
                .collect();
            waits
                .into_iter()
                .map(|w| w.join().expect("a waiting thread does not panic"))
                .collect::<Vec<_>>()
        });
        let mut slowest = 0.0f64;
        for (daemon, time) in times {
            let ms = time.with_context(|| format!("{daemon} did not reach epoch {epoch}"))?;
            slowest = slowest.max(ms);
            report.per_daemon_ms.entry(daemon).or_default().push(ms);
        }
        report.all_ms.push(slowest);
        // Changes one at a time: the next after every daemon ran this one.
        std::thread::sleep(Duration::from_millis(50));
    }
    fabric.stop();
    Ok(report)
}

/// Asks `admin`'s `/metrics` until its epoch is `epoch` or later; the
/// milliseconds from `since` to the answer that showed it.
fn await_epoch(admin: std::net::SocketAddr, epoch: u64, since: Instant) -> Option<f64> {
    while since.elapsed() < FOLLOW_LIMIT {
        let seen = telemetry::http_get(admin, "/metrics", Duration::from_secs(2))
            .ok()
            .and_then(|(_, text)| epoch_in(&text));
        if seen.is_some_and(|seen| seen >= epoch) {
            return Some(since.elapsed().as_secs_f64() * 1000.0);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_lower_middle_and_the_max_the_largest() {
        assert_eq!(p50_max(&[]), (0.0, 0.0));
        assert_eq!(p50_max(&[3.0, 1.0, 2.0]), (2.0, 3.0));
        assert_eq!(p50_max(&[4.0, 1.0, 3.0, 2.0]), (2.0, 4.0));
    }
}
