//! Exactly-once execution of COMPARE_SWAP and FETCH_ADD.
//!
//! A client tags each atomic with (client id, sequence number). The server
//! remembers the result of the most recent [`WINDOW`] atomics of every client,
//! so a request re-issued after a failover is answered with the first result
//! instead of being applied twice. The table is sharded by client id: clients
//! in different shards never contend, and the check-apply-record step of one
//! client is serialised only with the clients sharing its shard.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};

/// Results remembered per client.
pub const WINDOW: usize = 4096;
const SHARDS: usize = 64;

/// The remembered results of one client.
#[derive(Debug, Default)]
struct ClientWindow {
    results: HashMap<u64, u64>,
    /// Sequence numbers in the order they were recorded, oldest first.
    order: VecDeque<u64>,
    /// The highest sequence number ever evicted; older ones are unknowable.
    evicted_up_to: Option<u64>,
}

/// What happened to an exactly-once request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dedup {
    /// First time seen: the operation ran and returned this value.
    Applied(u64),
    /// Seen before: this is the value the first execution returned.
    Replayed(u64),
    /// Too old to tell whether it ran: its result has left the window.
    Stale,
}

/// Per-client windows of recent atomic results.
#[derive(Debug)]
pub struct DedupTable {
    shards: Vec<Mutex<HashMap<u32, ClientWindow>>>,
}

impl Default for DedupTable {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
}

impl DedupTable {
    /// Runs `apply` unless (`client`, `seq`) was seen before, recording its
    /// result. `apply` runs under the client's shard lock, so two copies of
    /// the same request racing in on two paths apply once.
    pub fn run<E>(
        &self,
        client: u32,
        seq: u64,
        apply: impl FnOnce() -> Result<u64, E>,
    ) -> Result<Dedup, E> {
        let shard = &self.shards[client as usize % SHARDS];
        let mut clients = shard.lock().unwrap_or_else(PoisonError::into_inner);
        let window = clients.entry(client).or_default();
        if let Some(&value) = window.results.get(&seq) {
            return Ok(Dedup::Replayed(value));
        }
        if window.evicted_up_to.is_some_and(|old| seq <= old) {
            return Ok(Dedup::Stale);
        }
        let value = apply()?;
        window.results.insert(seq, value);
        window.order.push_back(seq);
        if window.order.len() > WINDOW
            && let Some(old) = window.order.pop_front()
        {
            window.results.remove(&old);
            window.evicted_up_to = Some(window.evicted_up_to.map_or(old, |e| e.max(old)));
        }
        Ok(Dedup::Applied(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn add(counter: &AtomicU64) -> impl FnOnce() -> Result<u64, Infallible> + '_ {
        || Ok(counter.fetch_add(1, Ordering::SeqCst))
    }

    #[test]
    fn replay_returns_first_result_without_applying() {
        let table = DedupTable::default();
        let counter = AtomicU64::new(10);
        assert_eq!(table.run(7, 1, add(&counter)), Ok(Dedup::Applied(10)));
        assert_eq!(table.run(7, 1, add(&counter)), Ok(Dedup::Replayed(10)));
        assert_eq!(counter.load(Ordering::SeqCst), 11);
        // Same sequence number from another client is a different request.
        assert_eq!(table.run(8, 1, add(&counter)), Ok(Dedup::Applied(11)));
    }

    #[test]
    fn failed_apply_is_not_recorded() {
        let table = DedupTable::default();
        assert_eq!(table.run(1, 5, || Err::<u64, _>("boom")), Err("boom"));
        assert_eq!(table.run(1, 5, || Ok::<_, ()>(3)), Ok(Dedup::Applied(3)));
    }

    #[test]
    fn window_evicts_oldest_and_reports_stale() {
        let table = DedupTable::default();
        let counter = AtomicU64::new(0);
        for seq in 0..(WINDOW as u64 + 10) {
            assert!(matches!(
                table.run(3, seq, add(&counter)),
                Ok(Dedup::Applied(_))
            ));
        }
        assert_eq!(table.run(3, 0, add(&counter)), Ok(Dedup::Stale));
        assert_eq!(table.run(3, 9, add(&counter)), Ok(Dedup::Stale));
        assert_eq!(table.run(3, 10, add(&counter)), Ok(Dedup::Replayed(10)));
        assert_eq!(counter.load(Ordering::SeqCst), WINDOW as u64 + 10);
    }

    #[test]
    fn racing_duplicates_apply_once() {
        let table = DedupTable::default();
        let counter = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for seq in 0..1000 {
                        table.run(9, seq, add(&counter)).unwrap();
                    }
                });
            }
        });
        assert_eq!(counter.load(Ordering::SeqCst), 1000);
    }
}
