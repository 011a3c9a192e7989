//! The copies of replicated regions, moved and checked by `pmemctl`, with
//! real daemons on a real etcd: servers A (region A1) and B (region B1)
//! keep two copies of each region, fabric device F owns both.
//!
//! - `cluster drain-server`: server C holds nothing yet; a client writes
//!   through the pool library all along. B is drained: its copies move to
//!   C, it leaves the map, the application sees no error, every
//!   acknowledged write reads back, and each region's copies are
//!   byte-identical.
//! - `scrub --replicas`: a byte flipped in one copy's region file is found;
//!   the checksums its server recorded at rest name the damaged copy, which
//!   `--repair` has resynced; without recorded checksums nothing is
//!   repaired.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use control::{ClusterMap, Endpoints, Keys, ReplicaState};
use pmem_client::{AsyncPool, Pool};
use testkit::{Daemon, DaemonSpec, Etcd, FabricSpec, Ports, REGION_FILE_HEADER_LEN, file_bytes};
use topology::VirtAddr;

const REGION_LEN: u64 = 4 << 20;
const REGIONS: [&str; 2] = ["A1", "B1"];
const SLOT: u64 = 512;

fn data_dir(dir: &Path, server: &str) -> PathBuf {
    dir.join("data").join(server)
}

fn server(etcd: &Etcd, dir: &Path, id: &str) -> Daemon {
    Daemon::spawn(
        DaemonSpec::new(testkit::binary("pmem-server"))
            .args(["--etcd", &etcd.endpoint(), "--pool", "test", "--server", id])
            .args(["--admin", "127.0.0.1:0", "--insecure", "--data-dir"])
            .arg(data_dir(dir, id)),
    )
    .unwrap_or_else(|e| panic!("pmem-server {id} did not start:\n{e}"))
}

fn device(etcd: &Etcd, id: &str) -> Daemon {
    Daemon::spawn(
        DaemonSpec::new(testkit::binary("fabric-device"))
            .args(["--etcd", &etcd.endpoint(), "--pool", "test", "--device", id])
            .args(["--admin", "127.0.0.1:0", "--insecure"])
            .args(["--request-timeout-ms", "2000"])
            .args(["--reconnect-min-ms", "20", "--reconnect-max-ms", "200"]),
    )
    .unwrap_or_else(|e| panic!("fabric-device did not start:\n{e}"))
}

fn map_in(etcd: &Etcd) -> ClusterMap {
    let key = Keys::of("test").map();
    let records = etcd.get_prefix(&key).expect("etcdctl get");
    let (_, json) = records
        .iter()
        .find(|(k, _)| *k == key)
        .expect("the map in etcd");
    ClusterMap::from_json(&key, json.as_bytes()).expect("a map")
}

/// What the application wrote and what it was told.
struct Workload {
    /// Each region's bytes as they must read.
    regions: Vec<Vec<u8>>,
    /// Every error the pool returned.
    errors: Vec<String>,
}

/// Waits for a `pmemctl cluster drain-server B` run to end, and checks that
/// it succeeded and printed each of `lines` (`logs`: the devices' logs, for
/// the failure message).
fn drain_ended(drain: std::process::Child, lines: &[&str], logs: impl Fn() -> String) {
    let out = drain.wait_with_output().expect("pmemctl ends");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("pmemctl drain-server B:\n{stdout}{stderr}");
    assert!(
        out.status.success(),
        "drain-server failed: {stderr}\n{}",
        logs()
    );
    for line in lines {
        assert!(stdout.contains(line), "{line:?} in\n{stdout}");
    }
}

/// Client c1's pool on the map in `etcd`, with a thread writing through
/// it ([`write_until`]) until `stop`, already 20 rounds in (`when` names
/// the moment in the error if they never come).
struct Writing {
    pool: Arc<Pool>,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    writer: std::thread::JoinHandle<Workload>,
}

