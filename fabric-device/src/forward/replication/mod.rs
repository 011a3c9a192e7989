//! Replicated regions in the forwarding core: the owner device orders every
//! request of a region with several copies.
//!
//! - Writes, WRITE_PERSIST, FLUSH and ATOMIC_WRITE go to every copy that
//!   takes writes (`serving` or `syncing`), each over one link per copy
//!   (FIFO per link: every copy applies them in the owner's order); the
//!   client is answered once every such copy answered, with the answer of
//!   the deciding copy (the first `serving` one in set order).
//! - COMPARE_SWAP and FETCH_ADD are decided at the deciding copy alone,
//!   followed on the same link by a READ of the word (so the word written to
//!   the others is the one stored, even when the deciding copy answered a
//!   retry from its exactly-once window); the word then goes to every other
//!   copy as ATOMIC_WRITE under the client's identity. Until the word is
//!   queued for the others, requests overlapping it wait here, in order.
//! - READ goes to a `serving` copy (same socket first, then the link with
//!   the fewest requests pending in steps of a batch, then set order: one
//!   copy takes reads until it has a batch pending); a read overlapping a
//!   mutation in flight goes to the deciding copy, behind the mutation on
//!   the same link.
//! - A copy whose server answers STALE_MAP (it runs a newer map than the
//!   one this device said on the link, or lacks the region of a newer
//!   one) did not apply anything and is not lost: that part of the
//!   request goes again, with the same identity and in its order on the
//!   link, once the server has confirmed it runs this device's epoch
//!   (`stale`); overlapping requests wait until then.
//! - A copy that fails (its links down, a request timed out, an answer that
//!   disagrees with the other copies') stops being used; its loss is
//!   reported ([`Outgoing::CopyLost`]) and the answers that waited on it
//!   are held until the driver confirms it ([`Forwarder::copy_marked`]).
//!   The last `serving` copy is never dropped: its failures fail requests.
//! - A device that does not own a region answers its requests NOT_OWNER and
//!   reports the owner suspected; a device that becomes an owner waits for
//!   its copies' servers to run the new map first (`takeover`).
//!
//! Everything for a replicated region goes out through the outbox
//! ([`Forwarder::swap_outbox`]). The driver sends each link's requests in
//! order: on the link's RDMA queue pair (a server on verbs) what it can
//! carry, on its TCP connection the rest, including what is marked for the
//! server's CPU (an atomic and the READ of its word, the resync's requests).
//! A device that is not a region's owner answers its requests NOT_OWNER.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use control::ReplicaState;
use proto::request::{self, ExactlyOnce, Operation, Target};
use proto::{AccessKey, Message, Opcode, RegionIndex, RegionOffset, Status, response};
use topology::{RegionId, ServerId};

use super::links::{Pending, is_pending};
use super::offload::{Offload, RequestFields};
use super::routing::{BULK_MIN_BYTES, Located, Routed, rewrite_head};
use super::{
    ClientAction, ConnId, FORWARD_HEAD_LEN, Forwarder, LinkStatus, REPLY_HEAD_LEN, Reply,
    error_reply,
};
use crate::deadline::Deadline;
use crate::housekeeping::Gate;
use crate::idmap::IdMap;
use crate::ids::{LinkClass, LinkId};
use crate::link_tags::CONTROL_TAG;

pub(super) use super::copy_ticket::{CopyTicket, ReadAgain, ResyncPart, ResyncTicket};

mod answers;
mod atomics;
mod failures;
mod housekeeping;
mod missed;
mod reads;
mod requests;
mod resync;
mod resync_holds;
mod stale;
mod takeover;

#[cfg(test)]
pub(super) use reads::READ_SPREAD;
use reads::ReadVia;
#[cfg(test)]
pub(super) use resync::RECORDS_IN_FLIGHT;
#[cfg(test)]
pub(super) use stale::STALE_RESENDS;
pub use takeover::{HeardSince, OwnedRegion};
#[cfg(test)]
pub(super) use takeover::{RESAY_EVERY, SUSPECT_EVERY};

