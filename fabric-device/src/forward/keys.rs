//! Region keys in the forwarding core: learnt from each region's own
//! server (when a link opens, and again after the server refuses a
//! request, since an operator may have rotated a key), and passed on in
//! each client's MAP for the regions its grants reach.

use std::time::Instant;

use proto::{AccessKey, Message, Opcode, RegionIndex, map};

use super::links::KeyRefresh;
use super::{ClientAction, ConnId, Forwarder, LinkAction, LinkId, LinkStatus, frame_reply};
use crate::link_tags::KEY_REFRESH_TAG;

impl Forwarder {
    /// The MAP for the client on `conn`: every region, with the keys of
    /// those its grants reach (0 for the others, and for all without a
    /// session). While a reached region's key is not known yet because its
    /// server's links are still starting, the MAP waits, like a request.
    pub(super) fn map_reply(
        &mut self,
        conn: ConnId,
        frame: &[u8],
        tag: u64,
        now: Instant,
    ) -> ClientAction<'static> {
        let mut map = self.map.layout.to_map();
        let policy = self
            .sessions
            .get(&conn)
            .and_then(|s| s.client.as_ref())
            .map(|(_, policy)| policy);
        let mut unknown = None;
        for entry in &mut map.entries {
            let reached = policy.is_some_and(|p| p.grants.overlaps(entry.start, entry.len));
            if !reached {
                entry.key = AccessKey::NONE;
                continue;
            }
            if entry.key.is_none()
                && let Some(key) = self.serving_copy_key(entry.region.0)
            {
                entry.key = key;
            }
            if entry.key.is_none() && unknown.is_none() {
                unknown = Some(entry.region.0);
            }
        }
        if let Some(region) = unknown
            && self.park(conn, frame, region, Opcode::MapRequest, tag, now)
        {
            return ClientAction::Nothing;
        }
        ClientAction::Reply(frame_reply(&Message::Map(map), tag))
    }

    /// Records the keys `server` gives for its own regions (a server has
    /// no say over another's keys).
    pub(super) fn learn_keys(&mut self, server: &topology::ServerId, theirs: &map::Repr) {
        let own = |region: RegionIndex| {
            self.map
                .layout
                .entry(region)
                .is_some_and(|e| &e.server == server)
        };
        let entries = theirs
            .entries
            .iter()
            .filter(|e| !e.key.is_none() && own(e.region))
            .map(|e| (e.region, e.key))
            .collect::<Vec<_>>();
        for (region, key) in entries {
            self.map.layout.set_key(region, key);
        }
        // Each copy of a replicated region has its own key on its server.
        for entry in theirs.entries.iter().filter(|e| !e.key.is_none()) {
            self.learn_copy_key(entry.region.0, server, entry.key);
        }
    }

    /// Asks for `link`'s keys again at the next [`Forwarder::key_refresh`],
    /// unless a refresh is under way. A server on verbs never sees the keys
    /// of the requests its RNIC executes, so nothing refuses a rotated one
    /// there: the driver polls such links' keys instead.
    pub fn refresh_keys_soon(&mut self, link_id: LinkId) {
        if let Some(link) = self.links.get_mut(&link_id)
            && link.key_refresh == KeyRefresh::Current
        {
            link.key_refresh = KeyRefresh::PollDue;
        }
    }

    /// The MAP_REQUEST that refreshes `link`'s keys, when one is due (a
    /// server refused a request on it); the driver sends it on the link.
    pub fn key_refresh(&mut self, link_id: LinkId) -> Option<Vec<u8>> {
        let link = self.links.get_mut(&link_id)?;
        if link.status != LinkStatus::Up {
            return None;
        }
        match link.key_refresh {
            KeyRefresh::Due => self.metrics.key_refreshes.inc(),
            KeyRefresh::PollDue => self.metrics.key_polls.inc(),
            KeyRefresh::Current | KeyRefresh::Asked => return None,
        }
        link.key_refresh = KeyRefresh::Asked;
        Message::MapRequest.encode_to_vec(KEY_REFRESH_TAG).ok()
    }

    /// The server's answer to a key refresh: its keys are learnt, if it
    /// still agrees with the map (else the link is closed and reconnects).
    pub(super) fn keys_refreshed<'a>(&mut self, link_id: LinkId, frame: &[u8]) -> LinkAction<'a> {
        let Some(link) = self.links.get_mut(&link_id) else {
            return LinkAction::Nothing;
        };
        if link.key_refresh != KeyRefresh::Asked {
            return LinkAction::Close("key refresh answer on a link that asked none".into());
        }
        link.key_refresh = KeyRefresh::Current;
        let server = link.target.server.clone();
        let theirs = match proto::parse_frame(frame) {
            Ok((Message::Map(theirs), _)) => theirs,
            // Refused (the server does not answer MAP_REQUEST to this
            // device any more): keep the keys there are.
            Ok((Message::Response(_), _)) => return LinkAction::Nothing,
            Ok((other, _)) => {
                return LinkAction::Close(format!(
                    "unexpected {} frame answering a key refresh",
                    other.opcode()
                ));
            }
            Err(e) => return LinkAction::Close(format!("bad key refresh answer: {e}")),
        };
        if !self.map.server_agrees(&server, &theirs) {
            return LinkAction::Close(format!(
                "server {server:?} serves a layout that disagrees with this device's map"
            ));
        }
        self.learn_keys(&server, &theirs);
        if let Some(link) = self.links.get_mut(&link_id) {
            link.server_map = Some(theirs);
        }
        LinkAction::Nothing
    }
}
