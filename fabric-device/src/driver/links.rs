//! Server links: connecting with backoff, the handshake, reading the
//! servers' answers and relaying them, failing a link and its requests.

use super::*;

impl Device {
    /// Starts connecting every link whose next attempt is due, and gives
    /// up on connects that take too long.
    pub(super) fn connect_due_links(&mut self, now: Instant) {
        for link in self.reconnects.timed_out(now) {
            self.link_failed(link, now, "connect timed out");
        }
        for link in self.reconnects.due(now) {
            let Some(target) = self.core.link_target(link) else {
                continue;
            };
            if self.takeovers.holds_links_to(&target.server) {
                continue;
            }
            let Ok(addr) = target.addr.parse::<SocketAddr>() else {
                continue;
            };
            self.reconnects.connecting(link, now);
            let stream = TcpStream::connect(addr).and_then(|mut stream| {
                let _ = stream.set_nodelay(true);
                self.poll.registry().register(
                    &mut stream,
                    link_token(link),
                    Interest::READABLE | Interest::WRITABLE,
                )?;
                Ok(stream)
            });
            match stream {
                Ok(stream) => {
                    let endpoint = Endpoint::new(stream);
                    self.links.insert(link, LinkConn::Connecting { endpoint });
                }
                Err(e) => self.link_failed(link, now, &e.to_string()),
            }
        }
    }

    /// `link to SERVER/NIC (ADDR, LANE lane)`, for logs.
    pub(super) fn link_name(&self, link: LinkId) -> Option<String> {
        let key = self.core.link_target(link)?;
        let lane = self.core.link_lane(link)?;
        Some(format!(
            "link to {}/{} ({}, {} lane)",
            key.server,
            key.nic,
            key.addr,
            lane.as_str()
        ))
    }

    /// A link broke: fail its requests, close it and schedule a reconnect.
    pub(super) fn link_failed(&mut self, link: LinkId, now: Instant, why: &str) {
        let was_up = matches!(self.links.get(&link), Some(LinkConn::Connected { .. }));
        match self.links.insert(link, LinkConn::Idle) {
            Some(LinkConn::Connected { mut endpoint } | LinkConn::Connecting { mut endpoint }) => {
                let _ = self.poll.registry().deregister(&mut endpoint.stream);
                if let Some(slot) = endpoint.ring_slot() {
                    self.ring_slots.remove(&slot);
                }
            }
            Some(LinkConn::Idle) => {}
            None => {
                // Not a link of this device (any more).
                self.links.remove(&link);
                return;
            }
        }
        if let Some(name) = self.link_name(link) {
            if was_up {
                warn!("{name} down: {why}");
            } else {
                debug!("{name} not connected: {why}");
            }
        }
        self.uplinks.close(link);
        self.core.queue_pair_down(link);
        self.copy_streams.forget(link);
        let failed = self.core.link_down(link);
        self.deliver_all(failed);
        self.reconnects.failed(link, now);
    }

    pub(super) fn on_link_event(&mut self, link: LinkId, event: &Event, now: Instant) {
        if let Some(LinkConn::Connecting { endpoint, .. }) = self.links.get_mut(&link) {
            if !event.is_writable() {
                return;
            }
            let connected = match endpoint.stream.take_error() {
                Ok(None) => match endpoint.stream.peer_addr() {
                    Ok(_) => Ok(true),
                    Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
                    Err(e) => Err(e),
                },
                Ok(Some(e)) | Err(e) => Err(e),
            };
            match connected {
                Ok(false) => return,
                Ok(true) => {
                    let Some(LinkConn::Connecting { mut endpoint }) = self.links.remove(&link)
                    else {
                        return;
                    };
                    endpoint.note_event(event);
                    if let Io::Uring(ring) = &self.io {
                        // Connected: from now on the ring moves its bytes.
                        let _ = self.poll.registry().deregister(&mut endpoint.stream);
                        endpoint.attach(ring.shared(), Receive::Own);
                        if let Some(slot) = endpoint.ring_slot() {
                            self.ring_slots.insert(slot, Owner::Link(link));
                        }
                    }
                    if let Some(name) = self.link_name(link) {
                        info!("{name} connected");
                    }
                    self.reconnects.connected(link);
                    let hello = self.core.link_connected(link);
                    let sent = endpoint.send(&hello, &[]).and_then(|()| endpoint.flush());
                    self.links.insert(link, LinkConn::Connected { endpoint });
                    if let Err(e) = sent {
                        self.link_failed(link, now, &e.to_string());
                    }
                    return;
                }
                Err(e) => {
                    self.link_failed(link, now, &e.to_string());
                    return;
                }
            }
        }
        if let Some(LinkConn::Connected { endpoint }) = self.links.get_mut(&link) {
            endpoint.note_event(event);
        }
        self.serve_link(link, now);
    }

