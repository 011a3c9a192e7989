//! The Reliable Connection transport, sans-IO: one [`QueuePair`] is a
//! requester and a responder state machine behind one QP number.
//!
//! Inputs are `handle_datagram(now, bytes)`, `post(work request)`,
//! `post_recv`, `handle_timeout(now)` and `complete_execution`; outputs are
//! read with `poll_transmit(now, buf)`, `poll_completion()`,
//! `poll_timeout()` and `poll_execution()`. Nothing here reads a clock or
//! touches a socket, so tests drive two queue pairs through a simulated
//! network on a virtual clock.
//!
//! What the responder does with memory is up to its owner: it asks for
//! [`memory::Execution`]s and takes their results back, at once
//! ([`QueuePair::execute_with`] over a [`memory::RemoteMemory`]) or later
//! (a request forwarded elsewhere).
//!
//! Not covered yet: shared receive queues, memory windows and key
//! invalidation (SEND with invalidate is taken as a plain SEND),
//! end-to-end credits (the responder advertises unlimited credits and the
//! requester ignores them), automatic path migration, and IPv6.

pub mod memory;
mod requester;
mod responder;
pub mod work;

use core::net::Ipv4Addr;
use std::time::{Duration, Instant};

pub use memory::{AccessError, BufferMemory, Execution, MemoryOp, MemoryReply, RemoteMemory};
pub use requester::PostError;
pub use work::{Completion, CompletionKind, RemoteAddr, WcStatus, WorkOp, WorkRequest};

use super::datagram::{self, Datagram, IpFields};
use super::{Error, bth, packet};
use requester::Requester;
use responder::{PostedRecv, Responder};

/// Path MTUs RC allows.
pub const PATH_MTUS: [usize; 5] = [256, 512, 1024, 2048, 4096];

/// Where a queue pair's packets go and come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Path {
    /// This end's IPv4 address.
    pub local_ip: Ipv4Addr,
    /// The peer's IPv4 address; datagrams from elsewhere are dropped.
    pub remote_ip: Ipv4Addr,
    /// UDP source port of the datagrams this end sends.
    pub src_port: u16,
    /// DSCP of the datagrams this end sends.
    pub dscp: u8,
    /// TTL of the datagrams this end sends.
    pub ttl: u8,
}

/// The attributes a queue pair is brought up with (what `ibv_modify_qp`
/// sets on the way to RTS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpConfig {
    /// This QP's number (24 bits).
    pub local_qpn: u32,
    /// The peer QP's number (24 bits).
    pub remote_qpn: u32,
    /// Addressing.
    pub path: Path,
    /// Path MTU: one of [`PATH_MTUS`].
    pub pmtu: usize,
    /// First PSN this QP sends (`sq_psn`).
    pub send_psn: super::Psn,
    /// First PSN this QP expects (`rq_psn`).
    pub recv_psn: super::Psn,
    /// Partition key.
    pub pkey: u16,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout; 0 waits forever.
    pub timeout: u8,
    /// Retransmissions without progress before RetryExceeded (0..=7).
    pub retry_cnt: u8,
    /// RNR NAKs without progress before RnrRetryExceeded (0..=7; 7 = without bound).
    pub rnr_retry: u8,
    /// RNR NAK timer code this responder asks for (see `aeth::rnr_delay`).
    pub min_rnr_timer: u8,
    /// READs and atomics this requester keeps outstanding.
    pub max_rd_atomic: u8,
    /// READs and atomics this responder remembers for duplicates.
    pub max_dest_rd_atomic: u8,
    /// Work requests the send queue holds.
    pub max_send_wr: usize,
    /// Receives the receive queue holds.
    pub max_recv_wr: usize,
}

impl QpConfig {
    /// Defaults in the range Linux stacks use: MTU 1024, timeout 14
    /// (67 ms), 7 retries, RNR retry without bound, 16 outstanding READs
    /// and atomics, 256 work requests per queue.
    pub fn new(local_qpn: u32, remote_qpn: u32, path: Path) -> Self {
        QpConfig {
            local_qpn,
            remote_qpn,
            path,
            pmtu: 1024,
            send_psn: super::Psn::new(0),
            recv_psn: super::Psn::new(0),
            pkey: bth::DEFAULT_PKEY,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            max_send_wr: 256,
            max_recv_wr: 256,
        }
    }

    /// The local ACK timeout; `None` when `timeout` is 0.
    pub fn ack_timeout(&self) -> Option<Duration> {
        (self.timeout != 0).then(|| Duration::from_nanos(4096 << u32::from(self.timeout.min(31))))
    }

