//! The responder half of an RC queue pair: executes the peer's requests in
//! PSN order and answers them.
//!
//! - A request at the expected PSN is executed (through the memory side,
//!   see [`super::memory`]) and answered in order: READ responses cut to the
//!   path MTU, ATOMIC ACKs, ACKs where the requester asked for one (a run
//!   of ACKs not yet sent collapses into the newest). The packets of a
//!   WRITE are handed to memory as one operation at the end of the message,
//!   where an ACK is asked for, or every 64 KiB.
//! - A request past the expected PSN means some were lost: one PSN sequence
//!   error NAK, then silence until the expected PSN arrives.
//! - A request before the expected PSN is a duplicate: WRITE and SEND are
//!   ACKed again, up to the last PSN received unless that is a READ's or
//!   an atomic's (then up to the duplicate's); a READ is executed again from
//!   memory; an atomic, FLUSH or ATOMIC_WRITE is answered from the
//!   responder resource ring (sized by `max_dest_rd_atomic`) and never
//!   executed twice.
//! - A bad key, range or access gets a remote access error NAK; a malformed
//!   or out-of-sequence opcode an invalid request NAK; both stop the
//!   responder (the QP is in error). A SEND with no receive posted gets an
//!   RNR NAK.

use std::collections::VecDeque;

use super::memory::{AccessError, Execution, MemoryOp, MemoryReply};
use super::work::{Completion, CompletionKind, WcStatus};
use super::{Counters, QpConfig};
use crate::roce::aeth::{self, NakCode, Syndrome};
use crate::roce::packet::Repr;
use crate::roce::{Opcode, Psn, bth, feth, reth};

const MSN_MASK: u32 = 0xFF_FFFF;
/// Most bytes of a WRITE staged before they are handed to memory.
const WRITE_STAGE_LIMIT: usize = 64 * 1024;

/// What the responder sends for one slot of its in-order reply queue.
#[derive(Debug)]
enum Reply {
    /// Nothing (a WRITE packet that asked for no ACK).
    Nothing,
    /// An ACK, NAK or RNR NAK.
    Ack {
        psn: Psn,
        msn: u32,
        syndrome: Syndrome,
    },
    /// READ response packets (FLUSH and ATOMIC_WRITE: one, empty).
    /// `skip` packets of the original response come before `psn`: a READ
    /// asked again from its middle is answered with MIDDLE/LAST packets.
    Read {
        psn: Psn,
        msn: u32,
        data: Vec<u8>,
        skip: usize,
        sent: usize,
    },
    /// An ATOMIC ACK.
    Atomic { psn: Psn, msn: u32, original: u64 },
}

/// What to answer once a slot's memory operation is done.
#[derive(Debug, Clone, Copy)]
enum Then {
    /// ACK at `psn` if `ack` (the packet asked for one).
    Ack { psn: Psn, msn: u32, ack: bool },
    /// READ response starting at `psn`, `skip` packets into the original one.
    Read { psn: Psn, msn: u32, skip: usize },
    /// ATOMIC ACK; the result also goes into the resource at `psn`.
    Atomic { psn: Psn, msn: u32 },
    /// Empty READ response (FLUSH, ATOMIC_WRITE); completes the resource at `psn`.
    Placed { psn: Psn, msn: u32 },
}

#[derive(Debug)]
enum Slot {
    Waiting(Then),
    Ready(Reply),
}

/// A remembered READ, atomic, FLUSH or ATOMIC_WRITE, for answering duplicates.
#[derive(Debug, Clone, Copy)]
struct Resource {
    psn: Psn,
    span: u32,
    msn: u32,
    kind: ResourceKind,
}

#[derive(Debug, Clone, Copy)]
enum ResourceKind {
    Read,
    /// The original value once executed.
    Atomic(Option<u64>),
    /// FLUSH or ATOMIC_WRITE, and whether it was executed.
    Placed(bool),
}

