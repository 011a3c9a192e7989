//! The device as an RC requester toward PMEM servers on verbs.
//!
//! A link to a `verbs` server NIC keeps its TCP control connection (HELLO,
//! MAP, and what RDMA cannot carry) and gains one RC queue pair (sans-IO,
//! from `proto::roce::rc`) to the server's RNIC, set up with QP_CONNECT on
//! that connection. The server answers QP_ACCEPT with its end, an R_Key per
//! region it registered (at I/O address 0, so a region offset is the
//! remote address) and what its queue pair can do ([`caps`]).
//!
//! The forwarding core still routes, checks and times every request, and
//! still writes a request frame for the link; [`Uplinks::try_post`] turns
//! the ones RDMA can carry into work requests instead of sending them:
//!
//! | request | on the queue pair |
//! |---|---|
//! | READ | RDMA READ |
//! | WRITE | RDMA WRITE |
//! | WRITE_PERSIST | RDMA WRITE, then FLUSH (persistent) of its bytes, or a READ of its last byte where the server has no FLUSH (APM) |
//! | FLUSH | FLUSH (persistent), or a 1-byte READ (APM) |
//! | ATOMIC_WRITE | ATOMIC_WRITE (then FLUSH of its 8 bytes when persistent), where the server's RNIC executes it |
//!
//! The server never sees the 64-bit region key on this path, so the device
//! checks it: only a request whose key is the region key the link's server
//! gave in its MAP goes over RDMA (for a copy of a replicated region, the
//! key of the copy on that server: each copy has its own). Requests with another key (per-extent keys
//! of the allocator, or a wrong one) go to the server on the control
//! connection, which checks them; so do exactly-once atomics
//! (COMPARE_SWAP, FETCH_ADD), whose window the server keeps.
//!
//! A replicated region's requests to a copy keep their order across the
//! queue pair and the control connection: the driver asks
//! [`Uplinks::would_carry`] and waits for the other way to drain before
//! changing ways (`driver::copy_streams`).
//!
//! Each completion becomes the response frame the server would have sent
//! ([`Uplinks::poll_answer`]), which the core relays as usual. A queue
//! pair with a failed work request is in the error state and broken
//! ([`Uplinks::take_broken`]): its link is taken down and reconnected with a
//! new one. A refusal of the server's RNIC (a NAK) is that request's answer;
//! requests the transport lost (retries exhausted, or flushed by the error)
//! get none from here, so the core fails them when the link goes down and
//! the clients send them again elsewhere.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::Instant;

use proto::qp::{self, Connect, Endpoint, caps};
use proto::request::{self, Operation, flags};
use proto::response::Repr as ResponseRepr;
use proto::roce::Datagram;
use proto::roce::rc::{
    Completion, CompletionKind, Path, QpConfig, QueuePair, RemoteAddr, WcStatus, WorkOp,
    WorkRequest,
};
use proto::{AccessKey, Message, RegionIndex, Status, frame};

use crate::ids::LinkId;
pub use crate::link_tags::QP_CONNECT_TAG;
use crate::rdma::qp_numbering::{QPN_BASE, random_u32};

/// What became of a request offered to a queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Posting {
    /// Posted as work requests (or, from [`Uplinks::would_carry`], it
    /// would be).
    Posted,
    /// RDMA would carry it, but the send queue is full now.
    Full,
    /// RDMA does not carry it (no queue pair up, another key, an
    /// exactly-once atomic, ...): the server's CPU must.
    NotCarried,
}

/// Counters of the queue pairs toward servers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UplinkCounters {
    /// Requests carried as RDMA work requests.
    pub posted: u64,
    /// Requests left to the control connection (atomics, other keys, no
    /// queue pair yet).
    pub on_control: u64,
    /// Queue pairs that broke (a transport error).
    pub broken: u64,
    /// Queue pairs up now.
    pub up: u64,
}

