//! Owner failover in the forwarding core.
//!
//! - **Suspicion.** A request for a replicated region this device does not
//!   own is answered NOT_OWNER, and the region's owner is reported as
//!   suspected ([`Outgoing::OwnerSuspected`], at most once per
//!   [`SUSPECT_EVERY`] per owner): the driver probes it and, when it is
//!   dead and this device is its successor, takes its regions over in the
//!   map. The new map makes this device the owner.
//! - **Fencing before serving.** A device that becomes a region's owner
//!   holds the region's requests (in its queue, as behind an undecided
//!   atomic) until the server of every copy that takes writes has said, in
//!   its answer to MAP_EPOCH, that it runs the epoch of that map or a newer
//!   one. From then on the server refuses the old owner's links, which say
//!   an older epoch (STALE_MAP), so nothing the old owner still sends can
//!   land behind the new owner's writes. MAP_EPOCH is said again every
//!   [`RESAY_EVERY`] to a server that is behind; a copy whose server has
//!   not confirmed within the request timeout is lost (never the last
//!   serving one, whose requests then simply go out).
//! - **Deposed.** A device the map no longer names as a region's owner
//!   answers the requests it had queued for it NOT_OWNER (nothing ran; the
//!   client sends them to the new owner); those already sent to the copies
//!   finish as they would have. A server that answers NOT_OWNER (its map
//!   names another owner) makes the device read the map now, and that
//!   answer is not taken for a copy that missed a change.

use std::collections::HashMap;
use std::time::Duration;

use topology::FabricDeviceId;

use super::*;

/// How often at most one owner is reported suspected.
pub(in crate::forward) const SUSPECT_EVERY: Duration = Duration::from_millis(20);
/// How often MAP_EPOCH is said again to a server a new owner waits for.
pub(in crate::forward) const RESAY_EVERY: Duration = Duration::from_millis(20);

/// Takeover bookkeeping of the core.
#[derive(Debug, Default)]
pub(super) struct Takeovers {
    /// When each owner was last reported suspected.
    suspected: HashMap<FabricDeviceId, Instant>,
    /// The newest epoch each server said it runs (0: it follows no map).
    server_epochs: HashMap<ServerId, u64>,
    /// When each server last said an epoch (answered MAP_EPOCH).
    said_at: HashMap<ServerId, Instant>,
    /// Some region's requests wait for its copies' servers.
    any_waiting: bool,
    /// When MAP_EPOCH is said again to the servers waited for.
    resay_at: Option<Instant>,
}

impl Takeovers {
    /// The newest epoch `server` said it runs (0: it follows no map), if
    /// it said one.
    pub(super) fn said_epoch(&self, server: &ServerId) -> Option<u64> {
        self.server_epochs.get(server).copied()
    }
}

/// A region's fence: the epoch its copies' servers must confirm before
/// this device, its new owner, sends its requests.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Fence {
    /// Ownership was gained with the last map; the epoch is not set yet.
    gained: bool,
    /// It was gained from another owner (not at start, or with the
    /// region): said in the log.
    moved: bool,
    /// The epoch to be confirmed.
    epoch: u64,
    /// Requests wait until it is.
    waiting: bool,
    /// When the wait began (set at the first resend pass).
    since: Option<Instant>,
}

impl Fence {
    /// The fence of a region this device owns after a new map: carried
    /// over when it owned the region before, a fresh one when it gains it.
    pub(super) fn after_map(before: Option<(bool, Fence)>, owner: bool) -> Fence {
        match (before, owner) {
            (_, false) => Fence::default(),
            (Some((true, fence)), true) => fence,
            (before, true) => Fence {
                gained: true,
                moved: before.is_some(),
                ..Fence::default()
            },
        }
    }

    /// Whether the region's requests wait.
    pub(super) fn waiting(&self) -> bool {
        self.waiting
    }
}

/// A region the driver may take over from its owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedRegion {
    /// The region's id.
    pub region: RegionId,
    /// The version of its record this device runs.
    pub version: u64,
    /// This device has a link up to a serving copy's server.
    pub reachable: bool,
    /// Each serving copy's server, in set order, and whether this device
    /// has a link up to it.
    pub serving: Vec<(ServerId, bool)>,
}