/// The multi-packet message in progress.
#[derive(Debug)]
enum Inbound {
    Write {
        va: u64,
        rkey: u32,
        remaining: u64,
        recv: Option<u64>,
        /// Bytes received and not yet handed out, from `staged_va` on.
        staged: Vec<u8>,
        staged_va: u64,
    },
    Send {
        recv: PostedRecv,
        data: Vec<u8>,
    },
}

/// A receive posted for incoming SENDs.
#[derive(Debug, Clone, Copy)]
pub(super) struct PostedRecv {
    pub(super) wr_id: u64,
    pub(super) max_len: usize,
}

#[derive(Debug)]
pub(super) struct Responder {
    epsn: Psn,
    msn: u32,
    nak_sent: bool,
    error: bool,
    pmtu: usize,
    pkey: u16,
    dest_qp: u32,
    min_rnr_timer: u8,
    max_resources: usize,
    inbound: Option<Inbound>,
    resources: VecDeque<Resource>,
    pub(super) receives: VecDeque<PostedRecv>,
    /// Reply slots in PSN order; `first_slot` is the ticket of the front one.
    slots: VecDeque<Slot>,
    first_slot: u64,
    executions: VecDeque<Execution>,
    pub(super) completions: VecDeque<Completion>,
}

impl Responder {
    pub(super) fn new(config: &QpConfig) -> Self {
        Responder {
            epsn: config.recv_psn,
            msn: 0,
            nak_sent: false,
            error: false,
            pmtu: config.pmtu,
            pkey: config.pkey,
            dest_qp: config.remote_qpn,
            min_rnr_timer: config.min_rnr_timer,
            max_resources: usize::from(config.max_dest_rd_atomic.max(1)),
            inbound: None,
            resources: VecDeque::new(),
            receives: VecDeque::new(),
            slots: VecDeque::new(),
            first_slot: 0,
            executions: VecDeque::new(),
            completions: VecDeque::new(),
        }
    }

    pub(super) fn in_error(&self) -> bool {
        self.error
    }

    /// The next memory operation to execute.
    pub(super) fn poll_execution(&mut self) -> Option<Execution> {
        self.executions.pop_front()
    }

    /// Operations handed out whose results have not come back.
    pub(super) fn has_pending_executions(&self) -> bool {
        self.slots.iter().any(|s| matches!(s, Slot::Waiting(_)))
    }

    fn push_ready(&mut self, reply: Reply) {
        // Coalesce ACKs: of two ACKs not gone out yet, only the one further
        // along is sent (a duplicate's ACK can name an earlier PSN).
        if let (
            Reply::Ack {
                psn,
                syndrome: Syndrome::Ack { .. },
                ..
            },
            Some(Slot::Ready(Reply::Ack {
                psn: waiting,
                syndrome: Syndrome::Ack { .. },
                ..
            })),
        ) = (&reply, self.slots.back())
        {
            if psn.is_before(*waiting) {
                return;
            }
            self.slots.pop_back();
        }
        self.slots.push_back(Slot::Ready(reply));
    }

    fn push_execution(&mut self, op: MemoryOp, then: Then) {
        let ticket = self.first_slot + self.slots.len() as u64;
        self.slots.push_back(Slot::Waiting(then));
        self.executions.push_back(Execution { ticket, op });
    }

    fn ack(&self, psn: Psn) -> Reply {
        Reply::Ack {
            psn,
            msn: self.msn,
            syndrome: Syndrome::Ack {
                credits: aeth::UNLIMITED_CREDITS,
            },
        }
    }

    fn nak(&mut self, psn: Psn, code: NakCode, counters: &mut Counters) -> Reply {
        match code {
            NakCode::PsnSequenceError => counters.naks_sent_sequence += 1,
            NakCode::RemoteAccessError => counters.naks_sent_access += 1,
            NakCode::RemoteOperationalError => counters.naks_sent_operational += 1,
            _ => counters.naks_sent_invalid += 1,
        }
        Reply::Ack {
            psn,
            msn: self.msn,
            syndrome: Syndrome::Nak(code),
        }
    }