/// What a posted request waits for.
#[derive(Debug, Clone, Copy)]
struct Pending {
    /// The link-level tag of the request (the response echoes it).
    tag: u64,
    /// The request's operation (the response's kind follows from it).
    operation: Operation,
    /// Work requests still to complete; the answer goes with the last.
    parts: u8,
    /// The first part's data, for a READ.
    read: bool,
}

#[derive(Debug)]
enum State {
    /// QP_CONNECT sent with this end; QP_ACCEPT awaited.
    Connecting { local: Endpoint },
    /// The queue pair is up.
    Up(Box<Up>),
}

#[derive(Debug)]
struct Up {
    qp: QueuePair,
    rkeys: HashMap<u32, u32>,
    caps: u64,
    /// By wr_id: the request a work request belongs to (its first part's
    /// wr_id).
    parts: HashMap<u64, u64>,
    pending: HashMap<u64, Pending>,
    next_wr_id: u64,
}

#[derive(Debug)]
struct Uplink {
    /// The RoCE port (index) its datagrams use.
    port: usize,
    state: State,
}

/// Whether requests of a pool laid out as `layout` may go to verbs servers
/// as one-sided RDMA. Not in a pool with an allocator: there an extent
/// opens only with its own key and the allocator's records change only by
/// their owners, and both are checked by the server's CPU, while its RNIC
/// knows one key per region. Such a pool's requests go over the link's
/// control connection, where the server checks them as on TCP.
pub fn one_sided(layout: &topology::Layout) -> bool {
    layout.meta().is_none()
}

/// The requester queue pairs of every verbs link of the device.
#[derive(Debug, Default)]
pub struct Uplinks {
    links: HashMap<LinkId, Uplink>,
    by_qpn: HashMap<u32, LinkId>,
    next_qpn: u32,
    /// Each region's key as the link's server gave it (the core's copy,
    /// kept in step by the driver) and its length, by link and region: the
    /// copies of a replicated region have one index and a key per server.
    regions: HashMap<(LinkId, u32), (AccessKey, u64)>,
    answers: Vec<(LinkId, Vec<u8>)>,
    broken: Vec<(LinkId, WcStatus)>,
    counters: UplinkCounters,
}

impl Uplinks {
    /// No queue pairs yet.
    pub fn new() -> Self {
        Uplinks {
            next_qpn: QPN_BASE,
            ..Self::default()
        }
    }

    /// The counters.
    pub fn counters(&self) -> UplinkCounters {
        UplinkCounters {
            up: self
                .links
                .values()
                .filter(|u| matches!(u.state, State::Up(_)))
                .count() as u64,
            ..self.counters
        }
    }

    /// Whether `link` has a queue pair (up or being set up).
    pub fn has(&self, link: LinkId) -> bool {
        self.links.contains_key(&link)
    }

    /// Records the key requests for `region` on `link` must carry to go
    /// over RDMA (the key of the copy on the link's server), and the
    /// region's length.
    pub fn set_region(&mut self, link: LinkId, region: RegionIndex, key: AccessKey, len: u64) {
        self.regions.insert((link, region.0), (key, len));
    }

    /// Requests posted on `link`'s queue pair and not completed yet.
    pub fn in_flight(&self, link: LinkId) -> usize {
        match self.links.get(&link) {
            Some(Uplink {
                state: State::Up(up),
                ..
            }) => up.pending.len(),
            _ => 0,
        }
    }

    /// Starts a queue pair for `link` from RoCE port `port` (address `ip`,
    /// path MTU `mtu`) while the device runs map epoch `epoch` (0: it
    /// follows none): returns the QP_CONNECT frame to send on the link. The
    /// frame says the epoch, so a server that fenced queue pairs at a newer
    /// one (a takeover) refuses it STALE_MAP.
    pub fn start(
        &mut self,
        link: LinkId,
        port: usize,
        ip: Ipv4Addr,
        mtu: u16,
        epoch: u64,
    ) -> Vec<u8> {
        self.close(link);
        let qpn = self.fresh_qpn();
        let local = Endpoint {
            qpn,
            psn: random_u32() & 0xFF_FFFF,
            ip,
            mtu,
        };
        self.links.insert(
            link,
            Uplink {
                port,
                state: State::Connecting { local },
            },
        );
        self.by_qpn.insert(qpn, link);
        let connect = Connect {
            endpoint: local,
            atomics: None,
            epoch: (epoch > 0).then_some(epoch),
        };
        Message::QpConnect(connect)
            .encode_to_vec(QP_CONNECT_TAG)
            .unwrap_or_default()
    }

