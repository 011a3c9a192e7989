//! Sampling each daemon's map epoch during a run: its `*_map_epoch` gauge
//! from its `/metrics` (the epoch it runs), kept only when it changes; and
//! each worker's, as the worker says it (a client on etcd).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::fabric::launch::Fabric;
use crate::report::EpochChange;

/// How often the daemons are asked.
pub const SAMPLE_PERIOD: Duration = Duration::from_millis(250);

/// How long one scrape may take before the daemon is skipped this round.
const SCRAPE_TIMEOUT: Duration = Duration::from_millis(500);

/// The epoch gauge in a Prometheus text exposition: the value of the first
/// sample whose metric name ends in `_map_epoch`.
pub fn epoch_in(metrics: &str) -> Option<u64> {
    metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (name, value) = line.split_once(' ')?;
            let name = name.split('{').next()?;
            if !name.ends_with("_map_epoch") {
                return None;
            }
            let value: f64 = value.split_whitespace().next()?.parse().ok()?;
            (value >= 0.0 && value.fract() == 0.0).then_some(value as u64)
        })
}

/// The epochs seen so far and when each daemon changed.
#[derive(Debug, Default)]
pub struct EpochSampler {
    last: BTreeMap<String, u64>,
    changes: Vec<EpochChange>,
    next: Option<Instant>,
}

impl EpochSampler {
    /// A sampler that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks every running daemon of `fabric` for its epoch when a period
    /// has passed since the last round; a daemon that does not answer (it
    /// was killed) is skipped. Times count from `start`.
    pub fn sample(&mut self, fabric: &Fabric, start: Instant) {
        let now = Instant::now();
        if self.next.is_some_and(|next| now < next) {
            return;
        }
        self.next = Some(now + SAMPLE_PERIOD);
        for endpoint in fabric.endpoints() {
            let Ok(admin) = endpoint.admin.parse() else {
                continue;
            };
            let Ok((200, text)) = telemetry::http_get(admin, "/metrics", SCRAPE_TIMEOUT) else {
                continue;
            };
            let Some(epoch) = epoch_in(&text) else {
                continue;
            };
            let daemon = format!("{} {}", endpoint.kind.program(), endpoint.id);
            self.note(&daemon, epoch, start);
        }
    }

    /// [`EpochSampler::sample`] at once, whenever the last round was: the
    /// last look at the end of a run.
    pub fn sample_now(&mut self, fabric: &Fabric, start: Instant) {
        self.next = None;
        self.sample(fabric, start);
    }

    /// Records that `who` runs `epoch` now, if that is a change; times
    /// count from `start`.
    pub fn note(&mut self, who: &str, epoch: u64, start: Instant) {
        if self.last.get(who) != Some(&epoch) {
            self.changes.push(EpochChange {
                daemon: who.to_owned(),
                at_s: start.elapsed().as_secs_f64(),
                epoch,
            });
            self.last.insert(who.to_owned(), epoch);
        }
    }

    /// Every change seen, in the order seen.
    pub fn finish(self) -> Vec<EpochChange> {
        self.changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_changes_of_an_epoch_are_kept() {
        let start = Instant::now();
        let mut sampler = EpochSampler::new();
        for epoch in [1, 1, 2, 2, 2, 3] {
            sampler.note("worker c1", epoch, start);
        }
        sampler.note("worker c2", 2, start);
        let seen: Vec<(String, u64)> = sampler
            .finish()
            .into_iter()
            .map(|c| (c.daemon, c.epoch))
            .collect();
        let want = [
            ("worker c1", 1),
            ("worker c1", 2),
            ("worker c1", 3),
            ("worker c2", 2),
        ];
        let want: Vec<(String, u64)> = want.iter().map(|(w, e)| ((*w).to_owned(), *e)).collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn the_epoch_gauge_is_read_from_either_daemons_exposition() {
        let device = "# HELP fabric_device_map_epoch The map epoch.\n\
                      # TYPE fabric_device_map_epoch gauge\n\
                      fabric_device_links 3\nfabric_device_map_epoch 7\n";
        assert_eq!(epoch_in(device), Some(7));
        assert_eq!(epoch_in("pmem_server_map_epoch{pool=\"p\"} 12\n"), Some(12));
        assert_eq!(epoch_in("pmem_server_requests_total 5\n"), None);
        assert_eq!(epoch_in("pmem_server_map_epoch nonsense\n"), None);
        assert_eq!(epoch_in("pmem_server_map_epoch -1\n"), None);
    }
}
