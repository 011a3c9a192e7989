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

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use proto::request::{Repr, Target};
use proto::{AccessKey, Message, Status, frame};
use serde::{Deserialize, Serialize};
use topology::secrets::{Principal, read_key};
use topology::{RegionIndex, RegionOffset};

use crate::bench::client::BenchConn;
use crate::bench::peers::{RedisConfig, RedisServer};
use crate::lab::{GuestStorage, LabNet};
use crate::stats::{median, quantile};

/// Where the guest mounts the NVDIMM (fsdax, ext4 `-o dax`).
const PMEM_MOUNT: &str = "/mnt/pmem0";
/// Where the guest mounts its virtio disk (ext4).
const DISK_MOUNT: &str = "/mnt/disk";
/// Size of the NVDIMM backing file (sparse on the host).
const NVDIMM_SIZE: u64 = 128 << 20;
/// Size of the virtio disk image (sparse on the host).
const DISK_SIZE: u64 = 256 << 20;
/// Bytes of each region the writes go round.
const SPAN: u64 = 4 << 20;
/// How long a server in the guest may take to print its ready line.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long one request may take before the bench gives up.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// The servers' topology: `D` (region D1, NIC on 127.0.0.1:7001) and `M`
/// (region M1, 127.0.0.1:7002), each with one 8 MiB region; the fabric
/// device and client only make the topology complete, they do not run.
const TOPOLOGY: &str = r#"# Written by testbed bench-persist.
[pool]
name = "bench-persist"
extent_size = "1MiB"

[[servers]]
id = "D"
admin = "127.0.0.1:9101"

  [[servers.sockets]]
  id = "0"
    [[servers.sockets.devices]]
    id = "pmem0"
      [[servers.sockets.devices.regions]]
      id = "D1"
      size = "8MiB"

  [[servers.nics]]
  id = "n0"
  socket = "0"
  listen = "127.0.0.1:7001"

[[servers]]
id = "M"
admin = "127.0.0.1:9102"

  [[servers.sockets]]
  id = "0"
    [[servers.sockets.devices]]
    id = "pmem0"
      [[servers.sockets.devices.regions]]
      id = "M1"
      size = "8MiB"

  [[servers.nics]]
  id = "n0"
  socket = "0"
  listen = "127.0.0.1:7002"

[[fabric_devices]]
id = "F"
ports = [{ id = "p0", listen = "127.0.0.1:7100" }]
links = [{ server = "D", nic = "n0" }, { server = "M", nic = "n0" }]

