//! Real power cuts: a pmem-server in a QEMU guest of the RDMA lab, driven
//! from the host with WRITE_PERSIST, WRITE + FLUSH and persistent
//! exactly-once FETCH_ADD and COMPARE_SWAP; QEMU is killed with SIGKILL at
//! a seeded random instant, the guest boots again on the same media, and
//! every acknowledged write and atomic is checked.
//!
//! Three media ([`Medium`]): the region files on the guest's virtio disk
//! (ext4, the msync mechanism), on an emulated NVDIMM (ext4 mounted
//! `-o dax`, the DAX mechanism: `MAP_SYNC` mappings and cache-line
//! write-back), or the regions straight on an emulated NVDIMM made a device
//! DAX namespace (`/dev/dax0.0`, the devdax mechanism: the region header and
//! data in the character device's mapping, cache-line write-back; the
//! exactly-once window and the manifest stay on the virtio disk).
//!
//! Killing QEMU is a power cut for the guest: its page cache, and anything
//! the guest had not written to its virtual disk, is gone; what QEMU had
//! written to the disk image stays (it is the media). An NVDIMM's backing
//! file keeps every store the guest made, so on that medium the cut tests
//! the filesystem metadata `MAP_SYNC` must have made durable, the region
//! headers and the exactly-once window, not the cache-line write-back
//! (the emulated persistence domain tests that). The request running at the
//! cut may or may not have happened; the exactly-once atomic among them is
//! retried after the boot with its original sequence number and must be
//! answered as if it ran once.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use proto::request::{ExactlyOnce, Repr, Target};
use proto::{AccessKey, Message, Status, frame};
use serde::Serialize;
use topology::secrets::{Principal, read_key};
use topology::{RegionIndex, RegionOffset};

use crate::bench::client::BenchConn;
use crate::lab::{GuestStorage, LabNet};

/// The guest's address on the lab bridge, where its server listens.
const GUEST_IP: &str = "10.77.0.2";
const NIC_PORT: u16 = 7000;
/// The server's topology: one server `S` in the guest with one 8 MiB
/// region, one fabric device and one client (number 0, the driver's
/// exactly-once identity). Only the server runs.
const TOPOLOGY: &str = r#"# Written by testbed power-cut.
[pool]
name = "power-cut"
extent_size = "1MiB"

[[servers]]
id = "S"
admin = "10.77.0.2:9100"

  [[servers.sockets]]
  id = "0"
    [[servers.sockets.devices]]
    id = "pmem0"
      [[servers.sockets.devices.regions]]
      id = "S1"
      size = "8MiB"

  [[servers.nics]]
  id = "n0"
  socket = "0"
  listen = "10.77.0.2:7000"

[[fabric_devices]]
id = "F"
ports = [{ id = "p0", listen = "10.77.0.100:7100" }]
links = [{ server = "S", nic = "n0" }]

[[clients]]
id = "c"
rnics = [{ id = "r0", fabric_device = "F" }]
"#;

/// The workload's blocks: SLOTS blocks of BLOCK bytes after the words.
const SLOTS: u64 = 64;
const BLOCK: usize = 4096;
const BLOCKS_AT: u64 = 64 * 1024;
/// The FETCH_ADD counter and the COMPARE_SWAP chain.
const COUNTER_AT: u64 = 0;
const CHAIN_AT: u64 = 64;
/// How long a boot and server start may take under emulation.
const BOOT_TIMEOUT: Duration = Duration::from_secs(180);
const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// The device path a [`Medium::Devdax`] server's PMEM device names.
const DEVDAX_PATH: &str = "/dev/dax0.0";

/// The server's topology on `medium`: [`TOPOLOGY`], with the device's
/// path on device DAX.
fn topology(medium: Medium) -> String {
    match medium {
        Medium::Devdax => TOPOLOGY.replacen(
            "id = \"pmem0\"\n",
            &format!("id = \"pmem0\"\n    path = \"{DEVDAX_PATH}\"\n"),
            1,
        ),
        Medium::Disk | Medium::Fsdax => TOPOLOGY.to_owned(),
    }
}

/// Size of the NVDIMM backing file (sparse on the host).
const NVDIMM_SIZE: u64 = 128 << 20;

