//! A resync's requests refused STALE_MAP. As for the data path's parts
//! (`stale`), nothing ran: the server runs a newer map than the epoch this
//! device said on the link (another region's mark just moved it). The
//! request waits until the device runs at least the server's epoch and the
//! server has confirmed the device's (answering MAP_EPOCH, said again
//! meanwhile); then a record goes again as it was, and a block is copied
//! again from its READ (held, read from the deciding copy, written to the
//! syncing one), so that it follows every mutation of the block sent
//! meanwhile. The resync goes on where it was instead of starting again
//! from the first block.
//!
//! Bounded: a request refused more than [`STALE_RESENDS`] times at an
//! epoch no newer than the one it was sent under (the server confirmed
//! the device's epoch and still refuses, as one whose map lacks the
//! region), or waiting longer than the request timeout for its server to
//! confirm the epoch, stops the resync (logged with the reason), which
//! starts again later. A refusal at a newer epoch than the request went
//! under (the marks moved the map again meanwhile) is not counted: while
//! the marks of a server's return follow one another, a request may meet
//! several.

use super::super::stale::STALE_RESENDS;
use super::*;

/// A resync's request refused STALE_MAP, until it goes again.
#[derive(Debug, Clone, Copy)]
pub(super) struct StaleWait {
    part: ResyncPart,
    /// Its refusals counted so far (see the module), this one included.
    stale_refusals: u32,
    /// The copy whose server refused it, by position in the set.
    copy: usize,
    /// The epoch that server said it runs.
    theirs: u64,
    /// When it was refused.
    since: Instant,
}

impl StaleWait {
    /// The block it is a READ or WRITE of, if it is one.
    pub(super) fn block(&self) -> Option<u64> {
        match self.part {
            ResyncPart::Read { start, .. } | ResyncPart::Write { start, .. } => {
                Some(start / BLOCK_LEN)
            }
            ResyncPart::Sums { .. } | ResyncPart::Record { .. } => None,
        }
    }
}

impl Forwarder {
    /// A server running epoch `theirs` refused a resync's READ, WRITE or
    /// record STALE_MAP: it waits to go again (refused too often, the
    /// resync stops). A refused READ releases its block's hold meanwhile.
    pub(super) fn resync_refused_stale(&mut self, ticket: ResyncTicket, theirs: u64, now: Instant) {
        let id = ticket.sync;
        let stale_refusals = ticket.stale_refusals + u32::from(theirs <= ticket.sent_under);
        let Some(sync) = self.sync_mut(id) else {
            return;
        };
        let region = sync.region;
        let copy = match ticket.part {
            ResyncPart::Read { .. } => sync.source,
            _ => sync.copy,
        };
        if stale_refusals > STALE_RESENDS {
            let server = self
                .copy_server(region, copy)
                .map_or_else(String::new, |s| s.to_string());
            let why = format!(
                "server {server} answered STALE_MAP {stale_refusals} times to one of its \
                 requests at an epoch no newer than the one it went under, sent again each time \
                 once the server had confirmed this device's map epoch"
            );
            self.stop_resync(id, &why, now);
            return;
        }
        let mut released = None;
        match ticket.part {
            ResyncPart::Read { start, end } if sync.reading == Some((start, end)) => {
                sync.reading = None;
                released = Some((start, end));
            }
            ResyncPart::Write { .. } => sync.writing = sync.writing.saturating_sub(1),
            _ => {}
        }
        sync.stale.push(StaleWait {
            part: ticket.part,
            stale_refusals,
            copy,
            theirs,
            since: now,
        });
        tracing::debug!(
            "a resync's {:?} was refused STALE_MAP (the server runs epoch {theirs}); it goes \
             again once the server confirms this device's epoch",
            ticket.part
        );
        if let Some((start, end)) = released {
            self.release_resync_hold(region, start, end, now);
        }
        self.replication.stale.any = true;
        self.replication_changed();
        self.resend_stale(now);
    }

