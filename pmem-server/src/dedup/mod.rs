//! Exactly-once execution of COMPARE_SWAP and FETCH_ADD.
//!
//! A client tags each atomic with (client id, sequence number). The server
//! remembers the result of the most recent [`WINDOW`] atomics of every client,
//! so a request re-issued after a failover is answered with the first result
//! instead of being applied twice. Each result is kept with a digest of the
//! request that produced it ([`RequestDigest`]): only the same request is
//! answered from the record; another one under a recorded identity is a
//! [`Dedup::Conflict`] and runs nowhere. Who may use which identity is the
//! executor's to check before it asks this table. The table is sharded by client id: clients
//! in different shards never contend, and the check-apply-record step of one
//! client is serialised only with the clients sharing its shard.
//!
//! With a [`WindowStore`] the windows are also written to a mapped file, so
//! a server restarted after a crash still answers a retried atomic from the
//! window instead of applying it again. Changing the word and recording the
//! result are one failure-atomic step: an intent is written before the word
//! changes, and recovery settles an interrupted atomic by its word (see
//! [`store`]).
//!
//! A client numbers its atomics in sessions (the upper 32 bits of the
//! sequence number, one per process or queue pair), so several processes
//! can share an identity: staleness is judged per session
//! ([`marks`]).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError, RwLock};

mod marks;
mod record;
mod store;

pub use record::{Recorded, RequestDigest, WINDOW};
pub use store::{Expect, FILE_NAME, Intent, StoreError, WindowStore};

use crate::persist::PersistError;
use marks::{RaisedMark, StaleMarks};
use store::{INTENTS, LoadedWindow};

const SHARDS: usize = 64;

/// The remembered results of one client.
#[derive(Debug, Default)]
struct ClientWindow {
    results: HashMap<u64, Recorded>,
    /// Sequence numbers in the order they were recorded, oldest first.
    order: VecDeque<u64>,
    /// Which sequence numbers left the window, per session.
    marks: StaleMarks,
    /// Results recorded so far (the store's ring position).
    head: u64,
}

impl From<LoadedWindow> for ClientWindow {
    fn from(loaded: LoadedWindow) -> Self {
        Self {
            results: loaded.results.iter().copied().collect(),
            order: loaded.results.iter().map(|(seq, _)| *seq).collect(),
            marks: loaded.marks,
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
    /// The identity's result belongs to another request (operation, target
    /// or operand differ): nothing ran, and the result is not given out.
    Conflict,
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
    /// The window file has no slot left for the identity (a table not
    /// bounded by a topology).
    WindowFull,
}

impl Refusal {
    /// The `reason` label of the refusal counter.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::UnknownIdentity => "unknown_identity",
            Refusal::ReservedSeq => "reserved_seq",
            Refusal::WindowFull => "window_full",
        }
    }
}

/// Per-client windows of recent atomic results.
#[derive(Debug)]
pub struct DedupTable {
    shards: Vec<Mutex<HashMap<u32, ClientWindow>>>,
    /// The highest lane of each client number; `None`: any identity. A new
    /// map replaces it while atomics run.
    lanes: RwLock<Option<Vec<u8>>>,
    store: Option<WindowStore>,
    /// Serialises exactly-once atomics per stripe of words.
    stripes: Vec<Mutex<()>>,
}

impl Default for DedupTable {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            lanes: RwLock::new(None),
            store: None,
            stripes: (0..INTENTS).map(|_| Mutex::default()).collect(),
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
    pub fn bounded_by(self, lanes: Vec<u8>) -> Self {
        self.rebound(lanes);
        self
    }

    /// Bounds the table by a new map's clients (see
    /// [`DedupTable::bounded_by`]) from the next atomic on: a client's new
    /// RNIC brings its lane, a client the map adds its number. Windows
    /// already kept stay (a lane the map takes away is refused, its record
    /// is not dropped). Returns the identities the new bound names.
    pub fn rebound(&self, lanes: Vec<u8>) -> usize {
        let identities = lanes.iter().map(|&l| usize::from(l) + 1).sum();
        *self.lanes.write().unwrap_or_else(PoisonError::into_inner) = Some(lanes);
        identities
    }

