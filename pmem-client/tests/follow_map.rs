//! A client that takes its map from a real etcd and follows it while real
//! daemons serve: a server added, a fabric device removed, a map that
//! would move a region refused, all under a read/write loop that must see
//! no error.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use control::{ClusterMap, Endpoints, Keys};
use pmem_client::{AsyncPool, Pool, VIRT_BASE};
use testkit::{Daemon, DaemonSpec, Etcd, FabricSpec, Ports, pmem_server_with};
use topology::VirtAddr;

/// How long a test waits for something that should happen soon (a bound
/// on a wait, not a measurement).
const PATIENCE: Duration = Duration::from_secs(60);

/// Waits until `done` holds, naming `what` when it does not.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "still waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Puts `topology` as pool `test`'s map at `epoch`, as an operator's
/// change would.
fn put_map(etcd: &Etcd, epoch: u64, topology: &str) {
    let map = ClusterMap::new(epoch, topology);
    etcd.put(&Keys::of("test").map(), &map.to_json())
        .expect("etcdctl put");
}

fn text(path: &Path) -> String {
    std::fs::read_to_string(path).expect("topology")
}

fn server(config: &Path, id: &str, dir: &Path) -> Daemon {
    pmem_server_with(
        testkit::binary("pmem-server"),
        config,
        id,
        &dir.join(format!("data-{id}")),
        &[],
    )
    .unwrap_or_else(|e| panic!("pmem-server {id}: {e}"))
}

fn device_on_etcd(etcd: &Etcd, id: &str) -> Daemon {
    Daemon::spawn(
        DaemonSpec::new(testkit::binary("fabric-device"))
            .args(["--etcd", &etcd.endpoint(), "--pool", "test", "--device", id])
            .args(["--admin", "127.0.0.1:0", "--insecure"]),
    )
    .unwrap_or_else(|e| panic!("fabric device {id}: {e}"))
}

fn client_on_etcd(etcd: &Etcd) -> Pool {
    let endpoints = Endpoints::parse(&etcd.endpoint()).expect("endpoints");
    AsyncPool::builder_on_etcd(endpoints, "test", "c")
        .connect()
        .expect("the client opens the pool from etcd")
}

/// Writes and reads back words of `[base, base + 64 KiB)` until `stop`,
/// counting operations and errors (a failed call or a word read back
/// wrong).
struct Loop<'a> {
    pool: &'a Pool,
    base: VirtAddr,
    stop: AtomicBool,
    ops: AtomicU64,
    errors: AtomicU64,
}

impl<'a> Loop<'a> {
    fn new(pool: &'a Pool, base: VirtAddr) -> Self {
        Self {
            pool,
            base,
            stop: AtomicBool::new(false),
            ops: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        }
    }

    fn run(&self) {
        let mut i = 0u64;
        while !self.stop.load(Ordering::Relaxed) {
            let at = VirtAddr(self.base.0 + (i % 8192) * 8);
            let value = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let ok = self.pool.write_u64(at, value).is_ok()
                && self.pool.read_u64(at).ok() == Some(value);
            if !ok {
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
            self.ops.fetch_add(1, Ordering::Relaxed);
            i += 1;
        }
    }

    /// Lets the loop run until `ops` more operations are done.
    fn wait_for_ops(&self, ops: u64) {
        let target = self.ops.load(Ordering::Relaxed) + ops;
        wait_until("the loop's operations", || {
            self.ops.load(Ordering::Relaxed) >= target
        });
    }
}

#[test]
fn a_client_keeps_working_while_a_server_is_added_and_then_uses_its_region() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
    let (config_one, config_two) = testkit::one_then_two_servers(dir.path());
    put_map(&etcd, 1, &text(&config_one));
    let _s1 = server(&config_one, "S1", dir.path());
    // The new server runs before the map names it, as an operator would
    // start it before adding it.
    let _s2 = server(&config_two, "S2", dir.path());
    let device = device_on_etcd(&etcd, "F");
    device.wait_links_up(1);

    let pool = client_on_etcd(&etcd);
    assert_eq!(pool.map_epoch(), 1);
    let names = |pool: &Pool| -> Vec<String> { pool.regions().into_iter().map(|r| r.0).collect() };
    assert_eq!(names(&pool), ["R1"]);

