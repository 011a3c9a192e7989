//! COMPARE_SWAP, FETCH_ADD and exactly-once ATOMIC_WRITE of a replicated
//! region: decided at the deciding copy (its word read back on the same
//! link), then the word written to the other copies under the client's
//! identity, with the atomic's record so that each copy's exactly-once
//! window remembers it.

use proto::atomic_record::AtomicRecord;

use super::*;

impl Forwarder {
    /// COMPARE_SWAP, FETCH_ADD, ATOMIC_WRITE under an identity: decided at
    /// the deciding copy first.
    pub(super) fn start_atomic(
        &mut self,
        conn: ConnId,
        frame: &[u8],
        req: &request::Repr<'_>,
        tag: u64,
        at: Located,
        now: Instant,
    ) -> Result<(), Status> {
        let region = at.at.region.0;
        // Copies without a link are lost before anything is decided.
        self.reach_copies(region, now)?;
        let start = at.at.offset;
        let end = start.saturating_add(u64::from(req.span_len()));
        let (id, mut op) = self.new_op(
            conn,
            tag,
            req.operation.opcode(),
            region,
            (start, end),
            true,
        );
        op.atomic = Some(Atomic {
            head: rewrite_head(frame, req, 0, at.at, at.client_number),
            operation: req.operation,
            operand: req.operand,
            compare: req.compare,
            identity: req.exactly_once.map(|once| once.stamped(at.client_number)),
            persist: req.persist,
            client_key: req.key,
            client_number: at.client_number,
            at: at.at,
            decided: None,
            word: None,
            applying: false,
        });
        if !self.decide(&mut op, id, now) {
            self.replication.ops.insert(id, op);
            self.end_op(id, Status::ServerUnavailable, 0, now);
            return Ok(());
        }
        self.replication.ops.insert(id, op);
        Ok(())
    }

    /// Sends an atomic to the deciding copy, then a READ of its word on the
    /// same link; false when no copy can decide it.
    pub(super) fn decide(&mut self, op: &mut Op, id: u64, now: Instant) -> bool {
        let region = op.region;
        let Some(atomic) = op.atomic.as_ref() else {
            return false;
        };
        let (head, client_key, at, number) = (
            atomic.head,
            atomic.client_key,
            atomic.at,
            atomic.client_number,
        );
        let decider = loop {
            let Some(copy) = self.deciding_copy(region) else {
                return false;
            };
            let links = self
                .region_state(region)
                .map(|s| s.copies[copy].links.clone())
                .unwrap_or_default();
            match self.write_link(&links) {
                Some(link) => break (copy, link),
                None => {
                    if !self.lose_copy(region, copy, "no link to its server is up", now) {
                        return false;
                    }
                }
            }
        };
        let (copy, link) = decider;
        let Some(server) = self.copy_server(region, copy) else {
            return false;
        };
        let key = self.copy_key(region, &server, client_key);
        let none = Arc::clone(&self.replication.no_payload);
        self.send_op_part(
            op,
            id,
            copy,
            link,
            head,
            Arc::clone(&none),
            key,
            Purpose::Decide,
            now,
        );
        let read = request::Repr {
            on_behalf: Some(number),
            ..request::Repr::read(Target::Region(at), key, 8)
        };
        let Some(read_head) = own_head(&read) else {
            return false;
        };
        self.send_op_part(
            op,
            id,
            copy,
            link,
            read_head,
            none,
            key,
            Purpose::ReadBack,
            now,
        );
        self.metrics.atomics_decided.inc();
        true
    }

    /// The decided word goes to every other copy that takes writes, as
    /// ATOMIC_WRITE under the client's identity; with an identity, it
    /// carries the atomic's record (operation, operands and the deciding
    /// copy's result), so a retry of the atomic that reaches one of those
    /// copies once it decides is answered from its window, not applied
    /// again.
    pub(super) fn apply_word(&mut self, op: &mut Op, id: u64, word: u64, now: Instant) {
        let region = op.region;
        let Some(atomic) = op.atomic.as_mut() else {
            return;
        };
        atomic.applying = true;
        atomic.word = Some(word);
        let (at, client_key, identity, number, persist) = (
            atomic.at,
            atomic.client_key,
            atomic.identity,
            atomic.client_number,
            atomic.persist,
        );
        let record: Option<Arc<[u8]>> = match (identity, atomic.decided) {
            (Some(_), Some((_, result))) => {
                let record = AtomicRecord::new(
                    atomic.operation.opcode(),
                    atomic.compare,
                    atomic.operand,
                    result,
                );
                Some(Arc::from(&record.to_bytes()[..]))
            }
            _ => None,
        };
        let decider = op
            .sends
            .iter()
            .find(|s| s.purpose == Purpose::Decide && s.answer.is_some())
            .map(|s| s.copy);
        if let Some(state) = self.region_state_mut(region) {
            for span in state.spans.iter_mut().filter(|s| s.op == id) {
                span.undecided = false;
            }
        }
        // No copy left to write to: the deciding copy has the word.
        let copies = self.reach_copies(region, now).unwrap_or_default();
        let none = Arc::clone(&self.replication.no_payload);
        for (copy, link) in copies {
            if Some(copy) == decider {
                continue;
            }
            let Some(server) = self.copy_server(region, copy) else {
                continue;
            };
            let key = self.copy_key(region, &server, client_key);
            let write = request::Repr {
                operation: Operation::AtomicWrite,
                length: 8,
                operand: word,
                exactly_once: identity,
                on_behalf: Some(number),
                persist,
                payload: record.as_deref().unwrap_or_default(),
                ..request::Repr::read(Target::Region(at), key, 0)
            };
            let Some(head) = own_head(&write) else {
                continue;
            };
            self.send_op_part(
                op,
                id,
                copy,
                link,
                head,
                record.clone().unwrap_or_else(|| Arc::clone(&none)),
                key,
                Purpose::ApplyWord,
                now,
            );
            self.metrics.atomics_applied.inc();
        }
    }
}
