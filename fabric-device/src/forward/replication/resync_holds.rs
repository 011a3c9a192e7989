//! Ranges a resync holds while it copies a block from the deciding copy to
//! a syncing one: from before the block is read until its write is queued
//! on the syncing copy's link, requests overlapping it wait in the region's
//! queue, so an application write is never applied between the read and
//! the write (where the older block would undo it on the syncing copy).

use super::*;

impl Forwarder {
    /// Holds `start..end` of replicated region `region`: requests
    /// overlapping it wait from now on. False when the region is not
    /// replicated here.
    pub(crate) fn hold_for_resync(&mut self, region: u32, start: u64, end: u64) -> bool {
        let Some(state) = self.region_state_mut(region) else {
            return false;
        };
        state.held.push((start, end));
        true
    }

    /// Ends the hold of `start..end` on `region` (once the block's write is
    /// queued on the syncing copy's link): the requests that waited for it
    /// go out, in order, behind that write.
    pub(crate) fn release_resync_hold(&mut self, region: u32, start: u64, end: u64, now: Instant) {
        let Some(state) = self.region_state_mut(region) else {
            return;
        };
        if let Some(at) = state.held.iter().position(|&h| h == (start, end)) {
            state.held.swap_remove(at);
        }
        self.release_queue(region, now);
    }
}
