//! Client workloads: what a `testbed worker` process does against the pool,
//! how it remembers every acknowledged write, and how it checks them.
//!
//! Each worker owns a slice of the virtual space for its keys and its own
//! atomic words; the counter words at the start of the space are shared by
//! all workers. A write takes its key for its duration, so acknowledged
//! versions of a key are strictly ordered and the last one must be what a
//! final read finds (or a later write whose acknowledgement was lost).
//! Reads during the run are judged by [`check`]: one that overlapped a
//! write of its key may see a mix of versions. The register workload
//! ([`register`]) is apart: it shares a few hot words between all clients
//! and records a history for the linearizability check instead.
//!
//! - [`keys`]: where the keys live, what a value looks like, how keys are picked.
//! - [`space`]: where a run's keys and counters live (static space or allocator).
//! - [`check`]: a worker's model of its keys and its verdict on what it reads.
//! - [`register`]: the register workload and its history.
//! - [`first_use`]: a worker on etcd reporting its epoch and new regions' first use.

pub mod check;
pub mod end;
pub mod first_use;
pub mod keys;
pub mod register;
pub mod space;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use pmem_client::AsyncPool;
use serde::{Deserialize, Serialize};
use topology::VirtAddr;

use crate::report::{OpStats, Timeline, Verification};
use check::{KeyModel, ReadVerdict};
use keys::{KeyPicker, KeySpace, Rng, Seen, counter_word, decode, describe, value};

/// The workloads `testbed run` offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Workload {
    /// 50 % reads, 50 % updates.
    YcsbA,
    /// 95 % reads, 5 % updates.
    YcsbB,
    /// Reads only.
    YcsbC,
    /// FETCH_ADD on shared counter words.
    Counter,
    /// Every operation, persistent writes included.
    Mixed,
    /// READ, stores, COMPARE_SWAP and FETCH_ADD from every client on a few
    /// hot words, every operation recorded for the linearizability check.
    Register,
}

impl Workload {
    /// Every workload.
    pub const ALL: [Workload; 6] = [
        Workload::YcsbA,
        Workload::YcsbB,
        Workload::YcsbC,
        Workload::Counter,
        Workload::Mixed,
        Workload::Register,
    ];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Workload::YcsbA => "ycsb-a",
            Workload::YcsbB => "ycsb-b",
            Workload::YcsbC => "ycsb-c",
            Workload::Counter => "counter",
            Workload::Mixed => "mixed",
            Workload::Register => "register",
        }
    }
}

impl FromStr for Workload {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| {
                format!("unknown workload {s:?} (ycsb-a, ycsb-b, ycsb-c, counter, mixed, register)")
            })
    }
}

/// One operation a workload issues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Write,
    WritePersist,
    Flush,
    FetchAdd,
    CompareSwap,
    AtomicWrite,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Read => "READ",
            Op::Write => "WRITE",
            Op::WritePersist => "WRITE_PERSIST",
            Op::Flush => "FLUSH",
            Op::FetchAdd => "FETCH_ADD",
            Op::CompareSwap => "COMPARE_SWAP",
            Op::AtomicWrite => "ATOMIC_WRITE",
        }
    }
}

impl Workload {
    /// Draws the next operation.
    fn draw(self, rng: &mut Rng) -> Op {
        let p = rng.below(100);
        match self {
            Workload::YcsbA => {
                if p < 50 {
                    Op::Read
                } else {
                    Op::Write
                }
            }
            Workload::YcsbB => {
                if p < 95 {
                    Op::Read
                } else {
                    Op::Write
                }
            }
            // The register workload draws its own operations (`register`).
            Workload::YcsbC | Workload::Register => Op::Read,
            Workload::Counter => Op::FetchAdd,
            Workload::Mixed => match p {
                0..35 => Op::Read,
                35..55 => Op::Write,
                55..70 => Op::WritePersist,
                70..80 => Op::FetchAdd,
                80..85 => Op::CompareSwap,
                85..90 => Op::AtomicWrite,
                _ => Op::Flush,
            },
        }
    }
}