    /// How many identities the window file has slots for (`None`: no file,
    /// no limit).
    pub fn capacity(&self) -> Option<usize> {
        self.store.as_ref().map(WindowStore::capacity)
    }

    /// Whether (`client`, `seq`) may have a window entry.
    fn admits(&self, client: u32, seq: u64) -> Result<(), Refusal> {
        if seq == u64::MAX {
            return Err(Refusal::ReservedSeq);
        }
        let lanes = self.lanes.read().unwrap_or_else(PoisonError::into_inner);
        let Some(lanes) = lanes.as_ref() else {
            return Ok(());
        };
        let number = (client & proto::request::CLIENT_NUMBER_MASK) as usize;
        let lane = (client >> proto::request::LANE_SHIFT) as u8;
        match lanes.get(number) {
            Some(&max) if lane <= max => Ok(()),
            _ => Err(Refusal::UnknownIdentity),
        }
    }

    /// Runs an atomic on `word` unless (`client`, `seq`) was seen before:
    /// the word becomes `change(old)` and the result is `old`.
    ///
    /// With a store, the atomic and its result are one failure-atomic step:
    /// an intent is written (durably when `persist`) before the word
    /// changes, then the word is persisted with `persist_word` (when
    /// `persist`), then the result is recorded. Two copies of one request
    /// racing in on two paths apply once (the client's shard lock), and one
    /// intent is in flight per stripe of words (the stripe lock).
    pub fn run(
        &self,
        attempt: Attempt,
        word: Word<'_>,
        change: impl Fn(u64) -> u64,
        persist: bool,
        persist_word: impl FnOnce() -> Result<(), PersistError>,
    ) -> Result<Dedup, DedupError> {
        let Attempt {
            client,
            seq,
            digest,
        } = attempt;
        if let Err(refusal) = self.admits(client, seq) {
            return Ok(Dedup::Refused(refusal));
        }
        let shard = &self.shards[client as usize % SHARDS];
        let mut clients = shard.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(window) = clients.get(&client) {
            if let Some(recorded) = window.results.get(&seq) {
                return Ok(if recorded.digest == digest {
                    Dedup::Replayed(recorded.value)
                } else {
                    Dedup::Conflict
                });
            }
            if window.marks.is_stale(seq) {
                return Ok(Dedup::Stale);
            }
        }
        if let Some(store) = &self.store {
            match store.slot(client) {
                Ok(_) => {}
                Err(StoreError::Full { .. }) => return Ok(Dedup::Refused(Refusal::WindowFull)),
                Err(e) => return Err(e.into()),
            }
        }
        let stripe = stripe_of(word.region, word.offset);
        let _word = self.stripes[stripe]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let old = loop {
            let old = word.word.load(Ordering::SeqCst);
            let new = change(old);
            if new == old {
                break old;
            }
            if let Some(store) = &self.store {
                let intent = Intent {
                    client,
                    seq,
                    region: word.region,
                    offset: word.offset,
                    old,
                    new,
                    digest,
                };
                store.intend(stripe, &intent, persist)?;
            }
            // A plain WRITE may change the word meanwhile: then try again.
            if word
                .word
                .compare_exchange(old, new, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                break old;
            }
        };
        // From here on the atomic happened: remember it even if persisting
        // fails, so a retry is never applied a second time.
        let result = Recorded { value: old, digest };
        let window = clients.entry(client).or_default();
        let (head, mark) = window.remember(seq, result);
        if persist {
            persist_word().map_err(DedupError::Persist)?;
        }
        if let Some(store) = &self.store {
            store.record(client, head, (seq, result), mark, persist)?;
        }
        Ok(Dedup::Applied(old))
    }

