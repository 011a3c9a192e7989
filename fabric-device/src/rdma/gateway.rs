//! RoCEv2 queue pairs the device terminates, bridged to the forwarding core.
//!
//! A client's RNIC talks Reliable Connection to the device: each of its
//! queue pairs ends here in a [`QueuePair`] (sans-IO, from `proto::roce::rc`).
//! The queue pair's responder asks for memory operations; the gateway turns
//! each into a request of the device's own protocol addressed by PMEM
//! address (the RETH / AtomicETH virtual address is a PMEM address of the
//! pool) and hands it to the [`Forwarder`] as if the client had sent it on
//! a connection of its own, so routing, allow-lists, link choice and
//! timeouts are the ones TCP clients get. The server's answer comes back as
//! a response on that connection and completes the operation; the queue
//! pair turns it into READ responses, ATOMIC ACKs, ACKs or NAKs.
//!
//! Exactly-once atomics: an RDMA atomic carries no sequence number, so a
//! queue pair set up with an [`AtomicSeq`] has its COMPARE_SWAPs and
//! FETCH_ADDs numbered here, in arrival order, and forwarded as
//! exactly-once on the client's lane. A retransmitted atomic is answered by
//! the queue pair from its own record and never reaches this numbering.
//!
//! R_Keys: RDMA carries a 32-bit R_Key where the pool uses 64-bit region
//! keys, so each queue pair gets a table from the R_Keys it was given at
//! set-up to the region keys they stand for. An R_Key outside the table is
//! a remote access error and never reaches a server.
//!
//! A queue pair is set up on behalf of a client already authenticated on a
//! control connection and acts with that client's identity and grants;
//! datagrams for an unknown QP number, or from another address than the
//! one the queue pair was set up with, are dropped and counted.

use std::collections::HashMap;
use std::time::Instant;

use proto::fence::ConnEpoch;
use proto::frame;
use proto::qp::AtomicSeq;
use proto::request::{self, ExactlyOnce, Target};
use proto::roce::Datagram;
use proto::roce::rc::{
    AccessError, Counters, Execution, MemoryOp, MemoryReply, QpConfig, QueuePair,
};
use proto::{AccessKey, Message, PmemAddr, RegionIndex, Status, response};

use crate::forward::{ClientAction, Forwarder, Offload};
use crate::ids::{ConnId, LinkId};
pub(crate) use crate::rdma::qp_numbering::random_u32;
use crate::rdma::qp_numbering::{GATEWAY_QPN_FIRST, QPN_BASE};

/// Connection ids of queue pairs, far above the driver's socket numbering.
const QP_CONN_BASE: ConnId = 1 << 62;

/// What a queue pair is set up with.
#[derive(Debug, Clone)]
pub struct QpSetup {
    /// The client the queue pair acts for (authenticated by the caller).
    pub client: String,
    /// The queue pair's attributes; `local_qpn` is assigned by the gateway.
    pub config: QpConfig,
    /// R_Keys the client may use, with the regions they stand for; each
    /// operation carries the region key the device knows at that moment.
    pub rkeys: Vec<(u32, RegionIndex)>,
    /// How the queue pair's atomics are numbered for exactly-once
    /// execution; `None`: they are not.
    pub atomics: Option<AtomicSeq>,
    /// The map epoch the queue pair runs ([`Forwarder::qp_epoch`]): its
    /// requests are fenced by it.
    pub epoch: ConnEpoch,
}

/// Why a queue pair could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetupError {
    /// The forwarding core refused the client.
    #[error("client refused: {0:?}")]
    Client(Status),
    /// The attributes are out of range.
    #[error("queue pair attributes")]
    Config(#[source] proto::roce::rc::ConfigError),
}

/// Counters of the gateway as a whole (per-QP ones live in each QP).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GatewayCounters {
    /// Datagrams dropped for a bad ICRC before a QP could be found.
    pub icrc_errors: u64,
    /// Datagrams dropped as malformed before a QP could be found.
    pub malformed: u64,
    /// Datagrams for a QP number the device does not have.
    pub unknown_qp: u64,
    /// Operations refused locally for an R_Key outside the QP's table.
    pub bad_rkeys: u64,
}

/// What the core was asked to do for one execution.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Read,
    Atomic,
    Other,
}

#[derive(Debug)]
struct GatewayQp {
    qp: QueuePair,
    conn: ConnId,
    rkeys: HashMap<u32, RegionIndex>,
    /// The lane and number of the next COMPARE_SWAP / FETCH_ADD.
    atomics: Option<AtomicSeq>,
    /// Requests forwarded for this QP: tag → (ticket, kind).
    forwarded: HashMap<u64, (u64, Kind)>,
    next_tag: u64,
}

/// The RoCE queue pairs of one device port.
#[derive(Debug, Default)]
pub struct RoceGateway {
    qps: HashMap<u32, GatewayQp>,
    by_conn: HashMap<ConnId, u32>,
    next_qpn: u32,
    counters: GatewayCounters,
    /// Counters of the queue pairs already closed.
    closed: Counters,
    /// Index for round-robin transmission.
    turn: usize,
}

