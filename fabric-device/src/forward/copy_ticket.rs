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
}
