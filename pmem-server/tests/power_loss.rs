//! Power loss at every persistence step of a mixed workload.
//!
//! The server runs in process on the emulated persistence domain: stores stay
//! in private memory until persisted, and only persisted cache lines reach
//! the region files and the exactly-once file. For every step `k` of the
//! workload the test starts a fresh server, cuts the power after `k` persist
//! steps (once as is, once letting the caches evict a random subset of the
//! unpersisted words), reopens the server from its files as after a reboot,
//! and checks:
//!
//! - nothing acknowledged is missing: every acknowledged WRITE_PERSIST,
//!   flushed WRITE and persistent atomic is in the region;
//! - no atomic is torn: every atomic word holds a value the history allows;
//! - retrying every request (as a client whose connection died would)
//!   returns the first execution's result for every exactly-once atomic,
//!   and leaves the region exactly as a run without power loss does.

use std::path::Path;

use pmem_server::Flow;
use pmem_server::persist::{PersistPolicy, PowerDomain};
use pmem_server::{OpenedServer, ServerConfig};
use proto::request::{ExactlyOnce, Repr};
use proto::{AccessKey, Message, Status};
use testkit::{at, write_topology};
use topology::{RegionIndex, ServerId, Topology};

/// Lane `lane` of the topology's only client (number 0).
fn lane(lane: u8, seq: u64) -> ExactlyOnce {
    ExactlyOnce::on_lane(lane, seq).stamped(0)
}

/// One request of the workload; each touches its own bytes, except the two
/// FETCH_ADDs that share a word from two lanes.
#[derive(Clone)]
enum Op {
    WritePersist {
        offset: u64,
        data: Vec<u8>,
    },
    NonTemporalPersist {
        offset: u64,
        data: Vec<u8>,
    },
    Write {
        offset: u64,
        data: Vec<u8>,
    },
    Flush {
        offset: u64,
        len: u32,
    },
    FetchAdd {
        offset: u64,
        add: u64,
        once: ExactlyOnce,
    },
    CompareSwap {
        offset: u64,
        compare: u64,
        swap: u64,
        once: ExactlyOnce,
    },
    AtomicWrite {
        offset: u64,
        value: u64,
    },
}

const SHARED_WORD: u64 = 3 * 4096;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed | 1)
        .collect()
}

fn workload() -> Vec<Op> {
    vec![
        Op::WritePersist {
            offset: 7,
            data: pattern(100, 1),
        },
        Op::FetchAdd {
            offset: SHARED_WORD,
            add: 5,
            once: lane(0, 1),
        },
        Op::Write {
            offset: 4096 + 60,
            data: pattern(80, 2),
        },
        Op::Flush {
            offset: 4096 + 60,
            len: 80,
        },
        Op::CompareSwap {
            offset: SHARED_WORD + 64,
            compare: 0,
            swap: 77,
            once: lane(0, 2),
        },
        Op::AtomicWrite {
            offset: SHARED_WORD + 128,
            value: 0xdead_beef,
        },
        Op::FetchAdd {
            offset: SHARED_WORD,
            add: 7,
            once: lane(1, 1),
        },
        Op::WritePersist {
            offset: 8 * 4096 - 100,
            data: pattern(8192, 3),
        },
        Op::CompareSwap {
            offset: SHARED_WORD + 64,
            compare: 1,
            swap: 99,
            once: lane(0, 3),
        },
        Op::NonTemporalPersist {
            offset: 16 * 4096 + 3,
            data: pattern(300, 4),
        },
        Op::CompareSwap {
            offset: SHARED_WORD + 192,
            compare: 0,
            swap: 5,
            once: lane(1, 2),
        },
    ]
}