impl RoceGateway {
    /// A gateway with no queue pairs.
    pub fn new() -> Self {
        RoceGateway {
            next_qpn: GATEWAY_QPN_FIRST,
            ..Self::default()
        }
    }

    /// Gateway-wide counters.
    pub fn counters(&self) -> &GatewayCounters {
        &self.counters
    }

    /// Counters summed over every queue pair the gateway had, closed ones included.
    pub fn totals(&self) -> Counters {
        let mut totals = self.closed;
        for q in self.qps.values() {
            totals.add(q.qp.counters());
        }
        totals
    }

    /// Each queue pair's number and counters.
    pub fn qp_counters(&self) -> impl Iterator<Item = (u32, &Counters)> {
        self.qps.iter().map(|(qpn, q)| (*qpn, q.qp.counters()))
    }

    /// Sets up a queue pair for `setup.client`; returns its QP number.
    pub fn open(&mut self, fwd: &mut Forwarder, mut setup: QpSetup) -> Result<u32, SetupError> {
        let qpn = self.next_qpn;
        setup.config.local_qpn = qpn;
        let qp = QueuePair::new(setup.config).map_err(SetupError::Config)?;
        let conn = QP_CONN_BASE + u64::from(qpn);
        fwd.open_session_as(conn, &setup.client)
            .map_err(SetupError::Client)?;
        fwd.qp_runs_epoch(conn, setup.epoch);
        // Numbers from `QPN_BASE` up belong to the queue pairs toward
        // servers.
        self.next_qpn = if qpn + 1 >= QPN_BASE {
            GATEWAY_QPN_FIRST
        } else {
            qpn + 1
        };
        self.qps.insert(
            qpn,
            GatewayQp {
                qp,
                conn,
                rkeys: setup.rkeys.into_iter().collect(),
                atomics: setup.atomics,
                forwarded: HashMap::new(),
                next_tag: 1,
            },
        );
        self.by_conn.insert(conn, qpn);
        Ok(qpn)
    }

    /// Tears a queue pair down; answers still due to it are dropped.
    pub fn close(&mut self, fwd: &mut Forwarder, qpn: u32) {
        if let Some(q) = self.qps.remove(&qpn) {
            self.closed.add(q.qp.counters());
            self.by_conn.remove(&q.conn);
            fwd.client_closed(q.conn);
        }
    }

    /// Takes a datagram from the port and forwards what its QP needs done;
    /// `send` gets each forwarded request as a head and a payload for a link,
    /// with the work requests that carry it where RDMA may.
    pub fn handle_datagram(
        &mut self,
        now: Instant,
        bytes: &[u8],
        fwd: &mut Forwarder,
        send: impl FnMut(LinkId, &[u8], &[u8], Option<Offload>),
    ) {
        let checked = match Datagram::new_checked(bytes) {
            Ok(d) => d,
            Err(proto::roce::Error::BadIcrc { .. }) => {
                self.counters.icrc_errors += 1;
                return;
            }
            Err(_) => {
                self.counters.malformed += 1;
                return;
            }
        };
        let qpn = checked.transport.bth().dest_qp();
        let Some(q) = self.qps.get_mut(&qpn) else {
            self.counters.unknown_qp += 1;
            return;
        };
        q.qp.handle_checked(now, &checked);
        pump(q, fwd, now, &mut self.counters, send);
    }

    /// A response the forwarding core relayed to queue pair connection `conn`
    /// (`LinkAction::Deliver`), or an error reply it made for one (a timeout,
    /// a link lost): completes the operation it answers. Returns false when
    /// `conn` is not a queue pair's.
    pub fn deliver(&mut self, conn: ConnId, head: &[u8], payload: &[u8]) -> bool {
        let Some(q) = self.by_conn.get(&conn).and_then(|n| self.qps.get_mut(n)) else {
            return false;
        };
        let Some((tag, status, value)) = parse_response_head(head) else {
            return true;
        };
        let Some((ticket, kind)) = q.forwarded.remove(&tag) else {
            return true;
        };
        let result = match (status, kind) {
            (Status::Ok, Kind::Read) => Ok(MemoryReply::Read(payload.to_vec())),
            (Status::Ok, Kind::Atomic) => Ok(MemoryReply::Atomic(value)),
            (Status::Ok, Kind::Other) => Ok(MemoryReply::Done),
            (status, _) => Err(access_error(status)),
        };
        q.qp.complete_execution(ticket, result);
        true
    }

    /// Writes the next datagram any queue pair has to send into `buf`.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> bool {
        let n = self.qps.len();
        if n == 0 {
            return false;
        }
        let qpns: Vec<u32> = self.qps.keys().copied().collect();
        for i in 0..n {
            let qpn = qpns[(self.turn + i) % n];
            if let Some(q) = self.qps.get_mut(&qpn)
                && q.qp.poll_transmit(now, buf)
            {
                self.turn = (self.turn + i + 1) % n;
                return true;
            }
        }
        false
    }

    /// The earliest timer of any queue pair.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.qps.values().filter_map(|q| q.qp.poll_timeout()).min()
    }

    /// Fires the queue pairs' timers that are due.
    pub fn handle_timeout(&mut self, now: Instant) {
        for q in self.qps.values_mut() {
            if q.qp.poll_timeout().is_some_and(|t| t <= now) {
                q.qp.handle_timeout(now);
            }
        }
    }
}

