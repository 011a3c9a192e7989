//! The owner's resync of a `syncing` copy of a replicated region.
//!
//! The walk asks the deciding copy's server and the syncing copy's server
//! for the checksums of the same run of blocks (BLOCK_SUMS, on each copy's
//! write link, so each answer follows every mutation queued before it).
//! Each block that differs is held (overlapping requests wait), READ from
//! the deciding copy, written with WRITE_PERSIST to the syncing copy on its
//! write link, and released once that write is queued: later mutations
//! follow it on the same ordered connection. Blocks are copied one at a
//! time, as fast as the device's token bucket lets them. After a pass that
//! found nothing to copy, and once every copy's write is answered, the copy
//! is marked `serving` (by the driver: in etcd, or locally with a file)
//! and reads may use it. A block a mutation in flight overlaps, with a
//! part to send again after STALE_MAP (or one sent under an older epoch),
//! is copied only once that part went: the READ then follows it.
//!
//! A copy whose server opens a link again while the copy is `offline`
//! (the server restarted, or its power came back) is marked `syncing`
//! first, and its resync begins with the exactly-once records it missed
//! (`records`). A resync's request refused STALE_MAP goes again once the
//! server confirms the device's epoch (`refused`), and the resync goes on
//! from there. A resync whose copy or source is lost, or whose request
//! fails, releases its hold and starts again later from the first block.

use std::collections::HashMap;
use std::time::Duration;

use proto::block_sums;

use super::missed::Missed;
use super::*;
use crate::resync::rate::{DEFAULT_RATE, TokenBucket};
use crate::resync::walk::Walk;

mod answers;
mod records;
mod refused;

#[cfg(test)]
pub(in crate::forward) use records::RECORDS_IN_FLIGHT;

use refused::StaleWait;

/// Bytes per block: the servers' checksum block.
pub(crate) const BLOCK_LEN: u64 = 64 << 10;
/// Blocks per BLOCK_SUMS: a server reads 4 MiB to answer one, so requests
/// behind it on the same connection wait for no more than that.
const RUN_BLOCKS: u32 = 64;
/// How long a resync that stopped, or cannot start, waits before trying
/// again.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// The connection id of the resync's own requests: no client has it.
const RESYNC_CONN: ConnId = ConnId::MAX;

/// The owner's resyncs, and the copies it is bringing back.
#[derive(Debug)]
pub(super) struct Resyncs {
    /// Bytes per second the copies may move, all resyncs together.
    rate: u64,
    bucket: Option<TokenBucket>,
    runs: Vec<Sync>,
    next_id: u64,
    /// Offline copies (region, server) whose server opened a link again:
    /// to be marked `syncing`.
    returned: Vec<(u32, ServerId)>,
    /// Copies the driver is marking.
    marking: Vec<(u32, ServerId)>,
    /// Copies whose resync stopped or waits: not tried again before then.
    not_before: HashMap<(u32, ServerId), Instant>,
    /// Copies whose wait was logged (once, until their resync starts).
    waiting_logged: Vec<(u32, ServerId)>,
    /// Write links to sources whose servers have not confirmed the epoch
    /// of this device's ownership: MAP_EPOCH is said on them again.
    to_confirm: Vec<LinkId>,
}

impl Default for Resyncs {
    fn default() -> Self {
        Self {
            rate: DEFAULT_RATE,
            bucket: None,
            runs: Vec::new(),
            next_id: 1,
            returned: Vec::new(),
            marking: Vec::new(),
            not_before: HashMap::new(),
            waiting_logged: Vec::new(),
            to_confirm: Vec::new(),
        }
    }
}