    /// Records, under `attempt`'s identity, an atomic decided at another
    /// copy of the region, and stores `new_word`, the word it left: the copy a fabric device
    /// writes a decided COMPARE_SWAP or FETCH_ADD's word to remembers it,
    /// so a retry of that atomic reaching this copy is answered from the
    /// window. `attempt`'s digest is the atomic's own; `result` is what it
    /// returned where it was decided.
    ///
    /// Already recorded with the same digest: the word is stored and the
    /// recorded result returned ([`Dedup::Replayed`]). Recorded with
    /// another digest: nothing is stored ([`Dedup::Conflict`]). Too old to
    /// record: the word is stored, nothing recorded ([`Dedup::Stale`]).
    /// Otherwise the result is recorded (durably when `persist`) before
    /// the word is stored and made durable, so a crash between the two
    /// leaves the record without the word; the copy was lost with that
    /// crash (its device saw the write unanswered) and is brought up to
    /// date before it serves again, which a word without its record could
    /// not undo.
    pub fn carry(
        &self,
        attempt: Attempt,
        word: Word<'_>,
        (new_word, result): (u64, u64),
        persist: bool,
        persist_word: impl FnOnce() -> Result<(), PersistError>,
    ) -> Result<Dedup, DedupError> {
        let Attempt {
            client,
            seq,
            digest,
        } = attempt;
        if let Err(refusal) = self.admits(client, seq) {
            return Ok(Dedup::Refused(refusal));
        }
        let shard = &self.shards[client as usize % SHARDS];
        let mut clients = shard.lock().unwrap_or_else(PoisonError::into_inner);
        let known = clients.get(&client).and_then(|window| {
            if let Some(recorded) = window.results.get(&seq) {
                return Some(if recorded.digest == digest {
                    Dedup::Replayed(recorded.value)
                } else {
                    Dedup::Conflict
                });
            }
            window.marks.is_stale(seq).then_some(Dedup::Stale)
        });
        let outcome = match known {
            Some(Dedup::Conflict) => return Ok(Dedup::Conflict),
            Some(known) => known,
            None => {
                if let Some(store) = &self.store {
                    match store.slot(client) {
                        Ok(_) => {}
                        Err(StoreError::Full { .. }) => {
                            return Ok(Dedup::Refused(Refusal::WindowFull));
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                let recorded = Recorded {
                    value: result,
                    digest,
                };
                let window = clients.entry(client).or_default();
                let (head, mark) = window.remember(seq, recorded);
                if let Some(store) = &self.store {
                    store.record(client, head, (seq, recorded), mark, persist)?;
                }
                Dedup::Applied(result)
            }
        };
        word.word.store(new_word, Ordering::SeqCst);
        if persist {
            persist_word().map_err(DedupError::Persist)?;
        }
        Ok(outcome)
    }

    /// Settles an atomic whose intent was found without a result after a
    /// crash, given the value its word holds now: if the word changed, the
    /// atomic happened and its result is recorded durably (the caller has
    /// made the word durable first). Returns whether it was recorded.
    pub fn settle(&self, intent: &Intent, word_now: u64) -> Result<bool, DedupError> {
        if word_now == intent.old {
            return Ok(false);
        }
        let shard = &self.shards[intent.client as usize % SHARDS];
        let mut clients = shard.lock().unwrap_or_else(PoisonError::into_inner);
        let window = clients.entry(intent.client).or_default();
        if window.results.contains_key(&intent.seq) || window.marks.is_stale(intent.seq) {
            return Ok(false);
        }
        let result = Recorded {
            value: intent.old,
            digest: intent.digest,
        };
        let (head, mark) = window.remember(intent.seq, result);
        if let Some(store) = &self.store {
            store.record(intent.client, head, (intent.seq, result), mark, true)?;
        }
        Ok(true)
    }

    /// Forgets every intent once recovery has settled them, so none is
    /// settled again against a word that has changed since.
    pub fn finish_recovery(&self) -> Result<(), DedupError> {
        if let Some(store) = &self.store {
            store.clear_intents()?;
        }
        Ok(())
    }
}

/// One exactly-once atomic as it arrives: its identity (lane and client
/// number), its sequence number, and the digest of what it asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    /// The exactly-once identity.
    pub client: u32,
    /// Its sequence number.
    pub seq: u64,
    /// What it asks (operation, word, operands).
    pub digest: RequestDigest,
}

/// The 8-byte word an exactly-once atomic changes.
#[derive(Debug, Clone, Copy)]
pub struct Word<'a> {
    /// The word in the mapped region.
    pub word: &'a AtomicU64,
    /// Its region index.
    pub region: u32,
    /// Its offset in the region.
    pub offset: u64,
}

/// Why an exactly-once atomic could not complete.
#[derive(Debug, thiserror::Error)]
pub enum DedupError {
    /// The window file could not be written.
    #[error("cannot record an exactly-once result")]
    Store(#[from] StoreError),
    /// The changed word could not be made durable.
    #[error("cannot persist the word of an exactly-once atomic")]
    Persist(#[source] PersistError),
}

/// The lock stripe (and intent record) of a word.
fn stripe_of(region: u32, offset: u64) -> usize {
    let h = ((u64::from(region) << 48) ^ (offset / 8)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> 58) as usize % INTENTS
}

impl ClientWindow {
    /// Remembers `result` as that of `seq`, evicting the oldest result
    /// beyond the window; returns the result's ring position and the stale
    /// mark the eviction raised.
    fn remember(&mut self, seq: u64, result: Recorded) -> (u64, Option<RaisedMark>) {
        self.results.insert(seq, result);
        self.order.push_back(seq);
        let mut mark = None;
        if self.order.len() > WINDOW
            && let Some(old) = self.order.pop_front()
        {
            self.results.remove(&old);
            mark = self.marks.raise(old);
        }
        let head = self.head;
        self.head += 1;
        (head, mark)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persist::PersistPolicy;

    fn attempt(client: u32, seq: u64, digest: RequestDigest) -> Attempt {
        Attempt {
            client,
            seq,
            digest,
        }
    }

    /// The digest of a FETCH_ADD of 1 on offset 64 of region 0.
    fn add_one() -> RequestDigest {
        RequestDigest::of(0x14, 0, 64, 0, 1)
    }

    /// FETCH_ADD of 1 on `counter` as (`client`, `seq`), not persistent.
    fn add(table: &DedupTable, counter: &AtomicU64, client: u32, seq: u64) -> Dedup {
        let word = Word {
            word: counter,
            region: 0,
            offset: 64,
        };
        table
            .run(
                attempt(client, seq, add_one()),
                word,
                |old| old + 1,
                false,
                || Ok(()),
            )
            .unwrap()
    }

    #[test]
    fn a_stored_window_answers_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let counter = AtomicU64::new(0);
        let open = || {
            let (store, loaded) =
                WindowStore::open(dir.path(), &PersistPolicy::Msync, Expect::New, 8).unwrap();
            assert!(loaded.unfinished.is_empty());
            DedupTable::with_store(store, loaded.windows)
        };
        assert_eq!(add(&open(), &counter, 4, 77), Dedup::Applied(0));
        // A new incarnation of the server, as after kill -9 and a restart.
        let table = open();
        assert_eq!(add(&table, &counter, 4, 77), Dedup::Replayed(0));
        assert_eq!(counter.load(Ordering::SeqCst), 1, "applied once");
        assert_eq!(add(&table, &counter, 4, 78), Dedup::Applied(1));
    }

    #[test]
    fn an_interrupted_atomic_is_settled_by_its_word() {
        let dir = tempfile::tempdir().unwrap();
        let open = || WindowStore::open(dir.path(), &PersistPolicy::Msync, Expect::New, 8).unwrap();
        // An intent written, then the crash: before the word changed (seq
        // 1) and after it did (seq 2, on another stripe).
        let (store, _) = open();
        let before = Intent {
            client: 3,
            seq: 1,
            region: 0,
            offset: 64,
            old: 10,
            new: 11,
            digest: add_one(),
        };
        let after = Intent {
            seq: 2,
            offset: 8 * 1000,
            ..before
        };
        store.intend(stripe_of(0, 64), &before, true).unwrap();
        store.intend(stripe_of(0, 8 * 1000), &after, true).unwrap();
        drop(store);
        let (store, loaded) = open();
        assert_eq!(loaded.unfinished.len(), 2);
        let table = DedupTable::with_store(store, loaded.windows);
        assert!(!table.settle(&before, 10).unwrap(), "word unchanged");
        assert!(table.settle(&after, 11).unwrap(), "word changed");
        table.finish_recovery().unwrap();
        // The retries: the first applies, the second is answered.
        let word = AtomicU64::new(10);
        assert_eq!(add(&table, &word, 3, 1), Dedup::Applied(10));
        assert_eq!(add(&table, &word, 3, 2), Dedup::Replayed(10));
        drop(table);
        let (_, loaded) = open();
        assert!(loaded.unfinished.is_empty(), "recovery cleared the intents");
        let recorded = Recorded {
            value: 10,
            digest: add_one(),
        };
        assert_eq!(
            loaded.windows[&3].results,
            vec![(2, recorded), (1, recorded)]
        );
    }

    #[test]
    fn an_atomic_that_changes_nothing_writes_no_intent() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) =
            WindowStore::open(dir.path(), &PersistPolicy::Msync, Expect::New, 8).unwrap();
        let table = DedupTable::with_store(store, HashMap::new());
        let counter = AtomicU64::new(5);
        let word = Word {
            word: &counter,
            region: 0,
            offset: 0,
        };
        let failed_cas = |old| if old == 4 { 9 } else { old };
        let cas = RequestDigest::of(0x13, 0, 0, 4, 9);
        let ran = table
            .run(attempt(1, 1, cas), word, failed_cas, true, || Ok(()))
            .unwrap();
        assert_eq!(ran, Dedup::Applied(5));
        drop(table);
        let (_, loaded) =
            WindowStore::open(dir.path(), &PersistPolicy::Msync, Expect::New, 8).unwrap();
        assert!(loaded.unfinished.is_empty());
        let recorded = Recorded {
            value: 5,
            digest: cas,
        };
        assert_eq!(loaded.windows[&1].results, vec![(1, recorded)]);
    }