/// Forwards every memory operation `q`'s responder asks for.
fn pump(
    q: &mut GatewayQp,
    fwd: &mut Forwarder,
    now: Instant,
    counters: &mut GatewayCounters,
    mut send: impl FnMut(LinkId, &[u8], &[u8], Option<Offload>),
) {
    let mut frame = Vec::new();
    while let Some(Execution { ticket, op }) = q.qp.poll_execution() {
        // Every new atomic takes the next number, refused or not: the
        // client counts its posts the same way.
        let once = match (&op, q.atomics.as_mut()) {
            (MemoryOp::CompareSwap { .. } | MemoryOp::FetchAdd { .. }, Some(next)) => {
                let once = ExactlyOnce::on_lane(next.lane, next.first);
                next.first = next.first.wrapping_add(1);
                Some(once)
            }
            _ => None,
        };
        let key = |rkey: &u32| {
            let region = q.rkeys.get(rkey)?;
            Some(fwd.map().layout.entry(*region)?.key)
        };
        let Some((mut req, kind)) = request_for(&op, key) else {
            counters.bad_rkeys += 1;
            q.qp.complete_execution(ticket, Err(AccessError::BadKey));
            continue;
        };
        if let Some(once) = once {
            req = req.with_exactly_once(once.client, once.seq);
        }
        let tag = q.next_tag;
        q.next_tag += 1;
        frame.clear();
        if Message::Request(req).encode_into(tag, &mut frame).is_err() {
            q.qp.complete_execution(ticket, Err(AccessError::Failed));
            continue;
        }
        match fwd.client_frame(q.conn, &frame, now) {
            ClientAction::Forward {
                link,
                head,
                payload,
                rdma,
            } => {
                q.forwarded.insert(tag, (ticket, kind));
                send(link, &head, payload, rdma);
            }
            ClientAction::Reply(reply) | ClientAction::ReplyAndClose(reply) => {
                let status = parse_response_head(reply.as_bytes())
                    .map_or(Status::IoError, |(_, status, _)| status);
                q.qp.complete_execution(ticket, Err(access_error(status)));
            }
            // Parked until a link to the server comes up: the answer
            // arrives later under the same tag.
            ClientAction::Nothing => {
                q.forwarded.insert(tag, (ticket, kind));
            }
            ClientAction::Close | ClientAction::ConnectQp { .. } => {
                q.qp.complete_execution(ticket, Err(AccessError::Failed));
            }
        }
    }
}

/// The device request that performs `op`, with the region key `key` gives
/// for its R_Key; `None` for an R_Key the queue pair was not given.
fn request_for<'a>(
    op: &'a MemoryOp,
    key: impl Fn(&u32) -> Option<AccessKey>,
) -> Option<(request::Repr<'a>, Kind)> {
    let at = |va: u64| Target::Pmem(PmemAddr(va));
    Some(match op {
        MemoryOp::Read { va, rkey, len } => {
            (request::Repr::read(at(*va), key(rkey)?, *len), Kind::Read)
        }
        MemoryOp::Write { va, rkey, data } => {
            (request::Repr::write(at(*va), key(rkey)?, data), Kind::Other)
        }
        MemoryOp::CompareSwap {
            va,
            rkey,
            compare,
            swap,
        } => (
            request::Repr::compare_swap(at(*va), key(rkey)?, *compare, *swap),
            Kind::Atomic,
        ),
        MemoryOp::FetchAdd { va, rkey, add } => (
            request::Repr::fetch_add(at(*va), key(rkey)?, *add),
            Kind::Atomic,
        ),
        // The 8 bytes are a memory image; the server stores the operand
        // little-endian, so these bytes land as given.
        MemoryOp::AtomicWrite { va, rkey, value } => (
            request::Repr::atomic_write(at(*va), key(rkey)?, u64::from_le_bytes(*value)),
            Kind::Other,
        ),
        MemoryOp::Flush { va, rkey, len, .. } => {
            (request::Repr::flush(at(*va), key(rkey)?, *len), Kind::Other)
        }
    })
}

/// The tag, status and value of a response frame's first 32 bytes.
fn parse_response_head(head: &[u8]) -> Option<(u64, Status, u64)> {
    let header = frame::Header::parse(head.get(..frame::HEADER_LEN)?).ok()?;
    let body = head.get(frame::HEADER_LEN..frame::HEADER_LEN + response::HEADER_LEN)?;
    let packet = response::Packet::new_unchecked(body);
    Some((header.tag, packet.status(), packet.value()))
}

/// The RDMA access error a device status stands for.
fn access_error(status: Status) -> AccessError {
    match status {
        Status::AccessDenied | Status::UnknownClient => AccessError::NotPermitted,
        Status::OutOfBounds | Status::Unmapped => AccessError::OutOfBounds,
        _ => AccessError::Failed,
    }
}

#[cfg(test)]
mod tests;