impl Writing {
    fn start(etcd: &Etcd, when: &str) -> Self {
        let endpoints = Endpoints::parse(&etcd.endpoint()).expect("endpoints");
        let pool = Arc::new(
            AsyncPool::builder_on_etcd(endpoints, "test", "c1")
                .connect()
                .unwrap_or_else(|e| panic!("pool: {}", pmem_client::error_chain(&e))),
        );
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let writer = {
            let (pool, stop, done) = (Arc::clone(&pool), Arc::clone(&stop), Arc::clone(&done));
            std::thread::spawn(move || write_until(&pool, &stop, &done))
        };
        wait_rounds(&done, 20, when);
        Self {
            pool,
            stop,
            done,
            writer,
        }
    }
}

/// WRITE_PERSISTs of 512 bytes to both regions, round after round, until
/// `stop`; `done` counts the rounds.
fn write_until(pool: &Pool, stop: &AtomicBool, done: &AtomicU64) -> Workload {
    let regions = pool.regions();
    let base = |name: &str| {
        regions
            .iter()
            .find(|(id, _, _)| id == name)
            .unwrap_or_else(|| panic!("region {name} in {regions:?}"))
            .1
            .0
    };
    let mut work = Workload {
        regions: vec![vec![0; REGION_LEN as usize]; REGIONS.len()],
        errors: Vec::new(),
    };
    let slots = REGION_LEN / SLOT;
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        // 2053 is odd: the offsets visit every slot, about 1 MiB apart.
        let offset = (i * 2053 % slots) * SLOT;
        for (r, region) in REGIONS.into_iter().enumerate() {
            let data: Vec<u8> = (0..SLOT)
                .map(|b| (b.wrapping_mul(31) ^ i.wrapping_mul(7) ^ r as u64 ^ 0x5a) as u8)
                .collect();
            match pool.write_persist(VirtAddr(base(region) + offset), &data) {
                Ok(()) => {
                    let at = offset as usize;
                    work.regions[r][at..at + data.len()].copy_from_slice(&data);
                }
                Err(e) => work.errors.push(format!(
                    "write {i} to {region}: {}",
                    pmem_client::error_chain(&e)
                )),
            }
        }
        i += 1;
        done.store(i, Ordering::Relaxed);
    }
    work
}

