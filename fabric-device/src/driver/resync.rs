//! The driver's side of the owner's resyncs: a copy marked `syncing` (its
//! server is back) or `serving` (it is up to date) in etcd, one thread per
//! mark, when the device follows the map there, or at once with a
//! topology file; either way the core is told how it went.

use std::sync::mpsc;

use control::ReplicaState;
use control::copy_marks::{StateMarked, mark_copy_state};
use proto::RegionIndex;
use topology::{RegionId, ServerId};

use super::*;

/// A settled mark: the copy, its state, and whether the map now says it.
type Settled = (RegionIndex, ServerId, ReplicaState, bool);

/// The marks of `syncing` and `serving` the marker threads settled.
#[derive(Debug)]
pub(super) struct StateMarks {
    tx: mpsc::Sender<Settled>,
    rx: mpsc::Receiver<Settled>,
}

impl Default for StateMarks {
    fn default() -> Self {
        let (tx, rx) = mpsc::channel();
        Self { tx, rx }
    }
}

impl Device {
    /// Marks `region`'s copy on `server` with `state`: in etcd on a thread
    /// (the loop is woken when it is settled), or at once with a file.
    pub(super) fn mark_copy_state(
        &mut self,
        region: RegionIndex,
        region_id: RegionId,
        server: ServerId,
        state: ReplicaState,
        now: Instant,
    ) {
        let Some(marker) = &self.copy_marker else {
            self.core
                .copy_state_marked(region, &server, state, true, now);
            return;
        };
        let (endpoints, pool, credentials) = marker.endpoints();
        let (endpoints, pool, credentials) =
            (endpoints.clone(), pool.to_owned(), credentials.cloned());
        let done = marker.states.tx.clone();
        let waker = self.waker();
        let copy = server.clone();
        let spawned = std::thread::Builder::new()
            .name("copy-state-marker".into())
            .spawn(move || {
                let marked = mark_copy_state(
                    &endpoints,
                    &pool,
                    credentials.as_ref(),
                    region_id.as_str(),
                    server.as_str(),
                    state,
                );
                let written = match marked {
                    Ok(StateMarked::Written { epoch }) => {
                        info!(
                            "region {region_id}: copy on server {server} marked {state} in the \
                             map (epoch {epoch})"
                        );
                        true
                    }
                    Ok(StateMarked::Already) => true,
                    Err(e) => {
                        warn!(
                            "{}; the copy keeps its state here and the device tries again",
                            error_chain(&e)
                        );
                        false
                    }
                };
                let _ = done.send((region, server, state, written));
                let _ = waker.wake();
            });
        if let Err(e) = spawned {
            warn!("cannot start marking a copy {state}: {e}");
            let _ = marker.states.tx.send((region, copy, state, false));
            self.reports.mark();
        }
    }

    /// Hands the core the marks the marker threads settled.
    pub(super) fn confirm_state_marks(&mut self, now: Instant) {
        let Some(marker) = &self.copy_marker else {
            return;
        };
        let settled: Vec<Settled> = marker.states.rx.try_iter().collect();
        for (region, server, state, written) in settled {
            self.core
                .copy_state_marked(region, &server, state, written, now);
        }
    }
}