[[clients]]
id = "c"
rnics = [{ id = "r0", fabric_device = "F" }]
"#;

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
    let script = prepare(&work, plan)?;
    let exe = std::env::current_exe().context("the testbed binary")?;
    let exe_dir = exe.parent().context("the testbed binary's folder")?;
    let console = work.join("console.log");
    let pidfile = work.join("qemu.pid");
    let (disk, nvdimm) = (work.join("disk.img"), work.join("nvdimm.img"));
    let nvdimms = [nvdimm.as_path()];
    let storage = GuestStorage {
        disk: Some(&disk),
        nvdimms: &nvdimms,
        nodes: 1,
        pidfile: &pidfile,
        address: None,
    };
    let mut child = lab
        .guest_with_storage(&script, &[exe_dir], &console, &storage)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("boot the bench guest")?;
    let deadline = started + guest_timeout(plan);
    let status = loop {
        if let Some(status) = child.try_wait().context("wait for the guest")? {
            break status;
        }
        if Instant::now() > deadline {
            kill_qemu(&pidfile);
            let _ = child.wait();
            bail!(
                "the bench guest did not finish within {:?}:\n{}",
                guest_timeout(plan),
                tail(&console)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    drop(lab);
    ensure!(
        status.success(),
        "the bench in the guest failed ({status}):\n{}",
        tail(&console)
    );
    let results = work.join("guest-results.json");
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

/// SIGKILL to the QEMU whose pid is in `pidfile`, if there is one.
fn kill_qemu(pidfile: &Path) {
    let pid = std::fs::read_to_string(pidfile)
        .ok()
        .and_then(|text| text.trim().parse::<i32>().ok());
    if let Some(pid) = pid.filter(|&p| p > 0) {
        // SAFETY: kill(2) with a pid from QEMU's own pid file; that QEMU is
        // a child of the guest.sh this run started and still running.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// The last lines of a console log.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// The keys' folder in the work folder (the guest sees it at the same path).
const SECRETS: &str = "secrets";

/// Writes the topology, the keys and the guest's script, and makes the media: an
/// ext4 disk image and an NVDIMM backing file the guest formats. Returns
/// the script.
fn prepare(work: &Path, plan: PersistPlan) -> anyhow::Result<PathBuf> {
    std::fs::write(work.join("topology.toml"), TOPOLOGY).context("write the topology")?;
    // The guest's servers ask client c to prove its key, as any server does.
    let topology =
        topology::Topology::load(work.join("topology.toml")).context("the bench's topology")?;
    crate::keys::generate(&topology, &work.join(SECRETS)).context("make the keys")?;
    let exe = std::env::current_exe().context("the testbed binary")?;
    let script = work.join("guest-bench.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n# The bench-persist guest: NVDIMM as fsdax at {PMEM_MOUNT}, disk at \
             {DISK_MOUNT}, then the bench.\nset -e\nmkdir -p {PMEM_MOUNT} {DISK_MOUNT}\n\
             i=0; while [ ! -e /dev/pmem0 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done\n\
             ndctl create-namespace --force --reconfig namespace0.0 --mode fsdax --align 2M \
             >/dev/null\nmkfs.ext4 -q -F -b 4096 /dev/pmem0\n\
             mount -t ext4 -o dax /dev/pmem0 {PMEM_MOUNT}\n\
             mount -t ext4 /dev/vda {DISK_MOUNT}\n\
             exec {} bench-persist-guest --work {} --rounds {} --ops {} --warmup {} --size {}\n",
            exe.display(),
            work.display(),
            plan.rounds,
            plan.ops,
            plan.warmup,
            plan.size,
        ),
    )
    .context("write the guest's script")?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    let disk = work.join("disk.img");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(DISK_SIZE))
        .with_context(|| format!("make {}", disk.display()))?;
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&disk)
        .output()
        .context("run mkfs.ext4 (Debian package e2fsprogs)")?;
    ensure!(
        out.status.success(),
        "mkfs.ext4 {} failed: {}",
        disk.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let nvdimm = work.join("nvdimm.img");
    std::fs::File::create(&nvdimm)
        .and_then(|f| f.set_len(NVDIMM_SIZE))
        .with_context(|| format!("make {}", nvdimm.display()))?;
    Ok(script)
}

// ---------------------------------------------------------------------------
// The guest side.

/// What the guest runs: `testbed bench-persist-guest`.
#[derive(Debug, Clone)]
pub struct GuestArgs {
    /// The host's work folder, shared with the guest: the topology is read
    /// from it, the servers' logs and `guest-results.json` go to it.
    pub work: PathBuf,
    /// What to measure.
    pub plan: PersistPlan,
}

/// A pmem-server child process; killed when dropped.
#[derive(Debug)]
struct ServerChild {
    child: Child,
}

impl Drop for ServerChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `testbed daemon pmem-server` for `server` with its regions in
/// `data_dir` and `persistence`, waits for its ready line and returns it
/// with the child.
fn start_server(
    work: &Path,
    server: &str,
    data_dir: &str,
    persistence: &str,
) -> anyhow::Result<(ServerChild, BTreeMap<String, String>)> {
    let exe = std::env::current_exe().context("the testbed binary")?;
    let log_path = work.join(format!("server-{server}.log"));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("create {}", log_path.display()))?;
    let mut child = Command::new(exe)
        .args(["daemon", "pmem-server", "--config"])
        .arg(work.join("topology.toml"))
        .args(["--server", server, "--data-dir", data_dir])
        .args(["--persistence", persistence])
        .arg("--secrets")
        .arg(work.join(SECRETS))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .with_context(|| format!("start pmem-server {server}"))?;
    let stdout = child.stdout.take().context("the server's stdout")?;
    let guard = ServerChild { child };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        // Every line is read, so the pipe never fills; the ready line is
        // handed over.
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("ready ") {
                let _ = tx.send(line);
            }
        }
    });
    let line = rx.recv_timeout(READY_TIMEOUT).map_err(|_| {
        anyhow::anyhow!(
            "pmem-server {server} printed no ready line within {READY_TIMEOUT:?}:\n{}",
            tail(&log_path)
        )
    })?;
    let fields = testkit::parse_ready_line(&line).map_err(anyhow::Error::msg)?;
    Ok((guard, fields))
}

