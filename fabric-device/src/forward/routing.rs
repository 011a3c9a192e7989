//! Routing in the forwarding core: where a request goes (its region, the
//! offset in it, the lane and the link that is up), and its head rewritten
//! for that link.

use std::time::Instant;

use proto::frame;
use proto::request::{self, Operation, Target};
use proto::{RegionOffset, Status};

use super::links::{Pending, is_pending};
use super::offload::RequestFields;
use super::{
    ClientAction, ConnId, FORWARD_HEAD_LEN, Forwarder, LinkStatus, REPLY_HEAD_LEN, error_reply,
};
use crate::deadline::Deadline;
use crate::ids::{LinkClass, LinkId};
use crate::link_tags::CONTROL_TAG;

/// Requests moving at least this many bytes (WRITE data, READ length) go on
/// a NIC's bulk lane.
pub const BULK_MIN_BYTES: u64 = 64 * 1024;

/// Where a request goes: one link, or the copies of a replicated region.
#[derive(Debug, Clone, Copy)]
pub(super) enum Routed {
    /// A single-copy region: this link.
    Single(Route),
    /// A replicated region: the replication paths choose the links.
    Replicated(Located),
}

/// Where in a replicated region a request lands, and for which client.
#[derive(Debug, Clone, Copy)]
pub(super) struct Located {
    pub(super) at: RegionOffset,
    pub(super) client_number: u32,
}

/// Where a request goes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Route {
    /// Where in the server the request lands.
    pub(super) at: RegionOffset,
    pub(super) client_number: u32,
    pub(super) link: LinkId,
}

impl Forwarder {
    /// Where a request goes: its region, the offset in it, the client's
    /// number and the link to use; or the status that refuses it.
    pub(super) fn route(&self, conn: ConnId, req: &request::Repr<'_>) -> Result<Routed, Status> {
        let (_, policy) = self
            .sessions
            .get(&conn)
            .and_then(|s| s.client.as_ref())
            .ok_or(Status::UnknownClient)?;
        // The region index, the offset in it and the PMEM address; a
        // PMEM-addressed request needs only the map's extent table, not the
        // region's entry.
        let (region, offset, addr) = match req.target {
            Target::Pmem(addr) => {
                let at = self.map.lookup(addr).ok_or(Status::Unmapped)?;
                (at.offset.region, at.offset.offset, addr)
            }
            Target::Region(at) => {
                let entry = self.map.layout.entry(at.region).ok_or(Status::Unmapped)?;
                if at.offset >= entry.len {
                    return Err(Status::Unmapped);
                }
                let addr = entry.start.checked_add(at.offset).ok_or(Status::Unmapped)?;
                (entry.region, at.offset, addr)
            }
        };
        let len = u64::from(req.span_len());
        if !policy.allows(addr, len, req.operation.changes_memory()) {
            return Err(Status::AccessDenied);
        }
        if let Some(Some(_)) = self.map.replica_sets.get(region.0 as usize) {
            return Ok(Routed::Replicated(Located {
                at: RegionOffset::new(region, offset),
                client_number: policy.number,
            }));
        }
        let nics = self
            .map
            .region_links
            .get(region.0 as usize)
            .ok_or(Status::Unmapped)?;
        // The request's own lane on any NIC, else the other lane.
        let (lane, other) = match len >= BULK_MIN_BYTES {
            true => (LinkClass::Bulk, LinkClass::Main),
            false => (LinkClass::Main, LinkClass::Bulk),
        };
        let up = |id: &LinkId| {
            self.links
                .get(id)
                .is_some_and(|l| l.status == LinkStatus::Up)
        };
        let on = |lane| nics.iter().map(move |&i| self.link_ids[i].get(lane));
        let link = on(lane)
            .find(up)
            .or_else(|| on(other).find(up))
            .ok_or(Status::ServerUnavailable)?;
        Ok(Routed::Single(Route {
            at: RegionOffset::new(region, offset),
            client_number: policy.number,
            link,
        }))
    }

