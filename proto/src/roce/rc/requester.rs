//! The requester half of an RC queue pair: turns work requests into
//! packets, retransmits what the responder did not acknowledge, and
//! completes every work request exactly once, in the order posted.
//!
//! - Each work request takes consecutive PSNs: one per packet of a WRITE
//!   or SEND (payload cut to the path MTU), one per READ response packet,
//!   one for an atomic, FLUSH or ATOMIC_WRITE.
//! - ACKs are cumulative. A READ response or ATOMIC ACK also acknowledges
//!   everything before it; an ACK past a READ or atomic still unanswered
//!   means its response was lost (an implied NAK).
//! - Loss is repaired go-back-N: on a PSN sequence error NAK, on a gap in
//!   READ responses, on an implied NAK and on the local ACK timeout
//!   (4.096 µs × 2^timeout), sending restarts at the first PSN not
//!   acknowledged. A READ answered in part is asked again for the rest.
//! - `retry_cnt` bounds timeouts without progress, `rnr_retry` RNR NAKs
//!   (7 = without bound); past them the work request completes with
//!   RetryExceeded / RnrRetryExceeded and the QP goes to the error state,
//!   where every other work request completes as Flushed.
//! - At most `max_rd_atomic` READs and atomics are outstanding at once.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::work::{Completion, CompletionKind, WcStatus, WorkOp, WorkRequest};
use super::{Counters, QpConfig};
use crate::roce::aeth::{self, NakCode, Syndrome};
use crate::roce::packet::Repr;
use crate::roce::{Opcode, Psn, atomic_eth, bth, feth, reth};

/// Request an ACK at least every this many packets of a long message.
const ACK_EVERY: u32 = 16;
/// The most PSNs in flight: far inside the 2^23 that PSN comparison allows.
const MAX_PSNS_IN_FLIGHT: u32 = 1 << 16;
/// `rnr_retry` value that means "retry without bound".
const RNR_RETRY_FOREVER: u8 = 7;

#[derive(Debug)]
struct SendWqe {
    wr_id: u64,
    op: WorkOp,
    fence: bool,
    first_psn: Psn,
    /// PSNs the request takes.
    span: u32,
    /// Request packets sent in the current pass.
    sent: u32,
    /// PSNs acknowledged (WRITE, SEND) or answered (READ responses received).
    done_psns: u32,
    read_data: Vec<u8>,
}

impl SendWqe {
    fn expects_response(&self) -> bool {
        matches!(
            self.op,
            WorkOp::Read { .. }
                | WorkOp::CompareSwap { .. }
                | WorkOp::FetchAdd { .. }
                | WorkOp::AtomicWrite { .. }
                | WorkOp::Flush { .. }
        )
    }

    /// Packets this request puts on the wire per pass.
    fn request_packets(&self) -> u32 {
        match self.op {
            WorkOp::Write { .. } | WorkOp::Send { .. } => self.span,
            _ => 1,
        }
    }

    fn contains(&self, psn: Psn) -> bool {
        psn.distance_from(self.first_psn) < self.span
    }

    fn last_psn(&self) -> Psn {
        self.first_psn.add(self.span - 1)
    }

    fn completion(self, status: WcStatus, original: Option<u64>) -> Completion {
        let ok = status == WcStatus::Success;
        let kind = match self.op {
            WorkOp::Read { .. } => {
                CompletionKind::Read(if ok { self.read_data } else { Vec::new() })
            }
            WorkOp::Write { .. } => CompletionKind::Write,
            WorkOp::Send { .. } => CompletionKind::Send,
            WorkOp::CompareSwap { .. } | WorkOp::FetchAdd { .. } => {
                CompletionKind::Atomic(original.unwrap_or(0))
            }
            WorkOp::AtomicWrite { .. } => CompletionKind::AtomicWrite,
            WorkOp::Flush { .. } => CompletionKind::Flush,
        };
        Completion {
            wr_id: self.wr_id,
            status,
            kind,
        }
    }
}

/// Why a work request was refused at `post`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// A message longer than RC allows (2^31 bytes).
    #[error("message of {0} bytes is longer than 2^31")]
    TooLong(u64),
    /// The send queue holds `max_send_wr` requests already.
    #[error("send queue full")]
    QueueFull,
}

