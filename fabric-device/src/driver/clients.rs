//! Client connections: accepting them against the caps, reading and
//! handing their frames to the core, backpressure, flushing replies,
//! closing silent, idle and refused ones.

use super::*;

impl Device {
    /// Accepts every connection waiting on port `index` (epoll).
    pub(super) fn accept(&mut self, index: usize) {
        loop {
            let Some((_, listener, _)) = self.listeners.get(index) else {
                return;
            };
            let (stream, peer) = match listener.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    warn!("accept failed: {e}");
                    return;
                }
            };
            self.admit_client(index, stream, peer);
        }
    }

    /// Serves a connection accepted on port `index`, or closes it when the
    /// caps (or draining) say so.
    pub(super) fn admit_client(&mut self, index: usize, mut stream: TcpStream, peer: SocketAddr) {
        {
            let verdict = match self.draining {
                Some(_) => Verdict::Refuse("draining"),
                None => self.admission.verdict(),
            };
            match verdict {
                Verdict::Admit => {}
                Verdict::AdmitEvicting(oldest) => {
                    self.metrics
                        .connections_closed
                        .with(&["unproven_evicted"])
                        .inc();
                    self.close_client(oldest, "unproven, evicted for a newer connection");
                }
                Verdict::Refuse(reason) => {
                    debug!("refused client connection from {peer}: {reason}");
                    self.metrics.connections_closed.with(&[reason]).inc();
                    return;
                }
            }
            let conn = self.next_client as ConnId;
            self.next_client += 1;
            let _ = stream.set_nodelay(true);
            let registered = match &self.io {
                Io::Epoll => self
                    .poll
                    .registry()
                    .register(
                        &mut stream,
                        Token(conn as usize),
                        Interest::READABLE | Interest::WRITABLE,
                    )
                    .is_ok(),
                Io::Uring(_) => true,
            };
            if !registered {
                return;
            }
            debug!("client connection {conn} from {peer} opened");
            self.core.client_opened(conn);
            self.admission.opened(conn);
            let mut endpoint = Endpoint::with_decoder(
                stream,
                FrameDecoder::with_max_body_len(PRE_SESSION_MAX_BODY),
            );
            if let Io::Uring(ring) = &self.io {
                endpoint.attach(ring.shared(), Receive::Shared);
                if let Some(slot) = endpoint.ring_slot() {
                    self.ring_slots.insert(slot, Owner::Client(conn));
                }
            }
            self.clients.insert(
                conn,
                ClientConn {
                    endpoint,
                    opened: Instant::now(),
                    active: Instant::now(),
                    port: index,
                    paused: false,
                    waiting_for: None,
                    closing: false,
                    to_flush: false,
                },
            );
        }
    }

    pub(super) fn on_client_event(&mut self, conn: ConnId, event: &Event, now: Instant) {
        if let Some(client) = self.clients.get_mut(&conn) {
            client.endpoint.note_event(event);
        }
        self.client_ready(conn, now);
    }

    /// A client's socket has something (bytes, room, a hang-up): write
    /// what is queued, then read and handle its requests.
    pub(super) fn client_ready(&mut self, conn: ConnId, now: Instant) {
        let Some(client) = self.clients.get_mut(&conn) else {
            return;
        };
        client.active = now;
        if let Err(e) = client.endpoint.flush() {
            self.close_client(conn, &format!("write failed: {e}"));
            return;
        }
        self.serve_client(conn, now);
    }

    /// Reads and handles a client's requests until its socket is drained or
    /// backpressure pauses it.
    pub(super) fn serve_client(&mut self, conn: ConnId, now: Instant) {
        self.read_requests(conn, now);
        if self.admission.is_unproven(conn)
            && self.core.session_client(conn).is_some()
            && !self.admission.proven(conn)
        {
            self.metrics
                .connections_closed
                .with(&["too_many_clients"])
                .inc();
            self.close_client(conn, "proven, but --max-clients connections are open");
            return;
        }
        // Record what the connection holds now that its frames were handled.
        if let Some(client) = self.clients.get_mut(&conn) {
            let charge = client.endpoint.settle_charge() as u64;
            self.core.charge_request_bytes(conn, charge, false);
        }
    }

    /// Hands a client's frames to the core and reads more, until the socket
    /// is drained, the client is paused or the connection closes.
    pub(super) fn read_requests(&mut self, conn: ConnId, now: Instant) {
        loop {
            let end = self.dispatch_buffered(conn, now);
            let Some(client) = self.clients.get_mut(&conn) else {
                return;
            };
            match end {
                FramesEnd::Paused => {
                    self.pause(conn);
                    return;
                }
                FramesEnd::Close(why) => {
                    let _ = client.endpoint.flush();
                    self.close_client(conn, &why);
                    return;
                }
                FramesEnd::Drained => {}
            }
            if self.draining.is_some() || client.closing {
                return;
            }
            let core = &mut self.core;
            let mut admit = |held: usize| core.charge_request_bytes(conn, held as u64, true);
            match client.endpoint.fill(&mut admit) {
                Fill::Full => continue,
                Fill::NotAdmitted => {
                    // Others' frames will free budget; try again then.
                    self.pause(conn);
                    return;
                }
                Fill::Drained => {
                    // Complete frames may have arrived with the last read.
                    if client.endpoint.decoder.buffered() == 0 {
                        return;
                    }
                    match self.dispatch_buffered(conn, now) {
                        FramesEnd::Drained => return,
                        FramesEnd::Paused => {
                            self.pause(conn);
                            return;
                        }
                        FramesEnd::Close(why) => {
                            self.close_client(conn, &why);
                            return;
                        }
                    }
                }
                Fill::Closed => {
                    // Answer what was received before the hang-up, then close.
                    let _ = self.dispatch_buffered(conn, now);
                    self.close_client(conn, "peer closed");
                    return;
                }
                Fill::Failed(why) => {
                    if client.endpoint.decoder.error().is_some() {
                        // A bad header, or a frame too large for a peer
                        // that has not said who it is.
                        self.metrics.connections_closed.with(&["unframeable"]).inc();
                    }
                    let _ = self.dispatch_buffered(conn, now);
                    self.close_client(conn, &why);
                    return;
                }
            }
        }
    }

    /// Stops reading a client until [`Device::resume_paused`] finds room.
    pub(super) fn pause(&mut self, conn: ConnId) {
        if let Some(client) = self.clients.get_mut(&conn)
            && !client.paused
        {
            client.paused = true;
            self.paused.push(conn);
        }
    }

    /// Lists a client for the end-of-turn flush if it has bytes queued.
    pub(super) fn queue_flush(&mut self, conn: ConnId) {
        if let Some(client) = self.clients.get_mut(&conn) {
            mark_to_flush(&mut self.to_flush, conn, client);
        }
    }

    /// Hands every complete frame a client sent to the core.
    pub(super) fn dispatch_buffered(&mut self, conn: ConnId, now: Instant) -> FramesEnd {
        let end = self.dispatch_each_frame(conn, now);
        self.queue_flush(conn);
        end
    }

    /// The loop behind [`Device::dispatch_buffered`]: each complete frame to
    /// the core, and its action carried out (forwarded, answered, a queue
    /// pair connected), until no frame is left, the client must wait or the
    /// connection must close.
    pub(super) fn dispatch_each_frame(&mut self, conn: ConnId, now: Instant) -> FramesEnd {
        let Self {
            core,
            clients,
            links,
            metrics,
            roce,
            uplinks,
            ..
        } = self;
        let Some(client) = clients.get_mut(&conn) else {
            return FramesEnd::Close("gone".into());
        };
        let ClientConn {
            endpoint,
            closing,
            port,
            waiting_for,
            ..
        } = client;
        loop {
            if *closing {
                return FramesEnd::Drained;
            }
            if !may_read(
                core.client_has_room(conn),
                endpoint.pending_out(),
                waiting_for.is_some(),
            ) {
                return FramesEnd::Paused;
            }
            if endpoint.decoder.max_body_len() < proto::frame::MAX_BODY_LEN
                && core.session_client(conn).is_some()
            {
                // The client is known now: it may send requests of any size.
                endpoint
                    .decoder
                    .raise_max_body_len(proto::frame::MAX_BODY_LEN);
            }
            let frame = match endpoint.decoder.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => return FramesEnd::Drained,
                Err(e) => return FramesEnd::Close(format!("malformed stream: {e}")),
            };
            let started = metrics.start_timing();
            let sent = match core.client_frame(conn, frame, now) {
                ClientAction::Forward {
                    link,
                    head,
                    payload,
                    rdma,
                } => match send_to_link(links, uplinks, link, &head, payload, rdma) {
                    Ok(queued) => {
                        if queued > LINK_OUT_HIGH_WATER {
                            *waiting_for = Some(link);
                        }
                        Ok(())
                    }
                    Err(e) => Err(e),
                },
                ClientAction::Reply(reply) => endpoint.send(reply.as_bytes(), &[]),
                ClientAction::ReplyAndClose(reply) => {
                    *closing = true;
                    endpoint.send(reply.as_bytes(), &[])
                }
                ClientAction::ConnectQp { connect, tag } => {
                    let reply = match roce.get_mut(*port).and_then(Option::as_mut) {
                        Some(roce_port) => roce_port.connect(core, conn, connect, tag),
                        None => proto::error_reply(
                            proto::Opcode::QpConnect,
                            tag,
                            proto::Status::Unsupported,
                        )
                        .to_vec(),
                    };
                    endpoint.send(&reply, &[])
                }
                ClientAction::Nothing => Ok(()),
                ClientAction::Close => return FramesEnd::Close("unframeable stream".into()),
            };
            if let Some(started) = started {
                metrics.observe_device_time(started.elapsed());
            }
            if let Err(e) = sent {
                return FramesEnd::Close(format!("write failed: {e}"));
            }
        }
    }

    pub(super) fn close_client(&mut self, conn: ConnId, why: &str) {
        if let Some(mut client) = self.clients.remove(&conn) {
            self.admission.closed(conn);
            let _ = self.poll.registry().deregister(&mut client.endpoint.stream);
            if let Some(slot) = client.endpoint.ring_slot() {
                self.ring_slots.remove(&slot);
            }
            debug!("closed client connection {conn}: {why}");
            // A flood of connections must not flood the log: one line per
            // CLOSED_LOG_INTERVAL at most (the metrics count every close).
            self.closed_unlogged += 1;
            let since = self.closed_logged.elapsed();
            if since >= CLOSED_LOG_INTERVAL {
                info!(
                    "{} client connections closed in the last {} s; the last: {why}",
                    self.closed_unlogged,
                    since.as_secs()
                );
                self.closed_unlogged = 0;
                self.closed_logged = Instant::now();
            }
        }
        for port in self.roce.iter_mut().flatten() {
            port.control_closed(&mut self.core, conn);
        }
        self.core.client_closed(conn);
    }

    /// Resumes clients paused for backpressure that have room again.
    pub(super) fn resume_paused(&mut self, now: Instant) {
        if self.paused.is_empty() {
            return;
        }
        for conn in std::mem::take(&mut self.paused) {
            let Some(client) = self.clients.get_mut(&conn) else {
                continue;
            };
            if let Some(link) = client.waiting_for
                && let Some(LinkConn::Connected { endpoint }) = self.links.get(&link)
                && !link_drained(endpoint.pending_out())
            {
                self.paused.push(conn);
                continue;
            }
            client.waiting_for = None;
            if may_read(
                self.core.client_has_room(conn),
                client.endpoint.pending_out(),
                false,
            ) {
                client.paused = false;
                self.serve_client(conn, now);
            } else {
                self.paused.push(conn);
            }
        }
    }

    /// Closes connections that have not said HELLO (and with
    /// authentication proven their key) within the HELLO timeout, and
    /// connections idle for the idle timeout (nothing in
    /// flight or queued, no queue pair), so idle sockets cannot fill the
    /// connection cap. Checked at most once a second.
    pub(super) fn close_silent_clients(&mut self, now: Instant) {
        if now < self.hello_checked + Duration::from_secs(1) {
            return;
        }
        self.hello_checked = now;
        for client in self.clients.values_mut() {
            if now.saturating_duration_since(client.active) >= TRIM_IDLE_AFTER {
                client.endpoint.trim_idle();
            }
        }
        let silent: Vec<ConnId> = self
            .clients
            .iter()
            .filter(|(conn, c)| {
                now.saturating_duration_since(c.opened) >= self.config.hello_timeout
                    && self.core.session_client(**conn).is_none()
            })
            .map(|(conn, _)| *conn)
            .collect();
        for conn in silent {
            self.metrics
                .connections_closed
                .with(&["hello_timeout"])
                .inc();
            self.close_client(conn, "no HELLO (or no proof) in time");
        }
        let Some(limit) = self.config.idle_timeout else {
            return;
        };
        let idle: Vec<ConnId> = self
            .clients
            .iter()
            .filter(|(conn, c)| {
                now.saturating_duration_since(c.active) >= limit
                    && c.endpoint.pending_out() == 0
                    && !self.core.client_busy(**conn)
                    && !self
                        .roce
                        .iter()
                        .flatten()
                        .any(|r| r.has_queue_pairs(**conn))
            })
            .map(|(conn, _)| *conn)
            .collect();
        for conn in idle {
            self.metrics.connections_closed.with(&["idle"]).inc();
            self.close_client(conn, "idle");
        }
    }

    /// Sends error replies produced by the core to their clients.
    pub(super) fn deliver_all(&mut self, replies: Vec<(ConnId, Reply)>) {
        for (conn, reply) in replies {
            if Self::roce_deliver(&mut self.roce, conn, reply.as_bytes(), &[]) {
                continue;
            }
            if let Some(client) = self.clients.get_mut(&conn) {
                let _ = client.endpoint.send(reply.as_bytes(), &[]);
                mark_to_flush(&mut self.to_flush, conn, client);
            }
        }
    }

    /// Writes everything queued; closes clients that asked for it once
    /// their queue is empty, and clients whose socket failed. Links go
    /// first: the servers can start on their requests while the replies to
    /// clients are written.
    pub(super) fn flush_all(&mut self, now: Instant) {
        let mut failed = Vec::new();
        for (link, conn) in &mut self.links {
            if let LinkConn::Connected { endpoint } = conn
                && let Err(e) = endpoint.flush()
            {
                failed.push((*link, e.to_string()));
            }
        }
        for (link, why) in failed {
            self.link_failed(link, now, &why);
        }
        let mut close = Vec::new();
        for conn in std::mem::take(&mut self.to_flush) {
            let Some(client) = self.clients.get_mut(&conn) else {
                continue;
            };
            client.to_flush = false;
            match client.endpoint.flush() {
                Ok(()) if client.closing && client.endpoint.pending_out() == 0 => {
                    close.push((conn, "refused".to_owned()));
                }
                // The socket took part: try again next turn.
                Ok(()) => mark_to_flush(&mut self.to_flush, conn, client),
                Err(e) => close.push((conn, format!("write failed: {e}"))),
            }
        }
        for (conn, why) in close {
            self.close_client(conn, &why);
        }
    }
}

