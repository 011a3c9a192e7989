//! [`VerbsQp`]: an RC queue pair to a fabric device on a real RNIC, with
//! blocking READ / WRITE / FETCH_ADD / COMPARE_SWAP / ATOMIC_WRITE and a
//! pipelined `post_*` / [`VerbsQp::poll`] pair.
//!
//! The queue pair is an extended one (`ibv_create_qp_ex`), asked for
//! ATOMIC_WRITE too; where the RNIC or its provider refuses that, it is made
//! without it and [`VerbsQp::has_atomic_write`] says so. sideway has no call
//! for ATOMIC_WRITE, so that one work request is built through the
//! provider's `wr_atomic_write` entry of `ibv_qp_ex` (rdma-core 43 and
//! later).

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proto::qp::{AtomicSeq, Connect, Endpoint};
use proto::request::ExactlyOnce;
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::completion::{
    BasicCompletionQueue, PollCompletionQueueError, WorkCompletionStatus,
};
use sideway::ibverbs::device_context::DeviceContext;
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    ExtendedQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairState, QueuePairType,
    SendOperationFlags, SetScatterGatherEntry, WorkRequestFlags,
};

use rdma_mummy_sys::ibv_qp_ex;

use super::buffer::{DmaBuffer, place};
use super::control::Control;
use super::error::VerbsError;
use rnic::PortInfo;
use rnic::rc::RcAttrs;

/// Knobs of a [`VerbsQp`]; [`Default`] suits rxe and RNICs alike.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerbsOptions {
    /// The RNIC port (rxe has only port 1).
    pub port: u8,
    /// Bytes of the registered local buffer: bounds one READ/WRITE and
    /// what a pipelined batch may have in flight.
    pub buffer_len: usize,
    /// Work requests the send queue holds.
    pub queue_depth: u32,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout.
    pub ack_timeout: u8,
    /// Retransmissions before RETRY_EXC_ERR (0..=7).
    pub retry_cnt: u8,
    /// RNR retries (7 = without bound).
    pub rnr_retry: u8,
    /// How long a blocking operation (or [`VerbsQp::poll`]) waits.
    pub op_timeout: Duration,
    /// Have the device number this queue pair's atomics for exactly-once
    /// execution on this lane, starting here ([`VerbsQp::next_atomic`]).
    pub atomics: Option<AtomicSeq>,
    /// The map epoch the client runs (0: it follows none), said in
    /// QP_CONNECT to a device that takes it: the queue pair runs that
    /// epoch, and the device refuses its requests once it runs a newer one.
    pub map_epoch: u64,
}

impl Default for VerbsOptions {
    fn default() -> Self {
        VerbsOptions {
            port: 1,
            buffer_len: 1 << 20,
            queue_depth: 64,
            ack_timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            op_timeout: Duration::from_secs(10),
            atomics: None,
            map_epoch: 0,
        }
    }
}

/// What a work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// RDMA READ.
    Read,
    /// RDMA WRITE.
    Write,
    /// ATOMIC FETCH_ADD.
    FetchAdd,
    /// ATOMIC COMPARE_SWAP.
    CompareSwap,
    /// ATOMIC_WRITE of 8 bytes.
    AtomicWrite,
}

impl Op {
    /// The operation's name.
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "RDMA READ",
            Op::Write => "RDMA WRITE",
            Op::FetchAdd => "FETCH_ADD",
            Op::CompareSwap => "COMPARE_SWAP",
            Op::AtomicWrite => "ATOMIC_WRITE",
        }
    }
}

/// A completed work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// Its id, as `post_*` returned it.
    pub wr_id: u64,
    /// What it did.
    pub op: Op,
    /// Its status.
    pub status: WorkCompletionStatus,
    /// The provider's detail for an error status.
    pub vendor_err: u32,
    /// READ: the data (empty on error).
    pub data: Vec<u8>,
    /// Atomics: the old value (0 on error).
    pub value: u64,
}

