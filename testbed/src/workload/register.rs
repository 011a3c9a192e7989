//! The register workload: every client runs several sequential processes
//! that issue READ, store, COMPARE_SWAP and FETCH_ADD with random values on
//! a handful of hot 8-byte words shared by all clients, and records each
//! operation in the client's history file for the linearizability check
//! ([`crate::linearizability`]).
//!
//! The store is an ATOMIC_WRITE: the server's contract makes it atomic
//! against READ and the atomics on the word, which a plain 8-byte WRITE is
//! not. An operation that fails leaves its outcome unknown; its process
//! then ends and the task goes on as a new process, so that every process
//! is sequential and ends with its only operation of unknown outcome.
//! Each operation waits a random pause first (0–2× [`PAUSE_MEAN`]): that
//! keeps a word's history small enough for the checker's search.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use pmem_client::{AsyncPool, PoolError};
use topology::VirtAddr;

use super::keys::Rng;
use super::space::Space;
use super::{Progress, WorkerConfig, WorkerResult};
use crate::linearizability::history::{
    Entry, HISTORY_SUFFIX, HistoryWriter, Outcome, WordOp, WordRet, monotonic_ns,
};
use crate::report::{OpStats, Timeline, Verification};

/// The most hot words (`--keys` above it gives this many).
pub const MAX_WORDS: u64 = 8;

/// Mean pause a process takes before each operation.
pub const PAUSE_MEAN: Duration = Duration::from_millis(10);

/// The process id the run's setup stores under.
pub const SETUP_PROCESS: u64 = 0;

/// Hot words for `--keys keys`: between 1 and [`MAX_WORDS`].
pub fn words(keys: u64) -> u64 {
    keys.clamp(1, MAX_WORDS)
}

/// Where hot word `w` of `words` lives: the words are spread evenly over
/// the run's space, so they fall in every region of a small pool.
pub fn word_addr(space: Space, words: u64, w: u64) -> VirtAddr {
    let stride = (space.len / words.max(1)) & !7;
    VirtAddr(space.base + stride * (w % words.max(1)))
}

/// The history file of `client` in the folder `dir`.
pub fn history_path(dir: &Path, client: &str) -> std::path::PathBuf {
    dir.join(format!("{client}{HISTORY_SUFFIX}"))
}

/// Stores 0 into every hot word as `client`, recorded as the setup
/// process's operations in `dir/setup.history.jsonl`: run once, before
/// any worker starts, so every word's history begins from a known value.
pub async fn setup(
    pool: &AsyncPool,
    client: &str,
    space: Space,
    keys: u64,
    dir: &Path,
) -> Result<(), String> {
    let path = history_path(dir, "setup");
    let mut history = HistoryWriter::create(&path).map_err(|e| e.to_string())?;
    let mut last = 0;
    for w in 0..words(keys) {
        let invoked_ns = monotonic_ns().max(last + 1);
        pool.atomic_write(word_addr(space, words(keys), w), 0)
            .await
            .map_err(|e| {
                format!(
                    "store 0 into hot word {w}: {}",
                    pmem_client::error_chain(&e)
                )
            })?;
        last = monotonic_ns().max(invoked_ns);
        history
            .append(&Entry {
                client: client.to_owned(),
                process: SETUP_PROCESS,
                word: w,
                op: WordOp::Write(0),
                invoked_ns,
                completed_ns: last,
                outcome: Outcome::Ok(WordRet::Write),
            })
            .map_err(|e| e.to_string())?;
    }
    history.finish().map_err(|e| e.to_string())
}

/// [`setup`] on `fabric` as `client`, the history in `dir`.
pub fn setup_on(
    fabric: &crate::fabric::launch::Fabric,
    client: &str,
    space: Space,
    keys: u64,
    dir: &Path,
) -> Result<(), String> {
    let (client, dir) = (client.to_owned(), dir.to_owned());
    fabric.as_client(&client.clone(), |pool| async move {
        setup(&pool, &client, space, keys, &dir).await
    })
}

/// What the processes of one worker share.
struct Shared {
    history: Mutex<Option<HistoryWriter>>,
    /// The first failure to record, which fails the run.
    record_error: Mutex<Option<String>>,
    next_process: AtomicU64,
}

impl Shared {
    /// A process id no other worker uses: the client's index in the high
    /// half.
    fn new_process(&self, index: usize) -> u64 {
        ((index as u64 + 1) << 32) | self.next_process.fetch_add(1, Ordering::Relaxed)
    }

