//! `testbed bench-persist`: the latency of one durable small write, measured
//! inside one lab guest with an emulated NVDIMM and a virtio disk, for
//! information:
//!
//! - `dax`: WRITE_PERSIST to a pmem-server region on the NVDIMM (an fsdax
//!   namespace, ext4 mounted `-o dax`; the server runs `--persistence dax`,
//!   so the region is mapped with `MAP_SYNC` and made durable by cache-line
//!   write-back);
//! - `msync`: WRITE_PERSIST to a region on the virtio disk (ext4; a second
//!   server process with `--persistence msync`);
//! - `redis`: SET to redis-server with `appendonly yes`, `appendfsync
//!   always`, its folder on the virtio disk (the medium of `msync`);
//! - `redis-dax`: the same with its folder on the fsdax mount (reference).
//!
//! The load generator is this binary run in the guest
//! (`bench-persist-guest`): one connection per system over loopback, one
//! request at a time, each timed from send to reply. Systems take turns in
//! interleaved rounds (the order rotates every round), so a slow stretch of
//! the emulation hits all of them. Under TCG every instruction is emulated:
//! absolute times are emulation time, the ratios are the figure.

mod figures;
mod guest_side;

pub use figures::{markdown, summarize};
pub use guest_side::{GuestArgs, RespError, check_ok, encode_command, guest_main};

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use serde::{Deserialize, Serialize};
use topology::Topology;

use crate::fabric::launch::log_tail;
use crate::lab::LabNet;
use crate::lab::guest::{self, GuestWork, Media};

/// Where the guest mounts the NVDIMM (fsdax, ext4 `-o dax`).
const PMEM_MOUNT: &str = "/mnt/pmem0";
/// Where the guest mounts its virtio disk (ext4).
const DISK_MOUNT: &str = "/mnt/disk";
/// Size of the NVDIMM backing file (sparse on the host).
const NVDIMM_SIZE: u64 = 128 << 20;
/// Size of the virtio disk image (sparse on the host).
const DISK_SIZE: u64 = 256 << 20;
/// Lines of the guest's console an error shows.
const TAIL_LINES: usize = 30;

/// The servers' topology: `D` (region D1) and `M` (region M1), each with
/// one 8 MiB region and its NIC on `127.0.0.1:0` (the guest reads the port
/// from the server's ready line); the fabric device and client only make
/// the topology complete, they do not run.
fn topology() -> Topology {
    let mut topology = testkit::FabricSpec::new()
        .server("D", &[("D1", "8MiB")])
        .server("M", &[("M1", "8MiB")])
        .device("F")
        .client("c")
        .topology();
    topology.pool.name = "bench-persist".to_owned();
    topology
}

/// One system measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum System {
    /// WRITE_PERSIST to the fsdax region (`MAP_SYNC`, cache-line write-back).
    Dax,
    /// WRITE_PERSIST to the region on the virtio disk (msync).
    Msync,
    /// redis SET, `appendfsync always`, AOF on the virtio disk.
    Redis,
    /// redis SET, `appendfsync always`, AOF on the fsdax mount.
    RedisDax,
}

impl System {
    /// Every system, in the first round's order.
    pub const ALL: [System; 4] = [System::Dax, System::Msync, System::Redis, System::RedisDax];

    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            System::Dax => "dax",
            System::Msync => "msync",
            System::Redis => "redis",
            System::RedisDax => "redis-dax",
        }
    }

    /// What it is, for the report.
    pub fn what(self) -> &'static str {
        match self {
            System::Dax => "pmem-server WRITE_PERSIST, region on fsdax ext4 -o dax (MAP_SYNC)",
            System::Msync => "pmem-server WRITE_PERSIST, region on virtio-disk ext4 (msync)",
            System::Redis => "redis SET, appendfsync always, AOF on virtio-disk ext4",
            System::RedisDax => "redis SET, appendfsync always, AOF on fsdax ext4 (reference)",
        }
    }
}

/// How much to measure.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct PersistPlan {
    /// Interleaved rounds.
    pub rounds: usize,
    /// Sequential operations per system per round.
    pub ops: usize,
    /// Operations per system before the first round, not counted.
    pub warmup: usize,
    /// Bytes per write (the WRITE_PERSIST payload, the SET value).
    pub size: usize,
}

impl PersistPlan {
    /// The full measurement (5 rounds of 300), or a short smoke run (2 of
    /// 50).
    pub fn new(quick: bool, rounds: Option<usize>, size: usize) -> Self {
        let (ops, warmup, default_rounds) = if quick { (50, 10, 2) } else { (300, 50, 5) };
        PersistPlan {
            rounds: rounds.unwrap_or(default_rounds).clamp(1, 100),
            ops,
            warmup,
            size: size.clamp(1, 64 << 10),
        }
    }
}

/// One system's latencies in one round.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Series {
    /// The system.
    pub system: System,
    /// The round.
    pub round: usize,
    /// Each operation's latency, µs, in order.
    pub us: Vec<f64>,
}

/// What the guest hands back to the host (`guest-results.json`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GuestResults {
    /// The persistence mode each pmem-server's ready line gave (`D`, `M`).
    pub server_modes: BTreeMap<String, String>,
    /// The servers' lines about where their PMEM device is.
    pub device_lines: Vec<String>,
    /// Every series, in the order measured.
    pub series: Vec<Series>,
}

