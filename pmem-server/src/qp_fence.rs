//! Epoch-bound queue pairs: the RDMA side of fencing a deposed owner.
//!
//! A fabric device's RDMA requests reach a region's memory without this
//! process, so the epoch check that refuses a stale connection's requests
//! (`exec::fencing`) never sees them. Instead every queue pair is bound to
//! the connection that set it up, and through it to the map epoch that
//! connection said (MAP_EPOCH, or the epoch in the QP_CONNECT itself):
//!
//! - a QP_CONNECT of a connection older than the newest epoch this server
//!   fenced at, or than the epoch it runs, is refused STALE_MAP (no queue
//!   pair is created); a connection that says such an epoch after it set
//!   one up loses it;
//! - when the map the server applies gives a replicated region it holds to
//!   another owner (a takeover), every queue pair of a connection that said
//!   an older epoch, and every queue pair of the deposed owner's own
//!   connections (known with `--secrets`), is destroyed *before* the server
//!   runs that epoch, hence before it confirms the epoch to the new owner,
//!   which sends nothing until every copy's server did. Whatever the old
//!   owner posts from then on, or still has in flight, lands nowhere: its
//!   RNIC retries and fails the work requests, which breaks its link.
//!
//! A connection that said no epoch (a device on a topology file) is
//! unfenced, as in `proto::fence`; a topology file has no takeovers.
//! Epochs that change nothing of ownership (a copy marked `offline`,
//! `syncing`, `serving`) close no queue pair: the old owner is the owner.
//!
//! Creating a queue pair and sweeping them hold the same lock, so a
//! QP_CONNECT judged before a fence cannot add a queue pair after it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use telemetry::Gauge;

/// A queue pair as the fence holds it; dropping it destroys it.
pub(crate) type HeldQp = Box<dyn Send>;

/// Why a QP_CONNECT was not answered with a queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The connection runs an older map than `ours`: STALE_MAP.
    Stale {
        /// The epoch the server fences at (the STALE_MAP's value).
        ours: u64,
    },
    /// The RNIC could not set the queue pair up.
    Failed(proto::Status),
}

/// The queue pairs of every connection, and the epoch they are fenced at.
pub(crate) struct QpFence {
    state: Mutex<Fenced>,
    /// `pmem_server_queue_pairs`.
    gauge: Arc<Gauge>,
}

impl std::fmt::Debug for QpFence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("QpFence")
            .field("fenced_at", &state.fenced_at)
            .field("connections", &state.conns.len())
            .finish()
    }
}

#[derive(Default)]
struct Fenced {
    /// The newest epoch at which ownership changed (0: never).
    fenced_at: u64,
    next_id: u64,
    conns: HashMap<u64, ConnQps>,
}

/// One connection's queue pairs and what it said.
#[derive(Default)]
struct ConnQps {
    /// The epoch the connection said; `None`: unfenced.
    said: Option<u64>,
    /// The fabric device proven on it (with `--secrets`).
    device: Option<String>,
    qps: Vec<HeldQp>,
}

/// One connection's place in the fence; its queue pairs are destroyed
/// when it is dropped (the connection ended).
pub(crate) struct Binding {
    fence: Arc<QpFence>,
    id: u64,
}

impl QpFence {
    /// An empty fence counting its queue pairs in `gauge`.
    pub(crate) fn new(gauge: Arc<Gauge>) -> Self {
        QpFence {
            state: Mutex::new(Fenced::default()),
            gauge,
        }
    }

    /// A new connection's binding, with no queue pair yet.
    pub(crate) fn bind(self: &Arc<Self>) -> Binding {
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        state.conns.insert(id, ConnQps::default());
        Binding {
            fence: Arc::clone(self),
            id,
        }
    }

    /// The newest epoch at which a change of ownership fenced queue pairs.
    #[cfg(test)]
    pub(crate) fn fenced_at(&self) -> u64 {
        self.lock().fenced_at
    }

    /// The map at `epoch` gave regions of this server to new owners,
    /// deposing `deposed`: destroys the queue pairs of every connection at
    /// an older epoch and of every connection of a deposed device. Returns
    /// how many were destroyed.
    pub(crate) fn fence(&self, epoch: u64, deposed: &[String]) -> usize {
        let mut state = self.lock();
        state.fenced_at = state.fenced_at.max(epoch);
        let mut closed = 0;
        for conn in state.conns.values_mut() {
            let behind = conn.said.is_some_and(|said| said < epoch);
            let deposed = conn
                .device
                .as_ref()
                .is_some_and(|d| deposed.iter().any(|x| x == d));
            if behind || deposed {
                closed += conn.qps.len();
                conn.qps.clear();
            }
        }
        drop(state);
        self.gauge.sub(closed as i64);
        closed
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Fenced> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Binding {
    /// The connection said `said` (MAP_EPOCH; `None`: it follows no map).
    /// An epoch older than the fence's destroys the connection's queue
    /// pairs, as the fence would have: a device that set one up before it
    /// said its epoch (a QP_CONNECT without one) keeps nothing.
    pub(crate) fn said(&self, said: Option<u64>) {
        let mut state = self.fence.lock();
        let fenced_at = state.fenced_at;
        let Some(conn) = state.conns.get_mut(&self.id) else {
            return;
        };
        conn.said = said;
        if said.is_some_and(|s| s < fenced_at) {
            let closed = conn.qps.len();
            conn.qps.clear();
            drop(state);
            self.fence.gauge.sub(closed as i64);
        }
    }

    /// A QP_CONNECT of this connection, from `device` (with `--secrets`),
    /// saying `epoch` (its own, or else the connection's), while the server
    /// runs `running`: refused STALE_MAP when older than that or than the
    /// fence; otherwise `make` sets the queue pair up, under the fence's
    /// lock, and it is kept until the connection ends or is fenced.
    pub(crate) fn admit<R>(
        &self,
        device: Option<&str>,
        epoch: Option<u64>,
        running: u64,
        make: impl FnOnce() -> Result<(HeldQp, R), proto::Status>,
    ) -> Result<R, Refusal> {
        let mut state = self.fence.lock();
        let ours = state.fenced_at.max(running);
        if epoch.is_some_and(|e| e > 0 && e < ours) {
            return Err(Refusal::Stale { ours });
        }
        let (qp, answer) = make().map_err(Refusal::Failed)?;
        let conn = state.conns.entry(self.id).or_default();
        if let Some(device) = device {
            conn.device = Some(device.to_owned());
        }
        conn.qps.push(qp);
        drop(state);
        self.fence.gauge.inc();
        Ok(answer)
    }

    /// How many queue pairs the connection holds.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.fence
            .lock()
            .conns
            .get(&self.id)
            .map_or(0, |c| c.qps.len())
    }
}

impl Drop for Binding {
    fn drop(&mut self) {
        let closed = self
            .fence
            .lock()
            .conns
            .remove(&self.id)
            .map_or(0, |c| c.qps.len());
        if closed > 0 {
            self.fence.gauge.sub(closed as i64);
            tracing::debug!("{closed} queue pairs closed with their connection");
        }
    }
}

#[cfg(test)]
mod tests;