    fn fresh_qpn(&mut self) -> u32 {
        loop {
            let qpn = self.next_qpn;
            self.next_qpn = if qpn >= 0xFF_FFFF { QPN_BASE } else { qpn + 1 };
            if !self.by_qpn.contains_key(&qpn) {
                return qpn;
            }
        }
    }

    /// The server's QP_ACCEPT for `link`: brings the queue pair up.
    pub fn accepted(&mut self, link: LinkId, accept: &qp::Accept<'_>) -> Result<(), String> {
        let Some(uplink) = self.links.get_mut(&link) else {
            return Err("no queue pair is being set up on this link".into());
        };
        let State::Connecting { local } = uplink.state else {
            return Err("QP_ACCEPT for a queue pair already up".into());
        };
        let remote = accept.endpoint;
        let mut config = QpConfig::new(
            local.qpn,
            remote.qpn,
            Path {
                local_ip: local.ip,
                remote_ip: remote.ip,
                src_port: 0xC000 | (local.qpn as u16 & 0x3FFF),
                dscp: 0,
                ttl: 64,
            },
        );
        config.pmtu = usize::from(local.mtu.min(remote.mtu));
        config.send_psn = proto::roce::Psn::new(local.psn);
        config.recv_psn = proto::roce::Psn::new(remote.psn);
        let qp = QueuePair::new(config).map_err(|e| format!("queue pair attributes: {e}"))?;
        uplink.state = State::Up(Box::new(Up {
            qp,
            rkeys: accept.rkeys().collect(),
            caps: accept.caps(),
            parts: HashMap::new(),
            pending: HashMap::new(),
            next_wr_id: 1,
        }));
        Ok(())
    }

    /// Forgets `link`'s queue pair (its link went down); what it had posted
    /// is answered by the core's own failure handling.
    pub fn close(&mut self, link: LinkId) {
        if let Some(uplink) = self.links.remove(&link) {
            let qpn = match &uplink.state {
                State::Connecting { local } => local.qpn,
                State::Up(up) => up.qp.config().local_qpn,
            };
            self.by_qpn.remove(&qpn);
        }
    }

    /// Posts the request the core wrote for `link` (`head`: frame and
    /// request header, `payload`: write data) as work requests, if the
    /// link's queue pair is up and RDMA can carry it; false leaves it to
    /// the control connection.
    pub fn try_post(&mut self, link: LinkId, head: &[u8], payload: &[u8]) -> bool {
        if self.links.is_empty() {
            // No server on verbs: the common case costs one branch.
            return false;
        }
        let posted = self.post(link, head, payload) == Posting::Posted;
        if posted {
            self.counters.posted += 1;
        } else {
            self.sent_on_control(link);
        }
        posted
    }

    /// Posts the request as [`Uplinks::try_post`] does, saying why not when
    /// it does not: with a full send queue ([`Posting::Full`]) a request
    /// that must keep its place in an ordered stream waits rather than take
    /// the control connection. Nothing is counted for a request not posted.
    pub fn post_or_say(&mut self, link: LinkId, head: &[u8], payload: &[u8]) -> Posting {
        if self.links.is_empty() {
            return Posting::NotCarried;
        }
        let posting = self.post(link, head, payload);
        if posting == Posting::Posted {
            self.counters.posted += 1;
        }
        posting
    }

    /// Counts a request for `link` that its control connection carries
    /// (when the link has a queue pair at all).
    pub fn sent_on_control(&mut self, link: LinkId) {
        if self.links.contains_key(&link) {
            self.counters.on_control += 1;
        }
    }