    /// Refuses the request at `psn` and stops: the QP is in error.
    fn fail(&mut self, psn: Psn, code: NakCode, counters: &mut Counters) {
        let nak = self.nak(psn, code, counters);
        self.push_ready(nak);
        self.error = true;
        self.inbound = None;
        self.executions.clear();
    }

    /// Takes the result of an execution back.
    pub(super) fn complete_execution(
        &mut self,
        ticket: u64,
        result: Result<MemoryReply, AccessError>,
        counters: &mut Counters,
    ) {
        let Some(index) = ticket
            .checked_sub(self.first_slot)
            .and_then(|i| usize::try_from(i).ok())
        else {
            return;
        };
        let Some(Slot::Waiting(then)) = self.slots.get(index) else {
            return;
        };
        let then = *then;
        let reply = match (then, result) {
            (_, Err(e)) => {
                let psn = match then {
                    Then::Ack { psn, .. }
                    | Then::Read { psn, .. }
                    | Then::Atomic { psn, .. }
                    | Then::Placed { psn, .. } => psn,
                };
                self.error = true;
                self.inbound = None;
                self.executions.clear();
                self.nak(psn, e.nak_code(), counters)
            }
            (Then::Ack { psn, msn, ack }, Ok(_)) => {
                if ack {
                    Reply::Ack {
                        psn,
                        msn,
                        syndrome: Syndrome::Ack {
                            credits: aeth::UNLIMITED_CREDITS,
                        },
                    }
                } else {
                    Reply::Nothing
                }
            }
            (Then::Read { psn, msn, skip }, Ok(MemoryReply::Read(data))) => Reply::Read {
                psn,
                msn,
                data,
                skip,
                sent: 0,
            },
            (Then::Atomic { psn, msn }, Ok(MemoryReply::Atomic(original))) => {
                if let Some(r) = self.resources.iter_mut().find(|r| r.psn == psn) {
                    r.kind = ResourceKind::Atomic(Some(original));
                }
                Reply::Atomic { psn, msn, original }
            }
            (Then::Placed { psn, msn }, Ok(_)) => {
                if let Some(r) = self.resources.iter_mut().find(|r| r.psn == psn) {
                    r.kind = ResourceKind::Placed(true);
                }
                Reply::Read {
                    psn,
                    msn,
                    data: Vec::new(),
                    skip: 0,
                    sent: 0,
                }
            }
            // A backend answered with the wrong kind of reply.
            (Then::Read { psn, .. } | Then::Atomic { psn, .. }, Ok(_)) => {
                self.error = true;
                self.nak(psn, NakCode::RemoteOperationalError, counters)
            }
        };
        self.slots[index] = Slot::Ready(reply);
    }

    fn remember(&mut self, resource: Resource) {
        if self.resources.len() == self.max_resources {
            self.resources.pop_front();
        }
        self.resources.push_back(resource);
    }

    /// Handles a request packet addressed to this QP.
    pub(super) fn handle_request(&mut self, packet: &Repr<'_>, counters: &mut Counters) {
        if self.error {
            return;
        }
        let psn = packet.bth.psn;
        if psn == self.epsn {
            self.nak_sent = false;
            self.in_order(packet, counters);
        } else if psn.is_before(self.epsn) {
            counters.duplicates += 1;
            self.duplicate(packet);
        } else {
            counters.out_of_sequence += 1;
            if !self.nak_sent {
                self.nak_sent = true;
                let nak = self.nak(self.epsn, NakCode::PsnSequenceError, counters);
                self.push_ready(nak);
            }
        }
    }