impl std::fmt::Debug for Op {
    /// The request without its payload bytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::WritePersist { offset, data } => {
                write!(f, "WRITE_PERSIST {} bytes at {offset}", data.len())
            }
            Op::NonTemporalPersist { offset, data } => {
                write!(
                    f,
                    "non-temporal WRITE_PERSIST {} bytes at {offset}",
                    data.len()
                )
            }
            Op::Write { offset, data } => write!(f, "WRITE {} bytes at {offset}", data.len()),
            Op::Flush { offset, len } => write!(f, "FLUSH {len} bytes at {offset}"),
            Op::FetchAdd { offset, add, once } => {
                write!(f, "FETCH_ADD {add} at {offset} as {once:?}")
            }
            Op::CompareSwap {
                offset,
                compare,
                swap,
                once,
            } => write!(f, "COMPARE_SWAP {compare}->{swap} at {offset} as {once:?}"),
            Op::AtomicWrite { offset, value } => {
                write!(f, "ATOMIC_WRITE {value:#x} at {offset}")
            }
        }
    }
}

impl Op {
    fn kind(&self) -> &'static str {
        match self {
            Op::WritePersist { .. } => "WRITE_PERSIST",
            Op::NonTemporalPersist { .. } => "WRITE_PERSIST (non-temporal)",
            Op::Write { .. } => "WRITE",
            Op::Flush { .. } => "FLUSH",
            Op::FetchAdd { .. } => "FETCH_ADD",
            Op::CompareSwap { .. } => "COMPARE_SWAP",
            Op::AtomicWrite { .. } => "ATOMIC_WRITE",
        }
    }

    fn request<'a>(&'a self, k: AccessKey) -> Repr<'a> {
        match self {
            Op::WritePersist { offset, data } => Repr::write_persist(at(0, *offset), k, data),
            Op::NonTemporalPersist { offset, data } => {
                Repr::write_persist(at(0, *offset), k, data).with_non_temporal()
            }
            Op::Write { offset, data } => Repr::write(at(0, *offset), k, data),
            Op::Flush { offset, len } => Repr::flush(at(0, *offset), k, *len),
            Op::FetchAdd { offset, add, once } => Repr::fetch_add(at(0, *offset), k, *add)
                .with_exactly_once(once.client, once.seq)
                .with_persist(),
            Op::CompareSwap {
                offset,
                compare,
                swap,
                once,
            } => Repr::compare_swap(at(0, *offset), k, *compare, *swap)
                .with_exactly_once(once.client, once.seq)
                .with_persist(),
            Op::AtomicWrite { offset, value } => {
                Repr::atomic_write(at(0, *offset), k, *value).with_persist()
            }
        }
    }
}

/// What one response said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Answer {
    status: Status,
    value: u64,
}

struct Server {
    opened: OpenedServer,
    session: pmem_server::Session,
    key: AccessKey,
}

impl Server {
    /// A server on new files, with the key it made for region 0.
    fn create(config: &ServerConfig) -> Server {
        let opened =
            OpenedServer::open(config).unwrap_or_else(|e| panic!("create the server: {e:?}"));
        let key = opened.exec.region(RegionIndex(0)).expect("region 0").key();
        let session = opened.exec.new_session();
        Server {
            opened,
            session,
            key,
        }
    }

    /// The server reopened after a power cut; requests carry `key`, the
    /// key it had before (a region keeps its key across the cut).
    fn reopen(config: &ServerConfig, key: AccessKey) -> Server {
        let opened = OpenedServer::open(config)
            .unwrap_or_else(|e| panic!("reopen after the power cut: {e:?}"));
        let session = opened.exec.new_session();
        Server {
            opened,
            session,
            key,
        }
    }

    fn call(&mut self, op: &Op) -> Answer {
        let mut frame = Vec::new();
        Message::Request(op.request(self.key))
            .encode_into(1, &mut frame)
            .expect("encode");
        let mut out = Vec::new();
        let flow = self
            .opened
            .exec
            .handle_frame(&mut self.session, &frame, &mut out)
            .expect("a well-formed request");
        assert_eq!(flow, Flow::Continue);
        match proto::parse_frame(&out).expect("one response frame") {
            (Message::Response(r), _) => Answer {
                status: r.status,
                value: r.value,
            },
            (other, _) => panic!("not a response: {other:?}"),
        }
    }