#[derive(Debug)]
pub(super) struct Requester {
    sq: VecDeque<SendWqe>,
    /// PSN of the next posted request.
    next_psn: Psn,
    /// One past the highest PSN transmitted (answers beyond it are bogus).
    high_psn: Psn,
    pmtu: u32,
    pkey: u16,
    dest_qp: u32,
    timeout: Option<Duration>,
    retry_cnt: u8,
    retry_left: u8,
    rnr_retry: u8,
    rnr_left: u8,
    max_rd_atomic: usize,
    max_send_wr: usize,
    deadline: Option<Instant>,
    rnr_until: Option<Instant>,
    /// A go-back-N to this PSN is under way; repeats of the same signal are ignored.
    recovering_from: Option<Psn>,
    error: bool,
    pub(super) completions: VecDeque<Completion>,
}

impl Requester {
    pub(super) fn new(config: &QpConfig) -> Self {
        Requester {
            sq: VecDeque::new(),
            next_psn: config.send_psn,
            high_psn: config.send_psn,
            pmtu: config.pmtu as u32,
            pkey: config.pkey,
            dest_qp: config.remote_qpn,
            timeout: config.ack_timeout(),
            retry_cnt: config.retry_cnt,
            retry_left: config.retry_cnt,
            rnr_retry: config.rnr_retry,
            rnr_left: config.rnr_retry,
            max_rd_atomic: usize::from(config.max_rd_atomic.max(1)),
            max_send_wr: config.max_send_wr,
            deadline: None,
            rnr_until: None,
            recovering_from: None,
            error: false,
            completions: VecDeque::new(),
        }
    }

    pub(super) fn in_error(&self) -> bool {
        self.error
    }

    /// Work requests posted and not completed.
    pub(super) fn outstanding(&self) -> usize {
        self.sq.len()
    }

    pub(super) fn post(&mut self, wr: WorkRequest) -> Result<(), PostError> {
        if self.sq.len() >= self.max_send_wr {
            return Err(PostError::QueueFull);
        }
        let len: u64 = match &wr.op {
            WorkOp::Read { len, .. } => u64::from(*len),
            WorkOp::Write { data, .. } | WorkOp::Send { data, .. } => data.len() as u64,
            _ => 0,
        };
        if len > 1 << 31 {
            return Err(PostError::TooLong(len));
        }
        let span = match wr.op {
            WorkOp::Read { .. } | WorkOp::Write { .. } | WorkOp::Send { .. } => {
                len.div_ceil(u64::from(self.pmtu)).max(1) as u32
            }
            _ => 1,
        };
        let wqe = SendWqe {
            wr_id: wr.wr_id,
            op: wr.op,
            fence: wr.fence,
            first_psn: self.next_psn,
            span,
            sent: 0,
            done_psns: 0,
            read_data: Vec::new(),
        };
        if self.error {
            self.completions
                .push_back(wqe.completion(WcStatus::Flushed, None));
            return Ok(());
        }
        self.next_psn = self.next_psn.add(span);
        self.sq.push_back(wqe);
        Ok(())
    }

    /// The oldest PSN not yet acknowledged, if any request is outstanding.
    fn unacked(&self) -> Option<Psn> {
        self.sq.front().map(|w| w.first_psn.add(w.done_psns))
    }

    fn anything_sent(&self) -> bool {
        self.sq.iter().any(|w| w.sent > 0)
    }

    fn arm(&mut self, now: Instant) {
        self.deadline = match self.timeout {
            Some(t) if self.anything_sent() => Some(now + t),
            _ => None,
        };
    }

    fn progress(&mut self, now: Instant) {
        self.retry_left = self.retry_cnt;
        self.rnr_left = self.rnr_retry;
        self.recovering_from = None;
        self.arm(now);
    }

    /// Restarts sending at `psn`.
    fn go_back(&mut self, psn: Psn, counters: &mut Counters) {
        if self.recovering_from == Some(psn) {
            return;
        }
        self.recovering_from = Some(psn);
        counters.retransmissions += 1;
        let mut found = false;
        for w in &mut self.sq {
            if found {
                w.sent = 0;
            } else if w.contains(psn) {
                found = true;
                w.sent = match w.op {
                    WorkOp::Write { .. } | WorkOp::Send { .. } => {
                        psn.distance_from(w.first_psn).max(w.done_psns)
                    }
                    _ => 0,
                };
            }
        }
    }

