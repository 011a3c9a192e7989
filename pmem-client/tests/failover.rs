//! The client library against real daemons: a seeded random workload checked
//! against a model of the whole space, fabric devices killed under it,
//! exactly-once atomics across failover, and a layout mismatch at connect.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pmem_client::{Batch, Completion, OpenError, Pool, PoolError, VIRT_BASE};
use testkit::{Daemon, FabricSpec, Ports};
use topology::{EnvOverrides, Topology, VirtAddr};

const DEVICE_FLAGS: &[&str] = &[
    "--request-timeout-ms",
    "2000",
    "--reconnect-min-ms",
    "20",
    "--reconnect-max-ms",
    "200",
];

fn spec() -> FabricSpec {
    FabricSpec::new()
        .server("A", &[("A1", "4MiB"), ("A2", "4MiB")])
        .server("B", &[("B1", "4MiB")])
        .device("F1")
        .device("F2")
        .client("c1")
        .client("c2")
        .client("c3")
}

/// Two servers, two fabric devices, every client wired to both.
struct Fabric {
    dir: tempfile::TempDir,
    config: PathBuf,
    _servers: Vec<Daemon>,
    devices: HashMap<String, Daemon>,
}

fn start_device(config: &Path, id: &str) -> Daemon {
    let device = testkit::fabric_device(config, id, DEVICE_FLAGS)
        .unwrap_or_else(|e| panic!("fabric-device {id} did not start:\n{e}"));
    device.wait_links_up(2);
    device
}

