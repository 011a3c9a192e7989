//! Executes one-sided operations on the server's regions.
//!
//! The executor is shared by every connection thread: regions are mapped once,
//! atomics are atomic instructions on the mapping, and the only lock on the
//! data path is the exactly-once table's per-shard lock, taken for
//! COMPARE_SWAP / FETCH_ADD that ask for exactly-once execution.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use proto::auth::NONCE_LEN;
use proto::fence::ConnEpoch;
use proto::frame::{self, Header};
use proto::hello::{self, Capabilities, Role};
use proto::request::{self, Operation, Target};
use proto::response::{self, ResponseKind};
use proto::{AccessKey, Message, Opcode, Status};
use topology::{CachePolicy, Layout, RegionIndex, ServerId};

use crate::dedup::{Attempt, Dedup, DedupError, DedupTable, Intent, Refusal, RequestDigest, Word};
use crate::gate::{self, Followed, FollowedPrincipals, Gatekeeper, Session};
use crate::metrics::ServerMetrics;
use crate::persist::PersistError;
use crate::qp_fence::QpFence;
use crate::region_file::HEADER_LEN;
use crate::served_region::ServedRegion;
use crate::tenancy::{Asker, Tenancy};

mod fencing;
mod ownership;
mod recorded;
mod revocation;

/// The protocol version this server speaks.
pub use proto::PROTOCOL_VERSION;

/// What this server offers peers in HELLO.
pub const CAPABILITIES: Capabilities = Capabilities(
    Capabilities::PIPELINING.0
        | Capabilities::EXACTLY_ONCE.0
        | Capabilities::REGION_ADDRESSING.0
        | Capabilities::PERSISTENT_ATOMICS.0,
);

/// Which key opens each extent of a region of a pool with an allocator: the
/// region's extent key table, in the region's own mapping (see
/// [`topology::meta`]). Reserved (metadata) extents open with the region
/// key; an allocated extent only with its own key, so rotating that key on
/// free cuts off every stale translation at once; an unallocated one with
/// none (it is nobody's memory).
#[derive(Debug, Clone, Copy)]
struct ExtentKeys {
    extent: u64,
    reserved: u64,
    /// Mapping offset of the key table.
    table_at: usize,
}

impl ExtentKeys {
    fn of(layout: &Layout, region: RegionIndex) -> Option<Self> {
        let meta = layout.meta()?.region(region)?;
        Some(Self {
            extent: layout.extent_size().max(1),
            reserved: meta.reserved,
            table_at: usize::try_from(HEADER_LEN + meta.key_table_offset()).ok()?,
        })
    }

    /// Whether `key` opens `[offset, offset + len)` (already bounds-checked).
    fn admits(&self, region: &ServedRegion, key: AccessKey, offset: u64, len: u64) -> bool {
        let first = offset / self.extent;
        let last = (offset + len.max(1) - 1) / self.extent;
        (first..=last).all(|extent| {
            if extent < self.reserved {
                return key == region.key();
            }
            let installed = {
                self.table_at
                    .checked_add(extent as usize * 8)
                    .and_then(|at| region.file.map.atomic_u64(at).ok())
                    .map_or(u64::MAX, |word| word.load(Ordering::Acquire))
            };
            installed != 0 && key == AccessKey(installed)
        })
    }
}

/// What recovery found of the exactly-once atomics a crash interrupted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Atomics whose word had changed: recorded as applied.
    pub applied: usize,
    /// Atomics whose word had not: their retry applies them.
    pub not_applied: usize,
}

