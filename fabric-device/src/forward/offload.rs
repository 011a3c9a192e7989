//! Requests the server's RNIC executes: the core's decision that a request
//! forwarded on a link goes as one-sided RDMA on the link's queue pair
//! rather than to the server's CPU on its TCP connection, and the
//! completion of such a request turned into the client's answer.
//!
//! The driver reports a link's queue pair up ([`Forwarder::queue_pair_up`],
//! with the R_Keys and capabilities of the server's QP_ACCEPT) and down.
//! For a request on a link with a queue pair up, [`decide`] says which work
//! requests carry it, from the request's fields and what the core knows of
//! its region on the link's server (the key that server gave, the length);
//! the driver posts them as they are ([`Offload`]). The server never sees
//! the 64-bit region key on this path, so only a request with the key of
//! the region (or of the copy) on the link's server goes; other keys,
//! exactly-once atomics and what the RNIC would refuse go to the server's
//! CPU, which checks them. A completion comes back through
//! [`Forwarder::rdma_completed`] and is answered like the server's own
//! response.

use std::collections::HashMap;
use std::time::Instant;

use proto::frame;
use proto::qp::caps;
use proto::request::{self, Operation, flags};
use proto::response::{self, ResponseKind};
use proto::roce::rc::{RemoteAddr, WcStatus, WorkOp};
use proto::{AccessKey, Opcode, RegionIndex, RegionOffset, Status};

use super::links::{Answer, QueuePairKeys};
use super::{FORWARD_HEAD_LEN, Forwarder, LinkAction, REPLY_HEAD_LEN};
use crate::ids::LinkId;

/// Whether requests of a pool laid out as `layout` may go to verbs servers
/// as one-sided RDMA. Not in a pool with an allocator: there an extent
/// opens only with its own key and the allocator's records change only by
/// their owners, and both are checked by the server's CPU, while its RNIC
/// knows one key per region. Such a pool's requests go over the link's
/// control connection, where the server checks them as on TCP.
pub fn one_sided(layout: &topology::Layout) -> bool {
    layout.meta().is_none()
}

/// The fields of a request forwarded on a link that decide whether RDMA
/// carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestFields {
    /// The link-level tag.
    pub tag: u64,
    /// The operation.
    pub operation: Operation,
    /// Its flags as forwarded ([`flags`]).
    pub flags: u8,
    /// Where in the server's region it lands.
    pub at: RegionOffset,
    /// The key it carries.
    pub key: AccessKey,
    /// Its length field.
    pub length: u32,
    /// The atomic's operand.
    pub operand: u64,
    /// Bytes of write data that follow it.
    pub payload_len: usize,
}

impl RequestFields {
    /// The fields of client request `req` forwarded with link tag `tag` to
    /// `at` in its server's region (always region-addressed there).
    pub fn forwarded(req: &request::Repr<'_>, at: RegionOffset, tag: u64) -> Self {
        let mut flags = flags::REGION_ADDRESSED;
        if req.persist {
            flags |= flags::PERSIST;
        }
        if req.exactly_once.is_some() {
            flags |= flags::EXACTLY_ONCE;
        }
        RequestFields {
            tag,
            operation: req.operation,
            flags,
            at,
            key: req.key,
            length: req.length,
            operand: req.operand,
            payload_len: req.payload.len(),
        }
    }

    /// The fields of a head the core rewrote for a link (its own bytes:
    /// read in place, not checked again).
    pub(super) fn of_head(head: &[u8; FORWARD_HEAD_LEN], payload_len: usize) -> Option<Self> {
        let header = frame::Header::parse(head).ok()?;
        let body = request::Packet::new_unchecked(&head[frame::HEADER_LEN..]);
        Some(RequestFields {
            tag: header.tag,
            operation: Operation::from_opcode(header.opcode)?,
            flags: body.flags(),
            at: RegionOffset::new(RegionIndex(body.region()), body.addr()),
            key: AccessKey(body.key()),
            length: body.length(),
            operand: body.operand(),
            payload_len,
        })
    }
}

