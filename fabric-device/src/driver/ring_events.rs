//! The io_uring back end's side of the loop: waiting on the ring, and
//! turning its completions (accepts, receives, sends) into the same steps
//! the epoll back end takes on readiness.

use super::*;

impl Device {
    /// Waits up to `wait` for readiness events (epoll) or completions
    /// (io_uring, which then asks mio only when the ring saw its epoll
    /// instance ready, or woke with nothing).
    pub(super) fn wait(&mut self, events: &mut Events, wait: Duration) -> Result<(), DeviceError> {
        let poll_mio =
            |poll: &mut Poll, events: &mut Events, wait| match poll.poll(events, Some(wait)) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
                Err(e) => Err(DeviceError::Poll(e)),
            };
        let Io::Uring(ring) = &mut self.io else {
            return poll_mio(&mut self.poll, events, wait);
        };
        ring.wait(wait).map_err(DeviceError::Poll)?;
        self.completions.clear();
        ring.reap(&mut self.completions);
        let watched = self.completions.iter().any(|c| c.op() == Some(Op::Watch));
        if watched || (self.completions.is_empty() && !wait.is_zero()) {
            poll_mio(&mut self.poll, events, Duration::ZERO)
        } else {
            events.clear();
            Ok(())
        }
    }

    /// Handles the ring's completions of this turn.
    pub(super) fn on_completions(&mut self, now: Instant) {
        let completions = std::mem::take(&mut self.completions);
        for completion in &completions {
            match completion.op() {
                Some(Op::Accept) => self.on_accepted(completion),
                Some(Op::Recv) => self.on_received(completion, now),
                Some(Op::Send) => self.on_sent(completion, now),
                Some(Op::Watch) if !completion.more() => {
                    if let Io::Uring(ring) = &self.io {
                        ring.watch(self.poll.as_raw_fd());
                    }
                }
                Some(Op::Hangup) => self.on_hangup(completion),
                Some(Op::Watch | Op::Cancel) | None => {}
            }
        }
        self.completions = completions;
    }

    /// The endpoint on the ring with `slot`, if its connection is open.
    pub(super) fn ring_endpoint(&mut self, slot: u64) -> Option<(Owner, &mut Endpoint)> {
        let owner = *self.ring_slots.get(&slot)?;
        let endpoint = match owner {
            Owner::Client(conn) => &mut self.clients.get_mut(&conn)?.endpoint,
            Owner::Link(link) => match self.links.get_mut(&link)? {
                LinkConn::Connected { endpoint } => endpoint,
                _ => return None,
            },
        };
        (endpoint.ring_slot() == Some(slot)).then_some((owner, endpoint))
    }

    /// A socket received bytes (or its receive ended): serve the
    /// connection, which reads them in the ring's buffer, stage what it
    /// left and hand the buffer back.
    pub(super) fn on_received(&mut self, completion: &Completion, now: Instant) {
        let Self {
            io,
            ring_slots,
            clients,
            links,
            ..
        } = self;
        let Io::Uring(ring) = io else {
            return;
        };
        let slot = completion.slot();
        let endpoint = match ring_slots.get(&slot) {
            Some(&Owner::Client(conn)) => clients
                .get_mut(&conn)
                .map(|c| (Owner::Client(conn), &mut c.endpoint)),
            Some(&Owner::Link(link)) => match links.get_mut(&link) {
                Some(LinkConn::Connected { endpoint }) => Some((Owner::Link(link), endpoint)),
                _ => None,
            },
            None => None,
        };
        let owner = match endpoint {
            Some((owner, endpoint)) if endpoint.ring_slot() == Some(slot) => {
                let bytes = ring.received(completion);
                // SAFETY: the buffer goes back to the kernel (`release`
                // below) only after the endpoint settled or was closed,
                // and nothing else hands it out meanwhile.
                unsafe { endpoint.received(completion.result, bytes, completion.more()) };
                Some(owner)
            }
            _ => None,
        };
        match owner {
            Some(Owner::Client(conn)) => self.client_ready(conn, now),
            Some(Owner::Link(link)) => self.serve_link(link, now),
            None => {}
        }
        if let Some((_, endpoint)) = self.ring_endpoint(slot) {
            endpoint.settle();
        }
        if let Io::Uring(ring) = &mut self.io {
            ring.release(completion);
        }
    }

    /// A send completed: the rest or what gathered meanwhile goes out; a
    /// client closing after its last reply is closed once it is out.
    pub(super) fn on_sent(&mut self, completion: &Completion, now: Instant) {
        if let Io::Uring(ring) = &mut self.io {
            ring.release(completion);
        }
        let Some((owner, endpoint)) = self.ring_endpoint(completion.slot()) else {
            return;
        };
        let sent = endpoint.sent(completion.result);
        let drained = endpoint.pending_out() == 0;
        match (owner, sent) {
            (Owner::Client(conn), Err(e)) => self.close_client(conn, &format!("write failed: {e}")),
            (Owner::Link(link), Err(e)) => {
                self.link_failed(link, now, &format!("write failed: {e}"))
            }
            (Owner::Client(conn), Ok(())) => {
                if drained && self.clients.get(&conn).is_some_and(|c| c.closing) {
                    self.close_client(conn, "refused");
                }
            }
            (Owner::Link(_), Ok(())) => {}
        }
    }

    /// The peer of a client whose reading was stopped (it was paused with
    /// bytes staged) hung up: close it, as its partial frames can never
    /// complete. A client receiving again learns of the end by itself.
    pub(super) fn on_hangup(&mut self, completion: &Completion) {
        if completion.result <= 0 {
            return;
        }
        let Some((Owner::Client(conn), endpoint)) = self.ring_endpoint(completion.slot()) else {
            return;
        };
        if !endpoint.ring_receiving() {
            self.close_client(conn, "peer closed while its reading was paused");
        }
    }

    /// A listener accepted a connection (or its accept failed).
    pub(super) fn on_accepted(&mut self, completion: &Completion) {
        let port = completion.slot() as usize;
        if completion.result >= 0 {
            // SAFETY: the kernel just opened this descriptor for us; nothing
            // else owns it.
            let stream = unsafe { std::net::TcpStream::from_raw_fd(completion.result) };
            let stream = TcpStream::from_std(stream);
            match stream.peer_addr() {
                Ok(peer) => self.admit_client(port, stream, peer),
                Err(e) => debug!("accepted connection gone before it was served: {e}"),
            }
        } else {
            warn!(
                "accept failed: {}",
                io::Error::from_raw_os_error(-completion.result)
            );
        }
        if !completion.more() && self.draining.is_none() {
            let at = Instant::now() + accept_restart_delay(completion.result);
            self.accepts_stopped.push((port, at));
        }
    }

    /// Starts the multishot accepts that ended again, once their retry
    /// time has come.
    pub(super) fn restart_accepts(&mut self, now: Instant) {
        if self.accepts_stopped.is_empty() || self.draining.is_some() {
            return;
        }
        let Io::Uring(ring) = &self.io else {
            return;
        };
        let listeners = &self.listeners;
        self.accepts_stopped.retain(|&(port, at)| {
            if now < at {
                return true;
            }
            if let Some((_, listener, _)) = listeners.get(port) {
                ring.accept(port, listener.as_raw_fd());
            }
            false
        });
    }
}