/// Where the server in the guest keeps its regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Medium {
    /// A virtio disk with ext4; persistence by msync(2).
    Disk,
    /// An emulated NVDIMM as an fsdax namespace with ext4 mounted `-o
    /// dax`; persistence by `MAP_SYNC` and cache-line write-back.
    Fsdax,
    /// An emulated NVDIMM as a device DAX namespace (`/dev/dax0.0`) holding
    /// the regions, next to a virtio disk for the data directory;
    /// persistence by cache-line write-back.
    Devdax,
}

impl Medium {
    /// The persistence mechanism the server is asked for: on device DAX
    /// `auto`, so that the exactly-once window on the disk takes msync.
    fn persistence(self) -> &'static str {
        match self {
            Medium::Disk => "msync",
            Medium::Fsdax => "dax",
            Medium::Devdax => "auto",
        }
    }

    /// The mode the server must report for its regions.
    fn mode(self) -> &'static str {
        match self {
            Medium::Disk => "msync",
            Medium::Fsdax => "dax",
            Medium::Devdax => "devdax",
        }
    }

    /// The line the server must log about its PMEM device: where its
    /// regions are, on what, and its NUMA node.
    fn device_line(self) -> String {
        let (place, kind, node) = match self {
            Medium::Disk => ("/data/S (data dir)", "files on vda", "NUMA node unknown"),
            Medium::Fsdax => ("/data/S (data dir)", "fsdax on pmem0", "NUMA node 0"),
            Medium::Devdax => (DEVDAX_PATH, "devdax", "NUMA node 0"),
        };
        format!("pmem device pmem0 of socket 0: {place}, {kind}, {node}, 1 region")
    }

    /// Whether the guest gets the virtio disk.
    fn has_disk(self) -> bool {
        matches!(self, Medium::Disk | Medium::Devdax)
    }

    /// Whether the guest gets the NVDIMM.
    fn has_nvdimm(self) -> bool {
        matches!(self, Medium::Fsdax | Medium::Devdax)
    }

    /// The guest's lines that put the data folder in place at /data.
    fn mount(self) -> &'static str {
        match self {
            Medium::Disk => "mount -t ext4 /dev/vda /data\n",
            // The first boot turns the raw namespace into fsdax (an info
            // block on the NVDIMM, so later boots find it) and makes the
            // filesystem.
            Medium::Fsdax => {
                "i=0; while [ ! -e /dev/pmem0 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done\n\
                 if [ \"$(cat /sys/block/pmem0/queue/dax)\" != 1 ]; then\n\
                 ndctl create-namespace --force --reconfig namespace0.0 --mode fsdax --align 2M\n\
                 mkfs.ext4 -q -F -b 4096 /dev/pmem0\nfi\n\
                 mount -t ext4 -o dax /dev/pmem0 /data\n"
            }
            // The first boot turns the raw namespace into device DAX; later
            // boots find /dev/dax0.0 by its info block.
            Medium::Devdax => {
                "mount -t ext4 /dev/vda /data\n\
                 i=0; while [ ! -e /dev/pmem0 ] && [ ! -e /dev/dax0.0 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done\n\
                 if [ ! -e /dev/dax0.0 ]; then\n\
                 ndctl create-namespace --force --reconfig namespace0.0 --mode devdax --align 2M\nfi\n"
            }
        }
    }
}

impl std::fmt::Display for Medium {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Medium::Disk => "msync on a virtio disk",
            Medium::Fsdax => "DAX on an emulated NVDIMM (fsdax, MAP_SYNC)",
            Medium::Devdax => "device DAX on an emulated NVDIMM (devdax, /dev/dax0.0)",
        })
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct PowerCutPlan {
    /// Power cuts.
    pub cuts: usize,
    /// Where the regions live.
    pub medium: Medium,
    /// Seed of the cut instants.
    pub seed: u64,
    /// Where the report and the guest consoles go.
    pub out: PathBuf,
}

