//! What one 2 MiB extent costs to allocate and to free through the fabric,
//! on an authenticated fabric of real daemons (one server, one device, one
//! client, 2 MiB extents, region files on tmpfs). A measurement, not a check: run it with
//! `cargo test --release -p pmem-client --test extent_cost -- --ignored --nocapture`
//! and compare builds by running their binaries in alternation.

use std::time::{Duration, Instant};

use pmem_client::{Allocator, Pool};
use testkit::{FabricSpec, Ports};
use topology::Topology;
use topology::secrets::{Principal, write_key};

#[test]
#[ignore = "a measurement, not a check"]
fn extent_alloc_and_free_latency() {
    // Region files on tmpfs: the figure is the work of the fabric and the
    // servers, not of a disk shared with whatever else runs.
    let dir = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .expect("temp dir");
    let mut spec = FabricSpec::new()
        .server("A", &[("A1", "64MiB")])
        .device("F")
        .client("c1")
        .allocator("");
    spec.extent_size = "2MiB".to_owned();
    let config = spec.write(dir.path(), "topology.toml", &mut Ports::new());
    let secrets = dir.path().join("secrets");
    write_key(&secrets, Principal::Device("F"), &[0x11; 32]).expect("key");
    write_key(&secrets, Principal::Client("c1"), &[0xC1; 32]).expect("key");
    let with_secrets = ["--secrets", secrets.to_str().expect("path")];
    let server = testkit::pmem_server(&config, "A", &dir.path().join("A"), &with_secrets)
        .unwrap_or_else(|e| panic!("pmem-server did not start:\n{e}"));
    let device = testkit::fabric_device(&config, "F", &with_secrets)
        .unwrap_or_else(|e| panic!("fabric-device did not start:\n{e}"));
    device.wait_links_up(1);
    let pool = Pool::builder(Topology::load(&config).expect("topology"), "c1")
        .secrets(&secrets)
        .op_timeout(Duration::from_secs(20))
        .connect()
        .expect("connect");
    let alloc = pool
        .block_on(Allocator::format(pool.handle().clone(), false))
        .expect("format");
    let size = 2 << 20;
    for _ in 0..50 {
        let v = pool.block_on(alloc.alloc(size)).expect("alloc");
        pool.block_on(alloc.free(v)).expect("free");
    }
    // The server's own time executing requests, from its metrics.
    let server_seconds = || {
        let text = telemetry::http_get(server.addr("admin"), "/metrics", Duration::from_secs(5))
            .expect("metrics")
            .1;
        telemetry::metric_sum(&text, "pmem_server_operation_duration_seconds_sum", "")
            .unwrap_or_default()
    };
    let rounds = 200;
    let served_before = server_seconds();
    let (mut allocs, mut frees) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let started = Instant::now();
        let v = pool.block_on(alloc.alloc(size)).expect("alloc");
        let allocated = Instant::now();
        pool.block_on(alloc.free(v)).expect("free");
        allocs.push(allocated - started);
        frees.push(allocated.elapsed());
    }
    let served = server_seconds() - served_before;
    allocs.sort_unstable();
    frees.sort_unstable();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "2 MiB extent: alloc p50 {:.1} us p90 {:.1} us; free p50 {:.1} us p90 {:.1} us; \
         server execution per alloc+free {:.1} us",
        us(allocs[rounds / 2]),
        us(allocs[rounds * 9 / 10]),
        us(frees[rounds / 2]),
        us(frees[rounds * 9 / 10]),
        served * 1e6 / rounds as f64,
    );
}
