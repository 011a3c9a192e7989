//! The pool: connections on every path, per-request path choice and
//! failover, and the application API (async, blocking and batch).
//!
//! An operation on a virtual range is translated extent by extent (through
//! the TLB), split into one request per contiguous PMEM piece, and each
//! piece is sent on the path the [`PathTable`] chooses. A piece whose path
//! dies, times out or reports its server unavailable is re-sent on another
//! path; atomics keep their (client, sequence) so a re-sent one is answered
//! from the server's window instead of being applied twice. An atomic that
//! went as an RDMA atomic on a RoCE path has the identity its fabric device
//! gave it (the queue pair's lane and the atomic's number on it); asked
//! again, it carries that identity.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::future::join_all;
use proto::Status;
use proto::request::{self, Operation, Target};
use tokio::sync::{Notify, Semaphore};
use topology::{
    ClientId, Layout, MetaLayout, PmemAddr, RegionIndex, RnicTransport, Topology, VirtAddr,
};

use crate::alloc::records;

use crate::conn::{self, Response};
use crate::error::{OpenError, PoolError, Reason, Tried, TriedPath};
use crate::link::PathLink;
use crate::paths::{
    Attempts, Failure, GiveUpReason, Next, PathConfig, PathHealth, PathId, PathTable, Probe,
};
use crate::translate::{StaticTranslator, Tlb, Translation, Translator};

/// Tunables of a pool.
#[derive(Debug, Clone, Copy)]
pub struct PoolOptions {
    /// Path health, probing and retry timing.
    pub paths: PathConfig,
    /// How long connecting one path may take.
    pub connect_timeout: Duration,
    /// Requests in flight at once, over all paths.
    pub queue_depth: usize,
    /// Extents the translation cache holds.
    pub tlb_capacity: usize,
}

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            paths: PathConfig::default(),
            connect_timeout: Duration::from_secs(2),
            queue_depth: 256,
            tlb_capacity: 65536,
        }
    }
}

/// Builds a pool connection with non-default options.
#[derive(Debug)]
pub struct PoolBuilder {
    topology: Topology,
    client: ClientId,
    options: PoolOptions,
    translator: Option<Arc<dyn Translator>>,
    secrets: Option<PathBuf>,
}

/// The environment variable naming the folder of keys a pool proves its
/// client with, when the builder is not given one.
pub const SECRETS_ENV: &str = "PMEM_FABRIC_SECRETS";

impl PoolBuilder {
    /// Proves the client's key (`client.<id>.key` in `dir`) to every fabric
    /// device, which must prove it holds it too. By default the folder in
    /// `$PMEM_FABRIC_SECRETS`, if set; without one, no authentication.
    pub fn secrets(mut self, dir: impl Into<PathBuf>) -> Self {
        self.secrets = Some(dir.into());
        self
    }

    /// Per-attempt timeout: a request unanswered this long on one path is
    /// re-sent on another.
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.options.paths.attempt_timeout = timeout;
        self
    }

    /// Whole-operation timeout, retries included.
    pub fn op_timeout(mut self, timeout: Duration) -> Self {
        self.options.paths.op_timeout = timeout;
        self
    }

    /// Requests in flight at once.
    pub fn queue_depth(mut self, depth: usize) -> Self {
        self.options.queue_depth = depth.max(1);
        self
    }

    /// How long connecting one path may take.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.options.connect_timeout = timeout;
        self
    }

    /// All options at once.
    pub fn options(mut self, options: PoolOptions) -> Self {
        self.options = options;
        self
    }

    /// A translator other than the topology's static space (the allocator's
    /// page table).
    pub fn translator(mut self, translator: Arc<dyn Translator>) -> Self {
        self.translator = Some(translator);
        self
    }

    /// Connects inside the caller's tokio runtime.
    pub async fn connect_async(self) -> Result<AsyncPool, OpenError> {
        AsyncPool::open(self).await
    }

    /// Connects with a runtime of the pool's own, for the blocking API.
    pub fn connect(self) -> Result<Pool, OpenError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("pmem-pool")
            .enable_all()
            .build()
            .map_err(OpenError::Runtime)?;
        let pool = runtime.block_on(AsyncPool::open(self))?;
        Ok(Pool { runtime, pool })
    }
}

/// One path's current connection.
#[derive(Debug, Default)]
struct Slot {
    conn: Option<Arc<PathLink>>,
    /// Bumped on every (re)connect, so a stale connection's death is ignored.
    generation: u64,
}

/// Operations in flight, for `fence`.
#[derive(Debug, Default)]
struct InFlight {
    next: AtomicU64,
    active: Mutex<BTreeSet<u64>>,
    settled: Notify,
}

/// Marks one operation in flight until dropped.
struct OpGuard<'a>(&'a InFlight, u64);

impl Drop for OpGuard<'_> {
    fn drop(&mut self) {
        lock(&self.0.active).remove(&self.1);
        self.0.settled.notify_waiters();
    }
}