/// What one worker is asked to do.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerConfig {
    /// The client id it runs as.
    pub client: String,
    /// Its position among the run's clients (which slice it owns).
    pub index: usize,
    /// How many clients the run has.
    pub clients: usize,
    /// The workload.
    pub workload: Workload,
    /// Zipfian instead of uniform keys.
    pub zipfian: bool,
    /// How long to issue operations.
    pub duration: Duration,
    /// Value size in bytes (at least 16).
    pub size: u64,
    /// Operations in flight at once.
    pub depth: usize,
    /// Keys wanted (fewer when the slice is smaller).
    pub keys: u64,
    /// Seed of the operation mix and keys.
    pub seed: u64,
    /// Width of the timeline's buckets.
    pub bucket_ms: u64,
    /// Zero the slice before the run: its data may hold an earlier run's
    /// keys and words (a reused data directory).
    #[serde(default)]
    pub clear: bool,
    /// Where the register workload records its history.
    #[serde(default)]
    pub history: Option<std::path::PathBuf>,
    /// After `duration`, go on until the standard input closes
    /// ([`end::End`]).
    #[serde(default)]
    pub held_open: bool,
}

impl WorkerConfig {
    /// When this worker's workload ends, counted from now.
    pub fn end(&self) -> end::End {
        let deadline = Instant::now() + self.duration;
        if self.held_open {
            end::End::held_open(deadline)
        } else {
            end::End::at(deadline)
        }
    }
}

/// Acknowledged FETCH_ADDs on one shared counter word.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterTally {
    /// Increments acknowledged.
    pub acked: u64,
    /// Increments that failed visibly (they may or may not have applied).
    pub uncertain: u64,
}

/// What a worker reports when it is done.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerResult {
    /// The client id.
    pub client: String,
    /// Statistics by operation name.
    pub ops: BTreeMap<String, OpStats>,
    /// Completions over time, from the run's start.
    pub timeline: Timeline,
    /// Acknowledged increments per shared counter word (by word index).
    pub counters: BTreeMap<u64, CounterTally>,
    /// The check of this worker's own keys and words.
    pub verification: Verification,
}