    /// Whether `link`'s queue pair would carry this request now, without
    /// posting it: [`Posting::Posted`] when it would.
    pub fn would_carry(&self, link: LinkId, head: &[u8], payload: &[u8]) -> Posting {
        let Some(Uplink {
            state: State::Up(up),
            ..
        }) = self.links.get(&link)
        else {
            return Posting::NotCarried;
        };
        match self.work_for(link, up, head, payload) {
            Ok((_, ops)) if up.qp.outstanding() + ops.len() > up.qp.config().max_send_wr => {
                Posting::Full
            }
            Ok(_) => Posting::Posted,
            Err(()) => Posting::NotCarried,
        }
    }

    fn post(&mut self, link: LinkId, head: &[u8], payload: &[u8]) -> Posting {
        let Some(Uplink {
            state: State::Up(up),
            ..
        }) = self.links.get(&link)
        else {
            return Posting::NotCarried;
        };
        let Ok((req, ops)) = self.work_for(link, up, head, payload) else {
            return Posting::NotCarried;
        };
        let Some(Uplink {
            state: State::Up(up),
            ..
        }) = self.links.get_mut(&link)
        else {
            return Posting::NotCarried;
        };
        if up.qp.outstanding() + ops.len() > up.qp.config().max_send_wr {
            // The send queue is full: the control connection takes it, or
            // an ordered stream waits.
            return Posting::Full;
        }
        let first = up.next_wr_id;
        let parts = ops.len() as u8;
        for op in ops {
            let wr_id = up.next_wr_id;
            up.next_wr_id += 1;
            up.parts.insert(wr_id, first);
            if up.qp.post(WorkRequest::new(wr_id, op)).is_err() {
                // Checked for room above; a queue pair in the error state
                // refuses everything. Its link is about to go down, and
                // the core answers the request then.
                break;
            }
        }
        up.pending.insert(
            first,
            Pending {
                tag: req.tag,
                operation: req.operation,
                parts,
                read: req.operation == Operation::Read,
            },
        );
        Posting::Posted
    }

    /// The work requests that carry the request the core wrote for `link`
    /// on its queue pair `up`, or `Err` when RDMA cannot carry it.
    fn work_for(
        &self,
        link: LinkId,
        up: &Up,
        head: &[u8],
        payload: &[u8],
    ) -> Result<(ForwardedRequest, Vec<WorkOp>), ()> {
        if up.qp.in_error() {
            // Its link is about to reconnect; the server takes it meanwhile.
            return Err(());
        }
        let req = ForwardedRequest::parse(head).ok_or(())?;
        if req.flags & (flags::EXACTLY_ONCE | flags::REGION_ADDRESSED) != flags::REGION_ADDRESSED {
            return Err(());
        }
        // Only what the server's RNIC will take goes to it: a NAK would put
        // the queue pair in the error state and reconnect the link under
        // every other client's requests on it. The server answers the rest
        // on the control connection.
        let &(key, region_len) = self.regions.get(&(link, req.region)).ok_or(())?;
        let len = u64::from(req.operation.span_len(req.length));
        let fits = req
            .offset
            .checked_add(len)
            .is_some_and(|end| end <= region_len);
        let aligned = !req.operation.is_atomic() || req.offset.is_multiple_of(8);
        if key != req.key || key.is_none() || !fits || !aligned {
            return Err(());
        }
        let &rkey = up.rkeys.get(&req.region).ok_or(())?;
        let remote = RemoteAddr {
            va: req.offset,
            rkey,
        };
        let flush = up.caps & caps::FLUSH_PERSISTENT != 0;
        // How to make `len` bytes at `remote` durable after what precedes.
        let persist = |len: u32| -> WorkOp {
            if flush {
                WorkOp::persist(remote, len.max(1))
            } else {
                // APM: a READ is answered only once the writes before it on
                // this queue pair are placed.
                WorkOp::Read {
                    remote: RemoteAddr {
                        va: req.offset + u64::from(len.max(1)) - 1,
                        rkey,
                    },
                    len: 1,
                }
            }
        };
        let persistent = req.flags & flags::PERSIST != 0;
        let ops: Vec<WorkOp> = match req.operation {
            Operation::Read => vec![WorkOp::Read {
                remote,
                len: req.length,
            }],
            Operation::Write | Operation::WritePersist if payload.len() != req.length as usize => {
                return Err(());
            }
            Operation::Write if !persistent => vec![WorkOp::Write {
                remote,
                data: payload.to_vec(),
                imm: None,
            }],
            Operation::Write | Operation::WritePersist => vec![
                WorkOp::Write {
                    remote,
                    data: payload.to_vec(),
                    imm: None,
                },
                persist(req.length),
            ],
            Operation::Flush => vec![persist(req.length)],
            Operation::AtomicWrite if up.caps & caps::ATOMIC_WRITE != 0 => {
                let store = WorkOp::AtomicWrite {
                    remote,
                    value: req.operand.to_le_bytes(),
                };
                if persistent {
                    vec![store, persist(8)]
                } else {
                    vec![store]
                }
            }
            _ => return Err(()),
        };
        Ok((req, ops))
    }

