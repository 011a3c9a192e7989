//! Two queue pairs on a virtual clock, wired through a link that loses,
//! duplicates, reorders and corrupts datagrams at seeded rates.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use super::*;
use crate::roce::{Opcode, Psn, aeth};

const A_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const BASE: u64 = 0x10_0000;
const RKEY: u32 = 0x1234;
const MEM_LEN: usize = 64 * 1024;
const COUNTERS: u64 = 8;

/// SplitMix64: small, seeded, good enough to pick faults.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p && p > 0.0
    }
}

/// Fault rates of the simulated link, per datagram.
#[derive(Debug, Clone, Copy)]
struct Faults {
    loss: f64,
    duplicate: f64,
    reorder: f64,
    corrupt: f64,
}

const CLEAN: Faults = Faults {
    loss: 0.0,
    duplicate: 0.0,
    reorder: 0.0,
    corrupt: 0.0,
};

#[derive(Debug)]
struct Link {
    rng: Rng,
    faults: Faults,
    /// (delivery time, sequence, destination side, bytes)
    in_flight: Vec<(Instant, u64, usize, Vec<u8>)>,
    seq: u64,
    delay: Duration,
    cut: bool,
}

impl Link {
    fn send(&mut self, now: Instant, to: usize, bytes: &[u8]) {
        if self.cut || self.rng.chance(self.faults.loss) {
            return;
        }
        let copies = if self.rng.chance(self.faults.duplicate) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut data = bytes.to_vec();
            if self.rng.chance(self.faults.corrupt) {
                let i = self.rng.below(data.len() as u64) as usize;
                data[i] ^= 1 << self.rng.below(8);
            }
            let mut at = now + self.delay;
            if self.rng.chance(self.faults.reorder) {
                at += Duration::from_micros(self.rng.below(300));
            }
            self.seq += 1;
            self.in_flight.push((at, self.seq, to, data));
        }
    }

    fn next_delivery(&self) -> Option<Instant> {
        self.in_flight.iter().map(|p| p.0).min()
    }

    fn take_due(&mut self, now: Instant) -> Vec<(usize, Vec<u8>)> {
        let mut due: Vec<_> = Vec::new();
        let mut i = 0;
        while i < self.in_flight.len() {
            if self.in_flight[i].0 <= now {
                due.push(self.in_flight.swap_remove(i));
            } else {
                i += 1;
            }
        }
        due.sort_by_key(|p| (p.0, p.1));
        due.into_iter().map(|p| (p.2, p.3)).collect()
    }
}

fn config(local: u32, remote: u32, local_ip: Ipv4Addr, remote_ip: Ipv4Addr) -> QpConfig {
    let mut c = QpConfig::new(
        local,
        remote,
        Path {
            local_ip,
            remote_ip,
            src_port: 49152 + local as u16,
            dscp: 0,
            ttl: 64,
        },
    );
    c.pmtu = 256;
    c.timeout = 8; // ~1 ms
    c.min_rnr_timer = 1;
    c.max_rd_atomic = 4;
    c.max_dest_rd_atomic = 4;
    c.max_recv_wr = 1024;
    c
}

/// A completion kind without the bulk of its data, for messages.
fn brief(kind: Option<&CompletionKind>) -> String {
    match kind {
        Some(CompletionKind::Read(d)) => {
            let first_nonzero = d.iter().position(|&b| b != 0);
            format!(
                "Read(len {}, first non-zero byte at {first_nonzero:?})",
                d.len()
            )
        }
        Some(CompletionKind::Recv { data, imm }) => {
            format!("Recv(len {}, imm {imm:?})", data.len())
        }
        other => format!("{other:?}"),
    }
}

/// Two connected queue pairs, their memories and the link between them.
struct Pair {
    qp: [QueuePair; 2],
    mem: [BufferMemory; 2],
    link: Link,
    now: Instant,
    completions: [Vec<Completion>; 2],
}