impl InFlight {
    fn begin(&self) -> OpGuard<'_> {
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        lock(&self.active).insert(id);
        OpGuard(self, id)
    }

    /// Waits until every operation begun before this call has finished.
    async fn fence(&self) {
        let upto = self.next.load(Ordering::SeqCst);
        loop {
            let settled = self.settled.notified();
            if lock(&self.active)
                .first()
                .is_none_or(|first| *first >= upto)
            {
                return;
            }
            settled.await;
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Counters a client keeps about itself.
#[derive(Debug, Default)]
pub struct Stats {
    /// Requests sent (first attempts).
    pub requests: AtomicU64,
    /// Attempts re-sent after a path failed.
    pub retries: AtomicU64,
    /// Requests that completed on another path than their first.
    pub failovers: AtomicU64,
    /// Paths reconnected by the prober.
    pub reconnects: AtomicU64,
}

/// A snapshot of [`Stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Requests sent.
    pub requests: u64,
    /// Attempts re-sent after a path failed.
    pub retries: u64,
    /// Requests that completed on another path than their first.
    pub failovers: u64,
    /// Paths reconnected.
    pub reconnects: u64,
}

/// One path as `pmemctl map` shows it.
#[derive(Debug, Clone)]
pub struct PathStatus {
    /// The RNIC.
    pub rnic: String,
    /// `tcp` or `roce`.
    pub transport: &'static str,
    /// The fabric device and its address.
    pub device: String,
    /// Where it connects.
    pub device_addr: String,
    /// Up or down.
    pub up: bool,
    /// Requests outstanding on it.
    pub outstanding: usize,
}

#[derive(Debug)]
struct Inner {
    client: ClientId,
    /// The client's position in the topology.
    client_index: u16,
    pool_name: String,
    layout: Layout,
    translator: Backing,
    /// The client's key, proven to every device (with secrets).
    key: Option<proto::auth::Key>,
    tlb: Tlb,
    table: Mutex<PathTable>,
    slots: Vec<Mutex<Slot>>,
    seq: AtomicU64,
    depth: Semaphore,
    in_flight: InFlight,
    prober: Arc<Notify>,
    /// Woken whenever a path or a (path, server) pair comes back.
    restored: Notify,
    stats: Stats,
    options: PoolOptions,
}

/// What translates virtual addresses when the TLB misses.
#[derive(Debug)]
enum Backing {
    /// A translator in memory (the static space, or the caller's).
    Fixed(Arc<dyn Translator>),
    /// The allocator's page table in PMEM, read with one-sided READs.
    PageTable(MetaLayout),
}

/// The pool, for async code (tokio). Cheap to clone.
#[derive(Debug, Clone)]
pub struct AsyncPool {
    inner: Arc<Inner>,
}

/// The pool, for blocking code: each call waits for its result.
#[derive(Debug)]
pub struct Pool {
    runtime: tokio::runtime::Runtime,
    pool: AsyncPool,
}

/// One PMEM piece of a virtual range.
#[derive(Debug, Clone, Copy)]
struct Piece {
    vaddr: VirtAddr,
    pmem: PmemAddr,
    len: u64,
    key: u64,
    region: RegionIndex,
}

/// A request to send, before it has a path.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spec<'a> {
    pub(crate) operation: Operation,
    pub(crate) length: u32,
    pub(crate) operand: u64,
    pub(crate) compare: u64,
    pub(crate) payload: &'a [u8],
    pub(crate) persist: bool,
    pub(crate) exactly_once: bool,
}

impl Spec<'_> {
    pub(crate) fn plain(operation: Operation, length: u32) -> Self {
        Self {
            operation,
            length,
            operand: 0,
            compare: 0,
            payload: &[],
            persist: false,
            exactly_once: false,
        }
    }
}

/// Most bytes one request moves.
const MAX_PIECE: u64 = proto::frame::MAX_DATA_LEN as u64;

impl AsyncPool {
    /// A builder for a connection of `client` to the pool `topology` describes.
    pub fn builder(topology: Topology, client: impl Into<ClientId>) -> PoolBuilder {
        PoolBuilder {
            topology,
            client: client.into(),
            options: PoolOptions::default(),
            translator: None,
            secrets: std::env::var_os(SECRETS_ENV).map(PathBuf::from),
        }
    }

    /// Connects `client` with default options.
    pub async fn connect(
        topology: Topology,
        client: impl Into<ClientId>,
    ) -> Result<Self, OpenError> {
        Self::builder(topology, client).connect_async().await
    }

    async fn open(builder: PoolBuilder) -> Result<Self, OpenError> {
        let PoolBuilder {
            topology,
            client,
            options,
            translator,
            secrets,
        } = builder;
        topology.validate()?;
        let key = match &secrets {
            Some(dir) => Some(proto::auth::Key::new(topology::secrets::read_key(
                dir,
                topology::secrets::Principal::Client(client.as_str()),
            )?)),
            None => None,
        };
        let layout = Layout::new(&topology)?;
        let table = PathTable::new(&topology, &layout, &client, options.paths)?;
        let translator = match (translator, layout.meta()) {
            (Some(custom), _) => Backing::Fixed(custom),
            (None, Some(meta)) => Backing::PageTable(meta.clone()),
            (None, None) => Backing::Fixed(Arc::new(StaticTranslator::new(&layout))),
        };
        let extent = layout.extent_size();
        let slots = table.paths().iter().map(|_| Mutex::default()).collect();
        let start_seq = new_session();
        let client_index = topology
            .clients
            .iter()
            .position(|c| c.id == client)
            .and_then(|i| u16::try_from(i).ok())
            .unwrap_or(u16::MAX);
        let inner = Arc::new(Inner {
            client_index,
            pool_name: topology.pool.name.clone(),
            tlb: Tlb::new(extent, options.tlb_capacity),
            translator,
            key,
            client,
            layout,
            table: Mutex::new(table),
            slots,
            seq: AtomicU64::new(start_seq),
            depth: Semaphore::new(options.queue_depth.max(1)),
            in_flight: InFlight::default(),
            prober: Arc::new(Notify::new()),
            restored: Notify::new(),
            stats: Stats::default(),
            options,
        });
        let paths: Vec<PathId> = lock(&inner.table).paths().iter().map(|p| p.id).collect();
        let results = join_all(paths.iter().map(|&p| inner.connect_path(p))).await;
        let mut failures = Vec::new();
        let now = Instant::now();
        for (&path, result) in paths.iter().zip(results) {
            match result {
                Ok(()) => {}
                Err(
                    e @ (conn::ConnectError::Refused { .. }
                    | conn::ConnectError::DigestMismatch { .. }),
                ) => {
                    return Err(OpenError::Refused {
                        client: inner.client.to_string(),
                        path: inner.path_name(path),
                        source: Box::new(e),
                    });
                }
                Err(e) => {
                    lock(&inner.table).report_failure(path, 0, Failure::ConnectionLost, now);
                    failures.push((inner.path_name(path), e));
                }
            }
        }
        if failures.len() == paths.len() {
            return Err(OpenError::Unreachable {
                client: inner.client.to_string(),
                failures,
            });
        }
        tokio::spawn(probe_loop(
            Arc::downgrade(&inner),
            Arc::clone(&inner.prober),
        ));
        Ok(Self { inner })
    }