    /// Reads a link's responses and relays them to their clients.
    pub(super) fn serve_link(&mut self, link: LinkId, now: Instant) {
        loop {
            let Some(LinkConn::Connected { endpoint }) = self.links.get_mut(&link) else {
                return;
            };
            if let Err(e) = endpoint.flush() {
                self.link_failed(link, now, &e.to_string());
                return;
            }
            // Servers are trusted peers: their answers are never held back.
            let fill = endpoint.fill(&mut |_| true);
            if let Some(why) = self.handle_link_frames(link, now) {
                self.link_failed(link, now, &why);
                return;
            }
            if let Err(why) = self.start_uplink(link) {
                self.link_failed(link, now, &why);
                return;
            }
            match fill {
                Fill::Full => continue,
                Fill::Drained | Fill::NotAdmitted => return,
                Fill::Closed => {
                    self.link_failed(link, now, "server closed the connection");
                    return;
                }
                Fill::Failed(why) => {
                    self.link_failed(link, now, &why);
                    return;
                }
            }
        }
    }

    /// Hands every complete frame of a link to the core; returns why the
    /// link must close, if it must.
    pub(super) fn handle_link_frames(&mut self, link: LinkId, now: Instant) -> Option<String> {
        let Self {
            core,
            clients,
            to_flush,
            links,
            metrics,
            roce,
            uplinks,
            ..
        } = self;
        let Some(LinkConn::Connected { endpoint }) = links.get_mut(&link) else {
            return None;
        };
        loop {
            let frame = match endpoint.decoder.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => {
                    // A refusal in this batch may call for the server's
                    // keys again.
                    let refresh = core.key_refresh(link)?;
                    return endpoint
                        .send(&refresh, &[])
                        .err()
                        .map(|e| format!("write failed: {e}"));
                }
                Err(e) => return Some(format!("malformed stream from server: {e}")),
            };
            if let Ok(header) = proto::frame::Header::parse(frame)
                && header.tag == QP_CONNECT_TAG
            {
                if let Err(why) = uplink_answer(core, uplinks, link, frame) {
                    warn!(
                        "link {}: no RDMA queue pair, requests stay on TCP: {why}",
                        link.0
                    );
                }
                continue;
            }
            let started = metrics.start_timing();
            match core.link_frame(link, frame, now) {
                LinkAction::Deliver {
                    conn,
                    head,
                    payload,
                } => deliver_answer(roce, clients, to_flush, conn, &head, payload),
                LinkAction::Send(bytes) => {
                    if let Err(e) = endpoint.send(&bytes, &[]) {
                        return Some(format!("write failed: {e}"));
                    }
                }
                LinkAction::Nothing => {}
                LinkAction::Close(why) => return Some(why),
            }
            if let Some(started) = started {
                metrics.observe_device_time(started.elapsed());
            }
        }
    }

    /// Hands the requests the core parked while their links were starting
    /// back to it, now that they can be forwarded or refused.
    pub(super) fn replay_parked(&mut self, now: Instant) {
        for (conn, frame) in self.core.take_unparked() {
            match self.core.client_frame(conn, &frame, now) {
                ClientAction::Forward {
                    link,
                    head,
                    payload,
                    rdma,
                } => {
                    // A link that went away again answers through its
                    // pending request's timeout, as for any client request.
                    let _ = send_to_link(
                        &mut self.links,
                        &mut self.uplinks,
                        link,
                        &head,
                        payload,
                        rdma,
                    );
                }
                ClientAction::Reply(reply) | ClientAction::ReplyAndClose(reply) => {
                    self.deliver_all(vec![(conn, reply)]);
                }
                ClientAction::Nothing | ClientAction::Close | ClientAction::ConnectQp { .. } => {}
            }
        }
    }
}

/// Sends a request the core wrote for `link`: as the work requests the
/// core chose (`rdma`) on the link's RDMA queue pair when it has room for
/// them, else on its TCP connection. Returns the bytes the TCP connection
/// has queued (0 when the link is not connected: the core answers the
/// request at its timeout).
pub(super) fn send_to_link(
    links: &mut IdMap<LinkId, LinkConn>,
    uplinks: &mut Uplinks,
    link: LinkId,
    head: &[u8],
    payload: &[u8],
    rdma: Option<Offload>,
) -> io::Result<usize> {
    let Some(LinkConn::Connected { endpoint }) = links.get_mut(&link) else {
        return Ok(0);
    };
    let posted = rdma.is_some_and(|work| uplinks.post(link, &work, payload) == Posting::Posted);
    if !posted {
        uplinks.sent_on_control(link);
        endpoint.send(head, payload)?;
    }
    Ok(endpoint.pending_out())
}