/// Runs the bench in the guest and writes `guest-results.json` to the work
/// folder.
pub fn guest_main(args: &GuestArgs) -> anyhow::Result<()> {
    let work = &args.work;
    let plan = args.plan;
    let topology =
        topology::Topology::load(work.join("topology.toml")).context("the bench's topology")?;
    let layout = topology::Layout::new(&topology).context("the bench topology's layout")?;
    let region = |id: &str| {
        layout
            .entries()
            .iter()
            .find(|e| e.region_id.as_str() == id)
            .map(|e| e.region)
            .with_context(|| format!("no region {id} in the bench topology"))
    };
    let client_key = read_key(&work.join(SECRETS), Principal::Client("c"))?;
    let mut results = GuestResults::default();
    let mut servers = Vec::new();
    let mut fabric = BTreeMap::new();
    for (system, server, dir, persistence, region_id) in [
        (System::Dax, "D", format!("{PMEM_MOUNT}/D"), "dax", "D1"),
        (System::Msync, "M", format!("{DISK_MOUNT}/M"), "msync", "M1"),
    ] {
        let (child, fields) = start_server(work, server, &dir, persistence)?;
        let mode = fields.get("mode").cloned().unwrap_or_default();
        ensure!(
            mode == persistence,
            "pmem-server {server} runs in mode {mode:?}, not {persistence}"
        );
        results.server_modes.insert(server.to_owned(), mode);
        let nic: SocketAddr = fields
            .get("nic.n0")
            .context("no nic.n0 in the ready line")?
            .parse()
            .context("the ready line's nic.n0")?;
        let link = Link::connect(nic, region(region_id)?, client_key)
            .with_context(|| format!("connect to pmem-server {server} at {nic}"))?;
        servers.push(child);
        fabric.insert(system, link);
    }
    for server in ["D", "M"] {
        let log =
            std::fs::read_to_string(work.join(format!("server-{server}.log"))).unwrap_or_default();
        results.device_lines.extend(
            log.lines()
                .filter_map(|l| l.find("pmem device ").map(|at| l[at..].to_owned())),
        );
    }
    let redis = RedisServer::start(&RedisConfig {
        aof_always: true,
        dir: PathBuf::from(format!("{DISK_MOUNT}/redis")),
    })
    .context("start redis-server (AOF on the disk)")?;
    let redis_dax = RedisServer::start(&RedisConfig {
        aof_always: true,
        dir: PathBuf::from(format!("{PMEM_MOUNT}/redis")),
    })
    .context("start redis-server (AOF on the fsdax mount)")?;
    let mut resp = BTreeMap::new();
    resp.insert(System::Redis, Resp::connect(redis.port())?);
    resp.insert(System::RedisDax, Resp::connect(redis_dax.port())?);

    let data = vec![0x5Au8; plan.size];
    let mut next = BTreeMap::new();
    let mut measure = |system: System, ops: usize| -> anyhow::Result<Vec<f64>> {
        let counter = next.entry(system).or_insert(0u64);
        let mut us = Vec::with_capacity(ops);
        for _ in 0..ops {
            let i = *counter;
            *counter += 1;
            let took = match system {
                System::Dax | System::Msync => {
                    let link = fabric.get_mut(&system).context("no connection")?;
                    let offset = (i * plan.size as u64) % (SPAN - plan.size as u64);
                    link.write_persist(offset, &data)
                }
                System::Redis | System::RedisDax => {
                    let conn = resp.get_mut(&system).context("no connection")?;
                    let key = format!("k:{:04}", i % 1000);
                    conn.set(key.as_bytes(), &data).map_err(anyhow::Error::from)
                }
            }
            .with_context(|| format!("{} operation {i}", system.name()))?;
            us.push(took.as_secs_f64() * 1e6);
        }
        Ok(us)
    };
    for system in System::ALL {
        measure(system, plan.warmup)?;
    }
    for round in 0..plan.rounds {
        for k in 0..System::ALL.len() {
            let system = System::ALL[(round + k) % System::ALL.len()];
            let us = measure(system, plan.ops)?;
            println!(
                "bench-persist round {round} {}: p50 {:.0} µs",
                system.name(),
                quantile(&us, 0.5)
            );
            results.series.push(Series { system, round, us });
        }
    }
    let path = work.join("guest-results.json");
    std::fs::write(&path, serde_json::to_string(&results)?)
        .with_context(|| format!("write {}", path.display()))?;
    drop((redis, redis_dax, servers));
    Ok(())
}

