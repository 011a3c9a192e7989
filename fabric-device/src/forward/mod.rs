//! The forwarding core: lookup, rewrite, request-id mapping, link health and
//! timeouts, with no sockets and no clock.
//!
//! The driver feeds it events — a frame from a client, a frame from a server
//! link, a link going up or down, the time passing — together with `now`, and
//! carries out what it returns: bytes to send to a link or a client, a
//! connection to close. Large payloads are never copied here: a forwarded
//! request is a rewritten 72-byte head plus a slice of the client's frame, a
//! relayed response a rewritten 32-byte head plus a slice of the server's.
//!
//! Tags: every request forwarded on a link gets a tag unique on that link;
//! the core remembers which client connection and client tag it stands for
//! and restores them on the response. Control messages the device itself
//! sends on a link (HELLO, MAP_REQUEST) carry tags with the top bit set.
//!
//! Region keys (learnt from the servers, passed on in clients' MAPs) are
//! the submodule `keys`; the map epoch (fencing client connections, saying
//! the device's epoch to servers) the submodule `epoch`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proto::frame::{self, Header};
use proto::hello::{self, Capabilities, Role};
use proto::opening::{Credentials, Opening, OpeningTags, Progress};
use proto::request::{self, Operation, Target};
use proto::{Message, Opcode, RegionOffset, Status, map, response};
use telemetry::Gauge;

use crate::deadline::{Deadline, DeadlineQueue};
use crate::idmap::IdMap;
pub use crate::ids::{ConnId, Lane, LinkId};
use crate::link_tags::{CONTROL_TAG, KEY_REFRESH_TAG, LINK_HELLO_TAG, LINK_MAP_TAG, MAP_EPOCH_TAG};
use crate::map::{ClientPolicy, DeviceMap, LinkKey};
use crate::metrics::DeviceMetrics;
use crate::request_budget::RequestBudget;

/// The protocol version this device speaks.
pub use proto::PROTOCOL_VERSION;
/// Length of a forwarded request's rewritten head (frame + request header).
pub const FORWARD_HEAD_LEN: usize = frame::HEADER_LEN + request::HEADER_LEN;
/// Length of a relayed response's rewritten head (frame + response header).
pub const REPLY_HEAD_LEN: usize = frame::HEADER_LEN + response::HEADER_LEN;
/// Tags of the device's HELLO and MAP_REQUEST on a link.
const LINK_OPENING: OpeningTags = OpeningTags {
    hello: LINK_HELLO_TAG,
    map: LINK_MAP_TAG,
};

mod epoch;
mod keys;

use epoch::DeviceEpoch;
use keys::KeyRefresh;

/// Requests moving at least this many bytes (WRITE data, READ length) go on
/// a NIC's bulk lane.
pub const BULK_MIN_BYTES: u64 = 64 * 1024;

/// The two links of one server NIC.
#[derive(Debug, Clone, Copy)]
struct Lanes {
    main: LinkId,
    bulk: LinkId,
}

impl Lanes {
    fn get(self, lane: Lane) -> LinkId {
        match lane {
            Lane::Main => self.main,
            Lane::Bulk => self.bulk,
        }
    }
}

/// Tunables of the forwarding core.
#[derive(Debug, Clone, Copy)]
pub struct ForwarderConfig {
    /// A forwarded request unanswered for this long is answered TIMEOUT.
    pub request_timeout: Duration,
    /// Requests a client may have in flight; the driver stops reading from a
    /// client at the limit.
    pub max_in_flight_per_client: usize,
    /// Bytes of answers (READ data) a client may have on the way; beyond,
    /// the driver stops reading its requests. One request always may go,
    /// so a client's share is this plus its largest READ.
    pub max_reply_bytes_per_client: u64,
    /// Bytes of answers on the way for all clients together.
    pub max_reply_bytes_total: u64,
    /// Bytes of requests one client's connections may hold while they
    /// arrive (a large frame is read only once it fits).
    pub max_request_bytes_per_client: u64,
    /// Bytes of requests all connections together may hold while they arrive.
    pub max_request_bytes_total: u64,
    /// Connections one client may have open at once (HELLOs beyond are
    /// refused BUSY), so one principal cannot fill the connection cap.
    pub max_connections_per_client: usize,
}

impl Default for ForwarderConfig {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(5),
            max_in_flight_per_client: 256,
            max_reply_bytes_per_client: 32 << 20,
            max_reply_bytes_total: 512 << 20,
            max_request_bytes_per_client: 64 << 20,
            max_request_bytes_total: 1 << 30,
            max_connections_per_client: 64,
        }
    }
}

/// Bytes for a client: an error reply without allocation, or a whole frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// A 32-byte error response.
    Error([u8; proto::message::ERROR_REPLY_LEN]),
    /// Any other frame (HELLO, MAP, PONG).
    Frame(Vec<u8>),
}

