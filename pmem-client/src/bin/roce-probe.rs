//! `roce-probe`: checks a fabric device's RoCEv2 port through a real RNIC
//! (or the kernel's rxe). It connects as a client, sets up an RC queue pair
//! over the control connection and, on every region of the layout, WRITEs a
//! known pattern at the region start and READs it back, then runs
//! FETCH_ADD and COMPARE_SWAP on a word at offset 0x10000 and READs it
//! back, and ATOMIC_WRITE where the queue pair offers it; a pipelined batch of READs rechecks everything. Finally it prints
//! the RDMA devices' hardware counters (ICRC and sequence-error counters
//! must be zero) and `roce-probe-ok N` (N regions), exiting 0, or the
//! failure, exiting 1. With `--latency N` it also times N blocking 64-byte
//! READs and N FETCH_ADDs, one at a time, and prints their percentiles.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use pmem_client::error_chain;
use pmem_client::verbs::{
    Control, Op, VerbsError, VerbsOptions, VerbsQp, device_names, hw_counters,
};
use topology::{Layout, Topology};

/// Bytes of the pattern written at each region's start.
const PATTERN_LEN: usize = 3000;
/// Offset of the atomics' word in each region.
const WORD_AT: u64 = 0x10_000;

/// Checks a fabric device's RoCEv2 port with RDMA READ, WRITE and atomics
/// through a real RNIC or rxe.
#[derive(Debug, Parser)]
#[command(name = "roce-probe", version)]
struct Cli {
    /// The topology file (the same one the device reads).
    #[arg(long, value_name = "FILE")]
    topology: PathBuf,
    /// The client id to connect as (one of the topology's clients).
    #[arg(long, value_name = "ID")]
    client: String,
    /// The device port's control address, ip:port.
    #[arg(long, value_name = "ADDR")]
    device_port: SocketAddr,
    /// This host's RoCEv2 address (its GID is ::ffff:IP).
    #[arg(long, value_name = "IP")]
    local_ip: Ipv4Addr,
    /// The RDMA device to use (default: the first).
    #[arg(long, value_name = "NAME")]
    rdma_device: Option<String>,
    /// How long one operation may take.
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    timeout_ms: u64,
    /// Also time this many blocking 64 B READs and FETCH_ADDs (one in
    /// flight, like perftest's `_lat` tests).
    #[arg(long, value_name = "N", default_value_t = 0)]
    latency: usize,
    /// The folder with the client's key (`client.<ID>.key`), proven to the
    /// device; default `$PMEM_FABRIC_SECRETS`, if set. Without, only a
    /// device run `--insecure` answers.
    #[arg(long, value_name = "DIR")]
    secrets: Option<PathBuf>,
}

/// The pattern written to region `region`.
fn pattern(region: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(7)
                .wrapping_add(region.wrapping_mul(31)) as u8
        })
        .collect()
}

/// A failed check, said in one line.
type Failure = String;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(regions) => {
            println!("roce-probe-ok {regions}");
            ExitCode::SUCCESS
        }
        Err(failure) => {
            println!("roce-probe-failed: {failure}");
            ExitCode::FAILURE
        }
    }
}

fn load(path: &Path) -> Result<Layout, Failure> {
    let topology =
        Topology::load(path).map_err(|e| format!("{}: {}", path.display(), error_chain(&e)))?;
    Layout::new(&topology).map_err(|e| format!("layout of {}: {}", path.display(), error_chain(&e)))
}

fn check_client(path: &Path, client: &str) -> Result<(), Failure> {
    let topology = Topology::load(path).map_err(|e| error_chain(&e))?;
    if topology.clients.iter().any(|c| c.id.as_str() == client) {
        Ok(())
    } else {
        Err(format!("{}: no client {client:?}", path.display()))
    }
}

