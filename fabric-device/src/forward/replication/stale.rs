//! Parts of replicated requests a copy's server refused STALE_MAP.
//!
//! STALE_MAP means nothing ran: the server runs a newer map than the epoch
//! this device said on the link (each mark of a copy bumps the map's
//! epoch, and servers read it on their own), or the device said a newer
//! one and the server's map lacks the region. Such a copy did not miss a
//! change the others made, so it is not lost. The refused part waits
//! until the device runs at least the server's epoch (a newer one makes
//! it read the map at once) and the server has said, answering MAP_EPOCH,
//! that it runs the device's; then it goes again on the copy's link with
//! the same identity (a duplicate atomic is answered from the server's
//! exactly-once window). Waiting parts go again in the order they first
//! went, and a request overlapping an operation with a part waiting, or
//! with a part sent under an older epoch and not answered yet (it may come
//! back STALE_MAP), waits behind it: on every copy's link, one range's
//! requests keep the owner's order.
//!
//! A device whose newer map gives the region to another owner sends
//! nothing again: the operation is answered NOT_OWNER and the client takes
//! it to the new owner (a deposed owner's resend would apply a change the
//! servers were right to refuse).
//!
//! Bounded: a part refused more than [`STALE_RESENDS`] times, or waiting
//! longer than the request timeout for its server to confirm the epoch,
//! loses its copy (logged with the reason); when that is the last serving
//! copy, the request fails STALE_MAP instead.
//!
//! A READ refused STALE_MAP waits the same way and is then sent to a
//! serving copy again (behind any resent mutation it overlaps); past the
//! bound the client gets the STALE_MAP (nothing is lost for a read). A
//! resync's own requests wait the same way too (`resync::refused`).

use super::takeover::RESAY_EVERY;
use super::*;

/// How many times a part refused STALE_MAP goes again; one more refusal
/// loses its copy.
pub(in crate::forward) const STALE_RESENDS: u32 = 3;

/// A part refused STALE_MAP, until it goes again.
#[derive(Debug, Clone, Copy)]
pub(super) struct Waiting {
    /// The epoch the server said it runs, in its STALE_MAP.
    theirs: u64,
    /// When it was refused.
    since: Instant,
}

/// A READ a copy refused STALE_MAP, until it goes again.
#[derive(Debug)]
pub(super) struct StaleRead {
    pending: Pending,
    again: ReadAgain,
    waiting: Waiting,
}

/// The core's parts waiting after STALE_MAP.
#[derive(Debug, Default)]
pub(super) struct StaleParts {
    /// Some part (or a resync's request) may be waiting.
    pub(super) any: bool,
    /// Reads waiting, in the order they were refused.
    reads: Vec<StaleRead>,
    /// When MAP_EPOCH is said again to the servers waited for.
    resay_at: Option<Instant>,
}

impl Forwarder {
    /// Part `index` of operation `op_id` was refused STALE_MAP by a server
    /// that runs epoch `theirs`: it waits to go again (or, refused too
    /// often, its copy is lost).
    pub(super) fn copy_refused_stale(
        &mut self,
        op_id: u64,
        index: usize,
        theirs: u64,
        now: Instant,
    ) {
        let Some(op) = self.replication.ops.get_mut(&op_id) else {
            return;
        };
        let Some(send) = op.sends.get_mut(index) else {
            return;
        };
        send.stale_answers += 1;
        let (region, copy, refusals) = (op.region, send.copy, send.stale_answers);
        if refusals > STALE_RESENDS {
            let why = format!(
                "its server answered STALE_MAP {refusals} times to one request, sent again each \
                 time once the server had confirmed this device's map epoch"
            );
            if !self.lose_copy(region, copy, &why, now) {
                self.end_op(op_id, Status::StaleMap, theirs, now);
            }
            return;
        }
        send.waiting = Some(Waiting { theirs, since: now });
        self.replication.stale.any = true;
        self.replication_changed();
        self.refresh_behind(op_id, now);
        self.resend_stale(now);
    }