/// What a run did and found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PowerCutReport {
    /// Where the regions lived (`None` only in a default report).
    pub medium: Option<Medium>,
    /// Power cuts made.
    pub cuts: usize,
    /// Requests acknowledged before the cuts.
    pub acknowledged: u64,
    /// Acknowledged blocks (WRITE_PERSIST, WRITE + FLUSH) checked after the
    /// boots.
    pub blocks_checked: u64,
    /// Atomic words checked after the boots.
    pub atomics_checked: u64,
    /// Exactly-once atomics running at a cut, retried after the boot.
    pub retries_checked: u64,
    /// Acknowledged writes or atomics missing or wrong after a boot.
    pub lost: u64,
    /// Each cut: milliseconds of workload before it, and the request
    /// running when it came.
    pub timeline: Vec<CutRecord>,
    /// What was wrong, if anything.
    pub problems: Vec<String>,
}

/// One power cut.
#[derive(Debug, Clone, Serialize)]
pub struct CutRecord {
    /// Milliseconds of workload before the cut.
    pub after_ms: u64,
    /// Requests acknowledged in that time.
    pub acknowledged: u64,
    /// The request the cut interrupted.
    pub in_flight: String,
}

/// One request of the workload.
#[derive(Debug, Clone, Copy)]
enum Op {
    WritePersist {
        slot: u64,
        stamp: u64,
    },
    /// WRITE then FLUSH: acknowledged by the FLUSH.
    WriteFlush {
        slot: u64,
        stamp: u64,
    },
    FetchAdd {
        seq: u64,
    },
    CompareSwap {
        seq: u64,
        from: u64,
    },
}

/// What the host knows was acknowledged.
#[derive(Debug, Default)]
struct Ledger {
    /// The stamp of each block's last acknowledged write.
    blocks: Vec<Option<u64>>,
    counter: u64,
    chain: u64,
    next_stamp: u64,
    /// The driver's exactly-once session and its next sequence number.
    next_seq: u64,
    acknowledged: u64,
}

/// The bytes of block `slot` written with `stamp`.
fn block(slot: u64, stamp: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(BLOCK);
    let mut x = stamp.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ slot;
    while out.len() < BLOCK {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

/// A blocking connection to the server that reports a dead peer as an
/// error instead of panicking.
struct Link {
    stream: TcpStream,
    key: AccessKey,
    tag: u64,
}

/// A response: status, value and data.
type Answer = (Status, u64, Vec<u8>);

impl Link {
    /// Connects, proves client c's `key` and learns region 0's key from
    /// the server's MAP.
    fn connect(addr: SocketAddr, key: [u8; 32]) -> io::Result<Link> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        let stream = BenchConn::open_stream(stream, "c", Some(key))?;
        let mut link = Link {
            stream,
            key: AccessKey::NONE,
            tag: 0,
        };
        let frame = link.exchange(&Message::MapRequest)?;
        link.key = match proto::parse_frame(&frame) {
            Ok((Message::Map(map), tag)) if tag == link.tag => map.key(RegionIndex(0)),
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("expected a MAP: {other:?}"),
                ));
            }
        };
        Ok(link)
    }

    fn call(&mut self, req: Repr<'_>) -> io::Result<Answer> {
        let frame = self.exchange(&Message::Request(req))?;
        match proto::parse_frame(&frame) {
            Ok((Message::Response(r), tag)) if tag == self.tag => {
                Ok((r.status, r.value, r.payload.to_vec()))
            }
            other => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unexpected reply: {other:?}"),
            )),
        }
    }

    /// Sends `message` with the next tag and reads one frame back.
    fn exchange(&mut self, message: &Message<'_>) -> io::Result<Vec<u8>> {
        self.tag += 1;
        let bytes = message
            .encode_to_vec(self.tag)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        self.stream.write_all(&bytes)?;
        let mut frame = vec![0u8; frame::HEADER_LEN];
        self.stream.read_exact(&mut frame)?;
        let body = frame::Packet::new_unchecked(&frame[..]).body_len() as usize;
        if body > 16 << 20 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "oversized reply",
            ));
        }
        frame.resize(frame::HEADER_LEN + body, 0);
        self.stream.read_exact(&mut frame[frame::HEADER_LEN..])?;
        Ok(frame)
    }

    fn at(offset: u64) -> Target {
        Target::Region(RegionOffset::new(RegionIndex(0), offset))
    }

    /// Runs `op` and returns the value it answered with; `Err` when the
    /// connection died first. A status other than OK is an error too.
    fn run(&mut self, op: Op) -> io::Result<u64> {
        let key = self.key;
        let once = |seq| ExactlyOnce::on_lane(0, seq).stamped(0);
        let answer = match op {
            Op::WritePersist { slot, stamp } => {
                let data = block(slot, stamp);
                self.call(Repr::write_persist(Self::at(slot_at(slot)), key, &data))?
            }
            Op::WriteFlush { slot, stamp } => {
                let data = block(slot, stamp);
                let written = self.call(Repr::write(Self::at(slot_at(slot)), key, &data))?;
                expect_ok(&written, "WRITE")?;
                self.call(Repr::flush(Self::at(slot_at(slot)), key, BLOCK as u32))?
            }
            Op::FetchAdd { seq } => {
                let id = once(seq);
                self.call(
                    Repr::fetch_add(Self::at(COUNTER_AT), key, 1)
                        .with_exactly_once(id.client, id.seq)
                        .with_persist(),
                )?
            }
            Op::CompareSwap { seq, from } => {
                let id = once(seq);
                self.call(
                    Repr::compare_swap(Self::at(CHAIN_AT), key, from, from + 1)
                        .with_exactly_once(id.client, id.seq)
                        .with_persist(),
                )?
            }
        };
        expect_ok(&answer, "request")?;
        Ok(answer.1)
    }

    fn read(&mut self, offset: u64, len: u32) -> anyhow::Result<Vec<u8>> {
        let key = self.key;
        let answer = self.call(Repr::read(Self::at(offset), key, len))?;
        expect_ok(&answer, "READ")?;
        Ok(answer.2)
    }

    fn word(&mut self, offset: u64) -> anyhow::Result<u64> {
        let bytes = self.read(offset, 8)?;
        let bytes: [u8; 8] = bytes
            .try_into()
            .map_err(|_| anyhow::anyhow!("short READ"))?;
        Ok(u64::from_le_bytes(bytes))
    }
}