    fn bytes(&self, offset: u64, len: usize) -> Vec<u8> {
        let region = self.opened.exec.region(RegionIndex(0)).expect("region 0");
        let mut out = vec![0; len];
        region
            .file
            .map
            .read(
                (pmem_server::region_file::HEADER_LEN + offset) as usize,
                &mut out,
            )
            .expect("read the region");
        out
    }

    fn word(&self, offset: u64) -> u64 {
        u64::from_le_bytes(self.bytes(offset, 8).try_into().expect("8 bytes"))
    }
}

const REGION_LEN: usize = 4 << 20;
/// Random eviction orders tried at every cut point.
const EVICTIONS: u64 = 8;

struct Bench {
    _dir: tempfile::TempDir,
    topology: Topology,
    root: std::path::PathBuf,
}

impl Bench {
    fn new() -> Bench {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = write_topology(dir.path(), &[("R1", "4MiB")]);
        let topology = Topology::load(&path).expect("topology");
        let root = dir.path().to_owned();
        Bench {
            _dir: dir,
            topology,
            root,
        }
    }

    fn config(&self, data_dir: &Path, domain: &std::sync::Arc<PowerDomain>) -> ServerConfig {
        ServerConfig {
            topology: self.topology.clone(),
            server: ServerId::new("S"),
            data_dir: data_dir.to_owned(),
            admin: "127.0.0.1:0".parse().expect("address"),
            persistence: PersistPolicy::Emulated(std::sync::Arc::clone(domain)),
            format: false,
            create_missing: Vec::new(),
            reset_exactly_once: false,
            max_connections: 1,
            max_unproven: 1,
            timeouts: Default::default(),
            secrets: None,
            transport: None,
        }
    }
}

/// The workload without power loss: each answer, the steps it took and the
/// region afterwards.
struct Baseline {
    answers: Vec<Answer>,
    steps: u64,
    image: Vec<u8>,
}

fn baseline(bench: &Bench) -> Baseline {
    let domain = PowerDomain::new();
    let config = bench.config(&bench.root.join("baseline"), &domain);
    let mut server = Server::create(&config);
    let steps_at_open = domain.steps();
    let answers: Vec<Answer> = workload().iter().map(|op| server.call(op)).collect();
    for (op, answer) in workload().iter().zip(&answers) {
        assert_eq!(answer.status, Status::Ok, "{op:?}");
    }
    Baseline {
        answers,
        steps: domain.steps() - steps_at_open,
        image: server.bytes(0, REGION_LEN),
    }
}