fn wait_rounds(done: &AtomicU64, at_least: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while done.load(Ordering::Relaxed) < at_least {
        assert!(Instant::now() < deadline, "no progress {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every acknowledged write of `work` reads back through `pool`.
fn reads_back(pool: &Pool, work: &Workload) {
    let regions = pool.regions();
    for (r, region) in REGIONS.into_iter().enumerate() {
        let base = regions
            .iter()
            .find(|(id, _, _)| id == region)
            .expect("region")
            .1
            .0;
        for offset in (0..REGION_LEN).step_by(64 << 10) {
            let read = pool
                .read(VirtAddr(base + offset), 64 << 10)
                .unwrap_or_else(|e| panic!("read {region} at {offset}: {e}"));
            let at = offset as usize;
            assert!(
                read == work.regions[r][at..at + (64 << 10)],
                "{region}: the block at {offset} reads as written"
            );
        }
    }
}

#[test]
fn a_server_is_drained_under_writes_its_copies_move_and_nothing_is_lost() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut ports = Ports::new();
    let spec = FabricSpec::new()
        .server("A", &[("A1", "4MiB")])
        .server("B", &[("B1", "4MiB")])
        .server("C", &[])
        .device("F")
        .client("c1");
    let config = spec.write(dir.path(), "topology.toml", &mut ports);
    let text = std::fs::read_to_string(&config).expect("read the topology");
    let b1 = "id = \"B1\"\n      size = \"4MiB\"\n";
    let replicated = text
        .replacen("name = \"test\"", "name = \"test\"\nreplicas = 2", 1)
        .replacen(b1, &format!("{b1}      replicas = [\"A:0\"]\n"), 1);
    assert_eq!(
        replicated.matches("replicas").count(),
        2,
        "testkit writes the pool and B1 where this test expects:\n{text}"
    );
    let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
    let key = Keys::of("test").map();
    etcd.put(&key, &ClusterMap::new(1, replicated).to_json())
        .expect("etcdctl put");

    let a = server(&etcd, dir.path(), "A");
    let b = server(&etcd, dir.path(), "B");
    let device = device(&etcd, "F");
    device.wait_links_up(2);

    let Writing {
        pool,
        stop,
        done,
        writer,
    } = Writing::start(&etcd, "before the drain");

    let drain = Command::new(env!("CARGO_BIN_EXE_pmemctl"))
        .args(["cluster", "--etcd", &etcd.endpoint(), "--pool", "test"])
        .args(["drain-server", "B", "--timeout", "120"])
        .env_remove("PMEM_FABRIC_ETCD")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run pmemctl");

    // C opens the copies the drain adds to it when it starts: once both
    // are in the map.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !REGIONS.iter().all(|r| {
        map_in(&etcd)
            .replica_set(r)
            .and_then(|s| s.state_on("C"))
            .is_some()
    }) {
        assert!(Instant::now() < deadline, "the drain added no copy on C");
        std::thread::sleep(Duration::from_millis(100));
    }
    let c = server(&etcd, dir.path(), "C");
    let logs = || {
        let of = |name: &str, d: &Daemon| format!("{name}'s log:\n{}", d.stderr_so_far());
        [
            of("device F", &device),
            of("server A", &a),
            of("server B", &b),
            of("server C", &c),
        ]
        .join("\n----\n")
    };

    drain_ended(
        drain,
        &[
            "server B: intent recorded as draining",
            "region A1: copy added on C",
            "region B1: copy added on C",
            "region A1: copy on B dropped; copies now A serving, C serving",
            "region B1: copy on B dropped (its table moved to A, now the primary); copies now A \
             serving, C serving",
            "server B: drained",
        ],
        || format!("the device's log:\n{}", device.stderr_so_far()),
    );

    // The application goes on after the drain, then stops.
    let after = done.load(Ordering::Relaxed) + 20;
    wait_rounds(&done, after, "after the drain");
    stop.store(true, Ordering::Relaxed);
    let work = writer.join().expect("the writer");
    assert_eq!(
        work.errors,
        Vec::<String>::new(),
        "no application error; the device's log:\n{}",
        device.stderr_so_far()
    );

    let map = map_in(&etcd);
    let topology = map.topology_at(&key).expect("a valid map");
    assert!(topology.servers.iter().all(|s| s.id.as_str() != "B"));
    // Each region's copies are A's and C's, both serving. On a loaded
    // machine an owner may take a copy out after the drain (a request to
    // it past the copy timeout) and resync it: waited for, with patience.
    let deadline = Instant::now() + Duration::from_secs(60);
    for region in REGIONS {
        loop {
            let map = map_in(&etcd);
            let record = map.replica_set(region).expect("still replicated");
            let copies: Vec<(String, ReplicaState)> = record
                .copies
                .iter()
                .map(|c| (c.server.clone(), c.state))
                .collect();
            let servers: Vec<&str> = copies.iter().map(|(s, _)| s.as_str()).collect();
            assert_eq!(servers, ["A", "C"], "{region}");
            if copies
                .iter()
                .all(|(_, state)| *state == ReplicaState::Serving)
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{region}: {copies:?}, not every copy serving; {}",
                logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    // Every acknowledged write reads back through the pool, and both
    // copies of each region are the same bytes past their headers.
    reads_back(&pool, &work);
    for (r, region) in REGIONS.into_iter().enumerate() {
        let on_a = file_bytes(&data_dir(dir.path(), "A"), region, 0, REGION_LEN as usize);
        let on_c = file_bytes(&data_dir(dir.path(), "C"), region, 0, REGION_LEN as usize);
        assert!(on_a == on_c, "{region}: the copies on A and C differ");
        assert!(
            on_c == work.regions[r],
            "{region}: C's copy holds every write"
        );
    }
}

/// Servers A (A1) and B (B1) in one failure domain, each region with a
/// single copy, server C (empty, not started) in another; devices F and G;
/// the pool library of client c1 (an RNIC to each device) writing to both
/// regions from its own thread.
struct SingleCopies {
    dir: tempfile::TempDir,
    etcd: Etcd,
    _servers: Vec<Daemon>,
    devices: Vec<Daemon>,
    pool: Arc<Pool>,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    writer: Option<std::thread::JoinHandle<Workload>>,
}

impl SingleCopies {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut ports = Ports::new();
        let spec = FabricSpec::new()
            .server("A", &[("A1", "4MiB")])
            .server("B", &[("B1", "4MiB")])
            .server("C", &[])
            .device("F")
            .device("G")
            .client("c1");
        let config = spec.write(dir.path(), "topology.toml", &mut ports);
        let text = std::fs::read_to_string(&config).expect("read the topology");
        // A and B share a failure domain: a copy of B1 goes to C.
        let shared = text
            .replacen("id = \"A\"\n", "id = \"A\"\ndomain = \"ab\"\n", 1)
            .replacen("id = \"B\"\n", "id = \"B\"\ndomain = \"ab\"\n", 1);
        assert_eq!(shared.matches("domain = \"ab\"").count(), 2, "{text}");
        let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
        etcd.put(
            &Keys::of("test").map(),
            &ClusterMap::new(1, shared).to_json(),
        )
        .expect("etcdctl put");
        let servers = vec![
            server(&etcd, dir.path(), "A"),
            server(&etcd, dir.path(), "B"),
        ];
        let devices = vec![device(&etcd, "F"), device(&etcd, "G")];
        for d in &devices {
            d.wait_links_up(2);
        }
        let Writing {
            pool,
            stop,
            done,
            writer,
        } = Writing::start(&etcd, "at the start");
        Self {
            dir,
            etcd,
            _servers: servers,
            devices,
            pool,
            stop,
            done,
            writer: Some(writer),
        }
    }

    fn logs(&self) -> String {
        let logs: Vec<String> = self.devices.iter().map(Daemon::stderr_so_far).collect();
        format!("the devices' logs:\n{}", logs.join("\n----\n"))
    }

    /// Starts server C once the map names a copy of `region` on it (a
    /// server opens the copies a map adds to it at its start).
    fn start_c_with(&self, region: &str) -> Daemon {
        let deadline = Instant::now() + Duration::from_secs(60);
        while map_in(&self.etcd)
            .replica_set(region)
            .and_then(|s| s.state_on("C"))
            .is_none()
        {
            assert!(
                Instant::now() < deadline,
                "no copy of {region} on C in the map"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server(&self.etcd, self.dir.path(), "C")
    }

    /// The application writes 20 rounds more, then stops: what it wrote,
    /// with no error.
    fn finish(&mut self) -> Workload {
        let after = self.done.load(Ordering::Relaxed) + 20;
        wait_rounds(&self.done, after, "at the end");
        self.stop.store(true, Ordering::Relaxed);
        let work = self
            .writer
            .take()
            .expect("the writer runs")
            .join()
            .expect("the writer");
        assert_eq!(
            work.errors,
            Vec::<String>::new(),
            "no application error; {}",
            self.logs()
        );
        reads_back(&self.pool, &work);
        work
    }
}

#[test]
fn a_single_copy_region_given_a_second_copy_under_writes_through_two_devices_loses_nothing() {
    let mut fabric = SingleCopies::start();
    // Both regions get a copy on C in one map change: each turns from
    // single-copy (both devices forward it on their plain path) into
    // replicated (its owner orders it), under the application's writes.
    let map = map_in(&fabric.etcd);
    let place = |text: String, region: &str| {
        let table = format!("id = \"{region}\"\n      size = \"4MiB\"\n");
        assert!(text.contains(&table), "{region} in\n{text}");
        text.replacen(&table, &format!("{table}      replicas = [\"C:0\"]\n"), 1)
    };
    let changed = place(place(map.topology.clone(), "A1"), "B1");
    let answered = |d: &Daemon| d.metric("fabric_device_requests_total", "").unwrap_or(0.0);
    let (plain_f, plain_g) = (answered(&fabric.devices[0]), answered(&fabric.devices[1]));
    let file = fabric.dir.path().join("replicated.toml");
    std::fs::write(&file, changed).expect("write the topology");
    let apply = Command::new(env!("CARGO_BIN_EXE_pmemctl"))
        .args([
            "cluster",
            "--etcd",
            &fabric.etcd.endpoint(),
            "--pool",
            "test",
        ])
        .args(["apply", "--from", file.to_str().expect("path"), "--epoch"])
        .arg(map.epoch.to_string())
        .env_remove("PMEM_FABRIC_ETCD")
        .output()
        .expect("run pmemctl");
    assert!(
        apply.status.success(),
        "{}",
        String::from_utf8_lossy(&apply.stderr)
    );
    let _c = fabric.start_c_with("B1");

    let deadline = Instant::now() + Duration::from_secs(60);
    while !REGIONS.iter().all(|r| {
        map_in(&fabric.etcd)
            .replica_set(r)
            .is_some_and(|s| s.serving() == 2)
    }) {
        assert!(
            Instant::now() < deadline,
            "C's copies not serving; {}",
            fabric.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let work = fabric.finish();
    // The regions' writes moved from F's plain path (the client's first
    // path) to their owners, one of them G.
    let owners: Vec<String> = REGIONS
        .iter()
        .map(|r| {
            let set = map_in(&fabric.etcd).replica_set(r).cloned();
            set.expect("replicated").owner
        })
        .collect();
    let (f, g) = (answered(&fabric.devices[0]), answered(&fabric.devices[1]));
    eprintln!(
        "owners {owners:?}; requests answered: F {f} ({plain_f} before the change), G {g} \
         ({plain_g} before)"
    );
    assert!(plain_f > 0.0 && owners.iter().any(|o| o == "G") && g > plain_g);
    for (r, (region, primary)) in REGIONS.into_iter().zip(["A", "B"]).enumerate() {
        let on_primary = file_bytes(
            &data_dir(fabric.dir.path(), primary),
            region,
            0,
            REGION_LEN as usize,
        );
        let on_c = file_bytes(
            &data_dir(fabric.dir.path(), "C"),
            region,
            0,
            REGION_LEN as usize,
        );
        assert!(
            on_primary == on_c,
            "{region}: the copies on {primary} and C differ"
        );
        assert!(
            on_c == work.regions[r],
            "{region}: C's copy holds every write"
        );
    }
}

#[test]
fn a_single_copy_region_is_drained_under_writes_through_two_devices_and_nothing_is_lost() {
    let mut fabric = SingleCopies::start();
    let drain = Command::new(env!("CARGO_BIN_EXE_pmemctl"))
        .args([
            "cluster",
            "--etcd",
            &fabric.etcd.endpoint(),
            "--pool",
            "test",
        ])
        .args(["drain-server", "B", "--timeout", "60"])
        .env_remove("PMEM_FABRIC_ETCD")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run pmemctl");
    let _c = fabric.start_c_with("B1");
    drain_ended(
        drain,
        &[
            "region B1: copy added on C",
            "region B1: copy on B dropped (its table moved to C, now the primary); copies now one \
             (a single copy again)",
            "server B: drained",
        ],
        || fabric.logs(),
    );
    let work = fabric.finish();
    let map = map_in(&fabric.etcd);
    let topology = map
        .topology_at(&Keys::of("test").map())
        .expect("a valid map");
    assert!(topology.servers.iter().all(|s| s.id.as_str() != "B"));
    assert!(map.replica_set("B1").is_none(), "B1 has one copy again");
    let record = Keys::of("test").drain_single_copies("B");
    assert_eq!(
        fabric.etcd.get_prefix(&record).expect("etcdctl get"),
        [],
        "the drain's record of B1 is gone once it ended"
    );
    let on_c = file_bytes(
        &data_dir(fabric.dir.path(), "C"),
        "B1",
        0,
        REGION_LEN as usize,
    );
    assert!(on_c == work.regions[1], "B1: C's copy holds every write");
}

/// Runs `pmemctl --etcd ENDPOINT --pool test ARGS…`: exit code, stdout,
/// stderr.
fn pmemctl(etcd: &Etcd, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pmemctl"))
        .args(["--etcd", &etcd.endpoint(), "--pool", "test"])
        .args(args)
        .env_remove("PMEM_FABRIC_ETCD")
        .env_remove("PMEM_FABRIC_SECRETS")
        .output()
        .expect("run pmemctl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Flips the bits of the byte at `offset` of `region`'s file on a server
/// that runs: a change its server never executed.
fn flip(data_dir: &Path, region: &str, offset: u64) {
    let path = data_dir.join(format!("{region}.pmem"));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut byte = [0u8];
    let at = REGION_FILE_HEADER_LEN + offset;
    file.read_exact_at(&mut byte, at).expect("read the byte");
    file.write_all_at(&[!byte[0]], at).expect("write the byte");
}

#[test]
fn scrub_names_a_damaged_copy_repairs_it_and_refuses_to_guess() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut ports = Ports::new();
    let spec = FabricSpec::new()
        .server("A", &[("A1", "4MiB")])
        .server("B", &[("B1", "4MiB")])
        .device("F")
        .client("c1");
    let config = spec.write(dir.path(), "topology.toml", &mut ports);
    let text = std::fs::read_to_string(&config).expect("read the topology");
    let replicated = text.replacen("name = \"test\"", "name = \"test\"\nreplicas = 2", 1);
    let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
    etcd.put(
        &Keys::of("test").map(),
        &ClusterMap::new(1, replicated).to_json(),
    )
    .expect("etcdctl put");
    let _a = server(&etcd, dir.path(), "A");
    let _b = server(&etcd, dir.path(), "B");
    let device = device(&etcd, "F");
    device.wait_links_up(2);

    // B1's copy on A is damaged before any checksum is recorded: two
    // copies, and nothing says which is right.
    flip(&data_dir(dir.path(), "A"), "B1", 3 * 65536 + 17);
    let (code, out, err) = pmemctl(&etcd, &["scrub", "--replicas"]);
    assert_ne!(code, 0, "{out}");
    for line in [
        "region A1: 64 blocks compared on copies A, B: identical",
        "region B1: 64 blocks compared on copies B, A: 1 differ",
        "DIFFERS region B1 block 3 (offset 0x30000, 65536 bytes)",
        "undecided: no majority among the copies on B, A and no checksum recorded at rest \
         says which one is damaged",
    ] {
        assert!(out.contains(line), "{line:?} in\n{out}");
    }
    assert!(
        err.contains(
            "1 block(s) differ between copies, 1 with no way to decide which copy is damaged"
        ),
        "{err}"
    );
    let (code, out, _) = pmemctl(
        &etcd,
        &["scrub", "--replicas", "--region", "B1", "--repair"],
    );
    assert_ne!(code, 0, "{out}");
    assert!(!out.contains("repair:"), "{out}");
    let record = map_in(&etcd)
        .replica_set("B1")
        .cloned()
        .expect("B1's record");
    assert_eq!(record.serving(), 2, "nothing marked: {record:?}");

    // A1's copy on B is damaged after its checksums were recorded (by the
    // scrubs above): B's server finds the block changed without a write.
    flip(&data_dir(dir.path(), "B"), "A1", 65536 + 5);
    let (code, out, err) = pmemctl(&etcd, &["scrub", "--replicas", "--region", "A1"]);
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("DIFFERS region A1 block 1 (offset 0x10000, 65536 bytes)")
            && out.contains("damaged: the copy on B (by the checksum its server recorded at rest)"),
        "{out}"
    );
    assert!(
        err.contains("--repair (with --etcd) marks the damaged copies syncing"),
        "{err}"
    );
    let (code, out, err) = pmemctl(
        &etcd,
        &["scrub", "--replicas", "--region", "A1", "--repair"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("repair: region A1: copy on B serving -> syncing"),
        "{out}"
    );

    // The owner resyncs B's copy from A's and marks it serving.
    let deadline = Instant::now() + Duration::from_secs(60);
    while map_in(&etcd)
        .replica_set("A1")
        .and_then(|r| r.state_on("B"))
        != Some(ReplicaState::Serving)
    {
        assert!(
            Instant::now() < deadline,
            "B's copy of A1 not serving again; the device's log:\n{}",
            device.stderr_so_far()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let on_a = file_bytes(&data_dir(dir.path(), "A"), "A1", 0, REGION_LEN as usize);
    let on_b = file_bytes(&data_dir(dir.path(), "B"), "A1", 0, REGION_LEN as usize);
    assert!(on_a == on_b, "A1's copies differ after the repair");
    let (code, out, err) = pmemctl(&etcd, &["scrub", "--replicas", "--region", "A1"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("region A1: 64 blocks compared on copies A, B: identical"),
        "{out}"
    );
}
