//! Signals and new maps: draining on SIGTERM/SIGINT, SIGHUP reloads, maps
//! followed in etcd, and what a new map does to links.

use std::path::Path;

use super::*;

impl Device {
    pub(super) fn on_signal(&mut self, signal: i32) {
        match signal {
            SIGHUP => self.reload(),
            _ => {
                if self.draining.is_none() {
                    info!("signal {signal}, draining");
                    self.draining = Some(Instant::now() + self.config.forwarder.request_timeout);
                    for (port, (_, listener, _)) in self.listeners.iter_mut().enumerate() {
                        match &self.io {
                            Io::Epoll => {
                                let _ = self.poll.registry().deregister(listener);
                            }
                            Io::Uring(ring) => ring.stop_accepting(port),
                        }
                    }
                }
            }
        }
    }

    /// Re-reads the topology (and, with `--secrets`, the keys of its
    /// clients); a valid one replaces the map without touching client
    /// connections, an invalid one is refused and logged.
    pub(super) fn reload(&mut self) {
        let device = self.config.device.clone();
        let Some(path) = self.config.topology_path.clone() else {
            warn!("SIGHUP: no topology file to reload (the map follows etcd, if on it)");
            return;
        };
        let loaded = Topology::load(&path)
            .map_err(|e| error_chain(&e))
            .and_then(|t| match DeviceMap::new(&t, &device) {
                Ok(map) => Ok((t, map)),
                Err(e) => Err(error_chain(&e)),
            });
        let (topology, map) = match loaded {
            Ok(loaded) => loaded,
            Err(why) => {
                warn!("reload refused, keeping the old map: {why}");
                self.metrics.reloads.with(&["refused"]).inc();
                return;
            }
        };
        let keys = self.client_keys_for(&topology);
        let regions = self.replace_map(map);
        self.take_client_keys(keys, "reload");
        info!("reloaded {}: {regions} regions", path.display());
    }

    /// Applies the newest map the watcher handed over, as a reload does:
    /// client connections and requests in flight stay; one this device
    /// cannot run on (it is not in it, say) is refused and the old one kept.
    pub(super) fn apply_watched_map(&mut self) {
        let Some(update) = self.follow.as_ref().and_then(|f| f.watch.latest()) else {
            return;
        };
        let running = self.follow.as_ref().map_or(0, |f| f.epoch);
        let epoch = update.version.epoch;
        let map = match DeviceMap::new(&update.topology, &self.config.device) {
            Ok(map) => map.with_replica_states(&update.replica_sets),
            Err(e) => {
                warn!(
                    "map epoch={epoch} refused, keeping epoch={running}: {}",
                    error_chain(&e)
                );
                self.metrics.reloads.with(&["refused"]).inc();
                return;
            }
        };
        let when = format!("map epoch={epoch}");
        // What the core queued under the running epoch goes on its links
        // before they say the new one: sent after, a deposed owner's
        // request would reach a server on a connection at the new epoch,
        // which takes it, instead of being refused STALE_MAP.
        self.carry_out_replication(Instant::now());
        let keys = self.client_keys_for(&update.topology);
        let regions = self.replace_map(map);
        self.take_client_keys(keys, &when);
        let said = self.core.set_epoch(epoch);
        self.say_epoch(said);
        self.config.topology = update.topology.clone();
        self.metrics.map.applied(&update);
        if let Some(follow) = &mut self.follow {
            follow.epoch = epoch;
            if let Some(registration) = &follow.registration {
                registration.set_epoch(epoch);
            }
        }
        info!("map epoch={epoch} applied (was epoch={running}): {regions} regions");
    }

    /// With `--secrets`, the keys of `topology`'s clients, read again from
    /// the keys' folder (`None` without).
    fn client_keys_for(&self, topology: &Topology) -> Option<ClientKeys> {
        let dir = self.config.secrets.as_ref()?;
        Some(ClientKeys::read(dir, topology))
    }

    /// Puts the keys of the new map's clients in place (with `--secrets`),
    /// in the same turn as the map, logging who may now prove a key, who may
    /// no longer, and who cannot (no key file, or one that cannot be used:
    /// that client is left out, the rest of the map applies).
    fn take_client_keys(&mut self, keys: Option<ClientKeys>, when: &str) {
        let Some(keys) = keys else {
            return;
        };
        let dir = self
            .config
            .secrets
            .as_deref()
            .unwrap_or(Path::new(""))
            .display();
        let (added, dropped) = match self.core.client_keys() {
            Some(before) => keys.changes_from(before),
            None => (Vec::new(), Vec::new()),
        };
        for client in added {
            info!("{when}: client {client} may connect (its key from {dir})");
        }
        for client in dropped {
            info!("{when}: client {client} is no longer in the map: it may not connect");
        }
        for (client, file) in &keys.missing {
            warn!(
                "{when}: client {client} cannot connect: no key file {}",
                file.display()
            );
        }
        for unusable in &keys.unusable {
            warn!(
                "{when}: client {} cannot connect: {}",
                unusable.client,
                error_chain(unusable)
            );
        }
        self.core.require_client_keys(keys.keys);
    }

    /// Sends the device's MAP_EPOCH on the links the core named; a link
    /// that cannot take it is failed (and reconnects, saying it then).
    pub(super) fn say_epoch(&mut self, said: Vec<(LinkId, Vec<u8>)>) {
        // Called every turn: no clock read when there is nothing to say.
        if said.is_empty() {
            return;
        }
        let now = Instant::now();
        for (link, frame) in said {
            let Some(LinkConn::Connected { endpoint }) = self.links.get_mut(&link) else {
                continue;
            };
            if let Err(e) = endpoint.send(&frame, &[]) {
                self.link_failed(link, now, &format!("write failed: {e}"));
            }
        }
    }

    /// Asks the map watcher to read the map now when a server said it runs
    /// a newer epoch than the device.
    pub(super) fn reread_map_if_behind(&mut self) {
        if self.core.take_map_reread()
            && let Some(follow) = &mut self.follow
        {
            if follow.reread_logged != Some(follow.epoch) {
                follow.reread_logged = Some(follow.epoch);
                info!(
                    "a server runs a newer map epoch than this device's {}: reading the map now",
                    follow.epoch
                );
            }
            follow.watch.reread_now();
        }
    }

    /// Replaces the core's map by `map`, keeping client connections and
    /// the links it still has; the number of regions it maps.
    pub(super) fn replace_map(&mut self, map: DeviceMap) -> usize {
        let regions = map.layout.entries().len();
        let outcome = self.core.reload(map);
        self.deliver_all(outcome.failed);
        let now = Instant::now();
        for link in outcome.disconnect {
            self.reconnects.remove(link);
            if let Some(
                LinkConn::Connected { mut endpoint } | LinkConn::Connecting { mut endpoint },
            ) = self.links.remove(&link)
            {
                let _ = self.poll.registry().deregister(&mut endpoint.stream);
                if let Some(slot) = endpoint.ring_slot() {
                    self.ring_slots.remove(&slot);
                }
            }
        }
        for link in outcome.reconnect {
            self.link_failed(link, now, "server disagrees with the new map");
        }
        for link in outcome.connect {
            self.links.insert(link, LinkConn::Idle);
            self.reconnects.add(link, now);
        }
        self.metrics.reloads.with(&["applied"]).inc();
        regions
    }
}