fn device_requests(device: &Daemon) -> u64 {
    let (_, text) = telemetry::http_get(device.addr("admin"), "/metrics", Duration::from_secs(5))
        .expect("scrape");
    text.lines()
        .filter(|l| l.starts_with("fabric_device_requests_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

impl Fabric {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = spec().write(dir.path(), "topology.toml", &mut Ports::new());
        let servers = testkit::pmem_servers(&config, &["A", "B"], dir.path());
        let devices = ["F1", "F2"]
            .iter()
            .map(|id| (id.to_string(), start_device(&config, id)))
            .collect();
        Self {
            dir,
            config,
            _servers: servers,
            devices,
        }
    }

    fn topology(&self) -> Topology {
        Topology::load_with(&self.config, &EnvOverrides::None).expect("topology")
    }

    fn pool(&self, client: &str) -> Pool {
        Pool::builder(self.topology(), client)
            .attempt_timeout(Duration::from_secs(1))
            .op_timeout(Duration::from_secs(15))
            .connect()
            .unwrap_or_else(|e| panic!("{}", pmem_client::error_chain(&e)))
    }

    /// Kills a device with SIGKILL; returns when the signal was sent, after
    /// the process is gone.
    fn kill_device(&mut self, id: &str) -> Instant {
        let device = self.devices.remove(id).expect("device");
        let sent = Instant::now();
        device.kill9();
        sent
    }

    fn restart_device(&mut self, id: &str) {
        let device = start_device(&self.config, id);
        self.devices.insert(id.to_owned(), device);
    }
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

const SPACE: u64 = 12 << 20;
const REGION: u64 = 4 << 20;
/// Words at the end of the space used by the atomics.
const WORDS_AT: u64 = SPACE - 4096;

fn v(offset: u64) -> VirtAddr {
    VirtAddr(VIRT_BASE + offset)
}

/// One random operation, applied to the pool and to the model.
fn step(pool: &Pool, model: &mut [u8], rng: &mut Rng) {
    match rng.below(10) {
        0..=3 => {
            // Writes, a third of them across a region boundary.
            let len = 1 + rng.below(48 << 10) as usize;
            let at = if rng.below(3) == 0 {
                let boundary = REGION * (1 + rng.below(2));
                boundary - rng.below(len as u64).max(1)
            } else {
                rng.below(WORDS_AT - len as u64)
            };
            let data = rng.bytes(len);
            if rng.below(2) == 0 {
                pool.write(v(at), &data).expect("write");
            } else {
                pool.write_persist(v(at), &data).expect("write_persist");
            }
            model[at as usize..at as usize + len].copy_from_slice(&data);
        }
        4..=6 => {
            let len = 1 + rng.below(64 << 10);
            let at = rng.below(SPACE - len);
            let got = pool.read(v(at), len).expect("read");
            assert!(
                got == model[at as usize..(at + len) as usize],
                "read of {len} bytes at +{at:#x} differs from the model"
            );
        }
        7 => {
            let word = WORDS_AT + 8 * rng.below(64);
            let delta = rng.below(1000);
            let old = pool.fetch_add(v(word), delta).expect("fetch_add");
            let slot = &mut model[word as usize..word as usize + 8];
            let expected = u64::from_le_bytes(slot.try_into().expect("8 bytes"));
            assert_eq!(old, expected, "fetch_add old value");
            slot.copy_from_slice(&expected.wrapping_add(delta).to_le_bytes());
        }
        8 => {
            let word = WORDS_AT + 8 * rng.below(64);
            let slot = &mut model[word as usize..word as usize + 8];
            let current = u64::from_le_bytes(slot.try_into().expect("8 bytes"));
            let guess = if rng.below(2) == 0 {
                current
            } else {
                current ^ 1
            };
            let new = rng.next();
            let swap = pool.compare_and_swap(v(word), guess, new).expect("cas");
            let expected = if guess == current {
                Ok(current)
            } else {
                Err(current)
            };
            assert_eq!(swap, expected, "compare_and_swap outcome");
            if guess == current {
                slot.copy_from_slice(&new.to_le_bytes());
            }
        }
        _ => {
            let len = 1 + rng.below(1 << 20);
            let at = rng.below(SPACE - len);
            pool.flush(v(at), len).expect("flush");
        }
    }
}

#[test]
fn random_workload_survives_a_killed_fabric_device() {
    let mut fabric = Fabric::start();
    let pool = fabric.pool("c1");
    let mut model = vec![0u8; SPACE as usize];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..150 {
        step(&pool, &mut model, &mut rng);
    }
    let before = device_requests(&fabric.devices["F1"]);
    assert!(before > 0, "the first path carries the traffic");

    // Kill the device carrying the traffic; the next request must complete
    // on the other path without the application seeing anything.
    let killed = fabric.kill_device("F1");
    let got = pool.read(v(0), 64).expect("read right after the kill");
    let failover = killed.elapsed();
    assert!(got == model[..64]);
    eprintln!("failover: first request completed {failover:?} after kill -9 of F1");
    let f2_before = device_requests(&fabric.devices["F2"]);
    for _ in 0..150 {
        step(&pool, &mut model, &mut rng);
    }
    assert!(
        !pool.paths()[0].up,
        "the dead device's path is down: {:?}",
        pool.paths()
    );
    assert!(
        device_requests(&fabric.devices["F2"]) > f2_before + 100,
        "the other device carries the traffic"
    );

    // Bring F1 back: the client reconnects and uses it again.
    fabric.restart_device("F1");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pool.paths().iter().all(|p| p.up) {
        assert!(Instant::now() < deadline, "{:?}", pool.paths());
        std::thread::sleep(Duration::from_millis(20));
    }
    for _ in 0..150 {
        step(&pool, &mut model, &mut rng);
    }
    assert!(
        device_requests(&fabric.devices["F1"]) > 0,
        "the restarted device carries traffic again"
    );

    // Everything acknowledged is there.
    let whole = pool.read(v(0), SPACE).expect("read the whole space");
    assert!(whole == model, "the pool matches the model");
    assert!(pool.stats().reconnects >= 1);
}

#[test]
fn fetch_add_from_three_clients_is_exact_across_a_device_kill() {
    let mut fabric = Fabric::start();
    let word = v(WORDS_AT + 2048);
    const PER_CLIENT: u64 = 10_000;
    let pools: Vec<Pool> = ["c1", "c2", "c3"].iter().map(|c| fabric.pool(c)).collect();
    let done = std::sync::atomic::AtomicU64::new(0);
    let done_at_kill = std::thread::scope(|s| {
        for pool in &pools {
            let done = &done;
            s.spawn(move || {
                for _ in 0..PER_CLIENT {
                    pool.fetch_add(word, 1)
                        .unwrap_or_else(|e| panic!("{}", pmem_client::error_chain(&e)));
                    done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
        while done.load(std::sync::atomic::Ordering::Relaxed) < PER_CLIENT / 2 {
            std::thread::sleep(Duration::from_millis(1));
        }
        fabric.kill_device("F1");
        done.load(std::sync::atomic::Ordering::Relaxed)
    });
    assert!(
        done_at_kill < 3 * PER_CLIENT,
        "the device died during the run"
    );
    let total = pools[0].fetch_add(word, 0).expect("read the word");
    assert_eq!(total, 3 * PER_CLIENT);
}

#[test]
fn layout_mismatch_is_refused_at_connect() {
    let fabric = Fabric::start();
    // The client believes in one more region than the devices serve.
    let mut ports = Ports::new();
    let theirs = spec().write(fabric.dir.path(), "same-ports.toml", &mut ports);
    drop(theirs);
    let text = std::fs::read_to_string(&fabric.config).expect("read topology");
    let extra = text.replacen(
        "id = \"B1\"",
        "id = \"B1\"\n      size = \"4MiB\"\n      [[servers.sockets.devices.regions]]\n      id = \"B2\"",
        1,
    );
    assert_ne!(extra, text, "the topology changed");
    let path = fabric.dir.path().join("client-view.toml");
    std::fs::write(&path, extra).expect("write");
    let topology = Topology::load_with(&path, &EnvOverrides::None).expect("client topology");
    topology
        .validate()
        .expect("the client's view is valid on its own");
    let err = Pool::connect(topology, "c1").expect_err("must refuse");
    assert!(matches!(err, OpenError::Refused { .. }), "{err:?}");
    let text = pmem_client::error_chain(&err);
    assert!(text.contains("serves layout"), "{text}");
    assert!(text.contains("same topology"), "{text}");
}

#[test]
fn unknown_client_and_unmapped_addresses_are_clear_errors() {
    let fabric = Fabric::start();
    let err = Pool::connect(fabric.topology(), "nobody").expect_err("unknown client");
    assert!(pmem_client::error_chain(&err).contains("nobody"), "{err}");

    let pool = fabric.pool("c2");
    match pool.read(VirtAddr(VIRT_BASE - 8), 8) {
        Err(PoolError::Unmapped { at }) => {
            assert_eq!(at, pmem_client::Address::Virtual(VirtAddr(VIRT_BASE - 8)))
        }
        other => panic!("{other:?}"),
    }
    match pool.read(v(SPACE - 4), 8) {
        Err(PoolError::Unmapped { .. }) => {}
        other => panic!("a read past the end: {other:?}"),
    }
    match pool.fetch_add(v(4), 1) {
        Err(PoolError::Misaligned { .. }) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn async_batches_and_fence() {
    let fabric = Fabric::start();
    let topology = fabric.topology();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let pool = pmem_client::AsyncPool::connect(topology, "c3")
            .await
            .expect("connect");
        let mut batch = Batch::new();
        for i in 0..64u64 {
            batch.write(v(i * 4096), vec![i as u8; 100]);
            batch.fetch_add(v(WORDS_AT), 1);
        }
        let results = pool.submit(batch).await;
        assert_eq!(results.len(), 128);
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        let writer = pool.clone();
        let pending =
            tokio::spawn(async move { writer.write_persist(v(REGION - 50), &[7; 100]).await });
        tokio::task::yield_now().await;
        pool.fence().await;
        pending.await.expect("join").expect("write_persist");
        let mut reads = Batch::new();
        reads.read(v(63 * 4096), 100).read(v(REGION - 50), 100);
        let got = pool.submit(reads).await;
        assert_eq!(
            got[0].as_ref().expect("read"),
            &Completion::Data(vec![63; 100])
        );
        assert_eq!(
            got[1].as_ref().expect("read"),
            &Completion::Data(vec![7; 100])
        );
        assert_eq!(pool.fetch_add(v(WORDS_AT), 0).await.expect("faa"), 64);
    });
}
