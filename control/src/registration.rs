//! The control plane from a daemon's side, without async code of its own:
//! read the map at start, and keep the daemon's liveness record in etcd
//! from a thread of its own.

use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use topology::Topology;

use crate::credentials::Credentials;
use crate::endpoints::Endpoints;
use crate::error::ControlError;
use crate::member::Member;
use crate::plane::ControlPlane;
use crate::watch::{MapVersion, MapWatch, WatchObserver};

/// The lease's time to live: how long a dead daemon's record outlives it.
pub const LEASE_TTL_SECS: i64 = 5;
/// The longest wait between two attempts to reach etcd again.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A runtime whose one worker thread runs the lease's keep-alive task
/// while the caller's thread only looks at it.
fn runtime() -> Result<tokio::runtime::Runtime, ControlError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("etcd-client")
        .enable_all()
        .build()
        .map_err(|source| ControlError::Runtime { source })
}

/// The pool's map as etcd holds it now, loaded and validated, with its
/// epoch and revision; for a daemon starting on the control plane (as the
/// etcd user of `credentials` when given).
pub fn load_map(
    endpoints: &Endpoints,
    pool: &str,
    credentials: Option<&Credentials>,
) -> Result<(Topology, MapVersion), ControlError> {
    runtime()?.block_on(async {
        let mut plane = ControlPlane::connect(endpoints, pool, credentials).await?;
        let map = plane.read_map().await?;
        let topology = map.map.topology_at(&plane.keys().map())?;
        let version = MapVersion {
            epoch: map.map.epoch,
            revision: map.revision,
        };
        Ok((topology, version))
    })
}

/// A daemon's liveness record, kept alive by a thread: registered before
/// [`Registration::start`] returns (so a daemon that cannot reach etcd
/// fails at start, naming the endpoints), registered again under a new
/// lease whenever the old one is lost (etcd down, then back), with one log
/// line when it is lost and one when it is back, never one per attempt.
/// Dropping it revokes the lease, so the record goes at once.
#[derive(Debug)]
pub struct Registration {
    /// New epochs for the record; dropping it stops the thread.
    epochs: Option<mpsc::Sender<u64>>,
    thread: Option<JoinHandle<()>>,
}