    /// Reads `len` bytes at `vaddr`.
    pub async fn read(&self, vaddr: VirtAddr, len: u64) -> Result<Vec<u8>, PoolError> {
        let _op = self.inner.in_flight.begin();
        let pieces = self.inner.plan(vaddr, len).await?;
        let results = join_all(pieces.iter().map(|piece| {
            let length = piece.len as u32;
            self.inner
                .send_piece(*piece, Spec::plain(Operation::Read, length))
        }))
        .await;
        let mut out = Vec::with_capacity(len as usize);
        for result in results {
            out.extend_from_slice(&result?.data);
        }
        Ok(out)
    }

    /// Writes `data` at `vaddr`.
    pub async fn write(&self, vaddr: VirtAddr, data: &[u8]) -> Result<(), PoolError> {
        self.write_op(vaddr, data, Operation::Write).await
    }

    /// Writes `data` at `vaddr` and returns once it is durable.
    pub async fn write_persist(&self, vaddr: VirtAddr, data: &[u8]) -> Result<(), PoolError> {
        self.write_op(vaddr, data, Operation::WritePersist).await
    }

    async fn write_op(
        &self,
        vaddr: VirtAddr,
        data: &[u8],
        operation: Operation,
    ) -> Result<(), PoolError> {
        let _op = self.inner.in_flight.begin();
        let pieces = self.inner.plan(vaddr, data.len() as u64).await?;
        let mut offset = 0usize;
        let sends = pieces.iter().map(|piece| {
            let payload = &data[offset..offset + piece.len as usize];
            offset += piece.len as usize;
            let spec = Spec {
                payload,
                ..Spec::plain(operation, piece.len as u32)
            };
            self.inner.send_piece(*piece, spec)
        });
        let sends: Vec<_> = sends.collect();
        for result in join_all(sends).await {
            result?;
        }
        Ok(())
    }

    /// Makes `len` bytes at `vaddr` durable.
    pub async fn flush(&self, vaddr: VirtAddr, len: u64) -> Result<(), PoolError> {
        let _op = self.inner.in_flight.begin();
        let pieces = self.inner.plan(vaddr, len).await?;
        let results = join_all(pieces.iter().map(|piece| {
            self.inner
                .send_piece(*piece, Spec::plain(Operation::Flush, piece.len as u32))
        }))
        .await;
        results.into_iter().try_for_each(|r| r.map(drop))
    }

    /// Compare-and-swap of the 8-byte word at `vaddr`; returns the old value
    /// (the swap happened when it equals `old`). Exactly once, even across
    /// failover.
    pub async fn compare_and_swap(
        &self,
        vaddr: VirtAddr,
        old: u64,
        new: u64,
    ) -> Result<u64, PoolError> {
        self.atomic(vaddr, Operation::CompareSwap, new, old, true)
            .await
    }

    /// Adds `delta` to the 8-byte word at `vaddr`; returns the old value.
    /// Exactly once, even across failover.
    pub async fn fetch_add(&self, vaddr: VirtAddr, delta: u64) -> Result<u64, PoolError> {
        self.atomic(vaddr, Operation::FetchAdd, delta, 0, true)
            .await
    }

    /// Stores `value` into the 8-byte word at `vaddr` atomically.
    pub async fn atomic_write(&self, vaddr: VirtAddr, value: u64) -> Result<(), PoolError> {
        self.atomic(vaddr, Operation::AtomicWrite, value, 0, false)
            .await
            .map(drop)
    }

    async fn atomic(
        &self,
        vaddr: VirtAddr,
        operation: Operation,
        operand: u64,
        compare: u64,
        exactly_once: bool,
    ) -> Result<u64, PoolError> {
        if !vaddr.get().is_multiple_of(8) {
            return Err(PoolError::Misaligned { vaddr });
        }
        let _op = self.inner.in_flight.begin();
        let pieces = self.inner.plan(vaddr, 8).await?;
        let [piece] = pieces[..] else {
            return Err(PoolError::Misaligned { vaddr });
        };
        let spec = Spec {
            operand,
            compare,
            exactly_once,
            ..Spec::plain(operation, 8)
        };
        self.inner.send_piece(piece, spec).await.map(|r| r.value)
    }

    /// Waits until every operation issued before it has completed.
    pub async fn fence(&self) {
        self.inner.in_flight.fence().await;
    }

    /// Runs every operation of `batch` concurrently and waits once; results
    /// come back in the batch's order.
    pub async fn submit(&self, batch: Batch) -> Vec<Result<Completion, PoolError>> {
        join_all(batch.ops.into_iter().map(|op| self.run_batch_op(op))).await
    }

    async fn run_batch_op(&self, op: BatchOp) -> Result<Completion, PoolError> {
        match op {
            BatchOp::Read { vaddr, len } => self.read(vaddr, len).await.map(Completion::Data),
            BatchOp::Write {
                vaddr,
                data,
                persist,
            } => if persist {
                self.write_persist(vaddr, &data).await
            } else {
                self.write(vaddr, &data).await
            }
            .map(|()| Completion::Done),
            BatchOp::Flush { vaddr, len } => {
                self.flush(vaddr, len).await.map(|()| Completion::Done)
            }
            BatchOp::CompareAndSwap { vaddr, old, new } => self
                .compare_and_swap(vaddr, old, new)
                .await
                .map(Completion::Old),
            BatchOp::FetchAdd { vaddr, delta } => {
                self.fetch_add(vaddr, delta).await.map(Completion::Old)
            }
            BatchOp::AtomicWrite { vaddr, value } => self
                .atomic_write(vaddr, value)
                .await
                .map(|()| Completion::Done),
        }
    }

