//! READ of a replicated region: to a serving copy, or behind a mutation in
//! flight at the deciding copy; sent to another copy when its copy fails.

use super::*;

/// Requests pending on a copy's link below which reads of a replicated
/// region stay on that copy rather than spread over the copies.
///
/// Spreading a burst of small reads over two servers costs the device a
/// second send and the wake-up of a second server for the same requests,
/// and gains nothing while one server keeps up: on loopback with two
/// vCPUs, reads spread one by one forwarded about a third fewer per second
/// than reads of a region with one copy (`docs/benchmarks.md`). Past this
/// many requests waiting at one server, the others share them.
pub(in crate::forward) const READ_SPREAD: usize = 64;

/// Where a read of a replicated region goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::forward) struct ReadTarget {
    /// The copy, by its place in the replica set.
    pub copy: usize,
    /// The link to its server.
    pub link: LinkId,
    /// It goes behind a mutation in flight that it overlaps, on the
    /// deciding copy's link: it must keep its place in the copy's order.
    pub behind: bool,
}

/// Boxes of answered reads kept for the next reads at most: a read of a
/// replicated region then allocates nothing in the steady state.
const SPARE_READS: usize = 1024;

/// How a read of a replicated region leaves the core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::forward) enum ReadVia {
    /// Queued in the outbox, in its copy's order, like every other request
    /// to a copy (a read sent again, or released after waiting).
    Outbox,
    /// Handed back to be written straight to its link, like a single
    /// copy's READ, when nothing orders it against the copy's other
    /// requests: it overlaps no mutation in flight and its link has no
    /// queue pair (whose requests the driver orders against the TCP
    /// connection's). This spares the outbox and the copy's stream.
    Direct,
}

/// A read to write straight to its link ([`ReadVia::Direct`]).
#[derive(Debug)]
pub(in crate::forward) struct DirectRead {
    /// The link to the copy's server.
    pub link: LinkId,
    /// The READ's frame and request header, rewritten for the copy.
    pub head: [u8; FORWARD_HEAD_LEN],
}