/// What a device heard from a server since a moment
/// ([`Forwarder::server_heard_since`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeardSince {
    /// It said an epoch (answered MAP_EPOCH) since.
    Answered,
    /// It said none, but a link to it is connected or connecting.
    Linked,
    /// It said none, and every link to it is down.
    Silent,
}

impl Forwarder {
    /// A request for replicated `region` reached this device, which does
    /// not own it: its owner is reported suspected (rate-limited).
    pub(super) fn suspect_owner(&mut self, region: u32, now: Instant) {
        let Some(owner) = self
            .map
            .replica_sets
            .get(region as usize)
            .and_then(Option::as_ref)
            .map(|set| set.owner.clone())
        else {
            return;
        };
        if owner == self.map.device {
            return;
        }
        let takeovers = &mut self.replication.takeovers;
        let recent = takeovers
            .suspected
            .get(&owner)
            .is_some_and(|&at| now.saturating_duration_since(at) < SUSPECT_EVERY);
        if recent {
            return;
        }
        takeovers.suspected.insert(owner.clone(), now);
        self.replication
            .outbox
            .push(Outgoing::OwnerSuspected { owner });
    }

    /// The replicated regions `owner` orders by this device's map, with
    /// the versions of their records and which serving copies this device
    /// reaches.
    pub fn owned_by(&self, owner: &FabricDeviceId) -> Vec<OwnedRegion> {
        self.map
            .layout
            .entries()
            .iter()
            .zip(&self.map.replica_sets)
            .filter_map(|(entry, set)| {
                let set = set.as_ref().filter(|s| &s.owner == owner)?;
                let state = self.region_state(entry.region.0)?;
                let serving: Vec<(ServerId, bool)> = state
                    .copies
                    .iter()
                    .filter(|c| c.state == ReplicaState::Serving)
                    .map(|c| (c.server.clone(), self.write_link(&c.links).is_some()))
                    .collect();
                Some(OwnedRegion {
                    region: entry.region_id.clone(),
                    version: set.version,
                    reachable: serving.iter().any(|(_, up)| *up),
                    serving,
                })
            })
            .collect()
    }

    /// The regions this device gained with the map just applied wait for
    /// their copies' servers to confirm `epoch` (on a topology file, epoch
    /// 0, nothing is fenced).
    pub(in crate::forward) fn fence_new_owners(&mut self, epoch: u64) {
        self.replication_changed();
        let mut gained = Vec::new();
        for (region, state) in self.replication.regions.iter_mut().enumerate() {
            let Some(state) = state.as_mut().filter(|s| s.fence.gained) else {
                continue;
            };
            let moved = state.fence.moved;
            state.fence = Fence::default();
            if epoch > 0 {
                state.fence = Fence {
                    epoch,
                    waiting: true,
                    ..Fence::default()
                };
                gained.push((region as u32, moved));
            }
        }
        for (region, moved) in gained {
            if moved {
                tracing::info!(
                    "region {}: this device owns it from map epoch {epoch}; its requests wait \
                     until every copy's server runs that epoch",
                    self.region_state(region).map_or("?", |s| s.id.as_str())
                );
            }
            self.replication.takeovers.any_waiting = true;
            if self.fence_confirmed(region)
                && let Some(state) = self.region_state_mut(region)
            {
                state.fence.waiting = false;
            }
        }
        self.replication.takeovers.resay_at = None;
        self.update_any_waiting();
    }

    /// A server said (answering MAP_EPOCH on `link`) that it runs `epoch`:
    /// regions whose copies' servers have now all confirmed their fence
    /// send what waited.
    pub(in crate::forward) fn server_said_epoch(&mut self, link: LinkId, epoch: u64, now: Instant) {
        self.replication_changed();
        let Some(server) = self.links.get(&link).map(|l| l.target.server.clone()) else {
            return;
        };
        let known = self
            .replication
            .takeovers
            .server_epochs
            .entry(server.clone())
            .or_insert(epoch);
        // A server that follows no map says 0 and cannot be fenced.
        *known = if epoch == 0 { 0 } else { (*known).max(epoch) };
        self.replication.takeovers.said_at.insert(server, now);
        self.release_fences(now);
        self.resend_stale(now);
    }