impl Pair {
    fn new(seed: u64, faults: Faults) -> Self {
        let mut a = config(0x11, 0x22, A_IP, B_IP);
        let mut b = config(0x22, 0x11, B_IP, A_IP);
        // Start near the top of the PSN space so every run wraps around.
        a.send_psn = Psn::new(0xFF_FF00 + (seed as u32 % 200));
        b.recv_psn = a.send_psn;
        b.send_psn = Psn::new(0xFF_FFF0);
        a.recv_psn = b.send_psn;
        Pair {
            qp: [
                QueuePair::new(a).expect("config"),
                QueuePair::new(b).expect("config"),
            ],
            mem: [
                BufferMemory::new(BASE, RKEY, MEM_LEN),
                BufferMemory::new(BASE, RKEY, MEM_LEN),
            ],
            link: Link {
                rng: Rng(seed),
                faults,
                in_flight: Vec::new(),
                seq: 0,
                delay: Duration::from_micros(10),
                cut: false,
            },
            now: Instant::now(),
            completions: [Vec::new(), Vec::new()],
        }
    }

    /// Moves everything that can move now, then advances the clock to the
    /// next event. Returns false when nothing is left to happen.
    fn step(&mut self) -> bool {
        let mut buf = Vec::new();
        for side in 0..2 {
            self.qp[side].execute_with(&mut self.mem[side]);
            while self.qp[side].poll_transmit(self.now, &mut buf) {
                self.link.send(self.now, 1 - side, &buf);
            }
            while let Some(c) = self.qp[side].poll_completion() {
                self.completions[side].push(c);
            }
        }
        let next = [
            self.link.next_delivery(),
            self.qp[0].poll_timeout(),
            self.qp[1].poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(next) = next else { return false };
        self.now = self.now.max(next);
        for (to, bytes) in self.link.take_due(self.now) {
            self.qp[to].handle_datagram(self.now, &bytes);
        }
        for qp in &mut self.qp {
            if qp.poll_timeout().is_some_and(|t| t <= self.now) {
                qp.handle_timeout(self.now);
            }
        }
        true
    }

    fn run_until_idle(&mut self) {
        let start = self.now;
        while self.step() {
            assert!(
                self.now - start < Duration::from_secs(600),
                "no end in sight"
            );
        }
    }
}

fn remote(offset: u64) -> RemoteAddr {
    RemoteAddr {
        va: BASE + offset,
        rkey: RKEY,
    }
}

/// A random workload against the peer's memory with the result each
/// request must complete with, computed on a model of that memory: RC
/// executes a QP's requests in order, so the model applies them in order.
struct Workload {
    rng: Rng,
    model: Vec<u8>,
    expected: BTreeMap<u64, CompletionKind>,
    sends: VecDeque<Vec<u8>>,
    /// Ranges of recent READs: a write over one of them is fenced.
    reads: VecDeque<(u64, u64)>,
    next_id: u64,
}

impl Workload {
    fn new(seed: u64) -> Self {
        Workload {
            rng: Rng(seed ^ 0xABCD),
            model: vec![0; MEM_LEN],
            expected: BTreeMap::new(),
            sends: VecDeque::new(),
            reads: VecDeque::new(),
            next_id: 1,
        }
    }

    fn word(&self, offset: u64) -> u64 {
        let o = offset as usize;
        u64::from_ne_bytes(self.model[o..o + 8].try_into().expect("8 bytes"))
    }

    fn set_word(&mut self, offset: u64, value: u64) {
        let o = offset as usize;
        self.model[o..o + 8].copy_from_slice(&value.to_ne_bytes());
    }

