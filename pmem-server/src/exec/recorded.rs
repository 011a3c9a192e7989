//! ATOMIC_WRITEs that carry the record of an atomic decided at another
//! copy of a replicated region (`proto::atomic_record`): the word is
//! stored and the atomic remembered in this copy's exactly-once window
//! under the client's identity, with the digest the deciding copy recorded
//! and the result it returned, so a retry of that COMPARE_SWAP or
//! FETCH_ADD reaching this copy is answered from the window. Only a
//! fabric device (or anyone on a server without authentication) sends one.

use proto::request;

use super::{Done, Executor, atomic_digest};
use crate::dedup::{Attempt, Dedup, Word};
use crate::gate::Session;
use crate::persist::PersistError;

impl Executor {
    /// Runs `req` when it is an ATOMIC_WRITE carrying a record (its word
    /// at `target`, made durable by `persist_word` when the request asks);
    /// `None` for any other request.
    pub(super) fn carry_record(
        &self,
        req: &request::Repr<'_>,
        target: Word<'_>,
        persist_word: impl FnOnce() -> Result<(), PersistError>,
    ) -> Option<Result<Done, proto::Status>> {
        let record = req.record()?;
        let id = req.exactly_once?;
        let digest = atomic_digest(
            record.operation.into(),
            target.region,
            target.offset,
            record.compare,
            record.operand,
        );
        let attempt = Attempt {
            client: id.client,
            seq: id.seq,
            digest,
        };
        let carried = self.dedup.carry(
            attempt,
            target,
            (req.operand, record.result),
            req.persist,
            persist_word,
        );
        Some(self.exactly_once_done(carried.map(|done| match done {
            // Too old for the window: the word is stored all the same.
            Dedup::Stale => Dedup::Applied(record.result),
            other => other,
        })))
    }
}

/// Why `req` carries what only a fabric device may send, if it does: an
/// ATOMIC_WRITE with the record of an atomic decided at another copy comes
/// from the device that had it decided (or anyone on a server without
/// authentication), never from a client, who could otherwise plant a
/// result for its own retry.
pub(super) fn record_from_client(
    session: &Session,
    req: &request::Repr<'_>,
) -> Option<&'static str> {
    (req.carries_record() && matches!(session, Session::ProvenClient { .. }))
        .then_some("record_from_client")
}