    /// Whether `psn` lies in what has been sent (valid for an answer).
    fn answerable(&self, psn: Psn) -> bool {
        match self.unacked() {
            Some(una) => psn.is_before(self.high_psn) && !psn.is_before(una.sub(1)),
            None => false,
        }
    }

    /// Everything up to and including `psn` is acknowledged.
    fn ack_through(&mut self, psn: Psn, now: Instant, counters: &mut Counters) {
        let mut progressed = false;
        while let Some(w) = self.sq.front_mut() {
            if psn.is_before(w.first_psn) {
                break;
            }
            if w.expects_response() {
                // Its answer must come first: an ACK beyond it means the answer was lost.
                let missing = w.first_psn.add(w.done_psns);
                self.go_back(missing, counters);
                break;
            }
            if psn.is_before(w.last_psn()) {
                let acked = psn.distance_from(w.first_psn) + 1;
                if acked > w.done_psns {
                    // Packets acknowledged need no resending, even after a go-back-N.
                    w.done_psns = acked;
                    w.sent = w.sent.max(acked);
                    progressed = true;
                }
                break;
            }
            if let Some(w) = self.sq.pop_front() {
                self.completions
                    .push_back(w.completion(WcStatus::Success, None));
                progressed = true;
            }
        }
        if progressed {
            self.progress(now);
        }
    }

    /// Ends the QP: the head request with `status`, the others as flushed.
    fn fail(&mut self, status: WcStatus) {
        self.error = true;
        self.deadline = None;
        self.rnr_until = None;
        if let Some(w) = self.sq.pop_front() {
            self.completions.push_back(w.completion(status, None));
        }
        while let Some(w) = self.sq.pop_front() {
            self.completions
                .push_back(w.completion(WcStatus::Flushed, None));
        }
    }

    /// Handles a response packet (ACK, NAK, READ response, ATOMIC ACK).
    pub(super) fn handle_response(
        &mut self,
        now: Instant,
        packet: &Repr<'_>,
        counters: &mut Counters,
    ) {
        if self.error {
            return;
        }
        let psn = packet.bth.psn;
        if !self.answerable(psn) {
            counters.stale_responses += 1;
            return;
        }
        match (packet.bth.opcode, packet.aeth) {
            (Opcode::Acknowledge, Some(aeth)) => self.acknowledge(now, psn, aeth, counters),
            (Opcode::AtomicAcknowledge, Some(_)) => {
                let original = packet.atomic_ack.unwrap_or(0);
                self.ack_through(psn.sub(1), now, counters);
                self.complete_head_at(psn, Some(original), now);
            }
            (
                Opcode::ReadResponseFirst
                | Opcode::ReadResponseMiddle
                | Opcode::ReadResponseLast
                | Opcode::ReadResponseOnly,
                _,
            ) => self.read_response(now, packet, counters),
            _ => counters.stale_responses += 1,
        }
    }

    fn acknowledge(&mut self, now: Instant, psn: Psn, aeth: aeth::Repr, counters: &mut Counters) {
        match aeth.syndrome {
            Syndrome::Ack { .. } => self.ack_through(psn, now, counters),
            Syndrome::Nak(NakCode::PsnSequenceError) => {
                counters.naks_received += 1;
                self.ack_through(psn.sub(1), now, counters);
                self.go_back(psn, counters);
            }
            Syndrome::RnrNak { timer } => {
                counters.naks_received += 1;
                self.ack_through(psn.sub(1), now, counters);
                if self.rnr_retry != RNR_RETRY_FOREVER {
                    if self.rnr_left == 0 {
                        return self.fail(WcStatus::RnrRetryExceeded);
                    }
                    self.rnr_left -= 1;
                }
                self.rnr_until = Some(now + aeth::rnr_delay(timer));
                self.deadline = None;
                self.recovering_from = None;
                self.go_back(psn, counters);
            }
            Syndrome::Nak(code) => {
                counters.naks_received += 1;
                self.ack_through(psn.sub(1), now, counters);
                self.fail(match code {
                    NakCode::RemoteAccessError => WcStatus::RemoteAccessError,
                    NakCode::RemoteOperationalError => WcStatus::RemoteOperationalError,
                    _ => WcStatus::RemoteInvalidRequest,
                });
            }
            Syndrome::Reserved(_) => counters.stale_responses += 1,
        }
    }