impl Reply {
    /// The bytes to send.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Reply::Error(bytes) => bytes,
            Reply::Frame(bytes) => bytes,
        }
    }
}

/// What to do with a frame a client sent.
#[derive(Debug)]
pub enum ClientAction<'a> {
    /// Send `head` then `payload` on `link`.
    Forward {
        /// The link.
        link: LinkId,
        /// The rewritten frame and request header.
        head: [u8; FORWARD_HEAD_LEN],
        /// The write data, untouched (empty for other operations).
        payload: &'a [u8],
    },
    /// Send this back to the client.
    Reply(Reply),
    /// Send this back, then close the connection (a refused HELLO).
    ReplyAndClose(Reply),
    /// The authenticated client asks for a RoCEv2 queue pair with this end:
    /// set one up (see `roce`) and answer QP_ACCEPT with `tag`, or refuse.
    ConnectQp {
        /// The client's end and how its atomics are numbered.
        connect: proto::qp::Connect,
        /// The request's tag, for the answer.
        tag: u64,
    },
    /// Nothing to answer (frames a client should not send, like responses).
    Nothing,
    /// The stream cannot be framed any more: close it.
    Close,
}

/// What to do with a frame a server link sent.
#[derive(Debug)]
pub enum LinkAction<'a> {
    /// Send `head` then `payload` to client connection `conn`.
    Deliver {
        /// The client connection.
        conn: ConnId,
        /// The response's frame and response header, with the client's tag.
        head: [u8; REPLY_HEAD_LEN],
        /// The read data, untouched.
        payload: &'a [u8],
    },
    /// Send these bytes on the link (the link's opening answering its
    /// server).
    Send(Vec<u8>),
    /// Nothing to send (a control reply, or a response nobody waits for).
    Nothing,
    /// The link is unusable (broken framing, or a server that disagrees
    /// with the map): close it; then report [`Forwarder::link_down`].
    Close(String),
}

/// A link's state as the core sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkStatus {
    /// Not connected.
    Down,
    /// Connected; HELLO and MAP sent, answers awaited.
    Handshaking,
    /// Serving requests.
    Up,
}

/// Where a request goes.
#[derive(Debug, Clone, Copy)]
struct Route {
    /// Where in the server the request lands.
    at: RegionOffset,
    client_number: u32,
    link: LinkId,
}

/// A request forwarded and not answered yet.
#[derive(Debug)]
struct Pending {
    conn: ConnId,
    client_tag: u64,
    opcode: Opcode,
    sent: Instant,
    /// Bytes its answer will bring (READ data and the response head).
    reply_bytes: u64,
}

#[derive(Debug)]
struct Link {
    key: LinkKey,
    lane: Lane,
    status: LinkStatus,
    /// The link's opening while the server has not answered it.
    opening: Option<Opening>,
    /// The server's MAP from the last handshake, rechecked on reload.
    server_map: Option<map::Repr>,
    next_tag: u64,
    pending: IdMap<u64, Pending>,
    up_gauge: Arc<Gauge>,
    /// The first connection attempt has not ended yet (no handshake done,
    /// no failure): requests for its server wait instead of failing.
    starting: bool,
    /// Where the link stands with refreshing its server's region keys.
    key_refresh: KeyRefresh,
}

/// A request that arrived while every link to its region was still
/// starting; it is handled again once one is up (or none is starting).
#[derive(Debug)]
struct Parked {
    conn: ConnId,
    region: u32,
    frame: Vec<u8>,
    opcode: Opcode,
    tag: u64,
    deadline: Instant,
}

/// Requests parked at most, over all clients; beyond, they fail at once.
const MAX_PARKED: usize = 4096;

#[derive(Debug, Default)]
struct Session {
    /// The client's id and policy once its HELLO was accepted (refreshed on
    /// reload), so requests need no lookup by name.
    client: Option<(String, ClientPolicy)>,
    /// The client said HELLO on this connection (not a queue pair's session).
    by_hello: bool,
    /// With client authentication: the name said in HELLO and the
    /// challenge sent, until the proof arrives.
    challenged: Option<(String, [u8; proto::auth::NONCE_LEN])>,
    in_flight: usize,
    /// Bytes of the answers its requests in flight will bring.
    reply_bytes: u64,
    /// The map epoch the connection said it runs, if it said one.
    epoch: proto::fence::ConnEpoch,
}

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