    /// Sends again the resyncs' waiting requests whose servers confirmed
    /// `epoch`, itself at least the one they said; returns whether some
    /// still wait.
    pub(in crate::forward) fn resend_resync_parts(&mut self, epoch: u64, now: Instant) -> bool {
        let ids: Vec<u64> = self
            .replication
            .resyncs
            .runs
            .iter()
            .filter(|s| !s.stale.is_empty())
            .map(|s| s.id)
            .collect();
        for id in ids {
            let Some(sync) = self.sync_mut(id) else {
                continue;
            };
            let region = sync.region;
            let waits = std::mem::take(&mut sync.stale);
            let (ready, kept): (Vec<StaleWait>, Vec<StaleWait>) =
                waits.into_iter().partition(|w| {
                    epoch >= w.theirs
                        && self
                            .copy_server(region, w.copy)
                            .is_some_and(|server| self.server_confirms(&server, epoch))
                });
            if let Some(sync) = self.sync_mut(id) {
                sync.stale = kept;
            }
            if !ready.is_empty() {
                self.resend_waits(id, ready, now);
            }
        }
        self.replication
            .resyncs
            .runs
            .iter()
            .any(|s| !s.stale.is_empty())
    }

    /// Sends resync `id`'s `ready` requests again: each record as it was,
    /// each block from its READ, first in the queue.
    fn resend_waits(&mut self, id: u64, ready: Vec<StaleWait>, now: Instant) {
        let owned = self
            .sync_mut(id)
            .map(|s| s.region)
            .and_then(|region| self.region_state(region))
            .is_some_and(|s| s.owner);
        if !owned {
            // A deposed owner's resync sends nothing more.
            self.stop_resync(id, "this device no longer owns the region", now);
            return;
        }
        if let Some(sync) = self.sync_mut(id) {
            sync.stale_resent += ready.len() as u64;
        }
        let mut blocks = Vec::new();
        for wait in ready {
            self.metrics.resync_stale_resends.inc();
            match wait.part {
                ResyncPart::Record { index } => {
                    if !self.send_record(id, index, wait.stale_refusals, now) {
                        self.stop_resync(id, "the syncing copy's link went down", now);
                        return;
                    }
                }
                ResyncPart::Read { .. } | ResyncPart::Write { .. } => {
                    blocks.extend(wait.block().map(|block| ToCopy {
                        block,
                        stale_refusals: wait.stale_refusals,
                    }));
                }
                ResyncPart::Sums { .. } => {}
            }
        }
        if let Some(sync) = self.sync_mut(id) {
            for block in blocks.into_iter().rev() {
                sync.to_copy.push_front(block);
            }
        }
        self.advance_resync(id, now);
    }

    /// The resyncs' requests waiting past `patience` stop their resyncs;
    /// returns the copies (region, position) the others wait for while
    /// the device runs at least their servers' epochs.
    pub(in crate::forward) fn resync_stale_due(
        &mut self,
        epoch: u64,
        patience: Duration,
        now: Instant,
    ) -> Vec<(u32, usize)> {
        let mut overdue = Vec::new();
        let mut unconfirmed = Vec::new();
        for sync in &self.replication.resyncs.runs {
            for wait in &sync.stale {
                if now.saturating_duration_since(wait.since) >= patience {
                    overdue.push(sync.id);
                } else if epoch >= wait.theirs {
                    unconfirmed.push((sync.region, wait.copy));
                }
            }
        }
        for id in overdue {
            let why = "a server answered STALE_MAP to one of its requests and did not confirm \
                       this device's map epoch within the request timeout";
            self.stop_resync(id, why, now);
        }
        unconfirmed
    }

    /// When the oldest of the resyncs' waiting requests was refused.
    pub(in crate::forward) fn resync_stale_since(&self) -> Option<Instant> {
        self.replication
            .resyncs
            .runs
            .iter()
            .flat_map(|s| &s.stale)
            .map(|w| w.since)
            .min()
    }
}
