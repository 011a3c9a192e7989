//! Replicated regions in the forwarding core: the owner device orders every
//! request of a region with several copies.
//!
//! - Writes, WRITE_PERSIST, FLUSH and ATOMIC_WRITE go to every copy that
//!   takes writes (`serving` or `syncing`), each over one TCP link per copy
//!   (FIFO per link: every copy applies them in the owner's order); the
//!   client is answered once every such copy answered, with the answer of
//!   the deciding copy (the first `serving` one in set order).
//! - COMPARE_SWAP and FETCH_ADD are decided at the deciding copy alone,
//!   followed on the same link by a READ of the word (so the word written to
//!   the others is the one stored, even when the deciding copy answered a
//!   retry from its exactly-once window); the word then goes to every other
//!   copy as ATOMIC_WRITE under the client's identity. Until the word is
//!   queued for the others, requests overlapping it wait here, in order.
//! - READ goes to any `serving` copy (same socket first, then the link with
//!   the fewest requests pending); a read overlapping a mutation in flight
//!   goes to the deciding copy, behind the mutation on the same link.
//! - A copy that fails (its links down, a request timed out, an answer that
//!   disagrees with the other copies') stops being used; its loss is
//!   reported ([`Outgoing::CopyLost`]) and the answers that waited on it
//!   are held until the driver confirms it ([`Forwarder::copy_marked`]).
//!   The last `serving` copy is never dropped: its failures fail requests.
//!
//! Everything for a replicated region goes out through the outbox
//! ([`Forwarder::take_outbox`]) and is sent on the links' TCP connections,
//! never on an RDMA uplink. A device that is not a region's owner answers
//! its requests NOT_OWNER.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use control::ReplicaState;
use proto::request::{self, ExactlyOnce, Operation, Target};
use proto::{AccessKey, Message, Opcode, RegionIndex, RegionOffset, Status, response};
use topology::{RegionId, ServerId};

use super::links::{Pending, is_pending};
use super::routing::{BULK_MIN_BYTES, Located, Routed, rewrite_head};
use super::{ClientAction, ConnId, FORWARD_HEAD_LEN, Forwarder, LinkStatus, REPLY_HEAD_LEN, Reply};
use crate::deadline::Deadline;
use crate::idmap::IdMap;
use crate::ids::{Lane, LinkId};
use crate::link_tags::CONTROL_TAG;

/// Something the core asks the driver to do for a replicated region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outgoing {
    /// Send `head` then `payload` on `link`'s TCP connection.
    Send {
        /// The link.
        link: LinkId,
        /// The request's frame and request header, rewritten for the copy.
        head: [u8; FORWARD_HEAD_LEN],
        /// The write data (empty for other operations), shared by copies.
        payload: Arc<[u8]>,
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
}

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
    head: [u8; FORWARD_HEAD_LEN],
    /// The key the client sent.
    client_key: AccessKey,
    region: u32,
    copy: usize,
    start: u64,
    end: u64,
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
    /// The word is queued to the other copies.
    applying: bool,
}

impl Atomic {
    /// The word stored after the atomic, from the word before.
    fn word_after(&self, old: u64) -> u64 {
        match self.operation {
            Operation::CompareSwap if old == self.compare => self.operand,
            Operation::FetchAdd => old.wrapping_add(self.operand),
            _ => old,
        }
    }
}

impl Forwarder {
    /// What the driver is to do for replicated regions since the last call:
    /// sends, answers and lost copies, in order.
    pub fn take_outbox(&mut self) -> Vec<Outgoing> {
        std::mem::take(&mut self.replication.outbox)
    }