/// The forwarding state of one fabric device.
#[derive(Debug)]
pub struct Forwarder {
    config: ForwarderConfig,
    /// This device's key, proven to servers when its links open.
    link_key: Option<proto::auth::Key>,
    /// With `--secrets`: the clients' keys; a client must prove its key
    /// after HELLO before anything else is answered.
    client_keys: Option<HashMap<String, proto::auth::Key>>,
    map: DeviceMap,
    /// The links of each NIC in `map.links`, by position.
    link_ids: Vec<Lanes>,
    links: IdMap<LinkId, Link>,
    next_link: u32,
    sessions: IdMap<ConnId, Session>,
    deadlines: DeadlineQueue,
    parked: Vec<Parked>,
    /// Bytes of answers on the way for all clients.
    reply_bytes: u64,
    /// Bytes of requests held while they arrive.
    request_budget: RequestBudget,
    /// The epoch the device runs, and what its servers said of theirs.
    epoch: DeviceEpoch,
    metrics: Arc<DeviceMetrics>,
}

/// Whether the request a deadline stands for still waits for its response
/// (link tags are never reused, so the tag alone tells).
fn is_pending(links: &IdMap<LinkId, Link>, deadline: &Deadline) -> bool {
    links
        .get(&deadline.link)
        .is_some_and(|l| l.pending.contains_key(&deadline.tag))
}

fn error_reply(opcode: Opcode, tag: u64, status: Status) -> Reply {
    Reply::Error(proto::error_reply(opcode, tag, status))
}

fn frame_reply(message: &Message<'_>, tag: u64) -> Reply {
    match message.encode_to_vec(tag) {
        Ok(bytes) => Reply::Frame(bytes),
        Err(_) => error_reply(message.opcode(), tag, Status::IoError),
    }
}

impl Forwarder {
    /// A core over `map`; every link starts down.
    pub fn new(map: DeviceMap, config: ForwarderConfig, metrics: Arc<DeviceMetrics>) -> Self {
        let mut core = Self {
            config,
            link_key: None,
            client_keys: None,
            map,
            link_ids: Vec::new(),
            links: IdMap::default(),
            next_link: 0,
            sessions: IdMap::default(),
            deadlines: DeadlineQueue::default(),
            parked: Vec::new(),
            reply_bytes: 0,
            request_budget: RequestBudget::new(
                config.max_request_bytes_per_client,
                config.max_request_bytes_total,
            ),
            epoch: DeviceEpoch::default(),
            metrics,
        };
        core.link_ids = (0..core.map.links.len())
            .map(|i| {
                let key = core.map.links[i].key.clone();
                core.add_lanes(&key)
            })
            .collect();
        core.metrics
            .map_regions
            .set(core.map.layout.entries().len() as i64);
        core
    }

    fn add_lanes(&mut self, key: &LinkKey) -> Lanes {
        Lanes {
            main: self.add_link(key.clone(), Lane::Main),
            bulk: self.add_link(key.clone(), Lane::Bulk),
        }
    }

    fn add_link(&mut self, key: LinkKey, lane: Lane) -> LinkId {
        let id = LinkId(self.next_link);
        self.next_link += 1;
        let up_gauge = self
            .metrics
            .link_up(key.server.as_str(), key.nic.as_str(), lane);
        up_gauge.set(0);
        self.links.insert(
            id,
            Link {
                key,
                lane,
                status: LinkStatus::Down,
                opening: None,
                server_map: None,
                next_tag: 1,
                pending: IdMap::default(),
                up_gauge,
                starting: true,
                key_refresh: KeyRefresh::Current,
            },
        );
        id
    }

    /// Which of its NIC's connections `link` is.
    pub fn link_lane(&self, link: LinkId) -> Option<Lane> {
        self.links.get(&link).map(|l| l.lane)
    }

    /// The current map.
    pub fn map(&self) -> &DeviceMap {
        &self.map
    }

    /// Every link with its identity.
    pub fn links(&self) -> impl Iterator<Item = (LinkId, &LinkKey)> {
        self.links.iter().map(|(id, link)| (*id, &link.key))
    }

    /// A link's identity.
    pub fn link_key(&self, link: LinkId) -> Option<&LinkKey> {
        self.links.get(&link).map(|l| &l.key)
    }

    /// A link's status.
    pub fn link_status(&self, link: LinkId) -> Option<LinkStatus> {
        self.links.get(&link).map(|l| l.status)
    }

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

    /// Requests forwarded and not answered yet, or parked until a link is
    /// up, over every link: what a drain waits for.
    pub fn requests_in_flight(&self) -> usize {
        self.links.values().map(|l| l.pending.len()).sum::<usize>() + self.parked.len()
    }

    /// Whether `conn`'s client has requests in flight.
    pub fn client_busy(&self, conn: ConnId) -> bool {
        self.sessions.get(&conn).is_some_and(|s| s.in_flight > 0)
    }