    /// Reads `len` bytes at a PMEM address with `key` (allocator metadata).
    pub(crate) async fn pmem_read(
        &self,
        at: PmemAddr,
        key: u64,
        len: u32,
    ) -> Result<Vec<u8>, PoolError> {
        let mut out = Vec::with_capacity(len as usize);
        let mut done = 0u32;
        while done < len {
            let take = (len - done).min(MAX_PIECE as u32);
            let spec = Spec::plain(Operation::Read, take);
            let at = PmemAddr(at.get() + u64::from(done));
            out.extend_from_slice(&self.inner.raw(at, key, spec).await?.data);
            done += take;
        }
        Ok(out)
    }

    /// Writes `data` at a PMEM address with `key`, durably.
    pub(crate) async fn pmem_write(
        &self,
        at: PmemAddr,
        key: u64,
        data: &[u8],
    ) -> Result<(), PoolError> {
        for (i, chunk) in data.chunks(MAX_PIECE as usize).enumerate() {
            let spec = Spec {
                payload: chunk,
                ..Spec::plain(Operation::WritePersist, chunk.len() as u32)
            };
            let at = PmemAddr(at.get() + (i as u64) * MAX_PIECE);
            self.inner.raw(at, key, spec).await?;
        }
        Ok(())
    }

    /// A durable, exactly-once atomic on the word at a PMEM address; returns
    /// the old value (COMPARE_SWAP swapped when it equals `compare`).
    pub(crate) async fn pmem_atomic(
        &self,
        at: PmemAddr,
        key: u64,
        operation: Operation,
        operand: u64,
        compare: u64,
    ) -> Result<u64, PoolError> {
        let spec = Spec {
            operand,
            compare,
            persist: true,
            exactly_once: operation != Operation::AtomicWrite,
            ..Spec::plain(operation, 8)
        };
        Ok(self.inner.raw(at, key, spec).await?.value)
    }

    /// Caches a translation the allocator just created.
    pub(crate) fn install_translation(&self, t: Translation) {
        self.inner.install(t);
    }

    /// Drops the cached translation of `vaddr`'s extent.
    pub(crate) fn invalidate_translation(&self, vaddr: VirtAddr) {
        self.inner.invalidate(vaddr);
    }

    /// The virtual range of every region: (region id, start, length).
    pub fn regions(&self) -> Vec<(String, VirtAddr, u64)> {
        let translator = StaticTranslator::new(&self.inner.layout);
        translator
            .region_ranges()
            .filter_map(|(region, start, len)| {
                let entry = self.inner.layout.entry(region)?;
                Some((entry.region_id.to_string(), start, len))
            })
            .collect()
    }

    /// The layout the pool uses.
    pub fn layout(&self) -> &Layout {
        &self.inner.layout
    }

    /// The pool's name.
    pub fn pool_name(&self) -> &str {
        &self.inner.pool_name
    }

    /// The client's position in the topology (its owner number in the
    /// allocator's records).
    pub fn client_index(&self) -> u16 {
        self.inner.client_index
    }

    /// Every path and how it is doing.
    pub fn paths(&self) -> Vec<PathStatus> {
        let table = lock(&self.inner.table);
        table
            .paths()
            .iter()
            .map(|p| PathStatus {
                rnic: p.rnic.to_string(),
                transport: match p.transport {
                    RnicTransport::Tcp => "tcp",
                    RnicTransport::Roce => "roce",
                },
                device: p.device.to_string(),
                device_addr: p.device_addr.clone(),
                up: matches!(table.health(p.id), PathHealth::Up),
                outstanding: table.outstanding(p.id),
            })
            .collect()
    }

    /// The client's own counters.
    pub fn stats(&self) -> StatsSnapshot {
        let s = &self.inner.stats;
        StatsSnapshot {
            requests: s.requests.load(Ordering::Relaxed),
            retries: s.retries.load(Ordering::Relaxed),
            failovers: s.failovers.load(Ordering::Relaxed),
            reconnects: s.reconnects.load(Ordering::Relaxed),
        }
    }
}

impl Inner {
    fn path_name(&self, path: PathId) -> String {
        let table = lock(&self.table);
        table.paths().get(path.0).map_or_else(
            || format!("#{}", path.0),
            |p| format!("{} -> {}", p.rnic, p.device),
        )
    }

    fn server_name(&self, region: RegionIndex) -> String {
        self.layout
            .entry(region)
            .map_or_else(|| "?".to_owned(), |e| e.server.to_string())
    }

    /// (Re)connects `path` and installs the connection.
    async fn connect_path(self: &Arc<Self>, path: PathId) -> Result<(), conn::ConnectError> {
        let info = lock(&self.table).paths()[path.0].clone();
        let generation = lock(&self.slots[path.0]).generation + 1;
        let weak = Arc::downgrade(self);
        let on_lost = Box::new(move || {
            if let Some(inner) = weak.upgrade() {
                inner.connection_lost(path, generation);
            }
        });
        let link = match info.transport {
            RnicTransport::Tcp => PathLink::Tcp(
                conn::connect(
                    &info.device_addr,
                    info.local_addr.as_deref(),
                    self.client.as_str(),
                    self.key.clone(),
                    self.layout.digest(),
                    self.options.connect_timeout,
                    on_lost,
                )
                .await?,
            ),
            RnicTransport::Roce => self.connect_roce(&info, on_lost).await?,
        };
        let mut slot = lock(&self.slots[path.0]);
        slot.generation = generation;
        slot.conn = Some(Arc::new(link));
        Ok(())
    }