    fn duplicate(&mut self, packet: &Repr<'_>) {
        let psn = packet.bth.psn;
        let op = packet.bth.opcode;
        let found = self
            .resources
            .iter()
            .find(|r| psn.distance_from(r.psn) < r.span)
            .copied();
        match (op, found, packet.reth) {
            (Opcode::ReadRequest, Some(r), Some(reth)) if matches!(r.kind, ResourceKind::Read) => {
                let skip = psn.distance_from(r.psn) as usize;
                self.execute_read(reth, psn, r.msn, skip);
            }
            (Opcode::CompareSwap | Opcode::FetchAdd, Some(r), _) if r.psn == psn => {
                if let ResourceKind::Atomic(Some(original)) = r.kind {
                    self.push_ready(Reply::Atomic {
                        psn,
                        msn: r.msn,
                        original,
                    });
                }
            }
            (Opcode::Flush | Opcode::AtomicWrite, Some(r), _) if r.psn == psn => {
                if let ResourceKind::Placed(true) = r.kind {
                    self.push_ready(Reply::Read {
                        psn,
                        msn: r.msn,
                        data: Vec::new(),
                        skip: 0,
                        sent: 0,
                    });
                }
            }
            // A READ, atomic, FLUSH or ATOMIC_WRITE no resource remembers (or
            // one still executing) is dropped: the requester asks again.
            (
                Opcode::ReadRequest
                | Opcode::CompareSwap
                | Opcode::FetchAdd
                | Opcode::Flush
                | Opcode::AtomicWrite,
                _,
                _,
            ) => {}
            // WRITE and SEND: acknowledge again, up to the last PSN
            // received, as Linux rxe does; but when that PSN is a READ's
            // (or an atomic's, FLUSH's, ATOMIC_WRITE's), only up to the
            // duplicate's own. A requester such as rxe takes a plain ACK
            // naming a READ's PSN as the READ's completion, with no data
            // placed, and the READ it asked for again is answered only
            // after this ACK.
            _ => {
                // The newest resource is the last request received when
                // it ends where the expected PSN begins.
                let last_answered = self
                    .resources
                    .back()
                    .is_some_and(|r| r.psn.add(r.span) == self.epsn);
                let through = if last_answered { psn } else { self.epsn.sub(1) };
                let ack = self.ack(through);
                self.push_ready(ack);
            }
        }
    }

    fn complete_now(&mut self, then: Then, reply: MemoryReply) {
        let ticket = self.first_slot + self.slots.len() as u64;
        self.slots.push_back(Slot::Waiting(then));
        let mut scratch = Counters::default();
        self.complete_execution(ticket, Ok(reply), &mut scratch);
    }

    fn take_receive(&mut self) -> Option<PostedRecv> {
        self.receives.pop_front()
    }

    fn rnr_nak(&mut self, psn: Psn, counters: &mut Counters) {
        counters.naks_sent_rnr += 1;
        self.nak_sent = true;
        self.push_ready(Reply::Ack {
            psn,
            msn: self.msn,
            syndrome: Syndrome::RnrNak {
                timer: self.min_rnr_timer,
            },
        });
    }

    fn end_message(&mut self) {
        self.msn = (self.msn + 1) & MSN_MASK;
    }