/// Something the core asks the driver to do for a replicated region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outgoing {
    /// Send `head` then `payload` to the copy `link` reaches, after every
    /// request sent on `link` before it: on the link's RDMA queue pair when
    /// it can carry it, else on its TCP connection.
    Send {
        /// The link.
        link: LinkId,
        /// The request's frame and request header, rewritten for the copy.
        head: [u8; FORWARD_HEAD_LEN],
        /// The write data (empty for other operations), shared by copies.
        payload: Arc<[u8]>,
        /// The server's CPU must execute it (TCP), even where RDMA could
        /// carry it: the READ of an atomic's word follows the atomic on the
        /// connection the server executes in order.
        cpu: bool,
        /// The work requests that carry it on the link's RDMA queue pair,
        /// when RDMA may (never for `cpu`).
        rdma: Option<Offload>,
    },
    /// Send this answer to client connection `conn`.
    Answer {
        /// The client connection.
        conn: ConnId,
        /// The answer.
        reply: Reply,
    },
    /// The copy of `region` on `server` is no longer used: record it
    /// `offline` (in etcd, when the map lives there), then confirm with
    /// [`Forwarder::copy_marked`]; answers that waited on it are held
    /// until then.
    CopyLost {
        /// The region's index.
        region: RegionIndex,
        /// The region's id.
        region_id: RegionId,
        /// The server holding the copy.
        server: ServerId,
    },
    /// Send this whole frame on `link`'s TCP connection (a resync's own
    /// requests).
    SendFrame {
        /// The link.
        link: LinkId,
        /// The frame.
        frame: Vec<u8>,
    },
    /// Mark the copy of `region` on `server` with `state` (in etcd, when
    /// the map lives there), then confirm with
    /// [`Forwarder::copy_state_marked`].
    MarkCopy {
        /// The region's index.
        region: RegionIndex,
        /// The region's id.
        region_id: RegionId,
        /// The server holding the copy.
        server: ServerId,
        /// `syncing` (its server is back) or `serving` (it is up to date).
        state: ReplicaState,
    },
    /// A client sent this device a request for a region `owner` orders:
    /// probe the owner and, when it is dead and this device is next in
    /// turn, take its regions over in the map.
    OwnerSuspected {
        /// The region's owner by this device's map.
        owner: topology::FabricDeviceId,
    },
}

/// The replication state of the core.
#[derive(Debug, Default)]
pub(super) struct Replication {
    /// By region index; `None` for single-copy regions.
    regions: Vec<Option<RegionState>>,
    ops: IdMap<u64, Op>,
    next_op: u64,
    outbox: Vec<Outgoing>,
    /// Each copy's region key, learnt from its own server.
    keys: HashMap<(u32, ServerId), AccessKey>,
    /// The empty payload of the requests without data (reads, atomics),
    /// shared so that sending one allocates nothing.
    no_payload: Arc<[u8]>,
    /// The owner's resyncs of syncing copies.
    resyncs: resync::Resyncs,
    /// Suspected owners and the epochs servers confirmed.
    takeovers: takeover::Takeovers,
    /// Parts of requests refused STALE_MAP, waiting to go again.
    stale: stale::StaleParts,
    /// The order in which parts were put on links (for resending in it).
    next_send: u64,
    /// Boxes of answered reads, reused by the next reads: the boxes
    /// themselves are what is kept, so that a read allocates none.
    #[allow(clippy::vec_box)]
    spare_reads: Vec<Box<ReadAgain>>,
    /// When [`Forwarder::replication_turn`] has resyncs to move on or
    /// MAP_EPOCH to say again.
    housekeeping: Gate,
}

/// One replicated region as its owner (or another device) sees it.
#[derive(Debug)]
struct RegionState {
    id: RegionId,
    owner: bool,
    version: u64,
    copies: Vec<CopyState>,
    /// Ranges with a mutation in flight, by operation.
    spans: Vec<Span>,
    /// Requests waiting for an atomic's word to be decided, in arrival order.
    queued: VecDeque<Queued>,
    /// Ranges a resync is copying from the deciding copy to a syncing one:
    /// overlapping requests wait, as behind an undecided atomic.
    held: Vec<(u64, u64)>,
    /// A new owner's wait for its copies' servers to run its map.
    fence: takeover::Fence,
    /// Records of atomics decided while some copy did not serve, for its
    /// resync.
    missed: missed::MissedRecords,
}