/// A blocking raw-protocol connection to one pmem-server region.
#[derive(Debug)]
struct Link {
    stream: TcpStream,
    region: RegionIndex,
    key: AccessKey,
    tag: u64,
    buf: Vec<u8>,
}

impl Link {
    /// Connects, proves client c's `key` and learns `region`'s key from
    /// the server's MAP.
    fn connect(addr: SocketAddr, region: RegionIndex, key: [u8; 32]) -> anyhow::Result<Link> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        stream.set_write_timeout(Some(IO_TIMEOUT))?;
        let stream = BenchConn::open_stream(stream, "c", Some(key))
            .context("open the connection as client c")?;
        let mut link = Link {
            stream,
            region,
            key: AccessKey::NONE,
            tag: 0,
            buf: Vec::new(),
        };
        link.exchange(&Message::MapRequest)?;
        link.key = match proto::parse_frame(&link.buf) {
            Ok((Message::Map(map), _)) => map.key(region),
            other => bail!("expected a MAP, got {other:?}"),
        };
        ensure!(
            !link.key.is_none(),
            "the server's MAP gives no key for region {}",
            region.0
        );
        Ok(link)
    }

    /// One WRITE_PERSIST of `data` at `offset`; how long it took.
    fn write_persist(&mut self, offset: u64, data: &[u8]) -> anyhow::Result<Duration> {
        let target = Target::Region(RegionOffset::new(self.region, offset));
        let request = Message::Request(Repr::write_persist(target, self.key, data));
        let started = Instant::now();
        self.exchange(&request)?;
        let took = started.elapsed();
        match proto::parse_frame(&self.buf) {
            Ok((Message::Response(r), _)) if r.status == Status::Ok => Ok(took),
            Ok((Message::Response(r), _)) => bail!("WRITE_PERSIST answered {:?}", r.status),
            other => bail!("unexpected reply to WRITE_PERSIST: {other:?}"),
        }
    }

    /// Sends `message` with the next tag and reads one frame into `buf`.
    fn exchange(&mut self, message: &Message<'_>) -> anyhow::Result<()> {
        self.tag += 1;
        let bytes = message
            .encode_to_vec(self.tag)
            .context("encode the request")?;
        self.stream.write_all(&bytes).context("send")?;
        self.buf.clear();
        self.buf.resize(frame::HEADER_LEN, 0);
        self.stream.read_exact(&mut self.buf).context("receive")?;
        let body = frame::Packet::new_unchecked(&self.buf[..]).body_len() as usize;
        ensure!(body <= 16 << 20, "oversized reply ({body} bytes)");
        self.buf.resize(frame::HEADER_LEN + body, 0);
        self.stream
            .read_exact(&mut self.buf[frame::HEADER_LEN..])
            .context("receive")?;
        Ok(())
    }
}

/// What went wrong with a redis reply.
#[derive(Debug, thiserror::Error)]
pub enum RespError {
    /// The connection failed.
    #[error("redis connection")]
    Io(#[from] io::Error),
    /// redis answered with an error.
    #[error("redis answered an error: {0}")]
    Error(String),
    /// redis answered something other than `+OK`.
    #[error("unexpected redis reply {0:?}")]
    Unexpected(String),
}

/// A minimal RESP client: SET, and its `+OK` reply.
#[derive(Debug)]
struct Resp {
    reader: BufReader<TcpStream>,
    request: Vec<u8>,
    line: Vec<u8>,
}

impl Resp {
    /// Connects to redis on 127.0.0.1:`port`.
    fn connect(port: u16) -> anyhow::Result<Resp> {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .with_context(|| format!("connect to redis at {addr}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        stream.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(Resp {
            reader: BufReader::new(stream),
            request: Vec::new(),
            line: Vec::new(),
        })
    }