    fn in_order(&mut self, packet: &Repr<'_>, counters: &mut Counters) {
        let op = packet.bth.opcode;
        let psn = packet.bth.psn;
        let continues = matches!(
            op,
            Opcode::WriteMiddle
                | Opcode::WriteLast
                | Opcode::WriteLastImm
                | Opcode::SendMiddle
                | Opcode::SendLast
                | Opcode::SendLastImm
                | Opcode::SendLastInv
        );
        let sequence_ok = match &self.inbound {
            Some(Inbound::Write { .. }) => {
                matches!(
                    op,
                    Opcode::WriteMiddle | Opcode::WriteLast | Opcode::WriteLastImm
                )
            }
            Some(Inbound::Send { .. }) => matches!(
                op,
                Opcode::SendMiddle | Opcode::SendLast | Opcode::SendLastImm | Opcode::SendLastInv
            ),
            None => !continues,
        };
        let payload = packet.payload.len();
        let full_packet = op.ends_message() || payload == self.pmtu;
        if !sequence_ok || !op.is_request() || payload > self.pmtu || !full_packet {
            self.fail(psn, NakCode::InvalidRequest, counters);
            return;
        }
        match op {
            Opcode::ReadRequest => self.read(packet, counters),
            Opcode::CompareSwap | Opcode::FetchAdd => self.atomic(packet),
            Opcode::Flush | Opcode::AtomicWrite => self.placed(packet, counters),
            Opcode::SendFirst
            | Opcode::SendOnly
            | Opcode::SendOnlyImm
            | Opcode::SendOnlyInv
            | Opcode::SendMiddle
            | Opcode::SendLast
            | Opcode::SendLastImm
            | Opcode::SendLastInv => self.send(packet, counters),
            _ => self.write(packet, counters),
        }
    }

    fn read(&mut self, packet: &Repr<'_>, counters: &mut Counters) {
        let psn = packet.bth.psn;
        let Some(reth) = packet.reth else {
            return self.fail(psn, NakCode::InvalidRequest, counters);
        };
        if reth.dma_len > i32::MAX as u32 {
            return self.fail(psn, NakCode::InvalidRequest, counters);
        }
        let span = (reth.dma_len as usize).div_ceil(self.pmtu).max(1) as u32;
        self.end_message();
        self.epsn = self.epsn.add(span);
        self.remember(Resource {
            psn,
            span,
            msn: self.msn,
            kind: ResourceKind::Read,
        });
        self.execute_read(reth, psn, self.msn, 0);
    }

    /// Reads what `reth` names for a READ response at `psn`, `skip` packets
    /// into the original response (a zero-length READ touches no memory).
    fn execute_read(&mut self, reth: reth::Repr, psn: Psn, msn: u32, skip: usize) {
        let then = Then::Read { psn, msn, skip };
        if reth.dma_len == 0 {
            self.complete_now(then, MemoryReply::Read(Vec::new()));
        } else {
            let op = MemoryOp::Read {
                va: reth.va,
                rkey: reth.rkey,
                len: reth.dma_len,
            };
            self.push_execution(op, then);
        }
    }

    fn atomic(&mut self, packet: &Repr<'_>) {
        let psn = packet.bth.psn;
        let Some(a) = packet.atomic_eth else { return };
        self.end_message();
        self.epsn = self.epsn.next();
        self.remember(Resource {
            psn,
            span: 1,
            msn: self.msn,
            kind: ResourceKind::Atomic(None),
        });
        let op = if packet.bth.opcode == Opcode::CompareSwap {
            MemoryOp::CompareSwap {
                va: a.va,
                rkey: a.rkey,
                compare: a.compare,
                swap: a.swap_add,
            }
        } else {
            MemoryOp::FetchAdd {
                va: a.va,
                rkey: a.rkey,
                add: a.swap_add,
            }
        };
        self.push_execution(op, Then::Atomic { psn, msn: self.msn });
    }

    fn placed(&mut self, packet: &Repr<'_>, counters: &mut Counters) {
        let psn = packet.bth.psn;
        let Some(reth) = packet.reth else { return };
        let op = match packet.bth.opcode {
            Opcode::Flush => {
                let feth = packet.feth.unwrap_or(feth::Repr {
                    placement: feth::PLACEMENT_PERSISTENT,
                    selectivity: feth::SELECT_RANGE,
                });
                MemoryOp::Flush {
                    va: reth.va,
                    rkey: reth.rkey,
                    len: reth.dma_len,
                    placement: feth.placement,
                    selectivity: feth.selectivity,
                }
            }
            _ => {
                let Ok(value) = <[u8; 8]>::try_from(packet.payload) else {
                    return self.fail(psn, NakCode::InvalidRequest, counters);
                };
                MemoryOp::AtomicWrite {
                    va: reth.va,
                    rkey: reth.rkey,
                    value,
                }
            }
        };
        self.end_message();
        self.epsn = self.epsn.next();
        self.remember(Resource {
            psn,
            span: 1,
            msn: self.msn,
            kind: ResourceKind::Placed(false),
        });
        self.push_execution(op, Then::Placed { psn, msn: self.msn });
    }