impl RegionState {
    /// Whether a request on `start..end` must wait: it overlaps an
    /// undecided atomic, a mutation with a part to send again (or sent
    /// under an older epoch and not answered yet), or a range a resync
    /// holds, or the region's new owner waits for its copies' servers.
    fn holds(&self, start: u64, end: u64) -> bool {
        self.fence.waiting()
            || self
                .spans
                .iter()
                .any(|s| (s.undecided || s.behind) && s.overlaps(start, end))
            || self.held.iter().any(|&(s, e)| s < end && start < e)
    }

    /// Whether a mutation overlapping `start..end` has a part to send again
    /// after STALE_MAP, or one sent under an older epoch not answered yet.
    fn behind_over(&self, start: u64, end: u64) -> bool {
        self.spans
            .iter()
            .any(|s| s.behind && s.overlaps(start, end))
    }
}

#[derive(Debug)]
struct CopyState {
    server: ServerId,
    /// Positions in the map's links reaching the copy's server.
    links: Vec<usize>,
    state: ReplicaState,
    /// Lost by this device; the driver has not confirmed it yet.
    unconfirmed: bool,
    /// The record version at which this device lost the copy: a map still
    /// at that version keeps it offline (a topology file never changes it).
    lost_at: Option<u64>,
}

impl CopyState {
    fn takes_writes(&self) -> bool {
        matches!(self.state, ReplicaState::Serving | ReplicaState::Syncing)
    }
}

#[derive(Debug, Clone, Copy)]
struct Span {
    op: u64,
    start: u64,
    end: u64,
    /// An atomic whose word is not decided (or not queued to the other
    /// copies) yet: overlapping requests wait.
    undecided: bool,
    /// A part of the operation waits to be sent again after STALE_MAP, or
    /// was sent under an older epoch than the device's and may come back
    /// STALE_MAP: overlapping requests wait, so that on every copy's link
    /// they go after it.
    behind: bool,
}

impl Span {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start < end && start < self.end
    }
}

#[derive(Debug)]
struct Queued {
    conn: ConnId,
    frame: Vec<u8>,
    start: u64,
    end: u64,
}

/// A client's request to a replicated region, until it is answered.
#[derive(Debug)]
struct Op {
    conn: ConnId,
    client_tag: u64,
    opcode: Opcode,
    region: u32,
    sends: Vec<CopySend>,
    /// Copies lost while this operation waited on them.
    lost: Vec<usize>,
    atomic: Option<Atomic>,
}

#[derive(Debug)]
struct CopySend {
    copy: usize,
    link: LinkId,
    tag: u64,
    purpose: Purpose,
    answer: Option<(Status, u64)>,
    /// The copy was lost before it answered.
    dropped: bool,
    /// The request as it went (its tag is set again when it goes again).
    head: [u8; FORWARD_HEAD_LEN],
    payload: Arc<[u8]>,
    key: AccessKey,
    /// The device's epoch when it last went.
    epoch: u64,
    /// Its place among every part put on a link.
    order: u64,
    /// STALE_MAP answers so far.
    stale_answers: u32,
    /// Refused STALE_MAP and not sent again yet.
    waiting: Option<stale::Waiting>,
}

impl CopySend {
    fn settled(&self) -> bool {
        self.answer.is_some() || self.dropped
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// A client's mutation, sent to every copy.
    Mutation,
    /// An atomic, at the deciding copy.
    Decide,
    /// The word read after the atomic, at the deciding copy.
    ReadBack,
    /// The decided word, written to another copy.
    ApplyWord,
}

impl Purpose {
    /// Whether the part must reach the server's CPU (its TCP connection)
    /// even where the link's queue pair could carry it: the atomic and the
    /// READ of its word, one behind the other.
    fn for_cpu(self) -> bool {
        matches!(self, Purpose::Decide | Purpose::ReadBack)
    }
}

/// A COMPARE_SWAP or FETCH_ADD on its way.
#[derive(Debug)]
struct Atomic {
    /// The client's request rewritten for a link, with the client's key.
    head: [u8; FORWARD_HEAD_LEN],
    operation: Operation,
    operand: u64,
    compare: u64,
    identity: Option<ExactlyOnce>,
    persist: bool,
    client_key: AccessKey,
    client_number: u32,
    at: RegionOffset,
    /// The deciding copy's answer: status and the word before.
    decided: Option<(Status, u64)>,
    /// The word it left, written to the other copies.
    word: Option<u64>,
    /// The word is queued to the other copies.
    applying: bool,
}

impl Atomic {
    /// The word stored after the atomic, from the word before.
    fn word_after(&self, old: u64) -> u64 {
        match self.operation {
            Operation::CompareSwap if old == self.compare => self.operand,
            Operation::FetchAdd => old.wrapping_add(self.operand),
            Operation::AtomicWrite => self.operand,
            _ => old,
        }
    }
}

impl Forwarder {
    /// What the driver is to do for replicated regions since the last call:
    /// sends, answers and lost copies, in order.
    #[cfg(test)]
    pub fn take_outbox(&mut self) -> Vec<Outgoing> {
        std::mem::take(&mut self.replication.outbox)
    }

