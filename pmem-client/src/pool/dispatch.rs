//! Sending pieces: translation, path choice, attempts and failover, and
//! the prober that brings paths back.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use proto::request::{Operation, Target};
use proto::{AccessKey, Status, request};
use tokio::sync::Notify;
use topology::{MetaLayout, PmemAddr, RegionIndex, RnicTransport, VirtAddr};

use crate::conn::{self, Response};
use crate::error::{Address, NoPathToOwner, OwnerNotFound, PoolError, Reason, Tried, TriedPath};
use crate::link::{Carriage, PathLink};
use crate::paths::{Attempts, Failure, GiveUpReason, Next, PathId, Probe};
use crate::records;
use crate::translate::Translation;

#[cfg(feature = "verbs")]
use super::new_session;
use super::{Backing, Inner, MAX_PIECE, Piece, Spec, lock};

/// Longest wait for a timed-out path's queue pair to be destroyed before
/// its request is tried elsewhere.
const FENCE_LIMIT: Duration = Duration::from_millis(500);

impl Inner {
    pub(super) fn path_name(&self, path: PathId) -> String {
        let table = lock(&self.table);
        table.paths().get(path.0).map_or_else(
            || format!("#{}", path.0),
            |p| format!("{} -> {}", p.rnic, p.device),
        )
    }

    pub(super) fn server_name(&self, region: RegionIndex) -> String {
        self.epoch()
            .layout
            .entry(region)
            .map_or_else(|| "?".to_owned(), |e| e.server.to_string())
    }

    /// (Re)connects `path` and installs the connection.
    pub(super) async fn connect_path(
        self: &Arc<Self>,
        path: PathId,
    ) -> Result<(), conn::ConnectError> {
        let info = lock(&self.table).paths()[path.0].clone();
        let epoch = self.epoch();
        let Some(slot) = epoch.slots.get(path.0).cloned() else {
            return Err(conn::ConnectError::Protocol {
                addr: info.device_addr.clone(),
                what: format!("{path} is not in map epoch {}", epoch.number),
            });
        };
        let generation = lock(&slot).generation + 1;
        let weak = Arc::downgrade(self);
        let on_lost = Box::new(move || {
            if let Some(inner) = weak.upgrade() {
                inner.connection_lost(path, generation);
            }
        });
        let link = match info.transport {
            RnicTransport::Tcp => PathLink::Tcp(self.open_tcp(&info, on_lost).await?),
            RnicTransport::Roce => self.connect_roce(&info, on_lost).await?,
        };
        let mut slot = lock(&slot);
        slot.generation = generation;
        slot.conn = Some(Arc::new(link));
        Ok(())
    }

