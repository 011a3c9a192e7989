//! The exactly-once records a syncing copy missed (`missed`), carried by
//! its resync: each goes first, as the ATOMIC_WRITE the copy would have
//! had, on the copy's write link. The walk begins once every record is
//! acknowledged, so a record's word, older than the deciding copy's by
//! then, is compared and copied over like any other block, even when the
//! record went again after STALE_MAP behind later writes of that word.
//!
//! At most [`RECORDS_IN_FLIGHT`] records are on their way at once, the next
//! going as one is acknowledged: a copy back from an outage may have
//! missed hundreds, each a write of the server's exactly-once window, and
//! sent all at once they queued the application's writes to that copy
//! behind them on its link past the copy timeout, which took the copy out
//! again and started its resync over.

use super::*;

/// Records of one resync on their way to its syncing copy at most.
pub(in crate::forward) const RECORDS_IN_FLIGHT: usize = 16;

impl Forwarder {
    /// Sends resync `id`'s syncing copy every record kept for its region;
    /// returns how many went (none when its link went down: the resync
    /// stopped).
    pub(super) fn carry_records(&mut self, id: u64, now: Instant) -> usize {
        let Some(region) = self.sync_mut(id).map(|s| s.region) else {
            return 0;
        };
        let records = self.missed_records(region);
        let count = records.len();
        let first = count.min(RECORDS_IN_FLIGHT);
        if let Some(sync) = self.sync_mut(id) {
            sync.records = records;
            sync.records_out = count;
            sync.records_sent = first;
        }
        for index in 0..first {
            if !self.send_record(id, index, 0, now) {
                self.stop_resync(id, "the syncing copy's link went down", now);
                return 0;
            }
        }
        count
    }

    /// Sends record `index` of resync `id` to its syncing copy (refused
    /// STALE_MAP `stale_refusals` times before); false when it could not.
    pub(super) fn send_record(
        &mut self,
        id: u64,
        index: usize,
        stale_refusals: u32,
        now: Instant,
    ) -> bool {
        let Some(sync) = self.sync_mut(id) else {
            return false;
        };
        let (region, copy) = (sync.region, sync.copy);
        let Some(record) = sync.records.get(index).copied() else {
            return false;
        };
        let Some(key) = self.own_copy_key(region, copy) else {
            return false;
        };
        let ticket = ResyncTicket::new(id, ResyncPart::Record { index }, stale_refusals);
        let message = Message::Request(record.request(region, key));
        self.send_resync(region, copy, &message, Opcode::AtomicWrite, ticket, now)
    }

    /// A record of resync `id` is acknowledged: the next one not sent yet
    /// goes; with the last, the records are let go.
    pub(super) fn record_carried(&mut self, id: u64, now: Instant) {
        let Some(sync) = self.sync_mut(id) else {
            return;
        };
        sync.records_out = sync.records_out.saturating_sub(1);
        if sync.records_out == 0 {
            sync.records = Vec::new();
            return;
        }
        let next = sync.records_sent;
        if next >= sync.records.len() {
            return;
        }
        sync.records_sent += 1;
        if !self.send_record(id, next, 0, now) {
            self.stop_resync(id, "the syncing copy's link went down", now);
        }
    }
}