    /// What the driver is to do for replicated regions since the last call
    /// (sends, answers and lost copies, in order), into `out`, which must
    /// be empty and becomes the core's next outbox: the two trade their
    /// allocations.
    pub fn swap_outbox(&mut self, out: &mut Vec<Outgoing>) {
        debug_assert!(out.is_empty(), "an outbox not carried out");
        std::mem::swap(&mut self.replication.outbox, out);
    }

    /// The loss of `region`'s copy on `server` is recorded (or cannot be,
    /// and the device goes on without it): answers held for it go out.
    pub fn copy_marked(&mut self, region: RegionIndex, server: &ServerId, now: Instant) {
        self.replication_changed();
        let Some(state) = self.region_state_mut(region.0) else {
            return;
        };
        for copy in &mut state.copies {
            if &copy.server == server {
                copy.unconfirmed = false;
            }
        }
        self.progress_region(region.0, now);
    }

    /// Builds the replication state from the map, keeping what is in
    /// flight and the copies this device lost while the map's record has
    /// not moved past the version it lost them at. Requests queued for a
    /// region the map gives to another owner are answered NOT_OWNER.
    pub(super) fn replication_from_map(&mut self) {
        self.replication_changed();
        let servers_before = self.copy_servers();
        let mut old = std::mem::take(&mut self.replication.regions);
        let device = self.map.device.clone();
        let mut deposed = Vec::new();
        self.replication.regions = self
            .map
            .layout
            .entries()
            .iter()
            .zip(&self.map.replica_sets)
            .map(|(entry, set)| {
                let set = set.as_ref()?;
                let before = old
                    .get_mut(entry.region.0 as usize)
                    .and_then(Option::take)
                    .filter(|b| b.id == entry.region_id);
                let copies = set
                    .copies
                    .iter()
                    .map(|spec| {
                        let was = before
                            .as_ref()
                            .and_then(|b| b.copies.iter().find(|c| c.server == spec.server));
                        let kept_lost = was.and_then(|c| c.lost_at).filter(|&at| at == set.version);
                        CopyState {
                            server: spec.server.clone(),
                            links: spec.links.clone(),
                            state: match kept_lost {
                                Some(_) => ReplicaState::Offline,
                                None => spec.state,
                            },
                            unconfirmed: was.is_some_and(|c| c.unconfirmed),
                            lost_at: kept_lost,
                        }
                    })
                    .collect();
                let owner = set.owner == device;
                let fence =
                    takeover::Fence::after_map(before.as_ref().map(|b| (b.owner, b.fence)), owner);
                let (spans, mut queued, held, missed) = before
                    .map(|b| (b.spans, b.queued, b.held, b.missed))
                    .unwrap_or_default();
                if !owner {
                    deposed.extend(queued.drain(..));
                }
                Some(RegionState {
                    id: entry.region_id.clone(),
                    owner,
                    version: set.version,
                    copies,
                    spans,
                    queued,
                    held,
                    fence,
                    missed,
                })
            })
            .collect();
        self.follow_copies(&servers_before);
        self.answer_deposed(deposed);
    }

    /// Where each region's copies are, by region index: a replicated
    /// region's copies' servers in set order, another region's server.
    fn copy_servers(&self) -> Vec<Option<Vec<ServerId>>> {
        let mut servers: Vec<Option<Vec<ServerId>>> = self
            .replication
            .regions
            .iter()
            .map(|r| {
                r.as_ref()
                    .map(|s| s.copies.iter().map(|c| c.server.clone()).collect())
            })
            .collect();
        for entry in self.map.layout.entries() {
            let index = entry.region.0 as usize;
            if servers.len() <= index {
                servers.resize(index + 1, None);
            }
            if servers[index].is_none() {
                servers[index] = Some(vec![entry.server.clone()]);
            }
        }
        servers
    }

