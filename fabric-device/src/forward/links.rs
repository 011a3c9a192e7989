//! Server links in the forwarding core: two per server NIC (a main and a
//! bulk lane), their opening (HELLO, MAP_REQUEST, proofs), the server's
//! answers relayed to clients, and a link going down.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use proto::frame::{self, Header};
use proto::hello::{Capabilities, Role};
use proto::opening::{Credentials, Opening, OpeningTags, Progress};
use proto::{Opcode, Status, map, response};
use telemetry::Gauge;

use super::copy_ticket::CopyTicket;
use super::{ConnId, Forwarder, LinkAction, REPLY_HEAD_LEN, Reply, fresh_nonce};
use crate::deadline::Deadline;
use crate::idmap::IdMap;
use crate::ids::{LinkClass, LinkId};
use crate::link_tags::{CONTROL_TAG, KEY_REFRESH_TAG, LINK_HELLO_TAG, LINK_MAP_TAG, MAP_EPOCH_TAG};
use crate::map::LinkTarget;

/// Tags of the device's HELLO and MAP_REQUEST on a link.
pub(super) const LINK_OPENING: OpeningTags = OpeningTags {
    hello: LINK_HELLO_TAG,
    map: LINK_MAP_TAG,
};

/// The two links of one server NIC.
#[derive(Debug, Clone, Copy)]
pub(super) struct Lanes {
    pub(super) main: LinkId,
    pub(super) bulk: LinkId,
}

impl Lanes {
    /// The link of `lane`.
    pub(super) fn get(self, lane: LinkClass) -> LinkId {
        match lane {
            LinkClass::Main => self.main,
            LinkClass::Bulk => self.bulk,
        }
    }
}

/// A link's state as the core sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkStatus {
    /// Not connected.
    Down,
    /// Connected; HELLO and MAP sent, answers awaited.
    Handshaking,
    /// Serving requests.
    Up,
}

/// A request forwarded and not answered yet.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) conn: ConnId,
    pub(super) client_tag: u64,
    pub(super) opcode: Opcode,
    pub(super) sent: Instant,
    /// Bytes its answer will bring (READ data and the response head).
    pub(super) reply_bytes: u64,
    /// A request to one copy of a replicated region: what it is part of.
    pub(super) copy: Option<CopyTicket>,
}

/// A link to a server NIC as the core keeps it.
#[derive(Debug)]
pub(super) struct Link {
    pub(super) target: LinkTarget,
    pub(super) lane: LinkClass,
    pub(super) status: LinkStatus,
    /// The link's opening while the server has not answered it.
    pub(super) opening: Option<Opening>,
    /// The server's MAP from the last handshake, rechecked on reload.
    pub(super) server_map: Option<map::Repr>,
    pub(super) next_tag: u64,
    pub(super) pending: IdMap<u64, Pending>,
    pub(super) up_gauge: Arc<Gauge>,
    /// The first connection attempt has not ended yet (no handshake done,
    /// no failure): requests for its server wait instead of failing.
    pub(super) starting: bool,
    /// Where the link stands with refreshing its server's region keys.
    pub(super) key_refresh: KeyRefresh,
    /// The link's RDMA queue pair toward its server, while it is up.
    pub(super) queue_pair: Option<Box<QueuePairKeys>>,
}

/// A link's refresh of its server's region keys (MAP_REQUEST on the link).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum KeyRefresh {
    /// The keys are as the last MAP gave them.
    #[default]
    Current,
    /// The server refused a request: ask again.
    Due,
    /// A server on verbs is polled: ask again.
    PollDue,
    /// Asked; the answer is awaited.
    Asked,
}

/// What a link's queue pair toward its server offers, as its QP_ACCEPT
/// said.
#[derive(Debug, Clone, Default)]
pub(super) struct QueuePairKeys {
    /// The R_Key of each region the server registered, by region index.
    pub(super) rkeys: HashMap<u32, u32>,
    /// What the server's queue pair can do (`proto::qp::caps`).
    pub(super) caps: u64,
}

/// An answer to a request forwarded on a link.
#[derive(Debug)]
pub(super) struct Answer<'a> {
    /// The link-level tag.
    pub(super) tag: u64,
    /// The frame and response header.
    pub(super) head: [u8; REPLY_HEAD_LEN],
    /// The READ data after them.
    pub(super) payload: &'a [u8],
    /// The whole frame, when the server sent one.
    pub(super) whole: Option<&'a [u8]>,
}