    /// A READ of a copy (`pending`) was refused STALE_MAP by a server that
    /// runs epoch `theirs`: it waits to go again (or, refused too often,
    /// the client is told STALE_MAP).
    pub(in crate::forward) fn copy_read_stale(
        &mut self,
        mut pending: Pending,
        theirs: u64,
        now: Instant,
    ) {
        let Some(CopyTicket::Read(mut again)) = pending.copy.take() else {
            self.read_refused_stale(pending, theirs);
            return;
        };
        again.stale_refusals += 1;
        if again.stale_refusals > STALE_RESENDS {
            self.read_refused_stale(pending, theirs);
            return;
        }
        self.replication.stale.reads.push(StaleRead {
            pending,
            again: *again,
            waiting: Waiting { theirs, since: now },
        });
        self.replication.stale.any = true;
        self.replication_changed();
        self.resend_stale(now);
    }

    /// Answers a read STALE_MAP with the server's epoch `theirs`.
    fn read_refused_stale(&mut self, pending: Pending, theirs: u64) {
        let tag = pending.client_tag;
        if let Some((conn, _)) = self.answer(pending, Status::StaleMap) {
            self.metrics.stale_map.inc();
            let reply = Reply::Error(proto::fence::epoch_reply(
                Opcode::Read,
                tag,
                Status::StaleMap,
                theirs,
            ));
            self.replication
                .outbox
                .push(Outgoing::Answer { conn, reply });
        }
    }

    /// The device runs a new epoch: operations with parts in flight under
    /// an older one hold overlapping requests until those are answered,
    /// and waiting parts whose servers run this epoch go again.
    pub(in crate::forward) fn stale_after_epoch(&mut self, now: Instant) {
        self.replication_changed();
        let ids: Vec<u64> = self.replication.ops.keys().copied().collect();
        for id in ids {
            self.refresh_behind(id, now);
        }
        self.resend_stale(now);
    }

    /// Sends again, in the order they first went, the waiting parts whose
    /// servers confirmed the device's epoch, itself at least the one they
    /// said.
    pub(super) fn resend_stale(&mut self, now: Instant) {
        if !self.replication.stale.any {
            return;
        }
        let epoch = self.current_epoch();
        let mut ready = Vec::new();
        let mut deposed = Vec::new();
        let mut waiting = false;
        for (id, op) in self.replication.ops.iter() {
            let owner = self.region_state(op.region).is_some_and(|s| s.owner);
            for (i, send) in op.sends.iter().enumerate() {
                let Some(w) = send.waiting.filter(|_| !send.dropped) else {
                    continue;
                };
                if !owner {
                    // The map this device now runs gives the region to
                    // another owner: sending again would apply a deposed
                    // owner's change. The client goes to the new owner.
                    deposed.push(*id);
                    break;
                }
                waiting = true;
                let confirmed = self
                    .copy_server(op.region, send.copy)
                    .is_some_and(|server| self.server_confirms(&server, epoch));
                if epoch >= w.theirs && confirmed {
                    ready.push((send.order, *id, i));
                }
            }
        }
        self.replication.stale.any = waiting;
        for id in deposed {
            self.end_op(id, Status::NotOwner, epoch, now);
        }
        ready.sort_unstable();
        let ids: Vec<u64> = ready.iter().map(|&(_, id, _)| id).collect();
        for (_, id, index) in ready {
            self.resend_part(id, index, now);
        }
        for id in ids {
            self.refresh_behind(id, now);
        }
        self.resend_stale_reads(epoch, now);
        let resyncs_wait = self.resend_resync_parts(epoch, now);
        self.replication.stale.any =
            waiting || !self.replication.stale.reads.is_empty() || resyncs_wait;
    }