    /// A copy is its position in the set, and a map that adds or drops a
    /// copy (or makes the region a single copy again) moves the others: the
    /// operations in flight follow their copies by server (`before` is
    /// [`Self::copy_servers`] under the old map). A part sent to a copy the
    /// region no longer has is settled as dropped: its answer, or its
    /// link's failure, no longer concerns the region (and must not be taken
    /// for another copy's).
    fn follow_copies(&mut self, before: &[Option<Vec<ServerId>>]) {
        let after = self.copy_servers();
        if before == after.as_slice() {
            return;
        }
        for op in self.replication.ops.values_mut() {
            let r = op.region as usize;
            let (Some(Some(was)), Some(Some(now))) = (before.get(r), after.get(r)) else {
                continue;
            };
            if was == now {
                continue;
            }
            let moved = |copy: usize| {
                let server = was.get(copy)?;
                now.iter().position(|s| s == server)
            };
            for send in &mut op.sends {
                match moved(send.copy) {
                    Some(copy) => send.copy = copy,
                    None => {
                        send.copy = usize::MAX;
                        send.dropped = true;
                    }
                }
            }
            op.lost = op.lost.iter().filter_map(|&copy| moved(copy)).collect();
        }
    }

    /// Records the key `server` gives for its copy of a replicated region.
    pub(super) fn learn_copy_key(&mut self, region: u32, server: &ServerId, key: AccessKey) {
        let holds = self
            .region_state(region)
            .is_some_and(|s| s.copies.iter().any(|c| &c.server == server));
        if holds {
            self.replication.keys.insert((region, server.clone()), key);
        }
    }

    /// The key `server` gave for its copy of replicated `region`.
    pub(in crate::forward) fn copy_key_on(
        &self,
        region: u32,
        server: &ServerId,
    ) -> Option<AccessKey> {
        // A few entries (one per copy of each replicated region): compared
        // in place rather than hashed under a cloned server id, since every
        // request to a copy asks.
        self.replication
            .keys
            .iter()
            .find(|((r, s), _)| *r == region && s == server)
            .map(|(_, &key)| key)
    }

    /// Whether the request tagged `tag` on `link` still waits for its
    /// answer (neither answered nor failed).
    pub fn awaits_answer(&self, link: LinkId, tag: u64) -> bool {
        self.links
            .get(&link)
            .is_some_and(|l| l.pending.contains_key(&tag))
    }

    /// Whether some copy of replicated `region` that takes writes is
    /// reached only by links still on their first attempt; `None` for a
    /// single-copy region.
    pub(super) fn copies_starting(&self, region: u32) -> Option<bool> {
        let state = self.region_state(region)?;
        if self.links_starting == 0 {
            // Every link's first attempt ended: asked of every request.
            return Some(false);
        }
        Some(state.copies.iter().filter(|c| c.takes_writes()).any(|c| {
            !c.links.is_empty()
                && c.links.iter().all(|&i| {
                    self.links
                        .get(&self.link_ids[i].main)
                        .is_some_and(|l| l.starting && l.status != LinkStatus::Up)
                })
        }))
    }

    /// Replicated operations and queued requests not answered yet.
    pub(super) fn replicated_in_flight(&self) -> usize {
        self.replication.ops.len()
            + self
                .replication
                .regions
                .iter()
                .flatten()
                .map(|r| r.queued.len())
                .sum::<usize>()
    }

    /// Drops what a closed client connection had queued.
    pub(super) fn replication_client_closed(&mut self, conn: ConnId) {
        for state in self.replication.regions.iter_mut().flatten() {
            state.queued.retain(|q| q.conn != conn);
        }
    }

    fn region_state(&self, region: u32) -> Option<&RegionState> {
        self.replication.regions.get(region as usize)?.as_ref()
    }

    fn region_state_mut(&mut self, region: u32) -> Option<&mut RegionState> {
        self.replication.regions.get_mut(region as usize)?.as_mut()
    }

    /// The main-lane link of a copy that is up, on the copy's socket first:
    /// one connection per copy, so its requests keep their order.
    fn write_link(&self, positions: &[usize]) -> Option<LinkId> {
        positions.iter().map(|&i| self.link_ids[i].main).find(|id| {
            self.links
                .get(id)
                .is_some_and(|l| l.status == LinkStatus::Up)
        })
    }

