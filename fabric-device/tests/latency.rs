//! What the fabric device adds to a 64 B READ, against the direct client →
//! server path, measured in one run. A measurement, not an assertion:
//! `cargo test --release -p fabric-device --test latency -- --ignored --nocapture`.

use std::time::{Duration, Instant};

use proto::request::{Repr, Target};
use proto::{AccessKey, Status};
use testkit::{Conn, FabricSpec, Ports, layout};

const WARMUP: usize = 2_000;
const SAMPLES: usize = 20_000;

fn p(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q) as usize]
}

/// Round trips of a 64 B READ at queue depth 1.
fn measure(conn: &mut Conn, target: Target, key: AccessKey) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(SAMPLES);
    for i in 0..WARMUP + SAMPLES {
        let started = Instant::now();
        let reply = conn.call(Repr::read(target, key, 64));
        let elapsed = started.elapsed();
        assert_eq!(reply.status, Status::Ok);
        if i >= WARMUP {
            samples.push(elapsed);
        }
    }
    samples.sort();
    samples
}

#[test]
#[ignore = "a measurement; run with --ignored --nocapture"]
fn device_overhead_on_a_64_byte_read() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = FabricSpec::new()
        .server("A", &[("A1", "4MiB")])
        .device("F")
        .client("c1");
    let mut ports = Ports::new();
    let config = spec.write(dir.path(), "topology.toml", &mut ports);
    let layout = layout(&config);
    let entry = &layout.entries()[0];
    let server = testkit::pmem_server(&config, "A", &dir.path().join("A"), &[]).expect("server");
    // Extra device flags to compare, e.g. FABRIC_DEVICE_FLAGS="--busy-poll-us 200".
    let flags = std::env::var("FABRIC_DEVICE_FLAGS").unwrap_or_default();
    let flags: Vec<&str> = flags.split_whitespace().collect();
    let device = testkit::fabric_device(&config, "F", &flags).expect("device");

    let key = testkit::key(server.addr("nic.n0"), entry.region.0);
    let mut direct = Conn::connect(server.addr("nic.n0"));
    let mut fabric = Conn::connect(device.addr("port.p0"));
    fabric.hello("c1");
    let target = Target::Pmem(entry.start);
    // Wait for the device's link.
    while fabric.call(Repr::read(target, key, 64)).status != Status::Ok {
        std::thread::sleep(Duration::from_millis(10));
    }
    let direct_samples = measure(&mut direct, target, key);
    let fabric_samples = measure(&mut fabric, target, key);
    let (d50, f50) = (p(&direct_samples, 0.5), p(&fabric_samples, 0.5));
    println!(
        "64 B READ, queue depth 1, {SAMPLES} samples each:\n  \
         direct p50 {d50:?} p99 {:?}\n  fabric p50 {f50:?} p99 {:?}\n  \
         device adds {:?} at p50 (fabric/direct = {:.2})",
        p(&direct_samples, 0.99),
        p(&fabric_samples, 0.99),
        f50.saturating_sub(d50),
        f50.as_secs_f64() / d50.as_secs_f64(),
    );
}