    /// Routes a request, records it as pending and rewrites its head.
    pub(super) fn forward<'a>(
        &mut self,
        conn: ConnId,
        frame: &'a [u8],
        req: &request::Repr<'a>,
        tag: u64,
        now: Instant,
    ) -> ClientAction<'a> {
        let opcode = req.operation.opcode();
        if req.carries_record() {
            // Only a device records an atomic decided at one copy at the
            // others: forwarded, a client's would reach a server as the
            // device's.
            self.metrics.records_refused.inc();
            self.metrics.record(opcode, Status::AccessDenied);
            return ClientAction::Reply(error_reply(opcode, tag, Status::AccessDenied));
        }
        let verdict = match self.fence(conn, opcode, tag) {
            Ok(verdict) => verdict,
            Err(stale) => return ClientAction::Reply(stale),
        };
        let route = match self.route(conn, req) {
            Ok(Routed::Single(route)) => route,
            Ok(Routed::Replicated(at)) => {
                return self.forward_replicated(conn, frame, req, tag, at, verdict, now);
            }
            Err(Status::ServerUnavailable)
                if self
                    .region_of(req)
                    .is_some_and(|region| self.park(conn, frame, region, opcode, tag, now)) =>
            {
                return ClientAction::Nothing;
            }
            Err(status) => return ClientAction::Reply(self.refuse(verdict, opcode, tag, status)),
        };
        let Some(link) = self.links.get_mut(&route.link) else {
            return ClientAction::Reply(error_reply(opcode, tag, Status::ServerUnavailable));
        };
        let reply_bytes = REPLY_HEAD_LEN as u64
            + match req.operation {
                Operation::Read => u64::from(req.length),
                _ => 0,
            };
        let link_tag = link.next_tag;
        link.next_tag = (link.next_tag + 1) & !CONTROL_TAG;
        // A device with no server on verbs pays this one test per request.
        let queue_pair = link.queue_pair.is_some();
        let deadline = now + self.config.request_timeout;
        link.pending.insert(
            link_tag,
            Pending {
                conn,
                client_tag: tag,
                opcode,
                sent: now,
                reply_bytes,
                copy: None,
            },
        );
        let links = &self.links;
        self.deadlines.push(
            Deadline {
                at: deadline,
                link: route.link,
                tag: link_tag,
            },
            |d| is_pending(links, d),
        );
        if let Some(session) = self.sessions.get_mut(&conn) {
            session.in_flight += 1;
            session.reply_bytes += reply_bytes;
        }
        self.reply_bytes += reply_bytes;
        self.metrics.in_flight.inc();

        let head = rewrite_head(frame, req, link_tag, route.at, route.client_number);
        self.metrics.bytes_to_servers.add(frame.len() as u64);
        let rdma = match queue_pair {
            true => self.offload(
                route.link,
                &RequestFields::forwarded(req, route.at, link_tag),
            ),
            false => None,
        };
        ClientAction::Forward {
            link: route.link,
            head,
            payload: &frame[FORWARD_HEAD_LEN..],
            rdma,
        }
    }

    /// The region a request addresses, if it addresses one.
    pub(super) fn region_of(&self, req: &request::Repr<'_>) -> Option<u32> {
        match req.target {
            Target::Pmem(addr) => self.map.lookup(addr).map(|at| at.offset.region.0),
            Target::Region(at) => self.map.layout.entry(at.region).map(|e| e.region.0),
        }
    }
}

/// A client request's head rewritten for a link: the link's tag, the
/// region offset, and the client the device acts for.
pub(super) fn rewrite_head(
    frame: &[u8],
    req: &request::Repr<'_>,
    link_tag: u64,
    at: RegionOffset,
    client_number: u32,
) -> [u8; FORWARD_HEAD_LEN] {
    let mut head = [0u8; FORWARD_HEAD_LEN];
    head.copy_from_slice(&frame[..FORWARD_HEAD_LEN]);
    let (frame_head, body) = head.split_at_mut(frame::HEADER_LEN);
    frame::Packet::new_unchecked(frame_head).set_tag(link_tag);
    let mut packet = request::Packet::new_unchecked(body);
    // The server learns which client the device acts for (it checks that
    // client's grants when it authenticates its peers).
    packet.set_flags(packet.flags() | request::flags::REGION_ADDRESSED | request::flags::ON_BEHALF);
    packet.set_region(at.region.0);
    packet.set_addr(at.offset);
    match req.exactly_once {
        // The client picks the lane; its number is the device's to say.
        Some(once) => packet.set_client(once.stamped(client_number).client),
        None => packet.set_client(client_number & request::CLIENT_NUMBER_MASK),
    }
    head
}
