//! Fencing by map epoch, the rule every listener (fabric device, server)
//! applies: which requests of a connection may run, given the epoch of the
//! cluster map the connection said (MAP_EPOCH) and the one the listener
//! runs.
//!
//! - A connection that said no epoch (or 0) is unfenced: served as if
//!   fencing did not exist. So is every connection of a listener that
//!   follows no map (epoch 0, a topology file).
//! - A connection at an older epoch than the listener's is refused
//!   STALE_MAP, whatever it asks: nothing runs, nothing is passed on.
//! - A connection at the listener's epoch or a newer one is served; when
//!   it is newer and the listener's map lacks what a request names, the
//!   request is refused STALE_MAP instead of UNMAPPED (the listener is
//!   behind its own watch; the address may well be right).
//!
//! Every STALE_MAP carries the listener's epoch in the response's value.

use crate::frame::HEADER_LEN;
use crate::{Opcode, Status, response};

/// The epoch one connection runs, as far as this listener knows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnEpoch(Option<u64>);

/// What to do with a connection's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Serve it as without fencing.
    Serve,
    /// Serve it, but answer STALE_MAP instead of UNMAPPED: the connection
    /// runs a newer map than the listener.
    ServeAhead,
    /// Refuse it STALE_MAP: the connection runs an older map.
    Stale,
}

impl ConnEpoch {
    /// Records what MAP_EPOCH said (0: the peer follows no map, so the
    /// connection is unfenced from now on).
    pub fn said(&mut self, epoch: u64) {
        self.0 = (epoch > 0).then_some(epoch);
    }

    /// The epoch said, if the connection is fenced.
    pub fn get(self) -> Option<u64> {
        self.0
    }

    /// What to do with a request of this connection while the listener
    /// runs epoch `ours` (0: it follows no map).
    pub fn verdict(self, ours: u64) -> Verdict {
        match self.0 {
            _ if ours == 0 => Verdict::Serve,
            None => Verdict::Serve,
            Some(theirs) if theirs < ours => Verdict::Stale,
            Some(theirs) if theirs > ours => Verdict::ServeAhead,
            Some(_) => Verdict::Serve,
        }
    }

    /// The status that answers MAP_EPOCH once it is recorded: STALE_MAP
    /// when the connection is fenced and the listener's epoch `ours` is
    /// newer, OK otherwise.
    pub fn acknowledgement(self, ours: u64) -> Status {
        match self.verdict(ours) {
            Verdict::Stale => Status::StaleMap,
            Verdict::Serve | Verdict::ServeAhead => Status::Ok,
        }
    }
}

/// The refusal `status` of a request of a connection judged `verdict`:
/// UNMAPPED becomes STALE_MAP for a connection ahead of the listener.
pub fn refusal(verdict: Verdict, status: Status) -> Status {
    match (verdict, status) {
        (Verdict::ServeAhead, Status::Unmapped) => Status::StaleMap,
        _ => status,
    }
}

/// The response to a request (or MAP_EPOCH) with `opcode` and `tag`:
/// `status`, with `epoch` (the listener's) in its value.
pub fn epoch_reply(
    opcode: Opcode,
    tag: u64,
    status: Status,
    epoch: u64,
) -> [u8; crate::ERROR_REPLY_LEN] {
    let mut out = crate::error_reply(opcode, tag, status);
    response::Packet::new_unchecked(&mut out[HEADER_LEN..]).set_value(epoch);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(epoch: u64) -> ConnEpoch {
        let mut conn = ConnEpoch::default();
        conn.said(epoch);
        conn
    }

    #[test]
    fn older_connections_are_stale_newer_ones_served_ahead() {
        assert_eq!(at(3).verdict(4), Verdict::Stale);
        assert_eq!(at(4).verdict(4), Verdict::Serve);
        assert_eq!(at(5).verdict(4), Verdict::ServeAhead);
    }

    #[test]
    fn unfenced_connections_and_listeners_on_a_file_are_served() {
        assert_eq!(ConnEpoch::default().verdict(7), Verdict::Serve);
        assert_eq!(at(0).verdict(7), Verdict::Serve);
        assert_eq!(at(3).verdict(0), Verdict::Serve);
        // Saying 0 later lifts the fence.
        let mut conn = at(3);
        conn.said(0);
        assert_eq!(conn.get(), None);
    }

    #[test]
    fn map_epoch_is_acknowledged_stale_only_when_the_listener_is_newer() {
        assert_eq!(at(3).acknowledgement(4), Status::StaleMap);
        assert_eq!(at(4).acknowledgement(4), Status::Ok);
        assert_eq!(at(9).acknowledgement(4), Status::Ok);
        assert_eq!(at(0).acknowledgement(4), Status::Ok);
    }

    #[test]
    fn only_unmapped_turns_stale_and_only_ahead() {
        assert_eq!(
            refusal(Verdict::ServeAhead, Status::Unmapped),
            Status::StaleMap
        );
        assert_eq!(refusal(Verdict::Serve, Status::Unmapped), Status::Unmapped);
        assert_eq!(
            refusal(Verdict::ServeAhead, Status::AccessDenied),
            Status::AccessDenied
        );
    }

    #[test]
    fn the_reply_carries_the_listeners_epoch() {
        let reply = epoch_reply(Opcode::FetchAdd, 42, Status::StaleMap, 9);
        let (message, tag) = crate::parse_frame(&reply).unwrap();
        assert_eq!(tag, 42);
        let crate::Message::Response(r) = message else {
            panic!("not a response: {message:?}");
        };
        assert_eq!(r.status, Status::StaleMap);
        assert_eq!(r.value, 9);
        assert_eq!(r.kind.opcode(), Opcode::AtomicAcknowledge);
    }
}
