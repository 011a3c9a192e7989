//! The RDMA side: queue pairs toward servers on verbs (region keys,
//! completions) and the RoCEv2 ports' gateways.

use super::*;

impl Device {
    /// For an up link to a `verbs` server NIC, the first time: sends
    /// QP_CONNECT from the first RoCEv2 port (the core knows the region
    /// keys the queue pair's requests must carry). Returns why the link
    /// must close, if it must.
    pub(super) fn start_uplink(&mut self, link: LinkId) -> Result<(), String> {
        if self.core.link_status(link) != Some(crate::forward::LinkStatus::Up) {
            return Ok(());
        }
        let Some(key) = self.core.link_target(link) else {
            return Ok(());
        };
        let verbs = self
            .config
            .topology
            .server(&key.server)
            .and_then(|s| s.nic(&key.nic))
            .is_some_and(|n| n.transport == topology::NicTransport::Verbs);
        if !verbs {
            return Ok(());
        }
        if !crate::forward::one_sided(&self.core.map().layout) || self.uplinks.has(link) {
            return Ok(());
        }
        let Some((index, port)) = self
            .roce
            .iter()
            .enumerate()
            .find_map(|(i, p)| p.as_ref().map(|p| (i, p)))
        else {
            return Err("the server NIC is on verbs but this device has no RoCEv2 port".into());
        };
        let epoch = self.core.running_epoch();
        let connect = self
            .uplinks
            .start(link, index, port.ip(), port.mtu(), epoch);
        let Some(LinkConn::Connected { endpoint }) = self.links.get_mut(&link) else {
            return Ok(());
        };
        endpoint
            .send(&connect, &[])
            .map_err(|e| format!("write failed: {e}"))
    }

    /// Asks every link with a queue pair to a server on verbs for its
    /// server's region keys again, every [`VERBS_KEY_POLL`] (see
    /// [`Forwarder::refresh_keys_soon`]); the answer updates the keys the
    /// core checks for the queue pairs.
    pub(super) fn poll_verbs_keys(&mut self, now: Instant) {
        if now < self.verbs_keys_polled + VERBS_KEY_POLL {
            return;
        }
        self.verbs_keys_polled = now;
        let links: Vec<LinkId> = self
            .links
            .keys()
            .copied()
            .filter(|l| self.uplinks.has(*l))
            .collect();
        for link in links {
            self.core.refresh_keys_soon(link);
            let Some(frame) = self.core.key_refresh(link) else {
                continue;
            };
            if let Some(LinkConn::Connected { endpoint }) = self.links.get_mut(&link)
                && let Err(e) = endpoint.send(&frame, &[])
            {
                self.link_failed(link, now, &format!("write failed: {e}"));
            }
        }
    }

    /// Relays what the queue pairs toward servers completed, and takes down
    /// the links whose queue pair broke.
    pub(super) fn drain_uplinks(&mut self, now: Instant) {
        while let Some(done) = self.uplinks.poll_completed() {
            let Self {
                core,
                clients,
                to_flush,
                roce,
                ..
            } = self;
            let link = done.link;
            let outcome = done.outcome.as_deref().map_err(|status| *status);
            match core.rdma_completed(link, done.tag, outcome, now) {
                LinkAction::Deliver {
                    conn,
                    head,
                    payload,
                } => deliver_answer(roce, clients, to_flush, conn, &head, payload),
                LinkAction::Close(why) => self.link_failed(link, now, &why),
                LinkAction::Send(_) | LinkAction::Nothing => {}
            }
        }
        for (link, status) in self.uplinks.take_broken() {
            // Taking the link down ends the core's use of its queue pair.
            self.link_failed(
                link,
                now,
                &format!("its RDMA queue pair to the server failed ({status:?})"),
            );
        }
    }

    /// Sends what the queue pairs toward servers have ready.
    pub(super) fn transmit_uplinks(&mut self, now: Instant) {
        for (index, port) in self.roce.iter_mut().enumerate() {
            if let Some(port) = port {
                self.roce_dirty |= port.transmit(now, &mut self.uplinks, index);
            }
        }
    }

    /// Handles the frames waiting on port `index`'s RoCEv2 socket.
    pub(super) fn roce_receive(&mut self, index: usize, now: Instant) {
        self.roce_dirty = true;
        let Self {
            core,
            links,
            roce,
            uplinks,
            ..
        } = self;
        if let Some(Some(port)) = roce.get_mut(index) {
            port.receive(now, core, uplinks, |uplinks, link, head, payload, rdma| {
                let _ = send_to_link(links, uplinks, link, head, payload, rdma);
            });
        }
        self.drain_uplinks(now);
    }

    /// Fires the queue pairs' timers, sends what they have ready and, at
    /// most every [`ROCE_PUBLISH`], publishes their counters.
    pub(super) fn roce_turn(&mut self, now: Instant) {
        self.uplinks.handle_timeout(now);
        self.drain_uplinks(now);
        for (index, port) in self.roce.iter_mut().enumerate() {
            if let Some(port) = port {
                port.gateway.handle_timeout(now);
                self.roce_dirty |= port.transmit(now, &mut self.uplinks, index);
            }
        }
        if self.roce_dirty && now >= self.roce_published + ROCE_PUBLISH {
            self.roce_published = now;
            self.roce_dirty = false;
            let snapshots = self
                .listeners
                .iter()
                .zip(&mut self.roce)
                .filter_map(|((id, _, _), r)| r.as_mut().map(|r| r.snapshot(id.as_str())))
                .collect();
            self.roce_metrics.publish(snapshots);
            self.roce_metrics.publish_uplinks(self.uplinks.counters());
        }
    }

    /// Hands a response (or an error reply) for a queue pair's connection
    /// to its gateway; false when `conn` is not a queue pair's.
    pub(super) fn roce_deliver(
        roce: &mut [Option<RoceEndpoint>],
        conn: ConnId,
        head: &[u8],
        payload: &[u8],
    ) -> bool {
        roce.iter_mut()
            .flatten()
            .any(|port| port.gateway.deliver(conn, head, payload))
    }
}

/// The server's answer to the QP_CONNECT the device sent on `link`: with
/// QP_ACCEPT the queue pair comes up, and the core learns its R_Keys and
/// capabilities.
pub(super) fn uplink_answer(
    core: &mut Forwarder,
    uplinks: &mut Uplinks,
    link: LinkId,
    frame: &[u8],
) -> Result<(), String> {
    let outcome = match proto::parse_frame(frame) {
        Ok((proto::Message::QpAccept(accept), _)) => uplinks.accepted(link, &accept).map(|()| {
            core.queue_pair_up(link, accept.rkeys().collect(), accept.caps());
        }),
        Ok((proto::Message::Response(r), _)) => Err(format!("the server refused it: {}", r.status)),
        Ok((other, _)) => Err(format!("unexpected answer {:?}", other.opcode())),
        Err(e) => Err(format!("malformed answer: {e}")),
    };
    if outcome.is_err() {
        uplinks.close(link);
        core.queue_pair_down(link);
    }
    outcome
}
