//! Fencing by map epoch on the server: the epoch the server runs, and the
//! requests of a connection that said another one (MAP_EPOCH). A
//! connection at an older epoch has every request refused STALE_MAP; one
//! at a newer epoch has a request for a region this server does not serve
//! (or the map withdrew) refused STALE_MAP instead of UNMAPPED, and so
//! has one at an older epoch for a region a newer map withdrew. Refused
//! requests never reach the executor, so nothing runs and nothing enters
//! the exactly-once window. The rule is `proto::fence`'s; every STALE_MAP
//! carries the server's epoch.

use std::sync::atomic::Ordering;

use proto::fence::{self, ConnEpoch, Verdict};
use proto::request;
use proto::response::ResponseKind;
use proto::{Opcode, Status};

use super::{Executor, push_response};

impl Executor {
    /// The epoch of the cluster map the server runs (0: a topology file).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The server runs epoch `epoch` from now on; every connection's next
    /// request is judged against it.
    pub fn set_epoch(&self, epoch: u64) {
        self.epoch.store(epoch, Ordering::Release);
    }

    /// MAP_EPOCH: keeps what the peer said and answers with the server's
    /// epoch (STALE_MAP when the server's is newer).
    pub(super) fn map_epoch(&self, said: &mut ConnEpoch, epoch: u64, tag: u64, out: &mut Vec<u8>) {
        let ours = self.epoch();
        said.said(epoch);
        let status = said.acknowledgement(ours);
        out.extend_from_slice(&fence::epoch_reply(Opcode::MapEpoch, tag, status, ours));
    }

    /// How a request of a connection that said `said` is judged; `None`
    /// when it was refused STALE_MAP (answered in `out`).
    pub(super) fn fence(
        &self,
        said: ConnEpoch,
        req: &request::Repr<'_>,
        tag: u64,
        out: &mut Vec<u8>,
    ) -> Option<Verdict> {
        match said.verdict(self.epoch()) {
            Verdict::Stale => {
                self.stale_map(req, tag, out);
                None
            }
            verdict => Some(verdict),
        }
    }

    /// Whether a request of a connection judged `verdict` names a region
    /// this server's map lacks while the connection runs a newer one.
    pub(super) fn lacks_ahead(&self, verdict: Verdict, req: &request::Repr<'_>) -> bool {
        verdict == Verdict::ServeAhead && !matches!(self.locate(req.target), Some((_, _, false)))
    }

    /// Whether `req` names a region a map newer than the connection's
    /// withdrew from this server. The server withdraws a map's regions
    /// before it runs the map's epoch, so in between such a connection is
    /// not judged stale yet; its request was meant for the old placement
    /// and is refused STALE_MAP (the sender catches up and sends it where
    /// the region is now), not UNMAPPED, which would be final.
    pub(super) fn withdrawn_after(&self, said: ConnEpoch, req: &request::Repr<'_>) -> bool {
        said.get()
            .is_some_and(|said| self.withdrawn_by(req.target).is_some_and(|by| said < by))
    }

    /// Answers `req` STALE_MAP with the server's epoch, counted.
    pub(super) fn stale_map(&self, req: &request::Repr<'_>, tag: u64, out: &mut Vec<u8>) {
        self.metrics.stale_map.inc();
        self.metrics
            .record(req.operation, Status::StaleMap, std::time::Duration::ZERO);
        let kind = ResponseKind::answering(req.operation.opcode());
        push_response(out, tag, kind, Status::StaleMap, self.epoch(), 0);
    }
}

#[cfg(test)]
mod tests;
