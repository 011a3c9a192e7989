//! The control plane from a daemon's side, without async code of its own:
//! read the map at start, and keep the daemon's liveness record in etcd
//! from a thread of its own.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use topology::Topology;

use crate::endpoints::Endpoints;
use crate::error::ControlError;
use crate::member::Member;
use crate::plane::ControlPlane;

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
/// epoch; for a daemon starting on the control plane.
pub fn load_map(endpoints: &Endpoints, pool: &str) -> Result<(Topology, u64), ControlError> {
    runtime()?.block_on(async {
        let mut plane = ControlPlane::connect(endpoints, pool).await?;
        let map = plane.read_map().await?;
        let topology = map.map.topology_at(&plane.keys().map())?;
        Ok((topology, map.map.epoch))
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
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Registration {
    /// Registers `member` in pool `pool` and starts keeping it alive.
    pub fn start(endpoints: Endpoints, pool: String, member: Member) -> Result<Self, ControlError> {
        let (stop, stopped) = mpsc::channel::<()>();
        let (first, first_done) = mpsc::channel::<Result<(), ControlError>>();
        let thread = std::thread::Builder::new()
            .name("etcd-liveness".to_owned())
            .spawn(move || keep_registered(&endpoints, &pool, &member, &stopped, first))
            .map_err(|source| ControlError::Runtime { source })?;
        match first_done.recv() {
            Ok(Ok(())) => Ok(Self {
                stop: Some(stop),
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

impl Drop for Registration {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The liveness thread: register, watch the lease, re-register with
/// backoff after a loss, revoke when told to stop.
fn keep_registered(
    endpoints: &Endpoints,
    pool: &str,
    member: &Member,
    stopped: &mpsc::Receiver<()>,
    first: mpsc::Sender<Result<(), ControlError>>,
) {
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = first.send(Err(e));
            return;
        }
    };
    let register = || async {
        let mut plane = ControlPlane::connect(endpoints, pool).await?;
        plane.register(member, LEASE_TTL_SECS).await
    };
    let mut liveness = match runtime.block_on(register()) {
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
        // Look at the lease four times a TTL; any message, or the sender
        // gone, means stop.
        match stopped.recv_timeout(Duration::from_millis(250)) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
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
                Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
            }
            if let Ok(again) = runtime.block_on(register()) {
                liveness = again;
                backoff = Duration::from_millis(250);
                tracing::info!("registered in etcd again ({endpoints})");
                break;
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}