    /// Opens the device protocol over TCP from `info`'s RNIC to its device
    /// (saying the pool's map epoch when it follows the map) and learns
    /// the region keys the device's MAP gives. A device on a newer epoch
    /// makes the pool catch up (the next attempt opens on that epoch).
    async fn open_tcp(
        &self,
        info: &crate::paths::PathInfo,
        on_lost: Box<dyn FnOnce() + Send>,
    ) -> Result<conn::PathConn, conn::ConnectError> {
        let epoch = self.epoch();
        let view = conn::MapView {
            digest: epoch.layout.digest(),
            epoch: self.etcd.is_some().then_some(epoch.number),
        };
        let opened = conn::connect(
            &info.device_addr,
            info.local_addr.as_deref(),
            self.client.as_str(),
            self.key.clone(),
            view,
            self.options.connect_timeout,
            on_lost,
        )
        .await;
        let (conn, map) = match opened {
            Ok(opened) => opened,
            Err(e @ conn::ConnectError::NewerMap { theirs, .. }) => {
                self.ensure_epoch(theirs).await;
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        epoch.region_keys.learn(&map);
        Ok(conn)
    }

    /// Sets up a RoCE path: control connection and queue pair, numbering
    /// its atomics on lane `path + 1` from above anything an earlier queue
    /// pair of the path numbered.
    #[cfg(feature = "verbs")]
    pub(super) async fn connect_roce(
        &self,
        info: &crate::paths::PathInfo,
        on_lost: Box<dyn FnOnce() + Send>,
    ) -> Result<PathLink, conn::ConnectError> {
        use crate::verbs::link::{LinkConfig, VerbsLink};
        let bad_address = || conn::ConnectError::RoceAddress {
            addr: info.device_addr.clone(),
            rnic: info.rnic.to_string(),
            local: info.local_addr.clone(),
        };
        let local_ip = info
            .local_addr
            .as_deref()
            .and_then(|a| a.parse().ok())
            .ok_or_else(bad_address)?;
        let addr = info
            .device_addr
            .parse()
            .map_err(|_| conn::ConnectError::BadAddress(info.device_addr.clone()))?;
        let lane = u8::try_from(info.id.0 + 1).map_err(|_| bad_address())?;
        // Every queue pair numbers its atomics in a session of its own.
        let first = new_session();
        let config = LinkConfig {
            addr,
            client: self.client.to_string(),
            digest: self.epoch().layout.digest(),
            layout: topology::Layout::clone(&self.epoch().layout),
            timeout: self.options.connect_timeout,
            rdma_device: info.rdma_device.clone(),
            key: self.key.clone(),
            local_ip,
            atomics: proto::qp::AtomicSeq { lane, first },
            map_epoch: if self.etcd.is_some() {
                self.epoch().number
            } else {
                0
            },
        };
        let opened = tokio::task::spawn_blocking(move || VerbsLink::open(config, on_lost))
            .await
            .map_err(|e| conn::ConnectError::Protocol {
                addr: info.device_addr.clone(),
                what: format!("verbs set-up task: {e}"),
            })?;
        let link = match opened {
            Ok(link) => link,
            // The device runs a newer map: catch up, and the next attempt
            // sets the queue pair up at that epoch.
            Err(e @ conn::ConnectError::NewerMap { theirs, .. }) => {
                self.ensure_epoch(theirs).await;
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        // Requests that go over the control connection (WRITE_PERSIST,
        // FLUSH, ATOMIC_WRITE, atomics asked again) carry region keys.
        self.epoch().region_keys.learn(&link.map);
        Ok(PathLink::Verbs(link))
    }

    /// Without the `verbs` feature a RoCE path cannot be set up.
    #[cfg(not(feature = "verbs"))]
    pub(super) async fn connect_roce(
        &self,
        info: &crate::paths::PathInfo,
        _on_lost: Box<dyn FnOnce() + Send>,
    ) -> Result<PathLink, conn::ConnectError> {
        Err(conn::ConnectError::NoVerbs {
            addr: info.device_addr.clone(),
            rnic: info.rnic.to_string(),
        })
    }

    /// A connection died: the path is down until the prober brings it back.
    pub(super) fn connection_lost(&self, path: PathId, generation: u64) {
        {
            let Some(slot) = self.slot(path) else { return };
            let mut slot = lock(&slot);
            if slot.generation != generation {
                return;
            }
            slot.conn = None;
        }
        lock(&self.table).report_failure(path, 0, Failure::ConnectionLost, Instant::now());
        self.prober.notify_one();
    }

    pub(super) async fn translate(&self, vaddr: VirtAddr) -> Result<Translation, PoolError> {
        let epoch = self.epoch();
        match &epoch.translator {
            Backing::Fixed(translator) => self
                .tlb
                .translate(translator.as_ref(), vaddr)
                .map_err(|_| PoolError::Unmapped { at: vaddr.into() }),
            Backing::PageTable(meta) => {
                if let Some(t) = self.tlb.get(vaddr) {
                    return Ok(t);
                }
                let t = self.walk(meta, vaddr).await?;
                self.tlb.insert(t);
                Ok(t)
            }
        }
    }

    /// Reads `vaddr`'s page-table entry: its translation, or why it has none.
    pub(super) async fn walk(
        &self,
        meta: &MetaLayout,
        vaddr: VirtAddr,
    ) -> Result<Translation, PoolError> {
        let unmapped = PoolError::Unmapped { at: vaddr.into() };
        let index = records::vextent_of(meta, vaddr).ok_or(unmapped)?;
        let table = meta.meta_region();
        let at = meta.page_table_entry(index);
        let bytes = self
            .raw(
                at,
                table.key,
                Spec::plain(Operation::Read, records::PT_ENTRY_LEN as u32),
            )
            .await?
            .data;
        let entry =
            records::PtEntry::decode(&bytes).ok_or(PoolError::Unmapped { at: vaddr.into() })?;
        match entry.control.state {
            records::EntryState::Live => {
                let pmem = PmemAddr(entry.pmem);
                let region = self
                    .epoch()
                    .layout
                    .lookup(pmem)
                    .map(|at| at.offset.region)
                    .ok_or(PoolError::Unmapped { at: vaddr.into() })?;
                Ok(Translation {
                    vbase: records::vbase_of(meta, index),
                    len: meta.extent_size(),
                    pmem,
                    key: entry.key,
                    region,
                })
            }
            records::EntryState::Free | records::EntryState::Freeing
                if entry.control.generation > 0 =>
            {
                Err(PoolError::UseAfterFree { at: vaddr.into() })
            }
            _ => Err(PoolError::Unmapped { at: vaddr.into() }),
        }
    }

    /// Sends one request addressed by PMEM address and key (the allocator's
    /// metadata accesses), failing over like any other; a status other than
    /// OK becomes an error.
    pub(super) async fn raw(
        &self,
        pmem: PmemAddr,
        key: AccessKey,
        spec: Spec<'_>,
    ) -> Result<Response, PoolError> {
        let at = Address::Pmem(pmem);
        let region = self
            .epoch()
            .layout
            .lookup(pmem)
            .map(|at| at.offset.region)
            .ok_or(PoolError::Unmapped { at })?;
        let piece = Piece {
            at,
            pmem,
            len: u64::from(spec.length),
            key,
            region,
        };
        let response = self.send_keyed(piece, spec).await?;
        match response.status {
            Status::Ok => Ok(response),
            status => Err(self.status_error(piece, status)),
        }
    }

    /// Sends one piece with failover; when a server refuses the region key
    /// the piece carried (rotated meanwhile), learns the keys again and
    /// sends it once more with the new key.
    async fn send_keyed(&self, piece: Piece, spec: Spec<'_>) -> Result<Response, PoolError> {
        // The region key the request goes with, to tell a refresh by
        // another request from none (only a piece without its own key
        // takes the region's).
        let sent_with = if piece.key == AccessKey::NONE {
            self.epoch().region_keys.get(piece.region)
        } else {
            AccessKey::NONE
        };
        let response = self.send_with_failover(piece, spec).await?;
        if response.status == Status::AccessDenied
            && piece.key == AccessKey::NONE
            && self.refresh_keys(piece.region, sent_with).await
        {
            return self.send_with_failover(piece, spec).await;
        }
        Ok(response)
    }

    /// Asks the fabric devices for the client's MAP again, each in turn, a
    /// few times while `region`'s key stays `old`; true when the key
    /// changed. A device learns a rotated key from its server right after
    /// the server refused the old one; and when a map moves a region to a
    /// server of its own key (a drain), a device that applied that map
    /// knows the new key while another may not have applied it yet, so
    /// every device is asked, not only the first that answers.
    /// Rate-limited per region: while another request refreshes (or did a
    /// moment ago), this one waits as long for the key to change instead,
    /// so that requests refused together all go again.
    async fn refresh_keys(&self, region: RegionIndex, old: AccessKey) -> bool {
        const TRIES: u32 = 10;
        const PAUSE: Duration = Duration::from_millis(30);
        // The current epoch's keys each time: the client may follow a new
        // map meanwhile, which carries the keys over and learns new ones.
        let changed = || self.epoch().region_keys.get(region) != old;
        if !self.epoch().region_keys.may_refresh(region, Instant::now()) {
            for _ in 0..TRIES {
                if changed() {
                    return true;
                }
                tokio::time::sleep(PAUSE).await;
            }
            return changed();
        }
        // Every device port speaks the opening, RoCE ports' control
        // connections included.
        let devices: Vec<_> = lock(&self.table).paths().to_vec();
        for attempt in 0..TRIES {
            if attempt > 0 {
                tokio::time::sleep(PAUSE).await;
            }
            for path in &devices {
                if self.open_tcp(path, Box::new(|| {})).await.is_ok() && changed() {
                    self.stats.key_refreshes.fetch_add(1, Ordering::Relaxed);
                    return true;
                }
            }
        }
        false
    }

    /// The error for a final non-OK status of `piece`.
    pub(super) fn status_error(&self, piece: Piece, status: Status) -> PoolError {
        let at = piece.at;
        match status {
            Status::AccessDenied => PoolError::AccessDenied { at },
            Status::Unmapped => PoolError::Unmapped { at },
            Status::OutOfBounds => PoolError::OutOfBounds { at, len: piece.len },
            status => PoolError::Rejected {
                at,
                server: self.server_name(piece.region),
                status,
            },
        }
    }

    pub(super) fn install(&self, t: Translation) {
        self.tlb.insert(t);
    }

    pub(super) fn invalidate(&self, vaddr: VirtAddr) {
        self.tlb.invalidate(vaddr);
    }

    /// Splits `[vaddr, vaddr + len)` into PMEM pieces: one per run of
    /// extents contiguous in PMEM with the same key, at most [`MAX_PIECE`].
    pub(super) async fn plan(&self, vaddr: VirtAddr, len: u64) -> Result<Vec<Piece>, PoolError> {
        let end = vaddr.get().checked_add(len).ok_or(PoolError::OutOfBounds {
            at: vaddr.into(),
            len,
        })?;
        let mut pieces: Vec<Piece> = Vec::new();
        let mut at = vaddr.get();
        while at < end {
            let t = self.translate(VirtAddr(at)).await?;
            let take = t.remaining(VirtAddr(at)).min(end - at);
            let pmem = t.pmem_of(VirtAddr(at));
            match pieces.last_mut() {
                Some(last)
                    if last.region == t.region
                        && last.key == t.key
                        && last.pmem.get() + last.len == pmem.get()
                        && last.len + take <= MAX_PIECE =>
                {
                    last.len += take;
                }
                _ => pieces.push(Piece {
                    at: Address::Virtual(VirtAddr(at)),
                    pmem,
                    len: take,
                    key: t.key,
                    region: t.region,
                }),
            }
            at += take;
        }
        if pieces.is_empty() {
            // A zero-length access still names one address.
            let t = self.translate(vaddr).await?;
            pieces.push(Piece {
                at: vaddr.into(),
                pmem: t.pmem_of(vaddr),
                len: 0,
                key: t.key,
                region: t.region,
            });
        }
        Ok(pieces)
    }

    /// Sends one piece, failing over between paths, and maps the final
    /// status to an error. A stale translation (ACCESS_DENIED, UNMAPPED) is
    /// refilled once.
    pub(super) async fn send_piece(
        &self,
        piece: Piece,
        spec: Spec<'_>,
    ) -> Result<Response, PoolError> {
        let response = self.send_keyed(piece, spec).await?;
        let status = match response.status {
            Status::Ok => return Ok(response),
            status @ (Status::AccessDenied | Status::Unmapped) => {
                let Address::Virtual(vaddr) = piece.at else {
                    return Err(self.status_error(piece, status));
                };
                self.tlb.invalidate(vaddr);
                let fresh = self.translate(vaddr).await?;
                if fresh.pmem_of(vaddr) != piece.pmem || fresh.key != piece.key {
                    let piece = Piece {
                        pmem: fresh.pmem_of(vaddr),
                        key: fresh.key,
                        region: fresh.region,
                        ..piece
                    };
                    let retried = self.send_with_failover(piece, spec).await?;
                    if retried.status == Status::Ok {
                        return Ok(retried);
                    }
                    retried.status
                } else {
                    status
                }
            }
            status => status,
        };
        Err(self.status_error(piece, status))
    }

    /// Sends one request on the best path, and again on others while paths
    /// fail, until an answer other than SERVER_UNAVAILABLE comes back or no
    /// path is left.
    pub(super) async fn send_with_failover(
        &self,
        piece: Piece,
        spec: Spec<'_>,
    ) -> Result<Response, PoolError> {
        let _permit = self.depth.acquire().await.map_err(|_| PoolError::Closed)?;
        // The region as the running epoch numbers it (found by address,
        // which no epoch moves), its server and key; again after the pool
        // moves to a newer epoch.
        let (mut epoch_number, mut region, mut server, mut key) = self.placement(&piece)?;
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let mut repr = request::Repr {
            operation: spec.operation,
            target: Target::Pmem(piece.pmem),
            key,
            length: spec.length,
            exactly_once: None,
            on_behalf: None,
            persist: spec.persist,
            non_temporal: spec.non_temporal,
            operand: spec.operand,
            compare: spec.compare,
            payload: spec.payload,
        };
        if spec.exactly_once {
            repr = repr.with_exactly_once(0, seq);
        }
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let mut attempts = Attempts::new(region, Instant::now());
        let mut first_path = None;
        // Whether an earlier attempt may have run the request.
        let mut again = false;
        loop {
            if self.epoch().number != epoch_number {
                (epoch_number, region, server, key) = self.placement(&piece)?;
                repr.key = key;
                attempts.renumber(region);
            }
            let now = Instant::now();
            let next = attempts.next(&lock(&self.table), now);
            let path = match next {
                Next::Send(path) => path,
                Next::GiveUp(give_up)
                    if give_up.reason != GiveUpReason::Deadline
                        && (!server_is_down(&give_up.tried)
                            || lock(&self.table).owner_of(attempts.region()).is_some()) =>
                {
                    // Every path is down or failed for now: wait for one to
                    // come back (the prober restores them) or for a new map
                    // until the operation's deadline. A replicated region
                    // whose owner has no copy to decide on now waits too:
                    // the map may soon make another copy serve (the owner
                    // moves the role off a server that died with the
                    // previous owner), or the server comes back.
                    let op_deadline = attempts.op_deadline(&lock(&self.table));
                    self.wait_for_path_or_map(op_deadline).await;
                    continue;
                }
                Next::GiveUp(give_up) => {
                    let tried = {
                        let table = lock(&self.table);
                        give_up
                            .tried
                            .iter()
                            .map(|&(p, failure)| {
                                let info = &table.paths()[p.0];
                                TriedPath {
                                    rnic: info.rnic.to_string(),
                                    device: info.device.to_string(),
                                    failure,
                                }
                            })
                            .collect()
                    };
                    return Err(PoolError::NoPath {
                        at: piece.at,
                        server: self.server_name(piece.region),
                        reason: Reason(give_up.reason),
                        tried: Tried(tried),
                    });
                }
            };
            match first_path {
                None => first_path = Some(path),
                Some(_) => {
                    self.stats.retries.fetch_add(1, Ordering::Relaxed);
                }
            }
            let deadline = attempts.attempt_deadline(&lock(&self.table), now);
            let (outcome, identity) = self.attempt(path, region, &repr, again, deadline).await;
            again = spec.exactly_once;
            if let Some(identity) = identity {
                // It went as an RDMA atomic the device numbered: that
                // number is the one a server may have recorded.
                repr.exactly_once = Some(identity);
            }
            let now = Instant::now();
            match outcome {
                Ok((response, _)) if response.status == Status::StaleMap => {
                    self.stale_map(&mut attempts, path, server, response.value)
                        .await;
                }
                Ok((response, _)) if response.status == Status::NotOwner => {
                    self.not_owner(&mut attempts, path, server, piece, response.value)
                        .await?;
                }
                Ok((response, _))
                    if {
                        let table = lock(&self.table);
                        let region = attempts.region();
                        refusal_in_disguise(
                            response.status,
                            table.owner_of(region).is_some(),
                            table.via_owner(region, path),
                        )
                    } =>
                {
                    self.not_owner(&mut attempts, path, server, piece, 0)
                        .await?;
                }
                Ok((response, current)) if !server_unreachable(response.status) => {
                    if current {
                        lock(&self.table).report_success(path, server, now);
                    }
                    if first_path != Some(path) {
                        self.stats.failovers.fetch_add(1, Ordering::Relaxed);
                    }
                    return Ok(response);
                }
                Ok(_) => self.attempt_failed(
                    &mut attempts,
                    path,
                    server,
                    Failure::ServerUnavailable,
                    now,
                ),
                Err(failure) => self.attempt_failed(&mut attempts, path, server, failure, now),
            }
        }
    }

    /// The running epoch's view of `piece`: the epoch, the region holding
    /// the piece's address, its server and the key to send.
    fn placement(&self, piece: &Piece) -> Result<(u64, RegionIndex, u16, AccessKey), PoolError> {
        let epoch = self.epoch();
        let region = epoch
            .layout
            .lookup(piece.pmem)
            .map(|at| at.offset.region)
            .ok_or(PoolError::Unmapped { at: piece.at })?;
        let server = lock(&self.table).server_of(region).unwrap_or_default();
        let key = epoch.region_keys.resolve(region, piece.key);
        Ok((epoch.number, region, server, key))
    }

    /// A device answered STALE_MAP, carrying its epoch `theirs`: nothing
    /// ran. A newer epoch is fetched (the request is then placed on it);
    /// on the same epoch the connection had said an older one and is told
    /// the current one; an older epoch means the device is behind, and the
    /// request goes to another path or waits for this one to catch up.
    async fn stale_map(&self, attempts: &mut Attempts, path: PathId, server: u16, theirs: u64) {
        match StaleMap::of(self.epoch().number, theirs) {
            StaleMap::CatchUp => {
                self.stats.stale_newer.fetch_add(1, Ordering::Relaxed);
                self.ensure_epoch(theirs).await;
            }
            StaleMap::SayAgain => {}
            StaleMap::Behind => {
                self.stats.stale_behind.fetch_add(1, Ordering::Relaxed);
                self.attempt_failed(attempts, path, server, Failure::Behind, Instant::now());
                return;
            }
        }
        if self.say_epoch_on(path).await.is_none() {
            self.attempt_failed(
                attempts,
                path,
                server,
                Failure::ConnectionLost,
                Instant::now(),
            );
        }
    }

    /// A device answered NOT_OWNER for a replicated region (`theirs`: the
    /// epoch it runs, 0 when it did not say): nothing ran. When the device
    /// is the owner by the client's map and does not run an older map than
    /// the client, the client's map is behind: a newer epoch is fetched
    /// (on etcd) before the next attempt, and [`MAX_NOT_OWNER`] such
    /// answers end the request with an error. When another device answered
    /// (the owner's paths were down or behind on the map), or the owner by
    /// the client's map has not applied that map yet (it took the region
    /// over and its watch is a moment behind the client's), the request
    /// waits briefly for an owner path to come back (the prober restores
    /// it) or a new map (another device took the region over from a dead
    /// owner) before the next attempt, until the operation's deadline; the
    /// next attempt keeps the request's exactly-once identity. An error at
    /// once when the client has no path to the owner at all.
    async fn not_owner(
        &self,
        attempts: &mut Attempts,
        path: PathId,
        server: u16,
        piece: Piece,
        theirs: u64,
    ) -> Result<(), PoolError> {
        let region = attempts.region();
        let ours = self.epoch().number;
        let behind_us = theirs != 0 && theirs < ours;
        let was_owner = lock(&self.table).via_owner(region, path) && !behind_us;
        let failure = if was_owner {
            Failure::NotOwner
        } else {
            Failure::OwnerAway
        };
        self.attempt_failed(attempts, path, server, failure, Instant::now());
        if was_owner {
            self.ensure_epoch(theirs.max(ours + 1)).await;
        }
        let op_deadline = {
            let table = lock(&self.table);
            let region = attempts.region();
            let region_name = table
                .region_id(region)
                .map_or_else(|| format!("#{}", region.0), ToString::to_string);
            let owner = table.owner_of(region).map(ToString::to_string);
            let Some(owner) = owner else {
                // The map says the region has one copy now: any path serves it.
                return Ok(());
            };
            if !table.reaches_owner(region) {
                let mut devices: Vec<String> = table
                    .paths()
                    .iter()
                    .filter(|p| !table.is_retired(p.id))
                    .map(|p| p.device.to_string())
                    .collect();
                devices.sort();
                devices.dedup();
                return Err(PoolError::NoPathToOwner(Box::new(NoPathToOwner {
                    at: piece.at,
                    region: region_name,
                    owner,
                    client: self.client.to_string(),
                    devices: devices.join(", "),
                })));
            }
            let times = not_owner_answers(attempts.tried());
            if times >= MAX_NOT_OWNER {
                let tried = attempts
                    .tried()
                    .iter()
                    .map(|&(p, failure)| {
                        let info = &table.paths()[p.0];
                        TriedPath {
                            rnic: info.rnic.to_string(),
                            device: info.device.to_string(),
                            failure,
                        }
                    })
                    .collect();
                return Err(PoolError::OwnerNotFound(Box::new(OwnerNotFound {
                    at: piece.at,
                    region: region_name,
                    owner,
                    epoch: self.epoch().number,
                    times,
                    tried: Tried(tried),
                })));
            }
            attempts.op_deadline(&table)
        };
        if !was_owner {
            self.wait_for_path_or_map(op_deadline).await;
        }
        Ok(())
    }

    /// Waits until a path is restored or a new map applied, one probe
    /// interval at most, and never past `op_deadline`.
    async fn wait_for_path_or_map(&self, op_deadline: Instant) {
        let recheck = Instant::now() + self.options.paths.probe_interval;
        let restored = self.restored.notified();
        let applied = self.applied.notified();
        let woken = async {
            tokio::select! {
                () = restored => {}
                () = applied => {}
            }
        };
        let _ = tokio::time::timeout_at(recheck.min(op_deadline).into(), woken).await;
    }

    pub(super) fn attempt_failed(
        &self,
        attempts: &mut Attempts,
        path: PathId,
        server: u16,
        failure: Failure,
        now: Instant,
    ) {
        attempts.failed(path, failure);
        lock(&self.table).report_failure(path, server, failure, now);
        if failure == Failure::Timeout {
            // A path that stops answering is reconnected by the prober.
            if let Some(slot) = self.slot(path) {
                lock(&slot).conn = None;
            }
        }
        self.prober.notify_one();
    }

    /// Whether `conn` is still `path`'s connection (not replaced or dropped
    /// since an attempt started on it).
    pub(super) fn is_current(&self, path: PathId, conn: &Arc<PathLink>) -> bool {
        self.conn(path).is_some_and(|c| Arc::ptr_eq(&c, conn))
    }

    /// One attempt on one path (`again`: an earlier attempt may have run
    /// the request): the response, and whether the connection it came on is
    /// still the path's; with it, the exactly-once identity the request got
    /// on the way when it differs from the one it was sent with.
    pub(super) async fn attempt(
        &self,
        path: PathId,
        region: RegionIndex,
        repr: &request::Repr<'_>,
        again: bool,
        deadline: Instant,
    ) -> (
        Result<(Response, bool), Failure>,
        Option<request::ExactlyOnce>,
    ) {
        let Some(conn) = self.conn(path) else {
            return (Err(Failure::ConnectionLost), None);
        };
        let carriage = {
            let mut table = lock(&self.table);
            table.started(path);
            Carriage {
                again,
                to_non_owner: table.owner_of(region).is_some() && !table.via_owner(region, path),
            }
        };
        let mut identity = None;
        let result = match conn.send(repr, carriage) {
            Err(conn::Lost) => Err(Failure::ConnectionLost),
            Ok(mut sent) => {
                let reply = &mut sent.reply;
                let result = match tokio::time::timeout_at(deadline.into(), reply).await {
                    Ok(Ok(response)) => Ok(response),
                    Ok(Err(_)) => Err(Failure::ConnectionLost),
                    Err(_) => {
                        conn.cancel(&sent);
                        conn.fence(FENCE_LIMIT).await;
                        Err(Failure::Timeout)
                    }
                };
                identity = sent.identity();
                result
            }
        };
        lock(&self.table).finished(path);
        // An answer on a connection given up on meanwhile is good data but
        // says nothing about the path's current health.
        let current = self.is_current(path, &conn);
        (result.map(|response| (response, current)), identity)
    }

    /// One probe: reconnect a path, or ask a server through it.
    pub(super) async fn probe(self: Arc<Self>, probe: Probe) {
        let now = Instant::now();
        match probe.server {
            None => match self.connect_path(probe.path).await {
                Ok(()) => {
                    self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
                    lock(&self.table).path_restored(probe.path, Instant::now());
                    self.restored.notify_waiters();
                }
                Err(_) => lock(&self.table).probe_failed(probe, Instant::now()),
            },
            Some(server) => {
                let epoch = self.epoch();
                let Some(entry) = epoch
                    .layout
                    .entries()
                    .iter()
                    .find(|e| e.server_index == server)
                else {
                    return;
                };
                let key = epoch.region_keys.resolve(entry.region, entry.key);
                let repr = request::Repr::read(Target::Pmem(entry.start), key, 0);
                let deadline = now + self.options.paths.attempt_timeout;
                match self
                    .attempt(probe.path, entry.region, &repr, false, deadline)
                    .await
                    .0
                {
                    // A device behind on the map is not back yet; one that
                    // says the connection's epoch is old is told the
                    // current one and asked again at the next probe.
                    Ok((r, _)) if r.status == Status::StaleMap => {
                        if r.value >= epoch.number {
                            self.say_epoch_on(probe.path).await;
                        }
                        lock(&self.table).probe_failed(probe, Instant::now());
                    }
                    Ok((r, true)) if !server_unreachable(r.status) => {
                        lock(&self.table).report_success(probe.path, server, Instant::now());
                        self.restored.notify_waiters();
                    }
                    _ => lock(&self.table).probe_failed(probe, Instant::now()),
                }
            }
        }
    }
}

/// What a STALE_MAP answer (nothing ran) asks of the client; the request
/// is sent again in every case, with the same identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StaleMap {
    /// The device runs a newer epoch: bring the map up to it, tell the
    /// connection, send again.
    CatchUp,
    /// The device runs the client's epoch and the connection had said an
    /// older one: tell the connection the current one, send again.
    SayAgain,
    /// The device runs an older epoch: it is behind its own watch; send
    /// on another path, or on this one once it has caught up.
    Behind,
}

impl StaleMap {
    /// The answer to STALE_MAP carrying `theirs` to a client on `ours`.
    pub(super) fn of(ours: u64, theirs: u64) -> Self {
        match theirs.cmp(&ours) {
            std::cmp::Ordering::Greater => StaleMap::CatchUp,
            std::cmp::Ordering::Equal => StaleMap::SayAgain,
            std::cmp::Ordering::Less => StaleMap::Behind,
        }
    }
}

/// How many NOT_OWNER answers from the owner's own paths (by the client's
/// map) one request takes before it fails: enough for a stale map to be
/// refreshed and the new owner tried.
pub(super) const MAX_NOT_OWNER: usize = 4;

/// How many of the failed attempts `tried` were NOT_OWNER answers of the
/// owner by the client's map when they came ([`Failure::NotOwner`]);
/// another device's while the owner's paths were down
/// ([`Failure::OwnerAway`]) do not count, even once a new map makes that
/// device the owner.
pub(super) fn not_owner_answers(tried: &[(PathId, Failure)]) -> usize {
    tried
        .iter()
        .filter(|&&(_, f)| f == Failure::NotOwner)
        .count()
}

/// Whether a device's answer says it could not reach the server: it has no
/// live link to it (SERVER_UNAVAILABLE) or its link stopped answering
/// (TIMEOUT). Another device may still reach it.
pub(super) fn server_unreachable(status: Status) -> bool {
    matches!(status, Status::ServerUnavailable | Status::Timeout)
}

/// Whether SERVER_UNAVAILABLE for a replicated region (`replicated`)
/// from a device that is not its owner (`via_owner` false) is that
/// device's NOT_OWNER: a device that does not own a replicated region
/// forwards none of its requests, so it never finds its servers
/// unavailable, but over RDMA its refusal reaches the client as a NAK
/// (remote operational error), which the verbs path reports as
/// SERVER_UNAVAILABLE. Taken as NOT_OWNER, the request waits for the
/// owner's path instead of failing.
pub(super) fn refusal_in_disguise(status: Status, replicated: bool, via_owner: bool) -> bool {
    status == Status::ServerUnavailable && replicated && !via_owner
}

/// Whether every path that was tried reported the server itself
/// unavailable: the server is down, not a path. That is reported at once
/// (requests in flight on a dead server fail visibly) instead of being
/// waited out like a path outage.
pub(super) fn server_is_down(tried: &[(PathId, Failure)]) -> bool {
    !tried.is_empty() && tried.iter().all(|(_, f)| *f == Failure::ServerUnavailable)
}

/// Runs due probes until the pool is dropped.
pub(super) async fn probe_loop(pool: Weak<Inner>, wake: Arc<Notify>) {
    loop {
        let next = {
            let Some(inner) = pool.upgrade() else {
                return;
            };
            let now = Instant::now();
            let (due, next) = {
                let mut table = lock(&inner.table);
                (table.probes_due(now), table.poll_timeout())
            };
            for probe in due {
                tokio::spawn(Arc::clone(&inner).probe(probe));
            }
            next.unwrap_or(now + Duration::from_secs(1))
        };
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep_until(next.into()) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_map_catches_up_says_the_epoch_again_or_waits_for_the_device() {
        assert_eq!(StaleMap::of(3, 4), StaleMap::CatchUp);
        assert_eq!(StaleMap::of(3, 3), StaleMap::SayAgain);
        assert_eq!(StaleMap::of(3, 2), StaleMap::Behind);
        assert_eq!(
            StaleMap::of(0, 1),
            StaleMap::CatchUp,
            "a file client met a fence"
        );
    }

    #[test]
    fn a_device_behind_is_not_a_server_down() {
        let p = PathId(0);
        assert!(!server_is_down(&[(p, Failure::Behind)]));
        assert!(!server_is_down(&[
            (p, Failure::ServerUnavailable),
            (PathId(1), Failure::Behind)
        ]));
        assert!(server_is_down(&[(p, Failure::ServerUnavailable)]));
    }

    #[test]
    fn not_owner_answers_are_counted_and_say_no_server_is_down() {
        let (p, q) = (PathId(0), PathId(1));
        let tried = [
            (p, Failure::NotOwner),
            (q, Failure::ConnectionLost),
            (p, Failure::NotOwner),
        ];
        assert_eq!(not_owner_answers(&tried), 2);
        // Another device's NOT_OWNER (the owner's paths were down) does
        // not count, even when that device owns the region by a later map
        // (it took the region over): the request waits for the new map.
        let away = [
            (q, Failure::OwnerAway),
            (q, Failure::OwnerAway),
            (q, Failure::NotOwner),
        ];
        assert_eq!(not_owner_answers(&away), 1);
        assert!(!server_is_down(&[(q, Failure::OwnerAway)]));
        assert!(!server_is_down(&[(p, Failure::NotOwner)]));
        assert!(!server_unreachable(Status::NotOwner));
    }

    #[test]
    fn server_unavailable_from_a_device_that_does_not_own_a_replicated_region_is_its_refusal() {
        assert!(refusal_in_disguise(Status::ServerUnavailable, true, false));
        // From the owner it is the copies' loss; for a region kept once
        // any device forwards it; a timeout is not a refusal.
        assert!(!refusal_in_disguise(Status::ServerUnavailable, true, true));
        assert!(!refusal_in_disguise(
            Status::ServerUnavailable,
            false,
            false
        ));
        assert!(!refusal_in_disguise(Status::Timeout, true, false));
    }
}
