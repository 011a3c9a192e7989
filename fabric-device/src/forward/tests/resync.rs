//! The owner's resync on a virtual clock. Device A owns PA.1 (primary on
//! server A, backup on B); simulated servers hold each copy's bytes and
//! answer BLOCK_SUMS, READ, WRITE and WRITE_PERSIST from them, in the order
//! the device sent them. Each simulated server runs a map epoch and fences
//! requests by it as a real one does: a link that said an older epoch has
//! its requests (not its BLOCK_SUMS) refused STALE_MAP.

use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hasher};
use std::time::Duration;

use control::ReplicaState;
use proto::atomic_record::AtomicRecord;
use proto::block_sums;
use proto::request::Operation;
use proto::response::ResponseKind;

use super::replication::{answered, bring_up_with_server_keys, index, links_of, send};
use super::*;
use crate::forward::Outgoing;

const BLOCK: u64 = 64 << 10;
/// PA.1 is 64 MiB.
const BLOCKS: u64 = 1024;

/// What the simulated servers and the client saw, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// BLOCK_SUMS of PA.1 from `first`.
    Sums { server: String, first: u64 },
    /// BLOCK_SUMS of another region.
    OtherSums,
    /// The resync's READ of a block.
    SyncRead { server: String, offset: u64 },
    /// The resync's WRITE_PERSIST of a block of PA.1.
    SyncWrite { server: String, offset: u64 },
    /// The resync's WRITE_PERSIST of a block of another region.
    OtherSyncWrite,
    /// The resync's ATOMIC_WRITE of an atomic's record.
    SyncRecord {
        server: String,
        offset: u64,
        seq: Option<u64>,
        record: Option<AtomicRecord>,
    },
    /// An application's request sent to a copy.
    App {
        server: String,
        op: Operation,
        offset: u64,
    },
    /// A copy of PA.1 marked.
    Mark { server: String, state: ReplicaState },
    /// A copy of another region marked.
    OtherMark,
    /// An answer to the client: its tag and status.
    Answer { tag: u64, status: Status },
    /// A request refused STALE_MAP (nothing applied).
    Refused {
        server: String,
        op: Operation,
        offset: u64,
    },
}

/// A server's fencing by map epoch, as the simulation plays it.
#[derive(Debug, Default)]
struct Epochs {
    /// The epoch in the map, which the device reads when a server answers
    /// STALE_MAP with a newer one.
    map: u64,
    /// The epoch each server runs.
    runs: HashMap<String, u64>,
    /// The epoch the device last said on each link.
    said: HashMap<LinkId, u64>,
    /// Epochs the map moves to, in order: the first request of the
    /// operation to the server after the previous one finds it running the
    /// epoch (a mark moved the map's epoch, the server read it first).
    bumps: VecDeque<(String, Operation, u64)>,
    /// A server that confirms every epoch said but refuses every request
    /// STALE_MAP (as one whose map lacks the region the device asks for).
    lacking: Option<String>,
}

/// The forwarding core with two simulated servers holding PA.1's copies.
struct Sim {
    core: Forwarder,
    region: u32,
    /// Each server's copy of each region: the blocks written (the others
    /// are zeros).
    copies: HashMap<(String, u32), HashMap<u64, Vec<u8>>>,
    seen: Vec<Seen>,
    /// When each resync READ was sent.
    read_times: Vec<Instant>,
    /// Resync READs not answered yet (while `hold_reads`).
    held_reads: Vec<(LinkId, u64, RegionOffset, String)>,
    hold_reads: bool,
    now: Instant,
    /// The checksum of a block of zeros.
    zero_sum: u64,
    epochs: Epochs,
}

fn sum(data: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    h.write(data);
    h.finish() | 1
}

impl Sim {
    /// PA.1 with B's copy in `b_state` (in a map at version 2), every link
    /// up, client c1 connected as connection 1.
    fn new(config: ForwarderConfig, b_state: ReplicaState) -> Self {
        let topology = testkit::default_topology_with("replicas = 2");
        let mut core = core_with(&topology, config);
        let ids: Vec<LinkId> = core.links().map(|(id, _)| id).collect();
        for id in ids {
            bring_up_with_server_keys(&mut core, id);
        }
        hello(&mut core, 1, "c1");
        let mut records = control::replica_state::initial(&topology);
        let record = records.iter_mut().find(|r| r.region == "PA.1").unwrap();
        record.version = 2;
        record.copies[1].state = b_state;
        core.reload(
            DeviceMap::new(&topology, &"A".into())
                .unwrap()
                .with_replica_states(&records),
        );
        let region = index(&core, "PA.1").0;
        Self {
            core,
            region,
            copies: HashMap::new(),
            seen: Vec::new(),
            read_times: Vec::new(),
            held_reads: Vec::new(),
            hold_reads: false,
            now: Instant::now(),
            zero_sum: sum(&[0; BLOCK as usize]),
            epochs: Epochs::default(),
        }
    }

    /// [`Sim::new`] with the map at epoch `epoch`, which the device and
    /// both servers run.
    fn at_epoch(b_state: ReplicaState, epoch: u64) -> Self {
        let mut sim = Self::new(ForwarderConfig::default(), b_state);
        sim.epochs.map = epoch;
        for server in ["A", "B"] {
            sim.epochs.runs.insert(server.to_owned(), epoch);
        }
        let said = sim.core.set_epoch(epoch);
        sim.say(said);
        sim.pump();
        sim
    }

