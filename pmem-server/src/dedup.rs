//! Exactly-once execution of COMPARE_SWAP and FETCH_ADD.
//!
//! A client tags each atomic with (client id, sequence number). The server
//! remembers the result of the most recent [`WINDOW`] atomics of every client,
//! so a request re-issued after a failover is answered with the first result
//! instead of being applied twice. The table is sharded by client id: clients
//! in different shards never contend, and the check-apply-record step of one
//! client is serialised only with the clients sharing its shard.
//!
//! With a [`WindowStore`] the windows are also written to a mapped file, so
//! a server restarted after a crash still answers a retried atomic from the
//! window instead of applying it again.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::dedup_store::{LoadedWindow, WindowStore};

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
    /// Results recorded so far (the store's ring position).
    head: u64,
}

impl From<LoadedWindow> for ClientWindow {
    fn from(loaded: LoadedWindow) -> Self {
        Self {
            results: loaded.results.iter().copied().collect(),
            order: loaded.results.iter().map(|(seq, _)| *seq).collect(),
            evicted_up_to: loaded.evicted_up_to,
            head: loaded.head,
        }
    }
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
    /// Not run, and nothing recorded: the identity is not one this table
    /// keeps windows for.
    Refused(Refusal),
}

/// Why an exactly-once identity is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The client number is not a client of the topology, or the lane is
    /// beyond that client's (lane 0, plus one per RNIC).
    UnknownIdentity,
    /// `u64::MAX` is not a sequence number (nothing can follow it).
    ReservedSeq,
}

impl Refusal {
    /// The `reason` label of the refusal counter.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::UnknownIdentity => "unknown_identity",
            Refusal::ReservedSeq => "reserved_seq",
        }
    }
}

/// Per-client windows of recent atomic results.
#[derive(Debug)]
pub struct DedupTable {
    shards: Vec<Mutex<HashMap<u32, ClientWindow>>>,
    /// The highest lane of each client number; `None`: any identity.
    lanes: Option<Vec<u8>>,
    store: Option<WindowStore>,
    /// Whether a failure to record has been reported already.
    store_failed: AtomicBool,
}

impl Default for DedupTable {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            lanes: None,
            store: None,
            store_failed: AtomicBool::new(false),
        }
    }
}

impl DedupTable {
    /// A table backed by `store`, starting from the windows it held.
    pub fn with_store(store: WindowStore, loaded: HashMap<u32, LoadedWindow>) -> Self {
        let table = Self {
            store: Some(store),
            ..Self::default()
        };
        for (client, window) in loaded {
            table.shards[client as usize % SHARDS]
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(client, window.into());
        }
        table
    }

    /// Keeps windows only for the identities of the topology's clients:
    /// client number `n` (its position) with lanes `0..=lanes[n]`. Anything
    /// else is refused before it creates state, which bounds the table by
    /// the topology.
    pub fn bounded_by(mut self, lanes: Vec<u8>) -> Self {
        self.lanes = Some(lanes);
        self
    }

    /// Whether (`client`, `seq`) may have a window entry.
    fn admits(&self, client: u32, seq: u64) -> Result<(), Refusal> {
        if seq == u64::MAX {
            return Err(Refusal::ReservedSeq);
        }
        let Some(lanes) = &self.lanes else {
            return Ok(());
        };
        let number = (client & proto::request::CLIENT_NUMBER_MASK) as usize;
        let lane = (client >> proto::request::LANE_SHIFT) as u8;
        match lanes.get(number) {
            Some(&max) if lane <= max => Ok(()),
            _ => Err(Refusal::UnknownIdentity),
        }
    }

    /// Runs `apply` unless (`client`, `seq`) was seen before, recording its
    /// result. `apply` runs under the client's shard lock, so two copies of
    /// the same request racing in on two paths apply once.
    /// With a store, the result is written to it before this returns
    /// (durably when `persist`).
    pub fn run<E>(
        &self,
        client: u32,
        seq: u64,
        persist: bool,
        apply: impl FnOnce() -> Result<u64, E>,
    ) -> Result<Dedup, E> {
        if let Err(refusal) = self.admits(client, seq) {
            return Ok(Dedup::Refused(refusal));
        }
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
        if let Some(store) = &self.store {
            let recorded = store.record(
                client,
                window.head,
                seq,
                value,
                window.evicted_up_to,
                persist,
            );
            match recorded {
                Ok(true) => {}
                Ok(false) => self.report_once(&format!(
                    "exactly-once window file is full; client {client} is remembered in memory only"
                )),
                Err(e) => self.report_once(&format!("cannot record an exactly-once result: {e}")),
            }
        }
        window.head += 1;
        Ok(Dedup::Applied(value))
    }