    /// Sets up a RoCE path: control connection and queue pair, numbering
    /// its atomics on lane `path + 1` from above anything an earlier queue
    /// pair of the path numbered.
    #[cfg(feature = "verbs")]
    async fn connect_roce(
        &self,
        info: &crate::paths::PathInfo,
        on_lost: Box<dyn FnOnce() + Send>,
    ) -> Result<PathLink, conn::ConnectError> {
        use crate::verbs::link::{LinkConfig, VerbsLink};
        let bad_address = || conn::ConnectError::RoceAddress {
            addr: info.device_addr.clone(),
            rnic: info.rnic.to_string(),
            local: info.local_addr.clone(),
        };
        let local_ip = info
            .local_addr
            .as_deref()
            .and_then(|a| a.parse().ok())
            .ok_or_else(bad_address)?;
        let addr = info
            .device_addr
            .parse()
            .map_err(|_| conn::ConnectError::BadAddress(info.device_addr.clone()))?;
        let lane = u8::try_from(info.id.0 + 1).map_err(|_| bad_address())?;
        // Every queue pair numbers its atomics in a session of its own.
        let first = new_session();
        let config = LinkConfig {
            addr,
            client: self.client.to_string(),
            digest: self.layout.digest(),
            layout: self.layout.clone(),
            timeout: self.options.connect_timeout,
            rdma_device: info.rdma_device.clone(),
            key: self.key.clone(),
            local_ip,
            atomics: proto::qp::AtomicSeq { lane, first },
        };
        let link = tokio::task::spawn_blocking(move || VerbsLink::open(config, on_lost))
            .await
            .map_err(|e| conn::ConnectError::Protocol {
                addr: info.device_addr.clone(),
                what: format!("verbs set-up task: {e}"),
            })??;
        Ok(PathLink::Verbs(link))
    }

    /// Without the `verbs` feature a RoCE path cannot be set up.
    #[cfg(not(feature = "verbs"))]
    async fn connect_roce(
        &self,
        info: &crate::paths::PathInfo,
        _on_lost: Box<dyn FnOnce() + Send>,
    ) -> Result<PathLink, conn::ConnectError> {
        Err(conn::ConnectError::NoVerbs {
            addr: info.device_addr.clone(),
            rnic: info.rnic.to_string(),
        })
    }

    /// A connection died: the path is down until the prober brings it back.
    fn connection_lost(&self, path: PathId, generation: u64) {
        {
            let mut slot = lock(&self.slots[path.0]);
            if slot.generation != generation {
                return;
            }
            slot.conn = None;
        }
        lock(&self.table).report_failure(path, 0, Failure::ConnectionLost, Instant::now());
        self.prober.notify_one();
    }

    async fn translate(&self, vaddr: VirtAddr) -> Result<Translation, PoolError> {
        match &self.translator {
            Backing::Fixed(translator) => self
                .tlb
                .translate(translator.as_ref(), vaddr)
                .map_err(|_| PoolError::Unmapped { vaddr }),
            Backing::PageTable(meta) => {
                if let Some(t) = self.tlb.get(vaddr) {
                    return Ok(t);
                }
                let t = self.walk(meta, vaddr).await?;
                self.tlb.insert(t);
                Ok(t)
            }
        }
    }

    /// Reads `vaddr`'s page-table entry: its translation, or why it has none.
    async fn walk(&self, meta: &MetaLayout, vaddr: VirtAddr) -> Result<Translation, PoolError> {
        let unmapped = PoolError::Unmapped { vaddr };
        let index = records::vextent_of(meta, vaddr).ok_or(unmapped)?;
        let table = meta.meta_region();
        let at = meta.page_table_entry(index);
        let bytes = self
            .raw(
                at,
                table.key,
                Spec::plain(Operation::Read, records::PT_ENTRY_LEN as u32),
            )
            .await?
            .data;
        let entry = records::PtEntry::decode(&bytes).ok_or(PoolError::Unmapped { vaddr })?;
        match entry.control.state {
            records::EntryState::Live => {
                let pmem = PmemAddr(entry.pmem);
                let region = self
                    .layout
                    .lookup(pmem)
                    .map(|at| at.offset.region)
                    .ok_or(PoolError::Unmapped { vaddr })?;
                Ok(Translation {
                    vbase: records::vbase_of(meta, index),
                    len: meta.extent_size(),
                    pmem,
                    key: entry.key,
                    region,
                })
            }
            records::EntryState::Free | records::EntryState::Freeing
                if entry.control.generation > 0 =>
            {
                Err(PoolError::UseAfterFree { vaddr })
            }
            _ => Err(PoolError::Unmapped { vaddr }),
        }
    }

    /// Sends one request addressed by PMEM address and key (the allocator's
    /// metadata accesses), failing over like any other; a status other than
    /// OK becomes an error.
    async fn raw(&self, pmem: PmemAddr, key: u64, spec: Spec<'_>) -> Result<Response, PoolError> {
        let vaddr = VirtAddr(pmem.get());
        let region = self
            .layout
            .lookup(pmem)
            .map(|at| at.offset.region)
            .ok_or(PoolError::Unmapped { vaddr })?;
        let piece = Piece {
            vaddr,
            pmem,
            len: u64::from(spec.length),
            key,
            region,
        };
        let response = self.send_with_failover(piece, spec).await?;
        match response.status {
            Status::Ok => Ok(response),
            status => Err(self.status_error(piece, status)),
        }
    }

    /// The error for a final non-OK status of `piece`.
    fn status_error(&self, piece: Piece, status: Status) -> PoolError {
        let vaddr = piece.vaddr;
        match status {
            Status::AccessDenied => PoolError::AccessDenied { vaddr },
            Status::Unmapped => PoolError::Unmapped { vaddr },
            Status::OutOfBounds => PoolError::OutOfBounds {
                vaddr,
                len: piece.len,
            },
            status => PoolError::Rejected {
                vaddr,
                server: self.server_name(piece.region),
                status,
            },
        }
    }

    fn install(&self, t: Translation) {
        self.tlb.insert(t);
    }

