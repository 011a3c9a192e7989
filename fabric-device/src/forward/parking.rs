//! Requests that arrive while every link to their region is still on its
//! first connection attempt (right after the device starts) wait here
//! instead of failing, bounded in number and by the request timeout.

use std::time::Instant;

use proto::Opcode;

use super::{ConnId, Forwarder, LinkStatus};

/// A request that arrived while every link to its region was still
/// starting; it is handled again once one is up (or none is starting).
#[derive(Debug)]
pub(super) struct Parked {
    pub(super) conn: ConnId,
    pub(super) region: u32,
    pub(super) frame: Vec<u8>,
    pub(super) opcode: Opcode,
    pub(super) tag: u64,
    pub(super) deadline: Instant,
}

/// Requests parked at most, over all clients; beyond, they fail at once.
pub(super) const MAX_PARKED: usize = 4096;

impl Forwarder {
    /// Whether some link to `region` is still on its first attempt.
    pub(super) fn region_starting(&self, region: u32) -> bool {
        if let Some(starting) = self.copies_starting(region) {
            return starting;
        }
        self.map
            .region_links
            .get(region as usize)
            .is_some_and(|links| {
                links.iter().any(|&i| {
                    self.links
                        .get(&self.link_ids[i].main)
                        .is_some_and(|l| l.starting && l.status != LinkStatus::Up)
                })
            })
    }

    /// Keeps a request for a server whose links are still starting (right
    /// after the device starts), bounded by the request timeout and
    /// [`MAX_PARKED`]; false when it must fail now.
    pub(super) fn park(
        &mut self,
        conn: ConnId,
        frame: &[u8],
        region: u32,
        opcode: Opcode,
        tag: u64,
        now: Instant,
    ) -> bool {
        if self.parked.len() >= MAX_PARKED || !self.region_starting(region) {
            return false;
        }
        self.parked.push(Parked {
            conn,
            region,
            frame: frame.to_vec(),
            opcode,
            tag,
            deadline: now + self.config.request_timeout,
        });
        if let Some(session) = self.sessions.get_mut(&conn) {
            session.in_flight += 1;
        }
        true
    }

    /// Parked requests that can go now (a link to their region is up, or
    /// none is starting any more): the driver hands each to
    /// [`Forwarder::client_frame`] again, which forwards or refuses it.
    pub fn take_unparked(&mut self) -> Vec<(ConnId, Vec<u8>)> {
        if self.parked.is_empty() {
            return Vec::new();
        }
        let (ready, waiting): (Vec<Parked>, Vec<Parked>) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|p| !self.region_starting(p.region));
        self.parked = waiting;
        ready
            .into_iter()
            .map(|p| {
                if let Some(session) = self.sessions.get_mut(&p.conn) {
                    session.in_flight = session.in_flight.saturating_sub(1);
                }
                (p.conn, p.frame)
            })
            .collect()
    }
}
