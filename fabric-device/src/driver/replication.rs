//! What the core asks for replicated regions: requests to copies sent in
//! order on each link, over its RDMA queue pair where it has one and it can
//! carry them, else its TCP connection (`copy_streams`), answers delivered,
//! lost copies marked
//! offline (in etcd when the device follows the map there) and confirmed
//! back to the core, suspected owners probed (`takeover`), and MAP_EPOCH
//! said again to the servers a new owner waits for.

use std::sync::mpsc;

use proto::RegionIndex;
use topology::{RegionId, ServerId};

use super::*;
use crate::forward::Outgoing;

use super::copy_streams::{Carriers, CopyHead, CopyRequest};
use super::resync;

/// Marks lost copies offline in etcd, one thread per loss, and hands the
/// confirmations back to the event loop.
#[derive(Debug)]
pub(super) struct CopyMarker {
    endpoints: control::Endpoints,
    pool: String,
    credentials: Option<control::Credentials>,
    done_tx: mpsc::Sender<(RegionIndex, ServerId)>,
    done_rx: mpsc::Receiver<(RegionIndex, ServerId)>,
    /// Marks of `syncing` and `serving` settled: whether each was written.
    pub(super) states: resync::StateMarks,
}

impl CopyMarker {
    /// A marker for the map of `source`, when it is in etcd.
    pub(super) fn for_source(source: &control::MapSource) -> Option<Self> {
        let control::MapSource::Etcd {
            endpoints,
            pool,
            credentials,
        } = source
        else {
            return None;
        };
        let (done_tx, done_rx) = mpsc::channel();
        Some(Self {
            endpoints: endpoints.clone(),
            pool: pool.clone(),
            credentials: credentials.clone(),
            done_tx,
            done_rx,
            states: resync::StateMarks::default(),
        })
    }

    /// Starts marking `region`'s copy on `server` offline; the loop is woken
    /// by `waker` once it is written, or refused (logged: the device goes on
    /// without the copy either way).
    pub(super) fn endpoints(&self) -> (&control::Endpoints, &str, Option<&control::Credentials>) {
        (&self.endpoints, &self.pool, self.credentials.as_ref())
    }

    fn start(
        &self,
        region: RegionIndex,
        region_id: RegionId,
        server: ServerId,
        waker: Arc<mio::Waker>,
    ) {
        let endpoints = self.endpoints.clone();
        let pool = self.pool.clone();
        let credentials = self.credentials.clone();
        let done = self.done_tx.clone();
        let lost = server.clone();
        let spawned = std::thread::Builder::new()
            .name("copy-marker".into())
            .spawn(move || {
                let marked = control::copy_marks::mark_copy_offline(
                    &endpoints,
                    &pool,
                    credentials.as_ref(),
                    region_id.as_str(),
                    server.as_str(),
                );
                match marked {
                    Ok(control::copy_marks::CopyMarked::Written { epoch }) => info!(
                        "region {region_id}: copy on server {server} marked offline in the map \
                         (epoch {epoch})"
                    ),
                    Ok(control::copy_marks::CopyMarked::AlreadyOffline) => {
                        info!(
                            "region {region_id}: copy on server {server} already offline in the map"
                        )
                    }
                    Err(e) => warn!(
                        "{}; this device stops using the copy anyway (an operator can mark it \
                         with `pmemctl cluster mark-replica`)",
                        error_chain(&e)
                    ),
                }
                let _ = done.send((region, server));
                let _ = waker.wake();
            });
        if let Err(e) = spawned {
            warn!("cannot start marking a lost copy offline: {e}");
            let _ = self.done_tx.send((region, lost));
        }
    }
}

impl Device {
    /// Marks lost copies in the etcd map of `source` from now on (a file's
    /// map is not written: the loss is confirmed at once), and takes the
    /// regions of dead owners over there.
    pub fn mark_copies_in(&mut self, source: &control::MapSource) {
        self.copy_marker = CopyMarker::for_source(source);
        self.takeovers.use_map_in(source);
    }

    /// Uses the copies' states, owners and versions of `records` (the map's
    /// in etcd) instead of a new pool's, keeping links and clients.
    pub fn use_copy_states(&mut self, records: &[control::ReplicaSetRecord]) {
        let map = self.core.map().clone().with_replica_states(records);
        let outcome = self.core.reload(map);
        self.deliver_all(outcome.failed);
    }

    /// Carries out what the core queued for replicated regions, until it
    /// queues nothing more (a failed send fails its link, which may queue
    /// more).
    pub(super) fn carry_out_replication(&mut self, now: Instant) {
        let posted = self.uplinks.counters().posted;
        self.carry_out_replication_requests(now);
        if self.uplinks.counters().posted != posted {
            // Posted after this turn's transmissions: send them now.
            self.transmit_uplinks(now);
        }
    }

