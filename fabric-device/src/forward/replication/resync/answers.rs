//! Copies' answers to a resync's own requests: a run's checksums compared,
//! a block read from the deciding copy written to the syncing copy, a
//! block's or a record's write acknowledged. A READ, WRITE_PERSIST or
//! record refused STALE_MAP waits to go again (`stale`); any other refusal,
//! an unreadable answer or a failed request stops the resync.

use super::*;

impl Forwarder {
    /// A copy's answer to a resync's request.
    pub(in crate::forward) fn resync_answered(
        &mut self,
        ticket: ResyncTicket,
        frame: &[u8],
        now: Instant,
    ) {
        // Its step may set a new pace or stop it (a retry to wait for).
        self.replication_changed();
        let id = ticket.sync;
        if self.sync_mut(id).is_none() {
            // The resync stopped; its hold is released already.
            return;
        }
        let parsed = proto::parse_frame(frame).map(|(m, _)| m);
        if let Ok(Message::Response(r)) = &parsed
            && r.status == Status::StaleMap
            && !matches!(ticket.part, ResyncPart::Sums { .. })
        {
            // Nothing ran there: the part goes again once the server runs
            // this device's epoch (a newer server epoch makes the device
            // read the map now).
            let theirs = r.value;
            self.server_response(frame);
            self.resync_refused_stale(ticket, theirs, now);
            self.advance_resync(id, now);
            return;
        }
        match ticket.part {
            ResyncPart::Sums { first, syncing } => match parsed {
                Ok(Message::BlockSumsReport(report)) => {
                    self.sums_answered(id, first, syncing, report, now);
                }
                Ok(Message::Response(r)) => {
                    let which = if syncing { "syncing" } else { "deciding" };
                    let why = format!("the {which} copy's server refused BLOCK_SUMS: {}", r.status);
                    self.stop_resync(id, &why, now);
                }
                _ => self.stop_resync(id, "an unreadable BLOCK_SUMS answer", now),
            },
            ResyncPart::Read { start, end } => match parsed {
                Ok(Message::Response(r))
                    if r.status == Status::Ok && r.payload.len() as u64 == end - start =>
                {
                    self.block_read(id, start, end, r.payload, ticket.stale_refusals, now);
                }
                Ok(Message::Response(r)) => {
                    let why = format!(
                        "the deciding copy's server answered the READ of bytes {start}..{end} \
                         with {} (with authentication, servers refuse a device's own reads and \
                         writes)",
                        r.status
                    );
                    self.stop_resync(id, &why, now);
                }
                _ => self.stop_resync(id, "an unreadable READ answer", now),
            },
            ResyncPart::Write { start, end } => match parsed {
                Ok(Message::Response(r)) if r.status == Status::Ok => {
                    if let Some(sync) = self.sync_mut(id) {
                        sync.writing = sync.writing.saturating_sub(1);
                        sync.blocks_copied += 1;
                    }
                    self.metrics.resync_blocks_copied.inc();
                    self.metrics.resync_bytes_copied.add(end - start);
                }
                Ok(Message::Response(r)) => {
                    let why = format!("the syncing copy's server refused a block: {}", r.status);
                    self.stop_resync(id, &why, now);
                }
                _ => self.stop_resync(id, "an unreadable WRITE answer", now),
            },
            ResyncPart::Record { .. } => match parsed {
                Ok(Message::Response(r)) if r.status == Status::Ok => self.record_carried(id, now),
                Ok(Message::Response(r)) => {
                    let why = format!(
                        "the syncing copy's server refused an atomic's exactly-once record: {}",
                        r.status
                    );
                    self.stop_resync(id, &why, now);
                }
                _ => self.stop_resync(id, "an unreadable ATOMIC_WRITE answer", now),
            },
        }
        self.advance_resync(id, now);
    }

    /// One copy's checksums of the run asked; with both, the blocks that
    /// differ are to be copied.
    fn sums_answered(
        &mut self,
        id: u64,
        first: u64,
        syncing: bool,
        report: block_sums::Report,
        now: Instant,
    ) {
        let Some(sync) = self.sync_mut(id) else {
            return;
        };
        let expected = sync.walk.progress().total;
        let (deciding_total, syncing_total) = if syncing {
            (expected, report.head.total)
        } else {
            (report.head.total, expected)
        };
        let wrong = if u64::from(report.head.block_len) != BLOCK_LEN || report.head.first != first {
            Some(format!(
                "a server answered checksums of {}-byte blocks from block {} (asked: \
                 {BLOCK_LEN}-byte blocks from block {first})",
                report.head.block_len, report.head.first
            ))
        } else {
            sync.walk
                .check_totals(deciding_total, syncing_total)
                .err()
                .map(|e| e.to_string())
        };
        if let Some(why) = wrong {
            self.stop_resync(id, &why, now);
            return;
        }
        sync.sums[usize::from(syncing)] = Some(report.sums);
        let [Some(deciding), Some(copy)] = &sync.sums else {
            return;
        };
        let run = deciding.len() as u64;
        let compared = sync.walk.compared(first, deciding, copy);
        sync.sums = [None, None];
        match compared {
            Ok(differ) => {
                let progress = sync.walk.progress();
                sync.to_copy.extend(differ.into_iter().map(ToCopy::found));
                let region = sync.region;
                self.metrics.resync_blocks_compared.add(run);
                if let Some(state) = self.region_state(region) {
                    self.metrics
                        .resync_blocks_done
                        .with(&[state.id.as_str()])
                        .set(i64::try_from(progress.done).unwrap_or(i64::MAX));
                }
            }
            Err(e) => self.stop_resync(id, &e.to_string(), now),
        }
    }

    /// The block `start..end` read from the deciding copy: written to the
    /// syncing copy, then the hold released (waiting requests go behind
    /// the write on the same connection). `stale_refusals` goes with it.
    fn block_read(
        &mut self,
        id: u64,
        start: u64,
        end: u64,
        data: &[u8],
        stale_refusals: u32,
        now: Instant,
    ) {
        let Some(sync) = self.sync_mut(id) else {
            return;
        };
        let (region, copy) = (sync.region, sync.copy);
        let Some(key) = self.own_copy_key(region, copy) else {
            self.stop_resync(id, "the region is not mapped", now);
            return;
        };
        let write = request::Repr::write_persist(
            Target::Region(RegionOffset {
                region: RegionIndex(region),
                offset: start,
            }),
            key,
            data,
        );
        let ticket = ResyncTicket::new(id, ResyncPart::Write { start, end }, stale_refusals);
        let message = Message::Request(write);
        if !self.send_resync(region, copy, &message, Opcode::WritePersist, ticket, now) {
            self.stop_resync(id, "the syncing copy's link went down", now);
            return;
        }
        let Some(sync) = self.sync_mut(id) else {
            return;
        };
        sync.reading = None;
        sync.writing += 1;
        self.release_resync_hold(region, start, end, now);
    }

    /// A resync's request failed (its link went down, or it timed out):
    /// the resync stops and starts again later.
    pub(in crate::forward) fn resync_failed(
        &mut self,
        ticket: ResyncTicket,
        status: Status,
        now: Instant,
    ) {
        let why = format!("a request to a copy failed ({status})");
        self.stop_resync(ticket.sync, &why, now);
    }
}