    #[test]
    fn replay_returns_first_result_without_applying() {
        let table = DedupTable::default();
        let counter = AtomicU64::new(10);
        assert_eq!(add(&table, &counter, 7, 1), Dedup::Applied(10));
        assert_eq!(add(&table, &counter, 7, 1), Dedup::Replayed(10));
        assert_eq!(counter.load(Ordering::SeqCst), 11);
        // Same sequence number from another client is a different request.
        assert_eq!(add(&table, &counter, 8, 1), Dedup::Applied(11));
    }

    #[test]
    fn a_failed_persist_still_remembers_the_applied_atomic() {
        let table = DedupTable::default();
        let counter = AtomicU64::new(0);
        let word = Word {
            word: &counter,
            region: 0,
            offset: 0,
        };
        let failing = || Err(PersistError::Misaligned { offset: 4 });
        let ran = table.run(attempt(1, 5, add_one()), word, |o| o + 1, true, failing);
        assert!(ran.is_err());
        assert_eq!(add(&table, &counter, 1, 5), Dedup::Replayed(0));
        assert_eq!(counter.load(Ordering::SeqCst), 1, "applied once");
    }

    #[test]
    fn window_evicts_oldest_and_reports_stale() {
        let table = DedupTable::default();
        let counter = AtomicU64::new(0);
        for seq in 0..(WINDOW as u64 + 10) {
            assert!(matches!(add(&table, &counter, 3, seq), Dedup::Applied(_)));
        }
        assert_eq!(add(&table, &counter, 3, 0), Dedup::Stale);
        assert_eq!(add(&table, &counter, 3, 9), Dedup::Stale);
        assert_eq!(add(&table, &counter, 3, 10), Dedup::Replayed(10));
        assert_eq!(counter.load(Ordering::SeqCst), WINDOW as u64 + 10);
    }