    fn write(&mut self, packet: &Repr<'_>, counters: &mut Counters) {
        let psn = packet.bth.psn;
        let op = packet.bth.opcode;
        let with_imm = matches!(op, Opcode::WriteOnlyImm | Opcode::WriteLastImm);
        let (va, rkey, remaining, recv, mut staged, staged_va) =
            match (self.inbound.take(), packet.reth) {
                (
                    Some(Inbound::Write {
                        va,
                        rkey,
                        remaining,
                        recv,
                        staged,
                        staged_va,
                    }),
                    _,
                ) => (va, rkey, remaining, recv, staged, staged_va),
                (_, Some(reth)) => (
                    reth.va,
                    reth.rkey,
                    u64::from(reth.dma_len),
                    None,
                    Vec::new(),
                    reth.va,
                ),
                _ => return self.fail(psn, NakCode::InvalidRequest, counters),
            };
        let len = packet.payload.len() as u64;
        let last = op.ends_message();
        if len > remaining || (last && len != remaining) {
            return self.fail(psn, NakCode::InvalidRequest, counters);
        }
        // WRITE with immediate consumes a receive: without one, RNR NAK and
        // wait for the retry (nothing of the message is kept).
        let recv = match (with_imm, recv) {
            (true, None) => match self.take_receive() {
                Some(r) => Some(r.wr_id),
                None => {
                    if packet.reth.is_none() {
                        self.fail(psn, NakCode::InvalidRequest, counters);
                    } else {
                        self.rnr_nak(psn, counters);
                    }
                    return;
                }
            },
            (_, recv) => recv,
        };
        self.epsn = self.epsn.next();
        staged.extend_from_slice(packet.payload);
        // Packets of one message are handed to memory together: at its end,
        // where the requester asks for an ACK, or every WRITE_STAGE_LIMIT bytes.
        let flush = last || packet.bth.ack_req || staged.len() >= WRITE_STAGE_LIMIT;
        let (data, next_staged) = if flush {
            (std::mem::take(&mut staged), va.wrapping_add(len))
        } else {
            (Vec::new(), staged_va)
        };
        if last {
            self.end_message();
            if let Some(wr_id) = recv {
                self.completions.push_back(Completion {
                    wr_id,
                    status: WcStatus::Success,
                    kind: CompletionKind::Recv {
                        data: Vec::new(),
                        imm: packet.immdt,
                    },
                });
            }
        } else {
            self.inbound = Some(Inbound::Write {
                va: va.wrapping_add(len),
                rkey,
                remaining: remaining - len,
                recv,
                staged,
                staged_va: next_staged,
            });
        }
        if !flush {
            return;
        }
        let then = Then::Ack {
            psn,
            msn: self.msn,
            ack: packet.bth.ack_req,
        };
        if data.is_empty() {
            self.complete_now(then, MemoryReply::Done);
        } else {
            let op = MemoryOp::Write {
                va: staged_va,
                rkey,
                data,
            };
            self.push_execution(op, then);
        }
    }