    /// Sends again the waiting reads whose server confirmed `epoch`, itself
    /// at least the one they said, and that no mutation with a part still
    /// to send overlaps.
    fn resend_stale_reads(&mut self, epoch: u64, now: Instant) {
        if self.replication.stale.reads.is_empty() {
            return;
        }
        let reads = std::mem::take(&mut self.replication.stale.reads);
        let mut kept = Vec::new();
        for read in reads {
            let confirmed = self
                .copy_server(read.again.region, read.again.copy)
                .is_some_and(|server| self.server_confirms(&server, epoch));
            let behind = self
                .region_state(read.again.region)
                .is_some_and(|s| s.behind_over(read.again.start, read.again.end));
            if !self
                .region_state(read.again.region)
                .is_some_and(|s| s.owner)
            {
                // Deposed meanwhile: the new owner answers it.
                if let Some((conn, reply)) = self.answer(read.pending, Status::NotOwner) {
                    self.replication
                        .outbox
                        .push(Outgoing::Answer { conn, reply });
                }
                continue;
            }
            if epoch < read.waiting.theirs || !confirmed || behind {
                kept.push(read);
                continue;
            }
            if let Err(pending) = self.send_read(read.pending, read.again, ReadVia::Outbox, now)
                && let Some((conn, reply)) = self.answer(pending, Status::ServerUnavailable)
            {
                self.replication
                    .outbox
                    .push(Outgoing::Answer { conn, reply });
            }
        }
        self.replication.stale.reads.extend(kept);
    }

    /// Whether `server` said (answering MAP_EPOCH) that it runs `epoch` or
    /// a newer one, or that it follows no map.
    pub(super) fn server_confirms(&self, server: &ServerId, epoch: u64) -> bool {
        self.replication
            .takeovers
            .said_epoch(server)
            .is_some_and(|said| said == 0 || said >= epoch)
    }

    /// Puts part `index` of operation `op_id` on its copy's link again,
    /// same request, new link tag.
    fn resend_part(&mut self, op_id: u64, index: usize, now: Instant) {
        let Some(mut op) = self.replication.ops.remove(&op_id) else {
            return;
        };
        let Some(send) = op
            .sends
            .get(index)
            .filter(|s| s.waiting.is_some() && !s.dropped)
        else {
            self.replication.ops.insert(op_id, op);
            return;
        };
        let (copy, head, payload, key, cpu) = (
            send.copy,
            send.head,
            Arc::clone(&send.payload),
            send.key,
            send.purpose.for_cpu(),
        );
        let links = self
            .region_state(op.region)
            .and_then(|s| s.copies.get(copy))
            .map(|c| c.links.clone())
            .unwrap_or_default();
        let region = op.region;
        let Some(link) = self.write_link(&links) else {
            self.replication.ops.insert(op_id, op);
            if !self.lose_copy(region, copy, "no link to its server is up", now) {
                self.end_op(op_id, Status::ServerUnavailable, 0, now);
            }
            return;
        };
        let pending = Pending {
            conn: op.conn,
            client_tag: op.client_tag,
            opcode: op.opcode,
            sent: now,
            reply_bytes: 0,
            copy: Some(CopyTicket::Op(op_id)),
        };
        if let Ok(tag) = self.send_copy(head, payload, link, pending, key, cpu, now) {
            let order = self.replication.next_send;
            self.replication.next_send += 1;
            let epoch = self.current_epoch();
            if let Some(send) = op.sends.get_mut(index) {
                send.link = link;
                send.tag = tag;
                send.epoch = epoch;
                send.order = order;
                send.waiting = None;
            }
        }
        self.replication.ops.insert(op_id, op);
    }