    /// `SET key value`; how long until `+OK` came back.
    fn set(&mut self, key: &[u8], value: &[u8]) -> Result<Duration, RespError> {
        encode_command(&mut self.request, &[b"SET", key, value]);
        let started = Instant::now();
        self.reader.get_mut().write_all(&self.request)?;
        self.line.clear();
        let n = (&mut self.reader)
            .take(4096)
            .read_until(b'\n', &mut self.line)?;
        let took = started.elapsed();
        if n == 0 {
            return Err(RespError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "redis closed the connection",
            )));
        }
        check_ok(&self.line)?;
        Ok(took)
    }
}

/// Writes `args` as a RESP array of bulk strings into `out` (cleared first).
pub fn encode_command(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.clear();
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

/// Checks a one-line RESP reply is `+OK`.
pub fn check_ok(line: &[u8]) -> Result<(), RespError> {
    let text = String::from_utf8_lossy(line);
    let text = text.trim_end_matches(['\r', '\n']);
    match text.strip_prefix('-') {
        Some(error) => Err(RespError::Error(error.to_owned())),
        None if text == "+OK" => Ok(()),
        None => Err(RespError::Unexpected(text.to_owned())),
    }
}

// ---------------------------------------------------------------------------
// Figures.

/// The figures from the guest's series: per system the median of the
/// rounds' p50 and the p99 over every operation; the ratios per round.
pub fn summarize(
    plan: PersistPlan,
    results: GuestResults,
    seconds: f64,
) -> anyhow::Result<PersistReport> {
    let mut systems = Vec::new();
    for system in System::ALL {
        let series: Vec<&Series> = results
            .series
            .iter()
            .filter(|s| s.system == system)
            .collect();
        ensure!(
            series.len() == plan.rounds && series.iter().all(|s| !s.us.is_empty()),
            "{}: {} of {} rounds measured",
            system.name(),
            series.len(),
            plan.rounds
        );
        let all: Vec<f64> = series.iter().flat_map(|s| s.us.iter().copied()).collect();
        let round_p50_us: Vec<f64> = series.iter().map(|s| quantile(&s.us, 0.5)).collect();
        systems.push(SystemFigures {
            system,
            what: system.what().to_owned(),
            p50_us: median(&round_p50_us),
            p99_us: quantile(&all, 0.99),
            round_p99_us: series.iter().map(|s| quantile(&s.us, 0.99)).collect(),
            round_p50_us,
        });
    }
    let p50s = |system: System| {
        systems
            .iter()
            .find(|f| f.system == system)
            .map(|f| f.round_p50_us.clone())
            .unwrap_or_default()
    };
    let ratio = |a: System, b: System| {
        let ratios: Vec<f64> = p50s(a)
            .iter()
            .zip(p50s(b))
            .map(|(x, y)| x / y.max(f64::MIN_POSITIVE))
            .collect();
        Ratio {
            median: median(&ratios),
            min: ratios.iter().copied().fold(f64::INFINITY, f64::min),
            max: ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    };
    Ok(PersistReport {
        plan,
        server_modes: results.server_modes,
        device_lines: results.device_lines,
        dax_over_redis: ratio(System::Dax, System::Redis),
        msync_over_redis: ratio(System::Msync, System::Redis),
        dax_over_redis_dax: ratio(System::Dax, System::RedisDax),
        systems,
        seconds,
    })
}

/// The report as Markdown.
pub fn markdown(report: &PersistReport) -> String {
    let plan = report.plan;
    let mut text = format!(
        "# One durable {} B write in one NVDIMM guest: WRITE_PERSIST (DAX, msync) next to redis\n\n\
         One lab guest (QEMU, 1 vCPU; TCG unless the host has KVM): an emulated NVDIMM as fsdax \
         (ext4 `-o dax` at {PMEM_MOUNT}) and a virtio disk (ext4 at {DISK_MOUNT}). The load \
         generator runs in the same guest, one request at a time over loopback; {} interleaved \
         rounds of {} operations per system (order rotating each round) after {} warm-up \
         operations each. p50 = median of the rounds' p50s; p99 over every operation. Under \
         emulation absolute times are emulation time; compare the ratios. Run took {:.0} s.\n\n\
         | system | what | p50 µs | p99 µs | rounds' p50 µs |\n|---|---|---:|---:|---|\n",
        plan.size, plan.rounds, plan.ops, plan.warmup, report.seconds
    );
    for f in &report.systems {
        let rounds: Vec<String> = f.round_p50_us.iter().map(|v| format!("{v:.0}")).collect();
        text.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {} |\n",
            f.system.name(),
            f.what,
            f.p50_us,
            f.p99_us,
            rounds.join(", ")
        ));
    }
    text.push_str("\n| ratio of p50s | median of rounds | rounds' range |\n|---|---:|---|\n");
    for (name, r) in [
        ("dax / redis", report.dax_over_redis),
        ("msync / redis", report.msync_over_redis),
        ("dax / redis-dax", report.dax_over_redis_dax),
    ] {
        text.push_str(&format!(
            "| {name} | {:.2} | {:.2} – {:.2} |\n",
            r.median, r.min, r.max
        ));
    }
    text.push_str("\nServers: ");
    let modes: Vec<String> = report
        .server_modes
        .iter()
        .map(|(server, mode)| format!("{server} mode={mode}"))
        .collect();
    text.push_str(&modes.join(", "));
    text.push('\n');
    for line in &report.device_lines {
        text.push_str(&format!("- {line}\n"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn results(rounds: usize) -> GuestResults {
        let mut r = GuestResults::default();
        r.server_modes.insert("D".into(), "dax".into());
        r.server_modes.insert("M".into(), "msync".into());
        for round in 0..rounds {
            for (system, base) in [
                (System::Dax, 100.0),
                (System::Msync, 400.0),
                (System::Redis, 200.0),
                (System::RedisDax, 150.0),
            ] {
                let us = (0..100).map(|i| base + i as f64 + round as f64).collect();
                r.series.push(Series { system, round, us });
            }
        }
        r
    }

    #[test]
    fn figures_are_medians_of_rounds_and_ratios_of_p50s() {
        let plan = PersistPlan::new(true, Some(3), 64);
        let report = summarize(plan, results(3), 1.0).expect("complete");
        let dax = &report.systems[0];
        assert_eq!(dax.system, System::Dax);
        // Round r's p50 (nearest rank of 100 values) is base + 49 + r.
        assert_eq!(dax.round_p50_us, vec![149.0, 150.0, 151.0]);
        assert_eq!(dax.p50_us, 150.0);
        // Rank 297 of the 300 values pooled from the three rounds.
        assert_eq!(dax.p99_us, 199.0);
        assert!((report.dax_over_redis.median - 150.0 / 250.0).abs() < 1e-9);
        assert!((report.msync_over_redis.median - 450.0 / 250.0).abs() < 1e-9);
        let text = markdown(&report);
        assert!(text.contains("| dax / redis | 0.60 |"), "{text}");
        assert!(text.contains("D mode=dax, M mode=msync"), "{text}");
    }

    #[test]
    fn a_missing_round_is_an_error() {
        let plan = PersistPlan::new(false, Some(4), 256);
        let err = summarize(plan, results(3), 1.0).expect_err("incomplete");
        assert!(err.to_string().contains("3 of 4 rounds"), "{err}");
    }

    #[test]
    fn resp_set_and_replies() {
        let mut out = Vec::new();
        encode_command(&mut out, &[b"SET", b"k:1", b"xy"]);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$3\r\nk:1\r\n$2\r\nxy\r\n");
        assert!(check_ok(b"+OK\r\n").is_ok());
        assert!(matches!(
            check_ok(b"-MISCONF no disk\r\n"),
            Err(RespError::Error(m)) if m == "MISCONF no disk"
        ));
        assert!(matches!(
            check_ok(b"$-1\r\n"),
            Err(RespError::Unexpected(_))
        ));
    }

    #[test]
    fn the_topology_is_valid_with_one_region_per_server() {
        let topology = topology::Topology::from_toml_str(
            "bench-persist",
            TOPOLOGY,
            &topology::EnvOverrides::None,
        )
        .expect("parses");
        assert!(topology.validate().is_ok());
        let layout = topology::Layout::new(&topology).expect("layout");
        assert_eq!(layout.entries().len(), 2);
    }
}