impl Completion {
    /// The completion, or its error status as a [`VerbsError`].
    pub fn check(self) -> Result<Completion, VerbsError> {
        if self.status == WorkCompletionStatus::Success {
            Ok(self)
        } else {
            Err(VerbsError::Completion {
                op: self.op.name(),
                wr_id: self.wr_id,
                status: self.status,
                vendor_err: self.vendor_err,
            })
        }
    }
}

/// A work request with its parameters.
#[derive(Debug, Clone, Copy)]
enum Work {
    Read,
    Write,
    FetchAdd { add: u64 },
    CompareSwap { compare: u64, swap: u64 },
    AtomicWrite { value: [u8; 8] },
}

impl Work {
    fn op(self) -> Op {
        match self {
            Work::Read => Op::Read,
            Work::Write => Op::Write,
            Work::FetchAdd { .. } => Op::FetchAdd,
            Work::CompareSwap { .. } => Op::CompareSwap,
            Work::AtomicWrite { .. } => Op::AtomicWrite,
        }
    }
}

/// A posted work request and its buffer slot.
#[derive(Debug)]
struct InFlight {
    wr_id: u64,
    op: Op,
    at: usize,
    len: usize,
}

/// An RC queue pair to a fabric device, set up over its control
/// connection; remote addresses are PMEM addresses of the pool, keyed by
/// the R_Key the device gave for the region.
///
/// Resources go in reverse order of creation: the fields drop in
/// declaration order (QP, MR, CQ, PD, device context, then the buffer),
/// and sideway's Arcs keep each parent alive while a child needs it.
#[derive(Debug)]
pub struct VerbsQp {
    qp: ExtendedQueuePair,
    /// The queue pair was made with ATOMIC_WRITE among its operations.
    atomic_write: bool,
    mr: Arc<MemoryRegion>,
    cq: Arc<BasicCompletionQueue>,
    _pd: Arc<ProtectionDomain>,
    _ctx: Arc<DeviceContext>,
    /// Last: the RNIC may write into it until the QP is destroyed.
    buffer: DmaBuffer,
    rkeys: HashMap<u32, u32>,
    local: Endpoint,
    remote: Endpoint,
    device: String,
    port: PortInfo,
    options: VerbsOptions,
    next_wr_id: u64,
    /// The lane and number of the next atomic posted.
    atomics: Option<AtomicSeq>,
    head: usize,
    in_flight: VecDeque<InFlight>,
    done: VecDeque<Completion>,
}

impl VerbsQp {
    /// Sets up a queue pair with the device on `control` (which must stay
    /// open while the queue pair is used), on RDMA device `device` (or the
    /// first), from local RoCEv2 address `local_ip`.
    pub fn connect(
        control: &mut Control,
        device: Option<&str>,
        local_ip: Ipv4Addr,
    ) -> Result<VerbsQp, VerbsError> {
        Self::connect_with(control, device, local_ip, VerbsOptions::default())
    }