/// One resync: a syncing copy brought up to date from the deciding copy.
#[derive(Debug)]
struct Sync {
    id: u64,
    region: u32,
    /// The syncing copy, by position in the set.
    copy: usize,
    /// The deciding copy when the resync began.
    source: usize,
    server: ServerId,
    region_len: u64,
    walk: Walk,
    /// The run asked: the deciding copy's checksums and the syncing copy's.
    sums: [Option<Vec<u64>>; 2],
    /// Blocks found different, to copy in order.
    to_copy: VecDeque<ToCopy>,
    /// The range held while its READ is in flight.
    reading: Option<(u64, u64)>,
    /// Block WRITEs to the syncing copy not answered yet.
    writing: usize,
    /// The records of atomics the copy missed, as carried to it.
    records: Vec<Missed>,
    /// Records not acknowledged yet (not sent, sent, or waiting to go
    /// again); the walk begins once there are none.
    records_out: usize,
    /// Records sent so far (the first ones of `records`).
    records_sent: usize,
    /// Requests refused STALE_MAP, waiting to go again.
    stale: Vec<StaleWait>,
    /// Marking the copy `serving` (the driver has not confirmed yet).
    finishing: bool,
    /// The bucket is empty until then.
    paced_until: Option<Instant>,
    started: Instant,
    blocks_copied: u64,
    /// Requests sent again after STALE_MAP.
    stale_resent: u64,
}

/// A block to copy.
#[derive(Debug, Clone, Copy)]
struct ToCopy {
    block: u64,
    /// How many times its READ or WRITE was refused STALE_MAP, as
    /// `refused` counts them.
    stale_refusals: u32,
}

impl ToCopy {
    /// A block the walk found different.
    fn found(block: u64) -> Self {
        Self {
            block,
            stale_refusals: 0,
        }
    }
}

/// What a resync reports of itself, for tests.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ResyncStatus {
    /// The walk's progress.
    pub progress: crate::resync::walk::Progress,
    /// Blocks copied so far.
    pub blocks_copied: u64,
    /// Whether the copy is being marked `serving`.
    pub finishing: bool,
}

impl Forwarder {
    /// Paces every resync of this device at `bytes_per_second` (at least
    /// one byte per second) from now on.
    pub fn set_resync_rate(&mut self, bytes_per_second: u64) {
        self.replication_changed();
        let resyncs = &mut self.replication.resyncs;
        resyncs.rate = bytes_per_second.max(1);
        resyncs.bucket = None;
    }

    /// Moves the resyncs on: offline copies whose server is back are marked
    /// `syncing`, syncing copies of owned regions get a resync, and each
    /// resync sends what its bucket and its answers allow.
    pub fn run_resyncs(&mut self, now: Instant) {
        self.replication
            .resyncs
            .not_before
            .retain(|_, &mut at| at > now);
        self.mark_returned_copies();
        self.start_resyncs(now);
        let ids: Vec<u64> = self.replication.resyncs.runs.iter().map(|s| s.id).collect();
        for id in ids {
            self.advance_resync(id, now);
        }
        self.count_syncing();
    }

    /// Whether a resync waits on something no event marks for the
    /// housekeeping: a block a mutation with a part to send again
    /// overlaps, or a returned copy not marked `syncing` yet. The
    /// housekeeping then runs every turn, as it did before it was gated.
    pub(super) fn resync_waits_unmarked(&self) -> bool {
        let resyncs = &self.replication.resyncs;
        !resyncs.returned.is_empty()
            || resyncs.runs.iter().any(|sync| {
                let Some(block) = sync.to_copy.front() else {
                    return false;
                };
                let start = block.block * BLOCK_LEN;
                let end = (start + BLOCK_LEN).min(sync.region_len);
                !sync.finishing
                    && sync.reading.is_none()
                    && self
                        .region_state(sync.region)
                        .is_some_and(|s| s.behind_over(start, end))
            })
    }

    /// Sets the gauge of this device's owned copies in `syncing`.
    fn count_syncing(&self) {
        let syncing = self
            .replication
            .regions
            .iter()
            .flatten()
            .filter(|r| r.owner)
            .flat_map(|r| &r.copies)
            .filter(|c| c.state == ReplicaState::Syncing)
            .count();
        self.metrics.copies_syncing.set(syncing as i64);
    }