/// One system's figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SystemFigures {
    /// The system.
    pub system: System,
    /// What it is.
    pub what: String,
    /// Median of the rounds' p50, µs.
    pub p50_us: f64,
    /// p99 of every operation of every round, µs.
    pub p99_us: f64,
    /// Each round's p50, µs.
    pub round_p50_us: Vec<f64>,
    /// Each round's p99, µs.
    pub round_p99_us: Vec<f64>,
}

/// A ratio of p50s: the median of the rounds' ratios and their spread.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Ratio {
    /// Median of the per-round ratios.
    pub median: f64,
    /// Smallest per-round ratio.
    pub min: f64,
    /// Largest per-round ratio.
    pub max: f64,
}

/// The report (`report.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PersistReport {
    /// What ran.
    pub plan: PersistPlan,
    /// The persistence mode each server reported.
    pub server_modes: BTreeMap<String, String>,
    /// Where the servers found their PMEM devices.
    pub device_lines: Vec<String>,
    /// One entry per system.
    pub systems: Vec<SystemFigures>,
    /// p50 of `dax` ÷ p50 of `redis`.
    pub dax_over_redis: Ratio,
    /// p50 of `msync` ÷ p50 of `redis`.
    pub msync_over_redis: Ratio,
    /// p50 of `dax` ÷ p50 of `redis-dax` (both on the NVDIMM).
    pub dax_over_redis_dax: Ratio,
    /// Wall time of the whole bench (boot included), s.
    pub seconds: f64,
}

// ---------------------------------------------------------------------------
// The host side.

/// Boots the guest, lets it measure, and writes `report.json` and
/// `report.md` under `out` (the guest's console and the servers' logs under
/// `out/work`).
pub fn run(plan: PersistPlan, out: &Path) -> anyhow::Result<PersistReport> {
    let started = Instant::now();
    let work = out.join("work");
    std::fs::create_dir_all(&work).with_context(|| format!("create {}", work.display()))?;
    let work = work
        .canonicalize()
        .with_context(|| format!("resolve {}", work.display()))?;
    let lab = LabNet::enter().context("the RDMA lab")?;
    let mut work = GuestWork::new(&work, "guest-bench.sh");
    prepare(&mut work, plan)?;
    let console = work.dir().join("console.log");
    let mut child = work.boot(&lab, &console).context("boot the bench guest")?;
    let deadline = started + guest_timeout(plan);
    let status = loop {
        if let Some(status) = child.try_wait().context("wait for the guest")? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = guest::power_off(&work.pidfile());
            let _ = child.wait();
            bail!(
                "the bench guest did not finish within {:?}:\n{}",
                guest_timeout(plan),
                log_tail(&console, TAIL_LINES)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    drop(lab);
    ensure!(
        status.success(),
        "the bench in the guest failed ({status}):\n{}",
        log_tail(&console, TAIL_LINES)
    );
    let results = work.dir().join("guest-results.json");
    let text = std::fs::read_to_string(&results)
        .with_context(|| format!("read {} (the guest's figures)", results.display()))?;
    let results: GuestResults = serde_json::from_str(&text)
        .with_context(|| format!("parse {} (the guest's figures)", results.display()))?;
    let report = summarize(plan, results, started.elapsed().as_secs_f64())?;
    std::fs::write(
        out.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )
    .context("write report.json")?;
    std::fs::write(out.join("report.md"), markdown(&report)).context("write report.md")?;
    Ok(report)
}

/// How long the guest may run: boot and set-up, then about 20 ms per
/// operation under emulation, with room to spare.
fn guest_timeout(plan: PersistPlan) -> Duration {
    let ops = (plan.rounds * plan.ops + plan.warmup) * System::ALL.len();
    Duration::from_secs(240) + Duration::from_millis(ops as u64 * 20)
}

/// Writes the topology, the keys and the guest's script, and makes the
/// media: an ext4 disk image and an NVDIMM backing file the guest formats.
fn prepare(work: &mut GuestWork, plan: PersistPlan) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("the testbed binary")?;
    let body = format!(
        "# The bench-persist guest: NVDIMM as fsdax at {PMEM_MOUNT}, disk at \
         {DISK_MOUNT}, then the bench.\nset -e\nmkdir -p {PMEM_MOUNT} {DISK_MOUNT}\n\
         i=0; while [ ! -e /dev/pmem0 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done\n\
         ndctl create-namespace --force --reconfig namespace0.0 --mode fsdax --align 2M \
         >/dev/null\nmkfs.ext4 -q -F -b 4096 /dev/pmem0\n\
         mount -t ext4 -o dax /dev/pmem0 {PMEM_MOUNT}\n\
         mount -t ext4 /dev/vda {DISK_MOUNT}\n\
         exec {} bench-persist-guest --work {} --rounds {} --ops {} --warmup {} --size {}\n",
        exe.display(),
        work.dir().display(),
        plan.rounds,
        plan.ops,
        plan.warmup,
        plan.size,
    );
    let media = Media {
        disk: Some(DISK_SIZE),
        nvdimm: Some(NVDIMM_SIZE),
    };
    work.prepare(&topology(), &body, media)
        .context("prepare the bench guest")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_topology_is_valid_with_one_region_per_server() {
        let written = toml::to_string(&topology()).expect("toml");
        let topology =
            Topology::from_toml_str("bench-persist", &written, &topology::EnvOverrides::None)
                .expect("parses");
        assert!(topology.validate().is_ok());
        assert_eq!(topology.pool.name, "bench-persist");
        let layout = topology::Layout::new(&topology).expect("layout");
        let regions: Vec<&str> = layout
            .entries()
            .iter()
            .map(|e| e.region_id.as_str())
            .collect();
        assert_eq!(regions, ["D1", "M1"]);
    }
}