/// Whether the request a deadline stands for still waits for its response
/// (link tags are never reused, so the tag alone tells).
pub(super) fn is_pending(links: &IdMap<LinkId, Link>, deadline: &Deadline) -> bool {
    links
        .get(&deadline.link)
        .is_some_and(|l| l.pending.contains_key(&deadline.tag))
}

impl Forwarder {
    pub(super) fn add_lanes(&mut self, target: &LinkTarget) -> Lanes {
        Lanes {
            main: self.add_link(target.clone(), LinkClass::Main),
            bulk: self.add_link(target.clone(), LinkClass::Bulk),
        }
    }

    pub(super) fn add_link(&mut self, target: LinkTarget, lane: LinkClass) -> LinkId {
        let id = LinkId(self.next_link);
        self.next_link += 1;
        let up_gauge = self
            .metrics
            .link_up(target.server.as_str(), target.nic.as_str(), lane);
        up_gauge.set(0);
        self.links.insert(
            id,
            Link {
                target,
                lane,
                status: LinkStatus::Down,
                opening: None,
                server_map: None,
                next_tag: 1,
                pending: IdMap::default(),
                up_gauge,
                starting: true,
                key_refresh: KeyRefresh::Current,
                queue_pair: None,
            },
        );
        self.links_starting += 1;
        id
    }

    /// Which of its NIC's connections `link` is.
    pub fn link_lane(&self, link: LinkId) -> Option<LinkClass> {
        self.links.get(&link).map(|l| l.lane)
    }

    /// Every link with its identity.
    pub fn links(&self) -> impl Iterator<Item = (LinkId, &LinkTarget)> {
        self.links.iter().map(|(id, link)| (*id, &link.target))
    }

    /// A link's identity.
    pub fn link_target(&self, link: LinkId) -> Option<&LinkTarget> {
        self.links.get(&link).map(|l| &l.target)
    }

    /// A link's status.
    pub fn link_status(&self, link: LinkId) -> Option<LinkStatus> {
        self.links.get(&link).map(|l| l.status)
    }

    /// Proves this device to its servers with `key` when links open (their
    /// servers then require it).
    pub fn set_link_key(&mut self, key: proto::auth::Key) {
        self.link_key = Some(key);
    }

    /// The bytes to send on a link that just connected: HELLO and
    /// MAP_REQUEST (after the proofs, with a link key). The link is up once
    /// the server answers and agrees with the map.
    pub fn link_connected(&mut self, link: LinkId) -> Vec<u8> {
        let Some(state) = self.links.get_mut(&link) else {
            return Vec::new();
        };
        state.status = LinkStatus::Handshaking;
        let mut out = Vec::new();
        state.opening = Opening::start(
            Role::FabricDevice,
            Capabilities::PIPELINING | Capabilities::REGION_ADDRESSING,
            self.map.device.as_str(),
            true,
            LINK_OPENING,
            self.link_key.clone().map(|key| Credentials {
                key,
                nonce: fresh_nonce(),
            }),
            &mut out,
        )
        .ok();
        if state.opening.is_none() {
            out.clear();
        }
        out
    }