    /// Plays the MAP_EPOCH frames the device said: each server keeps the
    /// epoch said on the link and answers with the one it runs.
    fn say(&mut self, said: Vec<(LinkId, Vec<u8>)>) {
        for (link, frame) in said {
            let (Message::MapEpoch(epoch), tag) = proto::parse_frame(&frame).unwrap() else {
                panic!("said: {frame:?}");
            };
            self.epochs.said.insert(link, epoch);
            let server = self.server_of(link);
            let runs = self.epochs.runs.get(&server).copied().unwrap_or(0);
            let status = if epoch >= runs {
                Status::Ok
            } else {
                Status::StaleMap
            };
            let reply = proto::fence::epoch_reply(Opcode::MapEpoch, tag, status, runs);
            let action = self.core.link_frame(link, &reply, self.now);
            assert!(matches!(action, LinkAction::Nothing), "{action:?}");
        }
    }

    /// Brings `server`'s links up; each says the device's epoch first.
    fn bring_up(&mut self, server: &str) {
        for link in links_of(&self.core, server) {
            bring_up_with_server_keys(&mut self.core, link);
            if let Some(said) = self.core.link_opened_epoch() {
                self.say(vec![(link, said)]);
            }
        }
    }

    /// Whether `server` refuses request `op` on `link` STALE_MAP: the epoch
    /// it runs, if so.
    fn fenced(&mut self, link: LinkId, server: &str, op: Operation) -> Option<u64> {
        if let Some((at, bumped, epoch)) = self.epochs.bumps.front().cloned()
            && at == server
            && bumped == op
        {
            self.epochs.bumps.pop_front();
            self.epochs.runs.insert(server.to_owned(), epoch);
            self.epochs.map = self.epochs.map.max(epoch);
        }
        let runs = self.epochs.runs.get(server).copied().unwrap_or(0);
        let said = self.epochs.said.get(&link).copied().unwrap_or(0);
        let lacking = self.epochs.lacking.as_deref() == Some(server);
        (lacking || said < runs).then_some(runs)
    }

    /// Answers request `tag` on `link` STALE_MAP with `epoch`.
    fn refuse(&mut self, link: LinkId, tag: u64, op: Operation, offset: u64, epoch: u64) {
        let server = self.server_of(link);
        self.seen.push(Seen::Refused { server, op, offset });
        let refusal = response::Repr {
            kind: ResponseKind::answering(op.opcode()),
            status: Status::StaleMap,
            value: epoch,
            payload: &[],
        };
        self.reply(link, Message::Response(refusal), tag);
    }

    /// What the driver does when a server answered STALE_MAP with a newer
    /// epoch: it reads the map and says its epoch on every link.
    fn read_map_if_asked(&mut self) {
        if self.core.take_map_reread() && self.epochs.map > 0 {
            let said = self.core.set_epoch(self.epochs.map);
            self.say(said);
        }
    }

    fn syncing() -> Self {
        Self::new(ForwarderConfig::default(), ReplicaState::Syncing)
    }

    /// Block `block` of `server`'s copy of `region`, if it was written.
    fn stored(&self, server: &str, region: u32, block: u64) -> Option<&Vec<u8>> {
        self.copies
            .get(&(server.to_owned(), region))
            .and_then(|c| c.get(&block))
    }

    /// The checksum of a block as its server would give it.
    fn block_sum(&self, server: &str, region: u32, block: u64) -> u64 {
        self.stored(server, region, block)
            .map_or(self.zero_sum, |data| sum(data))
    }

    fn read_of(&self, server: &str, region: u32, offset: u64, len: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(len as usize);
        let mut at = offset;
        while at < offset + len {
            let within = (at % BLOCK) as usize;
            let n = (BLOCK - at % BLOCK).min(offset + len - at) as usize;
            match self.stored(server, region, at / BLOCK) {
                Some(block) => out.extend_from_slice(&block[within..within + n]),
                None => out.resize(out.len() + n, 0),
            }
            at += n as u64;
        }
        out
    }

    /// `len` bytes of `server`'s copy of PA.1 from `offset`.
    fn read(&self, server: &str, offset: u64, len: u64) -> Vec<u8> {
        self.read_of(server, self.region, offset, len)
    }