    let work = Loop::new(&pool, VirtAddr(VIRT_BASE));
    std::thread::scope(|scope| {
        scope.spawn(|| work.run());
        work.wait_for_ops(100);
        put_map(&etcd, 2, &text(&config_two));
        wait_until("the client on epoch 2", || pool.map_epoch() == 2);
        work.wait_for_ops(100);
        work.stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(
        work.errors.load(Ordering::Relaxed),
        0,
        "errors across the change"
    );

    // The new server's region, at a virtual address after R1's, without
    // restarting the client (the device links to S2 once it runs epoch 2).
    device.wait_links_up(2);
    let regions = pool.regions();
    assert_eq!(names(&pool), ["R1", "R2"]);
    let (_, r1, r1_len) = regions[0];
    let (_, r2, _) = regions[1];
    assert_eq!(r1, VirtAddr(VIRT_BASE), "R1 keeps its address");
    assert_eq!(r2, VirtAddr(VIRT_BASE + r1_len));
    pool.write_persist(r2, b"on the new server")
        .expect("write the new region");
    assert_eq!(pool.read(r2, 17).expect("read"), b"on the new server");
    let stats = pool.stats();
    assert_eq!(stats.map_epochs, 1, "{stats:?}");
    assert_eq!(stats.maps_refused, 0, "{stats:?}");

    // `pmemctl` takes the same map from etcd.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pmemctl"))
        .args([
            "--etcd",
            &etcd.endpoint(),
            "--pool",
            "test",
            "--client",
            "c",
        ])
        .args(["read", &r2.0.to_string(), "17", "--out"])
        .arg(dir.path().join("read.bin"))
        .env_remove("PMEM_FABRIC_ETCD_CREDENTIALS")
        .output()
        .expect("run pmemctl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read = std::fs::read(dir.path().join("read.bin")).expect("read.bin");
    assert_eq!(read, b"on the new server");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pmemctl"))
        .args([
            "--etcd",
            &etcd.endpoint(),
            "--pool",
            "test",
            "--client",
            "c",
        ])
        .arg("map")
        .output()
        .expect("run pmemctl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("map epoch 2 from etcd"), "{text}");
    assert!(text.contains("R2"), "{text}");
}

#[test]
fn a_client_leaves_a_device_the_map_removes_for_its_other_path() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
    let config = FabricSpec::new()
        .server("S", &[("R1", "4MiB")])
        .device("F")
        .device("G")
        .client("c")
        .write(dir.path(), "topology.toml", &mut Ports::new());
    put_map(&etcd, 1, &text(&config));
    let _s = server(&config, "S", dir.path());
    let f = device_on_etcd(&etcd, "F");
    let g = device_on_etcd(&etcd, "G");
    f.wait_links_up(1);
    g.wait_links_up(1);

    let pool = client_on_etcd(&etcd);
    let on_g = |pool: &Pool| {
        let paths = pool.paths();
        paths
            .into_iter()
            .find(|p| p.device == "G")
            .expect("the path to G")
    };
    assert!(on_g(&pool).up && !on_g(&pool).retired);
    let without_g = control::edit::remove_device(&text(&config), "G").expect("remove G");

    let work = Loop::new(&pool, VirtAddr(VIRT_BASE));
    std::thread::scope(|scope| {
        scope.spawn(|| work.run());
        work.wait_for_ops(100);
        put_map(&etcd, 2, &without_g.topology);
        wait_until("the client on epoch 2", || pool.map_epoch() == 2);
        assert!(on_g(&pool).retired, "{:?}", pool.paths());
        // G goes away for good: nothing of the client's needs it.
        g.kill9();
        work.wait_for_ops(200);
        work.stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(
        work.errors.load(Ordering::Relaxed),
        0,
        "errors across the change"
    );
    let f_path = pool.paths().into_iter().find(|p| p.device == "F");
    assert!(f_path.is_some_and(|p| p.up && !p.retired));
}

#[test]
fn a_client_wired_to_a_device_the_map_adds_uses_it_when_its_first_device_dies() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
    let mut ports = Ports::new();
    // Epoch 1: c has one RNIC, on F. Epoch 2 adds device G and wires an
    // RNIC of c to it (FabricSpec wires each client to every device).
    let one = FabricSpec::new()
        .server("S", &[("R1", "4MiB")])
        .device("F")
        .client("c");
    let two = one.clone().device("G");
    let one = one.write(dir.path(), "one.toml", &mut ports);
    let two = two.write(dir.path(), "two.toml", &mut ports);
    put_map(&etcd, 1, &text(&one));
    // The server follows the map too: it keeps windows for the identities
    // each map names.
    let _s = Daemon::spawn(
        DaemonSpec::new(testkit::binary("pmem-server"))
            .args([
                "--etcd",
                &etcd.endpoint(),
                "--pool",
                "test",
                "--server",
                "S",
            ])
            .args(["--admin", "127.0.0.1:0", "--insecure", "--data-dir"])
            .arg(dir.path().join("data-S")),
    )
    .unwrap_or_else(|e| panic!("pmem-server S: {e}"));
    let f = device_on_etcd(&etcd, "F");
    f.wait_links_up(1);
    let pool = client_on_etcd(&etcd);
    let counter = VirtAddr(VIRT_BASE + (1 << 20));
    assert_eq!(pool.fetch_add(counter, 1).expect("on F"), 0);

    put_map(&etcd, 2, &text(&two));
    let g = device_on_etcd(&etcd, "G");
    g.wait_links_up(1);
    wait_until("the client on epoch 2", || pool.map_epoch() == 2);
    wait_until("the client's path to G", || {
        pool.paths().iter().any(|p| p.device == "G" && p.up)
    });

    // F dies: the client's writes, reads and exactly-once atomics go
    // through G, with no error.
    let work = Loop::new(&pool, VirtAddr(VIRT_BASE));
    std::thread::scope(|scope| {
        scope.spawn(|| work.run());
        work.wait_for_ops(100);
        f.kill9();
        work.wait_for_ops(300);
        work.stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(
        work.errors.load(Ordering::Relaxed),
        0,
        "errors across F's death"
    );
    for n in 1..=20 {
        assert_eq!(pool.fetch_add(counter, 1).expect("through G"), n);
    }
    let f_path = pool.paths().into_iter().find(|p| p.device == "F");
    assert!(f_path.is_some_and(|p| !p.up), "{:?}", pool.paths());
    drop(g);
}

#[test]
fn a_map_that_moves_a_region_is_refused_and_the_client_stays_on_its_epoch() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
    let config = FabricSpec::new()
        .server("S", &[("R1", "4MiB"), ("R2", "4MiB")])
        .device("F")
        .client("c")
        .write(dir.path(), "topology.toml", &mut Ports::new());
    let original = text(&config);
    put_map(&etcd, 1, &original);
    // The daemons serve the file: only the client sees the bad map.
    let _s = server(&config, "S", dir.path());
    let f = Daemon::spawn(testkit::fabric_device_spec(
        testkit::binary("fabric-device"),
        &config,
        "F",
        &[],
    ))
    .expect("device");
    f.wait_links_up(1);
    let pool = client_on_etcd(&etcd);
    let (_, r2, _) = pool.regions()[1];
    pool.write_persist(r2, b"before").expect("write R2");

    // R1 grows, which pushes R2 to another PMEM address.
    let grown = original.replacen(
        "id = \"R1\"\n      size = \"4MiB\"",
        "id = \"R1\"\n      size = \"8MiB\"",
        1,
    );
    assert_ne!(grown, original, "the test edits R1's size");
    let work = Loop::new(&pool, VirtAddr(VIRT_BASE));
    std::thread::scope(|scope| {
        scope.spawn(|| work.run());
        put_map(&etcd, 2, &grown);
        wait_until("the client to refuse epoch 2", || {
            pool.stats().maps_refused == 1
        });
        work.wait_for_ops(100);
        work.stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(work.errors.load(Ordering::Relaxed), 0);
    assert_eq!(pool.map_epoch(), 1);
    assert_eq!(pool.regions()[1].1, r2, "R2 stays where it was");
    assert_eq!(pool.read(r2, 6).expect("read R2"), b"before");
}

/// The variable that turns [`client_process`] on, naming etcd's endpoint.
const CHILD_ETCD: &str = "FOLLOW_MAP_CLIENT_PROCESS_ETCD";

/// The client process of
/// `a_client_stopped_past_a_change_serves_its_next_requests`, run by it
/// as a child (not a test on its own): opens pool `test` from etcd, says
/// `ready`, then answers each line of stdin: `r1` or `r2` (write and read
/// back that region's first word: `ok` or `error …`), `epoch` (the map
/// epoch it runs).
#[test]
#[ignore = "run as a child process by another test"]
fn client_process() {
    use std::io::{BufRead, Write};
    let Ok(endpoint) = std::env::var(CHILD_ETCD) else {
        return;
    };
    let endpoints = Endpoints::parse(&endpoint).expect("endpoints");
    let pool = AsyncPool::builder_on_etcd(endpoints, "test", "c")
        .connect()
        .expect("open");
    let mut out = std::io::stdout();
    writeln!(out, "ready").expect("stdout");
    for (i, line) in std::io::stdin().lock().lines().enumerate() {
        let line = line.expect("stdin");
        let reply = match line.as_str() {
            "epoch" => pool.map_epoch().to_string(),
            region => match pool
                .regions()
                .into_iter()
                .find(|r| r.0 == region.to_uppercase())
            {
                None => format!("error no region {region}"),
                Some((_, at, _)) => {
                    let value = i as u64 + 1;
                    match pool.write_u64(at, value).and_then(|()| pool.read_u64(at)) {
                        Ok(read) if read == value => "ok".to_owned(),
                        Ok(read) => format!("error read {read}, wrote {value}"),
                        Err(e) => format!("error {}", pmem_client::error_chain(&e)),
                    }
                }
            },
        };
        writeln!(out, "reply {reply}").expect("stdout");
    }
}

/// A child process, killed when dropped.
struct Child {
    process: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Child {
    /// Sends `command` and returns the reply (harness lines skipped).
    fn ask(&mut self, command: &str) -> String {
        use std::io::{BufRead, Write};
        writeln!(self.stdin, "{command}").expect("child stdin");
        loop {
            let mut line = String::new();
            let n = self.stdout.read_line(&mut line).expect("child stdout");
            assert!(n > 0, "the client process ended");
            if let Some(reply) = line.trim_end().strip_prefix("reply ") {
                return reply.to_owned();
            }
        }
    }

    fn signal(&self, signal: i32) {
        let pid = i32::try_from(self.process.id()).expect("pid");
        // SAFETY: kill(2) with the id of a child this test started and has
        // not waited for, so the id names that child.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "kill {pid} {signal}");
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

#[test]
fn a_client_stopped_past_a_change_serves_its_next_requests() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
    let (config_one, config_two) = testkit::one_then_two_servers(dir.path());
    put_map(&etcd, 1, &text(&config_one));
    let _s1 = server(&config_one, "S1", dir.path());
    let _s2 = server(&config_two, "S2", dir.path());
    let device = device_on_etcd(&etcd, "F");
    device.wait_links_up(1);

    let mut process = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "client_process", "--ignored", "--nocapture"])
        .env(CHILD_ETCD, etcd.endpoint())
        .env_remove("PMEM_FABRIC_ETCD_CREDENTIALS")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the client process");
    let (stdin, stdout) = (process.stdin.take(), process.stdout.take());
    let mut child = Child {
        process,
        stdin: stdin.expect("stdin"),
        stdout: std::io::BufReader::new(stdout.expect("stdout")),
    };
    let mut line = String::new();
    while line.trim_end() != "ready" {
        line.clear();
        let n = child.stdout.read_line(&mut line).expect("child stdout");
        assert!(n > 0, "the client process ended before it was ready");
    }
    assert_eq!(child.ask("r1"), "ok");
    assert_eq!(child.ask("epoch"), "1");

    // Cut off past a change of the map, then back.
    child.signal(libc::SIGSTOP);
    put_map(&etcd, 2, &text(&config_two));
    device.wait_links_up(2);
    child.signal(libc::SIGCONT);
    assert_eq!(child.ask("r1"), "ok", "the first request after SIGCONT");
    wait_until("the client process on epoch 2", || {
        child.ask("epoch") == "2"
    });
    assert_eq!(child.ask("r2"), "ok");
    assert_eq!(child.ask("r1"), "ok");
}

/// Measures, not a check: how long from `etcdctl put` of a new epoch
/// returning to the client running it, over 20 changes (the same layout
/// each time). Run with `--ignored --nocapture`.
#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn measure_time_to_follow_a_new_epoch() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
    let config = FabricSpec::new()
        .server("S", &[("R1", "4MiB")])
        .device("F")
        .client("c")
        .write(dir.path(), "topology.toml", &mut Ports::new());
    let topology = text(&config);
    put_map(&etcd, 1, &topology);
    let _s = server(&config, "S", dir.path());
    let f = device_on_etcd(&etcd, "F");
    f.wait_links_up(1);
    let pool = client_on_etcd(&etcd);
    let mut times = Vec::new();
    for epoch in 2..22 {
        put_map(&etcd, epoch, &topology);
        let put = Instant::now();
        while pool.map_epoch() != epoch {
            assert!(put.elapsed() < PATIENCE, "epoch {epoch} not followed");
            std::thread::sleep(Duration::from_micros(200));
        }
        times.push(put.elapsed());
        pool.write_u64(VirtAddr(VIRT_BASE), epoch).expect("write");
    }
    times.sort();
    println!(
        "client follows a new epoch: p50 {:?}, max {:?} over {} changes",
        times[times.len() / 2],
        times[times.len() - 1],
        times.len()
    );
}