    #[test]
    fn processes_sharing_an_identity_never_make_each_other_stale() {
        let table = DedupTable::default();
        let counter = AtomicU64::new(0);
        // A process in session 9 (a restart, or a second worker) next to
        // one in session 5, interleaved well past the window.
        let seq = |session: u64, n: u64| session << 32 | n;
        let rounds = WINDOW as u64 * 2;
        for n in 0..rounds {
            assert!(matches!(
                add(&table, &counter, 3, seq(9, n)),
                Dedup::Applied(_)
            ));
            assert!(matches!(
                add(&table, &counter, 3, seq(5, n)),
                Dedup::Applied(_)
            ));
        }
        assert_eq!(counter.load(Ordering::SeqCst), 2 * rounds);
        // Within each session, what left the window is still stale.
        assert_eq!(add(&table, &counter, 3, seq(9, 0)), Dedup::Stale);
        assert_eq!(add(&table, &counter, 3, seq(5, 0)), Dedup::Stale);
        assert!(matches!(
            add(&table, &counter, 3, seq(5, rounds - 1)),
            Dedup::Replayed(_)
        ));
    }

    #[test]
    fn racing_duplicates_apply_once() {
        let table = DedupTable::default();
        let counter = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for seq in 0..1000 {
                        add(&table, &counter, 9, seq);
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
        assert_eq!(add(&table, &counter, on(0, 0), 1), Dedup::Applied(0));
        assert_eq!(add(&table, &counter, on(1, 0), 1), Dedup::Applied(1));
        assert_eq!(add(&table, &counter, on(0, 1), 1), Dedup::Applied(2));
        for (lane, number) in [(2, 0), (1, 1), (0, 2), (255, 99)] {
            assert_eq!(
                add(&table, &counter, on(lane, number), 1),
                Dedup::Refused(Refusal::UnknownIdentity),
                "lane {lane} of client {number}"
            );
        }
        assert_eq!(
            add(&table, &counter, on(0, 0), u64::MAX),
            Dedup::Refused(Refusal::ReservedSeq)
        );
        assert_eq!(counter.load(Ordering::SeqCst), 3, "refused ones never ran");
        let windows: usize = table.shards.iter().map(|s| s.lock().unwrap().len()).sum();
        assert_eq!(windows, 3, "and left no state");
    }

    #[test]
    fn a_full_window_file_is_refused_before_anything_runs() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) =
            WindowStore::open(dir.path(), &PersistPolicy::Msync, Expect::New, 1).unwrap();
        let table = DedupTable::with_store(store, HashMap::new());
        let counter = AtomicU64::new(0);
        assert_eq!(add(&table, &counter, 1, 1), Dedup::Applied(0));
        assert_eq!(
            add(&table, &counter, 2, 1),
            Dedup::Refused(Refusal::WindowFull)
        );
        assert_eq!(counter.load(Ordering::SeqCst), 1);
    }

