//! Request deadlines in the forwarding core: a request unanswered in time is
//! answered TIMEOUT, and the link it waited on is reported silent.

use std::time::Instant;

use proto::Status;

use super::copy_ticket::CopyTicket;
use super::links::{Pending, is_pending};
use super::parking::Parked;
use super::{ConnId, Forwarder, Reply, error_reply};
use crate::deadline::Deadline;
use crate::ids::LinkId;

impl Forwarder {
    /// Settles a pending request with an error status for its client.
    pub(super) fn answer(&mut self, pending: Pending, status: Status) -> Option<(ConnId, Reply)> {
        self.metrics.in_flight.dec();
        self.reply_bytes = self.reply_bytes.saturating_sub(pending.reply_bytes);
        let session = self.sessions.get_mut(&pending.conn)?;
        session.in_flight = session.in_flight.saturating_sub(1);
        session.reply_bytes = session.reply_bytes.saturating_sub(pending.reply_bytes);
        self.metrics.record(pending.opcode, status);
        Some((
            pending.conn,
            error_reply(pending.opcode, pending.client_tag, status),
        ))
    }

    /// When [`Forwarder::handle_timeouts`] next has work. Drops the
    /// deadlines of answered requests from the front of the queue first
    /// (done here, before the driver sleeps, rather than every turn).
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        let links = &self.links;
        self.deadlines.trim(|d| is_pending(links, d));
        let parked = self.parked.iter().map(|p| p.deadline).min();
        [
            self.deadlines.first(),
            parked,
            self.resync_wake(),
            self.fence_poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Answers TIMEOUT to every request whose deadline has passed. Also
    /// returns the links those requests were waiting on: a link that stops
    /// answering (a cut cable keeps TCP quiet for minutes) is to be closed
    /// and reconnected, which fails its other requests at once.
    pub fn handle_timeouts(&mut self, now: Instant) -> (Vec<(ConnId, Reply)>, Vec<LinkId>) {
        let mut replies = Vec::new();
        let mut silent = Vec::new();
        while let Some(Deadline {
            link: link_id, tag, ..
        }) = self.deadlines.pop_due(now)
        {
            let pending = self
                .links
                .get_mut(&link_id)
                .and_then(|l| l.pending.remove(&tag));
            if let Some(pending) = pending {
                if !silent.contains(&link_id) {
                    silent.push(link_id);
                }
                let reply = match pending.copy {
                    None => self.answer(pending, Status::Timeout),
                    Some(CopyTicket::Op(op)) => {
                        self.copy_request_failed(link_id, tag, op, Status::Timeout, now);
                        None
                    }
                    Some(CopyTicket::Read(_)) => {
                        self.copy_read_failed(pending, Status::Timeout, now)
                    }
                    Some(CopyTicket::Resync(ticket)) => {
                        self.resync_failed(ticket, Status::Timeout, now);
                        None
                    }
                };
                if let Some(reply) = reply {
                    replies.push(reply);
                }
            }
        }
        if self.parked.is_empty() {
            return (replies, silent);
        }
        let (expired, parked): (Vec<Parked>, Vec<Parked>) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|p| p.deadline <= now);
        self.parked = parked;
        for p in expired {
            if let Some(session) = self.sessions.get_mut(&p.conn) {
                session.in_flight = session.in_flight.saturating_sub(1);
                self.metrics.record(p.opcode, Status::Timeout);
                replies.push((p.conn, error_reply(p.opcode, p.tag, Status::Timeout)));
            }
        }
        (replies, silent)
    }
}
