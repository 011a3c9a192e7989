//! The exactly-once records a syncing copy missed (`missed`), carried by
//! its resync: each goes first, as the ATOMIC_WRITE the copy would have
//! had, on the copy's write link. The walk begins once every record is
//! acknowledged, so a record's word, older than the deciding copy's by
//! then, is compared and copied over like any other block, even when the
//! record went again after STALE_MAP behind later writes of that word.

use super::*;

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
        if let Some(sync) = self.sync_mut(id) {
            sync.records = records;
            sync.records_out = count;
        }
        for index in 0..count {
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

    /// A record of resync `id` is acknowledged; with the last, the records
    /// are let go.
    pub(super) fn record_carried(&mut self, id: u64) {
        if let Some(sync) = self.sync_mut(id) {
            sync.records_out = sync.records_out.saturating_sub(1);
            if sync.records_out == 0 {
                sync.records = Vec::new();
            }
        }
    }
}