    fn write_of(&mut self, server: &str, region: u32, offset: u64, data: &[u8]) {
        let mut done = 0;
        while done < data.len() {
            let at = offset + done as u64;
            let within = (at % BLOCK) as usize;
            let n = (BLOCK as usize - within).min(data.len() - done);
            let block = self
                .copies
                .entry((server.to_owned(), region))
                .or_default()
                .entry(at / BLOCK)
                .or_insert_with(|| vec![0; BLOCK as usize]);
            block[within..within + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
    }

    /// Writes `data` at `offset` of `server`'s copy of PA.1.
    fn write(&mut self, server: &str, offset: u64, data: &[u8]) {
        self.write_of(server, self.region, offset, data);
    }

    fn server_of(&self, link: LinkId) -> String {
        self.core.link_target(link).unwrap().server.to_string()
    }

    fn reply(&mut self, link: LinkId, message: Message<'_>, tag: u64) {
        let frame = message.encode_to_vec(tag).unwrap();
        let action = self.core.link_frame(link, &frame, self.now);
        assert!(matches!(action, LinkAction::Nothing), "{action:?}");
    }

    fn answer_read(&mut self, link: LinkId, tag: u64, at: RegionOffset, len: u64, server: &str) {
        let data = self.read_of(server, at.region.0, at.offset, len);
        self.reply(
            link,
            Message::Response(response::Repr::read_data(&data)),
            tag,
        );
    }

    /// Plays one request or mark the core asked for.
    fn serve(&mut self, item: Outgoing) {
        match item {
            Outgoing::SendFrame { link, frame } => {
                let server = self.server_of(link);
                let (message, tag) = proto::parse_frame(&frame).unwrap();
                match message {
                    Message::BlockSums(ask) => {
                        self.seen.push(if ask.region == self.region {
                            Seen::Sums {
                                server: server.clone(),
                                first: ask.first,
                            }
                        } else {
                            Seen::OtherSums
                        });
                        let sums = (ask.first..ask.first + u64::from(ask.blocks))
                            .map(|b| self.block_sum(&server, ask.region, b))
                            .collect();
                        let report = block_sums::Report {
                            head: proto::block_report::Head {
                                region: ask.region,
                                block_len: BLOCK as u32,
                                first: ask.first,
                                total: BLOCKS,
                            },
                            sums,
                        };
                        self.reply(link, Message::BlockSumsReport(report), tag);
                    }
                    Message::Request(req) => {
                        let Target::Region(at) = req.target else {
                            panic!("{req:?}")
                        };
                        if let Some(epoch) = self.fenced(link, &server, req.operation) {
                            self.refuse(link, tag, req.operation, at.offset, epoch);
                            return;
                        }
                        match req.operation {
                            Operation::Read => {
                                let len = u64::from(req.length);
                                if at.region.0 != self.region {
                                    self.answer_read(link, tag, at, len, &server);
                                    return;
                                }
                                self.seen.push(Seen::SyncRead {
                                    server: server.clone(),
                                    offset: at.offset,
                                });
                                self.read_times.push(self.now);
                                if self.hold_reads {
                                    self.held_reads.push((link, tag, at, server));
                                } else {
                                    self.answer_read(link, tag, at, len, &server);
                                }
                            }
                            Operation::WritePersist => {
                                self.seen.push(if at.region.0 == self.region {
                                    Seen::SyncWrite {
                                        server: server.clone(),
                                        offset: at.offset,
                                    }
                                } else {
                                    Seen::OtherSyncWrite
                                });
                                let data = req.payload.to_vec();
                                self.write_of(&server, at.region.0, at.offset, &data);
                                self.reply(
                                    link,
                                    Message::Response(response::Repr::ack(Status::Ok)),
                                    tag,
                                );
                            }
                            Operation::AtomicWrite => {
                                self.seen.push(Seen::SyncRecord {
                                    server: server.clone(),
                                    offset: at.offset,
                                    seq: req.exactly_once.map(|e| e.seq),
                                    record: req.record(),
                                });
                                let word = req.operand.to_le_bytes();
                                self.write_of(&server, at.region.0, at.offset, &word);
                                self.reply(
                                    link,
                                    Message::Response(response::Repr::ack(Status::Ok)),
                                    tag,
                                );
                            }
                            other => panic!("a resync sends no {other:?}"),
                        }
                    }
                    other => panic!("a resync sends no {other:?}"),
                }
            }
            Outgoing::Send {
                link,
                head,
                payload,
                ..
            } => {
                let server = self.server_of(link);
                let mut frame = head.to_vec();
                frame.extend_from_slice(&payload);
                let (Message::Request(req), tag) = proto::parse_frame(&frame).unwrap() else {
                    panic!("not a request");
                };
                let Target::Region(at) = req.target else {
                    panic!("{req:?}")
                };
                if let Some(epoch) = self.fenced(link, &server, req.operation) {
                    self.refuse(link, tag, req.operation, at.offset, epoch);
                    return;
                }
                self.seen.push(Seen::App {
                    server: server.clone(),
                    op: req.operation,
                    offset: at.offset,
                });
                if req.operation == Operation::Read {
                    self.answer_read(link, tag, at, u64::from(req.length), &server);
                } else {
                    let data = req.payload.to_vec();
                    self.write_of(&server, at.region.0, at.offset, &data);
                    self.reply(
                        link,
                        Message::Response(response::Repr::ack(Status::Ok)),
                        tag,
                    );
                }
            }
            Outgoing::Answer { reply, .. } => {
                let (status, _, tag) = answered(&reply);
                self.seen.push(Seen::Answer { tag, status });
            }
            Outgoing::CopyLost { region, server, .. } => {
                self.core.copy_marked(region, &server, self.now);
            }
            // Every device of these tests is alive.
            Outgoing::OwnerSuspected { .. } => {}
            Outgoing::MarkCopy {
                region,
                server,
                state,
                ..
            } => {
                self.seen.push(if region.0 == self.region {
                    Seen::Mark {
                        server: server.to_string(),
                        state,
                    }
                } else {
                    Seen::OtherMark
                });
                self.core
                    .copy_state_marked(region, &server, state, true, self.now);
            }
        }
    }

    /// Plays everything the core asks until it asks nothing more.
    fn pump(&mut self) {
        loop {
            let out = self.core.take_outbox();
            if out.is_empty() {
                return;
            }
            for item in out {
                self.serve(item);
            }
        }
    }

    /// One turn of the driver's loop: the map read when a server asked
    /// for it, then the housekeeping when it is due (MAP_EPOCH it says
    /// again is answered).
    fn turn(&mut self) {
        self.read_map_if_asked();
        let said = self.core.replication_turn(self.now);
        self.say(said);
        self.pump();
    }

    /// Turns, moving the clock to each wake-up, until `done` holds.
    fn until(&mut self, mut done: impl FnMut(&Sim) -> bool) {
        for _ in 0..100_000 {
            self.turn();
            if done(self) {
                return;
            }
            if let Some(t) = self.core.poll_timeout()
                && t > self.now
            {
                self.now = t;
            }
        }
        panic!("never done; seen: {:?}", self.seen.last());
    }

    fn until_serving(&mut self) {
        let region = self.region;
        self.until(|s| s.core.copy_state(region, "B") == Some(ReplicaState::Serving));
    }

    fn answer_held_reads(&mut self) {
        for (link, tag, at, server) in std::mem::take(&mut self.held_reads) {
            self.answer_read(link, tag, at, BLOCK, &server);
        }
    }

    /// The resync's block writes to `server`, by offset, in order.
    fn sync_writes(&self, server: &str) -> Vec<u64> {
        self.seen
            .iter()
            .filter_map(|s| match s {
                Seen::SyncWrite { server: at, offset } if at == server => Some(*offset),
                _ => None,
            })
            .collect()
    }

    fn copies_equal(&self) -> bool {
        (0..BLOCKS).all(|b| {
            let (a, b) = (
                self.stored("A", self.region, b),
                self.stored("B", self.region, b),
            );
            let zeros = |d: &Vec<u8>| d.iter().all(|&x| x == 0);
            match (a, b) {
                (Some(a), Some(b)) => a == b,
                (Some(d), None) | (None, Some(d)) => zeros(d),
                (None, None) => true,
            }
        })
    }
}

#[test]
fn only_the_blocks_that_differ_are_copied_and_the_copy_then_serves() {
    let mut sim = Sim::syncing();
    sim.write("A", 3 * BLOCK + 17, &[9; 100]);
    sim.write("A", 700 * BLOCK, &[4; 5]);
    sim.write("B", 3 * BLOCK, &[1; 3]);
    // Data on the syncing copy only: the deciding copy's zeros win.
    sim.write("B", 900 * BLOCK + 5, &[6; 10]);
    assert!(!sim.copies_equal());
    sim.until_serving();

    assert_eq!(
        sim.sync_writes("B"),
        [3 * BLOCK, 700 * BLOCK, 900 * BLOCK],
        "each differing block once, nothing else"
    );
    assert!(
        sim.sync_writes("A").is_empty(),
        "the source is never written"
    );
    assert!(sim.copies_equal());
    // Two passes: the one that copied and one that found nothing, each
    // asking both copies about all 1024 blocks in runs of 64.
    let sums = sim
        .seen
        .iter()
        .filter(|s| matches!(s, Seen::Sums { .. }))
        .count();
    assert_eq!(sums, 2 * 2 * 16);
    // The mark comes after the last copy, and reads may then use the copy.
    let mark = sim
        .seen
        .iter()
        .position(|s| {
            matches!(
                s,
                Seen::Mark {
                    state: ReplicaState::Serving,
                    ..
                }
            )
        })
        .unwrap();
    let last_write = sim
        .seen
        .iter()
        .rposition(|s| matches!(s, Seen::SyncWrite { .. }))
        .unwrap();
    assert!(mark > last_write);
    assert_eq!(sim.core.resync_status(sim.region, "B"), None, "ended");
    assert_eq!(sim.core.metrics.resyncs_finished.get(), 1);
    assert_eq!(sim.core.metrics.resync_blocks_copied.get(), 3);
    assert_eq!(sim.core.metrics.resync_bytes_copied.get(), 3 * BLOCK);
    assert_eq!(sim.core.metrics.resync_blocks_compared.get(), 2 * BLOCKS);
}

#[test]
fn a_write_to_a_block_being_copied_reaches_the_syncing_copy_after_the_copy() {
    let mut sim = Sim::syncing();
    sim.write("A", 3 * BLOCK, &[9; 64]);
    sim.hold_reads = true;
    sim.until(|s| !s.held_reads.is_empty());
    let status = sim.core.resync_status(sim.region, "B").unwrap();
    assert_eq!(status.blocks_copied, 0, "the block is held, its READ out");
    assert_eq!(
        (
            status.progress.passes,
            status.progress.done,
            status.progress.total
        ),
        (1, 64, BLOCKS),
        "the first run of the first pass compared"
    );
    assert!(!status.finishing);

    // The application writes into the held block: it waits.
    send(
        &mut sim.core,
        |c| Repr::write(pmem(c, "PA.1", 3 * BLOCK + 10), key(c, "PA.1"), &[5; 8]),
        7,
    );
    sim.pump();
    let app = |s: &Seen| matches!(s, Seen::App { .. });
    assert!(!sim.seen.iter().any(app), "it waits for the hold");

    sim.hold_reads = false;
    sim.answer_held_reads();
    sim.pump();
    let on_b: Vec<Seen> = sim
        .seen
        .iter()
        .filter(|s| {
            matches!(s, Seen::SyncWrite { server, .. } | Seen::App { server, .. } if server == "B")
        })
        .cloned()
        .collect();
    assert_eq!(
        on_b,
        [
            Seen::SyncWrite {
                server: "B".into(),
                offset: 3 * BLOCK
            },
            Seen::App {
                server: "B".into(),
                op: Operation::Write,
                offset: 3 * BLOCK + 10
            },
        ],
        "the copied block first, the application's write after it"
    );
    assert!(sim.seen.contains(&Seen::Answer {
        tag: 7,
        status: Status::Ok
    }));
    sim.until_serving();
    assert!(sim.copies_equal());
    assert_eq!(sim.read("B", 3 * BLOCK + 10, 8), [5; 8]);
}

#[test]
fn the_rate_spreads_the_copies_over_time() {
    // One block per second, a burst of one block.
    let config = ForwarderConfig {
        resync_rate: BLOCK,
        ..ForwarderConfig::default()
    };
    let mut sim = Sim::new(config, ReplicaState::Syncing);
    for b in [1, 2, 40, 1000] {
        sim.write("A", b * BLOCK, &[3; 16]);
    }
    let start = sim.now;
    sim.until_serving();
    assert_eq!(sim.sync_writes("B").len(), 4);
    let times = &sim.read_times;
    assert_eq!(times.len(), 4);
    for pair in times.windows(2) {
        assert!(
            pair[1] - pair[0] >= Duration::from_secs(1),
            "copies a second apart on the virtual clock: {:?}",
            pair[1] - pair[0]
        );
    }
    assert!(sim.now - start >= Duration::from_secs(3));
    assert!(sim.copies_equal());
}

#[test]
fn the_gated_housekeeping_reads_a_paced_block_at_its_deadline() {
    // One block per 10 ms, a burst of one block: the second block waits
    // for the bucket, well within the housekeeping's fallback.
    let config = ForwarderConfig {
        resync_rate: BLOCK * 100,
        ..ForwarderConfig::default()
    };
    let mut sim = Sim::new(config, ReplicaState::Syncing);
    sim.write("A", BLOCK, &[3; 16]);
    sim.write("A", 2 * BLOCK, &[4; 16]);
    sim.until(|s| s.read_times.len() == 1);
    // The first block's answers came within the turn; the next turn takes
    // the deadline the pacing set.
    sim.turn();
    assert_eq!(sim.read_times.len(), 1, "the bucket is empty");
    let paced = sim
        .core
        .housekeeping_next()
        .expect("a paced resync keeps a deadline");
    assert!(paced > sim.now, "{:?}", paced - sim.now);
    assert!(paced - sim.now <= Duration::from_millis(10));
    assert!(paced - sim.now < crate::housekeeping::FALLBACK);
    assert_eq!(sim.core.poll_timeout(), Some(paced), "the loop wakes then");

    sim.now = paced - Duration::from_micros(1);
    sim.turn();
    assert_eq!(sim.read_times.len(), 1, "not before its deadline");
    // Nothing happened since: only the deadline makes it due.
    sim.now = paced;
    sim.turn();
    assert_eq!(sim.read_times, [sim.read_times[0], paced], "read at it");
    sim.until_serving();
    assert_eq!(sim.sync_writes("B"), [BLOCK, 2 * BLOCK]);
    assert!(sim.copies_equal());
}

#[test]
fn the_gated_housekeeping_still_starts_a_resync_after_a_missed_mark() {
    let mut sim = Sim::new(ForwarderConfig::default(), ReplicaState::Serving);
    sim.turn();
    assert!(sim.core.resync_status(sim.region, "B").is_none());
    // A copy made `syncing` behind the housekeeping's back (no event marks
    // it): the fallback still starts its resync, and not later.
    sim.core
        .set_copy_state_unmarked(sim.region, "B", ReplicaState::Syncing);
    sim.now += crate::housekeeping::FALLBACK - Duration::from_millis(1);
    sim.turn();
    assert!(sim.core.resync_status(sim.region, "B").is_none(), "not due");
    sim.now += Duration::from_millis(1);
    sim.turn();
    assert!(
        sim.core.resync_status(sim.region, "B").is_some()
            || sim.core.copy_state(sim.region, "B") == Some(ReplicaState::Serving),
        "started at the fallback"
    );
    sim.until_serving();
}

#[test]
fn a_resync_waits_until_its_sources_server_runs_the_epoch_the_device_owns_the_region_from() {
    // The device owns PA.1 from epoch 5 (a region that had one copy, or a
    // takeover): B says it runs 5, A is still at 4, so A still serves
    // writes another device sent on an older map.
    let mut sim = Sim::syncing();
    let said = sim.core.set_epoch(5);
    assert!(!said.is_empty(), "MAP_EPOCH said on every link");
    let (a, b) = (links_of(&sim.core, "A"), links_of(&sim.core, "B"));
    for link in &b {
        super::takeover::server_runs(&mut sim.core, *link, 5, sim.now);
    }
    for link in &a {
        super::takeover::server_runs(&mut sim.core, *link, 4, sim.now);
    }
    // Past the request timeout the region's requests stop waiting for A
    // (its only serving copy); the resync still does, saying MAP_EPOCH to
    // A again.
    let end = sim.now + ForwarderConfig::default().request_timeout * 2;
    let mut resaid_to_a = 0;
    while sim.now < end {
        let resent = sim.core.replication_turn(sim.now);
        resaid_to_a += resent.iter().filter(|(l, _)| a.contains(l)).count();
        sim.pump();
        sim.now += Duration::from_millis(20);
    }
    assert!(
        !sim.seen.iter().any(|s| matches!(s, Seen::Sums { .. })),
        "no block summed before A runs epoch 5"
    );
    assert!(sim.core.resync_status(sim.region, "B").is_none());
    assert!(resaid_to_a > 2, "MAP_EPOCH said to A again: {resaid_to_a}");
    assert_eq!(
        sim.core.copy_state(sim.region, "A"),
        Some(ReplicaState::Serving)
    );

    sim.write("A", 3 * BLOCK, &[7; 64]);
    for link in &a {
        super::takeover::server_runs(&mut sim.core, *link, 5, sim.now);
    }
    sim.until_serving();
    assert_eq!(sim.sync_writes("B"), [3 * BLOCK]);
    assert!(sim.copies_equal());
}

#[test]
fn a_copy_lost_during_a_resync_releases_its_hold() {
    let mut sim = Sim::syncing();
    sim.write("A", 3 * BLOCK, &[9; 64]);
    sim.hold_reads = true;
    sim.until(|s| !s.held_reads.is_empty());
    send(
        &mut sim.core,
        |c| Repr::write(pmem(c, "PA.1", 3 * BLOCK + 10), key(c, "PA.1"), &[5; 8]),
        7,
    );
    sim.pump();
    // Server B goes away with the block held.
    for link in links_of(&sim.core, "B") {
        sim.core.link_down(link);
    }
    sim.pump();
    assert_eq!(
        sim.core.copy_state(sim.region, "B"),
        Some(ReplicaState::Offline)
    );
    assert_eq!(sim.core.resync_status(sim.region, "B"), None, "stopped");
    // The waiting write went out to the serving copy and was answered.
    assert!(sim.seen.contains(&Seen::App {
        server: "A".into(),
        op: Operation::Write,
        offset: 3 * BLOCK + 10
    }));
    assert!(sim.seen.contains(&Seen::Answer {
        tag: 7,
        status: Status::Ok
    }));
    // The READ's late answer copies nothing.
    sim.hold_reads = false;
    sim.answer_held_reads();
    sim.pump();
    assert!(sim.sync_writes("B").is_empty());
    assert_eq!(sim.core.requests_in_flight(), 0);
}

#[test]
fn a_resync_whose_source_lost_its_links_releases_its_hold_and_waits() {
    let mut sim = Sim::syncing();
    sim.write("A", 3 * BLOCK, &[9; 64]);
    sim.hold_reads = true;
    sim.until(|s| !s.held_reads.is_empty());
    send(
        &mut sim.core,
        |c| Repr::write(pmem(c, "PA.1", 3 * BLOCK + 10), key(c, "PA.1"), &[5; 8]),
        7,
    );
    sim.pump();
    let a_links = links_of(&sim.core, "A");
    for &link in &a_links {
        sim.core.link_down(link);
    }
    sim.held_reads.clear();
    sim.pump();
    // The last serving copy cannot be dropped: the write fails, it does
    // not wait forever.
    assert!(sim.seen.contains(&Seen::Answer {
        tag: 7,
        status: Status::ServerUnavailable
    }));
    assert_eq!(sim.core.requests_in_flight(), 0);
    // No source: nothing is asked or copied, however long it waits.
    let before = sim.seen.len();
    for _ in 0..5 {
        sim.now += Duration::from_secs(2);
        sim.turn();
    }
    assert_eq!(sim.seen.len(), before, "{:?}", &sim.seen[before..]);
    assert_eq!(sim.core.resync_status(sim.region, "B"), None);
    assert_eq!(
        sim.core.copy_state(sim.region, "B"),
        Some(ReplicaState::Syncing)
    );
    // The source is back: the resync runs to the end.
    sim.hold_reads = false;
    for link in a_links {
        bring_up_with_server_keys(&mut sim.core, link);
    }
    sim.until_serving();
    assert!(sim.copies_equal());
}

#[test]
fn an_offline_copy_whose_server_is_back_is_marked_syncing_and_resynced() {
    let mut sim = Sim::new(ForwarderConfig::default(), ReplicaState::Serving);
    let b_links = links_of(&sim.core, "B");
    for &link in &b_links {
        sim.core.link_down(link);
    }
    sim.pump();
    assert_eq!(
        sim.core.copy_state(sim.region, "B"),
        Some(ReplicaState::Offline)
    );
    // Written while B is down: on A only.
    send(
        &mut sim.core,
        |c| Repr::write(pmem(c, "PA.1", 5 * BLOCK), key(c, "PA.1"), &[8; 32]),
        3,
    );
    sim.turn();
    assert!(!sim.seen.iter().any(|s| matches!(s, Seen::Mark { .. })));
    assert!(!sim.copies_equal());

    for link in b_links {
        bring_up_with_server_keys(&mut sim.core, link);
    }
    sim.turn();
    assert_eq!(
        sim.seen
            .iter()
            .filter(|s| matches!(s, Seen::Mark { .. }))
            .collect::<Vec<_>>(),
        [&Seen::Mark {
            server: "B".into(),
            state: ReplicaState::Syncing
        }]
    );
    sim.until_serving();
    assert_eq!(sim.sync_writes("B"), [5 * BLOCK]);
    assert!(sim.copies_equal());
    let marks: Vec<&Seen> = sim
        .seen
        .iter()
        .filter(|s| matches!(s, Seen::Mark { .. }))
        .collect();
    assert_eq!(marks.len(), 2, "syncing, then serving: {marks:?}");
}

#[test]
fn a_copy_back_from_offline_gets_the_records_of_the_atomics_it_missed_before_its_walk() {
    let mut sim = Sim::new(ForwarderConfig::default(), ReplicaState::Serving);
    let b_links = links_of(&sim.core, "B");
    for &link in &b_links {
        sim.core.link_down(link);
    }
    sim.pump();
    // Decided at A while B is down: neither the word nor the record
    // reaches B.
    send(
        &mut sim.core,
        |c| Repr::fetch_add(pmem(c, "PA.1", 64), key(c, "PA.1"), 5).with_exactly_once(0, 31),
        3,
    );
    sim.turn();
    assert!(sim.seen.contains(&Seen::Answer {
        tag: 3,
        status: Status::Ok
    }));
    assert!(
        !sim.seen
            .iter()
            .any(|s| matches!(s, Seen::SyncRecord { .. }))
    );

    for link in b_links {
        bring_up_with_server_keys(&mut sim.core, link);
    }
    sim.until_serving();
    let to_b: Vec<&Seen> = sim
        .seen
        .iter()
        .filter(|s| match s {
            Seen::SyncRecord { .. } => true,
            Seen::Sums { server, .. } => server == "B",
            _ => false,
        })
        .collect();
    // The record first, under the client's identity, then the walk.
    assert_eq!(
        to_b[0],
        &Seen::SyncRecord {
            server: "B".into(),
            offset: 64,
            seq: Some(31),
            record: Some(AtomicRecord::new(Opcode::FetchAdd, 0, 5, 0)),
        }
    );
    assert!(
        to_b[1..].iter().all(|s| matches!(s, Seen::Sums { .. })),
        "one record, before every BLOCK_SUMS: {to_b:?}"
    );
    assert!(sim.copies_equal());

    // Every copy serves: the records are forgotten, a later resync of B
    // carries none.
    let records = |sim: &Sim| {
        sim.seen
            .iter()
            .filter(|s| matches!(s, Seen::SyncRecord { .. }))
            .count()
    };
    let b_links = links_of(&sim.core, "B");
    for &link in &b_links {
        sim.core.link_down(link);
    }
    sim.pump();
    for link in b_links {
        bring_up_with_server_keys(&mut sim.core, link);
    }
    sim.until_serving();
    assert_eq!(records(&sim), 1);
}

impl Sim {
    /// The requests refused STALE_MAP, as (server, operation).
    fn refusals(&self) -> Vec<(&str, Operation)> {
        self.seen
            .iter()
            .filter_map(|s| match s {
                Seen::Refused { server, op, .. } => Some((server.as_str(), *op)),
                _ => None,
            })
            .collect()
    }

    /// How many times `server` was asked for the checksums from block 0:
    /// once per pass, and once more for each start over.
    fn passes_begun(&self, server: &str) -> usize {
        self.seen
            .iter()
            .filter(|s| matches!(s, Seen::Sums { server: at, first: 0 } if at == server))
            .count()
    }

    /// B's links go down, FETCH_ADDs with identities (sequence numbers
    /// `seqs`, at words 64 bytes apart) are decided at A alone, and B's
    /// links come back: the copy is marked `syncing`.
    fn atomics_while_b_is_away(&mut self, seqs: &[u64]) {
        for link in links_of(&self.core, "B") {
            self.core.link_down(link);
        }
        self.pump();
        for (i, &seq) in seqs.iter().enumerate() {
            let offset = 64 * (i as u64 + 1);
            send(
                &mut self.core,
                |c| {
                    Repr::fetch_add(pmem(c, "PA.1", offset), key(c, "PA.1"), 5)
                        .with_exactly_once(0, seq)
                },
                seq,
            );
            self.turn();
            assert!(self.seen.contains(&Seen::Answer {
                tag: seq,
                status: Status::Ok
            }));
        }
        self.bring_up("B");
    }
}

#[test]
fn a_record_refused_stale_map_goes_again_once_the_server_confirms_the_epoch_and_the_resync_goes_on()
{
    let mut sim = Sim::at_epoch(ReplicaState::Serving, 4);
    // B reads epoch 5 (another region's mark) just before the first
    // record reaches it: that record is refused, nothing ran.
    sim.epochs
        .bumps
        .push_back(("B".into(), Operation::AtomicWrite, 5));
    sim.atomics_while_b_is_away(&[31, 32]);
    sim.until_serving();

    // Both records were on their way: both refused, nothing ran.
    assert_eq!(sim.refusals(), [("B", Operation::AtomicWrite); 2]);
    let to_b: Vec<&Seen> = sim
        .seen
        .iter()
        .filter(|s| match s {
            Seen::SyncRecord { .. } | Seen::Refused { .. } => true,
            Seen::Sums { server, .. } => server == "B",
            _ => false,
        })
        .collect();
    let records: Vec<(u64, Option<u64>)> = to_b
        .iter()
        .filter_map(|s| match s {
            Seen::SyncRecord { offset, seq, .. } => Some((*offset, *seq)),
            _ => None,
        })
        .collect();
    // Both again, in their order, once B confirmed epoch 5.
    assert_eq!(records, [(64, Some(31)), (128, Some(32))]);
    let first_sums = to_b
        .iter()
        .position(|s| matches!(s, Seen::Sums { .. }))
        .unwrap();
    let last_record = to_b
        .iter()
        .rposition(|s| matches!(s, Seen::SyncRecord { .. }))
        .unwrap();
    assert!(
        last_record < first_sums,
        "the walk follows the records: {to_b:?}"
    );
    assert_eq!(sim.passes_begun("B"), 1, "one pass, never started over");
    assert_eq!(sim.core.metrics.resyncs_stopped.get(), 0);
    assert_eq!(sim.core.metrics.resync_stale_resends.get(), 2);
    assert!(sim.copies_equal());
}

#[test]
fn a_record_refused_stale_map_too_often_stops_the_resync_which_starts_again() {
    let mut sim = Sim::at_epoch(ReplicaState::Serving, 4);
    // B confirms every epoch the device says and still refuses.
    sim.epochs.lacking = Some("B".into());
    sim.atomics_while_b_is_away(&[31]);
    sim.until(|s| s.core.metrics.resyncs_stopped.get() == 1);
    assert_eq!(
        sim.refusals(),
        [("B", Operation::AtomicWrite); 1 + crate::forward::replication::STALE_RESENDS as usize],
        "sent again after each refusal up to the bound"
    );
    assert_eq!(
        sim.core.metrics.resync_stale_resends.get(),
        u64::from(crate::forward::replication::STALE_RESENDS)
    );
    assert_eq!(sim.passes_begun("B"), 0, "the walk waited for the record");
    assert_eq!(sim.core.resync_status(sim.region, "B"), None, "stopped");
    assert_eq!(
        sim.core.copy_state(sim.region, "B"),
        Some(ReplicaState::Syncing)
    );

    // B takes requests again: the resync starts over, from its records.
    sim.epochs.lacking = None;
    sim.until_serving();
    assert_eq!(sim.core.metrics.resyncs_stopped.get(), 1);
    assert!(sim.copies_equal());
}

#[test]
fn a_block_write_refused_stale_map_is_copied_again_and_the_walk_goes_on() {
    let mut sim = Sim::at_epoch(ReplicaState::Syncing, 4);
    sim.write("A", 3 * BLOCK + 17, &[9; 100]);
    sim.write("A", 700 * BLOCK, &[4; 5]);
    sim.epochs
        .bumps
        .push_back(("B".into(), Operation::WritePersist, 5));
    sim.until_serving();

    assert_eq!(sim.refusals(), [("B", Operation::WritePersist)]);
    assert_eq!(
        sim.sync_writes("B"),
        [3 * BLOCK, 700 * BLOCK],
        "the refused block copied again, each applied once"
    );
    // The pass that copied and the one that found nothing: not started
    // over from the first block.
    assert_eq!(sim.passes_begun("B"), 2);
    assert_eq!(sim.core.metrics.resyncs_stopped.get(), 0);
    assert_eq!(sim.core.metrics.resync_stale_resends.get(), 1);
    assert_eq!(sim.core.metrics.resync_blocks_copied.get(), 2);
    assert!(sim.copies_equal());
}

#[test]
fn a_block_read_refused_stale_map_releases_its_hold_and_is_read_again() {
    let mut sim = Sim::at_epoch(ReplicaState::Syncing, 4);
    sim.write("A", 3 * BLOCK, &[9; 64]);
    sim.epochs.bumps.push_back(("A".into(), Operation::Read, 5));
    sim.until(|s| !s.refusals().is_empty());
    // The device has not read epoch 5 yet; the block is not held: a write
    // into it goes out (A refuses its part too, which goes again later).
    send(
        &mut sim.core,
        |c| Repr::write(pmem(c, "PA.1", 3 * BLOCK + 10), key(c, "PA.1"), &[5; 8]),
        7,
    );
    sim.pump();
    assert!(sim.seen.contains(&Seen::App {
        server: "B".into(),
        op: Operation::Write,
        offset: 3 * BLOCK + 10
    }));
    sim.until_serving();

    assert_eq!(
        sim.refusals(),
        [("A", Operation::Read), ("A", Operation::Write)]
    );
    assert!(sim.seen.contains(&Seen::Answer {
        tag: 7,
        status: Status::Ok
    }));
    assert_eq!(sim.read("B", 3 * BLOCK + 10, 8), [5; 8]);
    let reads = sim
        .seen
        .iter()
        .filter(|s| matches!(s, Seen::SyncRead { .. }))
        .count();
    assert_eq!(reads, 1, "read again once, after its refusal");
    assert_eq!(sim.sync_writes("B"), [3 * BLOCK]);
    assert_eq!(sim.passes_begun("B"), 2);
    assert_eq!(sim.core.metrics.resyncs_stopped.get(), 0);
    assert!(sim.copies_equal());
}

#[test]
fn a_record_refused_as_the_marks_move_the_epoch_again_and_again_goes_each_time() {
    let mut sim = Sim::at_epoch(ReplicaState::Serving, 4);
    // Each time the record goes, B has read a newer map than the device:
    // more refusals than the bound, none at an epoch it went under.
    for epoch in 5..10 {
        sim.epochs
            .bumps
            .push_back(("B".into(), Operation::AtomicWrite, epoch));
    }
    sim.atomics_while_b_is_away(&[31]);
    sim.until_serving();

    assert_eq!(sim.refusals(), [("B", Operation::AtomicWrite); 5]);
    const { assert!(5 > crate::forward::replication::STALE_RESENDS) };
    assert_eq!(sim.core.metrics.resyncs_stopped.get(), 0);
    assert_eq!(sim.core.metrics.resync_stale_resends.get(), 5);
    assert_eq!(sim.passes_begun("B"), 1);
    assert!(sim.copies_equal());
}

#[test]
fn a_copy_that_missed_many_records_gets_them_a_window_at_a_time() {
    let mut sim = Sim::new(ForwarderConfig::default(), ReplicaState::Serving);
    let seqs: Vec<u64> = (100..140).collect();
    sim.atomics_while_b_is_away(&seqs);
    let b = sim.server_of(links_of(&sim.core, "B")[0]);
    // The driver's loop by hand: what the core asks for at once, before
    // any of it is answered.
    let mut most = 0;
    let mut carried = 0;
    for _ in 0..10_000 {
        sim.read_map_if_asked();
        let said = sim.core.replication_turn(sim.now);
        sim.say(said);
        loop {
            let out = sim.core.take_outbox();
            if out.is_empty() {
                break;
            }
            let records = out
                .iter()
                .filter(|item| match item {
                    Outgoing::SendFrame { link, frame } => {
                        sim.server_of(*link) == b
                            && matches!(
                                proto::parse_frame(frame),
                                Ok((Message::Request(r), _)) if r.operation == Operation::AtomicWrite
                            )
                    }
                    _ => false,
                })
                .count();
            most = most.max(records);
            carried += records;
            for item in out {
                sim.serve(item);
            }
        }
        if sim.core.copy_state(sim.region, "B") == Some(ReplicaState::Serving) {
            break;
        }
        if let Some(t) = sim.core.poll_timeout()
            && t > sim.now
        {
            sim.now = t;
        }
    }
    assert_eq!(carried, seqs.len(), "every record went, once");
    assert_eq!(
        most,
        crate::forward::replication::RECORDS_IN_FLIGHT,
        "never more at once"
    );
    assert!(sim.copies_equal());
}
