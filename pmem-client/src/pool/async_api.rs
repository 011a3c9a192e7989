//! The async API: reads, writes, atomics, flushes and batches on virtual
//! ranges, fences, status.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use control::Endpoints;
use futures::future::join_all;
use proto::request::Operation;
use tokio::sync::{Notify, Semaphore};
use topology::{AccessKey, ClientId, Layout, PmemAddr, RnicTransport, Topology, VirtAddr};

use crate::conn;
use crate::error::{OpenError, PoolError};
use crate::paths::{Failure, PathHealth, PathId, PathTable};
use crate::translate::{Tlb, Translation};

use super::builder::Source;
use super::dispatch::probe_loop;
use super::epoch::Epoch;
use super::follow;
use super::{
    AsyncPool, Batch, BatchOp, Completion, ETCD_ENV, InFlight, Inner, MAX_PIECE, PathStatus,
    PoolBuilder, PoolOptions, SECRETS_ENV, ServerCache, Spec, Stats, StatsSnapshot, lock,
    new_session,
};

impl AsyncPool {
    /// A builder for a connection of `client` to the pool `topology` describes.
    pub fn builder(topology: Topology, client: impl Into<ClientId>) -> PoolBuilder {
        Self::builder_from(Source::Topology(topology), client.into())
    }

    /// A builder for a connection of `client` to pool `pool`, whose map
    /// it takes from etcd at `endpoints` and follows while it is open: a
    /// new epoch adds the regions, paths and keys it brings and retires
    /// what it withdraws, without dropping requests in flight. The etcd
    /// user is the one of the file in `$PMEM_FABRIC_ETCD_CREDENTIALS`, if
    /// set, unless [`PoolBuilder::etcd_credentials`] names one.
    pub fn builder_on_etcd(
        endpoints: Endpoints,
        pool: &str,
        client: impl Into<ClientId>,
    ) -> PoolBuilder {
        let source = Source::Etcd {
            endpoints,
            pool: pool.to_owned(),
            credentials: None,
        };
        Self::builder_from(source, client.into())
    }

    /// [`builder_on_etcd`](Self::builder_on_etcd) with the endpoints in
    /// `$PMEM_FABRIC_ETCD`, as the daemons and `pmemctl` read them.
    pub fn builder_on_etcd_from_env(
        pool: &str,
        client: impl Into<ClientId>,
    ) -> Result<PoolBuilder, OpenError> {
        let urls = std::env::var(ETCD_ENV).map_err(|_| OpenError::NoEtcd)?;
        Ok(Self::builder_on_etcd(
            Endpoints::parse(&urls)?,
            pool,
            client,
        ))
    }