fn run(cli: &Cli) -> Result<usize, Failure> {
    check_client(&cli.topology, &cli.client)?;
    let layout = load(&cli.topology)?;
    // Fail fast, before touching the device, when there is no RDMA device.
    let devices = device_names().map_err(|e| error_chain(&e))?;
    if devices.is_empty() {
        return Err(error_chain(&VerbsError::Rnic(
            pmem_client::verbs::RnicError::NoDevice,
        )));
    }
    println!("rdma devices: {}", devices.join(", "));
    let timeout = Duration::from_millis(cli.timeout_ms);
    let secrets = cli
        .secrets
        .clone()
        .or_else(|| std::env::var_os(pmem_client::pool::SECRETS_ENV).map(PathBuf::from));
    let key = match secrets {
        Some(dir) => Some(proto::auth::Key::new(
            topology::secrets::read_key(&dir, topology::secrets::Principal::Client(&cli.client))
                .map_err(|e| error_chain(&e))?,
        )),
        None => None,
    };
    let mut control = Control::connect_with(
        cli.device_port,
        &cli.client,
        key,
        Some(layout.digest()),
        timeout,
    )
    .map_err(|e| error_chain(&e))?;
    let options = VerbsOptions {
        op_timeout: timeout,
        ..VerbsOptions::default()
    };
    let started = Instant::now();
    let mut qp = VerbsQp::connect_with(
        &mut control,
        cli.rdma_device.as_deref(),
        cli.local_ip,
        options,
    )
    .map_err(|e| error_chain(&e))?;
    let (local, remote) = (qp.local(), qp.remote());
    println!(
        "queue pair: {} gid index {} qpn {:#x} psn {:#x} {} <-> device {:?} qpn {:#x} psn {:#x} {}, path mtu {}, set up in {:?}",
        qp.device_name(),
        qp.gid_index(),
        local.qpn,
        local.psn,
        local.ip,
        control.device,
        remote.qpn,
        remote.psn,
        remote.ip,
        local.mtu,
        started.elapsed()
    );

    let verbs = |what: &str, e: VerbsError| format!("{what}: {}", error_chain(&e));
    let mut work_requests = 0usize;
    for entry in layout.entries() {
        let region = entry.region.0;
        let id = &entry.region_id;
        let base = entry.start.get();
        if entry.len < WORD_AT + 8 || entry.len < PATTERN_LEN as u64 {
            return Err(format!(
                "region {id} is too small ({} bytes) for the probe",
                entry.len
            ));
        }
        let rkey = qp.rkey(region).ok_or(format!("no R_Key for region {id}"))?;
        let data = pattern(region, PATTERN_LEN);
        let t = Instant::now();
        qp.write(region, base, &data)
            .map_err(|e| verbs(&format!("region {id}: WRITE {PATTERN_LEN} at {base:#x}"), e))?;
        let back = qp
            .read(region, base, PATTERN_LEN)
            .map_err(|e| verbs(&format!("region {id}: READ {PATTERN_LEN} at {base:#x}"), e))?;
        if back != data {
            let first = back
                .iter()
                .zip(&data)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Err(format!(
                "region {id}: READ back differs from the WRITE at byte {first} ({:#04x} != {:#04x})",
                back.get(first).copied().unwrap_or(0),
                data[first]
            ));
        }
        let word = base + WORD_AT;
        qp.write(region, word, &0u64.to_le_bytes())
            .map_err(|e| verbs(&format!("region {id}: WRITE 0 at {word:#x}"), e))?;
        let old = qp
            .fetch_add(region, word, 7)
            .map_err(|e| verbs(&format!("region {id}: FETCH_ADD 7 at {word:#x}"), e))?;
        if old != 0 {
            return Err(format!(
                "region {id}: FETCH_ADD 7 returned {old}, expected 0"
            ));
        }
        let old = qp
            .compare_swap(region, word, 7, 10)
            .map_err(|e| verbs(&format!("region {id}: COMPARE_SWAP 7->10 at {word:#x}"), e))?;
        if old != 7 {
            return Err(format!(
                "region {id}: COMPARE_SWAP 7->10 returned {old}, expected 7"
            ));
        }
        let back = qp
            .read(region, word, 8)
            .map_err(|e| verbs(&format!("region {id}: READ 8 at {word:#x}"), e))?;
        if back != 10u64.to_le_bytes() {
            return Err(format!(
                "region {id}: the word reads {back:02x?}, expected 10 (little-endian)"
            ));
        }
        work_requests += 6;
        let atomic_write = if qp.has_atomic_write() {
            let at = word + 16;
            let value = 0x1122_3344_5566_7788u64;
            qp.atomic_write(region, at, value)
                .map_err(|e| verbs(&format!("region {id}: ATOMIC_WRITE at {at:#x}"), e))?;
            let back = qp
                .read(region, at, 8)
                .map_err(|e| verbs(&format!("region {id}: READ 8 at {at:#x}"), e))?;
            if back != value.to_le_bytes() {
                return Err(format!(
                    "region {id}: after ATOMIC_WRITE the word reads {back:02x?}, expected {value:#x} (little-endian)"
                ));
            }
            work_requests += 2;
            ", ATOMIC_WRITE"
        } else {
            " (this queue pair has no ATOMIC_WRITE)"
        };
        println!(
            "region {id} (index {region}, rkey {rkey:#010x}, {base:#x}): WRITE+READ {PATTERN_LEN} B, FETCH_ADD 0->7, COMPARE_SWAP 7->10{atomic_write} ok in {:?}",
            t.elapsed()
        );
    }

    // The same checks again, pipelined: every READ posted before any is polled.
    let mut expected = Vec::new();
    for entry in layout.entries() {
        let region = entry.region.0;
        let base = entry.start.get();
        let wr = qp
            .post_read(region, base, PATTERN_LEN)
            .map_err(|e| verbs("post READ", e))?;
        expected.push((wr, pattern(region, PATTERN_LEN)));
        let wr = qp
            .post_read(region, base + WORD_AT, 8)
            .map_err(|e| verbs("post READ", e))?;
        expected.push((wr, 10u64.to_le_bytes().to_vec()));
    }
    let done = qp.poll().map_err(|e| verbs("poll", e))?;
    work_requests += done.len();
    if done.len() != expected.len() {
        return Err(format!(
            "pipelined: {} completions for {} READs",
            done.len(),
            expected.len()
        ));
    }
    for (completion, (wr, data)) in done.into_iter().zip(expected) {
        let completion = completion.check().map_err(|e| verbs("pipelined READ", e))?;
        if completion.wr_id != wr || completion.op != Op::Read || completion.data != data {
            return Err(format!("pipelined READ {wr}: wrong completion or data"));
        }
    }
    println!("pipelined: {} READs ok", layout.entries().len() * 2);
    if cli.latency > 0
        && let Some(entry) = layout.entries().first()
    {
        let (region, base) = (entry.region.0, entry.start.get());
        let mut reads = Vec::with_capacity(cli.latency);
        for _ in 0..cli.latency {
            let t = Instant::now();
            qp.read(region, base, 64)
                .map_err(|e| verbs("latency READ", e))?;
            reads.push(t.elapsed());
        }
        println!("latency READ 64 B: {}", percentiles(&mut reads));
        let mut atomics = Vec::with_capacity(cli.latency);
        for _ in 0..cli.latency {
            let t = Instant::now();
            qp.fetch_add(region, base + WORD_AT + 8, 1)
                .map_err(|e| verbs("latency FETCH_ADD", e))?;
            atomics.push(t.elapsed());
        }
        println!("latency FETCH_ADD: {}", percentiles(&mut atomics));
        work_requests += 2 * cli.latency;
    }
    drop(qp);
    drop(control);

    let counters = hw_counters(Path::new(pmem_client::verbs::SYSFS_INFINIBAND));
    if counters.is_empty() {
        println!("hw_counters: none (no /sys/class/infiniband/*/ports/*/hw_counters)");
    }
    for c in &counters {
        println!("hw_counter {}/{} {} {}", c.device, c.port, c.name, c.value);
    }
    let bad: Vec<_> = counters
        .iter()
        .filter(|c| c.is_integrity_error() && c.value != 0)
        .map(|c| format!("{}/{} {}={}", c.device, c.port, c.name, c.value))
        .collect();
    if !bad.is_empty() {
        return Err(format!(
            "integrity counters are not zero: {}",
            bad.join(", ")
        ));
    }
    println!("{work_requests} work requests");
    Ok(layout.entries().len())
}

/// Minimum, median, 99th percentile and maximum of `samples`, in µs.
fn percentiles(samples: &mut [Duration]) -> String {
    samples.sort_unstable();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples[i].as_secs_f64() * 1e6
    };
    format!(
        "n {} min {:.1} µs p50 {:.1} µs p99 {:.1} µs max {:.1} µs",
        samples.len(),
        at(0.0),
        at(0.5),
        at(0.99),
        at(1.0)
    )
}