    /// Checks the attributes.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !PATH_MTUS.contains(&self.pmtu) {
            return Err(ConfigError::Mtu(self.pmtu));
        }
        if self.local_qpn >> 24 != 0 || self.remote_qpn >> 24 != 0 {
            return Err(ConfigError::Qpn);
        }
        if self.retry_cnt > 7 || self.rnr_retry > 7 {
            return Err(ConfigError::Retry);
        }
        if self.max_send_wr == 0 || self.max_recv_wr == 0 {
            return Err(ConfigError::QueueDepth);
        }
        Ok(())
    }
}

/// A queue pair attribute out of range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Not an RC path MTU.
    #[error("path MTU {0} is not one of 256, 512, 1024, 2048, 4096")]
    Mtu(usize),
    /// A QP number wider than 24 bits.
    #[error("QP numbers are 24 bits")]
    Qpn,
    /// A retry count above 7.
    #[error("retry counts are 0..=7")]
    Retry,
    /// A queue of depth zero.
    #[error("queue depths must be at least 1")]
    QueueDepth,
}

/// Counters of one queue pair, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Datagrams sent.
    pub packets_sent: u64,
    /// Bytes of datagrams sent.
    pub bytes_sent: u64,
    /// Datagrams accepted.
    pub packets_received: u64,
    /// Bytes of datagrams accepted.
    pub bytes_received: u64,
    /// Datagrams dropped for a bad ICRC.
    pub icrc_errors: u64,
    /// Datagrams dropped as malformed (IP, UDP or transport layer).
    pub malformed: u64,
    /// Datagrams dropped for another QP or another source address.
    pub foreign: u64,
    /// Duplicate requests answered or dropped by the responder.
    pub duplicates: u64,
    /// Requests past the expected PSN (dropped by the responder).
    pub out_of_sequence: u64,
    /// PSN sequence error NAKs sent.
    pub naks_sent_sequence: u64,
    /// RNR NAKs sent.
    pub naks_sent_rnr: u64,
    /// Invalid request NAKs sent.
    pub naks_sent_invalid: u64,
    /// Remote access error NAKs sent.
    pub naks_sent_access: u64,
    /// Remote operational error NAKs sent.
    pub naks_sent_operational: u64,
    /// NAKs (of any kind) received by the requester.
    pub naks_received: u64,
    /// Go-back-N restarts by the requester.
    pub retransmissions: u64,
    /// Local ACK timeouts.
    pub timeouts: u64,
    /// Responses that answer nothing outstanding (late duplicates).
    pub stale_responses: u64,
}

impl Counters {
    /// Adds `other` to these counters (totals over several queue pairs).
    pub fn add(&mut self, other: &Counters) {
        let Counters {
            packets_sent,
            bytes_sent,
            packets_received,
            bytes_received,
            icrc_errors,
            malformed,
            foreign,
            duplicates,
            out_of_sequence,
            naks_sent_sequence,
            naks_sent_rnr,
            naks_sent_invalid,
            naks_sent_access,
            naks_sent_operational,
            naks_received,
            retransmissions,
            timeouts,
            stale_responses,
        } = other;
        self.packets_sent += packets_sent;
        self.bytes_sent += bytes_sent;
        self.packets_received += packets_received;
        self.bytes_received += bytes_received;
        self.icrc_errors += icrc_errors;
        self.malformed += malformed;
        self.foreign += foreign;
        self.duplicates += duplicates;
        self.out_of_sequence += out_of_sequence;
        self.naks_sent_sequence += naks_sent_sequence;
        self.naks_sent_rnr += naks_sent_rnr;
        self.naks_sent_invalid += naks_sent_invalid;
        self.naks_sent_access += naks_sent_access;
        self.naks_sent_operational += naks_sent_operational;
        self.naks_received += naks_received;
        self.retransmissions += retransmissions;
        self.timeouts += timeouts;
        self.stale_responses += stale_responses;
    }
}

/// Why a receive could not be posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("receive queue full")]
pub struct RecvQueueFull;

/// One RC queue pair.
#[derive(Debug)]
pub struct QueuePair {
    config: QpConfig,
    requester: Requester,
    responder: Responder,
    counters: Counters,
    /// Alternates between the two halves so neither starves the other.
    responder_turn: bool,
    /// IPv4 identification of the next datagram.
    ident: u16,
}

impl QueuePair {
    /// A queue pair in the ready-to-send state.
    pub fn new(config: QpConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(QueuePair {
            requester: Requester::new(&config),
            responder: Responder::new(&config),
            config,
            counters: Counters::default(),
            responder_turn: true,
            ident: 1,
        })
    }

    /// The attributes.
    pub fn config(&self) -> &QpConfig {
        &self.config
    }

    /// The counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Whether the QP is in the error state (either half failed).
    pub fn in_error(&self) -> bool {
        self.requester.in_error() || self.responder.in_error()
    }