impl Forwarder {
    /// READ: to a serving copy; to the deciding one, behind the mutation,
    /// when it overlaps a mutation in flight. With [`ReadVia::Direct`], a
    /// read that may skip the outbox is handed back instead.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn read_copy(
        &mut self,
        conn: ConnId,
        frame: &[u8],
        req: &request::Repr<'_>,
        tag: u64,
        at: Located,
        via: ReadVia,
        now: Instant,
    ) -> Result<Option<DirectRead>, Status> {
        let region = at.at.region.0;
        let start = at.at.offset;
        let end = start.saturating_add(u64::from(req.length));
        let head = rewrite_head(frame, req, 0, at.at, at.client_number);
        let again = ReadAgain {
            head,
            client_key: req.key,
            region,
            copy: 0,
            start,
            end,
            stale_refusals: 0,
        };
        let reply_bytes = REPLY_HEAD_LEN as u64 + u64::from(req.length);
        if let Some(session) = self.sessions.get_mut(&conn) {
            session.in_flight += 1;
            session.reply_bytes += reply_bytes;
        }
        self.reply_bytes += reply_bytes;
        self.metrics.in_flight.inc();
        let pending = Pending {
            conn,
            client_tag: tag,
            opcode: Opcode::Read,
            sent: now,
            reply_bytes,
            copy: None,
        };
        match self.send_read(pending, again, via, now) {
            Ok(direct) => Ok(direct),
            Err(pending) => {
                // Nothing was sent: the refusal settles its charge.
                let _ = self.answer(pending, Status::ServerUnavailable);
                Err(Status::ServerUnavailable)
            }
        }
    }

    /// Sends a read to the copy it should go to now (or hands it back to
    /// be written straight to its link, see [`ReadVia`]); gives the request
    /// back when no serving copy is reachable.
    pub(super) fn send_read(
        &mut self,
        mut pending: Pending,
        mut again: ReadAgain,
        via: ReadVia,
        now: Instant,
    ) -> Result<Option<DirectRead>, Pending> {
        let Some(ReadTarget { copy, link, behind }) =
            self.read_target(again.region, again.start, again.end)
        else {
            return Err(pending);
        };
        let Some(server) = self
            .region_state(again.region)
            .and_then(|s| s.copies.get(copy))
            .map(|c| &c.server)
        else {
            return Err(pending);
        };
        let key = self.copy_key(again.region, server, again.client_key);
        again.copy = copy;
        let mut head = again.head;
        let again = match self.replication.spare_reads.pop() {
            Some(mut spare) => {
                *spare = again;
                spare
            }
            None => Box::new(again),
        };
        pending.copy = Some(CopyTicket::Read(again));
        let give_back = |mut pending: Pending| {
            pending.copy = None;
            pending
        };
        if via == ReadVia::Direct && !behind && !self.has_queue_pair(link) {
            self.record_copy(&mut head, 0, link, pending, key, now)
                .map_err(give_back)?;
            return Ok(Some(DirectRead { link, head }));
        }
        let none = Arc::clone(&self.replication.no_payload);
        self.send_copy(head, none, link, pending, key, false, now)
            .map_err(give_back)?;
        Ok(None)
    }

    /// Where a read of `[start, end)` goes: the deciding copy's write link
    /// when a mutation in flight overlaps it, else a serving copy with a
    /// link up: on its socket first, then the one with the fewest requests
    /// pending counted in steps of [`READ_SPREAD`], then in set order. So
    /// reads stay on one copy while it has fewer than [`READ_SPREAD`]
    /// pending (a client's batch goes out in one send to one server) and
    /// spread over the copies beyond.
    pub(super) fn read_target(&self, region: u32, start: u64, end: u64) -> Option<ReadTarget> {
        let state = self.region_state(region)?;
        if state.spans.iter().any(|s| s.overlaps(start, end)) {
            let copy = self.deciding_copy(region)?;
            let link = self.write_link(&state.copies[copy].links)?;
            return Some(ReadTarget {
                copy,
                link,
                behind: true,
            });
        }
        let lane = if end - start >= BULK_MIN_BYTES {
            LinkClass::Bulk
        } else {
            LinkClass::Main
        };
        let mut best: Option<((bool, usize), usize, LinkId)> = None;
        for (i, copy) in state.copies.iter().enumerate() {
            if copy.state != ReplicaState::Serving {
                continue;
            }
            let Some(&first) = copy.links.first() else {
                continue;
            };
            let home = &self.map.links[first].socket;
            for &pos in &copy.links {
                for id in [self.link_ids[pos].get(lane), self.link_ids[pos].main] {
                    let Some(link) = self.links.get(&id).filter(|l| l.status == LinkStatus::Up)
                    else {
                        continue;
                    };
                    let rank = (
                        &self.map.links[pos].socket != home,
                        link.pending.len() / READ_SPREAD,
                    );
                    if best.as_ref().is_none_or(|(r, _, _)| rank < *r) {
                        if rank == (false, 0) {
                            // Nothing ranks lower: the first such link wins.
                            return Some(ReadTarget {
                                copy: i,
                                link: id,
                                behind: false,
                            });
                        }
                        best = Some((rank, i, id));
                    }
                    break;
                }
            }
        }
        best.map(|(_, copy, link)| ReadTarget {
            copy,
            link,
            behind: false,
        })
    }

    /// Keeps the box of an answered read's record for the next read.
    pub(in crate::forward) fn recycle_read(&mut self, again: Box<ReadAgain>) {
        let spare = &mut self.replication.spare_reads;
        if spare.len() < SPARE_READS {
            spare.push(again);
        }
    }

    /// A read of a copy failed (its link went down, or it timed out): it
    /// goes to another serving copy, or fails with `status`. A timed-out
    /// copy is lost first.
    pub(in crate::forward) fn copy_read_failed(
        &mut self,
        mut pending: Pending,
        status: Status,
        now: Instant,
    ) -> Option<(ConnId, Reply)> {
        let Some(CopyTicket::Read(again)) = pending.copy.take() else {
            return self.answer(pending, status);
        };
        if status == Status::Timeout
            && !self.lose_copy(again.region, again.copy, "a read timed out", now)
        {
            return self.answer(pending, status);
        }
        match self.send_read(pending, *again, ReadVia::Outbox, now) {
            Ok(_) => None,
            Err(pending) => self.answer(pending, status),
        }
    }
}
