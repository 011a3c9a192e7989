//! A fabric device the cluster map removed while its link was open: the
//! server stops serving it at the link's next frame. Its requests are
//! answered STALE_MAP with the epoch of the map that removed it, not
//! refused outright: nothing runs, and the device relays the answer to
//! its client, which moves to that epoch and sends the request again on a
//! path the new map keeps, so the application never sees the removal.
//! Anything else but a PING (a MAP_REQUEST for region keys, a key
//! rotation) is answered STALE_MAP the same way, and gives nothing away.
//! The link stays open: closing it would only make the device connect
//! again (refused at HELLO, it no longer has a key here) and fail the
//! requests it carries meanwhile.

use proto::fence;
use proto::response::ResponseKind;
use proto::{Message, Status};

use super::{Executor, Flow, encode, push_response};
use crate::gate::Session;

impl Executor {
    /// The epoch of the map that removed `session`'s device, when it was
    /// proven and the gatekeeper no longer admits it; counted once, here.
    pub(super) fn revoked_at(&self, session: &Session) -> Option<u64> {
        let Session::ProvenDevice { device } = session else {
            return None;
        };
        let gate = self.gate()?;
        if gate.admits_device(device) {
            return None;
        }
        self.metrics.auth_failures.with(&["revoked"]).inc();
        Some(gate.epoch().max(self.epoch()))
    }

    /// Answers one frame of a revoked device's link (see the module).
    pub(super) fn answer_revoked(&self, epoch: u64, frame: &[u8], out: &mut Vec<u8>) -> Flow {
        match proto::parse_frame(frame) {
            Ok((Message::Request(req), tag)) => {
                self.metrics.stale_map.inc();
                self.metrics
                    .record(req.operation, Status::StaleMap, std::time::Duration::ZERO);
                let kind = ResponseKind::answering(req.operation.opcode());
                push_response(out, tag, kind, Status::StaleMap, epoch, 0);
                Flow::Continue
            }
            Ok((Message::Ping(token), tag)) => {
                encode(&Message::Pong(token), tag, out);
                Flow::Continue
            }
            Ok((message, tag)) => {
                let reply = fence::epoch_reply(message.opcode(), tag, Status::StaleMap, epoch);
                out.extend_from_slice(&reply);
                Flow::Continue
            }
            Err(_) => Flow::Close,
        }
    }
}