    /// Completes the head request, an atomic / FLUSH / ATOMIC_WRITE at `psn`.
    fn complete_head_at(&mut self, psn: Psn, original: Option<u64>, now: Instant) {
        let at_head = self
            .sq
            .front()
            .is_some_and(|w| w.first_psn == psn && w.expects_response() && w.span == 1);
        if at_head && let Some(w) = self.sq.pop_front() {
            self.completions
                .push_back(w.completion(WcStatus::Success, original));
            self.progress(now);
        }
    }

    fn read_response(&mut self, now: Instant, packet: &Repr<'_>, counters: &mut Counters) {
        let psn = packet.bth.psn;
        // Everything before the request this answers is acknowledged.
        let Some(index) = self.sq.iter().position(|w| w.contains(psn)) else {
            return;
        };
        let first = self.sq[index].first_psn;
        self.ack_through(first.sub(1), now, counters);
        let Some(w) = self.sq.front_mut() else { return };
        if w.first_psn != first {
            return;
        }
        match w.op {
            WorkOp::Read { len, .. } => {
                let expected = w.first_psn.add(w.done_psns);
                if psn != expected {
                    if expected.is_before(psn) {
                        self.go_back(expected, counters);
                    }
                    return;
                }
                let end = packet.bth.opcode.ends_message();
                let room = len as usize - w.read_data.len();
                let full = packet.payload.len() == self.pmtu as usize;
                let fits = packet.payload.len() <= room && (end || full);
                if !fits {
                    return self.fail(WcStatus::RemoteInvalidRequest);
                }
                w.read_data.extend_from_slice(packet.payload);
                w.done_psns += 1;
                if w.done_psns == w.span {
                    self.complete_head_at_read(now);
                } else {
                    self.progress(now);
                }
            }
            WorkOp::Flush { .. } | WorkOp::AtomicWrite { .. } => {
                self.complete_head_at(psn, None, now);
            }
            _ => {}
        }
    }

    fn complete_head_at_read(&mut self, now: Instant) {
        if let Some(w) = self.sq.pop_front() {
            self.completions
                .push_back(w.completion(WcStatus::Success, None));
            self.progress(now);
        }
    }

