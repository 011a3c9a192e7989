//! Exactly-once atomics from several client processes that share one client
//! identity, against real daemons: a restarted process and two processes at
//! once each number their atomics in a session of their own, so none of
//! them is told its atomics are stale, and every FETCH_ADD counts once.
//!
//! Client processes are this test binary re-run on the `#[ignore]`d test
//! [`worker`], with its instructions in `EO_WORKER_*` variables.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use pmem_client::{Pool, VIRT_BASE};
use testkit::{Daemon, FabricSpec, Ports};
use topology::{EnvOverrides, Topology, VirtAddr};

/// FETCH_ADDs per process: two processes together push results out of the
/// server's window (4096 per identity).
const ADDS: u64 = 2500;
const COUNTER: VirtAddr = VirtAddr(VIRT_BASE + 4096);

struct Fabric {
    _dir: tempfile::TempDir,
    config: PathBuf,
    _server: Daemon,
    _device: Daemon,
}

impl Fabric {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let spec = FabricSpec::new()
            .server("A", &[("A1", "4MiB")])
            .device("F1")
            .client("c0");
        let config = spec.write(dir.path(), "topology.toml", &mut Ports::new());
        let mut servers = testkit::pmem_servers(&config, &["A"], dir.path());
        let device = testkit::fabric_device(&config, "F1", &[])
            .unwrap_or_else(|e| panic!("fabric-device:\n{e}"));
        device.wait_links_up(1);
        Self {
            _dir: dir,
            config,
            _server: servers.remove(0),
            _device: device,
        }
    }
}

fn pool(config: &Path) -> Pool {
    let topology = Topology::load_with(config, &EnvOverrides::None).expect("topology");
    Pool::builder(topology, "c0")
        .op_timeout(Duration::from_secs(20))
        .connect()
        .unwrap_or_else(|e| panic!("{}", pmem_client::error_chain(&e)))
}

/// One client process of client `c0`: `EO_WORKER_ADDS` exactly-once
/// FETCH_ADDs of 1 on the counter, then `done`.
#[test]
#[ignore = "run by the tests below as a client process"]
fn worker() {
    let Ok(config) = std::env::var("EO_WORKER_CONFIG") else {
        return;
    };
    let adds: u64 = std::env::var("EO_WORKER_ADDS")
        .expect("adds")
        .parse()
        .expect("adds");
    let pool = pool(Path::new(&config));
    for i in 0..adds {
        pool.fetch_add(COUNTER, 1)
            .unwrap_or_else(|e| panic!("FETCH_ADD {i}: {}", pmem_client::error_chain(&e)));
    }
    println!("done");
}

fn spawn_worker(config: &Path) -> Child {
    Command::new(std::env::current_exe().expect("test binary"))
        .args(["worker", "--exact", "--ignored", "--nocapture"])
        .env("EO_WORKER_CONFIG", config)
        .env("EO_WORKER_ADDS", ADDS.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn worker")
}

fn wait(child: Child, what: &str) {
    let out = child.wait_with_output().expect("worker");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("done"),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_restarted_process_and_two_at_once_never_make_atomics_stale() {
    let fabric = Fabric::start();
    wait(spawn_worker(&fabric.config), "the first process");
    // The same client again, as after a restart.
    wait(spawn_worker(&fabric.config), "the restarted process");
    // Two processes of the same client at once.
    let both = [spawn_worker(&fabric.config), spawn_worker(&fabric.config)];
    for (i, child) in both.into_iter().enumerate() {
        wait(child, &format!("concurrent process {i}"));
    }
    let pool = pool(&fabric.config);
    let counter = pool.fetch_add(COUNTER, 0).expect("read the counter");
    assert_eq!(counter, 4 * ADDS, "every FETCH_ADD counted once");
}
