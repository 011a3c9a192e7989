//! `testbed map-follow`: how long every daemon of a fabric on etcd takes to
//! run a new map epoch. The operator writes the map again, unchanged, at
//! the next epoch (a change each daemon must follow, nothing else); the
//! time is from the write returning (wall clock) to the daemon's log line
//! `map epoch=N applied` (its own timestamp, in microseconds). The next
//! change waits until every daemon's `/metrics` shows the epoch. A report,
//! not a test: the figures depend on the machine and its load.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use topology::Topology;

use crate::fabric::epochs::epoch_in;
use crate::fabric::etcd::Control;
use crate::fabric::launch::{Fabric, LaunchOptions, NetMode};

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
    match crate::stats::spread(values) {
        (p50, _, max) if !values.is_empty() => (p50, max),
        _ => (0.0, 0.0),
    }
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
        .filter_map(|e| {
            Some((
                format!("{} {}", e.kind.program(), e.id),
                e.admin.parse().ok()?,
            ))
        })
        .collect();
    let mut written = Vec::new();
    for _ in 0..plan.changes {
        let epoch = etcd.bump_epoch().context("change the map")?;
        written.push((epoch, unix_us_now()));
        let since = Instant::now();
        for (daemon, admin) in &daemons {
            if !await_epoch(*admin, epoch, since) {
                anyhow::bail!("{daemon} did not reach epoch {epoch} within {FOLLOW_LIMIT:?}");
            }
        }
    }
    let mut report = FollowReport::default();
    let logs = plan.run_dir.join("logs");
    let mut applied: BTreeMap<String, BTreeMap<u64, i64>> = BTreeMap::new();
    for (daemon, _) in &daemons {
        let file = logs.join(format!("{}.log", daemon.replace(' ', "-")));
        applied.insert(daemon.clone(), applied_epochs(&file)?);
    }
    for (epoch, at_us) in written {
        let mut slowest = 0.0f64;
        for (daemon, epochs) in &applied {
            let seen = epochs.get(&epoch).with_context(|| {
                format!("{daemon}'s log has no `map epoch={epoch} applied` line")
            })?;
            // A daemon may log before the write's answer reaches us.
            let ms = ((seen - at_us) as f64 / 1000.0).max(0.0);
            slowest = slowest.max(ms);
            report
                .per_daemon_ms
                .entry(daemon.clone())
                .or_default()
                .push(ms);
        }
        report.all_ms.push(slowest);
    }
    fabric.stop();
    Ok(report)
}

/// Asks `admin`'s `/metrics` every 10 ms until its epoch is `epoch` or
/// later; false after [`FOLLOW_LIMIT`] from `since`.
fn await_epoch(admin: std::net::SocketAddr, epoch: u64, since: Instant) -> bool {
    while since.elapsed() < FOLLOW_LIMIT {
        let seen = telemetry::http_get(admin, "/metrics", Duration::from_secs(2))
            .ok()
            .and_then(|(_, text)| epoch_in(&text));
        if seen.is_some_and(|seen| seen >= epoch) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

fn unix_us_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// Every `map epoch=N applied` line of a daemon's log: N and when, in
/// microseconds since the Unix epoch.
fn applied_epochs(log: &Path) -> anyhow::Result<BTreeMap<u64, i64>> {
    let text = std::fs::read_to_string(log).with_context(|| format!("read {}", log.display()))?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let at = line.find("map epoch=")? + "map epoch=".len();
            let rest = &line[at..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            if !rest[digits.len()..].starts_with(" applied") {
                return None;
            }
            let when = unix_us_of(line.split_whitespace().next()?)?;
            Some((digits.parse().ok()?, when))
        })
        .collect())
}

/// A log line's UTC timestamp (`2026-11-27T14:45:07.450552Z`) in
/// microseconds since the Unix epoch.
fn unix_us_of(stamp: &str) -> Option<i64> {
    let stamp = stamp.strip_suffix('Z')?;
    let (date, time) = stamp.split_once('T')?;
    let mut ymd = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, d) = (ymd.next()??, ymd.next()??, ymd.next()??);
    let (hms, fraction) = time.split_once('.').unwrap_or((time, "0"));
    let mut parts = hms.split(':').map(|p| p.parse::<i64>().ok());
    let (hh, mm, ss) = (parts.next()??, parts.next()??, parts.next()??);
    let micros: String = fraction
        .chars()
        .chain(std::iter::repeat('0'))
        .take(6)
        .collect();
    // Days since 1970-01-01 of a proleptic Gregorian date.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400 + hh * 3600 + mm * 60 + ss) * 1_000_000) + micros.parse::<i64>().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_lower_middle_and_the_max_the_largest() {
        assert_eq!(p50_max(&[]), (0.0, 0.0));
        assert_eq!(p50_max(&[3.0, 1.0, 2.0]), (2.0, 3.0));
        assert_eq!(p50_max(&[4.0, 1.0, 3.0, 2.0]), (2.5, 4.0));
    }

    #[test]
    fn log_timestamps_are_read_as_unix_microseconds() {
        assert_eq!(unix_us_of("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(unix_us_of("1970-01-02T00:00:01.5Z"), Some(86_401_500_000));
        // 2026-11-27 is day 20_784 since 1970-01-01.
        assert_eq!(
            unix_us_of("2026-11-27T14:45:07.450552Z"),
            Some((20_784 * 86_400 + 14 * 3600 + 45 * 60 + 7) * 1_000_000 + 450_552)
        );
        assert_eq!(unix_us_of("yesterday"), None);
    }

    #[test]
    fn applied_lines_are_found_and_the_was_epoch_is_not_taken_for_one() {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("d.log");
        std::fs::write(
            &log,
            "1970-01-01T00:00:01Z  INFO x: map epoch=3 applied (was epoch=2): 4 regions\n\
             1970-01-01T00:00:02.000001Z  INFO x: map epoch=4 applied (was epoch=3)\n\
             1970-01-01T00:00:03Z  WARN x: refusing the map: keeping epoch=4\n",
        )
        .expect("write");
        let epochs = applied_epochs(&log).expect("read");
        assert_eq!(
            epochs.into_iter().collect::<Vec<_>>(),
            [(3, 1_000_000), (4, 2_000_001)]
        );
    }
}