    pub(super) fn handle_timeout(&mut self, now: Instant, counters: &mut Counters) {
        if self.rnr_until.is_some_and(|t| t <= now) {
            self.rnr_until = None;
        }
        if self.error || self.deadline.is_none_or(|t| t > now) {
            return;
        }
        self.deadline = None;
        counters.timeouts += 1;
        if self.retry_left == 0 {
            return self.fail(WcStatus::RetryExceeded);
        }
        self.retry_left -= 1;
        if let Some(una) = self.unacked() {
            self.recovering_from = None;
            self.go_back(una, counters);
        }
    }

    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        match (self.deadline, self.rnr_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Emits the next request packet through `emit`, if one may go now.
    pub(super) fn poll_packet<R>(
        &mut self,
        now: Instant,
        emit: impl FnOnce(&Repr<'_>) -> R,
    ) -> Option<R> {
        if self.error || self.rnr_until.is_some_and(|t| t > now) {
            return None;
        }
        let una = self.unacked()?;
        let mut reads_out = 0;
        let mut index = None;
        for (i, w) in self.sq.iter().enumerate() {
            if w.sent < w.request_packets() {
                index = Some(i);
                break;
            }
            if w.expects_response() {
                reads_out += 1;
            }
        }
        let i = index?;
        let w = &self.sq[i];
        let starting = w.sent == 0;
        if starting && w.expects_response() && reads_out >= self.max_rd_atomic {
            return None;
        }
        if starting && w.fence && reads_out > 0 {
            return None;
        }
        let psn = match w.op {
            WorkOp::Read { .. } => w.first_psn.add(w.done_psns),
            _ => w.first_psn.add(w.sent),
        };
        if psn.distance_from(una) >= MAX_PSNS_IN_FLIGHT {
            return None;
        }
        let out = request_packet(w, psn, self.pmtu, self.pkey, self.dest_qp, emit);
        let end = psn.add(match w.op {
            WorkOp::Read { .. } => w.span - w.done_psns,
            _ => 1,
        });
        if self.high_psn.is_before(end) {
            self.high_psn = end;
        }
        self.sq[i].sent += 1;
        if self.deadline.is_none() {
            self.arm(now);
        }
        Some(out)
    }
}

/// Builds the request packet of `w` at `psn`.
fn request_packet<R>(
    w: &SendWqe,
    psn: Psn,
    pmtu: u32,
    pkey: u16,
    dest_qp: u32,
    emit: impl FnOnce(&Repr<'_>) -> R,
) -> R {
    let bth = |opcode, ack_req| bth::Repr {
        opcode,
        solicited: false,
        migration: false,
        pkey,
        dest_qp,
        ack_req,
        psn,
    };
    match &w.op {
        WorkOp::Write { data, imm, .. } | WorkOp::Send { data, imm } => {
            let k = psn.distance_from(w.first_psn);
            let (first, last) = (k == 0, k + 1 == w.span);
            let remote = match &w.op {
                WorkOp::Write { remote, .. } => Some(remote),
                _ => None,
            };
            let opcode = message_opcode(remote.is_some(), first, last, imm.is_some());
            let repr = Repr {
                reth: remote.filter(|_| first).map(|r| reth::Repr {
                    va: r.va,
                    rkey: r.rkey,
                    dma_len: data.len() as u32,
                }),
                immdt: if last { *imm } else { None },
                payload: segment(data, k, pmtu),
                ..Repr::new(bth(opcode, last || (k + 1).is_multiple_of(ACK_EVERY)))
            };
            emit(&repr)
        }
        WorkOp::Read { remote, len } => {
            let done = (w.done_psns * pmtu).min(*len);
            let repr = Repr {
                reth: Some(reth::Repr {
                    va: remote.va.wrapping_add(u64::from(done)),
                    rkey: remote.rkey,
                    dma_len: len - done,
                }),
                ..Repr::new(bth(Opcode::ReadRequest, true))
            };
            emit(&repr)
        }
        WorkOp::CompareSwap {
            remote,
            compare,
            swap,
        } => emit(&Repr {
            atomic_eth: Some(atomic_eth::Repr {
                va: remote.va,
                rkey: remote.rkey,
                swap_add: *swap,
                compare: *compare,
            }),
            ..Repr::new(bth(Opcode::CompareSwap, true))
        }),
        WorkOp::FetchAdd { remote, add } => emit(&Repr {
            atomic_eth: Some(atomic_eth::Repr {
                va: remote.va,
                rkey: remote.rkey,
                swap_add: *add,
                compare: 0,
            }),
            ..Repr::new(bth(Opcode::FetchAdd, true))
        }),
        WorkOp::AtomicWrite { remote, value } => emit(&Repr {
            reth: Some(reth::Repr {
                va: remote.va,
                rkey: remote.rkey,
                dma_len: 8,
            }),
            payload: value,
            ..Repr::new(bth(Opcode::AtomicWrite, true))
        }),
        WorkOp::Flush {
            remote,
            len,
            placement,
        } => emit(&Repr {
            feth: Some(feth::Repr {
                placement: *placement,
                selectivity: feth::SELECT_RANGE,
            }),
            reth: Some(reth::Repr {
                va: remote.va,
                rkey: remote.rkey,
                dma_len: *len,
            }),
            ..Repr::new(bth(Opcode::Flush, true))
        }),
    }
}

/// The opcode of one packet of a WRITE (`write`) or SEND message.
fn message_opcode(write: bool, first: bool, last: bool, imm: bool) -> Opcode {
    match (write, first, last, imm) {
        (true, true, true, false) => Opcode::WriteOnly,
        (true, true, true, true) => Opcode::WriteOnlyImm,
        (true, true, false, _) => Opcode::WriteFirst,
        (true, false, true, false) => Opcode::WriteLast,
        (true, false, true, true) => Opcode::WriteLastImm,
        (true, false, false, _) => Opcode::WriteMiddle,
        (false, true, true, false) => Opcode::SendOnly,
        (false, true, true, true) => Opcode::SendOnlyImm,
        (false, true, false, _) => Opcode::SendFirst,
        (false, false, true, false) => Opcode::SendLast,
        (false, false, true, true) => Opcode::SendLastImm,
        (false, false, false, _) => Opcode::SendMiddle,
    }
}

/// The `k`-th path-MTU segment of a message.
fn segment(data: &[u8], k: u32, pmtu: u32) -> &[u8] {
    let start = (k as usize * pmtu as usize).min(data.len());
    let end = (start + pmtu as usize).min(data.len());
    &data[start..end]
}