/// Why interrupted exactly-once atomics could not be settled.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    /// The intent names a word this server does not serve (another layout).
    #[error(
        "an interrupted exactly-once atomic of client {:#x} names offset {} of region {}, which \
         this server does not serve",
        .0.client, .0.offset, .0.region
    )]
    Unserved(Intent),
    /// Its word could not be made durable.
    #[error("cannot persist the word of an interrupted exactly-once atomic")]
    Persist(#[source] PersistError),
    /// Its result could not be recorded.
    #[error("cannot settle an interrupted exactly-once atomic")]
    Dedup(#[source] DedupError),
}

/// The regions of one server and everything needed to execute on them.
#[derive(Debug)]
pub struct Executor {
    server: ServerId,
    layout: Layout,
    /// Served regions by region index; `None` for other servers' regions.
    regions: Vec<Option<ServedRegion>>,
    /// By region index: the map epoch from which the cluster map no longer
    /// places it here, so its requests are refused (its file stays); 0
    /// while it is served.
    withdrawn: Vec<AtomicU64>,
    /// Per-extent keys by region index, for pools with an allocator.
    extent_keys: Vec<Option<ExtentKeys>>,
    dedup: DedupTable,
    /// Held while a region key is being rotated, so rotations never race.
    rotation: Mutex<()>,
    metrics: Arc<ServerMetrics>,
    /// With `--secrets`: who may connect, and the proof they owe; replaced
    /// as a whole when a new map names other principals.
    gate: Option<RwLock<Gatekeeper>>,
    /// Who may change the allocator's records, and zeroing of extents.
    tenancy: Tenancy,
    /// The epoch of the cluster map the server runs; 0 on a topology file.
    epoch: AtomicU64,
    /// By region index: the fabric device the map names as the owner of a
    /// replicated region (empty until a map in etcd says).
    owners: RwLock<Vec<Option<String>>>,
    /// The queue pairs of every connection, bound to the epochs they said.
    qp_fence: Arc<QpFence>,
}

/// What the connection does after a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Go on.
    Continue,
    /// Send what was answered, then close (a peer refused at the gate).
    Close,
}

/// The result of one operation before it is encoded.
struct Done {
    status: Status,
    value: u64,
}

impl Done {
    fn ok(value: u64) -> Self {
        Self {
            status: Status::Ok,
            value,
        }
    }
}

impl From<Status> for Done {
    fn from(status: Status) -> Self {
        Self { status, value: 0 }
    }
}

/// Appends a frame header and response body for `kind` to `out`, with room
/// for `payload_len` bytes of data that the caller appends next.
fn push_response(
    out: &mut Vec<u8>,
    tag: u64,
    kind: ResponseKind,
    status: Status,
    value: u64,
    payload_len: usize,
) {
    let start = out.len();
    let fixed = frame::HEADER_LEN + response::HEADER_LEN;
    out.resize(start + fixed, 0);
    let (head, body) = out[start..].split_at_mut(frame::HEADER_LEN);
    Header {
        opcode: kind.opcode(),
        body_len: (response::HEADER_LEN + payload_len) as u32,
        tag,
    }
    .emit(&mut frame::Packet::new_unchecked(head));
    response::Repr {
        kind,
        status,
        value,
        payload: &[],
    }
    .emit(&mut response::Packet::new_unchecked(body));
}

impl Executor {
    /// An executor over `regions` (this server's regions) of `layout`.
    pub fn new(
        server: ServerId,
        layout: Layout,
        regions: Vec<ServedRegion>,
        dedup: DedupTable,
        metrics: Arc<ServerMetrics>,
    ) -> Self {
        let mut by_index: Vec<Option<ServedRegion>> =
            (0..layout.entries().len()).map(|_| None).collect();
        for region in regions {
            let slot = region.entry.region.0 as usize;
            if let Some(place) = by_index.get_mut(slot) {
                *place = Some(region);
            }
        }
        let extent_keys = (0..layout.entries().len() as u32)
            .map(|i| ExtentKeys::of(&layout, RegionIndex(i)))
            .collect();
        let tenancy = Tenancy::new(&layout, Arc::clone(&metrics));
        let withdrawn = by_index.iter().map(|_| AtomicU64::new(0)).collect();
        let qp_fence = Arc::new(QpFence::new(Arc::clone(&metrics.queue_pairs)));
        Self {
            server,
            layout,
            regions: by_index,
            withdrawn,
            extent_keys,
            dedup,
            rotation: Mutex::new(()),
            metrics,
            gate: None,
            tenancy,
            epoch: AtomicU64::new(0),
            owners: RwLock::new(Vec::new()),
            qp_fence,
        }
    }

    /// The queue pairs of every connection (`qp_fence`).
    pub(crate) fn qp_fence(&self) -> &Arc<QpFence> {
        &self.qp_fence
    }

    /// Requires every connection to prove its principal's key first.
    pub fn with_gate(mut self, gate: Gatekeeper) -> Self {
        self.gate = Some(RwLock::new(gate));
        self
    }