    fn record(&self, entry: &Entry) {
        let mut history = self.history.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(writer) = history.as_mut() else {
            return;
        };
        if let Err(e) = writer.append(entry) {
            *history = None;
            self.record_error
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_or_insert(e.to_string());
        }
    }
}

/// Runs the register workload on `pool` for `config.duration`, recording
/// the history in `config.history`.
pub async fn run(
    pool: AsyncPool,
    config: WorkerConfig,
    space: Space,
    run_start: Instant,
    progress: Arc<Progress>,
) -> WorkerResult {
    let mut verification = Verification::default();
    let writer = match config.history.as_deref().map(HistoryWriter::create) {
        Some(Ok(writer)) => Some(writer),
        Some(Err(e)) => {
            verification.push_during_run(format!("cannot record the history: {e}"));
            None
        }
        None => {
            verification
                .push_during_run("the register workload was given no history file to record in");
            None
        }
    };
    let shared = Arc::new(Shared {
        history: Mutex::new(writer),
        record_error: Mutex::new(None),
        next_process: AtomicU64::new(1),
    });
    let end = config.end();
    let tasks: Vec<_> = (0..config.depth.max(1))
        .map(|t| {
            let end = end.clone();
            let (pool, shared, progress, config) = (
                pool.clone(),
                Arc::clone(&shared),
                Arc::clone(&progress),
                config.clone(),
            );
            tokio::spawn(async move {
                let rng = Rng::new(config.seed ^ ((t as u64 + 1) << 32));
                let process = Process {
                    pool,
                    space,
                    words: words(config.keys),
                    index: config.index,
                    client: config.client.clone(),
                    shared,
                    rng,
                    last_seen: HashMap::new(),
                };
                process
                    .run(&end, run_start, config.bucket_ms, &progress)
                    .await
            })
        })
        .collect();
    let mut ops: BTreeMap<String, OpStats> = BTreeMap::new();
    let mut timeline = Timeline::new(config.bucket_ms);
    for task in tasks {
        match task.await {
            Ok((task_ops, task_timeline)) => {
                for (name, stats) in &task_ops {
                    ops.entry(name.clone()).or_default().merge(stats);
                }
                timeline.merge(&task_timeline);
            }
            Err(e) => verification.push_during_run(format!("a process of the workload died: {e}")),
        }
    }
    let writer = shared
        .history
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    if let Some(Err(e)) = writer.map(HistoryWriter::finish) {
        verification.push_during_run(format!("cannot record the history: {e}"));
    }
    if let Some(e) = shared
        .record_error
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
    {
        verification.push_during_run(format!("cannot record the history: {e}"));
    }
    verification.passed = verification.is_clean();
    WorkerResult {
        client: config.client,
        ops,
        timeline,
        counters: BTreeMap::new(),
        verification,
    }
}

/// One task of a worker: a sequence of processes, one after each operation
/// of unknown outcome.
struct Process {
    pool: AsyncPool,
    space: Space,
    words: u64,
    index: usize,
    client: String,
    shared: Arc<Shared>,
    rng: Rng,
    /// The last value this task saw in each word: what its COMPARE_SWAPs
    /// expect, so some of them swap.
    last_seen: HashMap<u64, u64>,
}

impl Process {
    async fn run(
        mut self,
        end: &super::end::End,
        run_start: Instant,
        bucket_ms: u64,
        progress: &Progress,
    ) -> (BTreeMap<String, OpStats>, Timeline) {
        let mut ops: BTreeMap<String, OpStats> = BTreeMap::new();
        let mut timeline = Timeline::new(bucket_ms);
        let mut process = self.shared.new_process(self.index);
        let mut last_ns = 0;
        let pause_us = PAUSE_MEAN.as_micros() as u64 * 2;
        loop {
            tokio::time::sleep(Duration::from_micros(self.rng.below(pause_us))).await;
            if end.reached() {
                break;
            }
            let w = self.rng.below(self.words);
            let op = self.draw(w);
            let started = Instant::now();
            let invoked_ns = monotonic_ns().max(last_ns + 1);
            let result = self.apply(w, op).await;
            let completed_ns = monotonic_ns().max(invoked_ns);
            last_ns = completed_ns;
            let at = started.duration_since(run_start) + started.elapsed();
            let stats = ops.entry(op_name(op).to_owned()).or_default();
            let outcome = match result {
                Ok(ret) => {
                    stats.record_ok(started.elapsed(), 8);
                    timeline.record(at, true);
                    progress.ops.fetch_add(1, Ordering::Relaxed);
                    if let Some(seen) = value_seen(op, ret) {
                        self.last_seen.insert(w, seen);
                    }
                    Outcome::Ok(ret)
                }
                Err(e) => {
                    stats.record_error();
                    timeline.record(at, false);
                    progress.errors.fetch_add(1, Ordering::Relaxed);
                    let why = pmem_client::error_chain(&e);
                    tracing::warn!("{} on hot word {w} failed: {why}", op_name(op));
                    Outcome::Unknown(why)
                }
            };
            let unknown = matches!(outcome, Outcome::Unknown(_));
            self.shared.record(&Entry {
                client: self.client.clone(),
                process,
                word: w,
                op,
                invoked_ns,
                completed_ns,
                outcome,
            });
            if unknown {
                process = self.shared.new_process(self.index);
            }
        }
        (ops, timeline)
    }