fn slot_at(slot: u64) -> u64 {
    BLOCKS_AT + slot * BLOCK as u64
}

fn expect_ok(answer: &Answer, what: &str) -> io::Result<()> {
    if answer.0 == Status::Ok {
        Ok(())
    } else {
        Err(io::Error::other(format!("{what} answered {}", answer.0)))
    }
}

impl Ledger {
    fn new(session: u32) -> Ledger {
        Ledger {
            blocks: vec![None; SLOTS as usize],
            next_seq: u64::from(session) << 32,
            ..Ledger::default()
        }
    }

    /// The next request of the workload.
    fn next(&mut self) -> Op {
        self.next_stamp += 1;
        let stamp = self.next_stamp;
        let slot = (stamp / 4) % SLOTS;
        match stamp % 4 {
            0 => Op::WritePersist { slot, stamp },
            1 => {
                self.next_seq += 1;
                Op::FetchAdd { seq: self.next_seq }
            }
            2 => Op::WriteFlush { slot, stamp },
            _ => {
                self.next_seq += 1;
                Op::CompareSwap {
                    seq: self.next_seq,
                    from: self.chain,
                }
            }
        }
    }

    /// Records that `op` was acknowledged with `value`.
    fn acknowledge(&mut self, op: Op, value: u64) -> Result<(), String> {
        self.acknowledged += 1;
        match op {
            Op::WritePersist { slot, stamp } | Op::WriteFlush { slot, stamp } => {
                self.blocks[slot as usize] = Some(stamp);
            }
            Op::FetchAdd { .. } => {
                if value != self.counter {
                    return Err(format!(
                        "FETCH_ADD returned {value}, the counter was {}",
                        self.counter
                    ));
                }
                self.counter += 1;
            }
            Op::CompareSwap { from, .. } => {
                if value != from {
                    return Err(format!("COMPARE_SWAP returned {value}, expected {from}"));
                }
                self.chain = from + 1;
            }
        }
        Ok(())
    }
}

/// The guest that runs the server, booted on the disk image.
struct Guest {
    child: Child,
    pidfile: PathBuf,
}

