//! Copies that fail: a request that timed out or whose link broke, a
//! server with no link up; the copy stops being used and its loss is
//! reported, never the last serving copy's.

use super::*;

impl Forwarder {
    /// A request of operation `op_id` to one copy failed (`status`: its
    /// link went down, or it timed out): the copy is lost, or, when it is
    /// the last serving one, the operation fails with `status`.
    pub(in crate::forward) fn copy_request_failed(
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

    /// The region and copy that request `link_tag` on `link` of operation
    /// `op_id` waits on, while it waits.
    pub(in crate::forward) fn op_copy(
        &self,
        op_id: u64,
        link: LinkId,
        link_tag: u64,
    ) -> Option<(u32, usize)> {
        let op = self.replication.ops.get(&op_id)?;
        op.sends
            .iter()
            .find(|s| s.link == link && s.tag == link_tag && !s.settled())
            .map(|s| (op.region, s.copy))
    }

    /// Whether `region` can go on without its copy `copy`, whose request
    /// is past the copy timeout at `now`: the copy does not serve, or
    /// another serving copy is answering (its server has nothing pending
    /// past the copy timeout). When every serving copy's server is that
    /// late, none is singled out: their requests wait for the request
    /// timeout, so a slow but live copy is not dropped in favour of a dead
    /// one.
    pub(in crate::forward) fn copy_may_be_dropped(
        &self,
        region: u32,
        copy: usize,
        now: Instant,
    ) -> bool {
        let Some(state) = self.region_state(region) else {
            return false;
        };
        let Some(c) = state.copies.get(copy) else {
            return false;
        };
        c.state != ReplicaState::Serving
            || state.copies.iter().enumerate().any(|(i, other)| {
                i != copy
                    && other.state == ReplicaState::Serving
                    && !self.late_on(&other.links, now)
            })
    }

    /// Whether a link at `positions` has a request pending past the copy
    /// timeout at `now`.
    fn late_on(&self, positions: &[usize], now: Instant) -> bool {
        let patience = self.config.copy_timeout;
        positions
            .iter()
            .filter_map(|&p| self.link_ids.get(p))
            .flat_map(|lanes| [lanes.main, lanes.bulk])
            .filter_map(|id| self.links.get(&id))
            .any(|link| link.pending.values().any(|p| p.sent + patience <= now))
    }

    /// Every server link of a copy of an owned region went down: the copies
    /// it held are lost (those whose server has no main link up any more).
    pub(in crate::forward) fn copies_unreachable(&mut self, server: &ServerId, now: Instant) {
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

    pub(super) fn copy_links_starting(&self, positions: &[usize]) -> bool {
        positions.iter().any(|&i| {
            self.links
                .get(&self.link_ids[i].main)
                .is_some_and(|l| l.starting)
        })
    }

    /// Stops using `region`'s copy `copy`: offline here, reported to the
    /// driver, dropped from the operations waiting on it. False (and
    /// nothing changes) when it is the last serving copy.
    pub(super) fn lose_copy(&mut self, region: u32, copy: usize, why: &str, now: Instant) -> bool {
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
        self.replication_changed();
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
            for send in op
                .sends
                .iter_mut()
                .filter(|s| s.copy == copy && !s.settled())
            {
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
        self.resync_copy_lost(region, copy, now);
        true
    }

    pub(super) fn progress_region(&mut self, region: u32, now: Instant) {
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
}