    /// When [`Forwarder::run_resyncs`] next has something to do that no
    /// answer will bring: the bucket refilled, a stopped resync's retry.
    pub(in crate::forward) fn resync_wake(&self) -> Option<Instant> {
        let resyncs = &self.replication.resyncs;
        let paced = resyncs.runs.iter().filter_map(|s| s.paced_until);
        let retries = resyncs.not_before.values().copied();
        paced.chain(retries).min()
    }

    /// The resync of `region`'s copy on `server`, if one runs.
    #[cfg(test)]
    pub(crate) fn resync_status(&self, region: u32, server: &str) -> Option<ResyncStatus> {
        let sync = self
            .replication
            .resyncs
            .runs
            .iter()
            .find(|s| s.region == region && s.server.as_str() == server)?;
        Some(ResyncStatus {
            progress: sync.walk.progress(),
            blocks_copied: sync.blocks_copied,
            finishing: sync.finishing,
        })
    }

    /// The state of `region`'s copy on `server` as this device uses it.
    #[cfg(test)]
    pub(crate) fn copy_state(&self, region: u32, server: &str) -> Option<ReplicaState> {
        self.region_state(region)?
            .copies
            .iter()
            .find(|c| c.server.as_str() == server)
            .map(|c| c.state)
    }

    /// The driver marked `region`'s copy on `server` with `state`
    /// (`written`), or could not: the copy takes the state here, or its
    /// resync stops and is tried again later.
    pub fn copy_state_marked(
        &mut self,
        region: RegionIndex,
        server: &ServerId,
        state: ReplicaState,
        written: bool,
        now: Instant,
    ) {
        self.replication_changed();
        let region = region.0;
        let resyncs = &mut self.replication.resyncs;
        resyncs
            .marking
            .retain(|(r, s)| !(*r == region && s == server));
        let finished = resyncs
            .runs
            .iter()
            .position(|s| s.region == region && &s.server == server && s.finishing)
            .map(|at| resyncs.runs.remove(at));
        if !written {
            resyncs
                .not_before
                .insert((region, server.clone()), now + RETRY_AFTER);
            if state == ReplicaState::Syncing {
                // Its server is still back: ask again after the wait.
                resyncs.returned.push((region, server.clone()));
            }
            return;
        }
        let metrics = Arc::clone(&self.metrics);
        let Some(region_state) = self.region_state_mut(region) else {
            return;
        };
        let region_id = region_state.id.clone();
        let Some(copy) = region_state.copies.iter_mut().find(|c| &c.server == server) else {
            return;
        };
        match (copy.state, state) {
            (ReplicaState::Offline, ReplicaState::Syncing) => {
                copy.state = ReplicaState::Syncing;
                copy.lost_at = None;
                copy.unconfirmed = false;
                tracing::info!(
                    "region {region_id}: the copy on server {server} is back and syncing: it \
                     takes writes from now on and is brought up to date"
                );
            }
            // A new map may have brought the state first.
            (ReplicaState::Syncing | ReplicaState::Serving, ReplicaState::Serving) => {
                copy.state = ReplicaState::Serving;
                if let Some(sync) = finished {
                    metrics.resyncs_finished.inc();
                    tracing::info!(
                        "region {region_id}: the copy on server {server} is up to date and \
                         serving again (resynced in {:.3} s, {} blocks copied, {} requests sent \
                         again after STALE_MAP)",
                        now.saturating_duration_since(sync.started).as_secs_f64(),
                        sync.blocks_copied,
                        sync.stale_resent
                    );
                }
            }
            _ => {}
        }
        self.forget_missed_if_all_serve(region);
        // Counted at once: the resync's end and the gauge agree.
        self.count_syncing();
    }