    /// A client connection closed: responses still due to it are dropped.
    pub fn client_closed(&mut self, conn: ConnId) {
        self.parked.retain(|p| p.conn != conn);
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

    /// Charges `conn` the bytes of requests its connection will hold once
    /// the frame it is receiving is in (see [`RequestBudget`]). With
    /// `admit`, a charge past its client's or the device's budget is
    /// refused and false returned: the driver stops reading the connection
    /// until there is room. Without, what was read is recorded as it is.
    pub fn charge_request_bytes(&mut self, conn: ConnId, bytes: u64, admit: bool) -> bool {
        let client = self
            .sessions
            .get(&conn)
            .and_then(|s| s.client.as_ref())
            .map(|(name, _)| name.as_str());
        let charged = self.request_budget.charge(conn, client, bytes, admit);
        if !charged {
            self.metrics.request_budget_waits.inc();
        }
        self.metrics
            .request_bytes_held
            .set(self.request_budget.total() as i64);
        charged
    }

    /// Whether `conn` may send another request now (backpressure).
    pub fn client_has_room(&self, conn: ConnId) -> bool {
        self.sessions.get(&conn).is_some_and(|s| {
            s.in_flight == 0
                || (s.in_flight < self.config.max_in_flight_per_client
                    && s.reply_bytes < self.config.max_reply_bytes_per_client
                    && self.reply_bytes < self.config.max_reply_bytes_total)
        })
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
                ClientAction::ConnectQp { connect, tag }
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

    /// A frame from a client that has not proven its key (client
    /// authentication on): HELLO draws a challenge, the proof is checked,
    /// anything else is refused and closes the connection.
    fn at_the_gate(
        &mut self,
        conn: ConnId,
        message: Message<'_>,
        tag: u64,
    ) -> ClientAction<'static> {
        let refuse = |metrics: &DeviceMetrics, reason: &str, opcode, status| {
            metrics.hello_refused.with(&[reason]).inc();
            ClientAction::ReplyAndClose(error_reply(opcode, tag, status))
        };
        let challenged = self.sessions.get(&conn).and_then(|s| s.challenged.clone());
        match (message, challenged) {
            (Message::Hello(hello), None) => {
                if hello.version < PROTOCOL_VERSION {
                    return refuse(
                        &self.metrics,
                        "version",
                        Opcode::Hello,
                        Status::VersionMismatch,
                    );
                }
                let known = self.map.clients.contains_key(hello.name)
                    && self
                        .client_keys
                        .as_ref()
                        .is_some_and(|keys| keys.contains_key(hello.name));
                if !known {
                    return refuse(
                        &self.metrics,
                        "unknown_client",
                        Opcode::Hello,
                        Status::UnknownClient,
                    );
                }
                let nonce = fresh_nonce();
                if let Some(session) = self.sessions.get_mut(&conn) {
                    session.challenged = Some((hello.name.to_owned(), nonce));
                }
                let mut bytes = Vec::new();
                let ours = Message::Hello(hello::Repr {
                    version: PROTOCOL_VERSION,
                    role: Role::FabricDevice,
                    capabilities: Capabilities::PIPELINING | Capabilities::EXACTLY_ONCE,
                    name: self.map.device.as_str(),
                });
                if ours.encode_into(tag, &mut bytes).is_err()
                    || Message::AuthChallenge(nonce)
                        .encode_into(tag, &mut bytes)
                        .is_err()
                {
                    return ClientAction::ReplyAndClose(error_reply(
                        Opcode::Hello,
                        tag,
                        Status::IoError,
                    ));
                }
                ClientAction::Reply(Reply::Frame(bytes))
            }
            (Message::AuthProof(proof), Some((name, nonce))) => {
                let transcript = proto::auth::Transcript {
                    role: Role::Client,
                    principal: &name,
                    listener: self.map.device.as_str(),
                    listener_nonce: nonce,
                    connector_nonce: proof.nonce,
                };
                let key = self.client_keys.as_ref().and_then(|keys| keys.get(&name));
                let Some(key) =
                    key.filter(|k| k.verify(proto::auth::Side::Connector, &transcript, &proof.mac))
                else {
                    return refuse(
                        &self.metrics,
                        "bad_proof",
                        Opcode::AuthProof,
                        Status::AccessDenied,
                    );
                };
                let answer = proto::auth::Proof {
                    nonce: [0; proto::auth::NONCE_LEN],
                    mac: key.prove(proto::auth::Side::Listener, &transcript),
                };
                // Proven: the HELLO's checks (connection cap) apply now.
                if let Some(session) = self.sessions.get_mut(&conn) {
                    session.challenged = None;
                }
                let hello = hello::Repr {
                    version: PROTOCOL_VERSION,
                    role: Role::Client,
                    capabilities: Capabilities::NONE,
                    name: &name,
                };
                match self.hello(conn, &hello, tag) {
                    ClientAction::Reply(_) => {
                        ClientAction::Reply(frame_reply(&Message::AuthProof(answer), tag))
                    }
                    refused => refused,
                }
            }
            (message, _) => refuse(
                &self.metrics,
                "unauthenticated",
                message.opcode(),
                Status::UnknownClient,
            ),
        }
    }

    fn hello(&mut self, conn: ConnId, hello: &hello::Repr<'_>, tag: u64) -> ClientAction<'static> {
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
            capabilities: Capabilities::PIPELINING | Capabilities::EXACTLY_ONCE,
            name: self.map.device.as_str(),
        });
        ClientAction::Reply(frame_reply(&reply, tag))
    }