/// One work request of an [`Offload`], without the write data (the
/// request's payload, joined when posted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// RDMA READ of `len` bytes.
    Read {
        /// Where.
        remote: RemoteAddr,
        /// Bytes.
        len: u32,
    },
    /// RDMA WRITE of the request's payload.
    Write {
        /// Where.
        remote: RemoteAddr,
    },
    /// ATOMIC_WRITE of 8 bytes.
    AtomicWrite {
        /// Where (8-aligned).
        remote: RemoteAddr,
        /// The value, stored little-endian.
        value: u64,
    },
    /// FLUSH of `len` bytes to persistence.
    Flush {
        /// Where.
        remote: RemoteAddr,
        /// Bytes.
        len: u32,
    },
}

impl Step {
    /// The work request, with `payload` as a WRITE's data.
    pub fn work_op(self, payload: &[u8]) -> WorkOp {
        match self {
            Step::Read { remote, len } => WorkOp::Read { remote, len },
            Step::Write { remote } => WorkOp::Write {
                remote,
                data: payload.to_vec(),
                imm: None,
            },
            Step::AtomicWrite { remote, value } => WorkOp::AtomicWrite {
                remote,
                value: value.to_le_bytes(),
            },
            Step::Flush { remote, len } => WorkOp::persist(remote, len),
        }
    }
}

/// A request carried by RDMA: its tag and its one or two work requests,
/// posted in order; the answer goes with the last to complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offload {
    /// The link-level tag, which [`Forwarder::rdma_completed`] is given
    /// back.
    pub tag: u64,
    /// The work request that does it.
    pub first: Step,
    /// What makes it durable, for a persistent one.
    pub then: Option<Step>,
}

impl Offload {
    /// Its work requests, in posting order.
    pub fn steps(&self) -> impl Iterator<Item = Step> + '_ {
        std::iter::once(self.first).chain(self.then)
    }

    /// How many work requests it takes.
    pub fn parts(&self) -> usize {
        1 + usize::from(self.then.is_some())
    }
}

/// How RDMA carries `req` to a region whose key on the link's server is
/// `region_key` and whose length is `region_len`, registered there under
/// `rkey`, on a queue pair that can do `caps`; `None` when the server's CPU
/// must take it.
///
/// Only what the server's RNIC will take goes to it: a refusal (a NAK)
/// would put the queue pair in the error state and reconnect the link
/// under every other client's requests on it.
pub fn decide(
    req: &RequestFields,
    region_key: AccessKey,
    region_len: u64,
    rkey: u32,
    caps: u64,
) -> Option<Offload> {
    if req.flags & (flags::EXACTLY_ONCE | flags::REGION_ADDRESSED) != flags::REGION_ADDRESSED {
        // Exactly-once atomics: the server keeps their window.
        return None;
    }
    let offset = req.at.offset;
    let len = u64::from(req.operation.span_len(req.length));
    let fits = offset.checked_add(len).is_some_and(|end| end <= region_len);
    let aligned = !req.operation.is_atomic() || offset.is_multiple_of(8);
    if region_key != req.key || region_key.is_none() || !fits || !aligned {
        return None;
    }
    let remote = RemoteAddr { va: offset, rkey };
    // How to make `len` bytes at `remote` durable after what precedes.
    let persist = |len: u32| -> Step {
        let len = len.max(1);
        if caps & caps::FLUSH_PERSISTENT != 0 {
            Step::Flush { remote, len }
        } else {
            // APM: a READ is answered only once the writes before it on
            // this queue pair are placed.
            Step::Read {
                remote: RemoteAddr {
                    va: offset + u64::from(len) - 1,
                    rkey,
                },
                len: 1,
            }
        }
    };
    let persistent = req.flags & flags::PERSIST != 0;
    let (first, then) = match req.operation {
        Operation::Read => (
            Step::Read {
                remote,
                len: req.length,
            },
            None,
        ),
        Operation::Write | Operation::WritePersist if req.payload_len != req.length as usize => {
            return None;
        }
        Operation::Write if !persistent => (Step::Write { remote }, None),
        Operation::Write | Operation::WritePersist => {
            (Step::Write { remote }, Some(persist(req.length)))
        }
        Operation::Flush => (persist(req.length), None),
        Operation::AtomicWrite if caps & caps::ATOMIC_WRITE != 0 => (
            Step::AtomicWrite {
                remote,
                value: req.operand,
            },
            persistent.then(|| persist(8)),
        ),
        _ => return None,
    };
    Some(Offload {
        tag: req.tag,
        first,
        then,
    })
}