    fn invalidate(&self, vaddr: VirtAddr) {
        self.tlb.invalidate(vaddr);
    }

    /// Splits `[vaddr, vaddr + len)` into PMEM pieces: one per run of
    /// extents contiguous in PMEM with the same key, at most [`MAX_PIECE`].
    async fn plan(&self, vaddr: VirtAddr, len: u64) -> Result<Vec<Piece>, PoolError> {
        let end = vaddr
            .get()
            .checked_add(len)
            .ok_or(PoolError::OutOfBounds { vaddr, len })?;
        let mut pieces: Vec<Piece> = Vec::new();
        let mut at = vaddr.get();
        while at < end {
            let t = self.translate(VirtAddr(at)).await?;
            let take = t.remaining(VirtAddr(at)).min(end - at);
            let pmem = t.pmem_of(VirtAddr(at));
            match pieces.last_mut() {
                Some(last)
                    if last.region == t.region
                        && last.key == t.key
                        && last.pmem.get() + last.len == pmem.get()
                        && last.len + take <= MAX_PIECE =>
                {
                    last.len += take;
                }
                _ => pieces.push(Piece {
                    vaddr: VirtAddr(at),
                    pmem,
                    len: take,
                    key: t.key,
                    region: t.region,
                }),
            }
            at += take;
        }
        if pieces.is_empty() {
            // A zero-length access still names one address.
            let t = self.translate(vaddr).await?;
            pieces.push(Piece {
                vaddr,
                pmem: t.pmem_of(vaddr),
                len: 0,
                key: t.key,
                region: t.region,
            });
        }
        Ok(pieces)
    }

    /// Sends one piece, failing over between paths, and maps the final
    /// status to an error. A stale translation (ACCESS_DENIED, UNMAPPED) is
    /// refilled once.
    async fn send_piece(&self, piece: Piece, spec: Spec<'_>) -> Result<Response, PoolError> {
        let response = self.send_with_failover(piece, spec).await?;
        let status = match response.status {
            Status::Ok => return Ok(response),
            status @ (Status::AccessDenied | Status::Unmapped) => {
                self.tlb.invalidate(piece.vaddr);
                let fresh = self.translate(piece.vaddr).await?;
                if fresh.pmem_of(piece.vaddr) != piece.pmem || fresh.key != piece.key {
                    let piece = Piece {
                        pmem: fresh.pmem_of(piece.vaddr),
                        key: fresh.key,
                        region: fresh.region,
                        ..piece
                    };
                    let retried = self.send_with_failover(piece, spec).await?;
                    if retried.status == Status::Ok {
                        return Ok(retried);
                    }
                    retried.status
                } else {
                    status
                }
            }
            status => status,
        };
        Err(self.status_error(piece, status))
    }

    /// Sends one request on the best path, and again on others while paths
    /// fail, until an answer other than SERVER_UNAVAILABLE comes back or no
    /// path is left.
    async fn send_with_failover(
        &self,
        piece: Piece,
        spec: Spec<'_>,
    ) -> Result<Response, PoolError> {
        let _permit = self.depth.acquire().await.map_err(|_| PoolError::Closed)?;
        let server = lock(&self.table)
            .server_of(piece.region)
            .unwrap_or_default();
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let mut repr = request::Repr {
            operation: spec.operation,
            target: Target::Pmem(piece.pmem),
            key: piece.key,
            length: spec.length,
            exactly_once: None,
            on_behalf: None,
            persist: spec.persist,
            non_temporal: false,
            operand: spec.operand,
            compare: spec.compare,
            payload: spec.payload,
        };
        if spec.exactly_once {
            repr = repr.with_exactly_once(0, seq);
        }
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let mut attempts = Attempts::new(piece.region, Instant::now());
        let mut first_path = None;
        // Whether an earlier attempt may have run the request.
        let mut again = false;
        loop {
            let now = Instant::now();
            let next = attempts.next(&lock(&self.table), now);
            let path = match next {
                Next::Send(path) => path,
                Next::GiveUp(give_up)
                    if give_up.reason != GiveUpReason::Deadline
                        && !server_is_down(&give_up.tried) =>
                {
                    // Every path is down or failed for now: wait for one to
                    // come back (the prober restores them) until the
                    // operation's deadline.
                    let op_deadline = attempts.op_deadline(&lock(&self.table));
                    let recheck = now + self.options.paths.probe_interval;
                    let restored = self.restored.notified();
                    let _ =
                        tokio::time::timeout_at(recheck.min(op_deadline).into(), restored).await;
                    continue;
                }
                Next::GiveUp(give_up) => {
                    let tried = {
                        let table = lock(&self.table);
                        give_up
                            .tried
                            .iter()
                            .map(|&(p, failure)| {
                                let info = &table.paths()[p.0];
                                TriedPath {
                                    rnic: info.rnic.to_string(),
                                    device: info.device.to_string(),
                                    failure,
                                }
                            })
                            .collect()
                    };
                    return Err(PoolError::NoPath {
                        vaddr: piece.vaddr,
                        server: self.server_name(piece.region),
                        reason: Reason(give_up.reason),
                        tried: Tried(tried),
                    });
                }
            };
            match first_path {
                None => first_path = Some(path),
                Some(_) => {
                    self.stats.retries.fetch_add(1, Ordering::Relaxed);
                }
            }
            let deadline = attempts.attempt_deadline(&lock(&self.table), now);
            let (outcome, identity) = self.attempt(path, &repr, again, deadline).await;
            again = spec.exactly_once;
            if let Some(identity) = identity {
                // It went as an RDMA atomic the device numbered: that
                // number is the one a server may have recorded.
                repr.exactly_once = Some(identity);
            }
            let now = Instant::now();
            match outcome {
                Ok((response, current)) if !server_unreachable(response.status) => {
                    if current {
                        lock(&self.table).report_success(path, server, now);
                    }
                    if first_path != Some(path) {
                        self.stats.failovers.fetch_add(1, Ordering::Relaxed);
                    }
                    return Ok(response);
                }
                Ok(_) => self.attempt_failed(
                    &mut attempts,
                    path,
                    server,
                    Failure::ServerUnavailable,
                    now,
                ),
                Err(failure) => self.attempt_failed(&mut attempts, path, server, failure, now),
            }
        }
    }