    /// Where a request goes: its region, the offset in it, the client's
    /// number and the link to use; or the status that refuses it.
    fn route(&self, conn: ConnId, req: &request::Repr<'_>) -> Result<Route, Status> {
        let (_, policy) = self
            .sessions
            .get(&conn)
            .and_then(|s| s.client.as_ref())
            .ok_or(Status::UnknownClient)?;
        // The region index, the offset in it and the PMEM address; a
        // PMEM-addressed request needs only the map's extent table, not the
        // region's entry.
        let (region, offset, addr) = match req.target {
            Target::Pmem(addr) => {
                let at = self.map.lookup(addr).ok_or(Status::Unmapped)?;
                (at.offset.region, at.offset.offset, addr)
            }
            Target::Region(at) => {
                let entry = self.map.layout.entry(at.region).ok_or(Status::Unmapped)?;
                if at.offset >= entry.len {
                    return Err(Status::Unmapped);
                }
                let addr = entry.start.checked_add(at.offset).ok_or(Status::Unmapped)?;
                (entry.region, at.offset, addr)
            }
        };
        let len = u64::from(req.span_len());
        if !policy.allows(addr, len, req.operation.changes_memory()) {
            return Err(Status::AccessDenied);
        }
        let nics = self
            .map
            .region_links
            .get(region.0 as usize)
            .ok_or(Status::Unmapped)?;
        // The request's own lane on any NIC, else the other lane.
        let (lane, other) = match len >= BULK_MIN_BYTES {
            true => (Lane::Bulk, Lane::Main),
            false => (Lane::Main, Lane::Bulk),
        };
        let up = |id: &LinkId| {
            self.links
                .get(id)
                .is_some_and(|l| l.status == LinkStatus::Up)
        };
        let on = |lane| nics.iter().map(move |&i| self.link_ids[i].get(lane));
        let link = on(lane)
            .find(up)
            .or_else(|| on(other).find(up))
            .ok_or(Status::ServerUnavailable)?;
        Ok(Route {
            at: RegionOffset::new(region, offset),
            client_number: policy.number,
            link,
        })
    }