    fn carry_out_replication_requests(&mut self, now: Instant) {
        if self.reports.due(now) {
            self.reports.ran(now, None);
            self.confirm_marked_copies(now);
            self.confirm_state_marks(now);
            self.takeovers_done(now);
        }
        let said = self.core.replication_turn(now);
        self.say_epoch(said);
        loop {
            // Requests that waited for their link's other way to drain go
            // first, ahead of anything new for their link.
            let mut failed = self.copy_streams.release(&mut LinkCarriers {
                links: &mut self.links,
                uplinks: &mut self.uplinks,
                core: &self.core,
            });
            // The core's outbox and this one trade places, keeping what
            // each had allocated.
            let mut outbox = std::mem::take(&mut self.outbox);
            self.core.swap_outbox(&mut outbox);
            if outbox.is_empty() && failed.is_empty() {
                self.outbox = outbox;
                return;
            }
            for item in outbox.drain(..) {
                match item {
                    Outgoing::Send {
                        link,
                        head,
                        payload,
                        rdma,
                        ..
                    } => {
                        // One ordered stream per copy. A link not connected
                        // answers at the request's deadline.
                        let request = CopyRequest {
                            head: CopyHead::Request(head),
                            payload,
                            rdma,
                        };
                        self.send_to_copy(link, request, &mut failed);
                    }
                    Outgoing::SendFrame { link, frame } => {
                        // A resync's own requests: for the server's CPU,
                        // in order with the application's.
                        let request = CopyRequest {
                            head: CopyHead::Frame(frame),
                            payload: Arc::from(&[][..]),
                            rdma: None,
                        };
                        self.send_to_copy(link, request, &mut failed);
                    }
                    Outgoing::MarkCopy {
                        region,
                        region_id,
                        server,
                        state,
                    } => self.mark_copy_state(region, region_id, server, state, now),
                    Outgoing::Answer { conn, reply } => deliver_answer(
                        &mut self.roce,
                        &mut self.clients,
                        &mut self.to_flush,
                        conn,
                        reply.as_bytes(),
                        &[],
                    ),
                    Outgoing::CopyLost {
                        region,
                        region_id,
                        server,
                    } => match &self.copy_marker {
                        Some(marker) => {
                            marker.start(region, region_id, server, self.waker());
                            // A thread that could not start reports at once.
                            self.reports.mark();
                        }
                        None => self.core.copy_marked(region, &server, now),
                    },
                    Outgoing::OwnerSuspected { owner } => self.owner_suspected(owner, now),
                }
            }
            self.outbox = outbox;
            for (link, why) in failed {
                self.link_failed(link, now, &why);
            }
        }
    }

    /// Sends a request to the copy `link` reaches, in its link's order;
    /// a failed write is noted in `failed`.
    fn send_to_copy(
        &mut self,
        link: LinkId,
        request: CopyRequest,
        failed: &mut Vec<(LinkId, String)>,
    ) {
        let mut carriers = LinkCarriers {
            links: &mut self.links,
            uplinks: &mut self.uplinks,
            core: &self.core,
        };
        if let Err(why) = self.copy_streams.send(link, request, &mut carriers) {
            failed.push((link, why));
        }
    }

    /// Hands the core the copies whose loss the marker threads settled.
    fn confirm_marked_copies(&mut self, now: Instant) {
        let Some(marker) = &self.copy_marker else {
            return;
        };
        let done: Vec<(RegionIndex, ServerId)> = marker.done_rx.try_iter().collect();
        for (region, server) in done {
            self.core.copy_marked(region, &server, now);
        }
    }
}

/// A link's queue pair (when it has one) and TCP connection.
struct LinkCarriers<'a> {
    links: &'a mut IdMap<LinkId, LinkConn>,
    uplinks: &'a mut Uplinks,
    core: &'a Forwarder,
}

impl Carriers for LinkCarriers<'_> {
    fn has_queue_pair(&self, link: LinkId) -> bool {
        self.uplinks.has(link)
    }

    fn room(&self, link: LinkId, work: &Offload) -> Posting {
        self.uplinks.room(link, work)
    }

    fn post(&mut self, link: LinkId, work: &Offload, payload: &[u8]) -> Posting {
        self.uplinks.post(link, work, payload)
    }

    fn posted_in_flight(&self, link: LinkId) -> usize {
        self.uplinks.in_flight(link)
    }

    fn awaits_answer(&self, link: LinkId, tag: u64) -> bool {
        self.core.awaits_answer(link, tag)
    }

    fn send_tcp(&mut self, link: LinkId, head: &[u8], payload: &[u8]) -> Result<(), String> {
        self.uplinks.sent_on_control(link);
        match self.links.get_mut(&link) {
            Some(LinkConn::Connected { endpoint }) => endpoint
                .send(head, payload)
                .map_err(|e| format!("write failed: {e}")),
            _ => Ok(()),
        }
    }
}
