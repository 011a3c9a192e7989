//! A new map applied to the forwarding core: links kept, added, closed or
//! reconnected, and sessions' admission refreshed, without touching client
//! connections.

use std::collections::HashMap;

use proto::map;

use super::links::Lanes;
use super::{ConnId, Forwarder, Reply};
use crate::ids::{LinkClass, LinkId};
use crate::map::{DeviceMap, LinkTarget};

/// What a reload changed.
#[derive(Debug, Default)]
pub struct ReloadOutcome {
    /// New links to connect.
    pub connect: Vec<LinkId>,
    /// Links no longer in the topology: close them.
    pub disconnect: Vec<LinkId>,
    /// Links whose server disagrees with the new map: close them and
    /// reconnect (with backoff), so the handshake checks again.
    pub reconnect: Vec<LinkId>,
    /// Replies for requests that were in flight on removed links.
    pub failed: Vec<(ConnId, Reply)>,
}

impl Forwarder {
    /// Swaps in a new map without touching client connections. Links that
    /// keep their identity keep their connection if their server's MAP
    /// agrees with the new map, and are to be reconnected otherwise; new
    /// links are to be connected, removed ones closed. Sessions of clients
    /// the new topology no longer names lose their admission.
    pub fn reload(&mut self, map: DeviceMap) -> ReloadOutcome {
        let mut outcome = ReloadOutcome::default();
        let mut by_key: HashMap<(LinkTarget, LinkClass), LinkId> = self
            .links
            .iter()
            .map(|(id, l)| ((l.target.clone(), l.lane), *id))
            .collect();
        let mut link_ids = Vec::with_capacity(map.links.len());
        for spec in &map.links {
            let mut lane = |lane| match by_key.remove(&(spec.target.clone(), lane)) {
                Some(id) => id,
                None => {
                    let id = self.add_link(spec.target.clone(), lane);
                    outcome.connect.push(id);
                    id
                }
            };
            let lanes = Lanes {
                main: lane(LinkClass::Main),
                bulk: lane(LinkClass::Bulk),
            };
            link_ids.push(lanes);
        }
        for (_, id) in by_key {
            outcome.failed.extend(self.link_down(id));
            self.links.remove(&id);
            outcome.disconnect.push(id);
        }
        for id in link_ids.iter().flat_map(|l| [l.main, l.bulk]) {
            let agrees = self.links.get(&id).is_none_or(|l| {
                l.server_map
                    .as_ref()
                    .is_none_or(|theirs| map.server_agrees(&l.target.server, theirs))
            });
            if !agrees {
                outcome.failed.extend(self.link_down(id));
                outcome.reconnect.push(id);
            }
        }
        for session in self.sessions.values_mut() {
            session.client = session
                .client
                .take()
                .and_then(|(name, _)| map.clients.get(&name).map(|p| (name, p.clone())));
        }
        // Keys of regions that stay where they were carry over: a server
        // that is down now cannot tell them again.
        let kept_keys: HashMap<_, _> = self
            .map
            .layout
            .entries()
            .iter()
            .filter(|e| !e.key.is_none())
            .map(|e| ((e.region, e.start, e.len, e.server.clone()), e.key))
            .collect();
        let mut map = map;
        let carried: Vec<_> = map
            .layout
            .entries()
            .iter()
            .filter_map(|e| {
                let key = kept_keys.get(&(e.region, e.start, e.len, e.server.clone()))?;
                e.key.is_none().then_some((e.region, *key))
            })
            .collect();
        for (region, key) in carried {
            map.layout.set_key(region, key);
        }
        self.link_ids = link_ids;
        self.map = map;
        self.replication_from_map();
        // The new map knows no keys yet: the servers' last MAPs have them.
        let known: Vec<(topology::ServerId, map::Repr)> = self
            .links
            .values()
            .filter_map(|l| Some((l.target.server.clone(), l.server_map.clone()?)))
            .collect();
        for (server, theirs) in &known {
            self.learn_keys(server, theirs);
        }
        self.metrics
            .map_regions
            .set(self.map.layout.entries().len() as i64);
        outcome
    }
}