    fn next(&mut self) -> WorkRequest {
        let wr_id = self.next_id;
        self.next_id += 1;
        let data_area = COUNTERS * 8;
        let (op, kind) = match self.rng.below(8) {
            0 | 1 => {
                let len = 1 + self.rng.below(1500);
                let off = data_area + self.rng.below(MEM_LEN as u64 - data_area - len);
                let data: Vec<u8> = (0..len).map(|_| self.rng.next() as u8).collect();
                self.model[off as usize..(off + len) as usize].copy_from_slice(&data);
                let op = WorkOp::Write {
                    remote: remote(off),
                    data,
                    imm: None,
                };
                (op, CompletionKind::Write)
            }
            2 | 3 => {
                let len = self.rng.below(1200) as u32;
                let off = self.rng.below(MEM_LEN as u64 - u64::from(len));
                let data = self.model[off as usize..off as usize + len as usize].to_vec();
                let op = WorkOp::Read {
                    remote: remote(off),
                    len,
                };
                (op, CompletionKind::Read(data))
            }
            4 => {
                let off = 8 * self.rng.below(COUNTERS);
                let add = 1 + self.rng.below(1000);
                let old = self.word(off);
                self.set_word(off, old.wrapping_add(add));
                let op = WorkOp::FetchAdd {
                    remote: remote(off),
                    add,
                };
                (op, CompletionKind::Atomic(old))
            }
            5 => {
                let off = 8 * self.rng.below(COUNTERS);
                let old = self.word(off);
                let compare = if self.rng.chance(0.5) { old } else { old ^ 1 };
                let swap = self.rng.next();
                if compare == old {
                    self.set_word(off, swap);
                }
                let op = WorkOp::CompareSwap {
                    remote: remote(off),
                    compare,
                    swap,
                };
                (op, CompletionKind::Atomic(old))
            }
            6 => {
                if self.rng.chance(0.5) {
                    let off = 8 * self.rng.below(COUNTERS);
                    let value = self.rng.next().to_ne_bytes();
                    self.model[off as usize..off as usize + 8].copy_from_slice(&value);
                    let op = WorkOp::AtomicWrite {
                        remote: remote(off),
                        value,
                    };
                    (op, CompletionKind::AtomicWrite)
                } else {
                    let op = WorkOp::persist(remote(self.rng.below(1024)), 4096);
                    (op, CompletionKind::Flush)
                }
            }
            _ => {
                let len = self.rng.below(700);
                let data: Vec<u8> = (0..len).map(|_| self.rng.next() as u8).collect();
                self.sends.push_back(data.clone());
                (WorkOp::Send { data, imm: None }, CompletionKind::Send)
            }
        };
        let written = match &op {
            WorkOp::Write { remote, data, .. } => Some((remote.va - BASE, data.len() as u64)),
            WorkOp::FetchAdd { remote, .. }
            | WorkOp::CompareSwap { remote, .. }
            | WorkOp::AtomicWrite { remote, .. } => Some((remote.va - BASE, 8)),
            WorkOp::Read { remote, len } => {
                if self.reads.len() == 64 {
                    self.reads.pop_front();
                }
                self.reads.push_back((remote.va - BASE, u64::from(*len)));
                None
            }
            _ => None,
        };
        let fence = written.is_some_and(|(off, len)| {
            self.reads
                .iter()
                .any(|&(r, rlen)| off < r + rlen && r < off + len)
        });
        self.expected.insert(wr_id, kind);
        WorkRequest { wr_id, op, fence }
    }
}

/// What one lossy run saw.
#[derive(Debug, Default)]
struct RunStats {
    requests: usize,
    retransmissions: u64,
    icrc_errors: u64,
    duplicates: u64,
}

/// Runs `count` random work requests in each direction at once and checks
/// that each completes exactly once with the model's result, and that each
/// side's memory ends equal to the model (so every atomic applied once).
fn lossy_run(seed: u64, faults: Faults, count: u64) -> RunStats {
    let mut pair = Pair::new(seed, faults);
    let mut loads = [Workload::new(seed), Workload::new(seed.wrapping_mul(31))];
    let mut posted = [0u64; 2];
    for side in 0..2 {
        for i in 0..count {
            pair.qp[1 - side]
                .post_recv(10_000 + i, 1024)
                .expect("receive queue");
        }
    }
    let start = pair.now;
    loop {
        for side in 0..2 {
            while posted[side] < count && pair.qp[side].outstanding() < 32 {
                let wr = loads[side].next();
                pair.qp[side].post(wr).expect("post");
                posted[side] += 1;
            }
        }
        let more = pair.step();
        let done = (0..2).all(|s| {
            posted[s] == count
                && pair.qp[s].outstanding() == 0
                && !pair.qp[1 - s].has_pending_executions()
        });
        if done && pair.link.in_flight.is_empty() {
            break;
        }
        assert!(more || done, "stalled: seed {seed} {faults:?}");
        assert!(
            pair.now - start < Duration::from_secs(3600),
            "seed {seed} {faults:?}: no end in sight"
        );
    }
    // Drain: completions of receives, late duplicates.
    pair.run_until_idle();
    for (side, load) in loads.iter().enumerate() {
        let mut seen = BTreeMap::new();
        for c in &pair.completions[side] {
            assert_eq!(c.status, WcStatus::Success, "seed {seed} {faults:?}: {c:?}");
            if matches!(c.kind, CompletionKind::Recv { .. }) {
                continue;
            }
            assert!(
                seen.insert(c.wr_id, c.kind.clone()).is_none(),
                "seed {seed}: wr {} completed twice",
                c.wr_id
            );
        }
        for (id, want) in &load.expected {
            let got = seen.get(id);
            assert!(
                got == Some(want),
                "seed {seed} {faults:?} side {side}: wr {id} got {} expected {}",
                brief(got),
                brief(Some(want))
            );
        }
        assert_eq!(
            seen.len(),
            load.expected.len(),
            "seed {seed}: extra completions"
        );
        // The SENDs side `side` made arrive at the other side, in order.
        let peer_recvs: Vec<Vec<u8>> = pair.completions[1 - side]
            .iter()
            .filter_map(|c| match &c.kind {
                CompletionKind::Recv { data, .. } => Some(data.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(
            peer_recvs,
            Vec::from(load.sends.clone()),
            "seed {seed} sends"
        );
        assert!(
            pair.mem[1 - side].bytes == load.model,
            "seed {seed} {faults:?}: memory of side {} differs from the model",
            1 - side
        );
        assert!(!pair.qp[side].in_error());
    }
    let c = [pair.qp[0].counters(), pair.qp[1].counters()];
    RunStats {
        requests: 2 * count as usize,
        retransmissions: c[0].retransmissions + c[1].retransmissions,
        icrc_errors: c[0].icrc_errors + c[1].icrc_errors,
        duplicates: c[0].duplicates + c[1].duplicates,
    }
}

#[test]
fn clean_link_completes_everything_without_retransmission() {
    let stats = lossy_run(1, CLEAN, 400);
    assert_eq!(stats.retransmissions, 0);
    assert_eq!(stats.duplicates, 0);
}

#[test]
fn every_work_request_completes_once_whatever_the_link_does() {
    let cases = [
        (
            "loss 1%",
            Faults {
                loss: 0.01,
                ..CLEAN
            },
        ),
        (
            "loss 5%",
            Faults {
                loss: 0.05,
                ..CLEAN
            },
        ),
        (
            "loss 10%",
            Faults {
                loss: 0.10,
                ..CLEAN
            },
        ),
        (
            "duplication 10%",
            Faults {
                duplicate: 0.10,
                ..CLEAN
            },
        ),
        (
            "reordering 20%",
            Faults {
                reorder: 0.20,
                ..CLEAN
            },
        ),
        (
            "corruption 5%",
            Faults {
                corrupt: 0.05,
                ..CLEAN
            },
        ),
        (
            "all at once",
            Faults {
                loss: 0.05,
                duplicate: 0.05,
                reorder: 0.10,
                corrupt: 0.02,
            },
        ),
    ];
    // RC_LOSSY_SEEDS=N runs more seeds per case (the default keeps CI short).
    let seeds: u64 = std::env::var("RC_LOSSY_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let mut runs = 0;
    for (name, faults) in cases {
        let mut total = RunStats::default();
        for seed in 0..seeds {
            let s = lossy_run(seed * 7919 + 3, faults, 150);
            total.requests += s.requests;
            total.retransmissions += s.retransmissions;
            total.icrc_errors += s.icrc_errors;
            total.duplicates += s.duplicates;
            runs += 1;
        }
        eprintln!("{name}: {total:?}");
        if faults.loss > 0.0 || faults.reorder > 0.0 {
            assert!(total.retransmissions > 0, "{name}: loss must be repaired");
        }
        if faults.corrupt > 0.0 {
            assert!(total.icrc_errors > 0, "{name}: corruption must be caught");
        }
        if faults.duplicate > 0.0 {
            assert!(total.duplicates > 0, "{name}: duplicates must be seen");
        }
    }
    eprintln!("{runs} lossy runs");
}

/// A responder memory that counts how often each kind of operation ran.
struct CountingMemory {
    inner: BufferMemory,
    atomics: usize,
}

impl RemoteMemory for CountingMemory {
    fn execute(&mut self, op: &MemoryOp) -> Result<MemoryReply, AccessError> {
        if matches!(op, MemoryOp::FetchAdd { .. } | MemoryOp::CompareSwap { .. }) {
            self.atomics += 1;
        }
        self.inner.execute(op)
    }
}

fn emit_all(qp: &mut QueuePair, now: Instant) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = Vec::new();
    while qp.poll_transmit(now, &mut buf) {
        out.push(buf.clone());
    }
    out
}

fn parse(bytes: &[u8]) -> packet::Repr<'_> {
    let d = Datagram::new_checked(bytes).expect("datagram");
    packet::Repr::parse(&d.transport).expect("packet")
}

#[test]
fn a_duplicate_atomic_is_answered_from_the_resource_ring_not_executed_again() {
    let now = Instant::now();
    let mut a = QueuePair::new(config(1, 2, A_IP, B_IP)).expect("a");
    let mut b = QueuePair::new(config(2, 1, B_IP, A_IP)).expect("b");
    let mut mem = CountingMemory {
        inner: BufferMemory::new(BASE, RKEY, 64),
        atomics: 0,
    };
    a.post(WorkRequest {
        fence: false,
        wr_id: 7,
        op: WorkOp::FetchAdd {
            remote: remote(8),
            add: 5,
        },
    })
    .expect("post");
    let request = emit_all(&mut a, now).remove(0);
    for _ in 0..3 {
        b.handle_datagram(now, &request);
        b.execute_with(&mut mem);
    }
    let replies = emit_all(&mut b, now);
    assert_eq!(mem.atomics, 1, "executed once");
    assert_eq!(replies.len(), 3, "every copy answered");
    for r in &replies {
        let p = parse(r);
        assert_eq!(p.bth.opcode, Opcode::AtomicAcknowledge);
        assert_eq!(p.atomic_ack, Some(0));
    }
    assert_eq!(b.counters().duplicates, 2);
    for r in &replies {
        a.handle_datagram(now, r);
    }
    let c = a.poll_completion().expect("completion");
    assert_eq!((c.wr_id, c.kind), (7, CompletionKind::Atomic(0)));
    assert_eq!(a.poll_completion(), None, "exactly one completion");
}

/// A WRITE then a READ whose responses are all lost, sent again by the
/// requester: the duplicate WRITE is acknowledged up to its own PSN, never
/// up to the READ's. A requester such as Linux rxe completes a READ on a
/// plain ACK of its PSN with no data placed, and the READ's response comes
/// only after that ACK.
#[test]
fn a_duplicate_write_is_acknowledged_no_further_than_itself() {
    let now = Instant::now();
    let mut a = QueuePair::new(config(1, 2, A_IP, B_IP)).expect("a");
    let mut b = QueuePair::new(config(2, 1, B_IP, A_IP)).expect("b");
    let mut mem = BufferMemory::new(BASE, RKEY, 4096);
    let write = WorkOp::Write {
        remote: remote(64),
        data: vec![3; 64],
        imm: None,
    };
    let read = WorkOp::Read {
        remote: remote(64),
        len: 64,
    };
    for (wr_id, op) in [(1, write), (2, read)] {
        a.post(WorkRequest {
            fence: false,
            wr_id,
            op,
        })
        .expect("post");
    }
    let requests = emit_all(&mut a, now);
    assert_eq!(requests.len(), 2, "one packet each");
    let read_psn = parse(&requests[1]).bth.psn;
    let mut deliver = |b: &mut QueuePair| {
        for r in &requests {
            b.handle_datagram(now, r);
            b.execute_with(&mut mem);
        }
        emit_all(b, now)
    };
    let lost = deliver(&mut b);
    assert_eq!(lost.len(), 2, "an ACK and a READ response, both lost");
    let replies = deliver(&mut b);
    assert_eq!(b.counters().duplicates, 2);
    let first_naming_the_read = replies
        .iter()
        .map(|r| parse(r))
        .find(|p| p.bth.psn == read_psn)
        .expect("the READ answered again");
    assert_eq!(
        first_naming_the_read.bth.opcode,
        Opcode::ReadResponseOnly,
        "nothing but the READ's response names its PSN"
    );
    for r in &replies {
        a.handle_datagram(now, r);
    }
    let kinds: Vec<_> = std::iter::from_fn(|| a.poll_completion())
        .map(|c| (c.wr_id, c.status, c.kind))
        .collect();
    assert_eq!(
        kinds,
        [
            (1, WcStatus::Success, CompletionKind::Write),
            (2, WcStatus::Success, CompletionKind::Read(vec![3; 64])),
        ]
    );
}

#[test]
fn a_gap_gets_one_sequence_nak_then_silence_until_in_order() {
    let now = Instant::now();
    let mut a = QueuePair::new(config(1, 2, A_IP, B_IP)).expect("a");
    let mut b = QueuePair::new(config(2, 1, B_IP, A_IP)).expect("b");
    let mut mem = BufferMemory::new(BASE, RKEY, 8192);
    a.post(WorkRequest {
        fence: false,
        wr_id: 1,
        op: WorkOp::Write {
            remote: remote(0),
            data: vec![7; 256 * 4],
            imm: None,
        },
    })
    .expect("post");
    let packets = emit_all(&mut a, now);
    assert_eq!(packets.len(), 4, "segmented to the path MTU");
    let opcodes: Vec<_> = packets.iter().map(|p| parse(p).bth.opcode).collect();
    assert_eq!(
        opcodes,
        [
            Opcode::WriteFirst,
            Opcode::WriteMiddle,
            Opcode::WriteMiddle,
            Opcode::WriteLast
        ]
    );
    assert!(parse(&packets[3]).bth.ack_req);
    // Packet 0 is lost.
    for p in &packets[1..] {
        b.handle_datagram(now, p);
    }
    let naks = emit_all(&mut b, now);
    assert_eq!(naks.len(), 1, "one NAK for the gap");
    let nak = parse(&naks[0]);
    assert_eq!(nak.bth.psn, Psn::new(0));
    assert_eq!(
        nak.aeth.map(|a| a.syndrome),
        Some(aeth::Syndrome::Nak(aeth::NakCode::PsnSequenceError))
    );
    a.handle_datagram(now, &naks[0]);
    let again = emit_all(&mut a, now);
    assert_eq!(again.len(), 4, "go-back-N from the NAKed PSN");
    for p in &again {
        b.handle_datagram(now, p);
        b.execute_with(&mut mem);
    }
    let acks = emit_all(&mut b, now);
    assert_eq!(acks.len(), 1, "one ACK for the message");
    a.handle_datagram(now, &acks[0]);
    assert_eq!(
        a.poll_completion().map(|c| c.status),
        Some(WcStatus::Success)
    );
    assert_eq!(&mem.bytes[..1024], &[7; 1024][..]);
}

#[test]
fn a_bad_key_completes_with_remote_access_error_and_flushes_the_rest() {
    let mut pair = Pair::new(5, CLEAN);
    let bad = RemoteAddr {
        va: BASE,
        rkey: RKEY + 1,
    };
    let ops = [
        WorkOp::Write {
            remote: remote(0),
            data: vec![1; 10],
            imm: None,
        },
        WorkOp::Read {
            remote: bad,
            len: 8,
        },
        WorkOp::Read {
            remote: remote(0),
            len: 8,
        },
    ];
    for (i, op) in ops.into_iter().enumerate() {
        pair.qp[0]
            .post(WorkRequest {
                fence: false,
                wr_id: i as u64,
                op,
            })
            .expect("post");
    }
    pair.run_until_idle();
    let statuses: Vec<_> = pair.completions[0].iter().map(|c| c.status).collect();
    assert_eq!(
        statuses,
        [
            WcStatus::Success,
            WcStatus::RemoteAccessError,
            WcStatus::Flushed
        ]
    );
    assert_eq!(pair.qp[1].counters().naks_sent_access, 1);
    // Out of bounds is refused the same way.
    let mut pair = Pair::new(6, CLEAN);
    pair.qp[0]
        .post(WorkRequest {
            fence: false,
            wr_id: 9,
            op: WorkOp::Read {
                remote: remote(MEM_LEN as u64 - 4),
                len: 8,
            },
        })
        .expect("post");
    pair.run_until_idle();
    assert_eq!(pair.completions[0][0].status, WcStatus::RemoteAccessError);
    // After the error, a new work request is flushed at once.
    pair.qp[0]
        .post(WorkRequest {
            fence: false,
            wr_id: 10,
            op: WorkOp::Read {
                remote: remote(0),
                len: 8,
            },
        })
        .expect("post");
    assert_eq!(
        pair.qp[0].poll_completion().map(|c| c.status),
        Some(WcStatus::Flushed)
    );
}

#[test]
fn a_dead_link_ends_in_retry_exceeded_after_the_configured_retries() {
    let mut pair = Pair::new(7, CLEAN);
    pair.link.cut = true;
    pair.qp[0]
        .post(WorkRequest {
            fence: false,
            wr_id: 1,
            op: WorkOp::Read {
                remote: remote(0),
                len: 8,
            },
        })
        .expect("post");
    pair.qp[0]
        .post(WorkRequest {
            fence: false,
            wr_id: 2,
            op: WorkOp::Read {
                remote: remote(0),
                len: 8,
            },
        })
        .expect("post");
    let start = pair.now;
    pair.run_until_idle();
    let statuses: Vec<_> = pair.completions[0].iter().map(|c| c.status).collect();
    assert_eq!(statuses, [WcStatus::RetryExceeded, WcStatus::Flushed]);
    assert_eq!(pair.qp[0].counters().timeouts, 8, "retry_cnt 7: 8 timeouts");
    let timeout = pair.qp[0].config().ack_timeout().expect("timeout");
    assert!(pair.now - start >= timeout * 8);
}

#[test]
fn a_send_without_a_receive_waits_out_rnr_naks() {
    let mut pair = Pair::new(8, CLEAN);
    pair.qp[0]
        .post(WorkRequest {
            fence: false,
            wr_id: 1,
            op: WorkOp::Send {
                data: b"hello".to_vec(),
                imm: Some(42),
            },
        })
        .expect("post");
    for _ in 0..20 {
        pair.step();
    }
    assert!(
        pair.qp[1].counters().naks_sent_rnr >= 2,
        "RNR NAKed while no receive"
    );
    assert!(pair.completions[0].is_empty());
    pair.qp[1].post_recv(77, 64).expect("recv");
    pair.run_until_idle();
    assert_eq!(pair.completions[0][0].status, WcStatus::Success);
    assert_eq!(
        pair.completions[1][0],
        Completion {
            wr_id: 77,
            status: WcStatus::Success,
            kind: CompletionKind::Recv {
                data: b"hello".to_vec(),
                imm: Some(42)
            }
        }
    );
    // With a bounded RNR retry count, the sender gives up.
    let mut pair = Pair::new(9, CLEAN);
    let mut c = *pair.qp[0].config();
    c.rnr_retry = 2;
    pair.qp[0] = QueuePair::new(c).expect("config");
    pair.qp[0]
        .post(WorkRequest {
            fence: false,
            wr_id: 1,
            op: WorkOp::Send {
                data: vec![1],
                imm: None,
            },
        })
        .expect("post");
    pair.run_until_idle();
    assert_eq!(pair.completions[0][0].status, WcStatus::RnrRetryExceeded);
}

#[test]
fn write_with_immediate_consumes_a_receive() {
    let mut pair = Pair::new(10, CLEAN);
    pair.qp[1].post_recv(5, 0).expect("recv");
    pair.qp[0]
        .post(WorkRequest {
            fence: false,
            wr_id: 1,
            op: WorkOp::Write {
                remote: remote(100),
                data: vec![3; 600],
                imm: Some(0xBEEF),
            },
        })
        .expect("post");
    pair.run_until_idle();
    assert_eq!(pair.completions[0][0].status, WcStatus::Success);
    assert_eq!(
        pair.completions[1][0].kind,
        CompletionKind::Recv {
            data: Vec::new(),
            imm: Some(0xBEEF)
        }
    );
    assert_eq!(&pair.mem[1].bytes[100..700], &[3; 600][..]);
}

#[test]
fn packets_for_another_qp_or_from_another_address_are_dropped_and_counted() {
    let now = Instant::now();
    let mut a = QueuePair::new(config(1, 2, A_IP, B_IP)).expect("a");
    let mut b = QueuePair::new(config(2, 1, B_IP, A_IP)).expect("b");
    let mut intruder = QueuePair::new(config(1, 2, Ipv4Addr::new(10, 0, 0, 9), B_IP)).expect("c");
    let mut wrong_qp = QueuePair::new(config(1, 3, A_IP, B_IP)).expect("d");
    let read = WorkRequest {
        fence: false,
        wr_id: 1,
        op: WorkOp::Read {
            remote: remote(0),
            len: 8,
        },
    };
    for qp in [&mut a, &mut intruder, &mut wrong_qp] {
        qp.post(read.clone()).expect("post");
        for p in emit_all(qp, now) {
            b.handle_datagram(now, &p);
        }
    }
    assert_eq!(b.counters().foreign, 2);
    assert_eq!(b.counters().packets_received, 1);
    b.handle_datagram(now, &[0x45, 0, 0]);
    assert_eq!(b.counters().malformed, 1);
}

#[test]
fn config_validation_names_the_problem() {
    let mut c = config(1, 2, A_IP, B_IP);
    c.pmtu = 1500;
    assert_eq!(QueuePair::new(c).err(), Some(ConfigError::Mtu(1500)));
    c.pmtu = 1024;
    c.remote_qpn = 1 << 24;
    assert_eq!(QueuePair::new(c).err(), Some(ConfigError::Qpn));
    assert_eq!(
        config(1, 2, A_IP, B_IP).ack_timeout(),
        Some(Duration::from_nanos(4096 * 256))
    );
}
