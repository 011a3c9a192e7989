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
//! decides which ones RDMA carries (`forward::offload`): those come with
//! their work requests, which [`Uplinks::post`] posts as they are:
//!
//! | request | on the queue pair |
//! |---|---|
//! | READ | RDMA READ |
//! | WRITE | RDMA WRITE |
//! | WRITE_PERSIST | RDMA WRITE, then FLUSH (persistent) of its bytes, or a READ of its last byte where the server has no FLUSH (APM) |
//! | FLUSH | FLUSH (persistent), or a 1-byte READ (APM) |
//! | ATOMIC_WRITE | ATOMIC_WRITE (then FLUSH of its 8 bytes when persistent), where the server's RNIC executes it |
//!
//! The server never sees the 64-bit region key on this path, so the core
//! checks it: only a request whose key is the region key the link's server
//! gave in its MAP goes over RDMA (for a copy of a replicated region, the
//! key of the copy on that server: each copy has its own). Requests with
//! another key (per-extent keys of the allocator, or a wrong one) go to the
//! server on the control connection, which checks them; so do exactly-once
//! atomics (COMPARE_SWAP, FETCH_ADD), whose window the server keeps, and a
//! request RDMA would carry when the send queue is full.
//!
//! A replicated region's requests to a copy keep their order across the
//! queue pair and the control connection: the driver asks
//! [`Uplinks::room`] and waits for the other way to drain before changing
//! ways (`driver::copy_streams`).
//!
//! Each request's end ([`Uplinks::poll_completed`]: its tag, and a READ's
//! data or the failure) goes to the core, which answers it as the server's
//! response (`Forwarder::rdma_completed`). A queue pair with a failed
//! work request is in the error state and broken
//! ([`Uplinks::take_broken`]): its link is taken down and reconnected with
//! a new one. A refusal of the server's RNIC (a NAK) is that request's answer;
//! requests the transport lost (retries exhausted, or flushed by the error)
//! get none from here, so the core fails them when the link goes down and
//! the clients send them again elsewhere.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::Instant;

use proto::Message;
use proto::qp::{self, Connect, Endpoint, caps};
use proto::roce::Datagram;
use proto::roce::rc::{CompletionKind, Path, QpConfig, QueuePair, WcStatus, WorkRequest};

use crate::forward::{Offload, Step};
use crate::ids::LinkId;
pub use crate::link_tags::QP_CONNECT_TAG;
use crate::rdma::qp_numbering::{QPN_BASE, random_u32};

/// What became of a request offered to a queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Posting {
    /// Posted as work requests (or, from [`Uplinks::room`], there is
    /// room for them).
    Posted,
    /// RDMA would carry it, but the send queue is full now.
    Full,
    /// RDMA does not carry it (the core said so, or the link's queue pair
    /// is not up or broke): the server's CPU must.
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
    /// The link-level tag of the request (the core's answer goes by it).
    tag: u64,
    /// Work requests still to complete; the answer goes with the last.
    parts: u8,
    /// The first part is a READ, whose data comes with the answer.
    read: bool,
}

/// A posted request ended: its work requests completed, or one failed
/// with what the server's RNIC said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    /// The link whose queue pair carried it.
    pub link: LinkId,
    /// The request's link-level tag.
    pub tag: u64,
    /// The data of its first part when that is a READ (empty otherwise),
    /// or the status it failed with.
    pub outcome: Result<Vec<u8>, WcStatus>,
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

/// The requester queue pairs of every verbs link of the device.
#[derive(Debug, Default)]
pub struct Uplinks {
    links: HashMap<LinkId, Uplink>,
    by_qpn: HashMap<u32, LinkId>,
    next_qpn: u32,
    completed: Vec<Completed>,
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

    /// Posts `offload` (with `payload`, a WRITE's data) on `link`'s queue
    /// pair when it is up and has room: [`Posting::Full`] without room
    /// (the control connection takes it, or an ordered stream waits),
    /// [`Posting::NotCarried`] without a queue pair fit to carry it.
    pub fn post(&mut self, link: LinkId, offload: &Offload, payload: &[u8]) -> Posting {
        let posting = self.room(link, offload);
        if posting != Posting::Posted {
            return posting;
        }
        let Some(Uplink {
            state: State::Up(up),
            ..
        }) = self.links.get_mut(&link)
        else {
            return Posting::NotCarried;
        };
        let first = up.next_wr_id;
        for step in offload.steps() {
            let wr_id = up.next_wr_id;
            up.next_wr_id += 1;
            up.parts.insert(wr_id, first);
            if up
                .qp
                .post(WorkRequest::new(wr_id, step.work_op(payload)))
                .is_err()
            {
                // Checked for room above; a queue pair in the error state
                // refuses everything. Its link is about to go down, and
                // the core answers the request then.
                break;
            }
        }
        up.pending.insert(
            first,
            Pending {
                tag: offload.tag,
                parts: offload.parts() as u8,
                read: matches!(offload.first, Step::Read { .. }),
            },
        );
        self.counters.posted += 1;
        Posting::Posted
    }

    /// Counts a request for `link` that its control connection carries
    /// (when the link has a queue pair at all).
    pub fn sent_on_control(&mut self, link: LinkId) {
        if self.links.contains_key(&link) {
            self.counters.on_control += 1;
        }
    }

    /// Whether `link`'s queue pair could take `offload` now, without
    /// posting it: [`Posting::Posted`] when it could.
    pub fn room(&self, link: LinkId, offload: &Offload) -> Posting {
        let Some(Uplink {
            state: State::Up(up),
            ..
        }) = self.links.get(&link)
        else {
            return Posting::NotCarried;
        };
        if up.qp.in_error() {
            // Its link is about to reconnect; the server takes it meanwhile.
            Posting::NotCarried
        } else if up.qp.outstanding() + offload.parts() > up.qp.config().max_send_wr {
            Posting::Full
        } else {
            Posting::Posted
        }
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

    /// Turns `link`'s completions into ended requests.
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
            let outcome = match done.status {
                WcStatus::Success => Ok(data.unwrap_or_default()),
                status => Err(status),
            };
            self.completed.push(Completed {
                link,
                tag: pending.tag,
                outcome,
            });
        }
        if let Some(status) = broke {
            self.broken.push((link, status));
        }
    }

    /// The next request that ended, for the core to answer.
    pub fn poll_completed(&mut self) -> Option<Completed> {
        self.completed.pop()
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