    /// Whether datagrams for `qpn` belong here.
    pub fn owns(&self, qpn: u32) -> bool {
        self.by_qpn.contains_key(&qpn)
    }

    /// A datagram for one of the queue pairs.
    pub fn handle_datagram(&mut self, now: Instant, checked: &Datagram<'_>) {
        let qpn = checked.transport.bth().dest_qp();
        let Some(link) = self.by_qpn.get(&qpn).copied() else {
            return;
        };
        if let Some(Uplink {
            state: State::Up(up),
            ..
        }) = self.links.get_mut(&link)
        {
            up.qp.handle_checked(now, checked);
            self.reap(link);
        }
    }

    /// Turns `link`'s completions into answers.
    fn reap(&mut self, link: LinkId) {
        let Some(Uplink {
            state: State::Up(up),
            ..
        }) = self.links.get_mut(&link)
        else {
            return;
        };
        let mut broke = None;
        while let Some(done) = up.qp.poll_completion() {
            let Some(first) = up.parts.remove(&done.wr_id) else {
                continue;
            };
            let Some(pending) = up.pending.get_mut(&first) else {
                continue;
            };
            pending.parts -= 1;
            let failed = done.status != WcStatus::Success;
            // A READ's data comes with its own (first) part.
            let data = match (&done.kind, pending.read, done.wr_id == first) {
                (CompletionKind::Read(data), true, true) => Some(data.clone()),
                _ => None,
            };
            if pending.parts > 0 && !failed {
                continue;
            }
            let Some(pending) = up.pending.remove(&first) else {
                continue;
            };
            if failed {
                // Parts still posted complete flushed, with no one waiting.
                up.parts.retain(|_, f| *f != first);
                // An RC queue pair that saw an error is in the error state:
                // its link must reconnect with a new one. The server's own
                // refusal is its answer; a request the transport lost is
                // answered by the core when the link goes down, as one
                // the client may send again elsewhere.
                broke.get_or_insert(done.status);
                if !matches!(
                    done.status,
                    WcStatus::RemoteAccessError
                        | WcStatus::RemoteInvalidRequest
                        | WcStatus::RemoteOperationalError
                ) {
                    continue;
                }
            }
            self.answers
                .push((link, answer(&pending, &done, data.as_deref())));
        }
        if let Some(status) = broke {
            self.broken.push((link, status));
        }
    }

    /// The next response frame for a link, as its server would have sent it.
    pub fn poll_answer(&mut self) -> Option<(LinkId, Vec<u8>)> {
        self.answers.pop()
    }

    /// Links whose queue pair broke since the last call, with why.
    pub fn take_broken(&mut self) -> Vec<(LinkId, WcStatus)> {
        let broken = std::mem::take(&mut self.broken);
        self.counters.broken += broken.len() as u64;
        broken
    }