    /// [`VerbsQp::connect`] with explicit options.
    pub fn connect_with(
        control: &mut Control,
        device: Option<&str>,
        local_ip: Ipv4Addr,
        options: VerbsOptions,
    ) -> Result<VerbsQp, VerbsError> {
        let (ctx, name) = rnic::open(device)?;
        let port = rnic::port_info(&ctx, &name, options.port, local_ip)?;
        let pd = ctx.alloc_pd().map_err(rnic::RnicError::AllocPd)?;
        let depth = options.queue_depth.max(1);
        let cq = ctx
            .create_cq_builder()
            .setup_cqe(depth * 2)
            .build()
            .map_err(rnic::RnicError::CreateCq)?;
        let buffer =
            DmaBuffer::new(options.buffer_len).ok_or(VerbsError::Buffer(options.buffer_len))?;
        // SAFETY: the buffer is a live allocation of `buffer.len()` bytes and
        // outlives the MR: `VerbsQp` drops `mr` (and `qp`) before `buffer`.
        let mr = unsafe { pd.reg_mr(buffer.addr(), buffer.len(), AccessFlags::LocalWrite) }
            .map_err(|source| VerbsError::RegMr {
                len: buffer.len(),
                source,
            })?;
        let mut builder = pd.create_qp_builder();
        builder
            .setup_qp_type(QueuePairType::ReliableConnection)
            .setup_max_send_wr(depth)
            .setup_max_recv_wr(1)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .setup_send_cq(Arc::clone(&cq))
            .setup_recv_cq(Arc::clone(&cq));
        let basic = SendOperationFlags::Write
            | SendOperationFlags::Read
            | SendOperationFlags::AtomicFetchAndAdd
            | SendOperationFlags::AtomicCompareAndSwap;
        let (mut qp, atomic_write) = match builder
            .setup_send_ops_flags(basic | SendOperationFlags::AtomicWrite)
            .build_ex()
        {
            Ok(qp) => (qp, true),
            Err(_) => (
                builder
                    .setup_send_ops_flags(basic)
                    .build_ex()
                    .map_err(rnic::RnicError::CreateQp)?,
                false,
            ),
        };

        let local = Endpoint {
            qpn: qp.qp_number(),
            psn: rnic::rc::random_psn(),
            ip: local_ip,
            mtu: rnic::mtu_bytes(port.active_mtu),
        };
        let accept = control
            .qp_connect(Connect {
                endpoint: local,
                atomics: options.atomics,
                epoch: control.epoch_to_say(options.map_epoch),
            })
            .map_err(VerbsError::Control)?;
        let remote = accept.endpoint;
        let path_mtu = rnic::rc::path_mtu(remote.mtu, &port)?;
        let attrs = RcAttrs {
            port: options.port,
            access: AccessFlags::LocalWrite,
            path_mtu,
            max_dest_rd_atomic: 1,
            ack_timeout: options.ack_timeout,
            retry_cnt: options.retry_cnt,
            rnr_retry: options.rnr_retry,
        };
        rnic::rc::connect(&mut qp, &port, &attrs, local.psn, &remote)?;

        Ok(VerbsQp {
            qp,
            atomic_write,
            mr,
            cq,
            _pd: pd,
            _ctx: ctx,
            buffer,
            rkeys: accept.rkeys,
            local: Endpoint {
                mtu: rnic::mtu_bytes(path_mtu),
                ..local
            },
            remote,
            device: name,
            port,
            atomics: options.atomics,
            options,
            next_wr_id: 1,
            head: 0,
            in_flight: VecDeque::new(),
            done: VecDeque::new(),
        })
    }

    /// This end (its `mtu` is the path MTU in use).
    pub fn local(&self) -> Endpoint {
        self.local
    }

    /// The device's end.
    pub fn remote(&self) -> Endpoint {
        self.remote
    }

    /// The RDMA device in use.
    pub fn device_name(&self) -> &str {
        &self.device
    }

    /// The local GID index in use.
    pub fn gid_index(&self) -> u8 {
        self.port.gid_index
    }

    /// The R_Key the device gave for `region`.
    pub fn rkey(&self, region: u32) -> Option<u32> {
        self.rkeys.get(&region).copied()
    }

    /// The exactly-once identity the device gives the next COMPARE_SWAP or
    /// FETCH_ADD posted (its client number still to be stamped); `None`
    /// when the queue pair was set up without a lane.
    pub fn next_atomic(&self) -> Option<ExactlyOnce> {
        self.atomics.map(|a| ExactlyOnce::on_lane(a.lane, a.first))
    }

    /// Whether ATOMIC_WRITE work requests can be posted.
    pub fn has_atomic_write(&self) -> bool {
        self.atomic_write
    }

    /// Work requests posted and not yet reaped.
    pub fn outstanding(&self) -> usize {
        self.in_flight.len()
    }