    /// A link to `server` opened: its copies that are `offline` in regions
    /// this device owns are to be marked `syncing`.
    pub(in crate::forward) fn resync_link_opened(&mut self, server: &ServerId) {
        self.replication_changed();
        let mut back = Vec::new();
        for (region, state) in self.replication.regions.iter().enumerate() {
            let Some(state) = state.as_ref().filter(|s| s.owner) else {
                continue;
            };
            if state
                .copies
                .iter()
                .any(|c| &c.server == server && c.state == ReplicaState::Offline)
            {
                back.push((region as u32, server.clone()));
            }
        }
        let returned = &mut self.replication.resyncs.returned;
        for copy in back {
            if !returned.contains(&copy) {
                returned.push(copy);
            }
        }
    }

    /// Asks the driver to mark `syncing` each returned copy that is still
    /// `offline`, whose loss is confirmed and whose server has a link up.
    fn mark_returned_copies(&mut self) {
        if self.replication.resyncs.returned.is_empty() {
            return;
        }
        let returned = std::mem::take(&mut self.replication.resyncs.returned);
        let mut kept = Vec::new();
        for (region, server) in returned {
            let Some(state) = self.region_state(region).filter(|s| s.owner) else {
                continue;
            };
            let Some(copy) = state.copies.iter().find(|c| c.server == server) else {
                continue;
            };
            if copy.state != ReplicaState::Offline {
                continue;
            }
            let waits = self
                .replication
                .resyncs
                .not_before
                .contains_key(&(region, server.clone()));
            if waits || copy.unconfirmed || self.write_link(&copy.links).is_none() {
                kept.push((region, server));
                continue;
            }
            let region_id = state.id.clone();
            let resyncs = &mut self.replication.resyncs;
            if resyncs
                .marking
                .iter()
                .any(|(r, s)| *r == region && s == &server)
            {
                kept.push((region, server));
                continue;
            }
            resyncs.marking.push((region, server.clone()));
            self.replication.outbox.push(Outgoing::MarkCopy {
                region: RegionIndex(region),
                region_id,
                server,
                state: ReplicaState::Syncing,
            });
        }
        self.replication.resyncs.returned.extend(kept);
    }

    /// Starts a resync for each syncing copy of an owned region that has
    /// none, one region's copy at a time, when both it and the deciding
    /// copy have a link up; otherwise says once why it waits.
    fn start_resyncs(&mut self, now: Instant) {
        let mut starts = Vec::new();
        for (region, state) in self.replication.regions.iter().enumerate() {
            let Some(state) = state.as_ref().filter(|s| s.owner) else {
                continue;
            };
            let region = region as u32;
            let resyncs = &self.replication.resyncs;
            if resyncs.runs.iter().any(|s| s.region == region) {
                continue;
            }
            let Some(copy) = state.copies.iter().position(|c| {
                c.state == ReplicaState::Syncing
                    && !resyncs
                        .marking
                        .iter()
                        .any(|(r, s)| *r == region && s == &c.server)
                    && !resyncs.not_before.contains_key(&(region, c.server.clone()))
            }) else {
                continue;
            };
            starts.push((region, copy));
        }
        for (region, copy) in starts {
            self.start_resync(region, copy, now);
        }
    }

