//! Copies' answers to replicated operations, and each operation moved on:
//! an atomic from its decision to its word applied, any operation to its
//! client's answer once every copy answered and every loss is confirmed.

use super::*;

impl Forwarder {
    /// An answer from a copy to part of a replicated operation.
    pub(in crate::forward) fn copy_answered(
        &mut self,
        link: LinkId,
        link_tag: u64,
        op_id: u64,
        head: &[u8],
        payload: &[u8],
        now: Instant,
    ) {
        let Some(op) = self.replication.ops.get_mut(&op_id) else {
            return;
        };
        let Some(index) = op
            .sends
            .iter()
            .position(|s| s.link == link && s.tag == link_tag && !s.dropped && s.waiting.is_none())
        else {
            return;
        };
        let body = &head[proto::frame::HEADER_LEN..];
        let response = response::Packet::new_unchecked(body);
        let status = response.status();
        if status == Status::StaleMap {
            // Nothing ran there: not a copy that missed a change, a part
            // to send again once its server runs this device's epoch (a
            // newer server epoch makes the device read the map now).
            let theirs = response.value();
            self.server_response(head);
            self.copy_refused_stale(op_id, index, theirs, now);
            return;
        }
        let send = &mut op.sends[index];
        let value = match send.purpose {
            Purpose::ReadBack => payload
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .map_or(0, u64::from_le_bytes),
            _ => response.value(),
        };
        send.answer = Some((status, value));
        if status == Status::NotOwner {
            // The copy's server runs a newer map, one that names another
            // owner: read it now.
            self.server_response(head);
        }
        self.progress(op_id, now);
    }

    /// Moves operation `id` on as far as its answers allow: an atomic from
    /// its decision to its word written to the others, any operation to its
    /// answer once every copy answered and every lost copy is confirmed.
    /// Requests it held (a part sent under an older epoch) go once it holds
    /// them no more.
    pub(super) fn progress(&mut self, id: u64, now: Instant) {
        self.advance_op(id, now);
        self.refresh_behind(id, now);
    }

    fn advance_op(&mut self, id: u64, now: Instant) {
        let Some(mut op) = self.replication.ops.remove(&id) else {
            return;
        };
        if op.atomic.as_ref().is_some_and(|a| !a.applying) {
            let decide = op.sends.iter().rev().find(|s| s.purpose == Purpose::Decide);
            let read = op
                .sends
                .iter()
                .rev()
                .find(|s| s.purpose == Purpose::ReadBack);
            let decide = decide.map(|d| (d.answer, d.dropped));
            let read = read.map(|r| (r.answer, r.settled()));
            match (decide, read) {
                (Some((None, true)), _) => {
                    // The deciding copy was lost before deciding: the next
                    // one decides (the lost copy is never read again).
                    let decided = self.decide(&mut op, id, now);
                    self.replication.ops.insert(id, op);
                    if !decided {
                        self.end_op(id, Status::ServerUnavailable, 0, now);
                    }
                    return;
                }
                (Some((Some((status, old)), _)), Some((word, true))) => {
                    let Some(atomic) = op.atomic.as_mut() else {
                        return;
                    };
                    atomic.decided = Some((status, old));
                    let word = match word {
                        Some((Status::Ok, word)) => word,
                        _ => atomic.word_after(old),
                    };
                    self.replication.ops.insert(id, op);
                    if status != Status::Ok {
                        self.end_op(id, status, old, now);
                        return;
                    }
                    if let Some(mut op) = self.replication.ops.remove(&id) {
                        self.apply_word(&mut op, id, word, now);
                        self.replication.ops.insert(id, op);
                    }
                    self.release_queue(region_of(&self.replication.ops, id), now);
                    self.progress(id, now);
                    return;
                }
                _ => {
                    self.replication.ops.insert(id, op);
                    return;
                }
            }
        }
        if !op.sends.iter().all(CopySend::settled) {
            self.replication.ops.insert(id, op);
            return;
        }
        // Copies that disagree with a serving copy's OK missed the change;
        // a server that says this device is not the owner (it runs a map
        // that deposed it) refused it for that, not for a fault.
        let serving = |s: &Forwarder, copy: usize| {
            s.region_state(op.region)
                .and_then(|st| st.copies.get(copy))
                .is_some_and(|c| c.state == ReplicaState::Serving)
        };
        let writes = |p: Purpose| matches!(p, Purpose::Mutation | Purpose::ApplyWord);
        let ok_somewhere = op
            .sends
            .iter()
            .any(|s| writes(s.purpose) && s.answer.is_some_and(|(st, _)| st == Status::Ok))
            || op.atomic.is_some();
        if ok_somewhere {
            let disagree: Vec<(usize, Status)> = op
                .sends
                .iter()
                .filter(|s| writes(s.purpose))
                .filter_map(|s| match s.answer {
                    Some((st, _)) if st != Status::Ok && st != Status::NotOwner => {
                        Some((s.copy, st))
                    }
                    _ => None,
                })
                .collect();
            for (copy, status) in disagree {
                let why = format!("it refused a change the others made ({status})");
                if self.lose_copy(op.region, copy, &why, now) && !op.lost.contains(&copy) {
                    op.lost.push(copy);
                }
            }
        }
        let held = op.lost.iter().any(|&copy| {
            self.region_state(op.region)
                .and_then(|s| s.copies.get(copy))
                .is_some_and(|c| c.unconfirmed)
        });
        if held {
            self.replication.ops.insert(id, op);
            return;
        }
        let (status, value) = match op.atomic.as_ref().and_then(|a| a.decided) {
            Some(decided) => decided,
            None => op
                .sends
                .iter()
                .filter(|s| serving(self, s.copy))
                .find_map(|s| s.answer)
                .or_else(|| op.sends.iter().find_map(|s| s.answer))
                .unwrap_or((Status::ServerUnavailable, 0)),
        };
        self.replication.ops.insert(id, op);
        self.end_op(id, status, value, now);
    }

    /// Answers operation `id` and forgets it; its range leaves the table
    /// and requests queued behind it may go.
    pub(super) fn end_op(&mut self, id: u64, status: Status, value: u64, now: Instant) {
        let Some(op) = self.replication.ops.remove(&id) else {
            return;
        };
        if status == Status::Ok {
            self.note_missed(&op);
        }
        if let Some(state) = self.region_state_mut(op.region) {
            state.spans.retain(|s| s.op != id);
        }
        self.metrics.in_flight.dec();
        self.reply_bytes = self.reply_bytes.saturating_sub(REPLY_HEAD_LEN as u64);
        if let Some(session) = self.sessions.get_mut(&op.conn) {
            session.in_flight = session.in_flight.saturating_sub(1);
            session.reply_bytes = session.reply_bytes.saturating_sub(REPLY_HEAD_LEN as u64);
            self.metrics.record(op.opcode, status);
            let repr = response::Repr {
                kind: response::ResponseKind::answering(op.opcode),
                status,
                value,
                payload: &[],
            };
            let reply = match Message::Response(repr).encode_to_vec(op.client_tag) {
                Ok(bytes) => Reply::Frame(bytes),
                Err(_) => error_reply(op.opcode, op.client_tag, status),
            };
            self.metrics
                .bytes_to_clients
                .add(reply.as_bytes().len() as u64);
            self.replication.outbox.push(Outgoing::Answer {
                conn: op.conn,
                reply,
            });
        }
        self.release_queue(op.region, now);
    }
}