    /// Writes the next datagram a queue pair of RoCE port `port` has to
    /// send into `buf`.
    pub fn poll_transmit(&mut self, port: usize, now: Instant, buf: &mut Vec<u8>) -> bool {
        // The caller drains every queue pair in one turn, so none waits
        // behind another for long.
        for uplink in self.links.values_mut().filter(|u| u.port == port) {
            if let State::Up(up) = &mut uplink.state
                && up.qp.poll_transmit(now, buf)
            {
                if up.caps & caps::RXE_FLUSH_ICRC != 0 {
                    rxe_flush_icrc(buf);
                }
                return true;
            }
        }
        false
    }

    /// The earliest timer of any queue pair.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.links
            .values()
            .filter_map(|u| match &u.state {
                State::Up(up) => up.qp.poll_timeout(),
                State::Connecting { .. } => None,
            })
            .min()
    }

    /// Fires the timers that are due (retransmissions, retry limits).
    pub fn handle_timeout(&mut self, now: Instant) {
        let due: Vec<LinkId> = self
            .links
            .iter_mut()
            .filter_map(|(link, u)| match &mut u.state {
                State::Up(up) if up.qp.poll_timeout().is_some_and(|t| t <= now) => {
                    up.qp.handle_timeout(now);
                    Some(*link)
                }
                _ => None,
            })
            .collect();
        for link in due {
            self.reap(link);
        }
    }
}

/// The fields of a forwarded request the queue pair needs.
#[derive(Debug, Clone, Copy)]
struct ForwardedRequest {
    tag: u64,
    operation: Operation,
    flags: u8,
    region: u32,
    offset: u64,
    key: AccessKey,
    length: u32,
    operand: u64,
}

impl ForwardedRequest {
    /// Reads a frame header and request header the core wrote.
    fn parse(head: &[u8]) -> Option<Self> {
        let header = frame::Header::parse(head).ok()?;
        let operation = Operation::from_opcode(header.opcode)?;
        let body = request::Packet::new_checked(head.get(frame::HEADER_LEN..)?).ok()?;
        Some(ForwardedRequest {
            tag: header.tag,
            operation,
            flags: body.flags(),
            region: body.region(),
            offset: body.addr(),
            key: AccessKey(body.key()),
            length: body.length(),
            operand: body.operand(),
        })
    }
}

/// The response frame the server would have sent for `pending`, given the
/// completion that ends it.
fn answer(pending: &Pending, done: &Completion, data: Option<&[u8]>) -> Vec<u8> {
    let opcode = pending.operation.opcode();
    let repr = match done.status {
        WcStatus::Success => match data {
            Some(data) => ResponseRepr::read_data(data),
            None => ResponseRepr::ack(Status::Ok),
        },
        WcStatus::RemoteAccessError => ResponseRepr::error(opcode, Status::OutOfBounds),
        WcStatus::RemoteInvalidRequest => ResponseRepr::error(opcode, Status::BadRequest),
        _ => ResponseRepr::error(opcode, Status::IoError),
    };
    Message::Response(repr)
        .encode_to_vec(pending.tag)
        .unwrap_or_default()
}

/// Gives a FLUSH datagram (IPv4, as the queue pair emits it) the ICRC
/// Linux rxe expects ([`proto::roce::icrc::ipv4_rxe_flush`]).
fn rxe_flush_icrc(datagram: &mut [u8]) {
    const IP: usize = 20;
    const BTH_AT: usize = IP + 8;
    let len = datagram.len();
    if len < BTH_AT + 12 + 4 || datagram[BTH_AT] != u8::from(proto::roce::Opcode::Flush) {
        return;
    }
    if let Some(crc) = proto::roce::icrc::ipv4_rxe_flush(&datagram[..len - 4], IP) {
        datagram[len - 4..].copy_from_slice(&crc.to_le_bytes());
    }
}

#[cfg(test)]
mod tests;
