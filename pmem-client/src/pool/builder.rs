//! Building a pool: its tunables, the client's key folder, connecting.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use control::{Credentials, Endpoints};
use topology::{ClientId, Topology};

use crate::error::OpenError;
use crate::paths::PathConfig;
use crate::translate::Translator;

use super::server_cache::{NON_TEMPORAL_FROM, ServerCache};
use super::{AsyncPool, Pool};

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
    /// Whether COMPARE_SWAP, FETCH_ADD and ATOMIC_WRITE persist their word
    /// (and the exactly-once record) before they answer: durable when they
    /// return, and exactly once across a server's power cut too, for a
    /// persist on every atomic. Off by default: an atomic is durable only
    /// after a FLUSH of its word.
    pub persistent_atomics: bool,
    /// Whether writes ask their server for non-temporal stores, which
    /// bypass its CPU cache ([`ServerCache`]); a call may choose otherwise
    /// ([`AsyncPool::write_with_cache`]).
    pub server_cache: ServerCache,
    /// The write size, in bytes, from which [`ServerCache::Auto`] asks for
    /// non-temporal stores.
    pub non_temporal_from: u64,
}

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            paths: PathConfig::default(),
            connect_timeout: Duration::from_secs(2),
            queue_depth: 256,
            tlb_capacity: 65536,
            persistent_atomics: false,
            server_cache: ServerCache::Auto,
            non_temporal_from: NON_TEMPORAL_FROM,
        }
    }
}

/// Where a pool takes its map from.
#[derive(Debug)]
pub(super) enum Source {
    /// A topology, loaded by the caller; the pool never changes its layout.
    Topology(Topology),
    /// The pool's map in etcd, followed while the pool is open.
    Etcd {
        endpoints: Endpoints,
        pool: String,
        /// The etcd user's credentials; by default the file in
        /// `$PMEM_FABRIC_ETCD_CREDENTIALS`, if set.
        credentials: Option<Credentials>,
    },
}

/// Builds a pool connection with non-default options.
#[derive(Debug)]
pub struct PoolBuilder {
    pub(super) source: Source,
    pub(super) client: ClientId,
    pub(super) options: PoolOptions,
    pub(super) translator: Option<Arc<dyn Translator>>,
    pub(super) secrets: Option<PathBuf>,
}

/// The environment variable naming the folder of keys a pool proves its
/// client with, when the builder is not given one.
pub const SECRETS_ENV: &str = "PMEM_FABRIC_SECRETS";

/// The environment variable naming etcd's client URLs, as the daemons and
/// `pmemctl cluster` read it.
pub const ETCD_ENV: &str = "PMEM_FABRIC_ETCD";

impl PoolBuilder {
    /// Connects as the etcd user of `credentials` (when etcd has
    /// authentication on) instead of the file in
    /// `$PMEM_FABRIC_ETCD_CREDENTIALS`; ignored for a pool on a file.
    pub fn etcd_credentials(mut self, credentials: Credentials) -> Self {
        if let Source::Etcd {
            credentials: slot, ..
        } = &mut self.source
        {
            *slot = Some(credentials);
        }
        self
    }

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

    /// Makes every atomic durable before it answers (see
    /// [`PoolOptions::persistent_atomics`]).
    pub fn persistent_atomics(mut self, persistent: bool) -> Self {
        self.options.persistent_atomics = persistent;
        self
    }

    /// Whether writes ask their server to bypass its CPU cache (see
    /// [`PoolOptions::server_cache`]).
    pub fn server_cache(mut self, policy: ServerCache) -> Self {
        self.options.server_cache = policy;
        self
    }

    /// The write size from which [`ServerCache::Auto`] asks for
    /// non-temporal stores (see [`PoolOptions::non_temporal_from`]).
    pub fn non_temporal_from(mut self, bytes: u64) -> Self {
        self.options.non_temporal_from = bytes;
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
        Ok(Pool {
            runtime: Arc::new(runtime),
            pool,
        })
    }
}
