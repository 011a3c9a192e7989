//! End-to-end latency of a 4 KiB WRITE_PERSIST through the real daemon, per
//! persistence mode. A measurement, not an assertion: run it with
//! `cargo test --release -p pmem-server --test latency -- --ignored --nocapture`
//! (add `--features libpmem` for the libpmem row).

use std::time::{Duration, Instant};

use proto::Status;
use proto::request::Repr;
use testkit::{Conn, at, key, pmem_server_with, write_topology};

/// This package's daemon, built with the features of the test run.
const PMEM_SERVER: &str = env!("CARGO_BIN_EXE_pmem-server");

const ITERATIONS: usize = 2000;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

#[test]
#[ignore = "a measurement; run with --ignored --nocapture"]
fn write_persist_4k_round_trip_per_mode() {
    let modes: &[&str] = if cfg!(feature = "libpmem") {
        &["msync", "libpmem", "dax"]
    } else {
        &["msync", "dax"]
    };
    for mode in modes {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = write_topology(dir.path(), &[("R1", "64MiB")]);
        let server = match pmem_server_with(
            PMEM_SERVER,
            &config,
            "S",
            &dir.path().join("data"),
            &["--persistence", mode],
        ) {
            Ok(server) => server,
            Err(why) => {
                println!(
                    "{mode:>8}: not available here ({})",
                    why.lines().last().unwrap_or("")
                );
                continue;
            }
        };
        let key = key(server.addr("nic.n0"), 0);
        let mut conn = Conn::connect(server.addr("nic.n0"));
        let block = vec![0x5a; 4096];
        let mut samples = Vec::with_capacity(ITERATIONS);
        for i in 0..ITERATIONS + 100 {
            let offset = (i as u64 % 16_000) * 4096;
            let started = Instant::now();
            let reply = conn.call(Repr::write_persist(at(0, offset), key, &block));
            let elapsed = started.elapsed();
            assert_eq!(reply.status, Status::Ok);
            if i >= 100 {
                samples.push(elapsed);
            }
        }
        samples.sort();
        println!(
            "{mode:>8}: 4 KiB WRITE_PERSIST round trip p50 {:?} p99 {:?} ({ITERATIONS} samples)",
            percentile(&samples, 0.5),
            percentile(&samples, 0.99),
        );
    }
}