    fn start_resync(&mut self, region: u32, copy: usize, now: Instant) {
        let Some(state) = self.region_state(region) else {
            return;
        };
        let region_id = state.id.clone();
        let server = state.copies[copy].server.clone();
        let mut unconfirmed = None;
        let why_not = match self.deciding_copy(region) {
            None => Some("no copy of the region is serving to copy from".to_owned()),
            Some(source) if self.write_link(&state.copies[source].links).is_none() => {
                Some(format!(
                    "its source, the copy on server {}, has no link up",
                    state.copies[source].server
                ))
            }
            Some(_) if self.write_link(&state.copies[copy].links).is_none() => {
                Some("no link to its server is up".to_owned())
            }
            // A device that ran an older map may still send the region's
            // writes on its plain path (the region had a single copy) or
            // as its former owner: the source's server refuses those only
            // once it runs this device's epoch, and a block summed before
            // one of them lands would miss it on the syncing copy.
            Some(source) if !self.owned_epoch_confirmed(region, &state.copies[source].server) => {
                unconfirmed = self.write_link(&state.copies[source].links);
                Some(format!(
                    "its source's server, {}, has not confirmed the map epoch this device owns                      the region from (MAP_EPOCH said again)",
                    state.copies[source].server
                ))
            }
            Some(_) => None,
        };
        let key = (region, server.clone());
        let resyncs = &mut self.replication.resyncs;
        // Waiting for an epoch's confirmation, the start is tried again as
        // often as MAP_EPOCH is said; other waits take longer.
        let retry = match unconfirmed {
            Some(_) => super::takeover::RESAY_EVERY,
            None => RETRY_AFTER,
        };
        resyncs.to_confirm.extend(unconfirmed);
        if let Some(why) = why_not {
            if !resyncs.waiting_logged.contains(&key) {
                tracing::warn!(
                    "region {region_id}: the syncing copy on server {server} waits to resync: \
                     {why}; nothing is copied until it has one"
                );
                resyncs.waiting_logged.push(key.clone());
            }
            resyncs.not_before.insert(key, now + retry);
            return;
        }
        resyncs.waiting_logged.retain(|k| k != &key);
        let Some(source) = self.deciding_copy(region) else {
            return;
        };
        let region_len = self
            .map
            .layout
            .entry(RegionIndex(region))
            .map_or(0, |e| e.len);
        let total = region_len.div_ceil(BLOCK_LEN);
        let resyncs = &mut self.replication.resyncs;
        let id = resyncs.next_id;
        resyncs.next_id += 1;
        let source_server = self
            .copy_server(region, source)
            .map_or_else(String::new, |s| s.to_string());
        tracing::info!(
            "region {region_id}: resyncing the copy on server {server} from the copy on server \
             {source_server} ({total} blocks of 64 KiB, at most {} bytes/s)",
            self.replication.resyncs.rate
        );
        self.metrics
            .resync_blocks_total
            .with(&[region_id.as_str()])
            .set(i64::try_from(total).unwrap_or(i64::MAX));
        self.metrics
            .resync_blocks_done
            .with(&[region_id.as_str()])
            .set(0);
        self.replication.resyncs.runs.push(Sync {
            id,
            region,
            copy,
            source,
            server,
            region_len,
            walk: Walk::new(total, RUN_BLOCKS),
            sums: [None, None],
            to_copy: VecDeque::new(),
            reading: None,
            writing: 0,
            records: Vec::new(),
            records_out: 0,
            records_sent: 0,
            stale: Vec::new(),
            finishing: false,
            paced_until: None,
            started: now,
            blocks_copied: 0,
            stale_resent: 0,
        });
        // The records of atomics the copy missed go first, ahead of the
        // walk on its link.
        let carried = self.carry_records(id, now);
        if carried > 0 {
            tracing::info!(
                "region {region_id}: {carried} exactly-once records of atomics decided while \
                 the copy did not serve sent to it"
            );
        }
    }

    /// The write links of resync sources waiting for their servers to
    /// confirm the device's epoch, each once per start attempt.
    pub(super) fn resync_sources_to_confirm(&mut self) -> Vec<LinkId> {
        let mut links = std::mem::take(&mut self.replication.resyncs.to_confirm);
        links.dedup();
        links
    }

    fn sync_mut(&mut self, id: u64) -> Option<&mut Sync> {
        self.replication
            .resyncs
            .runs
            .iter_mut()
            .find(|s| s.id == id)
    }