    /// Handles one complete frame from a server link.
    pub fn link_frame<'a>(
        &mut self,
        link_id: LinkId,
        frame: &'a [u8],
        now: Instant,
    ) -> LinkAction<'a> {
        let header = match Header::parse(frame) {
            Ok(header) => header,
            Err(e) => return LinkAction::Close(format!("bad frame from server: {e}")),
        };
        if header.tag == KEY_REFRESH_TAG {
            return self.keys_refreshed(link_id, frame);
        }
        if header.tag == MAP_EPOCH_TAG {
            self.server_response(frame);
            // Its value is the epoch the server runs.
            if let Some(body) = frame.get(frame::HEADER_LEN..)
                && let Ok(answer) = response::Packet::new_checked(body)
            {
                self.server_said_epoch(link_id, answer.value(), now);
            }
            return LinkAction::Nothing;
        }
        if header.tag & CONTROL_TAG != 0 {
            return self.link_control(link_id, frame);
        }
        if !header.opcode.is_response() || frame.len() < REPLY_HEAD_LEN {
            if header.opcode == Opcode::BlockSumsReport
                && let Some(ticket) = self.take_resync_pending(link_id, header.tag)
            {
                self.resync_answered(ticket, frame, now);
                return LinkAction::Nothing;
            }
            return LinkAction::Close(format!("unexpected {} frame from server", header.opcode));
        }
        let mut head = [0u8; REPLY_HEAD_LEN];
        head.copy_from_slice(&frame[..REPLY_HEAD_LEN]);
        let answer = Answer {
            tag: header.tag,
            head,
            payload: &frame[REPLY_HEAD_LEN..],
            whole: Some(frame),
        };
        self.link_response(link_id, answer, now)
    }

    /// The answer to a request forwarded on `link_id`: the server's
    /// response, or the RDMA completion made one.
    pub(super) fn link_response<'a>(
        &mut self,
        link_id: LinkId,
        answer: Answer<'a>,
        now: Instant,
    ) -> LinkAction<'a> {
        let Answer {
            tag,
            mut head,
            payload,
            whole,
        } = answer;
        let Some(link) = self.links.get_mut(&link_id) else {
            return LinkAction::Nothing;
        };
        let Some(mut pending) = link.pending.remove(&tag) else {
            // Answered already (timed out); nobody waits for it.
            return LinkAction::Nothing;
        };
        if let Some(CopyTicket::Resync(ticket)) = pending.copy {
            // The owner's own resync request (the server CPU's: never
            // posted as RDMA, so it comes as a frame).
            let links = &self.links;
            self.deadlines.trim(|d| is_pending(links, d));
            match whole {
                Some(frame) => self.resync_answered(ticket, frame, now),
                None => self.resync_failed(ticket, Status::IoError, now),
            }
            return LinkAction::Nothing;
        }
        if let Some(CopyTicket::Op(op)) = pending.copy {
            // Part of a replicated operation: answered once all are in.
            let links = &self.links;
            self.deadlines.trim(|d| is_pending(links, d));
            self.metrics
                .server_rtt
                .observe_duration(now.saturating_duration_since(pending.sent));
            self.copy_answered(link_id, tag, op, &head, payload, now);
            return LinkAction::Nothing;
        }
        if matches!(pending.copy, Some(CopyTicket::Read(_)))
            && let answer = response::Packet::new_unchecked(&head[frame::HEADER_LEN..])
            && answer.status() == Status::StaleMap
        {
            // A read of a replicated region's copy: read again once the
            // server runs the device's epoch, not failed.
            let theirs = answer.value();
            let links = &self.links;
            self.deadlines.trim(|d| is_pending(links, d));
            self.server_response(&head);
            self.copy_read_stale(pending, theirs, now);
            return LinkAction::Nothing;
        }
        if let Some(CopyTicket::Read(again)) = pending.copy.take() {
            // Answered: its record serves the next read.
            self.recycle_read(again);
        }
        let links = &self.links;
        self.deadlines.trim(|d| is_pending(links, d));
        self.metrics.in_flight.dec();
        self.metrics
            .server_rtt
            .observe_duration(now.saturating_duration_since(pending.sent));
        self.reply_bytes = self.reply_bytes.saturating_sub(pending.reply_bytes);
        let Some(session) = self.sessions.get_mut(&pending.conn) else {
            return LinkAction::Nothing;
        };
        session.in_flight = session.in_flight.saturating_sub(1);
        session.reply_bytes = session.reply_bytes.saturating_sub(pending.reply_bytes);
        frame::Packet::new_unchecked(&mut head[..frame::HEADER_LEN]).set_tag(pending.client_tag);
        let status = response::Packet::new_unchecked(&head[frame::HEADER_LEN..]).status();
        if status == Status::AccessDenied {
            // Perhaps a key rotated on the server: learn its keys again, so
            // the client's next MAP (and the device's own RoCE requests)
            // carry the current ones.
            if let Some(link) = self.links.get_mut(&link_id)
                && link.key_refresh == KeyRefresh::Current
                && link.status == LinkStatus::Up
            {
                link.key_refresh = KeyRefresh::Due;
            }
        }
        if status == Status::StaleMap {
            // Relayed as it is (its value is the server's epoch); a newer
            // one than the device's calls for the map now.
            self.server_response(&head);
        }
        self.metrics.record(pending.opcode, status);
        self.metrics
            .bytes_to_clients
            .add((REPLY_HEAD_LEN + payload.len()) as u64);
        LinkAction::Deliver {
            conn: pending.conn,
            head,
            payload,
        }
    }

    /// Takes the request a resync sent on `link_id` with `tag`, if it is one.
    fn take_resync_pending(
        &mut self,
        link_id: LinkId,
        tag: u64,
    ) -> Option<super::copy_ticket::ResyncTicket> {
        let link = self.links.get_mut(&link_id)?;
        let Some(CopyTicket::Resync(ticket)) = link.pending.get(&tag).and_then(|p| p.copy.as_ref())
        else {
            return None;
        };
        let ticket = *ticket;
        link.pending.remove(&tag);
        let links = &self.links;
        self.deadlines.trim(|d| is_pending(links, d));
        Some(ticket)
    }

    /// The server's answers to the device's own HELLO and MAP_REQUEST.
    pub(super) fn link_control<'a>(&mut self, link_id: LinkId, frame: &[u8]) -> LinkAction<'a> {
        let Some(link) = self.links.get_mut(&link_id) else {
            return LinkAction::Nothing;
        };
        let server = link.target.server.clone();
        let Some(opening) = link.opening.as_mut() else {
            return LinkAction::Close("handshake answer on a link that sent none".into());
        };
        let wrong_peer = |name: &str, role: Role| {
            (role != Role::Server || name != server.as_str()).then(|| {
                LinkAction::Close(format!(
                    "expected server {server:?}, but {name:?} ({role:?}) answered"
                ))
            })
        };
        let mut answer = Vec::new();
        let opened = match opening.handle_frame(frame, &mut answer) {
            Ok(Progress::Waiting) => {
                let refused = opening
                    .peer()
                    .and_then(|(name, role)| wrong_peer(name, role));
                return refused.unwrap_or(if answer.is_empty() {
                    LinkAction::Nothing
                } else {
                    LinkAction::Send(answer)
                });
            }
            Ok(Progress::Opened(opened)) => opened,
            Err(e) => return LinkAction::Close(format!("link handshake: {e}")),
        };
        link.opening = None;
        if let Some(close) = wrong_peer(&opened.peer, opened.role) {
            return close;
        }
        let Some(theirs) = opened.map else {
            return LinkAction::Close("no MAP in the link handshake".into());
        };
        if !self.map.server_agrees(&server, &theirs) {
            return LinkAction::Close(format!(
                "server {server:?} serves a layout that disagrees with this device's map"
            ));
        }
        self.learn_keys(&server, &theirs);
        let Some(link) = self.links.get_mut(&link_id) else {
            return LinkAction::Nothing;
        };
        link.status = LinkStatus::Up;
        link.up_gauge.set(1);
        if std::mem::take(&mut link.starting) {
            self.links_starting -= 1;
        }
        link.key_refresh = KeyRefresh::Current;
        link.server_map = Some(theirs);
        self.resync_link_opened(&server);
        // Ordered before any request the link will carry.
        self.link_opened_epoch()
            .map_or(LinkAction::Nothing, LinkAction::Send)
    }

    /// A link broke or was closed: every request in flight on it is answered
    /// SERVER_UNAVAILABLE.
    pub fn link_down(&mut self, link_id: LinkId) -> Vec<(ConnId, Reply)> {
        self.link_down_at(link_id, Instant::now())
    }

    /// [`Forwarder::link_down`] at `now`: requests to copies of replicated
    /// regions in flight on it lose their copy (or go to another copy, for
    /// reads), and a server that was up and is left with no link up loses
    /// its copies.
    pub fn link_down_at(&mut self, link_id: LinkId, now: Instant) -> Vec<(ConnId, Reply)> {
        let Some(link) = self.links.get_mut(&link_id) else {
            return Vec::new();
        };
        let was_up = link.status == LinkStatus::Up;
        link.status = LinkStatus::Down;
        if std::mem::take(&mut link.starting) {
            self.links_starting -= 1;
        }
        link.opening = None;
        link.server_map = None;
        link.key_refresh = KeyRefresh::Current;
        link.queue_pair = None;
        link.up_gauge.set(0);
        let server = link.target.server.clone();
        let pending: Vec<(u64, Pending)> = link.pending.drain().collect();
        let links = &self.links;
        self.deadlines.trim(|d| is_pending(links, d));
        // Resyncs and fences look at which links are up.
        self.replication_changed();
        let mut replies = Vec::new();
        for (tag, p) in pending {
            match p.copy {
                None => replies.extend(self.answer(p, Status::ServerUnavailable)),
                Some(CopyTicket::Op(op)) => {
                    self.copy_request_failed(link_id, tag, op, Status::ServerUnavailable, now);
                }
                Some(CopyTicket::Read(_)) => {
                    replies.extend(self.copy_read_failed(p, Status::ServerUnavailable, now));
                }
                Some(CopyTicket::Resync(ticket)) => {
                    self.resync_failed(ticket, Status::ServerUnavailable, now);
                }
            }
        }
        if was_up {
            // A server that was reached and is not any more; one that never
            // answered a connect loses its copies when a write needs them.
            self.copies_unreachable(&server, now);
        }
        replies
    }
}