    /// Routes a request, records it as pending and rewrites its head.
    fn forward<'a>(
        &mut self,
        conn: ConnId,
        frame: &'a [u8],
        req: &request::Repr<'a>,
        tag: u64,
        now: Instant,
    ) -> ClientAction<'a> {
        let opcode = req.operation.opcode();
        let verdict = match self.fence(conn, opcode, tag) {
            Ok(verdict) => verdict,
            Err(stale) => return ClientAction::Reply(stale),
        };
        let route = match self.route(conn, req) {
            Ok(route) => route,
            Err(Status::ServerUnavailable)
                if self
                    .region_of(req)
                    .is_some_and(|region| self.park(conn, frame, region, opcode, tag, now)) =>
            {
                return ClientAction::Nothing;
            }
            Err(status) => return ClientAction::Reply(self.refuse(verdict, opcode, tag, status)),
        };
        let Some(link) = self.links.get_mut(&route.link) else {
            return ClientAction::Reply(error_reply(opcode, tag, Status::ServerUnavailable));
        };
        let reply_bytes = REPLY_HEAD_LEN as u64
            + match req.operation {
                Operation::Read => u64::from(req.length),
                _ => 0,
            };
        let link_tag = link.next_tag;
        link.next_tag = (link.next_tag + 1) & !CONTROL_TAG;
        let deadline = now + self.config.request_timeout;
        link.pending.insert(
            link_tag,
            Pending {
                conn,
                client_tag: tag,
                opcode,
                sent: now,
                reply_bytes,
            },
        );
        let links = &self.links;
        self.deadlines.push(
            Deadline {
                at: deadline,
                link: route.link,
                tag: link_tag,
            },
            |d| is_pending(links, d),
        );
        if let Some(session) = self.sessions.get_mut(&conn) {
            session.in_flight += 1;
            session.reply_bytes += reply_bytes;
        }
        self.reply_bytes += reply_bytes;
        self.metrics.in_flight.inc();

        let mut head = [0u8; FORWARD_HEAD_LEN];
        head.copy_from_slice(&frame[..FORWARD_HEAD_LEN]);
        let (frame_head, body) = head.split_at_mut(frame::HEADER_LEN);
        frame::Packet::new_unchecked(frame_head).set_tag(link_tag);
        let mut packet = request::Packet::new_unchecked(body);
        // The server learns which client the device acts for (it checks that
        // client's grants when it authenticates its peers).
        packet.set_flags(
            packet.flags() | request::flags::REGION_ADDRESSED | request::flags::ON_BEHALF,
        );
        packet.set_region(route.at.region.0);
        packet.set_addr(route.at.offset);
        match req.exactly_once {
            // The client picks the lane; its number is the device's to say.
            Some(once) => packet.set_client(once.stamped(route.client_number).client),
            None => packet.set_client(route.client_number & request::CLIENT_NUMBER_MASK),
        }
        self.metrics.bytes_to_servers.add(frame.len() as u64);
        ClientAction::Forward {
            link: route.link,
            head,
            payload: &frame[FORWARD_HEAD_LEN..],
        }
    }

    /// The region a request addresses, if it addresses one.
    fn region_of(&self, req: &request::Repr<'_>) -> Option<u32> {
        match req.target {
            Target::Pmem(addr) => self.map.lookup(addr).map(|at| at.offset.region.0),
            Target::Region(at) => self.map.layout.entry(at.region).map(|e| e.region.0),
        }
    }

    /// Whether some link to `region` is still on its first attempt.
    fn region_starting(&self, region: u32) -> bool {
        self.map
            .region_links
            .get(region as usize)
            .is_some_and(|links| {
                links.iter().any(|&i| {
                    self.links
                        .get(&self.link_ids[i].main)
                        .is_some_and(|l| l.starting && l.status != LinkStatus::Up)
                })
            })
    }

    /// Keeps a request for a server whose links are still starting (right
    /// after the device starts), bounded by the request timeout and
    /// [`MAX_PARKED`]; false when it must fail now.
    fn park(
        &mut self,
        conn: ConnId,
        frame: &[u8],
        region: u32,
        opcode: Opcode,
        tag: u64,
        now: Instant,
    ) -> bool {
        if self.parked.len() >= MAX_PARKED || !self.region_starting(region) {
            return false;
        }
        self.parked.push(Parked {
            conn,
            region,
            frame: frame.to_vec(),
            opcode,
            tag,
            deadline: now + self.config.request_timeout,
        });
        if let Some(session) = self.sessions.get_mut(&conn) {
            session.in_flight += 1;
        }
        true
    }

    /// Parked requests that can go now (a link to their region is up, or
    /// none is starting any more): the driver hands each to
    /// [`Forwarder::client_frame`] again, which forwards or refuses it.
    pub fn take_unparked(&mut self) -> Vec<(ConnId, Vec<u8>)> {
        if self.parked.is_empty() {
            return Vec::new();
        }
        let (ready, waiting): (Vec<Parked>, Vec<Parked>) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|p| !self.region_starting(p.region));
        self.parked = waiting;
        ready
            .into_iter()
            .map(|p| {
                if let Some(session) = self.sessions.get_mut(&p.conn) {
                    session.in_flight = session.in_flight.saturating_sub(1);
                }
                (p.conn, p.frame)
            })
            .collect()
    }

    /// Requires every client to prove its key (from `keys`, by client id)
    /// after HELLO; a client without a key is refused.
    pub fn require_client_keys(&mut self, keys: HashMap<String, proto::auth::Key>) {
        self.client_keys = Some(keys);
    }

    /// Proves this device to its servers with `key` when links open (their
    /// servers then require it).
    pub fn set_link_key(&mut self, key: proto::auth::Key) {
        self.link_key = Some(key);
    }

    /// The bytes to send on a link that just connected: HELLO and
    /// MAP_REQUEST (after the proofs, with a link key). The link is up once
    /// the server answers and agrees with the map.
    pub fn link_connected(&mut self, link: LinkId) -> Vec<u8> {
        let Some(state) = self.links.get_mut(&link) else {
            return Vec::new();
        };
        state.status = LinkStatus::Handshaking;
        let mut out = Vec::new();
        state.opening = Opening::start(
            Role::FabricDevice,
            Capabilities::PIPELINING | Capabilities::REGION_ADDRESSING,
            self.map.device.as_str(),
            true,
            LINK_OPENING,
            self.link_key.clone().map(|key| Credentials {
                key,
                nonce: fresh_nonce(),
            }),
            &mut out,
        )
        .ok();
        if state.opening.is_none() {
            out.clear();
        }
        out
    }

    /// Handles one complete frame from a server link.
    pub fn link_frame<'a>(
        &mut self,
        link_id: LinkId,
        frame: &'a [u8],
        now: Instant,
    ) -> LinkAction<'a> {
        let header = match Header::parse(frame) {
            Ok(header) => header,
            Err(e) => return LinkAction::Close(format!("bad frame from server: {e}")),
        };
        if header.tag == KEY_REFRESH_TAG {
            return self.keys_refreshed(link_id, frame);
        }
        if header.tag == MAP_EPOCH_TAG {
            self.server_response(frame);
            return LinkAction::Nothing;
        }
        if header.tag & CONTROL_TAG != 0 {
            return self.link_control(link_id, frame);
        }
        if !header.opcode.is_response() || frame.len() < REPLY_HEAD_LEN {
            return LinkAction::Close(format!("unexpected {} frame from server", header.opcode));
        }
        let Some(link) = self.links.get_mut(&link_id) else {
            return LinkAction::Nothing;
        };
        let Some(pending) = link.pending.remove(&header.tag) else {
            // Answered already (timed out); nobody waits for it.
            return LinkAction::Nothing;
        };
        let links = &self.links;
        self.deadlines.trim(|d| is_pending(links, d));
        self.metrics.in_flight.dec();
        self.metrics
            .server_rtt
            .observe_duration(now.saturating_duration_since(pending.sent));
        self.reply_bytes = self.reply_bytes.saturating_sub(pending.reply_bytes);
        let Some(session) = self.sessions.get_mut(&pending.conn) else {
            return LinkAction::Nothing;
        };
        session.in_flight = session.in_flight.saturating_sub(1);
        session.reply_bytes = session.reply_bytes.saturating_sub(pending.reply_bytes);
        let mut head = [0u8; REPLY_HEAD_LEN];
        head.copy_from_slice(&frame[..REPLY_HEAD_LEN]);
        frame::Packet::new_unchecked(&mut head[..frame::HEADER_LEN]).set_tag(pending.client_tag);
        let status = response::Packet::new_unchecked(&head[frame::HEADER_LEN..]).status();
        if status == Status::AccessDenied {
            // Perhaps a key rotated on the server: learn its keys again, so
            // the client's next MAP (and the device's own RoCE requests)
            // carry the current ones.
            if let Some(link) = self.links.get_mut(&link_id)
                && link.key_refresh == KeyRefresh::Current
                && link.status == LinkStatus::Up
            {
                link.key_refresh = KeyRefresh::Due;
            }
        }
        if status == Status::StaleMap {
            // Relayed as it is (its value is the server's epoch); a newer
            // one than the device's calls for the map now.
            self.server_response(frame);
        }
        self.metrics.record(pending.opcode, status);
        self.metrics.bytes_to_clients.add(frame.len() as u64);
        LinkAction::Deliver {
            conn: pending.conn,
            head,
            payload: &frame[REPLY_HEAD_LEN..],
        }
    }

    /// The server's answers to the device's own HELLO and MAP_REQUEST.
    fn link_control<'a>(&mut self, link_id: LinkId, frame: &[u8]) -> LinkAction<'a> {
        let Some(link) = self.links.get_mut(&link_id) else {
            return LinkAction::Nothing;
        };
        let server = link.key.server.clone();
        let Some(opening) = link.opening.as_mut() else {
            return LinkAction::Close("handshake answer on a link that sent none".into());
        };
        let wrong_peer = |name: &str, role: Role| {
            (role != Role::Server || name != server.as_str()).then(|| {
                LinkAction::Close(format!(
                    "expected server {server:?}, but {name:?} ({role:?}) answered"
                ))
            })
        };
        let mut answer = Vec::new();
        let opened = match opening.handle_frame(frame, &mut answer) {
            Ok(Progress::Waiting) => {
                let refused = opening
                    .peer()
                    .and_then(|(name, role)| wrong_peer(name, role));
                return refused.unwrap_or(if answer.is_empty() {
                    LinkAction::Nothing
                } else {
                    LinkAction::Send(answer)
                });
            }
            Ok(Progress::Opened(opened)) => opened,
            Err(e) => return LinkAction::Close(format!("link handshake: {e}")),
        };
        link.opening = None;
        if let Some(close) = wrong_peer(&opened.peer, opened.role) {
            return close;
        }
        let Some(theirs) = opened.map else {
            return LinkAction::Close("no MAP in the link handshake".into());
        };
        if !self.map.server_agrees(&server, &theirs) {
            return LinkAction::Close(format!(
                "server {server:?} serves a layout that disagrees with this device's map"
            ));
        }
        self.learn_keys(&server, &theirs);
        let Some(link) = self.links.get_mut(&link_id) else {
            return LinkAction::Nothing;
        };
        link.status = LinkStatus::Up;
        link.up_gauge.set(1);
        link.starting = false;
        link.key_refresh = KeyRefresh::Current;
        link.server_map = Some(theirs);
        // Ordered before any request the link will carry.
        self.link_opened_epoch()
            .map_or(LinkAction::Nothing, LinkAction::Send)
    }

    /// A link broke or was closed: every request in flight on it is answered
    /// SERVER_UNAVAILABLE.
    pub fn link_down(&mut self, link_id: LinkId) -> Vec<(ConnId, Reply)> {
        let Some(link) = self.links.get_mut(&link_id) else {
            return Vec::new();
        };
        link.status = LinkStatus::Down;
        link.starting = false;
        link.opening = None;
        link.server_map = None;
        link.key_refresh = KeyRefresh::Current;
        link.up_gauge.set(0);
        let pending: Vec<Pending> = link.pending.drain().map(|(_, p)| p).collect();
        let links = &self.links;
        self.deadlines.trim(|d| is_pending(links, d));
        pending
            .into_iter()
            .filter_map(|p| self.answer(p, Status::ServerUnavailable))
            .collect()
    }

    /// Settles a pending request with an error status for its client.
    fn answer(&mut self, pending: Pending, status: Status) -> Option<(ConnId, Reply)> {
        self.metrics.in_flight.dec();
        self.reply_bytes = self.reply_bytes.saturating_sub(pending.reply_bytes);
        let session = self.sessions.get_mut(&pending.conn)?;
        session.in_flight = session.in_flight.saturating_sub(1);
        session.reply_bytes = session.reply_bytes.saturating_sub(pending.reply_bytes);
        self.metrics.record(pending.opcode, status);
        Some((
            pending.conn,
            error_reply(pending.opcode, pending.client_tag, status),
        ))
    }

    /// When [`Forwarder::handle_timeouts`] next has work. Drops the
    /// deadlines of answered requests from the front of the queue first
    /// (done here, before the driver sleeps, rather than every turn).
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        let links = &self.links;
        self.deadlines.trim(|d| is_pending(links, d));
        let parked = self.parked.iter().map(|p| p.deadline).min();
        match (self.deadlines.first(), parked) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Answers TIMEOUT to every request whose deadline has passed. Also
    /// returns the links those requests were waiting on: a link that stops
    /// answering (a cut cable keeps TCP quiet for minutes) is to be closed
    /// and reconnected, which fails its other requests at once.
    pub fn handle_timeouts(&mut self, now: Instant) -> (Vec<(ConnId, Reply)>, Vec<LinkId>) {
        let mut replies = Vec::new();
        let mut silent = Vec::new();
        while let Some(Deadline {
            link: link_id, tag, ..
        }) = self.deadlines.pop_due(now)
        {
            let pending = self
                .links
                .get_mut(&link_id)
                .and_then(|l| l.pending.remove(&tag));
            if let Some(pending) = pending {
                if !silent.contains(&link_id) {
                    silent.push(link_id);
                }
                if let Some(reply) = self.answer(pending, Status::Timeout) {
                    replies.push(reply);
                }
            }
        }
        if self.parked.is_empty() {
            return (replies, silent);
        }
        let (expired, parked): (Vec<Parked>, Vec<Parked>) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|p| p.deadline <= now);
        self.parked = parked;
        for p in expired {
            if let Some(session) = self.sessions.get_mut(&p.conn) {
                session.in_flight = session.in_flight.saturating_sub(1);
                self.metrics.record(p.opcode, Status::Timeout);
                replies.push((p.conn, error_reply(p.opcode, p.tag, Status::Timeout)));
            }
        }
        (replies, silent)
    }

    /// Swaps in a new map without touching client connections. Links that
    /// keep their identity keep their connection if their server's MAP
    /// agrees with the new map, and are to be reconnected otherwise; new
    /// links are to be connected, removed ones closed. Sessions of clients
    /// the new topology no longer names lose their admission.
    pub fn reload(&mut self, map: DeviceMap) -> ReloadOutcome {
        let mut outcome = ReloadOutcome::default();
        let mut by_key: HashMap<(LinkKey, Lane), LinkId> = self
            .links
            .iter()
            .map(|(id, l)| ((l.key.clone(), l.lane), *id))
            .collect();
        let mut link_ids = Vec::with_capacity(map.links.len());
        for spec in &map.links {
            let mut lane = |lane| match by_key.remove(&(spec.key.clone(), lane)) {
                Some(id) => id,
                None => {
                    let id = self.add_link(spec.key.clone(), lane);
                    outcome.connect.push(id);
                    id
                }
            };
            let lanes = Lanes {
                main: lane(Lane::Main),
                bulk: lane(Lane::Bulk),
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
                    .is_none_or(|theirs| map.server_agrees(&l.key.server, theirs))
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
        self.link_ids = link_ids;
        self.map = map;
        // The new map knows no keys yet: the servers' last MAPs have them.
        let known: Vec<(topology::ServerId, map::Repr)> = self
            .links
            .values()
            .filter_map(|l| Some((l.key.server.clone(), l.server_map.clone()?)))
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

/// 32 random bytes from the operating system, for a link's proof.
fn fresh_nonce() -> [u8; proto::auth::NONCE_LEN] {
    let mut nonce = [0u8; proto::auth::NONCE_LEN];
    // Linux's source does not fail once booted; a failure leaves zeros,
    // which only weakens this one proof's freshness, not the key.
    let _ = getrandom::fill(&mut nonce);
    nonce
}

#[cfg(test)]
mod tests;
