//! One pool path over the verbs transport: a queue pair to a fabric device
//! and the control connection it was set up on, driven by a thread of
//! their own.
//!
//! The pool hands the link device requests ([`VerbsLink::send`]); the
//! thread turns READ, WRITE, COMPARE_SWAP and FETCH_ADD into RDMA work
//! requests on the queue pair (the PMEM address is the remote address, the
//! region's R_Key the key) and answers each from its completion. What a
//! queue pair cannot carry goes on the control connection, in order with
//! the thread's other work:
//!
//! - FLUSH (the verbs library this builds on cannot post it, nor can
//!   rdma-core before 45), ATOMIC_WRITE (see `Worker::post_waiting`), and
//!   the FLUSH that makes a persistent WRITE or atomic durable once its
//!   completion is in;
//! - an exactly-once atomic asked again after an attempt that may have run
//!   ([`Resend::Again`]), with the identity it had.
//!
//! Exactly-once: the queue pair is set up with a lane, so the device
//! numbers its atomics in the order they are posted; the link records the
//! number of each atomic as it posts it ([`Ticket::identity`]). When the
//! queue pair dies with the atomic in doubt, the pool asks again on another
//! path with that identity and the server answers from its record if the
//! first one ran.
//!
//! The link dies (and the pool's `on_lost` runs once) when the control
//! connection closes, a completion reports an error (an RC queue pair that
//! saw one is in the error state), or posting fails; every request still
//! waiting then fails as lost, a request posted on the queue pair only once
//! the queue pair is destroyed (so that it cannot land after a retry of it
//! on another path).

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use proto::qp::AtomicSeq;
use proto::request::{self, ExactlyOnce, Operation, Target};
use proto::{AccessKey, PmemAddr, Status};
use tokio::sync::oneshot;
use topology::Layout;

use super::WorkCompletionStatus;
use super::control::Control;
use super::error::VerbsError;
use super::qp::{VerbsOptions, VerbsQp};
use crate::conn::{ConnectError, Lost, Response};

/// How often an idle link checks that its control connection is open.
const LIVENESS_CHECK: Duration = Duration::from_millis(10);
/// Empty polls spun before the thread starts sleeping between polls.
const SPIN_POLLS: u32 = 2_000;

/// Where and as whom a link connects.
#[derive(Debug, Clone)]
pub(crate) struct LinkConfig {
    /// The device port's control address.
    pub addr: SocketAddr,
    /// The client's name, for HELLO.
    pub client: String,
    /// The layout digest the device must serve.
    pub digest: [u8; 32],
    /// The layout, to find a PMEM address's region.
    pub layout: Layout,
    /// How long connecting and set-up may take.
    pub timeout: Duration,
    /// The RDMA device (`None`: the first).
    pub rdma_device: Option<String>,
    /// The client's key, proven on the control connection.
    pub key: Option<proto::auth::Key>,
    /// The RNIC's IPv4 address.
    pub local_ip: Ipv4Addr,
    /// The exactly-once lane and the number of the first atomic.
    pub atomics: AtomicSeq,
    /// The map epoch the pool runs (0: it follows none).
    pub map_epoch: u64,
}

/// Whether a request may have run already on some path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resend {
    /// First attempt.
    First,
    /// An earlier attempt may have run it: an exactly-once atomic must
    /// keep its identity, so it goes on the control connection.
    Again,
}

const QUEUED: u8 = 0;
const POSTED: u8 = 1;
const CANCELLED: u8 = 2;

/// A request handed to the thread: whether it was posted or given up on,
/// and, for a device-numbered atomic, its identity.
#[derive(Debug, Default)]
pub(crate) struct Ticket {
    state: AtomicU8,
    identity: OnceLock<ExactlyOnce>,
}

impl Ticket {
    /// The thread takes the request on; false when the pool gave up on it.
    fn claim(&self, identity: Option<ExactlyOnce>) -> bool {
        if let Some(id) = identity {
            let _ = self.identity.set(id);
        }
        match self
            .state
            .compare_exchange(QUEUED, POSTED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(state) => state == POSTED,
        }
    }
}