    fn attempt_failed(
        &self,
        attempts: &mut Attempts,
        path: PathId,
        server: u16,
        failure: Failure,
        now: Instant,
    ) {
        attempts.failed(path, failure);
        lock(&self.table).report_failure(path, server, failure, now);
        if failure == Failure::Timeout {
            // A path that stops answering is reconnected by the prober.
            lock(&self.slots[path.0]).conn = None;
        }
        self.prober.notify_one();
    }

    /// Whether `conn` is still `path`'s connection (not replaced or dropped
    /// since an attempt started on it).
    fn is_current(&self, path: PathId, conn: &Arc<PathLink>) -> bool {
        lock(&self.slots[path.0])
            .conn
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, conn))
    }

    /// One attempt on one path (`again`: an earlier attempt may have run
    /// the request): the response, and whether the connection it came on is
    /// still the path's; with it, the exactly-once identity the request got
    /// on the way when it differs from the one it was sent with.
    async fn attempt(
        &self,
        path: PathId,
        repr: &request::Repr<'_>,
        again: bool,
        deadline: Instant,
    ) -> (
        Result<(Response, bool), Failure>,
        Option<request::ExactlyOnce>,
    ) {
        let conn = lock(&self.slots[path.0]).conn.clone();
        let Some(conn) = conn else {
            return (Err(Failure::ConnectionLost), None);
        };
        lock(&self.table).started(path);
        let mut identity = None;
        let result = match conn.send(repr, again) {
            Err(conn::Lost) => Err(Failure::ConnectionLost),
            Ok(mut sent) => {
                let reply = &mut sent.reply;
                let result = match tokio::time::timeout_at(deadline.into(), reply).await {
                    Ok(Ok(response)) => Ok(response),
                    Ok(Err(_)) => Err(Failure::ConnectionLost),
                    Err(_) => {
                        conn.cancel(&sent);
                        Err(Failure::Timeout)
                    }
                };
                identity = sent.identity();
                result
            }
        };
        lock(&self.table).finished(path);
        // An answer on a connection given up on meanwhile is good data but
        // says nothing about the path's current health.
        let current = self.is_current(path, &conn);
        (result.map(|response| (response, current)), identity)
    }

    /// One probe: reconnect a path, or ask a server through it.
    async fn probe(self: Arc<Self>, probe: Probe) {
        let now = Instant::now();
        match probe.server {
            None => match self.connect_path(probe.path).await {
                Ok(()) => {
                    self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
                    lock(&self.table).path_restored(probe.path, Instant::now());
                    self.restored.notify_waiters();
                }
                Err(_) => lock(&self.table).probe_failed(probe, Instant::now()),
            },
            Some(server) => {
                let Some(entry) = self
                    .layout
                    .entries()
                    .iter()
                    .find(|e| e.server_index == server)
                else {
                    return;
                };
                let repr = request::Repr::read(Target::Pmem(entry.start), entry.key, 0);
                let deadline = now + self.options.paths.attempt_timeout;
                match self.attempt(probe.path, &repr, false, deadline).await.0 {
                    Ok((r, true)) if !server_unreachable(r.status) => {
                        lock(&self.table).report_success(probe.path, server, Instant::now());
                        self.restored.notify_waiters();
                    }
                    _ => lock(&self.table).probe_failed(probe, Instant::now()),
                }
            }
        }
    }
}

/// Whether a device's answer says it could not reach the server: it has no
/// live link to it (SERVER_UNAVAILABLE) or its link stopped answering
/// (TIMEOUT). Another device may still reach it.
fn server_unreachable(status: Status) -> bool {
    matches!(status, Status::ServerUnavailable | Status::Timeout)
}

/// Whether every path that was tried reported the server itself
/// unavailable: the server is down, not a path. That is reported at once
/// (requests in flight on a dead server fail visibly) instead of being
/// waited out like a path outage.
fn server_is_down(tried: &[(PathId, Failure)]) -> bool {
    !tried.is_empty() && tried.iter().all(|(_, f)| *f == Failure::ServerUnavailable)
}

/// Runs due probes until the pool is dropped.
async fn probe_loop(pool: Weak<Inner>, wake: Arc<Notify>) {
    loop {
        let next = {
            let Some(inner) = pool.upgrade() else {
                return;
            };
            let now = Instant::now();
            let (due, next) = {
                let mut table = lock(&inner.table);
                (table.probes_due(now), table.poll_timeout())
            };
            for probe in due {
                tokio::spawn(Arc::clone(&inner).probe(probe));
            }
            next.unwrap_or(now + Duration::from_secs(1))
        };
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep_until(next.into()) => {}
        }
    }
}

/// Several operations submitted together with [`AsyncPool::submit`].
#[derive(Debug, Default, Clone)]
pub struct Batch {
    ops: Vec<BatchOp>,
}

/// One operation of a [`Batch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOp {
    /// Read `len` bytes.
    Read {
        /// Where.
        vaddr: VirtAddr,
        /// How many bytes.
        len: u64,
    },
    /// Write `data`, durably when `persist`.
    Write {
        /// Where.
        vaddr: VirtAddr,
        /// What.
        data: Vec<u8>,
        /// Acknowledge only once durable.
        persist: bool,
    },
    /// Make `len` bytes durable.
    Flush {
        /// Where.
        vaddr: VirtAddr,
        /// How many bytes.
        len: u64,
    },
    /// Compare-and-swap an 8-byte word.
    CompareAndSwap {
        /// Where.
        vaddr: VirtAddr,
        /// Expected value.
        old: u64,
        /// New value.
        new: u64,
    },
    /// Fetch-and-add on an 8-byte word.
    FetchAdd {
        /// Where.
        vaddr: VirtAddr,
        /// What to add.
        delta: u64,
    },
    /// Store an 8-byte word atomically.
    AtomicWrite {
        /// Where.
        vaddr: VirtAddr,
        /// What.
        value: u64,
    },
}

