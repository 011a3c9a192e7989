//! The replication work of a loop turn that no answer or request brings:
//! resyncs moved on (a returned copy marked `syncing`, a resync started, a
//! paced block read) and MAP_EPOCH said again to servers a fenced region
//! or a part refused STALE_MAP waits for. It runs only when due: after an
//! event that may have given it work ([`Forwarder::replication_changed`]),
//! at the next deadline it keeps (the bucket refilled, a retry, a resend,
//! a give-up), while a resync waits on something no event marks, and at
//! least every [`crate::housekeeping::FALLBACK`].

use super::*;

impl Forwarder {
    /// One loop turn's replication housekeeping, when it is due: resyncs
    /// moved on ([`Forwarder::run_resyncs`]) and what to say again
    /// ([`Forwarder::fence_resends`]), which it returns.
    pub fn replication_turn(&mut self, now: Instant) -> Vec<(LinkId, Vec<u8>)> {
        if !self.replication.housekeeping.due(now) {
            return Vec::new();
        }
        self.run_resyncs(now);
        let said = self.fence_resends(now);
        let next = [self.resync_wake(), self.fence_poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        self.replication.housekeeping.ran(now, next);
        if self.resync_waits_unmarked() {
            self.replication.housekeeping.mark();
        }
        said
    }

    /// Something the housekeeping depends on changed (a copy's state, a
    /// link, the map or its epoch, a resync's or a STALE_MAP part's
    /// progress): it runs at the next turn.
    pub(in crate::forward) fn replication_changed(&mut self) {
        self.replication.housekeeping.mark();
    }

    /// When the housekeeping next has work without an event, as of its
    /// last run (for tests).
    #[cfg(test)]
    pub(crate) fn housekeeping_next(&self) -> Option<Instant> {
        self.replication.housekeeping.next()
    }

    /// Sets the state of `region`'s copy on `server` without telling the
    /// housekeeping (a test of its fallback).
    #[cfg(test)]
    pub(crate) fn set_copy_state_unmarked(
        &mut self,
        region: u32,
        server: &str,
        state: ReplicaState,
    ) {
        if let Some(copy) = self
            .region_state_mut(region)
            .and_then(|s| s.copies.iter_mut().find(|c| c.server.as_str() == server))
        {
            copy.state = state;
        }
    }
}