impl Ticket {
    /// Gives up on the request: if the thread has not taken it yet it never
    /// will.
    pub fn cancel(&self) {
        let _ = self
            .state
            .compare_exchange(QUEUED, CANCELLED, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The exactly-once identity the device gave the request, when it was
    /// posted as a numbered atomic (its client number still to be stamped).
    pub fn identity(&self) -> Option<ExactlyOnce> {
        self.identity.get().copied()
    }
}

/// A request, owned, for the thread.
#[derive(Debug)]
struct Owned {
    operation: Operation,
    pmem: PmemAddr,
    key: AccessKey,
    length: u32,
    operand: u64,
    compare: u64,
    payload: Vec<u8>,
    persist: bool,
    exactly_once: Option<ExactlyOnce>,
}

impl Owned {
    fn of(req: &request::Repr<'_>) -> Option<Owned> {
        let Target::Pmem(pmem) = req.target else {
            return None;
        };
        Some(Owned {
            operation: req.operation,
            pmem,
            key: req.key,
            length: req.length,
            operand: req.operand,
            compare: req.compare,
            payload: req.payload.to_vec(),
            persist: req.persist || req.operation == Operation::WritePersist,
            exactly_once: req.exactly_once,
        })
    }

    fn repr(&self) -> request::Repr<'_> {
        request::Repr {
            operation: self.operation,
            target: Target::Pmem(self.pmem),
            key: self.key,
            length: self.length,
            exactly_once: self.exactly_once,
            on_behalf: None,
            persist: self.persist && self.operation != Operation::WritePersist,
            non_temporal: false,
            operand: self.operand,
            compare: self.compare,
            payload: &self.payload,
        }
    }

    /// The FLUSH that makes this request's bytes durable.
    fn flush(&self) -> request::Repr<'static> {
        let len = self.operation.span_len(self.length);
        request::Repr::flush(Target::Pmem(self.pmem), self.key, len)
    }
}

#[derive(Debug)]
struct Job {
    request: Owned,
    /// On the control connection rather than the queue pair.
    control: bool,
    reply: oneshot::Sender<Response>,
    ticket: Arc<Ticket>,
}

/// A live verbs path. Dropping it stops the thread, which destroys the
/// queue pair and closes the control connection.
#[derive(Debug)]
pub(crate) struct VerbsLink {
    jobs: Mutex<mpsc::Sender<Job>>,
    alive: Arc<AtomicBool>,
    /// Asks the thread to stop now, whoever still holds the link.
    stop: Arc<AtomicBool>,
    /// Set once the queue pair is destroyed: nothing posted on it can
    /// reach the device any more (no retransmission either).
    destroyed: Arc<AtomicBool>,
    /// The device's MAP from the control connection's opening (the region
    /// keys requests sent over the control connection carry).
    pub map: proto::map::Repr,
}

/// Why a verbs link could not be opened.
fn verbs_error(addr: SocketAddr, source: VerbsError) -> ConnectError {
    match source {
        VerbsError::Control(super::ControlError::Connect(e)) => e,
        source => ConnectError::Rdma {
            addr: addr.to_string(),
            source: Box::new(source),
        },
    }
}

