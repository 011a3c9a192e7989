//! The pool's server cache policy reaches the server: against a real
//! server and fabric device, the server's count of writes stored with
//! non-temporal stores at the client's request moves exactly when the
//! pool's policy, a call's own policy or `pmemctl write --non-temporal`
//! asks for them.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use pmem_client::{Pool, ServerCache, VIRT_BASE, error_chain};
use testkit::{Daemon, FabricSpec, Ports};
use topology::{EnvOverrides, Topology, VirtAddr};

const COUNTER: &str = "pmem_server_non_temporal_writes_total";

/// One server with one region, one fabric device, one client.
struct Fabric {
    _dir: tempfile::TempDir,
    config: PathBuf,
    server: Daemon,
    _device: Daemon,
}

impl Fabric {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = FabricSpec::new()
            .server("A", &[("A1", "8MiB")])
            .device("F1")
            .client("c1")
            .write(dir.path(), "topology.toml", &mut Ports::new());
        let server = testkit::pmem_server(&config, "A", &dir.path().join("A"), &[])
            .unwrap_or_else(|e| panic!("pmem-server A:\n{e}"));
        let device = testkit::fabric_device(&config, "F1", &[])
            .unwrap_or_else(|e| panic!("fabric-device F1:\n{e}"));
        device.wait_links_up(1);
        Self {
            _dir: dir,
            config,
            server,
            _device: device,
        }
    }

    /// A pool of client c1 whose writes follow `policy`.
    fn pool(&self, policy: ServerCache) -> Pool {
        let topology = Topology::load_with(&self.config, &EnvOverrides::None).expect("topology");
        Pool::builder(topology, "c1")
            .op_timeout(Duration::from_secs(20))
            .server_cache(policy)
            .connect()
            .unwrap_or_else(|e| panic!("client c1: {}", error_chain(&e)))
    }

    /// The server's count of writes it stored non-temporally on request.
    fn non_temporal_writes(&self) -> u64 {
        let (_, text) = telemetry::http_get(
            self.server.addr("admin"),
            "/metrics",
            Duration::from_secs(5),
        )
        .expect("scrape the server's metrics");
        telemetry::metric_sum(&text, COUNTER, "")
            .unwrap_or_else(|| panic!("no {COUNTER} in the server's metrics:\n{text}"))
            as u64
    }
}

#[test]
fn the_pools_policy_and_each_calls_reach_the_server() {
    let fabric = Fabric::start();
    let at = VirtAddr(VIRT_BASE);
    let small = [7u8; 256];
    let bulk = vec![9u8; pmem_client::pool::NON_TEMPORAL_FROM as usize];
    assert_eq!(fabric.non_temporal_writes(), 0);

    // Auto, the default: small writes use the cache, bulk ones bypass it.
    let auto = fabric.pool(ServerCache::Auto);
    auto.write(at, &small).expect("small write");
    auto.write_persist(at, &small).expect("small write_persist");
    assert_eq!(fabric.non_temporal_writes(), 0, "small writes stay cached");
    auto.write(at, &bulk).expect("bulk write");
    assert_eq!(fabric.non_temporal_writes(), 1, "a bulk write bypasses");
    auto.write_persist(at, &bulk).expect("bulk write_persist");
    assert_eq!(fabric.non_temporal_writes(), 2);
    // Reads, flushes and atomics never ask.
    assert_eq!(auto.read(at, bulk.len() as u64).expect("read"), bulk);
    auto.flush(at, bulk.len() as u64).expect("flush");
    auto.fetch_add(at, 1).expect("fetch_add");
    assert_eq!(fabric.non_temporal_writes(), 2);

    // A call's own policy wins over the pool's, both ways.
    auto.write_with_cache(at, &small, ServerCache::NonTemporal)
        .expect("small non-temporal write");
    assert_eq!(fabric.non_temporal_writes(), 3);
    auto.write_persist_with_cache(at, &bulk, ServerCache::Cached)
        .expect("bulk cached write_persist");
    assert_eq!(fabric.non_temporal_writes(), 3);
    assert_eq!(auto.read(at, bulk.len() as u64).expect("read"), bulk);
    drop(auto);

    // A pool that never asks, and one that always does.
    let cached = fabric.pool(ServerCache::Cached);
    cached.write(at, &bulk).expect("bulk write");
    cached.write_persist(at, &bulk).expect("bulk write_persist");
    assert_eq!(fabric.non_temporal_writes(), 3, "a cached pool never asks");
    drop(cached);
    let streaming = fabric.pool(ServerCache::NonTemporal);
    streaming.write(at, &small).expect("small write");
    assert_eq!(
        fabric.non_temporal_writes(),
        4,
        "a non-temporal pool always asks"
    );
    assert_eq!(streaming.read(at, small.len() as u64).expect("read"), small);
}

#[test]
fn pmemctl_write_asks_for_non_temporal_stores_when_told() {
    let fabric = Fabric::start();
    let pmemctl = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_pmemctl"))
            .arg("--config")
            .arg(&fabric.config)
            .args(["--client", "c1", "--op-timeout-ms", "10000"])
            .args(args)
            .output()
            .expect("run pmemctl");
        assert!(
            output.status.success(),
            "pmemctl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    pmemctl(&["write", "1TiB", "cached"]);
    pmemctl(&["write", "1TiB", "cached, durable", "--persist"]);
    assert_eq!(fabric.non_temporal_writes(), 0);
    pmemctl(&["write", "1TiB", "streamed", "--non-temporal"]);
    assert_eq!(fabric.non_temporal_writes(), 1);
    pmemctl(&[
        "write",
        "1TiB",
        "streamed, durable",
        "--persist",
        "--non-temporal",
    ]);
    assert_eq!(fabric.non_temporal_writes(), 2);
}