/// State shared by a worker's tasks.
#[derive(Debug, Default)]
struct Shared {
    model: KeyModel,
    words: HashMap<u64, (u64, bool)>,
    busy_words: HashSet<u64>,
    counters: BTreeMap<u64, CounterTally>,
    /// What the checks during the run found, and how many reads they
    /// judged.
    during_run: Verification,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The line a worker prints on its standard output when its pool is
/// connected and the workload begins: the run schedules its faults from then
/// (a lab guest boots for seconds before that).
pub const STARTED_LINE: &str = "workload started";

/// Live progress, read by whoever prints it.
#[derive(Debug, Default)]
pub struct Progress {
    /// Operations completed.
    pub ops: AtomicU64,
    /// Operations that failed.
    pub errors: AtomicU64,
}

/// Everything one task of a worker records.
#[derive(Debug)]
struct TaskRecord {
    ops: BTreeMap<String, OpStats>,
    timeline: Timeline,
}

/// The slice of `space` the worker of `config` owns.
fn key_space(space: space::Space, config: &WorkerConfig) -> KeySpace {
    KeySpace::new(
        space.base,
        space.len,
        config.index,
        config.clients,
        config.size,
        config.keys,
    )
}

/// Zeroes the slice of `space` the worker of `config` owns (its own words
/// and every key slot), in 1 MiB writes.
pub async fn clear_slice(
    pool: &AsyncPool,
    space: space::Space,
    config: &WorkerConfig,
) -> Result<(), pmem_client::PoolError> {
    const CHUNK: u64 = 1 << 20;
    let keys = key_space(space, config);
    let end = keys.key_addr(keys.keys.saturating_sub(1)).get() + keys.slot;
    let zeros = vec![0u8; CHUNK as usize];
    let mut at = keys.start;
    while at < end {
        let len = (end - at).min(CHUNK);
        pool.write(VirtAddr(at), &zeros[..len as usize]).await?;
        at += len;
    }
    Ok(())
}

/// Runs the workload on `pool` in `space` for `config.duration`, then checks
/// every key and word the worker owns; the timeline counts from `run_start`.
pub async fn run(
    pool: AsyncPool,
    config: WorkerConfig,
    space: space::Space,
    run_start: Instant,
    progress: Arc<Progress>,
) -> WorkerResult {
    if config.workload == Workload::Register {
        return register::run(pool, config, space, run_start, progress).await;
    }
    let keys = key_space(space, &config);
    let picker = Arc::new(KeyPicker::new(keys.keys, config.zipfian));
    let shared = Arc::new(Mutex::new(Shared::default()));
    let end = config.end();
    let tasks: Vec<_> = (0..config.depth.max(1))
        .map(|t| {
            let end = end.clone();
            let (pool, shared, picker, progress, config) = (
                pool.clone(),
                Arc::clone(&shared),
                Arc::clone(&picker),
                Arc::clone(&progress),
                config.clone(),
            );
            tokio::spawn(async move {
                let mut rng = Rng::new(config.seed ^ ((t as u64 + 1) << 32));
                let mut record = TaskRecord {
                    ops: BTreeMap::new(),
                    timeline: Timeline::new(config.bucket_ms),
                };
                while !end.reached() {
                    let op = config.workload.draw(&mut rng);
                    let started = Instant::now();
                    let outcome = step(&pool, &keys, &picker, &shared, &config, op, &mut rng).await;
                    let at = started.duration_since(run_start) + started.elapsed();
                    let stats = record.ops.entry(op.name().to_owned()).or_default();
                    match outcome {
                        Some(Ok(bytes)) => {
                            stats.record_ok(started.elapsed(), bytes);
                            record.timeline.record(at, true);
                            progress.ops.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(Err(())) => {
                            stats.record_error();
                            record.timeline.record(at, false);
                            progress.errors.fetch_add(1, Ordering::Relaxed);
                        }
                        None => {}
                    }
                }
                record
            })
        })
        .collect();
    let mut ops: BTreeMap<String, OpStats> = BTreeMap::new();
    let mut timeline = Timeline::new(config.bucket_ms);
    for task in tasks {
        if let Ok(record) = task.await {
            for (name, stats) in &record.ops {
                ops.entry(name.clone()).or_default().merge(stats);
            }
            timeline.merge(&record.timeline);
        }
    }
    let verification = verify(&pool, &keys, &shared, config.size).await;
    let counters = lock(&shared).counters.clone();
    WorkerResult {
        client: config.client,
        ops,
        timeline,
        counters,
        verification,
    }
}

/// Picks a key no other task is writing and starts a write of it: the key
/// and the version to write.
fn take_key(shared: &Mutex<Shared>, picker: &KeyPicker, rng: &mut Rng) -> Option<(u64, u64)> {
    let mut s = lock(shared);
    (0..8).find_map(|_| {
        let k = picker.pick(rng);
        s.model.begin_write(k).map(|version| (k, version))
    })
}

/// Records what a read during the run saw.
fn record_read(shared: &Mutex<Shared>, verdict: ReadVerdict) {
    let checks = &mut lock(shared).during_run;
    checks.reads_checked += 1;
    match verdict {
        ReadVerdict::Clean => {}
        ReadVerdict::Overlapped { torn } => {
            checks.reads_overlapped += 1;
            checks.reads_torn_by_overlap += u64::from(torn);
        }
        ReadVerdict::Wrong(line) => checks.push_during_run(line),
    }
}

/// Logs an operation the application saw fail (the report counts it).
fn report_error(op: Op, e: &pmem_client::PoolError) {
    tracing::warn!("{} failed: {}", op.name(), pmem_client::error_chain(e));
}

/// One operation; `None` when nothing could be issued (every key busy).
/// `Ok` carries the payload bytes moved.
async fn step(
    pool: &AsyncPool,
    keys: &KeySpace,
    picker: &KeyPicker,
    shared: &Mutex<Shared>,
    config: &WorkerConfig,
    op: Op,
    rng: &mut Rng,
) -> Option<Result<u64, ()>> {
    let size = config.size;
    match op {
        Op::Read => {
            let k = picker.pick(rng);
            let pending = lock(shared).model.begin_read(k);
            let result = pool.read(keys.key_addr(k), size).await;
            Some(result.map_err(|e| report_error(op, &e)).map(|bytes| {
                let verdict = match lock(shared).model.end_read(pending, decode(k, &bytes)) {
                    ReadVerdict::Wrong(line) => {
                        ReadVerdict::Wrong(format!("{line}: {}", describe(k, &bytes)))
                    }
                    verdict => verdict,
                };
                record_read(shared, verdict);
                size
            }))
        }
        Op::Write | Op::WritePersist => {
            let (k, version) = take_key(shared, picker, rng)?;
            let data = value(k, version, size as usize);
            let result = if op == Op::Write {
                pool.write(keys.key_addr(k), &data).await
            } else {
                pool.write_persist(keys.key_addr(k), &data).await
            };
            if let Err(e) = &result {
                report_error(op, e);
            }
            let ok = result.is_ok();
            lock(shared).model.end_write(k, version, ok);
            Some(if ok { Ok(size) } else { Err(()) })
        }
        Op::Flush => {
            let k = picker.pick(rng);
            let len = size * (1 + rng.below(16));
            let len = len.min((keys.keys - k) * keys.stride);
            Some(
                pool.flush(keys.key_addr(k), len)
                    .await
                    .map(|()| 0)
                    .map_err(|e| report_error(op, &e)),
            )
        }
        Op::FetchAdd => {
            let w = rng.below(keys::COUNTERS);
            let result = pool.fetch_add(counter_word(keys.counters, w), 1).await;
            let mut s = lock(shared);
            let tally = s.counters.entry(w).or_default();
            match &result {
                Ok(_) => tally.acked += 1,
                Err(e) => {
                    tally.uncertain += 1;
                    report_error(op, e);
                }
            }
            Some(result.map(|_| 8).map_err(drop))
        }
        Op::CompareSwap | Op::AtomicWrite => {
            let w = rng.below(keys::OWN_WORDS);
            let (expected, certain) = {
                let mut s = lock(shared);
                if !s.busy_words.insert(w) {
                    return None;
                }
                s.words.get(&w).copied().unwrap_or((0, true))
            };
            let addr = keys.own_word(w);
            let (result, new) = if op == Op::CompareSwap {
                let new = expected.wrapping_add(1);
                let result = pool
                    .compare_and_swap(addr, expected, new)
                    .await
                    .map(|swap| swap.unwrap_or_else(|actual| actual));
                if let Ok(old) = result
                    && certain
                    && old != expected
                {
                    lock(shared).during_run.push_during_run(format!(
                        "compare_and_swap on own word {w} during the run found {old}, the model \
                         says {expected}"
                    ));
                }
                (result.map(drop), new)
            } else {
                let new = rng.next_u64();
                (pool.atomic_write(addr, new).await, new)
            };
            if let Err(e) = &result {
                report_error(op, e);
            }
            let mut s = lock(shared);
            let ok = result.is_ok();
            s.words
                .insert(w, (if ok { new } else { expected }, certain && ok));
            s.busy_words.remove(&w);
            Some(if ok { Ok(8) } else { Err(()) })
        }
    }
}

/// How long the final verification keeps retrying a read that found no
/// working path to its server: a server a fault killed may still be coming
/// back when the workload ends (a lab guest booting under emulation on a
/// loaded machine takes tens of seconds). A server that stays away that long
/// fails the verification.
pub const VERIFY_PATIENCE: Duration = Duration::from_secs(120);

/// Runs `op` again, twice a second, while it fails because no path to its
/// server works and `until` has not passed; any other outcome is returned
/// as it is.
async fn patiently<T, F, Fut>(until: Instant, mut op: F) -> Result<T, pmem_client::PoolError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, pmem_client::PoolError>>,
{
    loop {
        match op().await {
            Err(pmem_client::PoolError::NoPath { .. }) if Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            outcome => return outcome,
        }
    }
}

/// Reads back every key and word the worker wrote and checks each holds
/// its last acknowledged value (or a later unacknowledged one); the result
/// also carries what the checks during the run found.
async fn verify(
    pool: &AsyncPool,
    keys: &KeySpace,
    shared: &Mutex<Shared>,
    size: u64,
) -> Verification {
    let (key_states, words, mut verification) = {
        let s = lock(shared);
        let states: Vec<_> = s.model.written().map(|(k, st)| (k, st.clone())).collect();
        (states, s.words.clone(), s.during_run.clone())
    };
    let until = Instant::now() + VERIFY_PATIENCE;
    for (k, state) in &key_states {
        verification.keys_checked += 1;
        let problem = match patiently(until, || pool.read(keys.key_addr(*k), size)).await {
            Err(e) => Some(format!("key {k}: read back failed: {e}")),
            Ok(bytes) => {
                let seen = decode(*k, &bytes);
                check::final_problem(*k, state, seen).map(|line| match seen {
                    Seen::Garbage => format!("{line}: {}", describe(*k, &bytes)),
                    _ => line,
                })
            }
        };
        if let Some(line) = problem {
            verification.push_mismatch(line);
        }
    }
    for (w, (expected, certain)) in &words {
        if !certain {
            continue;
        }
        verification.counters_checked += 1;
        match patiently(until, || pool.fetch_add(keys.own_word(*w), 0)).await {
            Ok(found) if found == *expected => {}
            Ok(found) => verification
                .push_mismatch(format!("own word {w}: expected {expected}, found {found}")),
            Err(e) => verification.push_mismatch(format!("own word {w}: read back failed: {e}")),
        }
    }
    verification.passed = verification.is_clean();
    verification
}