impl VerbsLink {
    /// Connects the control connection, sets up the queue pair and starts
    /// the thread; blocks until set-up is done. `on_lost` runs once when
    /// the link dies after that.
    pub fn open(
        config: LinkConfig,
        on_lost: Box<dyn FnOnce() + Send>,
    ) -> Result<VerbsLink, ConnectError> {
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let (jobs_tx, jobs_rx) = mpsc::channel();
        let alive = Arc::new(AtomicBool::new(true));
        let thread_alive = Arc::clone(&alive);
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let destroyed = Arc::new(AtomicBool::new(false));
        let thread_destroyed = Arc::clone(&destroyed);
        let addr = config.addr;
        let spawned = std::thread::Builder::new()
            .name(format!("verbs {addr}"))
            .spawn(move || {
                let set_up = Control::connect_with(
                    config.addr,
                    &config.client,
                    config.key.clone(),
                    Some(config.digest),
                    config.timeout,
                )
                .map_err(|e| VerbsError::Control(e.into()))
                .and_then(|mut control| {
                    let options = VerbsOptions {
                        atomics: Some(config.atomics),
                        map_epoch: config.map_epoch,
                        buffer_len: 8 << 20,
                        op_timeout: config.timeout,
                        ..VerbsOptions::default()
                    };
                    let qp = VerbsQp::connect_with(
                        &mut control,
                        config.rdma_device.as_deref(),
                        config.local_ip,
                        options,
                    )?;
                    Ok((control, qp))
                });
                match set_up {
                    Ok((mut control, qp)) => {
                        let _ = ready_tx.send(Ok(control.map.take().unwrap_or_default()));
                        let mut worker = Worker {
                            control,
                            qp,
                            layout: config.layout,
                            waiting: VecDeque::new(),
                            posted: HashMap::new(),
                        };
                        worker.run(&jobs_rx, &thread_stop);
                        thread_alive.store(false, Ordering::SeqCst);
                        // Requests never posted fail as lost at once, and
                        // the pool hears that the path is gone before the
                        // queue pair is torn down (slow on some RNICs).
                        worker.waiting.clear();
                        drop(jobs_rx);
                        on_lost();
                        // Requests posted on the queue pair fail only once
                        // it is destroyed: until then it may still send
                        // them (an RC queue pair retransmits what it
                        // posted), and a WRITE tried again on another path
                        // could land before this copy of it, which would
                        // then overwrite what came after.
                        let posted = std::mem::take(&mut worker.posted);
                        drop(worker);
                        thread_destroyed.store(true, Ordering::SeqCst);
                        drop(posted);
                    }
                    Err(e) => {
                        thread_alive.store(false, Ordering::SeqCst);
                        thread_destroyed.store(true, Ordering::SeqCst);
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(|source| ConnectError::Io {
                addr: addr.to_string(),
                source,
            })?;
        drop(spawned);
        match ready_rx.recv() {
            Ok(Ok(map)) => Ok(VerbsLink {
                jobs: Mutex::new(jobs_tx),
                alive,
                stop,
                destroyed,
                map,
            }),
            Ok(Err(e)) => Err(verbs_error(addr, e)),
            Err(_) => Err(ConnectError::Protocol {
                addr: addr.to_string(),
                what: "the verbs thread ended during set-up".to_owned(),
            }),
        }
    }

    /// Whether the link still works.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Ends the link now: the thread stops, fails what it holds and
    /// destroys the queue pair, so a request posted on it can no longer be
    /// retransmitted and land after a retry on another path.
    pub fn shut(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Whether the queue pair is gone (after [`shut`](Self::shut) or the
    /// link's death).
    pub fn is_destroyed(&self) -> bool {
        self.destroyed.load(Ordering::SeqCst)
    }

    /// Hands `req` (addressed by PMEM address) to the thread; returns where
    /// its answer comes (an error when the link dies first) and its ticket.
    pub fn send(
        &self,
        req: &request::Repr<'_>,
        resend: Resend,
        to_non_owner: bool,
    ) -> Result<(oneshot::Receiver<Response>, Arc<Ticket>), Lost> {
        if !self.is_alive() {
            return Err(Lost);
        }
        let request = Owned::of(req).ok_or(Lost)?;
        let control = on_control_connection(
            request.operation,
            resend,
            request.exactly_once.is_some(),
            to_non_owner,
        );
        let (tx, rx) = oneshot::channel();
        let ticket = Arc::new(Ticket::default());
        let job = Job {
            request,
            control,
            reply: tx,
            ticket: Arc::clone(&ticket),
        };
        self.jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .send(job)
            .map_err(|_| Lost)?;
        Ok((rx, ticket))
    }
}

/// Whether a request goes on the path's control connection rather than its
/// queue pair: FLUSH (the device's persistence point, answered by the
/// server); a resent exactly-once COMPARE_SWAP or FETCH_ADD (it must keep
/// the identity its first attempt had, which the queue pair's numbering
/// would not) and an exactly-once ATOMIC_WRITE (which the queue pair does
/// not number); and
/// anything for a replicated region sent to a device that is not its owner
/// (`to_non_owner`), whose refusal would come as a NAK and break the queue
/// pair.
fn on_control_connection(
    operation: Operation,
    resend: Resend,
    exactly_once: bool,
    to_non_owner: bool,
) -> bool {
    to_non_owner
        || match operation {
            Operation::Read | Operation::Write | Operation::WritePersist => false,
            Operation::CompareSwap | Operation::FetchAdd => resend == Resend::Again && exactly_once,
            // The queue pair numbers only COMPARE_SWAP and FETCH_ADD.
            Operation::AtomicWrite => exactly_once,
            Operation::Flush => true,
        }
}

/// A request on the queue pair, waiting for its completion.
#[derive(Debug)]
struct Posted {
    request: Owned,
    reply: oneshot::Sender<Response>,
}

/// The link's thread: owns the queue pair and the control connection.
struct Worker {
    control: Control,
    qp: VerbsQp,
    layout: Layout,
    waiting: VecDeque<Job>,
    posted: HashMap<u64, Posted>,
}

/// Why the worker stops.
struct Dead;

fn ok(value: u64, data: Vec<u8>) -> Response {
    Response {
        status: Status::Ok,
        value,
        data,
    }
}

fn failed(status: Status) -> Response {
    Response {
        status,
        value: 0,
        data: Vec::new(),
    }
}

/// The device status an error completion stands for, when the device
/// answered (a NAK); `None` when the path itself failed (retries exhausted,
/// flushed, a local error): the request then fails as lost, and the pool
/// tries it on another path as after any broken connection.
fn completion_status(status: WorkCompletionStatus) -> Option<Status> {
    match status {
        WorkCompletionStatus::RemoteAccessError => Some(Status::AccessDenied),
        WorkCompletionStatus::RemoteInvalidRequestError => Some(Status::BadRequest),
        // The device could not get an answer from the server: another
        // device may reach it.
        WorkCompletionStatus::RemoteOperationError => Some(Status::ServerUnavailable),
        _ => None,
    }
}

impl Worker {
    fn run(&mut self, jobs: &mpsc::Receiver<Job>, stop: &AtomicBool) {
        let mut checked = Instant::now();
        let mut idle = 0u32;
        loop {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            if self.posted.is_empty() && self.waiting.is_empty() {
                match jobs.recv_timeout(LIVENESS_CHECK) {
                    Ok(job) => self.waiting.push_back(job),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            loop {
                match jobs.try_recv() {
                    Ok(job) => self.waiting.push_back(job),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            let progress = match self.post_waiting().and_then(|()| self.reap()) {
                Ok(progress) => progress,
                Err(Dead) => return,
            };
            if checked.elapsed() >= LIVENESS_CHECK {
                checked = Instant::now();
                if self.control.is_closed() {
                    return;
                }
            }
            if progress || self.posted.is_empty() {
                idle = 0;
            } else {
                idle += 1;
                if idle < SPIN_POLLS {
                    std::hint::spin_loop();
                } else {
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
        }
    }

    /// Posts (or runs on the control connection) what waits, in order,
    /// until the queue pair has no room.
    fn post_waiting(&mut self) -> Result<(), Dead> {
        while let Some(job) = self.waiting.pop_front() {
            // ATOMIC_WRITE goes on the control connection: in the lab, an
            // RDMA ATOMIC_WRITE retried across a cut of the device's RoCE
            // link sometimes completes with a remote access error after the
            // device NAKs it (cause not yet found), which the application
            // would see. `VerbsQp` can post it (`roce-probe` checks it on a
            // healthy path).
            let unpostable = job.request.operation == Operation::AtomicWrite;
            if job.control || unpostable {
                if job.ticket.claim(None) {
                    let answer = self.on_control(&job.request.repr())?;
                    let _ = job.reply.send(answer);
                }
                continue;
            }
            let atomic = matches!(
                job.request.operation,
                Operation::CompareSwap | Operation::FetchAdd
            );
            let identity = if atomic { self.qp.next_atomic() } else { None };
            if !job.ticket.claim(identity) {
                continue;
            }
            match self.post(&job.request) {
                Ok(wr_id) => {
                    self.posted.insert(
                        wr_id,
                        Posted {
                            request: job.request,
                            reply: job.reply,
                        },
                    );
                }
                Err(VerbsError::QueueFull(_) | VerbsError::TooLong { .. })
                    if !self.posted.is_empty() =>
                {
                    // No room until completions free some: try again then.
                    self.waiting.push_front(job);
                    return Ok(());
                }
                Err(VerbsError::UnknownRegion(_) | VerbsError::Misaligned { .. }) => {
                    let _ = job.reply.send(failed(Status::BadRequest));
                }
                Err(VerbsError::TooLong { .. }) => {
                    let _ = job.reply.send(failed(Status::BadRequest));
                }
                Err(_) => return Err(Dead),
            }
        }
        Ok(())
    }

    fn post(&mut self, request: &Owned) -> Result<u64, VerbsError> {
        let region = self
            .layout
            .lookup(request.pmem)
            .map(|at| at.offset.region.0)
            .ok_or(VerbsError::UnknownRegion(u32::MAX))?;
        let addr = request.pmem.get();
        match request.operation {
            Operation::Read => self.qp.post_read(region, addr, request.length as usize),
            Operation::Write | Operation::WritePersist => {
                self.qp.post_write(region, addr, &request.payload)
            }
            Operation::FetchAdd => self.qp.post_fetch_add(region, addr, request.operand),
            Operation::CompareSwap => {
                self.qp
                    .post_compare_swap(region, addr, request.compare, request.operand)
            }
            // The pool's words are little-endian; the image is that.
            Operation::AtomicWrite => {
                self.qp
                    .post_atomic_write(region, addr, request.operand.to_le_bytes())
            }
            Operation::Flush => Err(VerbsError::Unsupported("FLUSH")),
        }
    }

    /// Answers what completed; true when anything did.
    fn reap(&mut self) -> Result<bool, Dead> {
        let completions = self.qp.try_poll().map_err(|_| Dead)?;
        let progress = !completions.is_empty();
        let mut broken = false;
        for c in completions {
            let Some(posted) = self.posted.remove(&c.wr_id) else {
                continue;
            };
            if c.status != WorkCompletionStatus::Success {
                // The queue pair is in the error state now: the requests
                // behind this one are flushed and the link goes.
                if let Some(status) = completion_status(c.status) {
                    let _ = posted.reply.send(failed(status));
                }
                broken = true;
                continue;
            }
            let mut answer = ok(c.value, c.data);
            if posted.request.persist {
                let flushed = self.on_control(&posted.request.flush())?;
                if flushed.status != Status::Ok {
                    answer = flushed;
                }
            }
            let _ = posted.reply.send(answer);
        }
        if broken { Err(Dead) } else { Ok(progress) }
    }

    /// One request on the control connection; the link dies with it.
    fn on_control(&mut self, req: &request::Repr<'_>) -> Result<Response, Dead> {
        self.control.request(req).map_err(|_| Dead)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Operation; 7] = [
        Operation::Read,
        Operation::Write,
        Operation::WritePersist,
        Operation::AtomicWrite,
        Operation::CompareSwap,
        Operation::FetchAdd,
        Operation::Flush,
    ];

    #[test]
    fn a_request_to_a_device_that_does_not_own_its_region_goes_on_the_control_connection() {
        for op in ALL {
            for resend in [Resend::First, Resend::Again] {
                for exactly_once in [false, true] {
                    assert!(
                        on_control_connection(op, resend, exactly_once, true),
                        "{op:?} {resend:?} exactly_once={exactly_once}"
                    );
                }
            }
        }
    }

    #[test]
    fn through_the_owner_only_flush_and_atomics_that_keep_an_identity_leave_the_queue_pair() {
        for op in ALL {
            for resend in [Resend::First, Resend::Again] {
                for exactly_once in [false, true] {
                    let expected = op == Operation::Flush
                        || (op == Operation::AtomicWrite && exactly_once)
                        || (matches!(op, Operation::CompareSwap | Operation::FetchAdd)
                            && resend == Resend::Again
                            && exactly_once);
                    assert_eq!(
                        on_control_connection(op, resend, exactly_once, false),
                        expected,
                        "{op:?} {resend:?} exactly_once={exactly_once}"
                    );
                }
            }
        }
    }
}