    /// Sends what resync `id` may send now: the next block's READ (when the
    /// bucket lets it), the next run's checksums, or the mark `serving`.
    fn advance_resync(&mut self, id: u64, now: Instant) {
        let Some(sync) = self.replication.resyncs.runs.iter().find(|s| s.id == id) else {
            return;
        };
        if sync.finishing {
            // The mark `serving` is on its way; the driver says how it went.
            return;
        }
        let (region, copy, source) = (sync.region, sync.copy, sync.source);
        let still = self.region_state(region).is_some_and(|s| {
            s.owner
                && s.copies
                    .get(copy)
                    .is_some_and(|c| c.server == sync.server && c.state == ReplicaState::Syncing)
        }) && self.deciding_copy(region) == Some(source);
        if !still {
            self.stop_resync(id, "the copies' states changed", now);
            return;
        }
        if sync.reading.is_some() {
            return;
        }
        if let Some(&block) = sync.to_copy.front() {
            let start = block.block * BLOCK_LEN;
            let end = (start + BLOCK_LEN).min(sync.region_len);
            if self
                .region_state(region)
                .is_some_and(|s| s.behind_over(start, end))
            {
                // A mutation of the block has a part to send again after
                // STALE_MAP: read the block once it went, so that the
                // block holds it on both copies (its answer wakes this).
                return;
            }
            let rate = self.replication.resyncs.rate;
            let bucket = self
                .replication
                .resyncs
                .bucket
                .get_or_insert_with(|| TokenBucket::new(rate, BLOCK_LEN, now));
            let paced = bucket.take(end - start, now);
            let Some(sync) = self.sync_mut(id) else {
                return;
            };
            match paced {
                Err(at) => sync.paced_until = Some(at),
                Ok(()) => {
                    sync.paced_until = None;
                    sync.to_copy.pop_front();
                    self.copy_block(id, start, end, block.stale_refusals, now);
                }
            }
            return;
        }
        if sync.records_out > 0 || !sync.stale.is_empty() {
            // The walk follows every record (a record's word, older than
            // the deciding copy's, is then compared and copied over) and
            // waits while a request refused STALE_MAP waits to go again.
            return;
        }
        if sync.walk.is_finished() {
            if sync.writing == 0 {
                self.finish_resync(id);
            }
            return;
        }
        let Some(sync) = self.sync_mut(id) else {
            return;
        };
        let Some((first, blocks)) = sync.walk.next_run() else {
            return;
        };
        sync.sums = [None, None];
        let sent = [(source, false), (copy, true)]
            .into_iter()
            .all(|(at, syncing)| {
                let ticket = ResyncTicket::new(id, ResyncPart::Sums { first, syncing }, 0);
                let ask = Message::BlockSums(block_sums::Repr {
                    region,
                    first,
                    blocks,
                });
                self.send_resync(region, at, &ask, Opcode::BlockSums, ticket, now)
            });
        if !sent {
            self.stop_resync(id, "a copy's link went down", now);
        }
    }

    /// Holds `start..end` and reads it from the deciding copy; its READ
    /// and WRITE were refused STALE_MAP `stale_refusals` times before.
    fn copy_block(&mut self, id: u64, start: u64, end: u64, stale_refusals: u32, now: Instant) {
        let Some(sync) = self.sync_mut(id) else {
            return;
        };
        let (region, source) = (sync.region, sync.source);
        sync.reading = Some((start, end));
        self.hold_for_resync(region, start, end);
        let Some(key) = self.own_copy_key(region, source) else {
            self.stop_resync(id, "the region is not mapped", now);
            return;
        };
        let read = request::Repr::read(
            Target::Region(RegionOffset {
                region: RegionIndex(region),
                offset: start,
            }),
            key,
            (end - start) as u32,
        );
        let ticket = ResyncTicket::new(id, ResyncPart::Read { start, end }, stale_refusals);
        let message = Message::Request(read);
        if !self.send_resync(region, source, &message, Opcode::Read, ticket, now) {
            self.stop_resync(id, "the deciding copy's link went down", now);
        }
    }