    /// Every copy of `region` that takes writes, with its link; a copy
    /// without a link up is lost on the way. Fails when the last serving
    /// copy has no link.
    fn reach_copies(&mut self, region: u32, now: Instant) -> Result<Vec<(usize, LinkId)>, Status> {
        loop {
            let state = self.region_state(region).ok_or(Status::Unmapped)?;
            let mut reached = Vec::new();
            let mut unreachable = None;
            for (i, copy) in state.copies.iter().enumerate() {
                if !copy.takes_writes() {
                    continue;
                }
                match self.write_link(&copy.links) {
                    Some(link) => reached.push((i, link)),
                    None => {
                        unreachable = Some(i);
                        break;
                    }
                }
            }
            match unreachable {
                None => return Ok(reached),
                Some(copy) => {
                    if !self.lose_copy(region, copy, "no link to its server is up", now) {
                        return Err(Status::ServerUnavailable);
                    }
                }
            }
        }
    }

    /// The deciding copy: the first serving one in set order.
    fn deciding_copy(&self, region: u32) -> Option<usize> {
        self.region_state(region)?
            .copies
            .iter()
            .position(|c| c.state == ReplicaState::Serving)
    }

    /// The key for `server`'s copy: the copy's own key when the client
    /// sent the region's (the primary's) key; any other key as it is (an
    /// extent's key is in the region's data, the same on every copy).
    fn copy_key(&self, region: u32, server: &ServerId, client_key: AccessKey) -> AccessKey {
        if client_key.is_none() || !self.is_copy_key(region, client_key) {
            return client_key;
        }
        self.copy_key_on(region, server).unwrap_or(client_key)
    }

    /// Whether `key` is the key of one of `region`'s copies: the one the
    /// client's MAP gave (the primary's, or another copy's while the
    /// primary's is unknown) or one learnt from a copy's server.
    fn is_copy_key(&self, region: u32, key: AccessKey) -> bool {
        let primary = self
            .map
            .layout
            .entry(RegionIndex(region))
            .map_or(AccessKey::NONE, |e| e.key);
        key == primary
            || self
                .replication
                .keys
                .iter()
                .any(|(&(r, _), &k)| r == region && k == key)
    }

    /// A key a client may use for replicated `region` while its primary's
    /// key is unknown (its server down since this device started): the
    /// key of a copy that serves, which [`Self::copy_key`] translates for
    /// every other copy.
    pub(super) fn serving_copy_key(&self, region: u32) -> Option<AccessKey> {
        let state = self.region_state(region)?;
        state
            .copies
            .iter()
            .filter(|c| c.state == ReplicaState::Serving)
            .find_map(|c| {
                self.replication
                    .keys
                    .get(&(region, c.server.clone()))
                    .copied()
            })
    }

    fn copy_server(&self, region: u32, copy: usize) -> Option<ServerId> {
        Some(self.region_state(region)?.copies.get(copy)?.server.clone())
    }

    /// Records a request to one copy as pending on `link` and queues it
    /// (for the server's CPU when `cpu`).
    #[allow(clippy::too_many_arguments)]
    fn send_copy(
        &mut self,
        mut head: [u8; FORWARD_HEAD_LEN],
        payload: Arc<[u8]>,
        link_id: LinkId,
        pending: Pending,
        key: AccessKey,
        cpu: bool,
        now: Instant,
    ) -> Result<u64, Pending> {
        let link_tag = self.record_copy(&mut head, payload.len(), link_id, pending, key, now)?;
        let rdma = match cpu || !self.has_queue_pair(link_id) {
            true => None,
            false => RequestFields::of_head(&head, payload.len())
                .and_then(|fields| self.offload(link_id, &fields)),
        };
        self.replication.outbox.push(Outgoing::Send {
            link: link_id,
            head,
            payload,
            cpu,
            rdma,
        });
        Ok(link_tag)
    }