    /// What this device heard from `server` since `since`, for moving a
    /// deciding role off it: a copy whose server said an epoch since the
    /// takeover may have acknowledged the new owner's writes alone, and a
    /// link not down may still carry them.
    pub fn server_heard_since(&self, server: &ServerId, since: Instant) -> HeardSince {
        let said = self.replication.takeovers.said_at.get(server);
        if said.is_some_and(|&at| at >= since) {
            return HeardSince::Answered;
        }
        let linked = self
            .links
            .values()
            .any(|l| &l.target.server == server && l.status != LinkStatus::Down);
        if linked {
            HeardSince::Linked
        } else {
            HeardSince::Silent
        }
    }

    /// Whether every copy of `region` that takes writes has confirmed the
    /// region's fence: its server said the epoch or a newer one, or said
    /// it follows no map, or has no link up (such a copy is lost when a
    /// request needs it).
    fn fence_confirmed(&self, region: u32) -> bool {
        let Some(state) = self.region_state(region) else {
            return true;
        };
        let epochs = &self.replication.takeovers.server_epochs;
        state.copies.iter().filter(|c| c.takes_writes()).all(|c| {
            let said = epochs.get(&c.server).copied();
            said.is_some_and(|e| e == 0 || e >= state.fence.epoch)
                || (self.write_link(&c.links).is_none() && !self.copy_links_starting(&c.links))
        })
    }

    /// Whether `server` said it runs the epoch from which this device owns
    /// `region` (or a newer one, or no map at all): from then on it refuses
    /// what any device sent under an older map (STALE_MAP), plain-path
    /// writes of a region that had a single copy among them.
    pub(super) fn owned_epoch_confirmed(&self, region: u32, server: &ServerId) -> bool {
        let Some(state) = self.region_state(region) else {
            return true;
        };
        let said = self.replication.takeovers.said_epoch(server);
        state.fence.epoch == 0 || said.is_some_and(|e| e == 0 || e >= state.fence.epoch)
    }

    /// Ends the wait of every fenced region whose servers confirmed.
    fn release_fences(&mut self, now: Instant) {
        if !self.replication.takeovers.any_waiting {
            return;
        }
        let ready: Vec<u32> = (0..self.replication.regions.len() as u32)
            .filter(|&r| self.region_state(r).is_some_and(|s| s.fence.waiting))
            .filter(|&r| self.fence_confirmed(r))
            .collect();
        for region in ready {
            self.end_fence(region, now);
        }
        self.update_any_waiting();
    }

    fn end_fence(&mut self, region: u32, now: Instant) {
        if let Some(state) = self.region_state_mut(region) {
            state.fence.waiting = false;
        }
        self.release_queue(region, now);
    }

    fn update_any_waiting(&mut self) {
        self.replication.takeovers.any_waiting = self
            .replication
            .regions
            .iter()
            .flatten()
            .any(|s| s.fence.waiting);
    }

    /// What the driver sends for fenced regions and for parts of requests
    /// refused STALE_MAP: MAP_EPOCH again on a main link to each server
    /// not confirmed yet, every [`RESAY_EVERY`]. A copy still unconfirmed
    /// after the request timeout is lost, and its region (or request)
    /// stops waiting for it.
    pub fn fence_resends(&mut self, now: Instant) -> Vec<(LinkId, Vec<u8>)> {
        let mut said = self.fence_resays(now);
        let mut stale = self.stale_resays(now);
        stale.extend(self.resync_sources_to_confirm());
        if stale.is_empty() {
            return said;
        }
        if let Some(message) = self.link_opened_epoch() {
            for link in stale {
                if !said.iter().any(|(l, _)| *l == link) {
                    said.push((link, message.clone()));
                }
            }
        }
        said
    }