    /// A random operation on word `w`, a quarter of each kind.
    fn draw(&mut self, w: u64) -> WordOp {
        match self.rng.below(4) {
            0 => WordOp::Read,
            1 => WordOp::Write(self.rng.next_u64()),
            2 => WordOp::CompareSwap {
                expected: self.last_seen.get(&w).copied().unwrap_or(0),
                new: self.rng.next_u64(),
            },
            _ => WordOp::FetchAdd(self.rng.next_u64()),
        }
    }

    async fn apply(&self, w: u64, op: WordOp) -> Result<WordRet, PoolError> {
        let addr = word_addr(self.space, self.words, w);
        Ok(match op {
            WordOp::Read => WordRet::Read(self.pool.read_u64(addr).await?),
            WordOp::Write(value) => {
                self.pool.atomic_write(addr, value).await?;
                WordRet::Write
            }
            WordOp::CompareSwap { expected, new } => {
                let found = self.pool.compare_and_swap(addr, expected, new).await?;
                WordRet::CompareSwap(found.unwrap_or_else(|actual| actual))
            }
            WordOp::FetchAdd(delta) => WordRet::FetchAdd(self.pool.fetch_add(addr, delta).await?),
        })
    }
}

/// The value the word held after `op` returned `ret`, as far as the
/// process knows.
fn value_seen(op: WordOp, ret: WordRet) -> Option<u64> {
    match (op, ret) {
        (_, WordRet::Read(v)) => Some(v),
        (WordOp::Write(v), WordRet::Write) => Some(v),
        (WordOp::CompareSwap { expected, new }, WordRet::CompareSwap(found)) => {
            Some(if found == expected { new } else { found })
        }
        (WordOp::FetchAdd(d), WordRet::FetchAdd(found)) => Some(found.wrapping_add(d)),
        _ => None,
    }
}

/// The request an operation is sent as, for the report's tables.
fn op_name(op: WordOp) -> &'static str {
    match op {
        WordOp::Read => "READ",
        WordOp::Write(_) => "ATOMIC_WRITE",
        WordOp::CompareSwap { .. } => "COMPARE_SWAP",
        WordOp::FetchAdd(_) => "FETCH_ADD",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_words_are_spread_over_the_space_and_aligned() {
        let space = Space {
            base: 1 << 40,
            len: (64 << 20) + 12,
        };
        assert_eq!(words(4096), MAX_WORDS);
        assert_eq!(words(0), 1);
        let addrs: Vec<u64> = (0..8).map(|w| word_addr(space, 8, w).get()).collect();
        assert_eq!(addrs[0], space.base);
        assert!(
            addrs.windows(2).all(|p| p[1] - p[0] == 8 << 20),
            "{addrs:?}"
        );
        assert!(
            addrs
                .iter()
                .all(|a| a % 8 == 0 && a + 8 <= space.base + space.len)
        );
    }

    #[test]
    fn a_process_knows_what_its_operations_left_in_the_word() {
        let swap = WordOp::CompareSwap {
            expected: 1,
            new: 5,
        };
        assert_eq!(value_seen(swap, WordRet::CompareSwap(1)), Some(5));
        assert_eq!(value_seen(swap, WordRet::CompareSwap(3)), Some(3));
        assert_eq!(
            value_seen(WordOp::FetchAdd(2), WordRet::FetchAdd(u64::MAX)),
            Some(1)
        );
        assert_eq!(value_seen(WordOp::Read, WordRet::Read(9)), Some(9));
        assert_eq!(value_seen(WordOp::Write(4), WordRet::Write), Some(4));
    }
}
