//! Request deadlines in the forwarding core: a request unanswered in time is
//! answered TIMEOUT, and the link it waited on is reported silent. A request
//! to one copy of a replicated region has a second, shorter deadline, the
//! copy timeout: past it the copy is lost (the link reported silent) when
//! the region can go on without it, so a silent copy holds its region's
//! operations for that long only.

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
        self.copy_deadlines.trim(|d| is_pending(links, d));
        let parked = self.parked.iter().map(|p| p.deadline).min();
        [
            self.deadlines.first(),
            self.copy_deadlines.first(),
            parked,
            self.resync_wake(),
            self.fence_poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Answers TIMEOUT to every request whose deadline has passed, and
    /// loses the copies whose requests are past the copy timeout (where the
    /// region has another copy to go on with). Also
    /// returns the links those requests were waiting on: a link that stops
    /// answering (a cut cable keeps TCP quiet for minutes) is to be closed
    /// and reconnected, which fails its other requests at once.
    pub fn handle_timeouts(&mut self, now: Instant) -> (Vec<(ConnId, Reply)>, Vec<LinkId>) {
        let mut replies = Vec::new();
        let mut silent = Vec::new();
        while let Some(due) = self.deadlines.pop_due(now) {
            replies.extend(self.time_out(due, &mut silent, now));
        }
        while let Some(due) = self.copy_deadlines.pop_due(now) {
            if self.copy_may_time_out(due.link, due.tag, now) {
                replies.extend(self.time_out(due, &mut silent, now));
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

    /// Settles the request `due` names if it is still waited for (its link
    /// then goes into `silent`): TIMEOUT for its client, or, for a copy of a
    /// replicated region, the copy lost and the operation going on with the
    /// others.
    fn time_out(
        &mut self,
        due: Deadline,
        silent: &mut Vec<LinkId>,
        now: Instant,
    ) -> Option<(ConnId, Reply)> {
        let Deadline {
            link: link_id, tag, ..
        } = due;
        let pending = self
            .links
            .get_mut(&link_id)
            .and_then(|l| l.pending.remove(&tag))?;
        if !silent.contains(&link_id) {
            silent.push(link_id);
        }
        match pending.copy {
            None => self.answer(pending, Status::Timeout),
            Some(CopyTicket::Op(op)) => {
                self.copy_request_failed(link_id, tag, op, Status::Timeout, now);
                None
            }
            Some(CopyTicket::Read(_)) => self.copy_read_failed(pending, Status::Timeout, now),
            Some(CopyTicket::Resync(ticket)) => {
                self.resync_failed(ticket, Status::Timeout, now);
                None
            }
        }
    }

    /// Whether request `tag` of `link_id`, past its copy timeout at `now`,
    /// is still waited for and waits on a copy the region can go on
    /// without (see [`Forwarder::copy_may_be_dropped`]); else it waits for
    /// the request timeout.
    fn copy_may_time_out(&self, link_id: LinkId, tag: u64, now: Instant) -> bool {
        let Some(pending) = self.links.get(&link_id).and_then(|l| l.pending.get(&tag)) else {
            return false;
        };
        match &pending.copy {
            Some(CopyTicket::Op(op)) => self
                .op_copy(*op, link_id, tag)
                .is_some_and(|(region, copy)| self.copy_may_be_dropped(region, copy, now)),
            Some(CopyTicket::Read(again)) => {
                self.copy_may_be_dropped(again.region, again.copy, now)
            }
            Some(CopyTicket::Resync(_)) | None => false,
        }
    }
}