    /// Work requests posted and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.requester.outstanding()
    }

    /// Posts a send-queue work request.
    pub fn post(&mut self, wr: WorkRequest) -> Result<(), PostError> {
        self.requester.post(wr)
    }

    /// Posts a receive for an incoming SEND of up to `max_len` bytes (or a WRITE with immediate).
    pub fn post_recv(&mut self, wr_id: u64, max_len: usize) -> Result<(), RecvQueueFull> {
        if self.responder.receives.len() >= self.config.max_recv_wr {
            return Err(RecvQueueFull);
        }
        self.responder
            .receives
            .push_back(PostedRecv { wr_id, max_len });
        Ok(())
    }

    /// Takes a received datagram (an IPv4 packet). Anything malformed, with
    /// a bad ICRC, for another QP or from another address is dropped and counted.
    pub fn handle_datagram(&mut self, now: Instant, bytes: &[u8]) {
        let checked = match Datagram::new_checked(bytes) {
            Ok(d) => d,
            Err(Error::BadIcrc { .. }) => {
                self.counters.icrc_errors += 1;
                return;
            }
            Err(_) => {
                self.counters.malformed += 1;
                return;
            }
        };
        self.handle_checked(now, &checked);
    }

    /// Takes a datagram the caller already checked (e.g. to find its QP by
    /// the BTH's destination QP): the same as [`QueuePair::handle_datagram`]
    /// without checking the ICRC again.
    pub fn handle_checked(&mut self, now: Instant, checked: &Datagram<'_>) {
        let Ok(repr) = packet::Repr::parse(&checked.transport) else {
            self.counters.malformed += 1;
            return;
        };
        if repr.bth.dest_qp != self.config.local_qpn || checked.ip.src != self.config.path.remote_ip
        {
            self.counters.foreign += 1;
            return;
        }
        self.counters.packets_received += 1;
        self.counters.bytes_received += checked.total_len as u64;
        if repr.bth.opcode.is_request() {
            self.responder.handle_request(&repr, &mut self.counters);
        } else {
            self.requester
                .handle_response(now, &repr, &mut self.counters);
        }
    }

    /// Fires the retransmission and RNR timers that are due.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.requester.handle_timeout(now, &mut self.counters);
    }

    /// When [`QueuePair::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.requester.poll_timeout()
    }

    /// Writes the next datagram to send into `buf` (cleared first); false when there is none.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> bool {
        let path = self.config.path;
        let ident = self.ident;
        let mut emit = |transport: &packet::Repr<'_>| {
            let repr = datagram::Repr {
                ip: IpFields {
                    src: path.local_ip,
                    dst: path.remote_ip,
                    dscp: path.dscp,
                    ecn: 0,
                    ident,
                    dont_frag: true,
                    ttl: path.ttl,
                },
                src_port: path.src_port,
                udp_checksum: false,
                transport: *transport,
            };
            buf.clear();
            buf.resize(repr.buffer_len(), 0);
            repr.emit(buf).is_ok()
        };
        let sent = if self.responder_turn {
            self.responder
                .poll_packet(&mut emit)
                .or_else(|| self.requester.poll_packet(now, &mut emit))
        } else {
            self.requester
                .poll_packet(now, &mut emit)
                .or_else(|| self.responder.poll_packet(&mut emit))
        };
        self.responder_turn = !self.responder_turn;
        match sent {
            Some(true) => {
                // Never 0: raw IP sockets replace an identification of 0,
                // which the ICRC covers.
                self.ident = self.ident.wrapping_add(1).max(1);
                self.counters.packets_sent += 1;
                self.counters.bytes_sent += buf.len() as u64;
                true
            }
            _ => false,
        }
    }

    /// The next completion: send-queue work requests in the order posted,
    /// receives in the order consumed.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.requester
            .completions
            .pop_front()
            .or_else(|| self.responder.completions.pop_front())
    }

    /// The next memory operation the responder needs done.
    pub fn poll_execution(&mut self) -> Option<Execution> {
        self.responder.poll_execution()
    }

    /// The result of an operation from [`QueuePair::poll_execution`].
    pub fn complete_execution(&mut self, ticket: u64, result: Result<MemoryReply, AccessError>) {
        self.responder
            .complete_execution(ticket, result, &mut self.counters);
    }

    /// Runs every pending memory operation against `memory` at once.
    pub fn execute_with(&mut self, memory: &mut impl RemoteMemory) {
        while let Some(e) = self.poll_execution() {
            let result = memory.execute(&e.op);
            self.complete_execution(e.ticket, result);
        }
    }

    /// Whether the responder waits for memory operations it handed out.
    pub fn has_pending_executions(&self) -> bool {
        self.responder.has_pending_executions()
    }
}

#[cfg(test)]
mod tests;