/// How handling a client's buffered frames ended.
#[derive(Debug)]
pub(super) enum FramesEnd {
    /// Every complete frame was handled.
    Drained,
    /// Backpressure: stop reading this client for now.
    Paused,
    /// Close the connection.
    Close(String),
}

/// Hands a server's answer to whoever asked: a queue pair's gateway, or a
/// client connection (listed in `to_flush`).
pub(super) fn deliver_answer(
    roce: &mut [Option<RoceEndpoint>],
    clients: &mut IdMap<ConnId, ClientConn>,
    to_flush: &mut Vec<ConnId>,
    conn: ConnId,
    head: &[u8],
    payload: &[u8],
) {
    if Device::roce_deliver(roce, conn, head, payload) {
        // A queue pair's operation: its gateway answered it.
    } else if let Some(client) = clients.get_mut(&conn) {
        let _ = client.endpoint.send(head, payload);
        mark_to_flush(to_flush, conn, client);
    }
}

/// Lists `client` in `to_flush` once, if it has bytes queued.
pub(super) fn mark_to_flush(to_flush: &mut Vec<ConnId>, conn: ConnId, client: &mut ClientConn) {
    if !client.to_flush && client.endpoint.pending_out() > 0 {
        client.to_flush = true;
        to_flush.push(conn);
    }
}