    /// Carries FETCH_ADD of 1 on offset 64 as (`client`, `seq`), decided
    /// elsewhere with result `result`, storing `new_word` into `counter`.
    fn carry(
        table: &DedupTable,
        counter: &AtomicU64,
        (client, seq): (u32, u64),
        (new_word, result): (u64, u64),
    ) -> Dedup {
        let word = Word {
            word: counter,
            region: 0,
            offset: 64,
        };
        table
            .carry(
                attempt(client, seq, add_one()),
                word,
                (new_word, result),
                false,
                || Ok(()),
            )
            .unwrap()
    }

    #[test]
    fn a_carried_atomic_answers_its_retry_from_the_window() {
        let table = DedupTable::default();
        let counter = AtomicU64::new(0);
        // Decided elsewhere: the word went from 10 to 11.
        assert_eq!(
            carry(&table, &counter, (4, 7), (11, 10)),
            Dedup::Applied(10)
        );
        assert_eq!(counter.load(Ordering::SeqCst), 11);
        // The retry here: answered with the first result, not applied.
        assert_eq!(add(&table, &counter, 4, 7), Dedup::Replayed(10));
        assert_eq!(counter.load(Ordering::SeqCst), 11);
        // Carried again (a new owner resending): the word is stored, the
        // record kept.
        assert_eq!(
            carry(&table, &counter, (4, 7), (12, 99)),
            Dedup::Replayed(10)
        );
        assert_eq!(counter.load(Ordering::SeqCst), 12);
        // Another request under the identity is refused and stores nothing.
        let word = Word {
            word: &counter,
            region: 0,
            offset: 64,
        };
        let other = RequestDigest::of(0x13, 0, 64, 12, 1);
        let carried = table
            .carry(attempt(4, 7, other), word, (1, 12), false, || Ok(()))
            .unwrap();
        assert_eq!(carried, Dedup::Conflict);
        assert_eq!(counter.load(Ordering::SeqCst), 12);
    }

