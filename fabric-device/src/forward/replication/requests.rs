//! Requests of a replicated region at its owner: NOT_OWNER elsewhere, a
//! wait behind an undecided atomic (or a range a resync holds), mutations
//! sent to every copy, and the queue released in order.

use super::*;

impl Forwarder {
    /// A request for a replicated region: refused NOT_OWNER here unless
    /// this device owns the region (its owner then suspected), or STALE_MAP
    /// when the client runs a newer map (which may name this device the
    /// owner: the client tries again once the device has it); queued
    /// behind an undecided atomic it overlaps; otherwise sent.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::forward) fn forward_replicated<'a>(
        &mut self,
        conn: ConnId,
        frame: &'a [u8],
        req: &request::Repr<'_>,
        tag: u64,
        at: Located,
        verdict: proto::fence::Verdict,
        now: Instant,
    ) -> ClientAction<'a> {
        let opcode = req.operation.opcode();
        let region = at.at.region.0;
        if !self.region_state(region).is_some_and(|s| s.owner) {
            if verdict == proto::fence::Verdict::ServeAhead {
                return ClientAction::Reply(self.stale_map(opcode, tag));
            }
            self.suspect_owner(region, now);
            return ClientAction::Reply(self.not_owner_reply(opcode, tag));
        }
        if self.copies_starting(region) == Some(true)
            && self.park(conn, frame, region, opcode, tag, now)
        {
            return ClientAction::Nothing;
        }
        let start = at.at.offset;
        let end = start.saturating_add(u64::from(req.span_len()));
        let Some(state) = self.region_state_mut(region) else {
            return ClientAction::Reply(self.refuse(verdict, opcode, tag, Status::Unmapped));
        };
        let waits =
            state.queued.iter().any(|q| q.start < end && start < q.end) || state.holds(start, end);
        if waits {
            state.queued.push_back(Queued {
                conn,
                frame: frame.to_vec(),
                start,
                end,
            });
            if let Some(session) = self.sessions.get_mut(&conn) {
                session.in_flight += 1;
            }
            return ClientAction::Nothing;
        }
        if req.operation == Operation::Read {
            // A read nothing orders goes straight to its link.
            return match self.read_copy(conn, frame, req, tag, at, ReadVia::Direct, now) {
                Ok(Some(read)) => ClientAction::Forward {
                    link: read.link,
                    head: read.head,
                    payload: &[],
                    rdma: None,
                },
                Ok(None) => ClientAction::Nothing,
                Err(status) => ClientAction::Reply(self.refuse(verdict, opcode, tag, status)),
            };
        }
        match self.dispatch(conn, frame, req, tag, at, now) {
            Ok(()) => ClientAction::Nothing,
            Err(status) => ClientAction::Reply(self.refuse(verdict, opcode, tag, status)),
        }
    }

    /// Sends a request of a replicated region to its copies.
    pub(super) fn dispatch(
        &mut self,
        conn: ConnId,
        frame: &[u8],
        req: &request::Repr<'_>,
        tag: u64,
        at: Located,
        now: Instant,
    ) -> Result<(), Status> {
        match req.operation {
            Operation::Read => self
                .read_copy(conn, frame, req, tag, at, ReadVia::Outbox, now)
                .map(|_| ()),
            Operation::CompareSwap | Operation::FetchAdd => {
                self.start_atomic(conn, frame, req, tag, at, now)
            }
            // An ATOMIC_WRITE under an identity is stored once however
            // often it is sent: decided like the other atomics, so that its
            // record is at every copy.
            Operation::AtomicWrite if req.exactly_once.is_some() => {
                self.start_atomic(conn, frame, req, tag, at, now)
            }
            _ => self.fan_out(conn, frame, req, tag, at, now),
        }
    }

    /// WRITE, WRITE_PERSIST, FLUSH, ATOMIC_WRITE without an identity: to
    /// every copy that takes writes.
    pub(super) fn fan_out(
        &mut self,
        conn: ConnId,
        frame: &[u8],
        req: &request::Repr<'_>,
        tag: u64,
        at: Located,
        now: Instant,
    ) -> Result<(), Status> {
        let region = at.at.region.0;
        let copies = self.reach_copies(region, now)?;
        let start = at.at.offset;
        let end = start.saturating_add(u64::from(req.span_len()));
        let (id, mut op) = self.new_op(
            conn,
            tag,
            req.operation.opcode(),
            region,
            (start, end),
            false,
        );
        let head = rewrite_head(frame, req, 0, at.at, at.client_number);
        let payload: Arc<[u8]> = Arc::from(&frame[FORWARD_HEAD_LEN..]);
        for (copy, link) in copies {
            let Some(server) = self.copy_server(region, copy) else {
                continue;
            };
            let key = self.copy_key(region, &server, req.key);
            self.send_op_part(
                &mut op,
                id,
                copy,
                link,
                head,
                Arc::clone(&payload),
                key,
                Purpose::Mutation,
                now,
            );
        }
        self.replication.ops.insert(id, op);
        Ok(())
    }

    /// Sends the queued requests of `region` that no undecided atomic, held
    /// range or earlier queued request overlaps any more, in order.
    pub(super) fn release_queue(&mut self, region: u32, now: Instant) {
        let Some(state) = self.region_state_mut(region) else {
            return;
        };
        if state.queued.is_empty() {
            return;
        }
        let waiting = std::mem::take(&mut state.queued);
        let mut kept: VecDeque<Queued> = VecDeque::new();
        for q in waiting {
            let blocked = kept.iter().any(|k| k.start < q.end && q.start < k.end)
                || self
                    .region_state(region)
                    .is_some_and(|s| s.holds(q.start, q.end));
            if blocked {
                kept.push_back(q);
                continue;
            }
            if let Some(session) = self.sessions.get_mut(&q.conn) {
                session.in_flight = session.in_flight.saturating_sub(1);
            } else {
                continue;
            }
            self.send_queued(q, now);
        }
        if let Some(state) = self.region_state_mut(region) {
            while let Some(q) = kept.pop_back() {
                state.queued.push_front(q);
            }
        }
    }

    /// A queued request, sent now (or refused, as it would have been).
    pub(super) fn send_queued(&mut self, q: Queued, now: Instant) {
        let Ok((Message::Request(req), tag)) = proto::parse_frame(&q.frame) else {
            return;
        };
        let opcode = req.operation.opcode();
        let sent = match self.route(q.conn, &req) {
            // The map gave the region to another owner meanwhile.
            Ok(Routed::Replicated(at))
                if !self.region_state(at.at.region.0).is_some_and(|s| s.owner) =>
            {
                let reply = self.not_owner_reply(opcode, tag);
                self.replication.outbox.push(Outgoing::Answer {
                    conn: q.conn,
                    reply,
                });
                return;
            }
            Ok(Routed::Replicated(at)) => self.dispatch(q.conn, &q.frame, &req, tag, at, now),
            Ok(Routed::Single(_)) => Err(Status::StaleMap),
            Err(status) => Err(status),
        };
        if let Err(status) = sent {
            self.metrics.record(opcode, status);
            self.replication.outbox.push(Outgoing::Answer {
                conn: q.conn,
                reply: error_reply(opcode, tag, status),
            });
        }
    }
}