impl Guest {
    fn boot(lab: &LabNet, work: &Path, medium: Medium, boot: usize) -> anyhow::Result<Guest> {
        let script = work.join("guest-server.sh");
        let exe = std::env::current_exe().context("the testbed binary")?;
        let exe_dir = exe.parent().context("the testbed binary's folder")?;
        let pidfile = work.join("qemu.pid");
        let _ = std::fs::remove_file(&pidfile);
        let console = work.join(format!("console-{boot}.log"));
        let disk = work.join("disk.img");
        let nvdimm = work.join("nvdimm.img");
        let nvdimms = [nvdimm.as_path()];
        let storage = GuestStorage {
            disk: medium.has_disk().then_some(disk.as_path()),
            nvdimms: if medium.has_nvdimm() { &nvdimms } else { &[] },
            nodes: 1,
            pidfile: &pidfile,
            address: None,
        };
        let child = lab
            .guest_with_storage(&script, &[exe_dir], &console, &storage)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("boot the server's guest")?;
        Ok(Guest { child, pidfile })
    }

    /// Waits until the server in the guest accepts connections.
    fn wait_ready(
        &mut self,
        addr: SocketAddr,
        key: [u8; 32],
        console: &Path,
    ) -> anyhow::Result<Link> {
        let deadline = Instant::now() + BOOT_TIMEOUT;
        loop {
            if let Ok(link) = Link::connect(addr, key) {
                return Ok(link);
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "the guest ended ({status}) before its server listened:\n{}",
                    tail(console)
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "the server in the guest did not listen within {BOOT_TIMEOUT:?}:\n{}",
                    tail(console)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// QEMU's process id.
    fn pid(&self) -> anyhow::Result<i32> {
        std::fs::read_to_string(&self.pidfile)
            .context("QEMU's pid file")?
            .trim()
            .parse()
            .context("QEMU's pid")
    }

    /// Cuts the power now and waits for the guest's end.
    fn cut(&mut self) -> anyhow::Result<()> {
        power_off(self.pid()?)?;
        self.child.wait()?;
        Ok(())
    }
}

/// SIGKILL to QEMU process `pid`: the guest loses power.
fn power_off(pid: i32) -> anyhow::Result<()> {
    // SAFETY: kill(2) with a pid read from QEMU's own pid file; QEMU is a
    // child of a guest.sh this run started and has not been reaped.
    if unsafe { libc::kill(pid, libc::SIGKILL) } != 0 {
        bail!("kill QEMU {pid}: {}", io::Error::last_os_error());
    }
    Ok(())
}

/// The last lines of a console log.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// The keys' folder in the work folder (the guest sees it at the same path).
const SECRETS: &str = "secrets";

/// Writes the guest's script, topology and keys and makes the media: an ext4
/// disk image, an NVDIMM backing file the first boot formats, or both.
fn prepare(work: &Path, medium: Medium) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(work)?;
    let topology = work.join("topology.toml");
    std::fs::write(&topology, self::topology(medium))?;
    // The driver proves client c's key to the server, as any client would.
    let parsed = topology::Topology::load(&topology).context("the power-cut topology")?;
    crate::keys::generate(&parsed, &work.join(SECRETS)).context("make the keys")?;
    let exe = std::env::current_exe()?;
    let script = work.join("guest-server.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n# The server's guest: its data on {medium}.\nset -e\n\
             mkdir -p /data\n{}\
             exec {} daemon pmem-server --config {} --server S --data-dir /data/S \
             --persistence {} --secrets {}\n",
            medium.mount(),
            exe.display(),
            topology.display(),
            medium.persistence(),
            work.join(SECRETS).display(),
        ),
    )?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    if medium.has_disk() {
        let disk = work.join("disk.img");
        std::fs::File::create(&disk)?.set_len(64 << 20)?;
        let out = std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(&disk)
            .output()
            .context("run mkfs.ext4 (Debian package e2fsprogs)")?;
        ensure!(
            out.status.success(),
            "mkfs.ext4 failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    if medium.has_nvdimm() {
        std::fs::File::create(work.join("nvdimm.img"))?.set_len(NVDIMM_SIZE)?;
    }
    Ok(topology)
}

/// Checks that the server in the guest said it runs on `medium`'s
/// persistence mechanism (its ready line, on the console) and where it
/// found its device's memory and NUMA node.
fn check_mode(console: &Path, medium: Medium) -> anyhow::Result<()> {
    let want = medium.mode();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(console).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.starts_with("ready server=")) {
            let fields = testkit::parse_ready_line(line).map_err(anyhow::Error::msg)?;
            ensure!(
                fields.get("mode").map(String::as_str) == Some(want),
                "the server runs in another mode than {want}: {line}"
            );
            let device_line = medium.device_line();
            ensure!(
                text.contains(&device_line),
                "the server did not say where its device is ({device_line:?}):\n{}",
                tail(console)
            );
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "no ready line from the server on the console:\n{}",
            tail(console)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Checks the server's state after a boot against the ledger, retries the
/// interrupted exactly-once atomic, and counts what it checked.
fn verify(
    link: &mut Link,
    ledger: &mut Ledger,
    in_flight: Option<Op>,
    report: &mut PowerCutReport,
) -> anyhow::Result<()> {
    let lose = |report: &mut PowerCutReport, what: String| {
        report.lost += 1;
        report.problems.push(what);
    };
    for slot in 0..SLOTS {
        let found = link.read(slot_at(slot), BLOCK as u32)?;
        let pending = match in_flight {
            Some(Op::WritePersist { slot: s, stamp } | Op::WriteFlush { slot: s, stamp })
                if s == slot =>
            {
                Some(stamp)
            }
            _ => None,
        };
        let acked = ledger.blocks[slot as usize];
        let matches = |stamp: Option<u64>| match stamp {
            Some(stamp) => found == block(slot, stamp),
            None => found.iter().all(|&b| b == 0),
        };
        if acked.is_some() {
            report.blocks_checked += 1;
        }
        let pending_landed = pending.is_some() && matches(pending);
        if !matches(acked) && !pending_landed {
            lose(
                report,
                format!("block {slot}: acknowledged stamp {acked:?} is not what it holds"),
            );
        }
        if pending_landed {
            ledger.blocks[slot as usize] = pending;
        }
    }
    report.atomics_checked += 2;
    let counter = link.word(COUNTER_AT)?;
    let chain = link.word(CHAIN_AT)?;
    let counter_may_be = [ledger.counter, ledger.counter + 1];
    let fetch_add_running = matches!(in_flight, Some(Op::FetchAdd { .. }));
    if counter != ledger.counter && !(fetch_add_running && counter == ledger.counter + 1) {
        lose(
            report,
            format!("the counter holds {counter}, expected one of {counter_may_be:?}"),
        );
    }
    let swap_running = matches!(in_flight, Some(Op::CompareSwap { .. }));
    if chain != ledger.chain && !(swap_running && chain == ledger.chain + 1) {
        lose(
            report,
            format!("the chain holds {chain}, expected {}", ledger.chain),
        );
    }
    if let Some(op @ (Op::FetchAdd { .. } | Op::CompareSwap { .. })) = in_flight {
        // The client retries with the same sequence number: answered as if
        // it ran once.
        report.retries_checked += 1;
        let value = link.run(op).context("retry the interrupted atomic")?;
        if let Err(e) = ledger.acknowledge(op, value) {
            lose(report, format!("retry after the cut: {e}"));
        }
        let (word, expected) = match op {
            Op::FetchAdd { .. } => (link.word(COUNTER_AT)?, ledger.counter),
            _ => (link.word(CHAIN_AT)?, ledger.chain),
        };
        if word != expected {
            lose(
                report,
                format!("after the retry the word holds {word}, expected {expected}"),
            );
        }
    }
    Ok(())
}

/// Runs the workload until the power is cut; returns the request the cut
/// interrupted, if one was running.
fn drive(link: &mut Link, ledger: &mut Ledger, cut: &AtomicBool) -> anyhow::Result<Option<Op>> {
    loop {
        let op = ledger.next();
        match link.run(op) {
            // Answered, so acknowledged, even if the power went since.
            Ok(value) => ledger.acknowledge(op, value).map_err(anyhow::Error::msg)?,
            Err(_) if cut.load(Ordering::SeqCst) => return Ok(Some(op)),
            Err(e) => return Err(e).context("the workload failed before the power cut"),
        }
    }
}

/// Runs `plan`: boots, drives, cuts and verifies `plan.cuts` times, then
/// writes `report.json` and `report.md` to `plan.out`.
pub fn run(plan: &PowerCutPlan) -> anyhow::Result<PowerCutReport> {
    let lab = LabNet::enter().context("the RDMA lab")?;
    let work = plan.out.join("work");
    prepare(&work, plan.medium)?;
    let client_key = read_key(&work.join(SECRETS), Principal::Client("c"))?;
    // The region key the server made on its first boot; kept across cuts.
    let mut first_key = None;
    let addr: SocketAddr = format!("{GUEST_IP}:{NIC_PORT}").parse()?;
    let mut rng = fastrand::Rng::with_seed(plan.seed);
    let mut ledger = Ledger::new(rng.u32(1..u32::MAX));
    let mut report = PowerCutReport {
        medium: Some(plan.medium),
        ..PowerCutReport::default()
    };
    let mut in_flight = None;
    for boot in 0..=plan.cuts {
        let console = work.join(format!("console-{boot}.log"));
        let mut guest = Guest::boot(&lab, &work, plan.medium, boot)?;
        let mut link = guest.wait_ready(addr, client_key, &console)?;
        if link.key.is_none() {
            bail!("boot {boot}: the server gives no key for region 0");
        }
        if *first_key.get_or_insert(link.key) != link.key {
            bail!("boot {boot}: region 0's key is not the one it had before the power cut");
        }
        check_mode(&console, plan.medium)?;
        verify(&mut link, &mut ledger, in_flight.take(), &mut report)
            .with_context(|| format!("checking after boot {boot}"))?;
        if report.lost > 0 || boot == plan.cuts {
            guest.cut()?;
            break;
        }
        let cut = Arc::new(AtomicBool::new(false));
        let delay = Duration::from_millis(rng.u64(500..4000));
        let stream = link.stream.try_clone()?;
        let pid = guest.pid()?;
        let started = Instant::now();
        let acknowledged_before = ledger.acknowledged;
        // The power goes at a random instant, most likely in the middle of
        // a request; the driver's socket is shut so it notices at once.
        let cutter = {
            let cut = Arc::clone(&cut);
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                cut.store(true, Ordering::SeqCst);
                let off = power_off(pid);
                let _ = stream.shutdown(std::net::Shutdown::Both);
                off
            })
        };
        let driven = drive(&mut link, &mut ledger, &cut);
        let off = cutter
            .join()
            .map_err(|_| anyhow::anyhow!("the power-cut thread panicked"))?;
        guest.child.wait()?;
        in_flight = driven?;
        off?;
        report.cuts += 1;
        report.timeline.push(CutRecord {
            after_ms: started.elapsed().as_millis() as u64,
            acknowledged: ledger.acknowledged - acknowledged_before,
            in_flight: in_flight.map_or("none".to_owned(), |op| format!("{op:?}")),
        });
    }
    report.acknowledged = ledger.acknowledged;
    write_report(&plan.out, &report)?;
    Ok(report)
}

/// `report.json` and `report.md` in `out`.
fn write_report(out: &Path, report: &PowerCutReport) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    std::fs::write(
        out.join("report.json"),
        serde_json::to_string_pretty(report)?,
    )?;
    std::fs::write(out.join("report.md"), markdown(report))?;
    Ok(())
}

/// The report for people.
pub fn markdown(report: &PowerCutReport) -> String {
    let mut text = format!(
        "# Power cuts of a pmem-server guest ({})\n\n\
         | | |\n|---|---|\n\
         | power cuts | {} |\n| requests acknowledged | {} |\n\
         | acknowledged blocks checked | {} |\n| atomic words checked | {} |\n\
         | interrupted exactly-once atomics retried | {} |\n| lost | {} |\n\n\
         | cut | ms of workload | acknowledged | interrupted request |\n|---|---|---|---|\n",
        report
            .medium
            .map_or("medium not recorded".to_owned(), |m| m.to_string()),
        report.cuts,
        report.acknowledged,
        report.blocks_checked,
        report.atomics_checked,
        report.retries_checked,
        report.lost
    );
    for (i, cut) in report.timeline.iter().enumerate() {
        text.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            i + 1,
            cut.after_ms,
            cut.acknowledged,
            cut.in_flight
        ));
    }
    for problem in &report.problems {
        text.push_str(&format!("\n- {problem}"));
    }
    text
}