    /// The gatekeeper now, with `--secrets`.
    fn gate(&self) -> Option<RwLockReadGuard<'_, Gatekeeper>> {
        let gate = self.gate.as_ref()?;
        Some(gate.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// With `--secrets`: builds the gatekeeper again for `topology` (the
    /// map at `epoch`: who may connect, whom each device acts for, the
    /// clients' grants), keys from the same folder, and puts it in place
    /// for every connection's next frame. A device proven before that the
    /// new map no longer names is revoked at its next frame (see
    /// `Session::Revoked`). Returns what
    /// was built (its devices, and those whose key could not be read), or
    /// `None` without `--secrets`.
    pub fn follow_principals(
        &self,
        topology: &topology::Topology,
        layout: &Layout,
        epoch: u64,
    ) -> Option<Result<FollowedPrincipals, topology::secrets::SecretError>> {
        let slot = self.gate.as_ref()?;
        let followed = match self.gate()?.follow(topology, layout, epoch) {
            Ok(followed) => followed,
            Err(e) => return Some(Err(e)),
        };
        let Followed { gate, unreadable } = followed;
        let devices = gate.devices().into_iter().map(str::to_owned).collect();
        let dir = gate.dir().to_path_buf();
        let mut current = slot.write().unwrap_or_else(PoisonError::into_inner);
        let before = current.devices().into_iter().map(str::to_owned).collect();
        *current = gate;
        Some(Ok(FollowedPrincipals {
            dir,
            before,
            devices,
            unreadable,
        }))
    }

    /// Keeps exactly-once windows for the identities of `topology`'s
    /// clients from the next atomic on (a client's new RNIC brings a lane,
    /// a new client its number). Returns how many identities the map names
    /// and how many the window file has room for (`None`: no limit).
    pub fn follow_identities(&self, topology: &topology::Topology) -> (usize, Option<usize>) {
        let named = self.dedup.rebound(crate::identities::lanes_of(topology));
        (named, self.dedup.capacity())
    }

    /// A new connection's standing with the gate.
    pub fn new_session(&self) -> Session {
        if self.gate.is_some() {
            Session::Hello
        } else {
            Session::Open
        }
    }

    /// The regions this server serves.
    pub fn regions(&self) -> impl Iterator<Item = &ServedRegion> {
        self.regions.iter().flatten()
    }

    /// Marks the region at `index` as withdrawn by the cluster map at
    /// `epoch` (its requests are refused UNMAPPED, or STALE_MAP for a
    /// connection that said an older epoch; its file is kept) or placed
    /// here again; whether that changed anything. A region withdrawn
    /// already keeps the epoch that withdrew it.
    pub fn set_withdrawn(&self, index: RegionIndex, withdrawn: bool, epoch: u64) -> bool {
        let Some(flag) = self.withdrawn.get(index.0 as usize) else {
            return false;
        };
        if (flag.load(Ordering::Acquire) != 0) == withdrawn {
            return false;
        }
        flag.store(if withdrawn { epoch.max(1) } else { 0 }, Ordering::Release);
        true
    }

    /// The map epoch that withdrew the region `target` addresses, if it is
    /// a served region the map withdrew.
    pub(crate) fn withdrawn_by(&self, target: Target) -> Option<u64> {
        let index = match target {
            Target::Region(at) => at.region,
            Target::Pmem(addr) => self.layout.lookup(addr)?.offset.region,
        };
        let epoch = self
            .withdrawn
            .get(index.0 as usize)?
            .load(Ordering::Acquire);
        (epoch != 0).then_some(epoch)
    }

    /// The metrics this executor records into.
    pub fn metrics(&self) -> &Arc<ServerMetrics> {
        &self.metrics
    }

    /// Handles one complete frame from a peer of `session` and appends the
    /// reply to `out`, for a peer whose map epoch is not kept: it is
    /// unfenced, and a MAP_EPOCH is answered but forgotten (a connection
    /// keeps it with [`Executor::handle_frame_at`]). An error means the
    /// stream cannot be framed any more: close it.
    pub fn handle_frame(
        &self,
        session: &mut Session,
        frame: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Flow, proto::Error> {
        self.handle_frame_at(session, &mut ConnEpoch::default(), frame, out)
    }

    /// [`Executor::handle_frame`] for a connection that said (or will say)
    /// the map epoch it runs, kept in `said`: its requests are fenced by
    /// that epoch (see `proto::fence`).
    pub fn handle_frame_at(
        &self,
        session: &mut Session,
        said: &mut ConnEpoch,
        frame: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Flow, proto::Error> {
        if let Some(epoch) = self.revoked_at(session) {
            *session = Session::Revoked { epoch };
        }
        if let Session::Revoked { epoch } = *session {
            return Ok(self.answer_revoked(epoch, frame, out));
        }
        match proto::parse_frame(frame) {
            Ok((Message::MapEpoch(epoch), tag)) if session.admits() => {
                self.map_epoch(said, epoch, tag, out);
                Ok(Flow::Continue)
            }
            Ok((Message::Request(req), tag)) if session.admits() => {
                let Some(verdict) = self.fence(*said, &req, tag, out) else {
                    return Ok(Flow::Continue);
                };
                let refused = match self.authorize(session, &req) {
                    Some(reason) => Some((&self.metrics.denied, reason)),
                    None => match recorded::record_from_client(session, &req) {
                        Some(reason) => Some((&self.metrics.denied, reason)),
                        None => self
                            .foreign_identity(session, &req)
                            .map(|reason| (&self.metrics.exactly_once_refused, reason)),
                    },
                };
                match refused {
                    None if self.lacks_ahead(verdict, &req)
                        || self.withdrawn_after(*said, &req) =>
                    {
                        self.stale_map(&req, tag, out)
                    }
                    None if self.deposed_owner(session, verdict, &req).is_some() => {
                        self.not_owner(&req, tag, out)
                    }
                    None => self.execute(Asker::of(session, req.on_behalf), &req, tag, out),
                    Some((counter, reason)) => {
                        counter.with(&[reason]).inc();
                        self.metrics.record(
                            req.operation,
                            Status::AccessDenied,
                            std::time::Duration::ZERO,
                        );
                        let kind = ResponseKind::answering(req.operation.opcode());
                        push_response(out, tag, kind, Status::AccessDenied, 0, 0);
                    }
                }
                Ok(Flow::Continue)
            }
            Ok((message, tag)) if session.admits() => {
                self.handle_message(session, message, tag, out);
                Ok(Flow::Continue)
            }
            Ok((message, tag)) => Ok(self.at_the_gate(session, message, tag, out)),
            Err(error) => {
                self.metrics.malformed_frames.inc();
                if let Some(reply) = proto::reply_to_malformed(frame, &error) {
                    out.extend_from_slice(&reply);
                }
                if error.breaks_framing() {
                    Err(error)
                } else {
                    Ok(Flow::Continue)
                }
            }
        }
    }

    /// Why `req` may not run for `session`'s peer, if it may not: with
    /// authentication, a request is held to the grants of the client it is
    /// for.
    fn authorize(&self, session: &Session, req: &request::Repr<'_>) -> Option<&'static str> {
        let gate = self.gate()?;
        let number = match (session, req.on_behalf) {
            (Session::Open, _) => return None,
            (Session::ProvenDevice { device }, Some(number)) if gate.wired(device, number) => {
                number
            }
            (Session::ProvenDevice { .. }, Some(_)) => return Some("unwired_client"),
            // A replicated region's owner resyncing a copy, in its own name.
            (Session::ProvenDevice { device }, None) if self.owner_asks(device, req) => {
                return None;
            }
            (Session::ProvenDevice { .. }, None) => return Some("no_client"),
            (Session::ProvenClient { number }, None) => *number,
            (Session::ProvenClient { .. }, Some(_)) => return Some("on_behalf_from_client"),
            (Session::ProvenOperator, _) => return Some("operator"),
            _ => return Some("unauthenticated"),
        };
        let addr = match req.target {
            Target::Pmem(addr) => addr,
            Target::Region(at) => {
                let entry = self.layout.entry(at.region)?;
                entry.start.checked_add(at.offset)?
            }
        };
        let len = u64::from(req.span_len());
        gate.denies(number, addr, len, req.operation.changes_memory())
    }

    /// Why `req`'s exactly-once identity is not one `session`'s peer may
    /// use, if it is not: a client proven by its key uses only its own
    /// number (any of its lanes), a device only the number of the client it
    /// acts for. Checked before the identity reaches the window, so no one
    /// can record (or read) a result under another client's identity.
    /// Without authentication there is no one to bind an identity to.
    fn foreign_identity(&self, session: &Session, req: &request::Repr<'_>) -> Option<&'static str> {
        let once = req.exactly_once?;
        let owner = match (session, req.on_behalf) {
            (Session::ProvenClient { number }, _) => *number,
            (Session::ProvenDevice { .. }, Some(number)) => number,
            _ => return None,
        };
        (once.client & request::CLIENT_NUMBER_MASK != owner).then_some("foreign_identity")
    }

    /// A frame from a peer that has not proven its key yet: HELLO and the
    /// proof are taken, anything else is refused and ends the connection.
    fn at_the_gate(
        &self,
        session: &mut Session,
        message: Message<'_>,
        tag: u64,
        out: &mut Vec<u8>,
    ) -> Flow {
        let Some(gate) = self.gate() else {
            return Flow::Continue;
        };
        let refuse = |reason: &str, opcode, status, out: &mut Vec<u8>| {
            self.metrics.auth_failures.with(&[reason]).inc();
            encode(&proto::error_response(opcode, status), tag, out);
            Flow::Close
        };
        match (message, &*session) {
            (Message::Hello(peer), Session::Hello) => {
                if peer.version < PROTOCOL_VERSION {
                    return refuse("version", Opcode::Hello, Status::VersionMismatch, out);
                }
                if gate.key(peer.role, peer.name).is_none() {
                    return refuse(
                        "unknown_principal",
                        Opcode::Hello,
                        Status::UnknownClient,
                        out,
                    );
                }
                let mut nonce = [0u8; NONCE_LEN];
                if getrandom::fill(&mut nonce).is_err() {
                    return refuse("no_randomness", Opcode::Hello, Status::IoError, out);
                }
                self.handle_message(session, Message::Hello(peer), tag, out);
                encode(&Message::AuthChallenge(nonce), tag, out);
                *session = Session::Challenged {
                    role: peer.role,
                    name: peer.name.to_owned(),
                    nonce,
                };
                Flow::Continue
            }
            (Message::AuthProof(proof), Session::Challenged { role, name, nonce }) => {
                let answer = gate.key(*role, name).and_then(|key| {
                    gate::answer_proof(key, *role, name, self.server.as_str(), *nonce, &proof)
                });
                let proven = match role {
                    Role::FabricDevice => gate.admits_device(name).then(|| Session::ProvenDevice {
                        device: name.clone(),
                    }),
                    Role::Admin => Some(Session::ProvenOperator),
                    Role::Client => gate
                        .client_number(name)
                        .map(|number| Session::ProvenClient { number }),
                    _ => None,
                };
                match (answer, proven) {
                    (Some(answer), Some(proven)) => {
                        encode(&Message::AuthProof(answer), tag, out);
                        *session = proven;
                        Flow::Continue
                    }
                    _ => refuse("bad_proof", Opcode::AuthProof, Status::AccessDenied, out),
                }
            }
            (message, _) => refuse(
                "unauthenticated",
                message.opcode(),
                Status::UnknownClient,
                out,
            ),
        }
    }

    fn handle_message(&self, session: &Session, message: Message<'_>, tag: u64, out: &mut Vec<u8>) {
        match message {
            Message::Request(req) => {
                self.execute(Asker::of(session, req.on_behalf), &req, tag, out)
            }
            Message::Hello(peer) => {
                let reply = if peer.version < PROTOCOL_VERSION {
                    proto::error_response(Opcode::Hello, Status::VersionMismatch)
                } else {
                    Message::Hello(hello::Repr {
                        version: PROTOCOL_VERSION,
                        role: Role::Server,
                        capabilities: CAPABILITIES,
                        name: self.server.as_str(),
                    })
                };
                encode(&reply, tag, out);
            }
            Message::MapRequest => encode(&Message::Map(self.map_for(session)), tag, out),
            Message::RotateKey(region) => {
                let status = match self.rotate_key(session, region) {
                    Ok(()) => Status::Ok,
                    Err(status) => status,
                };
                encode(&proto::error_response(Opcode::RotateKey, status), tag, out);
            }
            Message::Scrub(scrub) => encode(&self.scrub(session, scrub), tag, out),
            Message::BlockSums(ask) => encode(&self.block_sums(session, ask), tag, out),
            Message::Ping(token) => encode(&Message::Pong(token), tag, out),
            // A server terminates no queue pairs on this transport.
            Message::QpConnect(_) => encode(
                &proto::error_response(Opcode::QpConnect, Status::Unsupported),
                tag,
                out,
            ),
            // Authentication is not asked for on this server.
            Message::AuthProof(_) => encode(
                &proto::error_response(Opcode::AuthProof, Status::Unsupported),
                tag,
                out,
            ),
            // Answers only a listener sends: no one to answer.
            answer if !answer.listener_receives() => {
                self.metrics.malformed_frames.inc();
            }
            // A kind a listener receives that this server does not serve.
            other => encode(
                &proto::error_response(other.opcode(), Status::Unsupported),
                tag,
                out,
            ),
        }
    }

    /// The address map as `session`'s peer may see it: the keys of this
    /// server's regions go to fabric devices, to clients for the regions
    /// their grants reach, and to everyone when there is no authentication;
    /// every other key is 0.
    fn map_for(&self, session: &Session) -> proto::map::Repr {
        let mut map = self.layout.to_map();
        let gate = self.gate();
        for entry in &mut map.entries {
            let Some(region) = self.region(entry.region) else {
                continue;
            };
            let given = match (session, &gate) {
                (Session::Open | Session::ProvenDevice { .. }, _) => true,
                (Session::ProvenClient { number }, Some(gate)) => {
                    gate.reaches(*number, entry.start, entry.len)
                }
                _ => false,
            };
            entry.key = if given { region.key() } else { AccessKey::NONE };
        }
        map
    }

    /// Replaces the key of `index` with a fresh random one, durably, for an
    /// operator (or anyone, without authentication). The old key opens
    /// nothing once this returns.
    fn rotate_key(&self, session: &Session, index: RegionIndex) -> Result<(), Status> {
        if !matches!(session, Session::Open | Session::ProvenOperator) {
            self.metrics.denied.with(&["not_operator"]).inc();
            return Err(Status::AccessDenied);
        }
        let region = self.region(index).ok_or(Status::Unmapped)?;
        let _serial = self.rotation.lock().unwrap_or_else(PoisonError::into_inner);
        match region.file.rotate_key() {
            Ok(key) => {
                region.set_key(key);
                tracing::info!(region = %region.entry.region_id, "region key rotated");
                Ok(())
            }
            Err(e) => {
                tracing::error!(
                    region = %region.entry.region_id,
                    "cannot rotate the region key: {}",
                    telemetry::logging::error_chain(&e)
                );
                Err(Status::IoError)
            }
        }
    }

    /// The served region and offset a request addresses, or UNMAPPED.
    fn resolve(&self, target: Target) -> Result<(&ServedRegion, u64), Status> {
        let (region, offset, withdrawn) = self.locate(target).ok_or(Status::Unmapped)?;
        if withdrawn {
            self.metrics.withdrawn_refused.inc();
            return Err(Status::Unmapped);
        }
        Ok((region, offset))
    }

    /// The served region a request addresses, the offset in it and whether
    /// the map withdrew it; `None` when this server does not hold it.
    fn locate(&self, target: Target) -> Option<(&ServedRegion, u64, bool)> {
        let (index, offset) = match target {
            Target::Region(at) => (at.region, at.offset),
            Target::Pmem(addr) => {
                let at = self.layout.lookup(addr)?;
                (at.offset.region, at.offset.offset)
            }
        };
        let region = self.regions.get(index.0 as usize)?.as_ref()?;
        let withdrawn = self
            .withdrawn
            .get(index.0 as usize)
            .is_some_and(|flag| flag.load(Ordering::Acquire) != 0);
        Some((region, offset, withdrawn))
    }

    /// Executes a one-sided request and appends its response to `out`.
    fn execute(&self, who: Asker, req: &request::Repr<'_>, tag: u64, out: &mut Vec<u8>) {
        let started = Instant::now();
        self.metrics.in_flight.inc();
        let op = req.operation;
        let kind = ResponseKind::answering(op.opcode());
        let status = if op == Operation::Read {
            self.read(req, tag, out)
        } else {
            let done = self.execute_in_place(who, req).unwrap_or_else(Done::from);
            push_response(out, tag, kind, done.status, done.value, 0);
            done.status
        };
        self.metrics.in_flight.dec();
        self.metrics.record(op, status, started.elapsed());
    }

    /// READ: the data goes straight from the mapping into the output buffer.
    fn read(&self, req: &request::Repr<'_>, tag: u64, out: &mut Vec<u8>) -> Status {
        let len = u64::from(req.length);
        let located = self.resolve(req.target).and_then(|(region, offset)| {
            let at = region.span(offset, len)?;
            self.check_key(region, req.key, offset, len)?;
            Ok((region, at))
        });
        let (region, at) = match located {
            Ok(found) => found,
            Err(status) => {
                push_response(out, tag, ResponseKind::ReadResponse, status, 0, 0);
                return status;
            }
        };
        let len = req.length as usize;
        let start = out.len();
        push_response(out, tag, ResponseKind::ReadResponse, Status::Ok, 0, len);
        let data_at = out.len();
        out.resize(data_at + len, 0);
        if region.file.map.read(at, &mut out[data_at..]).is_err() {
            out.truncate(start);
            push_response(out, tag, ResponseKind::ReadResponse, Status::IoError, 0, 0);
            return Status::IoError;
        }
        self.metrics.bytes_out.add(len as u64);
        Status::Ok
    }

    /// Every operation but READ: no data comes back, only a status and value.
    fn execute_in_place(&self, who: Asker, req: &request::Repr<'_>) -> Result<Done, Status> {
        let (region, offset) = self.resolve(req.target)?;
        let len = u64::from(req.span_len());
        region.span(offset, len)?;
        self.check_key(region, req.key, offset, len)?;
        // Allocator records: checked against their owner, held until applied.
        let _records = self.tenancy.admit(who, region, offset, req)?;
        // Scrubs record, not verify, the blocks this changes.
        let _writing = req
            .operation
            .changes_memory()
            .then(|| region.file.sums.writing(offset, len));
        let map = &region.file.map;
        let cache = if req.non_temporal {
            CachePolicy::NonTemporal
        } else {
            region.entry.cache
        };
        let io = |_| Status::IoError;
        match req.operation {
            Operation::Read => Err(Status::BadRequest),
            Operation::Write | Operation::WritePersist => {
                let at = region.span(offset, req.payload.len() as u64)?;
                if req.must_persist() {
                    map.write_persist(at, req.payload, cache).map_err(io)?;
                } else {
                    map.write(at, req.payload, cache).map_err(io)?;
                }
                self.metrics.bytes_in.add(req.payload.len() as u64);
                if req.non_temporal {
                    self.metrics.non_temporal_writes.inc();
                }
                Ok(Done::ok(0))
            }
            Operation::Flush => {
                let at = region.span(offset, u64::from(req.length))?;
                map.persist(at, req.length as usize).map_err(io)?;
                Ok(Done::ok(0))
            }
            Operation::CompareSwap | Operation::FetchAdd | Operation::AtomicWrite => {
                if offset % 8 != 0 {
                    return Err(Status::BadRequest);
                }
                let at = region.span(offset, 8)?;
                let word = map.atomic_u64(at).map_err(|_| Status::BadRequest)?;
                let target = Word {
                    word,
                    region: region.entry.region.0,
                    offset,
                };
                if let Some(done) = self.carry_record(req, target, || map.persist(at, 8)) {
                    return done;
                }
                let once = req.exactly_once;
                let Some(id) = once else {
                    let old = match req.operation {
                        Operation::CompareSwap => {
                            match word.compare_exchange(
                                req.compare,
                                req.operand,
                                Ordering::SeqCst,
                                Ordering::SeqCst,
                            ) {
                                Ok(old) | Err(old) => old,
                            }
                        }
                        Operation::FetchAdd => word.fetch_add(req.operand, Ordering::SeqCst),
                        _ => {
                            word.store(req.operand, Ordering::SeqCst);
                            0
                        }
                    };
                    if req.persist {
                        map.persist(at, 8).map_err(io)?;
                    }
                    return Ok(Done::ok(old));
                };
                let change = |old: u64| match req.operation {
                    Operation::CompareSwap if old == req.compare => req.operand,
                    Operation::CompareSwap => old,
                    Operation::AtomicWrite => req.operand,
                    _ => old.wrapping_add(req.operand),
                };
                let digest = atomic_digest(
                    req.operation.opcode().into(),
                    target.region,
                    offset,
                    req.compare,
                    req.operand,
                );
                let attempt = Attempt {
                    client: id.client,
                    seq: id.seq,
                    digest,
                };
                let ran = self
                    .dedup
                    .run(attempt, target, change, req.persist, || map.persist(at, 8));
                self.exactly_once_done(ran)
            }
        }
    }

    /// The answer to an exactly-once atomic (or an ATOMIC_WRITE carrying
    /// one's record) from what its window said, counted.
    fn exactly_once_done(&self, ran: Result<Dedup, DedupError>) -> Result<Done, Status> {
        match ran {
            Ok(Dedup::Applied(old)) => Ok(Done::ok(old)),
            Ok(Dedup::Replayed(old)) => {
                self.metrics.replays.inc();
                Ok(Done::ok(old))
            }
            Ok(Dedup::Stale) => Err(Status::BadRequest),
            Ok(Dedup::Conflict) => {
                self.metrics.exactly_once_refused.with(&["conflict"]).inc();
                Err(Status::ExactlyOnceConflict)
            }
            Ok(Dedup::Refused(refusal)) => {
                self.metrics
                    .exactly_once_refused
                    .with(&[refusal.reason()])
                    .inc();
                Err(match refusal {
                    Refusal::UnknownIdentity => Status::UnknownClient,
                    Refusal::ReservedSeq => Status::BadRequest,
                    Refusal::WindowFull => Status::IoError,
                })
            }
            Err(e) => {
                self.report_store_failure(&e);
                Err(Status::IoError)
            }
        }
    }

    /// Logs a failure of the exactly-once store, at most once a minute.
    fn report_store_failure(&self, e: &DedupError) {
        static LAST: Mutex<Option<Instant>> = Mutex::new(None);
        let mut last = LAST.lock().unwrap_or_else(PoisonError::into_inner);
        if last.is_none_or(|at| at.elapsed() > Duration::from_secs(60)) {
            *last = Some(Instant::now());
            tracing::warn!(
                "exactly-once atomic failed: {}",
                telemetry::logging::error_chain(e)
            );
        }
    }

    /// Settles the exactly-once atomics a crash left between their intent
    /// and their result (see the `dedup` module's store), before anything is
    /// served: each whose word changed is recorded as applied (after its
    /// word is made durable), the others will be applied by their retry.
    pub fn recover_exactly_once(&self, unfinished: &[Intent]) -> Result<Recovery, RecoveryError> {
        let mut recovery = Recovery::default();
        for intent in unfinished {
            let served = self
                .region(RegionIndex(intent.region))
                .and_then(|r| Some((r, r.span(intent.offset, 8).ok()?)));
            let Some((region, at)) = served else {
                return Err(RecoveryError::Unserved(*intent));
            };
            let map = &region.file.map;
            let word = map
                .atomic_u64(at)
                .map_err(|_| RecoveryError::Unserved(*intent))?;
            map.persist(at, 8).map_err(RecoveryError::Persist)?;
            if self
                .dedup
                .settle(intent, word.load(Ordering::SeqCst))
                .map_err(RecoveryError::Dedup)?
            {
                recovery.applied += 1;
            } else {
                recovery.not_applied += 1;
            }
        }
        self.dedup.finish_recovery().map_err(RecoveryError::Dedup)?;
        Ok(recovery)
    }

    /// ACCESS_DENIED unless `key` opens `[offset, offset + len)` of `region`
    /// (a range already checked against the region's bounds).
    fn check_key(
        &self,
        region: &ServedRegion,
        key: AccessKey,
        offset: u64,
        len: u64,
    ) -> Result<(), Status> {
        let admitted = match self.extent_keys.get(region.entry.region.0 as usize) {
            Some(Some(keys)) => keys.admits(region, key, offset, len),
            _ => key == region.key(),
        };
        if admitted {
            Ok(())
        } else {
            self.metrics.denied.with(&["bad_key"]).inc();
            Err(Status::AccessDenied)
        }
    }

    /// Makes every region durable (used at shutdown).
    pub fn persist_all(&self) -> Result<(), crate::persist::PersistError> {
        self.regions().try_for_each(|r| r.file.map.persist_all())
    }

    /// The region with this index, if this server serves it.
    pub fn region(&self, index: RegionIndex) -> Option<&ServedRegion> {
        self.regions.get(index.0 as usize).and_then(Option::as_ref)
    }
}

/// The window digest of a COMPARE_SWAP (opcode 0x13) or FETCH_ADD (0x14)
/// on `offset` of region `region`. A FETCH_ADD's compare field means
/// nothing: a retry may carry another one (a RoCE atomic retried over TCP),
/// so it is left out.
fn atomic_digest(
    opcode: u8,
    region: u32,
    offset: u64,
    compare: u64,
    operand: u64,
) -> RequestDigest {
    let compare = match Opcode::from(opcode) {
        Opcode::CompareSwap => compare,
        _ => 0,
    };
    RequestDigest::of(opcode, region, offset, compare, operand)
}

/// Appends `message` as a frame; messages built here always fit a frame.
fn encode(message: &Message<'_>, tag: u64, out: &mut Vec<u8>) {
    if message.encode_into(tag, out).is_err() {
        out.extend_from_slice(&proto::error_reply(message.opcode(), tag, Status::IoError));
    }
}