/// The result of one batch operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// Data read.
    Data(Vec<u8>),
    /// Done, nothing to return.
    Done,
    /// The old value of an atomic.
    Old(u64),
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an operation.
    pub fn push(&mut self, op: BatchOp) -> &mut Self {
        self.ops.push(op);
        self
    }

    /// Adds a read.
    pub fn read(&mut self, vaddr: VirtAddr, len: u64) -> &mut Self {
        self.push(BatchOp::Read { vaddr, len })
    }

    /// Adds a write.
    pub fn write(&mut self, vaddr: VirtAddr, data: impl Into<Vec<u8>>) -> &mut Self {
        self.push(BatchOp::Write {
            vaddr,
            data: data.into(),
            persist: false,
        })
    }

    /// Adds a durable write.
    pub fn write_persist(&mut self, vaddr: VirtAddr, data: impl Into<Vec<u8>>) -> &mut Self {
        self.push(BatchOp::Write {
            vaddr,
            data: data.into(),
            persist: true,
        })
    }

    /// Adds a fetch-and-add.
    pub fn fetch_add(&mut self, vaddr: VirtAddr, delta: u64) -> &mut Self {
        self.push(BatchOp::FetchAdd { vaddr, delta })
    }

    /// Operations in the batch.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

impl Pool {
    /// Connects `client` with default options (blocking).
    pub fn connect(topology: Topology, client: impl Into<ClientId>) -> Result<Self, OpenError> {
        AsyncPool::builder(topology, client).connect()
    }

    /// A builder with options.
    pub fn builder(topology: Topology, client: impl Into<ClientId>) -> PoolBuilder {
        AsyncPool::builder(topology, client)
    }

    /// Runs `future` (for example an [`Allocator`](crate::Allocator) call)
    /// on the pool's runtime and waits for it.
    pub fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// The async handle, sharing this pool's connections.
    pub fn handle(&self) -> &AsyncPool {
        &self.pool
    }

    /// Reads `len` bytes at `vaddr`.
    pub fn read(&self, vaddr: VirtAddr, len: u64) -> Result<Vec<u8>, PoolError> {
        self.runtime.block_on(self.pool.read(vaddr, len))
    }

    /// Writes `data` at `vaddr`.
    pub fn write(&self, vaddr: VirtAddr, data: &[u8]) -> Result<(), PoolError> {
        self.runtime.block_on(self.pool.write(vaddr, data))
    }

    /// Writes `data` at `vaddr`, returning once durable.
    pub fn write_persist(&self, vaddr: VirtAddr, data: &[u8]) -> Result<(), PoolError> {
        self.runtime.block_on(self.pool.write_persist(vaddr, data))
    }

    /// Makes `len` bytes at `vaddr` durable.
    pub fn flush(&self, vaddr: VirtAddr, len: u64) -> Result<(), PoolError> {
        self.runtime.block_on(self.pool.flush(vaddr, len))
    }

    /// Compare-and-swap; returns the old value.
    pub fn compare_and_swap(&self, vaddr: VirtAddr, old: u64, new: u64) -> Result<u64, PoolError> {
        self.runtime
            .block_on(self.pool.compare_and_swap(vaddr, old, new))
    }

    /// Fetch-and-add; returns the old value.
    pub fn fetch_add(&self, vaddr: VirtAddr, delta: u64) -> Result<u64, PoolError> {
        self.runtime.block_on(self.pool.fetch_add(vaddr, delta))
    }

    /// Atomic 8-byte store.
    pub fn atomic_write(&self, vaddr: VirtAddr, value: u64) -> Result<(), PoolError> {
        self.runtime.block_on(self.pool.atomic_write(vaddr, value))
    }

    /// Waits for everything issued before it.
    pub fn fence(&self) {
        self.runtime.block_on(self.pool.fence());
    }

    /// Runs a batch and waits once.
    pub fn submit(&self, batch: Batch) -> Vec<Result<Completion, PoolError>> {
        self.runtime.block_on(self.pool.submit(batch))
    }

    /// Every path and how it is doing.
    pub fn paths(&self) -> Vec<PathStatus> {
        self.pool.paths()
    }

    /// The client's counters.
    pub fn stats(&self) -> StatsSnapshot {
        self.pool.stats()
    }

    /// The virtual range of every region.
    pub fn regions(&self) -> Vec<(String, VirtAddr, u64)> {
        self.pool.regions()
    }

    /// The layout in use.
    pub fn layout(&self) -> &Layout {
        self.pool.layout()
    }
}

/// The servers by index, for status displays.
pub fn server_names(layout: &Layout) -> HashMap<u16, String> {
    layout
        .entries()
        .iter()
        .map(|e| (e.server_index, e.server.to_string()))
        .collect()
}

/// The first sequence number of a new exactly-once session: a random
/// session number in the upper 32 bits (never 0 or all ones), the count from
/// 0 below. Each process (and each RDMA queue pair) numbers its atomics in
/// its own session, so processes sharing an exactly-once identity, or a
/// restarted one, never make each other's atomics stale on the server.
fn new_session() -> u64 {
    let mut bytes = [0u8; 4];
    if getrandom::fill(&mut bytes).is_err() {
        // No OS randomness: the clock still separates restarts.
        let now = SystemTime::now().duration_since(UNIX_EPOCH);
        bytes = now
            .map_or(1, |d| d.subsec_nanos() ^ d.as_secs() as u32)
            .to_le_bytes();
    }
    let session = u32::from_le_bytes(bytes).clamp(1, u32::MAX - 1);
    u64::from(session) << 32
}