/// The status a failed work request answers its request with: the RNIC's
/// refusals as the server's CPU would have refused them, anything else an
/// I/O error.
pub fn failure_status(status: WcStatus) -> Status {
    match status {
        WcStatus::RemoteAccessError => Status::OutOfBounds,
        WcStatus::RemoteInvalidRequest => Status::BadRequest,
        _ => Status::IoError,
    }
}

/// The response head a request of `opcode` tagged `tag` is answered with
/// when its work requests ended with `outcome` (`Ok` with a READ's data).
fn response_head(
    opcode: Opcode,
    tag: u64,
    outcome: &Result<&[u8], WcStatus>,
) -> [u8; REPLY_HEAD_LEN] {
    let data_len = match outcome {
        Ok(data) if opcode == Opcode::Read => data.len(),
        Ok(_) => 0,
        Err(status) => return proto::error_reply(opcode, tag, failure_status(*status)),
    };
    let kind = ResponseKind::answering(opcode);
    let mut head = [0u8; REPLY_HEAD_LEN];
    let (frame_head, body) = head.split_at_mut(frame::HEADER_LEN);
    frame::Header {
        opcode: kind.opcode(),
        body_len: (response::HEADER_LEN + data_len) as u32,
        tag,
    }
    .emit(&mut frame::Packet::new_unchecked(frame_head));
    response::Repr {
        kind,
        status: Status::Ok,
        value: 0,
        payload: &[],
    }
    .emit(&mut response::Packet::new_unchecked(body));
    head
}

impl Forwarder {
    /// `link`'s RDMA queue pair toward its server is up, with the R_Key of
    /// each region the server registered (`rkeys`, by region index) and
    /// what its queue pair can do (`caps`): from now on the core says which
    /// requests on `link` go as RDMA.
    pub fn queue_pair_up(&mut self, link: LinkId, rkeys: HashMap<u32, u32>, caps: u64) {
        if let Some(link) = self.links.get_mut(&link) {
            link.queue_pair = Some(Box::new(QueuePairKeys { rkeys, caps }));
        }
    }

    /// `link`'s queue pair is gone (refused, broken or closed): its
    /// requests go on its TCP connection again.
    pub fn queue_pair_down(&mut self, link: LinkId) {
        if let Some(link) = self.links.get_mut(&link) {
            link.queue_pair = None;
        }
    }

    /// Whether `link` has a queue pair up.
    pub(super) fn has_queue_pair(&self, link: LinkId) -> bool {
        self.links
            .get(&link)
            .is_some_and(|l| l.queue_pair.is_some())
    }

    /// How RDMA carries `req` on `link_id`, if the link has a queue pair up
    /// and the pool, the region and the request allow it ([`decide`]).
    pub(super) fn offload(&self, link_id: LinkId, req: &RequestFields) -> Option<Offload> {
        let link = self.links.get(&link_id)?;
        let qp = link.queue_pair.as_deref()?;
        if !one_sided(&self.map.layout) {
            return None;
        }
        let region = req.at.region;
        let entry = self.map.layout.entry(region)?;
        // A copy of a replicated region has the key its own server gave;
        // a single-copy region the one its owner gave.
        let key = self
            .copy_key_on(region.0, &link.target.server)
            .or((entry.server == link.target.server).then_some(entry.key))?;
        let &rkey = qp.rkeys.get(&region.0)?;
        decide(req, key, entry.len, rkey, qp.caps)
    }

    /// The work requests of the request tagged `tag` on `link` completed
    /// (`Ok`, with a READ's data) or failed with `outcome`'s status: its
    /// answer, as if the server had sent it. A remote access error answers
    /// OUT_OF_BOUNDS, an invalid request BAD_REQUEST, anything else
    /// IO_ERROR.
    pub fn rdma_completed<'a>(
        &mut self,
        link: LinkId,
        tag: u64,
        outcome: Result<&'a [u8], WcStatus>,
        now: Instant,
    ) -> LinkAction<'a> {
        let Some(pending) = self.links.get(&link).and_then(|l| l.pending.get(&tag)) else {
            // Answered already (timed out); nobody waits for it.
            return LinkAction::Nothing;
        };
        let opcode = pending.opcode;
        let data = match outcome {
            Ok(data) if opcode == Opcode::Read => data,
            _ => &[],
        };
        let answer = Answer {
            tag,
            head: response_head(opcode, tag, &outcome),
            payload: data,
            whole: None,
        };
        self.link_response(link, answer, now)
    }
}