    fn send(&mut self, packet: &Repr<'_>, counters: &mut Counters) {
        let psn = packet.bth.psn;
        let op = packet.bth.opcode;
        let (recv, mut data) = match self.inbound.take() {
            Some(Inbound::Send { recv, data }) => (recv, data),
            _ => match self.take_receive() {
                Some(recv) => (recv, Vec::new()),
                None => return self.rnr_nak(psn, counters),
            },
        };
        if data.len() + packet.payload.len() > recv.max_len {
            return self.fail(psn, NakCode::InvalidRequest, counters);
        }
        data.extend_from_slice(packet.payload);
        self.epsn = self.epsn.next();
        if op.ends_message() {
            self.end_message();
            self.completions.push_back(Completion {
                wr_id: recv.wr_id,
                status: WcStatus::Success,
                kind: CompletionKind::Recv {
                    data,
                    imm: packet.immdt,
                },
            });
        } else {
            self.inbound = Some(Inbound::Send { recv, data });
        }
        if packet.bth.ack_req {
            let ack = self.ack(psn);
            self.push_ready(ack);
        }
    }

    /// Emits the next reply packet through `emit`, if one is ready.
    pub(super) fn poll_packet<R>(&mut self, emit: impl FnOnce(&Repr<'_>) -> R) -> Option<R> {
        loop {
            match self.slots.front_mut()? {
                Slot::Waiting(_) => return None,
                Slot::Ready(Reply::Nothing) => {
                    self.slots.pop_front();
                    self.first_slot += 1;
                }
                Slot::Ready(reply) => {
                    let (out, done) =
                        reply_packet(reply, self.pmtu, self.pkey, self.dest_qp, emit)?;
                    if done {
                        self.slots.pop_front();
                        self.first_slot += 1;
                    }
                    return Some(out);
                }
            }
        }
    }
}

fn bth_for(opcode: Opcode, psn: Psn, pkey: u16, dest_qp: u32) -> bth::Repr {
    bth::Repr {
        opcode,
        solicited: false,
        migration: false,
        pkey,
        dest_qp,
        ack_req: false,
        psn,
    }
}

/// Builds the next packet of `reply` and whether the reply is finished;
/// `None` for [`Reply::Nothing`].
fn reply_packet<R>(
    reply: &mut Reply,
    pmtu: usize,
    pkey: u16,
    dest_qp: u32,
    emit: impl FnOnce(&Repr<'_>) -> R,
) -> Option<(R, bool)> {
    let credits = Syndrome::Ack {
        credits: aeth::UNLIMITED_CREDITS,
    };
    match reply {
        Reply::Nothing => None,
        Reply::Ack { psn, msn, syndrome } => {
            let repr = Repr {
                aeth: Some(aeth::Repr {
                    syndrome: *syndrome,
                    msn: *msn,
                }),
                ..Repr::new(bth_for(Opcode::Acknowledge, *psn, pkey, dest_qp))
            };
            Some((emit(&repr), true))
        }
        Reply::Atomic { psn, msn, original } => {
            let repr = Repr {
                aeth: Some(aeth::Repr {
                    syndrome: credits,
                    msn: *msn,
                }),
                atomic_ack: Some(*original),
                ..Repr::new(bth_for(Opcode::AtomicAcknowledge, *psn, pkey, dest_qp))
            };
            Some((emit(&repr), true))
        }
        Reply::Read {
            psn,
            msn,
            data,
            skip,
            sent,
        } => {
            let total = data.len().div_ceil(pmtu).max(1);
            let index = *sent;
            let opcode = match (*skip + index, *skip + total) {
                (0, 1) => Opcode::ReadResponseOnly,
                (0, _) => Opcode::ReadResponseFirst,
                (i, n) if i + 1 == n => Opcode::ReadResponseLast,
                _ => Opcode::ReadResponseMiddle,
            };
            let start = (index * pmtu).min(data.len());
            let end = (start + pmtu).min(data.len());
            let with_aeth = opcode != Opcode::ReadResponseMiddle;
            let repr = Repr {
                aeth: with_aeth.then_some(aeth::Repr {
                    syndrome: credits,
                    msn: *msn,
                }),
                payload: &data[start..end],
                ..Repr::new(bth_for(opcode, psn.add(index as u32), pkey, dest_qp))
            };
            let out = emit(&repr);
            *sent += 1;
            Some((out, *sent == total))
        }
    }
}