/// Whether a client's next request may be read: the core has room for it,
/// its replies do not pile up past [`CLIENT_OUT_HIGH_WATER`], and it is not
/// waiting for a full link to drain.
pub(super) fn may_read(core_has_room: bool, replies_queued: usize, waiting_for_link: bool) -> bool {
    core_has_room && replies_queued <= CLIENT_OUT_HIGH_WATER && !waiting_for_link
}

/// Whether a link a client waits for has drained enough (to
/// [`LINK_OUT_LOW_WATER`]) for the client to be read again: clients resume
/// well below the mark that paused them, so they do not flap.
pub(super) fn link_drained(link_queued: usize) -> bool {
    link_queued <= LINK_OUT_LOW_WATER
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_read_only_with_room_and_its_replies_taken() {
        assert!(may_read(true, 0, false));
        assert!(may_read(true, CLIENT_OUT_HIGH_WATER, false));
        assert!(
            !may_read(true, CLIENT_OUT_HIGH_WATER + 1, false),
            "replies pile up"
        );
        assert!(!may_read(false, 0, false), "the core has no room");
        assert!(!may_read(true, 0, true), "its link is full");
    }

    #[test]
    fn a_full_link_frees_its_clients_only_once_well_drained() {
        const { assert!(LINK_OUT_LOW_WATER < LINK_OUT_HIGH_WATER) };
        assert!(!link_drained(LINK_OUT_HIGH_WATER));
        assert!(!link_drained(LINK_OUT_LOW_WATER + 1));
        assert!(link_drained(LINK_OUT_LOW_WATER));
        assert!(link_drained(0));
    }
}
