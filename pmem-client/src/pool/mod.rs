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
//!
//! - `builder`: [`PoolOptions`], [`PoolBuilder`], connecting;
//! - `async_api`: [`AsyncPool`]'s operations on virtual ranges, fences,
//!   status;
//! - `dispatch`: translation, pieces, path choice, attempts, failover and
//!   the prober;
//! - `batch`: [`Batch`]; `blocking`: [`Pool`], the blocking facade;
//! - `keys`: the region keys the devices gave, refreshed when a server
//!   refuses one (rotated);
//! - `server_cache`: [`ServerCache`], whether a write asks its server to
//!   bypass the server's CPU cache;
//! - `stats`, `in_flight`: what the pool counts and what `fence` waits for.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use proto::request::Operation;
use tokio::sync::{Notify, Semaphore};
use topology::{AccessKey, ClientId, Layout, MetaLayout, PmemAddr, RegionIndex};

use crate::error::Address;
use crate::link::PathLink;
use crate::paths::{PathId, PathTable};
use crate::translate::{Tlb, Translator};
use epoch::Epoch;

mod async_api;
mod batch;
mod blocking;
mod builder;
mod dispatch;
mod epoch;
mod follow;
mod in_flight;
mod keys;
mod server_cache;
mod stats;

pub use batch::{Batch, BatchOp, Completion};
pub use builder::{ETCD_ENV, PoolBuilder, PoolOptions, SECRETS_ENV};
use in_flight::InFlight;
pub use server_cache::{NON_TEMPORAL_FROM, ServerCache, UnknownServerCache};
pub use stats::{PathStatus, Stats, StatsSnapshot};

/// One path's current connection.
#[derive(Debug, Default)]
struct Slot {
    conn: Option<Arc<PathLink>>,
    /// Bumped on every (re)connect, so a stale connection's death is ignored.
    generation: u64,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Inner {
    /// The epoch the pool runs now.
    fn epoch(&self) -> Arc<Epoch> {
        Arc::clone(&self.epoch.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// `path`'s slot (`None` for a path of a newer epoch than the one
    /// looked at).
    fn slot(&self, path: PathId) -> Option<Arc<Mutex<Slot>>> {
        self.epoch().slots.get(path.0).cloned()
    }

    /// `path`'s current connection, if any.
    fn conn(&self, path: PathId) -> Option<Arc<PathLink>> {
        self.slot(path).and_then(|slot| lock(&slot).conn.clone())
    }
}

#[derive(Debug)]
struct Inner {
    client: ClientId,
    /// The client's position in the topology.
    client_index: u16,
    pool_name: String,
    /// Everything that depends on the map's epoch, swapped as one.
    epoch: RwLock<Arc<Epoch>>,
    /// The caller's translator, kept across epochs.
    custom_translator: Option<Arc<dyn Translator>>,
    /// Where the map comes from when the pool follows it in etcd.
    etcd: Option<control::MapSource>,
    /// Held while a new epoch is applied, so two never interleave.
    applying: tokio::sync::Mutex<()>,
    /// Woken whenever a new epoch is applied.
    applied: Notify,
    /// Maps a request read from etcd itself, for the follower to apply.
    direct: Option<follow::DirectMaps>,
    /// The client's key, proven to every device (with secrets).
    key: Option<proto::auth::Key>,
    tlb: Tlb,
    table: Mutex<PathTable>,
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
    runtime: Arc<tokio::runtime::Runtime>,
    pool: AsyncPool,
}

/// One PMEM piece of a virtual range (or a request addressed by PMEM
/// address only).
#[derive(Debug, Clone, Copy)]
struct Piece {
    /// Where it is aimed, for errors and to refresh a stale translation.
    at: Address,
    pmem: PmemAddr,
    len: u64,
    key: AccessKey,
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
    /// Ask the server for non-temporal stores (writes only).
    pub(crate) non_temporal: bool,
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
            non_temporal: false,
        }
    }
}

/// Most bytes one request moves.
const MAX_PIECE: u64 = proto::frame::MAX_DATA_LEN as u64;

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