    /// Posts an RDMA READ of `len` bytes at `pmem_addr` of `region`.
    pub fn post_read(
        &mut self,
        region: u32,
        pmem_addr: u64,
        len: usize,
    ) -> Result<u64, VerbsError> {
        self.post(Work::Read, region, pmem_addr, len, |_, _| {})
    }

    /// Posts an RDMA WRITE of `data` at `pmem_addr` of `region`.
    pub fn post_write(
        &mut self,
        region: u32,
        pmem_addr: u64,
        data: &[u8],
    ) -> Result<u64, VerbsError> {
        self.post(Work::Write, region, pmem_addr, data.len(), |buffer, at| {
            // SAFETY: `post` hands out a reserved slot of `data.len()` bytes
            // that no posted work request uses yet.
            unsafe { buffer.put(at, data) }
        })
    }

    /// Posts an atomic FETCH_ADD of `add` on the 8-byte word at `pmem_addr`.
    pub fn post_fetch_add(
        &mut self,
        region: u32,
        pmem_addr: u64,
        add: u64,
    ) -> Result<u64, VerbsError> {
        self.post(Work::FetchAdd { add }, region, pmem_addr, 8, |_, _| {})
    }

    /// Posts an atomic COMPARE_SWAP on the 8-byte word at `pmem_addr`.
    pub fn post_compare_swap(
        &mut self,
        region: u32,
        pmem_addr: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64, VerbsError> {
        self.post(
            Work::CompareSwap { compare, swap },
            region,
            pmem_addr,
            8,
            |_, _| {},
        )
    }

    /// Posts an ATOMIC_WRITE of the 8-byte memory image `value` at
    /// `pmem_addr` (8-byte aligned); [`VerbsError::Unsupported`] where the
    /// queue pair has no ATOMIC_WRITE.
    pub fn post_atomic_write(
        &mut self,
        region: u32,
        pmem_addr: u64,
        value: [u8; 8],
    ) -> Result<u64, VerbsError> {
        if !self.atomic_write {
            return Err(VerbsError::Unsupported(Op::AtomicWrite.name()));
        }
        self.post(Work::AtomicWrite { value }, region, pmem_addr, 8, |_, _| {})
    }

    /// Waits until every outstanding work request has completed and returns
    /// all completions not yet handed out, in posting order; fails with
    /// [`VerbsError::Timeout`] after the options' `op_timeout`.
    pub fn poll(&mut self) -> Result<Vec<Completion>, VerbsError> {
        self.wait(|qp| qp.in_flight.is_empty())?;
        Ok(self.done.drain(..).collect())
    }

    /// The completions there are now, without waiting.
    pub fn try_poll(&mut self) -> Result<Vec<Completion>, VerbsError> {
        self.reap()?;
        Ok(self.done.drain(..).collect())
    }

    /// RDMA READ of `len` bytes at `pmem_addr` of `region`, waiting for it.
    pub fn read(&mut self, region: u32, pmem_addr: u64, len: usize) -> Result<Vec<u8>, VerbsError> {
        let wr_id = self.post_read(region, pmem_addr, len)?;
        Ok(self.complete(wr_id)?.data)
    }

    /// RDMA WRITE of `data` at `pmem_addr` of `region`, waiting for it.
    pub fn write(&mut self, region: u32, pmem_addr: u64, data: &[u8]) -> Result<(), VerbsError> {
        let wr_id = self.post_write(region, pmem_addr, data)?;
        self.complete(wr_id).map(drop)
    }

    /// FETCH_ADD on the word at `pmem_addr`, waiting for it; returns the
    /// old value.
    pub fn fetch_add(&mut self, region: u32, pmem_addr: u64, add: u64) -> Result<u64, VerbsError> {
        let wr_id = self.post_fetch_add(region, pmem_addr, add)?;
        Ok(self.complete(wr_id)?.value)
    }

    /// ATOMIC_WRITE of `value` (stored little-endian, as the pool stores
    /// words) at `pmem_addr`, waiting for it.
    pub fn atomic_write(
        &mut self,
        region: u32,
        pmem_addr: u64,
        value: u64,
    ) -> Result<(), VerbsError> {
        let wr_id = self.post_atomic_write(region, pmem_addr, value.to_le_bytes())?;
        self.complete(wr_id).map(drop)
    }

    /// COMPARE_SWAP on the word at `pmem_addr`, waiting for it; returns the
    /// old value (the swap happened when it equals `compare`).
    pub fn compare_swap(
        &mut self,
        region: u32,
        pmem_addr: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64, VerbsError> {
        let wr_id = self.post_compare_swap(region, pmem_addr, compare, swap)?;
        Ok(self.complete(wr_id)?.value)
    }

    /// Waits for work request `wr_id`, leaving other completions for
    /// [`VerbsQp::poll`].
    fn complete(&mut self, wr_id: u64) -> Result<Completion, VerbsError> {
        self.wait(|qp| qp.done.iter().any(|c| c.wr_id == wr_id))?;
        let at = self
            .done
            .iter()
            .position(|c| c.wr_id == wr_id)
            .ok_or(VerbsError::StrayCompletion(wr_id))?;
        self.done
            .remove(at)
            .ok_or(VerbsError::StrayCompletion(wr_id))?
            .check()
    }

    /// Reaps completions until `ready`, spinning briefly, then sleeping a
    /// little between polls.
    fn wait(&mut self, ready: impl Fn(&Self) -> bool) -> Result<(), VerbsError> {
        let start = Instant::now();
        let mut idle = 0u32;
        loop {
            if self.reap()? > 0 {
                idle = 0;
            }
            if ready(self) {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited >= self.options.op_timeout {
                return Err(VerbsError::Timeout {
                    outstanding: self.in_flight.len(),
                    waited,
                });
            }
            idle += 1;
            if idle < 1000 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Moves what the CQ holds to `done`; returns how many.
    fn reap(&mut self) -> Result<usize, VerbsError> {
        let polled: Vec<(u64, u32, u32)> = match self.cq.start_poll() {
            Ok(poller) => poller
                .map(|wc| (wc.wr_id(), wc.status(), wc.vendor_err()))
                .collect(),
            Err(PollCompletionQueueError::CompletionQueueEmpty) => return Ok(0),
            Err(e) => return Err(VerbsError::PollCq(e)),
        };
        for &(wr_id, status, vendor_err) in &polled {
            // An RC send queue completes in order: normally the oldest.
            let index = self
                .in_flight
                .iter()
                .position(|w| w.wr_id == wr_id)
                .ok_or(VerbsError::StrayCompletion(wr_id))?;
            let Some(work) = self.in_flight.remove(index) else {
                return Err(VerbsError::StrayCompletion(wr_id));
            };
            let status = WorkCompletionStatus::from(status);
            let ok = status == WorkCompletionStatus::Success;
            let (data, value) = match work.op {
                // SAFETY: the slot belongs to this completed work request; the
                // RNIC has finished writing it.
                Op::Read if ok => (unsafe { self.buffer.get(work.at, work.len) }, 0),
                Op::FetchAdd | Op::CompareSwap if ok => {
                    // SAFETY: as above; the RNIC stores the old value in host
                    // byte order.
                    let bytes = unsafe { self.buffer.get(work.at, 8) };
                    let mut word = [0u8; 8];
                    word.copy_from_slice(&bytes);
                    (Vec::new(), u64::from_ne_bytes(word))
                }
                _ => (Vec::new(), 0),
            };
            self.done.push_back(Completion {
                wr_id,
                op: work.op,
                status,
                vendor_err,
                data,
                value,
            });
        }
        Ok(polled.len())
    }

    /// Reserves a slot of `len` bytes, lets `fill` write it, posts the work
    /// request, signalled, and records it.
    fn post(
        &mut self,
        work: Work,
        region: u32,
        pmem_addr: u64,
        len: usize,
        fill: impl FnOnce(&DmaBuffer, usize),
    ) -> Result<u64, VerbsError> {
        let op = work.op();
        let rkey = self.rkey(region).ok_or(VerbsError::UnknownRegion(region))?;
        if matches!(op, Op::FetchAdd | Op::CompareSwap | Op::AtomicWrite)
            && !pmem_addr.is_multiple_of(8)
        {
            return Err(VerbsError::Misaligned {
                op: op.name(),
                addr: pmem_addr,
            });
        }
        if self.in_flight.len() >= self.options.queue_depth.max(1) as usize {
            return Err(VerbsError::QueueFull(self.in_flight.len()));
        }
        let length = u32::try_from(len).map_err(|_| VerbsError::TooLong {
            op: op.name(),
            len,
            buffer: self.buffer.len(),
        })?;
        let oldest = self.in_flight.front().map(|w| w.at);
        let (at, head) = place(self.buffer.len(), self.head, oldest, len).ok_or_else(|| {
            VerbsError::TooLong {
                op: op.name(),
                len,
                buffer: self.buffer.len(),
            }
        })?;
        fill(&self.buffer, at);
        let wr_id = self.next_wr_id;
        let local = (self.buffer.addr() + at) as u64;
        let lkey = self.mr.lkey();
        // SAFETY: an extended QP's `ibv_qp` is the first member of its
        // `ibv_qp_ex`, so the two pointers are the same (sideway relies on
        // this too); the QP lives as long as `self`.
        let qp_ex: *mut ibv_qp_ex = unsafe { self.qp.qp() }.as_ptr().cast();
        let mut guard = self.qp.start_post_send();
        let wr = guard.construct_wr(wr_id, WorkRequestFlags::Signaled);
        let local_buffer = match work {
            Work::Read => Some(wr.setup_read(rkey, pmem_addr)),
            Work::Write => Some(wr.setup_write(rkey, pmem_addr)),
            Work::FetchAdd { add } => Some(wr.setup_atomic_fetch_add(rkey, pmem_addr, add)),
            Work::CompareSwap { compare, swap } => {
                Some(wr.setup_atomic_compare_swap(rkey, pmem_addr, compare, swap))
            }
            Work::AtomicWrite { value } => {
                // `construct_wr` set the request's id and flags on the QP;
                // the handle has nothing more to do.
                let _ = wr;
                // SAFETY: between `start_post_send` and `post`, with the QP
                // made with ATOMIC_WRITE among its send operations (checked
                // by `post_atomic_write`), the provider's entry is set; it
                // copies the 8 bytes of `value` before returning.
                unsafe {
                    let post = (*qp_ex)
                        .wr_atomic_write
                        .ok_or(VerbsError::Unsupported(Op::AtomicWrite.name()))?;
                    post(qp_ex, rkey, pmem_addr, value.as_ptr().cast());
                }
                None
            }
        };
        if let Some(local_buffer) = local_buffer {
            // SAFETY: `at..at + len` is a slot of the registered buffer
            // reserved for this work request until its completion is reaped,
            // and the buffer outlives the QP.
            unsafe { local_buffer.setup_sge(lkey, local, length) };
        }
        guard.post().map_err(|source| VerbsError::PostSend {
            op: op.name(),
            source,
        })?;
        self.next_wr_id += 1;
        if matches!(op, Op::FetchAdd | Op::CompareSwap)
            && let Some(next) = self.atomics.as_mut()
        {
            next.first = next.first.wrapping_add(1);
        }
        self.head = head;
        self.in_flight.push_back(InFlight { wr_id, op, at, len });
        Ok(wr_id)
    }
}

impl Drop for VerbsQp {
    fn drop(&mut self) {
        // Stop the RNIC from touching the buffer before anything is freed:
        // move the QP to ERR (outstanding requests are flushed); destroying
        // it, first among the fields, then releases it.
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Error);
        let _ = self.qp.modify(&attr);
    }
}