impl Registration {
    /// Registers `member` in pool `pool` (as the etcd user of
    /// `credentials` when given) and starts keeping it alive.
    pub fn start(
        endpoints: Endpoints,
        pool: String,
        credentials: Option<Credentials>,
        member: Member,
    ) -> Result<Self, ControlError> {
        let (epochs, stopped) = mpsc::channel::<u64>();
        let (first, first_done) = mpsc::channel::<Result<(), ControlError>>();
        // The thread logs under the daemon's span (its name and id).
        let span = tracing::Span::current();
        let thread = std::thread::Builder::new()
            .name("etcd-liveness".to_owned())
            .spawn(move || {
                let access = (&endpoints, pool.as_str(), credentials.as_ref());
                span.in_scope(|| keep_registered(access, member, &stopped, first));
            })
            .map_err(|source| ControlError::Runtime { source })?;
        match first_done.recv() {
            Ok(Ok(())) => Ok(Self {
                epochs: Some(epochs),
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(ControlError::Runtime {
                source: std::io::Error::other("the liveness thread ended before registering"),
            }),
        }
    }
}

impl Registration {
    /// Records that the daemon now runs map epoch `epoch` (written to its
    /// record by the liveness thread, and again after any re-registration).
    pub fn set_epoch(&self, epoch: u64) {
        if let Some(epochs) = &self.epochs {
            let _ = epochs.send(epoch);
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        drop(self.epochs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The liveness thread: register, watch the lease, re-register with
/// backoff after a loss, rewrite the record when the epoch changes, revoke
/// when told to stop (the sender dropped).
fn keep_registered(
    (endpoints, pool, credentials): (&Endpoints, &str, Option<&Credentials>),
    mut member: Member,
    stopped: &mpsc::Receiver<u64>,
    first: mpsc::Sender<Result<(), ControlError>>,
) {
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = first.send(Err(e));
            return;
        }
    };
    let register = |member: Member| async move {
        let mut plane = ControlPlane::connect(endpoints, pool, credentials).await?;
        plane.register(&member, LEASE_TTL_SECS).await
    };
    let mut liveness = match runtime.block_on(register(member.clone())) {
        Ok(liveness) => {
            let _ = first.send(Ok(()));
            liveness
        }
        Err(e) => {
            let _ = first.send(Err(e));
            return;
        }
    };
    let mut backoff = Duration::from_millis(250);
    loop {
        // Look at the lease four times a TTL; a new epoch is written at
        // once, the sender gone means stop.
        match stopped.recv_timeout(Duration::from_millis(250)) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(epoch) => {
                member.epoch = epoch;
                // Not written now (etcd away): the re-registration below
                // writes the new epoch.
                let _ = runtime.block_on(liveness.rewrite(&member));
            }
            Err(RecvTimeoutError::Disconnected) => {
                let _ = runtime.block_on(liveness.revoke());
                return;
            }
        }
        if liveness.is_alive() {
            continue;
        }
        tracing::warn!(
            "lost the liveness lease in etcd ({endpoints}); registering again as soon as etcd \
             answers (the data path is not affected)"
        );
        loop {
            match stopped.recv_timeout(backoff) {
                Err(RecvTimeoutError::Timeout) => {}
                Ok(epoch) => {
                    member.epoch = epoch;
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return,
            }
            if let Ok(again) = runtime.block_on(register(member.clone())) {
                liveness = again;
                backoff = Duration::from_millis(250);
                tracing::info!("registered in etcd again ({endpoints})");
                break;
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}

/// Where a daemon takes its map from: a topology file, or the pool's map
/// in etcd (`--etcd`), in which case it is also a member while it runs.
#[derive(Debug, Clone)]
pub enum MapSource {
    /// A topology file.
    File(std::path::PathBuf),
    /// The map of `pool` in etcd at `endpoints`.
    Etcd {
        /// etcd's client URLs.
        endpoints: Endpoints,
        /// The pool's name.
        pool: String,
        /// The daemon's etcd user, when etcd has authentication on.
        credentials: Option<Credentials>,
    },
}

/// Why a daemon's map could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum MapSourceError {
    /// The topology file.
    #[error(transparent)]
    File(#[from] topology::LoadError),
    /// etcd.
    #[error(transparent)]
    Etcd(#[from] ControlError),
}

impl MapSource {
    /// The source command-line flags name: etcd when `etcd` is given
    /// (as the user of the `credentials` file when given, which is read
    /// here), otherwise the file (the daemons' flags require one of them).
    pub fn from_flags(
        config: Option<std::path::PathBuf>,
        etcd: Option<Endpoints>,
        pool: &str,
        credentials: Option<&std::path::Path>,
    ) -> Result<Self, MapSourceError> {
        Ok(match (etcd, config) {
            (Some(endpoints), _) => MapSource::Etcd {
                endpoints,
                pool: pool.to_owned(),
                credentials: credentials
                    .map(Credentials::read)
                    .transpose()
                    .map_err(ControlError::from)?,
            },
            (None, file) => MapSource::File(file.unwrap_or_default()),
        })
    }

    /// The topology, and its version when it came from etcd; a map from
    /// etcd is validated here, a file is validated by the caller as before.
    pub fn load(&self) -> Result<(Topology, Option<MapVersion>), MapSourceError> {
        match self {
            MapSource::File(path) => Ok((Topology::load(path)?, None)),
            MapSource::Etcd {
                endpoints,
                pool,
                credentials,
            } => {
                let (topology, version) = load_map(endpoints, pool, credentials.as_ref())?;
                tracing::info!(
                    "map of pool {pool} at epoch {} from etcd ({endpoints})",
                    version.epoch
                );
                Ok((topology, Some(version)))
            }
        }
    }

    /// On etcd, follows the map from after `from` (what [`MapSource::load`]
    /// gave), re-reading it every `reread`; `None` for a file.
    pub fn watch(
        &self,
        from: Option<MapVersion>,
        reread: Duration,
        observer: Arc<dyn WatchObserver>,
    ) -> Result<Option<MapWatch>, ControlError> {
        match (self, from) {
            (
                MapSource::Etcd {
                    endpoints,
                    pool,
                    credentials,
                },
                Some(from),
            ) => MapWatch::start(
                endpoints.clone(),
                pool,
                credentials.clone(),
                from,
                reread,
                observer,
            )
            .map(Some),
            _ => Ok(None),
        }
    }

    /// On etcd, registers this process as `name` in `role`, reachable at
    /// `address`, running `epoch`; `None` for a file.
    pub fn register(
        &self,
        role: crate::member::Role,
        name: &str,
        address: &str,
        epoch: u64,
    ) -> Result<Option<Registration>, ControlError> {
        match self {
            MapSource::File(_) => Ok(None),
            MapSource::Etcd {
                endpoints,
                pool,
                credentials,
            } => {
                let member = Member::this_process(role, name, address, epoch);
                Registration::start(endpoints.clone(), pool.clone(), credentials.clone(), member)
                    .map(Some)
            }
        }
    }

    /// The topology file, when the map comes from one (what SIGHUP re-reads).
    pub fn file(&self) -> Option<&std::path::Path> {
        match self {
            MapSource::File(path) => Some(path),
            MapSource::Etcd { .. } => None,
        }
    }
}