    /// Sets whether operation `op_id` holds overlapping requests (a part
    /// waiting, or one sent under an older epoch and not answered yet);
    /// when it stops holding them, those that can go, go.
    pub(super) fn refresh_behind(&mut self, op_id: u64, now: Instant) {
        let Some(op) = self.replication.ops.get(&op_id) else {
            return;
        };
        let epoch = self.current_epoch();
        let behind = op.sends.iter().any(|s| {
            !s.dropped && (s.waiting.is_some() || (s.answer.is_none() && s.epoch < epoch))
        });
        let region = op.region;
        let Some(state) = self.region_state_mut(region) else {
            return;
        };
        let mut released = false;
        for span in state.spans.iter_mut().filter(|s| s.op == op_id) {
            released |= span.behind && !behind;
            span.behind = behind;
        }
        if released {
            self.release_queue(region, now);
        }
    }

    /// What the driver sends for waiting parts: MAP_EPOCH again, every
    /// [`RESAY_EVERY`], on the link of each copy whose server has not
    /// confirmed the device's epoch. A part waiting past the request
    /// timeout loses its copy (a resync's request stops its resync).
    pub(super) fn stale_resays(&mut self, now: Instant) -> Vec<LinkId> {
        if !self.replication.stale.any {
            return Vec::new();
        }
        let patience = self.config.request_timeout;
        let epoch = self.current_epoch();
        let mut overdue = Vec::new();
        let mut unconfirmed = Vec::new();
        for (id, op) in self.replication.ops.iter() {
            for send in &op.sends {
                let Some(w) = send.waiting.filter(|_| !send.dropped) else {
                    continue;
                };
                if now.saturating_duration_since(w.since) >= patience {
                    overdue.push((*id, op.region, send.copy, w.theirs));
                } else if epoch >= w.theirs {
                    unconfirmed.push((op.region, send.copy));
                }
            }
        }
        for (id, region, copy, theirs) in overdue {
            let why = "its server answered STALE_MAP and did not confirm this device's map epoch \
                       within the request timeout";
            if !self.lose_copy(region, copy, why, now) {
                self.end_op(id, Status::StaleMap, theirs, now);
            }
        }
        unconfirmed.extend(self.resync_stale_due(epoch, patience, now));
        let reads = std::mem::take(&mut self.replication.stale.reads);
        for read in reads {
            if now.saturating_duration_since(read.waiting.since) >= patience {
                self.read_refused_stale(read.pending, read.waiting.theirs);
                continue;
            }
            if epoch >= read.waiting.theirs {
                unconfirmed.push((read.again.region, read.again.copy));
            }
            self.replication.stale.reads.push(read);
        }
        // Confirmations that came meanwhile.
        self.resend_stale(now);
        let due = self.replication.stale.resay_at.is_none_or(|at| at <= now);
        if !due || !self.replication.stale.any {
            return Vec::new();
        }
        // Looked at again in a period, said or not (a part whose device
        // is behind waits for the map, not for its server).
        self.replication.stale.resay_at = Some(now + RESAY_EVERY);
        let mut links = Vec::new();
        for (region, copy) in unconfirmed {
            let Some(state) = self.region_state(region) else {
                continue;
            };
            let Some(c) = state.copies.get(copy) else {
                continue;
            };
            if self.server_confirms(&c.server, epoch) {
                continue;
            }
            if let Some(link) = self.write_link(&c.links)
                && !links.contains(&link)
            {
                links.push(link);
            }
        }
        links
    }

    /// When [`Self::stale_resays`] next has work, if a part waits.
    pub(super) fn stale_poll_timeout(&self) -> Option<Instant> {
        if !self.replication.stale.any {
            return None;
        }
        let patience = self.config.request_timeout;
        let give_up = self
            .replication
            .ops
            .values()
            .flat_map(|op| op.sends.iter())
            .filter(|s| !s.dropped)
            .filter_map(|s| s.waiting.map(|w| w.since))
            .chain(self.replication.stale.reads.iter().map(|r| r.waiting.since))
            .chain(self.resync_stale_since())
            .min()?
            + patience;
        Some(
            self.replication
                .stale
                .resay_at
                .map_or(give_up, |at| at.min(give_up)),
        )
    }
}