    /// Records a request to one copy as pending on `link`, with its
    /// deadlines, and writes the link's tag and the copy's `key` into its
    /// `head`; the tag, or `pending` back when the link is gone.
    fn record_copy(
        &mut self,
        head: &mut [u8; FORWARD_HEAD_LEN],
        payload_len: usize,
        link_id: LinkId,
        pending: Pending,
        key: AccessKey,
        now: Instant,
    ) -> Result<u64, Pending> {
        let Some(link) = self.links.get_mut(&link_id) else {
            return Err(pending);
        };
        let link_tag = link.next_tag;
        link.next_tag = (link.next_tag + 1) & !CONTROL_TAG;
        // A client's operation waits on this copy: it gets the shorter
        // copy timeout too (a resync's own requests only the request's).
        let for_client = matches!(pending.copy, Some(CopyTicket::Op(_) | CopyTicket::Read(_)));
        link.pending.insert(link_tag, pending);
        let links = &self.links;
        let after = |wait| Deadline {
            at: now + wait,
            link: link_id,
            tag: link_tag,
        };
        self.deadlines
            .push(after(self.config.request_timeout), |d| is_pending(links, d));
        if for_client && self.config.copy_timeout < self.config.request_timeout {
            self.copy_deadlines
                .push(after(self.config.copy_timeout), |d| is_pending(links, d));
        }
        proto::frame::Packet::new_unchecked(&mut head[..proto::frame::HEADER_LEN])
            .set_tag(link_tag);
        request::Packet::new_unchecked(&mut head[proto::frame::HEADER_LEN..]).set_key(key.get());
        self.metrics
            .bytes_to_servers
            .add((FORWARD_HEAD_LEN + payload_len) as u64);
        Ok(link_tag)
    }

    /// Sends part `purpose` of operation `op_id` to `copy` over `link`.
    #[allow(clippy::too_many_arguments)]
    fn send_op_part(
        &mut self,
        op: &mut Op,
        op_id: u64,
        copy: usize,
        link: LinkId,
        head: [u8; FORWARD_HEAD_LEN],
        payload: Arc<[u8]>,
        key: AccessKey,
        purpose: Purpose,
        now: Instant,
    ) {
        let pending = Pending {
            conn: op.conn,
            client_tag: op.client_tag,
            opcode: op.opcode,
            sent: now,
            reply_bytes: 0,
            copy: Some(CopyTicket::Op(op_id)),
        };
        let cpu = purpose.for_cpu();
        let Ok(tag) = self.send_copy(head, Arc::clone(&payload), link, pending, key, cpu, now)
        else {
            return;
        };
        let order = self.replication.next_send;
        self.replication.next_send += 1;
        if matches!(purpose, Purpose::Mutation | Purpose::ApplyWord)
            && let Some(state) = self.region_state(op.region)
            && let Some(c) = state.copies.get(copy)
        {
            let role = if copy == 0 { "primary" } else { "backup" };
            self.metrics
                .copy_writes
                .with(&[c.server.as_str(), role])
                .inc();
        }
        op.sends.push(CopySend {
            copy,
            link,
            tag,
            purpose,
            answer: None,
            dropped: false,
            head,
            payload,
            key,
            epoch: self.current_epoch(),
            order,
            stale_answers: 0,
            waiting: None,
        });
    }

    /// Starts an operation: charged to its client once, its range entered.
    fn new_op(
        &mut self,
        conn: ConnId,
        tag: u64,
        opcode: Opcode,
        region: u32,
        (start, end): (u64, u64),
        undecided: bool,
    ) -> (u64, Op) {
        let id = self.replication.next_op;
        self.replication.next_op += 1;
        if let Some(session) = self.sessions.get_mut(&conn) {
            session.in_flight += 1;
            session.reply_bytes += REPLY_HEAD_LEN as u64;
        }
        self.reply_bytes += REPLY_HEAD_LEN as u64;
        self.metrics.in_flight.inc();
        if let Some(state) = self.region_state_mut(region) {
            state.spans.push(Span {
                op: id,
                start,
                end,
                undecided,
                behind: false,
            });
        }
        let op = Op {
            conn,
            client_tag: tag,
            opcode,
            region,
            sends: Vec::new(),
            lost: Vec::new(),
            atomic: None,
        };
        (id, op)
    }
}

/// The region of operation `id` (`u32::MAX` when it is gone).
fn region_of(ops: &IdMap<u64, Op>, id: u64) -> u32 {
    ops.get(&id).map_or(u32::MAX, |op| op.region)
}

/// The frame and request header of a request the device makes itself
/// (its tag and key set when sent).
fn own_head(req: &request::Repr<'_>) -> Option<[u8; FORWARD_HEAD_LEN]> {
    let bytes = Message::Request(*req).encode_to_vec(0).ok()?;
    bytes.get(..FORWARD_HEAD_LEN)?.try_into().ok()
}
