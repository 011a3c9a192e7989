//! What a request sent to one copy of a replicated region is part of, as
//! the link that carries it remembers it: a leaf shared by the links, their
//! timeouts and the replication code.

use proto::AccessKey;

use super::FORWARD_HEAD_LEN;

/// What a request to one copy is part of.
#[derive(Debug)]
pub(super) enum CopyTicket {
    /// Replicated operation number `0`.
    Op(u64),
    /// A read of one copy, sent again to another if that copy fails.
    Read(Box<ReadAgain>),
    /// A request of the owner's own resync of a syncing copy.
    Resync(ResyncTicket),
}

/// A request a resync sent to one copy, as its link remembers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ResyncTicket {
    /// The resync it belongs to (an answer to one that ended is dropped).
    pub(super) sync: u64,
    /// What it asked.
    pub(super) part: ResyncPart,
    /// How many times a server refused this part (for a block: its READ
    /// or its WRITE) STALE_MAP at an epoch no newer than the one it was
    /// sent under.
    pub(super) stale_refusals: u32,
    /// The map epoch this device ran when the part went (set as it goes).
    pub(super) sent_under: u64,
}

impl ResyncTicket {
    /// Part `part` of resync `sync`, refused STALE_MAP `stale_refusals`
    /// times before.
    pub(super) fn new(sync: u64, part: ResyncPart, stale_refusals: u32) -> Self {
        Self {
            sync,
            part,
            stale_refusals,
            sent_under: 0,
        }
    }
}

/// What a resync asked a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ResyncPart {
    /// The checksums of the run from block `first`, of the deciding copy
    /// or of the syncing one.
    Sums {
        /// The first block of the run.
        first: u64,
        /// Asked of the syncing copy (else of the deciding one).
        syncing: bool,
    },
    /// The bytes `start..end` of the deciding copy, held meanwhile.
    Read {
        /// First byte of the block.
        start: u64,
        /// Past its last byte.
        end: u64,
    },
    /// The block `start..end` written to the syncing copy.
    Write {
        /// First byte of the block.
        start: u64,
        /// Past its last byte.
        end: u64,
    },
    /// The record of an atomic the syncing copy missed, written to it:
    /// the resync's record number `index`.
    Record {
        /// Its place among the records the resync carries.
        index: usize,
    },
}

/// What a read of a copy needs to be sent to another copy.
#[derive(Debug)]
pub(super) struct ReadAgain {
    /// The rewritten head.
    pub(super) head: [u8; FORWARD_HEAD_LEN],
    /// The key the client sent.
    pub(super) client_key: AccessKey,
    pub(super) region: u32,
    pub(super) copy: usize,
    pub(super) start: u64,
    pub(super) end: u64,
    /// How many times a copy answered it STALE_MAP.
    pub(super) stale_refusals: u32,
}