    fn builder_from(source: Source, client: ClientId) -> PoolBuilder {
        PoolBuilder {
            source,
            client,
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

    pub(super) async fn open(builder: PoolBuilder) -> Result<Self, OpenError> {
        let PoolBuilder {
            source,
            client,
            options,
            translator,
            secrets,
        } = builder;
        let (topology, replica_sets, etcd, version) = match source {
            Source::Topology(topology) => (topology, None, None, None),
            Source::Etcd {
                endpoints,
                pool,
                credentials,
            } => {
                let (read, etcd, version) =
                    follow::read_map_from(endpoints, pool, credentials).await?;
                (
                    read.topology,
                    Some(read.replica_sets),
                    Some(etcd),
                    Some(version),
                )
            }
        };
        topology.validate()?;
        let key = match &secrets {
            Some(dir) => Some(proto::auth::Key::new(topology::secrets::read_key(
                dir,
                topology::secrets::Principal::Client(client.as_str()),
            )?)),
            None => None,
        };
        let layout = Layout::new(&topology)?;
        let mut table = PathTable::new(&topology, &layout, &client, options.paths)?;
        // On etcd, the owners of replicated regions are the map's (a file's
        // are its topology's turn order, which the table starts with).
        if let Some(records) = &replica_sets {
            table.set_owners(records);
        }
        let extent = layout.extent_size();
        let epoch = Epoch::first(
            version.map_or(0, |v| v.epoch),
            layout,
            translator.as_ref(),
            table.paths().len(),
        );
        let start_seq = new_session();
        let client_index = topology
            .clients
            .iter()
            .position(|c| c.id == client)
            .and_then(|i| u16::try_from(i).ok())
            .unwrap_or(u16::MAX);
        let following = etcd.is_some();
        let (direct, direct_maps) = tokio::sync::mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            direct: following.then_some(direct),
            client_index,
            pool_name: topology.pool.name.clone(),
            tlb: Tlb::new(extent, options.tlb_capacity),
            epoch: RwLock::new(Arc::new(epoch)),
            custom_translator: translator,
            etcd,
            applying: tokio::sync::Mutex::new(()),
            applied: Notify::new(),
            key,
            client,
            table: Mutex::new(table),
            seq: AtomicU64::new(start_seq),
            depth: Semaphore::new(options.queue_depth.max(1)),
            in_flight: InFlight::default(),
            prober: Arc::new(Notify::new()),
            restored: Notify::new(),
            stats: Stats::default(),
            options,
        });
        // The map is followed from the start: a device that runs a newer
        // epoch than the one read above brings the pool up to it while
        // the paths connect (`ensure_epoch` hands the map to the follower).
        if let (Some(source), Some(version)) = (&inner.etcd, version) {
            follow::start(&inner, source, version, direct_maps)?;
        }
        let paths: Vec<PathId> = lock(&inner.table).paths().iter().map(|p| p.id).collect();
        let mut failures = connect_paths(&inner, &paths, following).await?;
        let behind = |failures: &[(String, conn::ConnectError)]| {
            failures
                .iter()
                .any(|(_, e)| matches!(e, conn::ConnectError::NewerMap { .. }))
        };
        if following && failures.len() == paths.len() && behind(&failures) {
            // The map moved on while the pool opened, and connecting caught
            // the pool up: once more, at the devices' epoch.
            failures = connect_paths(&inner, &paths, following).await?;
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

    /// Reads `len` bytes at `vaddr`: what every write and atomic
    /// acknowledged before the read was sent left there, durable or not. A
    /// read that overlaps a write in flight may see a mix of old and new
    /// bytes, as with one-sided RDMA.
    pub async fn read(&self, vaddr: VirtAddr, len: u64) -> Result<Vec<u8>, PoolError> {
        let too_long = || PoolError::OutOfBounds {
            at: vaddr.into(),
            len,
        };
        let mut out = Vec::new();
        let bytes = usize::try_from(len).map_err(|_| too_long())?;
        out.try_reserve_exact(bytes).map_err(|_| too_long())?;
        out.resize(bytes, 0);
        self.read_into(vaddr, &mut out).await?;
        Ok(out)
    }

    /// Reads `buf.len()` bytes at `vaddr` into `buf` (no allocation); the
    /// same view of memory as [`read`](Self::read). On an error `buf` may
    /// hold part of the range.
    pub async fn read_into(&self, vaddr: VirtAddr, buf: &mut [u8]) -> Result<(), PoolError> {
        let _op = self.inner.in_flight.begin();
        let pieces = self.inner.plan(vaddr, buf.len() as u64).await?;
        let results = join_all(pieces.iter().map(|piece| {
            let length = piece.len as u32;
            self.inner
                .send_piece(*piece, Spec::plain(Operation::Read, length))
        }))
        .await;
        let mut rest = &mut buf[..];
        for (piece, result) in pieces.iter().zip(results) {
            let data = result?.data;
            let (here, after) = std::mem::take(&mut rest).split_at_mut(piece.len as usize);
            if data.len() != here.len() {
                return Err(PoolError::WrongLength {
                    at: piece.at,
                    asked: piece.len,
                    got: data.len(),
                });
            }
            here.copy_from_slice(&data);
            rest = after;
        }
        Ok(())
    }

    /// Reads the 8-byte little-endian word at `vaddr` with a plain READ (no
    /// alignment needed). Against atomics on the same word it is not an
    /// atomic load: use [`fetch_add`](Self::fetch_add) with 0 for that.
    pub async fn read_u64(&self, vaddr: VirtAddr) -> Result<u64, PoolError> {
        let mut word = [0u8; 8];
        self.read_into(vaddr, &mut word).await?;
        Ok(u64::from_le_bytes(word))
    }

    /// Writes `data` at `vaddr`. Acknowledged once the server has stored it:
    /// every later read sees it, but it is **not durable** (a power cut or a
    /// server crash may lose it) until a [`flush`](Self::flush) of the range
    /// sent after this returned. [`write_persist`](Self::write_persist) does
    /// both in one request. The server's CPU cache is treated as the pool's
    /// [`ServerCache`] policy says.
    pub async fn write(&self, vaddr: VirtAddr, data: &[u8]) -> Result<(), PoolError> {
        let cache = self.inner.options.server_cache;
        self.write_op(vaddr, data, Operation::Write, cache).await
    }

    /// [`write`](Self::write) with `cache` instead of the pool's policy:
    /// for instance [`ServerCache::NonTemporal`] for bulk data nobody reads
    /// back soon, or [`ServerCache::Cached`] for a large record that is.
    pub async fn write_with_cache(
        &self,
        vaddr: VirtAddr,
        data: &[u8],
        cache: ServerCache,
    ) -> Result<(), PoolError> {
        self.write_op(vaddr, data, Operation::Write, cache).await
    }

    /// Writes `value` as 8 little-endian bytes at `vaddr` with a plain WRITE
    /// (no alignment needed), durable only after a FLUSH as
    /// [`write`](Self::write). Not atomic against atomics on the same word:
    /// use [`atomic_write`](Self::atomic_write) for that.
    pub async fn write_u64(&self, vaddr: VirtAddr, value: u64) -> Result<(), PoolError> {
        self.write(vaddr, &value.to_le_bytes()).await
    }

    /// Writes `data` at `vaddr` and returns once it is durable (WRITE_PERSIST:
    /// the server stores and persists the range before it answers).
    pub async fn write_persist(&self, vaddr: VirtAddr, data: &[u8]) -> Result<(), PoolError> {
        let cache = self.inner.options.server_cache;
        self.write_op(vaddr, data, Operation::WritePersist, cache)
            .await
    }

    /// [`write_persist`](Self::write_persist) with `cache` instead of the
    /// pool's [`ServerCache`] policy.
    pub async fn write_persist_with_cache(
        &self,
        vaddr: VirtAddr,
        data: &[u8],
        cache: ServerCache,
    ) -> Result<(), PoolError> {
        self.write_op(vaddr, data, Operation::WritePersist, cache)
            .await
    }

    /// Writes `data` with `operation`, every piece asking for non-temporal
    /// stores when `cache` does for a write of the whole length.
    async fn write_op(
        &self,
        vaddr: VirtAddr,
        data: &[u8],
        operation: Operation,
        cache: ServerCache,
    ) -> Result<(), PoolError> {
        let _op = self.inner.in_flight.begin();
        let len = data.len() as u64;
        let non_temporal = cache.non_temporal(len, self.inner.options.non_temporal_from);
        let pieces = self.inner.plan(vaddr, len).await?;
        let mut offset = 0usize;
        let sends = pieces.iter().map(|piece| {
            let payload = &data[offset..offset + piece.len as usize];
            offset += piece.len as usize;
            let spec = Spec {
                payload,
                non_temporal,
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

    /// Makes `len` bytes at `vaddr` durable: whatever the range holds when
    /// the server runs the FLUSH (writes and atomics acknowledged before it
    /// was sent, and anyone else's that happen to be there) is persistent
    /// once this returns. A write still in flight when the FLUSH is sent
    /// (one in the same [`Batch`]) may or may not be covered.
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

    /// Compare-and-swap of the 8-byte word at `vaddr` (8-byte aligned), as
    /// std's `AtomicU64::compare_exchange`: `Ok(previous)` when the word
    /// held `current` and now holds `new`, `Err(actual)` with the value
    /// found when it did not and was left alone. Exactly once, even across
    /// failover. Atomic against the other atomics on the word; visible to
    /// every later read, but **not durable** until a
    /// [`flush`](Self::flush) of the word sent after this returned, unless
    /// the pool was built with
    /// [`persistent_atomics`](super::PoolBuilder::persistent_atomics)
    /// (then durable when it returns, as every atomic).
    pub async fn compare_and_swap(
        &self,
        vaddr: VirtAddr,
        current: u64,
        new: u64,
    ) -> Result<Result<u64, u64>, PoolError> {
        let old = self
            .atomic(vaddr, Operation::CompareSwap, new, current, true)
            .await?;
        Ok(if old == current { Ok(old) } else { Err(old) })
    }

    /// Adds `delta` (wrapping) to the 8-byte word at `vaddr` (8-byte
    /// aligned); returns the old value. Exactly once, even across failover.
    /// **Not durable** until a [`flush`](Self::flush) of the word sent after
    /// this returned (unless `persistent_atomics`).
    pub async fn fetch_add(&self, vaddr: VirtAddr, delta: u64) -> Result<u64, PoolError> {
        self.atomic(vaddr, Operation::FetchAdd, delta, 0, true)
            .await
    }

    /// Stores `value` into the 8-byte word at `vaddr` (8-byte aligned)
    /// atomically: a concurrent atomic or read of the word sees the old or
    /// the new value, never a mix. Exactly once, like the other atomics: a
    /// store retried after a failover is not applied again after another
    /// client's later store (which would bring the old value back). **Not
    /// durable** until a [`flush`](Self::flush) of the word sent after this
    /// returned (unless `persistent_atomics`).
    pub async fn atomic_write(&self, vaddr: VirtAddr, value: u64) -> Result<(), PoolError> {
        self.atomic(vaddr, Operation::AtomicWrite, value, 0, true)
            .await
            .map(drop)
    }

    pub(super) async fn atomic(
        &self,
        vaddr: VirtAddr,
        operation: Operation,
        operand: u64,
        compare: u64,
        exactly_once: bool,
    ) -> Result<u64, PoolError> {
        if !vaddr.get().is_multiple_of(8) {
            return Err(PoolError::Misaligned { at: vaddr.into() });
        }
        let _op = self.inner.in_flight.begin();
        let pieces = self.inner.plan(vaddr, 8).await?;
        let [piece] = pieces[..] else {
            return Err(PoolError::Misaligned { at: vaddr.into() });
        };
        let spec = Spec {
            operand,
            compare,
            exactly_once,
            persist: self.inner.options.persistent_atomics,
            ..Spec::plain(operation, 8)
        };
        self.inner.send_piece(piece, spec).await.map(|r| r.value)
    }

    /// Waits until every operation issued before it has completed.
    pub async fn fence(&self) {
        self.inner.in_flight.fence().await;
    }

    /// Runs every operation of `batch` concurrently and waits once; results
    /// come back in the batch's order. The operations are not ordered among
    /// themselves: a FLUSH does not wait for a WRITE of the same batch.
    pub async fn submit(&self, batch: Batch) -> Vec<Result<Completion, PoolError>> {
        join_all(batch.ops.into_iter().map(|op| self.run_batch_op(op))).await
    }

    pub(super) async fn run_batch_op(&self, op: BatchOp) -> Result<Completion, PoolError> {
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
            BatchOp::CompareAndSwap {
                vaddr,
                current,
                new,
            } => self
                .compare_and_swap(vaddr, current, new)
                .await
                .map(Completion::CompareAndSwap),
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
        key: AccessKey,
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
        key: AccessKey,
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
        key: AccessKey,
        operation: Operation,
        operand: u64,
        compare: u64,
    ) -> Result<u64, PoolError> {
        let spec = Spec {
            operand,
            compare,
            persist: true,
            exactly_once: true,
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

    /// The virtual range of every region in the static space (region id,
    /// start, length), in virtual order. On a pool that follows the map,
    /// a region keeps its range across epochs and new regions come after
    /// every range given before.
    pub fn regions(&self) -> Vec<(String, VirtAddr, u64)> {
        let epoch = self.inner.epoch();
        epoch
            .static_space
            .region_ranges()
            .filter_map(|(region, start, len)| {
                let entry = epoch.layout.entry(region)?;
                Some((entry.region_id.to_string(), start, len))
            })
            .collect()
    }

    /// The layout the pool uses now. A pool that follows the cluster map
    /// may move to a newer layout later: hold the returned one for a
    /// consistent view, ask again for the current one.
    pub fn layout(&self) -> Arc<Layout> {
        Arc::clone(&self.inner.epoch().layout)
    }

    /// The epoch of the cluster map the pool runs (0: it reads a topology
    /// file and follows no map).
    pub fn map_epoch(&self) -> u64 {
        self.inner.epoch().number
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
                up: matches!(table.health(p.id), PathHealth::Up) && !table.is_retired(p.id),
                retired: table.is_retired(p.id),
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
            key_refreshes: s.key_refreshes.load(Ordering::Relaxed),
            map_epochs: s.map_epochs.load(Ordering::Relaxed),
            maps_refused: s.maps_refused.load(Ordering::Relaxed),
            stale_newer: s.stale_newer.load(Ordering::Relaxed),
            stale_behind: s.stale_behind.load(Ordering::Relaxed),
        }
    }
}

/// Connects each of `paths` of a pool being opened: the paths that could
/// not connect, with why (each reported down, so the prober tries it
/// again), or the refusal that stops the open.
async fn connect_paths(
    inner: &Arc<Inner>,
    paths: &[PathId],
    following: bool,
) -> Result<Vec<(String, conn::ConnectError)>, OpenError> {
    let results = join_all(paths.iter().map(|&p| inner.connect_path(p))).await;
    let mut failures = Vec::new();
    let now = Instant::now();
    for (&path, result) in paths.iter().zip(results) {
        match result {
            Ok(()) => {}
            // A device on another epoch than the client (or, unfenced,
            // on another layout) catches up, or the client does: the
            // path is probed again.
            Err(e @ conn::ConnectError::DigestMismatch { .. }) if !following => {
                return Err(OpenError::Refused {
                    client: inner.client.to_string(),
                    path: inner.path_name(path),
                    source: Box::new(e),
                });
            }
            Err(
                e @ (conn::ConnectError::Refused { .. }
                | conn::ConnectError::AuthRequired { .. }
                | conn::ConnectError::NoAuth { .. }),
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
    Ok(failures)
}