    /// [`Self::fence_resends`] for fenced regions.
    fn fence_resays(&mut self, now: Instant) -> Vec<(LinkId, Vec<u8>)> {
        // A server whose links went down meanwhile is waited for no more.
        self.release_fences(now);
        if !self.replication.takeovers.any_waiting {
            return Vec::new();
        }
        let patience = self.config.request_timeout;
        let mut overdue = Vec::new();
        for (region, state) in self.replication.regions.iter_mut().enumerate() {
            let Some(state) = state.as_mut().filter(|s| s.fence.waiting) else {
                continue;
            };
            let since = *state.fence.since.get_or_insert(now);
            if now.saturating_duration_since(since) >= patience {
                overdue.push(region as u32);
            }
        }
        for region in overdue {
            self.give_up_fence(region, now);
        }
        self.update_any_waiting();
        let due = self
            .replication
            .takeovers
            .resay_at
            .is_none_or(|at| at <= now);
        if !self.replication.takeovers.any_waiting || !due {
            return Vec::new();
        }
        self.replication.takeovers.resay_at = Some(now + RESAY_EVERY);
        let Some(message) = self.link_opened_epoch() else {
            return Vec::new();
        };
        let mut links: Vec<LinkId> = Vec::new();
        for region in 0..self.replication.regions.len() as u32 {
            for (link, _) in self.unconfirmed_copies(region) {
                if let Some(link) = link
                    && !links.contains(&link)
                {
                    links.push(link);
                }
            }
        }
        links.into_iter().map(|l| (l, message.clone())).collect()
    }

    /// The copies of fenced `region` whose servers have not confirmed: the
    /// main link up to each (if any) and the copy's position.
    fn unconfirmed_copies(&self, region: u32) -> Vec<(Option<LinkId>, usize)> {
        let Some(state) = self.region_state(region).filter(|s| s.fence.waiting) else {
            return Vec::new();
        };
        let epochs = &self.replication.takeovers.server_epochs;
        state
            .copies
            .iter()
            .enumerate()
            .filter(|(_, c)| c.takes_writes())
            .filter(|(_, c)| {
                !epochs
                    .get(&c.server)
                    .is_some_and(|&e| e == 0 || e >= state.fence.epoch)
            })
            .map(|(i, c)| (self.write_link(&c.links), i))
            .collect()
    }

    /// A fenced region waited the request timeout: the copies whose servers
    /// have a link up and did not confirm are lost (a server with no link
    /// up loses its copy when a request needs it), and the region's
    /// requests go.
    fn give_up_fence(&mut self, region: u32, now: Instant) {
        for (link, copy) in self.unconfirmed_copies(region) {
            if link.is_none() {
                continue;
            }
            self.lose_copy(
                region,
                copy,
                "its server did not confirm the map epoch of this device's ownership in time",
                now,
            );
        }
        self.end_fence(region, now);
    }

    /// When [`Forwarder::fence_resends`] next has work, if a region or a
    /// part refused STALE_MAP waits.
    pub(in crate::forward) fn fence_poll_timeout(&self) -> Option<Instant> {
        let fenced = self.fenced_poll_timeout();
        let stale = self.stale_poll_timeout();
        match (fenced, stale) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn fenced_poll_timeout(&self) -> Option<Instant> {
        let takeovers = &self.replication.takeovers;
        if !takeovers.any_waiting {
            return None;
        }
        let patience = self.config.request_timeout;
        let give_up = self
            .replication
            .regions
            .iter()
            .flatten()
            .filter(|s| s.fence.waiting)
            .filter_map(|s| s.fence.since.map(|at| at + patience))
            .min();
        match (takeovers.resay_at, give_up) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Requests this device had queued for regions the new map gives to
    /// another owner: answered NOT_OWNER (nothing ran).
    pub(super) fn answer_deposed(&mut self, deposed: Vec<Queued>) {
        for q in deposed {
            let Ok((Message::Request(req), tag)) = proto::parse_frame(&q.frame) else {
                continue;
            };
            let Some(session) = self.sessions.get_mut(&q.conn) else {
                continue;
            };
            session.in_flight = session.in_flight.saturating_sub(1);
            let reply = self.not_owner_reply(req.operation.opcode(), tag);
            self.replication.outbox.push(Outgoing::Answer {
                conn: q.conn,
                reply,
            });
        }
    }
}
