//! Client connections in the forwarding core: a session per connection, the
//! client's HELLO and the dispatch of each frame a client sends.

use std::time::Instant;

use proto::hello::{self, Capabilities, Role};
use proto::{Message, Opcode, Status};

use super::{ClientAction, ConnId, Forwarder, PROTOCOL_VERSION, Reply, error_reply, frame_reply};
use crate::map::ClientPolicy;
use crate::metrics::DeviceMetrics;

/// A client connection as the core keeps it.
#[derive(Debug, Default)]
pub(super) struct Session {
    /// The client's id and policy once its HELLO was accepted (refreshed on
    /// reload), so requests need no lookup by name.
    pub(super) client: Option<(String, ClientPolicy)>,
    /// The client said HELLO on this connection (not a queue pair's session).
    pub(super) by_hello: bool,
    /// With client authentication: the name said in HELLO and the
    /// challenge sent, until the proof arrives.
    pub(super) challenged: Option<(String, [u8; proto::auth::NONCE_LEN])>,
    pub(super) in_flight: usize,
    /// Bytes of the answers its requests in flight will bring.
    pub(super) reply_bytes: u64,
    /// The map epoch the connection said it runs, if it said one.
    pub(super) epoch: proto::fence::ConnEpoch,
}

impl Forwarder {
    /// A client connection opened.
    pub fn client_opened(&mut self, conn: ConnId) {
        self.sessions.insert(conn, Session::default());
        self.metrics.clients.inc();
    }

    /// Opens a session already bound to `client`, for traffic that arrives
    /// on behalf of a client authenticated elsewhere (a RoCE queue pair set
    /// up over that client's connection). Refused for a client the
    /// topology does not name.
    pub fn open_session_as(&mut self, conn: ConnId, client: &str) -> Result<(), Status> {
        let policy = self
            .map
            .clients
            .get(client)
            .ok_or(Status::UnknownClient)?
            .clone();
        self.client_opened(conn);
        if let Some(session) = self.sessions.get_mut(&conn) {
            session.client = Some((client.to_owned(), policy));
        }
        Ok(())
    }

    /// The client a connection authenticated as, if it did.
    pub fn session_client(&self, conn: ConnId) -> Option<&str> {
        self.sessions
            .get(&conn)
            .and_then(|s| s.client.as_ref())
            .map(|(name, _)| name.as_str())
    }

    /// Whether `conn`'s client has requests in flight.
    pub fn client_busy(&self, conn: ConnId) -> bool {
        self.sessions.get(&conn).is_some_and(|s| s.in_flight > 0)
    }

    /// A client connection closed: responses still due to it are dropped.
    pub fn client_closed(&mut self, conn: ConnId) {
        self.parked.retain(|p| p.conn != conn);
        self.replication_client_closed(conn);
        self.request_budget.release(conn);
        self.metrics
            .request_bytes_held
            .set(self.request_budget.total() as i64);
        if let Some(session) = self.sessions.remove(&conn) {
            self.metrics.clients.dec();
            self.metrics.in_flight.sub(session.in_flight as i64);
            self.reply_bytes = self.reply_bytes.saturating_sub(session.reply_bytes);
        }
    }

    /// Handles one complete frame from client connection `conn`.
    pub fn client_frame<'a>(
        &mut self,
        conn: ConnId,
        frame: &'a [u8],
        now: Instant,
    ) -> ClientAction<'a> {
        let (message, tag) = match proto::parse_frame(frame) {
            Ok(parsed) => parsed,
            Err(error) => {
                self.metrics.malformed_frames.inc();
                return match proto::reply_to_malformed(frame, &error) {
                    Some(reply) => ClientAction::Reply(Reply::Error(reply)),
                    None if error.breaks_framing() => ClientAction::Close,
                    None => ClientAction::Nothing,
                };
            }
        };
        if self.client_keys.is_some() && self.session_client(conn).is_none() {
            return self.at_the_gate(conn, message, tag);
        }
        match message {
            Message::Request(req) => self.forward(conn, frame, &req, tag, now),
            Message::Hello(hello) => self.hello(conn, &hello, tag),
            Message::MapRequest => self.map_reply(conn, frame, tag, now),
            Message::MapEpoch(epoch) => self.map_epoch(conn, epoch, tag),
            Message::Ping(token) => ClientAction::Reply(frame_reply(&Message::Pong(token), tag)),
            Message::QpConnect(connect) if self.session_client(conn).is_some() => {
                match self.fence_qp(conn, connect.epoch, tag) {
                    Ok(()) => ClientAction::ConnectQp { connect, tag },
                    Err(stale) => ClientAction::Reply(stale),
                }
            }
            Message::QpConnect(_) => {
                ClientAction::Reply(error_reply(Opcode::QpConnect, tag, Status::UnknownClient))
            }
            // Client authentication is not asked for on this device.
            Message::AuthProof(_) => ClientAction::ReplyAndClose(error_reply(
                Opcode::AuthProof,
                tag,
                Status::Unsupported,
            )),
            // Keys are rotated on the server that makes them.
            Message::RotateKey(_) => {
                ClientAction::Reply(error_reply(Opcode::RotateKey, tag, Status::Unsupported))
            }
            // Blocks are scrubbed on the server that holds them.
            Message::Scrub(_) => {
                ClientAction::Reply(error_reply(Opcode::Scrub, tag, Status::Unsupported))
            }
            // Answers only a listener sends: no one to answer.
            answer if !answer.listener_receives() => {
                self.metrics.malformed_frames.inc();
                ClientAction::Nothing
            }
            // A kind a listener receives that this device does not serve.
            other => ClientAction::Reply(error_reply(other.opcode(), tag, Status::Unsupported)),
        }
    }

    pub(super) fn hello(
        &mut self,
        conn: ConnId,
        hello: &hello::Repr<'_>,
        tag: u64,
    ) -> ClientAction<'static> {
        if hello.version < PROTOCOL_VERSION {
            return ClientAction::ReplyAndClose(error_reply(
                Opcode::Hello,
                tag,
                Status::VersionMismatch,
            ));
        }
        let refuse = |metrics: &DeviceMetrics, reason: &str, status| {
            metrics.hello_refused.with(&[reason]).inc();
            ClientAction::ReplyAndClose(error_reply(Opcode::Hello, tag, status))
        };
        let Some(policy) = self.map.clients.get(hello.name) else {
            return refuse(&self.metrics, "unknown_client", Status::UnknownClient);
        };
        let current = self.session_client(conn);
        if current.is_some_and(|name| name != hello.name) {
            // One connection, one identity: a second HELLO may repeat it,
            // never change it.
            return refuse(&self.metrics, "identity_switch", Status::UnknownClient);
        }
        if current.is_none() {
            let open = self
                .sessions
                .values()
                .filter(|s| s.by_hello && s.client.as_ref().is_some_and(|(n, _)| n == hello.name))
                .count();
            if open >= self.config.max_connections_per_client {
                return refuse(&self.metrics, "connections_per_client", Status::Busy);
            }
        }
        if let Some(session) = self.sessions.get_mut(&conn) {
            session.client = Some((hello.name.to_owned(), policy.clone()));
            session.by_hello = true;
        }
        let reply = Message::Hello(hello::Repr {
            version: PROTOCOL_VERSION,
            role: Role::FabricDevice,
            // Not ZERO_COPY: the device copies every payload it forwards.
            capabilities: Capabilities::PIPELINING
                | Capabilities::EXACTLY_ONCE
                | Capabilities::QP_EPOCH,
            name: self.map.device.as_str(),
        });
        ClientAction::Reply(frame_reply(&reply, tag))
    }
}