    /// The loss of `region`'s copy on `server` is recorded (or cannot be,
    /// and the device goes on without it): answers held for it go out.
    pub fn copy_marked(&mut self, region: RegionIndex, server: &ServerId, now: Instant) {
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
    /// not moved past the version it lost them at.
    pub(super) fn replication_from_map(&mut self) {
        let mut old = std::mem::take(&mut self.replication.regions);
        let device = self.map.device.clone();
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
                        let kept_lost = was
                            .and_then(|c| c.lost_at)
                            .filter(|&at| at == set.version);
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
                let (spans, queued) = before.map(|b| (b.spans, b.queued)).unwrap_or_default();
                Some(RegionState {
                    id: entry.region_id.clone(),
                    owner: set.owner == device,
                    version: set.version,
                    copies,
                    spans,
                    queued,
                })
            })
            .collect();
    }

    /// Records the key `server` gives for its copy of a replicated region.
    pub(super) fn learn_copy_key(&mut self, region: u32, server: &ServerId, key: AccessKey) {
        let holds = self
            .region_state(region)
            .is_some_and(|s| s.copies.iter().any(|c| &c.server == server));
        if holds {
            self.replication
                .keys
                .insert((region, server.clone()), key);
        }
    }

    /// Whether some copy of replicated `region` that takes writes is
    /// reached only by links still on their first attempt; `None` for a
    /// single-copy region.
    pub(super) fn copies_starting(&self, region: u32) -> Option<bool> {
        let state = self.region_state(region)?;
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

    /// A request for a replicated region: refused NOT_OWNER here unless
    /// this device owns the region; queued behind an undecided atomic it
    /// overlaps; otherwise sent.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn forward_replicated<'a>(
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
            self.metrics.not_owner.inc();
            return ClientAction::Reply(self.refuse(verdict, opcode, tag, Status::NotOwner));
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
        let waits = state.queued.iter().any(|q| q.start < end && start < q.end)
            || state
                .spans
                .iter()
                .any(|s| s.undecided && s.overlaps(start, end));
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
        match self.dispatch(conn, frame, req, tag, at, now) {
            Ok(()) => ClientAction::Nothing,
            Err(status) => ClientAction::Reply(self.refuse(verdict, opcode, tag, status)),
        }
    }

    /// Sends a request of a replicated region to its copies.
    fn dispatch(
        &mut self,
        conn: ConnId,
        frame: &[u8],
        req: &request::Repr<'_>,
        tag: u64,
        at: Located,
        now: Instant,
    ) -> Result<(), Status> {
        match req.operation {
            Operation::Read => self.read_copy(conn, frame, req, tag, at, now),
            Operation::CompareSwap | Operation::FetchAdd => {
                self.start_atomic(conn, frame, req, tag, at, now)
            }
            _ => self.fan_out(conn, frame, req, tag, at, now),
        }
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
        let region_key = self
            .map
            .layout
            .entry(RegionIndex(region))
            .map_or(AccessKey::NONE, |e| e.key);
        if region_key.is_none() || client_key != region_key {
            return client_key;
        }
        self.replication
            .keys
            .get(&(region, server.clone()))
            .copied()
            .unwrap_or(client_key)
    }

    fn copy_server(&self, region: u32, copy: usize) -> Option<ServerId> {
        Some(self.region_state(region)?.copies.get(copy)?.server.clone())
    }

    /// Records a request to one copy as pending on `link` and queues it.
    #[allow(clippy::too_many_arguments)]
    fn send_copy(
        &mut self,
        mut head: [u8; FORWARD_HEAD_LEN],
        payload: Arc<[u8]>,
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
        link.pending.insert(link_tag, pending);
        let links = &self.links;
        self.deadlines.push(
            Deadline {
                at: now + self.config.request_timeout,
                link: link_id,
                tag: link_tag,
            },
            |d| is_pending(links, d),
        );
        proto::frame::Packet::new_unchecked(&mut head[..proto::frame::HEADER_LEN])
            .set_tag(link_tag);
        request::Packet::new_unchecked(&mut head[proto::frame::HEADER_LEN..]).set_key(key.get());
        self.metrics
            .bytes_to_servers
            .add((FORWARD_HEAD_LEN + payload.len()) as u64);
        self.replication.outbox.push(Outgoing::Send {
            link: link_id,
            head,
            payload,
        });
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
        let Ok(tag) = self.send_copy(head, payload, link, pending, key, now) else {
            return;
        };
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

    /// WRITE, WRITE_PERSIST, FLUSH, ATOMIC_WRITE: to every copy that takes
    /// writes.
    fn fan_out(
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
        let (id, mut op) = self.new_op(conn, tag, req.operation.opcode(), region, (start, end), false);
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

    /// COMPARE_SWAP, FETCH_ADD: decided at the deciding copy first.
    fn start_atomic(
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
        let (id, mut op) = self.new_op(conn, tag, req.operation.opcode(), region, (start, end), true);
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
    fn decide(&mut self, op: &mut Op, id: u64, now: Instant) -> bool {
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
        let none: Arc<[u8]> = Arc::from(&[][..]);
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
        self.send_op_part(op, id, copy, link, read_head, none, key, Purpose::ReadBack, now);
        self.metrics.atomics_decided.inc();
        true
    }

    /// The decided word goes to every other copy that takes writes, as
    /// ATOMIC_WRITE under the client's identity.
    fn apply_word(&mut self, op: &mut Op, id: u64, word: u64, now: Instant) {
        let region = op.region;
        let Some(atomic) = op.atomic.as_mut() else {
            return;
        };
        atomic.applying = true;
        let (at, client_key, identity, number, persist) = (
            atomic.at,
            atomic.client_key,
            atomic.identity,
            atomic.client_number,
            atomic.persist,
        );
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
        let copies = match self.reach_copies(region, now) {
            Ok(copies) => copies,
            Err(_) => Vec::new(),
        };
        let none: Arc<[u8]> = Arc::from(&[][..]);
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
                Arc::clone(&none),
                key,
                Purpose::ApplyWord,
                now,
            );
            self.metrics.atomics_applied.inc();
        }
    }

    /// READ: to a serving copy; to the deciding one, behind the mutation,
    /// when it overlaps a mutation in flight.
    fn read_copy(
        &mut self,
        conn: ConnId,
        frame: &[u8],
        req: &request::Repr<'_>,
        tag: u64,
        at: Located,
        now: Instant,
    ) -> Result<(), Status> {
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
        match self.send_read(pending, again, now) {
            Ok(()) => Ok(()),
            Err(pending) => {
                // Nothing was sent: the refusal settles its charge.
                let _ = self.answer(pending, Status::ServerUnavailable);
                Err(Status::ServerUnavailable)
            }
        }
    }

    /// Sends a read to the copy it should go to now; gives the request back
    /// when no serving copy is reachable.
    fn send_read(
        &mut self,
        mut pending: Pending,
        mut again: ReadAgain,
        now: Instant,
    ) -> Result<(), Pending> {
        let Some((copy, link)) = self.read_target(again.region, again.start, again.end) else {
            return Err(pending);
        };
        let Some(server) = self.copy_server(again.region, copy) else {
            return Err(pending);
        };
        let key = self.copy_key(again.region, &server, again.client_key);
        again.copy = copy;
        let head = again.head;
        pending.copy = Some(CopyTicket::Read(Box::new(again)));
        self.send_copy(head, Arc::from(&[][..]), link, pending, key, now)
            .map(|_| ())
            .map_err(|mut pending| {
                pending.copy = None;
                pending
            })
    }

    /// Where a read of `[start, end)` goes: the deciding copy's write link
    /// when a mutation in flight overlaps it, else the serving copy with a
    /// link up on its socket first, then the fewest requests pending.
    fn read_target(&self, region: u32, start: u64, end: u64) -> Option<(usize, LinkId)> {
        let state = self.region_state(region)?;
        if state.spans.iter().any(|s| s.overlaps(start, end)) {
            let copy = self.deciding_copy(region)?;
            return Some((copy, self.write_link(&state.copies[copy].links)?));
        }
        let lane = if end - start >= BULK_MIN_BYTES {
            Lane::Bulk
        } else {
            Lane::Main
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
                    let rank = (&self.map.links[pos].socket != home, link.pending.len());
                    if best.as_ref().is_none_or(|(r, _, _)| rank < *r) {
                        best = Some((rank, i, id));
                    }
                    break;
                }
            }
        }
        best.map(|(_, copy, link)| (copy, link))
    }

    /// An answer from a copy to part of a replicated operation.
    pub(super) fn copy_answered(
        &mut self,
        link: LinkId,
        link_tag: u64,
        op_id: u64,
        frame: &[u8],
        now: Instant,
    ) {
        let Some(op) = self.replication.ops.get_mut(&op_id) else {
            return;
        };
        let Some(send) = op
            .sends
            .iter_mut()
            .find(|s| s.link == link && s.tag == link_tag && !s.dropped)
        else {
            return;
        };
        let body = &frame[proto::frame::HEADER_LEN..];
        let response = response::Packet::new_unchecked(body);
        let status = response.status();
        let value = match send.purpose {
            Purpose::ReadBack => frame
                .get(REPLY_HEAD_LEN..REPLY_HEAD_LEN + 8)
                .and_then(|b| b.try_into().ok())
                .map_or(0, u64::from_le_bytes),
            _ => response.value(),
        };
        send.answer = Some((status, value));
        self.progress(op_id, now);
    }

    /// A request of operation `op_id` to one copy failed (`status`: its
    /// link went down, or it timed out): the copy is lost, or, when it is
    /// the last serving one, the operation fails with `status`.
    pub(super) fn copy_request_failed(
        &mut self,
        link: LinkId,
        link_tag: u64,
        op_id: u64,
        status: Status,
        now: Instant,
    ) {
        let Some(op) = self.replication.ops.get(&op_id) else {
            return;
        };
        let Some(send) = op
            .sends
            .iter()
            .find(|s| s.link == link && s.tag == link_tag && !s.settled())
        else {
            return;
        };
        let (region, copy) = (op.region, send.copy);
        let why = match status {
            Status::Timeout => "a request timed out",
            _ => "its link broke with requests in flight",
        };
        if !self.lose_copy(region, copy, why, now) {
            self.end_op(op_id, status, 0, now);
        }
    }

    /// A read of a copy failed (its link went down, or it timed out): it
    /// goes to another serving copy, or fails with `status`. A timed-out
    /// copy is lost first.
    pub(super) fn copy_read_failed(
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
        match self.send_read(pending, *again, now) {
            Ok(()) => None,
            Err(pending) => self.answer(pending, status),
        }
    }

    /// Every server link of a copy of an owned region went down: the copies
    /// it held are lost (those whose server has no main link up any more).
    pub(super) fn copies_unreachable(&mut self, server: &ServerId, now: Instant) {
        let mut lost = Vec::new();
        for (region, state) in self.replication.regions.iter().enumerate() {
            let Some(state) = state.as_ref().filter(|s| s.owner) else {
                continue;
            };
            for (i, copy) in state.copies.iter().enumerate() {
                if &copy.server == server
                    && copy.takes_writes()
                    && self.write_link(&copy.links).is_none()
                    && !self.copy_links_starting(&copy.links)
                {
                    lost.push((region as u32, i));
                }
            }
        }
        for (region, copy) in lost {
            self.lose_copy(region, copy, "every link to its server is down", now);
        }
    }

    fn copy_links_starting(&self, positions: &[usize]) -> bool {
        positions.iter().any(|&i| {
            self.links
                .get(&self.link_ids[i].main)
                .is_some_and(|l| l.starting)
        })
    }

    /// Stops using `region`'s copy `copy`: offline here, reported to the
    /// driver, dropped from the operations waiting on it. False (and
    /// nothing changes) when it is the last serving copy.
    fn lose_copy(&mut self, region: u32, copy: usize, why: &str, now: Instant) -> bool {
        let Some(state) = self.region_state_mut(region) else {
            return false;
        };
        let serving = state
            .copies
            .iter()
            .filter(|c| c.state == ReplicaState::Serving)
            .count();
        let version = state.version;
        let region_id = state.id.clone();
        let Some(c) = state.copies.get_mut(copy) else {
            return false;
        };
        if c.state == ReplicaState::Offline {
            return true;
        }
        if c.state == ReplicaState::Serving && serving <= 1 {
            return false;
        }
        c.state = ReplicaState::Offline;
        c.unconfirmed = true;
        c.lost_at = Some(version);
        let server = c.server.clone();
        tracing::warn!(
            "region {region_id}: the copy on server {server} is no longer used ({why}); \
             marking it offline"
        );
        self.metrics.copies_offline.inc();
        self.replication.outbox.push(Outgoing::CopyLost {
            region: RegionIndex(region),
            region_id,
            server,
        });
        let mut affected = Vec::new();
        for (id, op) in self.replication.ops.iter_mut() {
            if op.region != region {
                continue;
            }
            let mut hit = false;
            for send in op.sends.iter_mut().filter(|s| s.copy == copy && !s.settled()) {
                send.dropped = true;
                hit = true;
            }
            if hit && !op.lost.contains(&copy) {
                op.lost.push(copy);
            }
            if hit {
                affected.push(*id);
            }
        }
        for id in affected {
            self.progress(id, now);
        }
        true
    }

    fn progress_region(&mut self, region: u32, now: Instant) {
        let ids: Vec<u64> = self
            .replication
            .ops
            .iter()
            .filter(|(_, op)| op.region == region)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.progress(id, now);
        }
    }

    /// Moves operation `id` on as far as its answers allow: an atomic from
    /// its decision to its word written to the others, any operation to its
    /// answer once every copy answered and every lost copy is confirmed.
    fn progress(&mut self, id: u64, now: Instant) {
        let Some(mut op) = self.replication.ops.remove(&id) else {
            return;
        };
        if op.atomic.as_ref().is_some_and(|a| !a.applying) {
            let decide = op.sends.iter().rev().find(|s| s.purpose == Purpose::Decide);
            let read = op.sends.iter().rev().find(|s| s.purpose == Purpose::ReadBack);
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
        // Copies that disagree with a serving copy's OK missed the change.
        let serving = |s: &Forwarder, copy: usize| {
            s.region_state(op.region)
                .and_then(|st| st.copies.get(copy))
                .is_some_and(|c| c.state == ReplicaState::Serving)
        };
        let writes = |p: Purpose| matches!(p, Purpose::Mutation | Purpose::ApplyWord);
        let ok_somewhere = op.sends.iter().any(|s| {
            writes(s.purpose) && s.answer.is_some_and(|(st, _)| st == Status::Ok)
        }) || op.atomic.is_some();
        if ok_somewhere {
            let disagree: Vec<usize> = op
                .sends
                .iter()
                .filter(|s| writes(s.purpose) && s.answer.is_some_and(|(st, _)| st != Status::Ok))
                .map(|s| s.copy)
                .collect();
            for copy in disagree {
                if self.lose_copy(op.region, copy, "it refused a change the others made", now)
                    && !op.lost.contains(&copy)
                {
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
    fn end_op(&mut self, id: u64, status: Status, value: u64, now: Instant) {
        let Some(op) = self.replication.ops.remove(&id) else {
            return;
        };
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
                Err(_) => super::error_reply(op.opcode, op.client_tag, status),
            };
            self.metrics.bytes_to_clients.add(reply.as_bytes().len() as u64);
            self.replication.outbox.push(Outgoing::Answer {
                conn: op.conn,
                reply,
            });
        }
        self.release_queue(op.region, now);
    }

    /// Sends the queued requests of `region` that no undecided atomic (nor
    /// an earlier queued request) overlaps any more, in order.
    fn release_queue(&mut self, region: u32, now: Instant) {
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
                || self.region_state(region).is_some_and(|s| {
                    s.spans
                        .iter()
                        .any(|sp| sp.undecided && sp.overlaps(q.start, q.end))
                });
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
    fn send_queued(&mut self, q: Queued, now: Instant) {
        let Ok((Message::Request(req), tag)) = proto::parse_frame(&q.frame) else {
            return;
        };
        let opcode = req.operation.opcode();
        let sent = match self.route(q.conn, &req) {
            Ok(Routed::Replicated(at)) => self.dispatch(q.conn, &q.frame, &req, tag, at, now),
            Ok(Routed::Single(_)) => Err(Status::StaleMap),
            Err(status) => Err(status),
        };
        if let Err(status) = sent {
            self.metrics.record(opcode, status);
            self.replication.outbox.push(Outgoing::Answer {
                conn: q.conn,
                reply: super::error_reply(opcode, tag, status),
            });
        }
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
