//! Exactly-once records a copy missed, carried to it by its resync.
//!
//! A copy that is `offline` gets no ATOMIC_WRITE, so no record of the
//! atomics decided meanwhile; a resync that copied only its blocks would
//! leave its exactly-once window without them, and once that copy decides
//! for the region (the deciding copy died), a client's retry of such an
//! atomic would be applied a second time. So the owner keeps, per region,
//! the records of the atomics it decided while some copy did not serve
//! (identity, word, operation, operands and result), and a resync first
//! sends each one to the syncing copy as an ATOMIC_WRITE carrying the
//! record (the same request the copy would have had), on the copy's write
//! link before the resync's first BLOCK_SUMS. The word it stores may be
//! older than the deciding copy's by then; the resync's walk, which
//! follows on the same link, finds that block different and copies it,
//! and the copy serves only after a pass that found nothing to copy. The
//! records are forgotten once every copy of the region serves.
//!
//! Bounded: at most [`MISSED_MAX`] records per region (the oldest go
//! first, said once in the log). What the owner did not decide itself (a
//! previous owner's atomics, or its own before a restart) it cannot carry.

use proto::atomic_record::{AtomicRecord, RECORD_LEN};

use super::*;

/// Records kept per region while one of its copies does not serve.
pub(super) const MISSED_MAX: usize = 1 << 16;

/// One atomic's record, as a copy that missed it is to get it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Missed {
    identity: ExactlyOnce,
    client_number: u32,
    offset: u64,
    /// The word the atomic left.
    word: u64,
    record: [u8; RECORD_LEN],
}

/// A region's records kept for copies that do not serve.
#[derive(Debug, Default)]
pub(super) struct MissedRecords {
    records: VecDeque<Missed>,
    /// The bound was reached (said once).
    capped: bool,
}

impl Forwarder {
    /// Operation `op` of `region` is answered: a decided atomic with an
    /// identity is kept while some copy of the region does not serve.
    pub(super) fn note_missed(&mut self, op: &Op) {
        let Some(atomic) = op.atomic.as_ref() else {
            return;
        };
        let (Some(identity), Some((Status::Ok, result)), Some(word)) =
            (atomic.identity, atomic.decided, atomic.word)
        else {
            return;
        };
        let Some(state) = self.region_state_mut(op.region) else {
            return;
        };
        if state
            .copies
            .iter()
            .all(|c| c.state == ReplicaState::Serving)
        {
            return;
        }
        let record = AtomicRecord::new(
            atomic.operation.opcode(),
            atomic.compare,
            atomic.operand,
            result,
        );
        let missed = &mut state.missed;
        if missed.records.len() >= MISSED_MAX {
            missed.records.pop_front();
            if !missed.capped {
                missed.capped = true;
                tracing::warn!(
                    "region {}: more than {MISSED_MAX} atomics decided while a copy does not \
                     serve; the oldest records are no longer kept for it (a retry of one of \
                     those could apply again at that copy once it decides)",
                    state.id
                );
            }
        }
        missed.records.push_back(Missed {
            identity,
            client_number: atomic.client_number,
            offset: atomic.at.offset,
            word,
            record: record.to_bytes(),
        });
    }

    /// Forgets `region`'s kept records once every copy of it serves.
    pub(super) fn forget_missed_if_all_serve(&mut self, region: u32) {
        if let Some(state) = self.region_state_mut(region)
            && state
                .copies
                .iter()
                .all(|c| c.state == ReplicaState::Serving)
        {
            state.missed = MissedRecords::default();
        }
    }

    /// `region`'s kept records, oldest first, as a resync carries them.
    pub(super) fn missed_records(&self, region: u32) -> Vec<Missed> {
        self.region_state(region)
            .map(|s| s.missed.records.iter().copied().collect())
            .unwrap_or_default()
    }
}

impl Missed {
    /// The ATOMIC_WRITE carrying this record that a copy of `region` which
    /// missed the atomic gets, under the client's identity, with the
    /// copy's `key`.
    pub(super) fn request(&self, region: u32, key: AccessKey) -> request::Repr<'_> {
        let target = Target::Region(RegionOffset {
            region: RegionIndex(region),
            offset: self.offset,
        });
        request::Repr {
            exactly_once: Some(self.identity),
            on_behalf: Some(self.client_number),
            persist: true,
            ..request::Repr::atomic_write(target, key, self.word).recording(&self.record)
        }
    }
}