    #[test]
    fn a_carried_atomic_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let open = || {
            let (store, loaded) =
                WindowStore::open(dir.path(), &PersistPolicy::Msync, Expect::New, 8).unwrap();
            DedupTable::with_store(store, loaded.windows)
        };
        let counter = AtomicU64::new(0);
        assert_eq!(carry(&open(), &counter, (2, 3), (6, 5)), Dedup::Applied(5));
        let table = open();
        assert_eq!(add(&table, &counter, 2, 3), Dedup::Replayed(5));
        assert_eq!(counter.load(Ordering::SeqCst), 6, "never applied here");
    }

    #[test]
    fn another_request_under_a_recorded_identity_is_a_conflict() {
        let table = DedupTable::default();
        let counter = AtomicU64::new(7);
        let word = Word {
            word: &counter,
            region: 0,
            offset: 64,
        };
        assert_eq!(add(&table, &counter, 5, 40), Dedup::Applied(7));
        // The same (client, seq) asking to add 1000 instead: nothing runs
        // and the first request's result is not given out.
        let other = RequestDigest::of(0x14, 0, 64, 0, 1000);
        let ran = table
            .run(attempt(5, 40, other), word, |o| o + 1000, false, || Ok(()))
            .unwrap();
        assert_eq!(ran, Dedup::Conflict);
        assert_eq!(counter.load(Ordering::SeqCst), 8);
        // The real retry is still answered.
        assert_eq!(add(&table, &counter, 5, 40), Dedup::Replayed(7));
    }

    #[test]
    fn a_settled_intent_keeps_its_request_digest_across_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let open = || WindowStore::open(dir.path(), &PersistPolicy::Msync, Expect::New, 8).unwrap();
        let intent = Intent {
            client: 2,
            seq: 9,
            region: 0,
            offset: 64,
            old: 3,
            new: 4,
            digest: add_one(),
        };
        let (store, loaded) = open();
        let table = DedupTable::with_store(store, loaded.windows);
        assert!(table.settle(&intent, 4).unwrap());
        drop(table);
        let (store, loaded) = open();
        let table = DedupTable::with_store(store, loaded.windows);
        let counter = AtomicU64::new(4);
        assert_eq!(add(&table, &counter, 2, 9), Dedup::Replayed(3));
        let word = Word {
            word: &counter,
            region: 0,
            offset: 64,
        };
        let other = RequestDigest::of(0x13, 0, 64, 3, 1);
        let ran = table.run(attempt(2, 9, other), word, |o| o, false, || Ok(()));
        assert_eq!(ran.unwrap(), Dedup::Conflict);
    }
}