/// Sets up the back end `config` asks for: io_uring where the kernel
/// allows it, else epoll, saying why.
pub(super) fn start_io(config: IoConfig) -> (Io, Selected) {
    if config.backend == Backend::Epoll {
        let selected = Selected {
            backend: Backend::Epoll,
            fallback: None,
        };
        return (Io::Epoll, selected);
    }
    let (release, disabled) = backend::choice::read_kernel_facts();
    let fallback = match backend::choice::kernel_refusal(&release, disabled.as_deref()) {
        Some(refused) => refused,
        None => match uring::Ring::new(config.sqpoll) {
            Ok(ring) => {
                let selected = Selected {
                    backend: Backend::Uring,
                    fallback: None,
                };
                return (Io::Uring(Box::new(ring)), selected);
            }
            Err(e) => backend::choice::setup_refusal(&e, disabled.as_deref()),
        },
    };
    let selected = Selected {
        backend: Backend::Epoll,
        fallback: Some(fallback),
    };
    (Io::Epoll, selected)
}

/// How long after a multishot accept ended with `result` to start it
/// again: at once after a connection (the kernel ends one now and then),
/// [`ACCEPT_RETRY`] after an error (out of descriptors, say), so a lasting
/// error is not retried every turn.
pub(super) fn accept_restart_delay(result: i32) -> Duration {
    if result < 0 {
        ACCEPT_RETRY
    } else {
        Duration::ZERO
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_accept_that_failed_waits_before_it_starts_again() {
        assert_eq!(accept_restart_delay(7), Duration::ZERO);
        assert_eq!(accept_restart_delay(-libc::EMFILE), ACCEPT_RETRY);
        assert!(!ACCEPT_RETRY.is_zero());
    }
}