/// Checks the region after a reboot against what was acknowledged: the
/// first `acked` requests of the workload completed while the power was on;
/// request `acked` (if any) was running when it went off.
fn check_durable(server: &Server, ops: &[Op], acked: usize, what: &str) {
    let mut shared_acked = 0;
    let mut shared_in_flight = 0;
    for (i, op) in ops.iter().enumerate() {
        let done = i < acked;
        let running = i == acked;
        match op {
            Op::WritePersist { offset, data } | Op::NonTemporalPersist { offset, data } => {
                if done {
                    assert_eq!(
                        server.bytes(*offset, data.len()),
                        *data,
                        "{what}: acknowledged {op:?} is missing"
                    );
                }
            }
            Op::Write { .. } => {}
            Op::Flush { offset, len } => {
                if done {
                    let Op::Write { data, .. } = &ops[i - 1] else {
                        panic!("a FLUSH follows its WRITE")
                    };
                    assert_eq!(
                        server.bytes(*offset, *len as usize),
                        *data,
                        "{what}: flushed write is missing"
                    );
                }
            }
            Op::FetchAdd { offset, add, .. } => {
                assert_eq!(*offset, SHARED_WORD);
                if done {
                    shared_acked += add;
                } else if running {
                    shared_in_flight += add;
                }
            }
            Op::CompareSwap {
                offset,
                compare,
                swap,
                ..
            } => {
                // Each CAS word sees one successful swap, from 0; a CAS
                // comparing with anything else never matches.
                let word = server.word(*offset);
                if *compare != 0 {
                    assert_ne!(word, *swap, "{what}: CAS at {offset} matched {compare}");
                } else if done {
                    assert_eq!(
                        word, *swap,
                        "{what}: acknowledged CAS at {offset} is missing"
                    );
                } else if running {
                    assert!(
                        word == 0 || word == *swap,
                        "{what}: CAS word at {offset} holds {word:#x}, neither before nor after"
                    );
                } else {
                    assert_eq!(
                        word, 0,
                        "{what}: CAS at {offset} happened before it was sent"
                    );
                }
            }
            Op::AtomicWrite { offset, value } => {
                let word = server.word(*offset);
                if done {
                    assert_eq!(word, *value, "{what}: acknowledged ATOMIC_WRITE is missing");
                } else {
                    assert!(
                        word == 0 || word == *value,
                        "{what}: torn ATOMIC_WRITE {word:#x}"
                    );
                }
            }
        }
    }
    let shared = server.word(SHARED_WORD);
    assert!(
        shared == shared_acked || shared == shared_acked + shared_in_flight,
        "{what}: the shared counter holds {shared}, expected {shared_acked} \
         (or {} with the request in flight)",
        shared_acked + shared_in_flight
    );
}

#[test]
fn every_crash_point_keeps_what_was_acknowledged_and_retries_apply_once() {
    let bench = Bench::new();
    let base = baseline(&bench);
    let ops = workload();
    assert!(base.steps >= ops.len() as u64, "every request persists");
    let mut explored = 0;
    // Cuts that fell inside each kind of request.
    let mut inside: std::collections::BTreeMap<&str, usize> = Default::default();
    for cut in 0..=base.steps {
        // No eviction, and caches that wrote back random subsets of the
        // unpersisted words.
        let seeds = (0..EVICTIONS).map(|i| Some(cut * 1000 + i + 1));
        for eviction in std::iter::once(None).chain(seeds) {
            let what = format!(
                "cut after step {cut} of {}, eviction {eviction:?}",
                base.steps
            );
            let data_dir = bench.root.join(format!("cut-{cut}-{eviction:?}"));
            let domain = PowerDomain::new();
            let config = bench.config(&data_dir, &domain);
            let (acked, key) = {
                let mut server = Server::create(&config);
                domain.cut_after(domain.steps() + cut, eviction);
                let mut acked = 0;
                for op in &ops {
                    let answer = server.call(op);
                    if !domain.is_on() {
                        break;
                    }
                    assert_eq!(answer.status, Status::Ok, "{what}: {op:?}");
                    acked += 1;
                }
                (acked, server.key)
            };
            // Reboot: a new domain with the power on, over the same files.
            let config = bench.config(&data_dir, &PowerDomain::new());
            let mut server = Server::reopen(&config, key);
            check_durable(&server, &ops, acked, &what);
            // The client retries everything it was not told about, and (to
            // check the replies) everything it was.
            for (i, op) in ops.iter().enumerate() {
                let answer = server.call(op);
                assert_eq!(answer, base.answers[i], "{what}: retry of {op:?}");
            }
            assert!(
                server.bytes(0, REGION_LEN) == base.image,
                "{what}: after the retries the region differs from a run without power loss"
            );
            explored += 1;
            *inside
                .entry(ops.get(acked).map_or("after the last", Op::kind))
                .or_default() += 1;
            std::fs::remove_dir_all(&data_dir).expect("clean up");
        }
    }
    println!(
        "{explored} power cuts explored over {} persist steps of {} requests; cuts inside \
         each kind of request: {inside:?}",
        base.steps,
        ops.len()
    );
}