    /// Asks the driver to mark resync `id`'s copy `serving`.
    fn finish_resync(&mut self, id: u64) {
        let Some(sync) = self.sync_mut(id) else {
            return;
        };
        sync.finishing = true;
        let (region, server) = (sync.region, sync.server.clone());
        let Some(region_id) = self.region_state(region).map(|s| s.id.clone()) else {
            return;
        };
        self.replication
            .resyncs
            .marking
            .push((region, server.clone()));
        self.replication.outbox.push(Outgoing::MarkCopy {
            region: RegionIndex(region),
            region_id,
            server,
            state: ReplicaState::Serving,
        });
    }

    /// The key of `region`'s copy `copy`, as its server gave it (the
    /// primary's from the layout while unknown).
    fn own_copy_key(&self, region: u32, copy: usize) -> Option<AccessKey> {
        let primary = self.map.layout.entry(RegionIndex(region))?.key;
        let server = self.copy_server(region, copy)?;
        Some(self.copy_key(region, &server, primary))
    }

    /// Sends a resync's own request to `region`'s copy `copy` on its write
    /// link (the connection its mutations take, so the request follows
    /// them); false when it has none up.
    pub(super) fn send_resync(
        &mut self,
        region: u32,
        copy: usize,
        message: &Message<'_>,
        opcode: Opcode,
        ticket: ResyncTicket,
        now: Instant,
    ) -> bool {
        let sent_under = self.current_epoch();
        let Some(links) = self
            .region_state(region)
            .and_then(|s| s.copies.get(copy))
            .map(|c| c.links.clone())
        else {
            return false;
        };
        let Some(link_id) = self.write_link(&links) else {
            return false;
        };
        let Some(link) = self.links.get_mut(&link_id) else {
            return false;
        };
        let tag = link.next_tag;
        let Ok(frame) = message.encode_to_vec(tag) else {
            return false;
        };
        let ticket = ResyncTicket {
            sent_under,
            ..ticket
        };
        link.next_tag = (link.next_tag + 1) & !CONTROL_TAG;
        link.pending.insert(
            tag,
            Pending {
                conn: RESYNC_CONN,
                client_tag: 0,
                opcode,
                sent: now,
                reply_bytes: 0,
                copy: Some(CopyTicket::Resync(ticket)),
            },
        );
        let links = &self.links;
        self.deadlines.push(
            Deadline {
                at: now + self.config.request_timeout,
                link: link_id,
                tag,
            },
            |d| is_pending(links, d),
        );
        self.metrics.bytes_to_servers.add(frame.len() as u64);
        self.replication.outbox.push(Outgoing::SendFrame {
            link: link_id,
            frame,
        });
        true
    }

    /// `region`'s copy `copy` was lost: resyncs to or from it stop.
    pub(super) fn resync_copy_lost(&mut self, region: u32, copy: usize, now: Instant) {
        let ids: Vec<u64> = self
            .replication
            .resyncs
            .runs
            .iter()
            .filter(|s| s.region == region && (s.copy == copy || s.source == copy))
            .map(|s| s.id)
            .collect();
        for id in ids {
            self.stop_resync(id, "a copy it uses was lost", now);
        }
    }

    /// Stops resync `id`: its hold is released (the requests that waited
    /// go out), and it starts again from the first block later.
    fn stop_resync(&mut self, id: u64, why: &str, now: Instant) {
        self.replication_changed();
        let resyncs = &mut self.replication.resyncs;
        let Some(at) = resyncs.runs.iter().position(|s| s.id == id) else {
            return;
        };
        let sync = resyncs.runs.remove(at);
        self.metrics.resyncs_stopped.inc();
        let resyncs = &mut self.replication.resyncs;
        resyncs
            .not_before
            .insert((sync.region, sync.server.clone()), now + RETRY_AFTER);
        let region_id = self
            .region_state(sync.region)
            .map_or_else(String::new, |s| s.id.to_string());
        tracing::warn!(
            "region {region_id}: the resync of the copy on server {} stopped ({why}); it starts \
             again from the first block",
            sync.server
        );
        if let Some((start, end)) = sync.reading {
            self.release_resync_hold(sync.region, start, end, now);
        }
    }
}