    /// Logs a store problem the first time it happens.
    fn report_once(&self, what: &str) {
        if !self.store_failed.swap(true, Ordering::Relaxed) {
            tracing::warn!("{what}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl DedupTable {
        fn run_test<E>(
            &self,
            client: u32,
            seq: u64,
            apply: impl FnOnce() -> Result<u64, E>,
        ) -> Result<Dedup, E> {
            self.run(client, seq, false, apply)
        }
    }

    #[test]
    fn a_stored_window_answers_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let counter = AtomicU64::new(0);
        {
            let (store, loaded) =
                WindowStore::open(dir.path(), topology::Persistence::Msync, false).unwrap();
            let table = DedupTable::with_store(store, loaded);
            assert_eq!(table.run_test(4, 77, add(&counter)), Ok(Dedup::Applied(0)));
        }
        // A new incarnation of the server, as after kill -9 and a restart.
        let (store, loaded) =
            WindowStore::open(dir.path(), topology::Persistence::Msync, false).unwrap();
        let table = DedupTable::with_store(store, loaded);
        assert_eq!(table.run_test(4, 77, add(&counter)), Ok(Dedup::Replayed(0)));
        assert_eq!(counter.load(Ordering::SeqCst), 1, "applied once");
        assert_eq!(table.run_test(4, 78, add(&counter)), Ok(Dedup::Applied(1)));
    }
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn add(counter: &AtomicU64) -> impl FnOnce() -> Result<u64, Infallible> + '_ {
        || Ok(counter.fetch_add(1, Ordering::SeqCst))
    }

    #[test]
    fn replay_returns_first_result_without_applying() {
        let table = DedupTable::default();
        let counter = AtomicU64::new(10);
        assert_eq!(table.run_test(7, 1, add(&counter)), Ok(Dedup::Applied(10)));
        assert_eq!(table.run_test(7, 1, add(&counter)), Ok(Dedup::Replayed(10)));
        assert_eq!(counter.load(Ordering::SeqCst), 11);
        // Same sequence number from another client is a different request.
        assert_eq!(table.run_test(8, 1, add(&counter)), Ok(Dedup::Applied(11)));
    }

    #[test]
    fn failed_apply_is_not_recorded() {
        let table = DedupTable::default();
        assert_eq!(table.run_test(1, 5, || Err::<u64, _>("boom")), Err("boom"));
        assert_eq!(
            table.run_test(1, 5, || Ok::<_, ()>(3)),
            Ok(Dedup::Applied(3))
        );
    }

    #[test]
    fn window_evicts_oldest_and_reports_stale() {
        let table = DedupTable::default();
        let counter = AtomicU64::new(0);
        for seq in 0..(WINDOW as u64 + 10) {
            assert!(matches!(
                table.run_test(3, seq, add(&counter)),
                Ok(Dedup::Applied(_))
            ));
        }
        assert_eq!(table.run_test(3, 0, add(&counter)), Ok(Dedup::Stale));
        assert_eq!(table.run_test(3, 9, add(&counter)), Ok(Dedup::Stale));
        assert_eq!(
            table.run_test(3, 10, add(&counter)),
            Ok(Dedup::Replayed(10))
        );
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
                        table.run_test(9, seq, add(&counter)).unwrap();
                    }
                });
            }
        });
        assert_eq!(counter.load(Ordering::SeqCst), 1000);
    }

    #[test]
    fn a_bounded_table_refuses_identities_outside_the_topology() {
        let counter = AtomicU64::new(0);
        // Two clients: number 0 with one RNIC (lanes 0 and 1), number 1 with none.
        let table = DedupTable::default().bounded_by(vec![1, 0]);
        let on = |lane: u8, number: u32| {
            proto::request::ExactlyOnce::on_lane(lane, 0)
                .stamped(number)
                .client
        };
        assert_eq!(
            table.run_test(on(0, 0), 1, add(&counter)),
            Ok(Dedup::Applied(0))
        );
        assert_eq!(
            table.run_test(on(1, 0), 1, add(&counter)),
            Ok(Dedup::Applied(1))
        );
        assert_eq!(
            table.run_test(on(0, 1), 1, add(&counter)),
            Ok(Dedup::Applied(2))
        );
        for (lane, number) in [(2, 0), (1, 1), (0, 2), (255, 99)] {
            assert_eq!(
                table.run_test(on(lane, number), 1, add(&counter)),
                Ok(Dedup::Refused(Refusal::UnknownIdentity)),
                "lane {lane} of client {number}"
            );
        }
        assert_eq!(
            table.run_test(on(0, 0), u64::MAX, add(&counter)),
            Ok(Dedup::Refused(Refusal::ReservedSeq))
        );
        assert_eq!(counter.load(Ordering::SeqCst), 3, "refused ones never ran");
        let windows: usize = table.shards.iter().map(|s| s.lock().unwrap().len()).sum();
        assert_eq!(windows, 3, "and left no state");
    }
}
