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
//! sends on a link carry tags with the top bit set ([`crate::link_tags`]).
//!
//! This module holds the [`Forwarder`] and what it returns; each concern of
//! its `impl` is a submodule:
//!
//! - `clients`: a session per client connection, HELLO, and the dispatch
//!   of each frame a client sends ([`Forwarder::client_frame`]).
//! - `gate`: client authentication, a proof of the client's key after HELLO.
//! - `budget`: what a client may hold (requests in flight, bytes of answers
//!   and of requests arriving).
//! - `routing`: where a request goes, and its head rewritten for the link.
//! - `parking`: requests waiting for links still on their first attempt.
//! - `links`: server links, their opening, the responses they bring
//!   ([`Forwarder::link_frame`]) and a link going down.
//! - `timeouts`: request deadlines and TIMEOUT answers.
//! - `offload`: which requests a link's RDMA queue pair carries, and
//!   their completions answered ([`Forwarder::rdma_completed`]).
//! - `copy_ticket`: what a request to one copy of a replicated region is
//!   part of, as its link remembers it.
//! - `reload`: a new map applied.
//! - `replication`: regions with several copies: the owner's fan-out,
//!   atomics decided at one copy, reads, and copies lost.
//! - `keys`: region keys learnt from servers and passed on in clients' MAPs.
//! - `epoch`: the map epoch, fencing client connections and said to servers.
//! - `tests`: the core on a virtual clock, one file per concern.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use proto::{Message, Opcode, Status, frame, request, response};

use crate::deadline::DeadlineQueue;
use crate::idmap::IdMap;
pub use crate::ids::{ConnId, LinkId};
use crate::map::DeviceMap;
use crate::metrics::DeviceMetrics;
use crate::request_budget::RequestBudget;

mod budget;
mod clients;
mod copy_ticket;
mod epoch;
mod gate;
mod keys;
mod links;
mod offload;
mod parking;
mod reload;
mod replication;
mod routing;
mod timeouts;

use clients::Session;
use epoch::DeviceEpoch;
pub use links::LinkStatus;
use links::{Lanes, Link};
pub use offload::{Offload, Step, one_sided};
/// The decision alone, for the uplink's tests.
#[cfg(test)]
pub use offload::{RequestFields, decide, failure_status};
use parking::Parked;
use replication::Replication;
pub use replication::{HeardSince, Outgoing, OwnedRegion};

/// The protocol version this device speaks.
pub use proto::PROTOCOL_VERSION;
/// Length of a forwarded request's rewritten head (frame + request header).
pub const FORWARD_HEAD_LEN: usize = frame::HEADER_LEN + request::HEADER_LEN;
/// Length of a relayed response's rewritten head (frame + response header).
pub const REPLY_HEAD_LEN: usize = frame::HEADER_LEN + response::HEADER_LEN;

/// Tunables of the forwarding core.
#[derive(Debug, Clone, Copy)]
pub struct ForwarderConfig {
    /// A forwarded request unanswered for this long is answered TIMEOUT.
    pub request_timeout: Duration,
    /// A request to one copy of a replicated region unanswered for this
    /// long loses that copy, when the region has another copy to go on
    /// with (the last serving copy waits for `request_timeout`). Shorter
    /// than the clients' attempt timeout, so an owner settles a silent
    /// copy before its clients give up on the owner's path.
    pub copy_timeout: Duration,
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
    /// Bytes per second this device's resyncs copy to syncing copies, all
    /// together (at least 1).
    pub resync_rate: u64,
}

impl Default for ForwarderConfig {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(5),
            copy_timeout: Duration::from_secs(1),
            max_in_flight_per_client: 256,
            max_reply_bytes_per_client: 32 << 20,
            max_reply_bytes_total: 512 << 20,
            max_request_bytes_per_client: 64 << 20,
            max_request_bytes_total: 1 << 30,
            max_connections_per_client: 64,
            resync_rate: crate::resync::rate::DEFAULT_RATE,
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
        /// Post it as these work requests on the link's RDMA queue pair
        /// instead, when it has room (else send it as above).
        rdma: Option<Offload>,
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
    /// The copy timeouts of requests to copies of replicated regions.
    copy_deadlines: DeadlineQueue,
    parked: Vec<Parked>,
    /// Bytes of answers on the way for all clients.
    reply_bytes: u64,
    /// Bytes of requests held while they arrive.
    request_budget: RequestBudget,
    /// The epoch the device runs, and what its servers said of theirs.
    epoch: DeviceEpoch,
    /// Replicated regions: their copies, operations and outbox.
    replication: Replication,
    /// Links whose first connection attempt has not ended (no handshake
    /// done, no failure): while none is, no request waits for one.
    links_starting: usize,
    metrics: Arc<DeviceMetrics>,
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

/// 32 random bytes from the operating system, for a link's proof.
fn fresh_nonce() -> [u8; proto::auth::NONCE_LEN] {
    let mut nonce = [0u8; proto::auth::NONCE_LEN];
    // Linux's source does not fail once booted; a failure leaves zeros,
    // which only weakens this one proof's freshness, not the key.
    let _ = getrandom::fill(&mut nonce);
    nonce
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
            copy_deadlines: DeadlineQueue::default(),
            parked: Vec::new(),
            reply_bytes: 0,
            request_budget: RequestBudget::new(
                config.max_request_bytes_per_client,
                config.max_request_bytes_total,
            ),
            epoch: DeviceEpoch::default(),
            replication: Replication::default(),
            links_starting: 0,
            metrics,
        };
        core.replication_from_map();
        core.set_resync_rate(config.resync_rate);
        core.link_ids = (0..core.map.links.len())
            .map(|i| {
                let key = core.map.links[i].target.clone();
                core.add_lanes(&key)
            })
            .collect();
        core.metrics
            .map_regions
            .set(core.map.layout.entries().len() as i64);
        core
    }

    /// The current map.
    pub fn map(&self) -> &DeviceMap {
        &self.map
    }

    /// Requests forwarded and not answered yet, or parked until a link is
    /// up, over every link: what a drain waits for.
    pub fn requests_in_flight(&self) -> usize {
        self.links.values().map(|l| l.pending.len()).sum::<usize>()
            + self.parked.len()
            + self.replicated_in_flight()
    }
}

#[cfg(test)]
mod tests;
