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

mod medium;
mod workload;

pub use medium::Medium;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use proto::RegionIndex;
use serde::Serialize;
use topology::secrets::{Principal, read_key};

use crate::fabric::launch::log_tail;
use crate::lab::LabNet;
use crate::lab::guest::{self, GuestWork, Media};
use crate::lab::raw_client::{RawClient, Timeouts};
use medium::{GUEST_IP, NIC_PORT};
use workload::{Ledger, drive, verify};

/// How long a boot and server start may take under emulation.
const BOOT_TIMEOUT: Duration = Duration::from_secs(180);
/// How long connecting to the server, and each read or write, may take.
const TIMEOUTS: Timeouts = Timeouts {
    connect: Duration::from_secs(2),
    io: Duration::from_secs(60),
};
/// Size of the NVDIMM backing file (sparse on the host).
const NVDIMM_SIZE: u64 = 128 << 20;
/// Size of the virtio disk image (sparse on the host).
const DISK_SIZE: u64 = 64 << 20;
/// Lines of a console log an error shows.
const TAIL_LINES: usize = 20;

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
    /// Blocks an interrupted write left torn (each 8-byte word the old
    /// write's or the interrupted one's, as persistent memory allows);
    /// written again whole before the workload went on.
    pub torn: u64,
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

/// The guest that runs the server, booted on its media.
struct Guest {
    child: Child,
    pidfile: PathBuf,
}

impl Guest {
    fn boot(lab: &LabNet, work: &GuestWork, console: &Path) -> anyhow::Result<Guest> {
        let child = work.boot(lab, console).context("boot the server's guest")?;
        Ok(Guest {
            child,
            pidfile: work.pidfile(),
        })
    }

    /// Waits until the server in the guest accepts connections.
    fn wait_ready(
        &mut self,
        addr: SocketAddr,
        key: [u8; 32],
        console: &Path,
    ) -> anyhow::Result<RawClient> {
        let deadline = Instant::now() + BOOT_TIMEOUT;
        loop {
            if let Ok(client) = RawClient::connect(addr, "c", key, RegionIndex(0), TIMEOUTS) {
                return Ok(client);
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "the guest ended ({status}) before its server listened:\n{}",
                    log_tail(console, TAIL_LINES)
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "the server in the guest did not listen within {BOOT_TIMEOUT:?}:\n{}",
                    log_tail(console, TAIL_LINES)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// QEMU's process id.
    fn pid(&self) -> anyhow::Result<i32> {
        Ok(guest::qemu_pid(&self.pidfile)?)
    }

    /// Cuts the power now and waits for the guest's end.
    fn cut(&mut self) -> anyhow::Result<()> {
        guest::power_off(&self.pidfile)?;
        self.child.wait()?;
        Ok(())
    }
}

/// Writes the guest's topology, keys and boot script and makes the media:
/// an ext4 disk image, an NVDIMM backing file the first boot formats, or
/// both.
fn prepare(work: &mut GuestWork, medium: Medium) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("the testbed binary")?;
    let body = format!(
        "# The server's guest: its data on {medium}.\nset -e\n\
         mkdir -p /data\n{}\
         exec {} daemon pmem-server --config {} --server S --data-dir /data/S \
         --persistence {} --secrets {}\n",
        medium.mount(),
        exe.display(),
        work.topology().display(),
        medium.persistence(),
        work.secrets().display(),
    );
    let media = Media {
        disk: medium.has_disk().then_some(DISK_SIZE),
        nvdimm: medium.has_nvdimm().then_some(NVDIMM_SIZE),
    };
    work.prepare(&medium::topology(medium), &body, media)
        .context("prepare the server's guest")?;
    Ok(())
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
                log_tail(console, TAIL_LINES)
            );
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "no ready line from the server on the console:\n{}",
            log_tail(console, TAIL_LINES)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs `plan`: boots, drives, cuts and verifies `plan.cuts` times, then
/// writes `report.json` and `report.md` to `plan.out`.
pub fn run(plan: &PowerCutPlan) -> anyhow::Result<PowerCutReport> {
    let lab = LabNet::enter().context("the RDMA lab")?;
    let mut work = GuestWork::new(&plan.out.join("work"), "guest-server.sh");
    prepare(&mut work, plan.medium)?;
    let client_key = read_key(&work.secrets(), Principal::Client("c"))?;
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
        let console = work.dir().join(format!("console-{boot}.log"));
        let mut guest = Guest::boot(&lab, &work, &console)?;
        let mut link = guest.wait_ready(addr, client_key, &console)?;
        if link.key().is_none() {
            bail!("boot {boot}: the server gives no key for region 0");
        }
        if *first_key.get_or_insert(link.key()) != link.key() {
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
        let stream = link.stream().try_clone()?;
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
                let off = guest::kill_qemu(pid);
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
         | interrupted exactly-once atomics retried | {} |\n\
         | blocks torn by an interrupted write | {} |\n| lost | {} |\n\n\
         | cut | ms of workload | acknowledged | interrupted request |\n|---|---|---|---|\n",
        report
            .medium
            .map_or("medium not recorded".to_owned(), |m| m.to_string()),
        report.cuts,
        report.acknowledged,
        report.blocks_checked,
        report.atomics_checked,
        report.retries_checked,
        report.torn,
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
