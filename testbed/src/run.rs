//! `testbed run`, `demo` and `chaos`: bring a fabric up, run one worker
//! process per client, inject the planned faults, then verify, report and
//! stop everything.

mod outcome;
pub mod replay;

pub use outcome::RunOutcome;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use topology::{Topology, VirtAddr};

use crate::etcd::{Control, EtcdControl};
use crate::lab;
use crate::launch::{DaemonKind, Fabric, LaunchOptions, NetMode};
use crate::report::{FaultRecord, RoceCounters, RunReport, Timeline, Verification, write_report};
use crate::workload::keys::{COUNTER_AREA, KeySpace, counter_word};
use crate::workload::space;
use crate::workload::{CounterTally, STARTED_LINE, WorkerResult, Workload};

/// A fault to inject during a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedFault {
    /// When, from the start of the workload.
    pub at: Duration,
    /// What.
    pub kind: FaultKind,
    /// Which daemon.
    pub target: String,
    /// How long until the target is restarted.
    pub restore_after: Duration,
}

/// The faults the testbed injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// SIGKILL a fabric device, restart it later.
    KillFabric,
    /// SIGKILL a pmem-server, restart it later.
    KillServer,
    /// SIGSTOP a pmem-server past its liveness lease, SIGCONT it once a
    /// copy it holds is out of service (see [`crate::freeze`]).
    FreezeServer,
    /// Take a link down, bring it back later (netns only).
    CutLink,
    /// SIGKILL every daemon, restart them all later.
    RestartAll,
    /// SIGKILL every etcd member (`--control etcd`), restart them later.
    KillEtcd,
    /// SIGKILL the etcd member that leads, restart it later.
    KillEtcdLeader,
    /// Add the server held back from the first map (`add-server` on etcd),
    /// then start it; the devices link to it.
    AddServer,
    /// Add the fabric device held back from the first map (`add-device`),
    /// then start it.
    AddDevice,
    /// Remove a fabric device every client has another path than
    /// (`remove-device`), then stop it.
    RemoveDevice,
}

/// Every daemon kind, devices first: the order faults kill them in.
const ALL_DAEMONS: [DaemonKind; 2] = [DaemonKind::FabricDevice, DaemonKind::PmemServer];

impl FaultKind {
    /// The name reports use.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillFabric => "kill-fabric",
            FaultKind::KillServer => "kill-server",
            FaultKind::FreezeServer => "freeze-server",
            FaultKind::CutLink => "cut-link",
            FaultKind::RestartAll => "restart-all",
            FaultKind::KillEtcd => "kill-etcd",
            FaultKind::KillEtcdLeader => "kill-etcd-leader",
            FaultKind::AddServer => "add-server",
            FaultKind::AddDevice => "add-device",
            FaultKind::RemoveDevice => "remove-device",
        }
    }

    /// Whether it changes the map's membership (not undone later).
    fn changes_membership(self) -> bool {
        matches!(
            self,
            FaultKind::AddServer | FaultKind::AddDevice | FaultKind::RemoveDevice
        )
    }

    /// The daemon kind a fabric must hold back from its first map for it.
    fn held_back(self) -> Option<DaemonKind> {
        match self {
            FaultKind::AddServer => Some(DaemonKind::PmemServer),
            FaultKind::AddDevice => Some(DaemonKind::FabricDevice),
            _ => None,
        }
    }

    /// Whether the application must not see it: another path exists, or
    /// only the control plane is hit and the data path serves on.
    fn invisible(self) -> bool {
        matches!(
            self,
            FaultKind::KillFabric
                | FaultKind::CutLink
                | FaultKind::KillEtcd
                | FaultKind::KillEtcdLeader
                | FaultKind::AddServer
                | FaultKind::AddDevice
                | FaultKind::RemoveDevice
        )
    }

    fn from_name(name: &str) -> Option<Self> {
        [
            FaultKind::KillFabric,
            FaultKind::KillServer,
            FaultKind::FreezeServer,
            FaultKind::CutLink,
            FaultKind::RestartAll,
            FaultKind::KillEtcd,
            FaultKind::KillEtcdLeader,
            FaultKind::AddServer,
            FaultKind::AddDevice,
            FaultKind::RemoveDevice,
        ]
        .into_iter()
        .find(|k| k.name() == name)
    }

    /// Injects the fault; returns when it took effect, and what it hit
    /// when the plan named it only by its role (the etcd leader).
    fn inject(self, fabric: &mut Fabric, target: &str) -> anyhow::Result<(Instant, String)> {
        fn etcd(fabric: &mut Fabric, kind: FaultKind) -> anyhow::Result<&mut EtcdControl> {
            fabric
                .etcd_mut()
                .ok_or_else(|| anyhow::anyhow!("{} needs --control etcd", kind.name()))
        }
        Ok(match self {
            FaultKind::KillEtcd => (etcd(fabric, self)?.kill_all(), target.to_owned()),
            FaultKind::KillEtcdLeader => {
                let (at, leader) = etcd(fabric, self)?.kill_leader()?;
                (at, format!("{target} {leader}"))
            }
            FaultKind::AddServer | FaultKind::AddDevice => {
                let at = Instant::now();
                let change = fabric.admit_held()?;
                (at, format!("{} at epoch {}", change.id, change.epoch))
            }
            FaultKind::RemoveDevice => {
                let device = crate::membership::spare_device(&fabric.topology)?;
                let at = Instant::now();
                let change = fabric.remove_device(&device)?;
                (at, format!("{} at epoch {}", change.id, change.epoch))
            }
            other => (other.inject_daemon(fabric, target)?, target.to_owned()),
        })
    }

    /// Injects a fault on the daemons or links.
    fn inject_daemon(self, fabric: &mut Fabric, target: &str) -> anyhow::Result<Instant> {
        Ok(match self {
            FaultKind::KillFabric => fabric.kill(DaemonKind::FabricDevice, target)?,
            FaultKind::KillServer => fabric.kill(DaemonKind::PmemServer, target)?,
            FaultKind::FreezeServer => crate::freeze::freeze(fabric, target)?,
            FaultKind::CutLink => {
                let at = Instant::now();
                fabric.set_link(target, false)?;
                at
            }
            FaultKind::RestartAll => {
                let at = Instant::now();
                for kind in ALL_DAEMONS {
                    for id in fabric.daemon_ids(kind) {
                        fabric.kill(kind, &id)?;
                    }
                }
                at
            }
            FaultKind::KillEtcd
            | FaultKind::KillEtcdLeader
            | FaultKind::AddServer
            | FaultKind::AddDevice
            | FaultKind::RemoveDevice => Instant::now(),
        })
    }

    /// Undoes the fault.
    fn restore(self, fabric: &mut Fabric, target: &str) -> anyhow::Result<()> {
        match self {
            FaultKind::KillFabric => fabric.restart(DaemonKind::FabricDevice, target)?,
            FaultKind::KillServer => fabric.restart(DaemonKind::PmemServer, target)?,
            FaultKind::FreezeServer => crate::freeze::thaw(fabric, target)?,
            FaultKind::CutLink => fabric.set_link(target, true)?,
            FaultKind::RestartAll => {
                // Servers first, so the devices' links come up at once.
                for kind in ALL_DAEMONS.into_iter().rev() {
                    for id in fabric.daemon_ids(kind) {
                        fabric.restart(kind, &id)?;
                    }
                }
            }
            FaultKind::KillEtcd | FaultKind::KillEtcdLeader => {
                if let Some(etcd) = fabric.etcd_mut() {
                    etcd.restart_killed()?;
                }
            }
            // A membership change stays: the map moved on.
            FaultKind::AddServer | FaultKind::AddDevice | FaultKind::RemoveDevice => {}
        }
        Ok(())
    }
}

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// `run`, `demo` or `chaos`, for the report.
    pub command: String,
    /// The workload.
    pub workload: Workload,
    /// Zipfian keys.
    pub zipfian: bool,
    /// How many of the topology's clients run a worker (all when `None`).
    pub clients: Option<usize>,
    /// How long the workload runs.
    pub duration: Duration,
    /// Value size in bytes.
    pub size: u64,
    /// Operations in flight per client.
    pub depth: usize,
    /// Keys per client.
    pub keys: u64,
    /// Seed of the workload.
    pub seed: u64,
    /// Loopback or netns.
    pub net: NetMode,
    /// The topology file given on the command line (`None`: the embedded
    /// one for `net`), for the replay command line.
    pub topology_file: Option<PathBuf>,
    /// The chaos scenario `faults` were drawn from, for the report.
    pub scenario: Option<Scenario>,
    /// Region files go here (when `None`, a folder inside the report,
    /// removed after a run that passed and kept after one that failed).
    pub data_dir: Option<PathBuf>,
    /// Reports go to `reports/<run-id>/`.
    pub reports: PathBuf,
    /// Faults to inject.
    pub faults: Vec<PlannedFault>,
    /// Where the daemons take their map from (file, or a real etcd).
    pub control: Control,
    /// Show a progress bar.
    pub progress: bool,
    /// Whether the workers' writes ask the servers to bypass their CPU
    /// cache.
    pub server_cache: client_vmm::ServerCache,
    /// `--replicas`: the copies of every region the run set in the
    /// topology's `[pool]`, for the replay command line.
    pub replicas: Option<u64>,
}

impl RunOptions {
    /// Options for `workload` with the testbed's defaults.
    pub fn new(command: &str, workload: Workload) -> Self {
        Self {
            command: command.to_owned(),
            workload,
            zipfian: false,
            clients: None,
            duration: Duration::from_secs(10),
            size: 256,
            depth: 8,
            keys: 4096,
            seed: 42,
            net: NetMode::Loopback,
            topology_file: None,
            scenario: None,
            data_dir: None,
            reports: PathBuf::from("reports"),
            faults: Vec::new(),
            control: Control::File,
            progress: true,
            server_cache: client_vmm::ServerCache::Auto,
            replicas: None,
        }
    }
}

/// The chaos scenarios.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// SIGKILL fabric devices and restart them.
    KillFabric,
    /// SIGKILL pmem-servers and restart them.
    KillServer,
    /// SIGSTOP pmem-servers past their liveness lease, then SIGCONT them.
    FreezeServer,
    /// Take client RNIC links and device-to-server links down and up
    /// (netns only).
    CutLink,
    /// Kill every daemon and restart them all.
    RestartAll,
    /// Kill every etcd member under the workload and restart them
    /// (`--control etcd`).
    KillEtcd,
    /// Kill the etcd member that leads and restart it (`--control etcd
    /// --etcd-members 3`).
    KillEtcdLeader,
    /// Start with the last server held back from the map, add it under the
    /// workload (`--control etcd`).
    AddServer,
    /// Start with a fabric device held back from the map, add it under the
    /// workload (`--control etcd`).
    AddDevice,
    /// Remove a fabric device every client has another path than, under
    /// the workload (`--control etcd`).
    RemoveDevice,
}

impl Scenario {
    /// Whether the scenario can run on a fabric with `control`; why not
    /// otherwise.
    pub fn check_control(self, control: Control) -> Result<(), String> {
        match (self, control) {
            (
                Scenario::KillEtcd
                | Scenario::KillEtcdLeader
                | Scenario::AddServer
                | Scenario::AddDevice
                | Scenario::RemoveDevice,
                Control::File,
            ) => Err(format!("--scenario {} needs --control etcd", self.name())),
            (Scenario::KillEtcdLeader, Control::Etcd { members }) if members < 3 => Err(format!(
                "--scenario kill-etcd-leader needs --etcd-members 3 or more (with {members}, \
                 killing the leader takes etcd down: that is kill-etcd)"
            )),
            _ => Ok(()),
        }
    }
}

impl std::str::FromStr for Scenario {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "kill-fabric" => Ok(Scenario::KillFabric),
            "kill-server" => Ok(Scenario::KillServer),
            "freeze-server" => Ok(Scenario::FreezeServer),
            "cut-link" => Ok(Scenario::CutLink),
            "restart-all" => Ok(Scenario::RestartAll),
            "kill-etcd" => Ok(Scenario::KillEtcd),
            "kill-etcd-leader" => Ok(Scenario::KillEtcdLeader),
            "add-server" => Ok(Scenario::AddServer),
            "add-device" => Ok(Scenario::AddDevice),
            "remove-device" => Ok(Scenario::RemoveDevice),
            other => Err(format!(
                "unknown scenario {other:?} (kill-fabric, kill-server, freeze-server, cut-link, \
                 restart-all, \
                 kill-etcd, kill-etcd-leader, add-server, add-device, remove-device)"
            )),
        }
    }
}

/// `count` faults of `scenario` at seeded random times in the middle of a
/// run of `duration`, each target restarted after a tenth of the run (etcd
/// after three tenths). A membership scenario changes the map once,
/// whatever `count` says: one daemon is held back, and removing a second
/// device could leave a client without a path.
pub fn plan_faults(
    topology: &Topology,
    net: NetMode,
    scenario: Scenario,
    duration: Duration,
    count: usize,
    seed: u64,
) -> Vec<PlannedFault> {
    let mut rng = crate::workload::keys::Rng::new(seed);
    let (kind, targets): (FaultKind, Vec<String>) = match scenario {
        Scenario::KillFabric => (
            FaultKind::KillFabric,
            topology
                .fabric_devices
                .iter()
                .map(|d| d.id.to_string())
                .collect(),
        ),
        Scenario::KillServer => (
            FaultKind::KillServer,
            topology.servers.iter().map(|s| s.id.to_string()).collect(),
        ),
        Scenario::FreezeServer => (
            FaultKind::FreezeServer,
            topology.servers.iter().map(|s| s.id.to_string()).collect(),
        ),
        Scenario::CutLink => {
            let rnics = topology
                .clients
                .iter()
                .flat_map(|c| c.rnics.iter().map(move |r| format!("{}/{}", c.id, r.id)));
            let server_links = topology.fabric_devices.iter().flat_map(|d| {
                d.links
                    .iter()
                    .map(move |l| format!("{}>{}/{}", d.id, l.server, l.nic))
            });
            // In the lab only the RNICs' RoCE side can be cut: the device
            // links are on the namespace's loopback.
            let targets = match net {
                NetMode::Lab => rnics.collect(),
                _ => rnics.chain(server_links).collect(),
            };
            (FaultKind::CutLink, targets)
        }
        Scenario::RestartAll => (FaultKind::RestartAll, vec!["all".to_owned()]),
        Scenario::KillEtcd => (FaultKind::KillEtcd, vec!["etcd".to_owned()]),
        Scenario::KillEtcdLeader => (FaultKind::KillEtcdLeader, vec!["leader".to_owned()]),
        Scenario::AddServer => (FaultKind::AddServer, vec!["held".to_owned()]),
        Scenario::AddDevice => (FaultKind::AddDevice, vec!["held".to_owned()]),
        Scenario::RemoveDevice => (FaultKind::RemoveDevice, vec!["spare".to_owned()]),
    };
    let count = if kind.changes_membership() {
        count.min(1)
    } else {
        count
    };
    // etcd stays down longer: the workload must run on through the outage.
    let share = match kind {
        FaultKind::KillEtcd | FaultKind::KillEtcdLeader => 0.3,
        _ => 0.1,
    };
    let least = match kind {
        // A frozen server stays frozen past its liveness lease.
        FaultKind::FreezeServer => crate::freeze::least_freeze(),
        _ => Duration::from_millis(500),
    };
    let restore_after = duration.mul_f64(share).max(least);
    let window = duration.mul_f64(0.6);
    (0..count)
        .map(|i| {
            let slot = window.mul_f64(1.0 / count.max(1) as f64);
            let at =
                duration.mul_f64(0.2) + slot.mul_f64(i as f64) + slot.mul_f64(rng.unit() * 0.5);
            PlannedFault {
                at,
                kind,
                target: targets[rng.below(targets.len() as u64) as usize].clone(),
                restore_after,
            }
        })
        .collect()
}

/// Where a run broke the fabric's contract: faults of a fabric device must
/// be invisible to the application (another path exists), a read must see
/// a version that was written (a mix of two only while a write of its key
/// overlapped it), and nothing acknowledged may be lost (the final
/// verification).
pub fn contract_violations(report: &RunReport) -> Vec<String> {
    let mut violations = Vec::new();
    for fault in &report.faults {
        let kind = FaultKind::from_name(&fault.kind);
        if kind.is_some_and(FaultKind::invisible) && fault.errors_seen > 0 {
            let why = match kind {
                Some(FaultKind::KillEtcd | FaultKind::KillEtcdLeader) => {
                    "although only the control plane was down"
                }
                _ => "although another path existed",
            };
            violations.push(format!(
                "{} {} at {:.2} s: the application saw {} errors {why}",
                fault.kind, fault.target, fault.at_s, fault.errors_seen
            ));
        }
    }
    if let Some(check) = &report.linearizability
        && !check.passed
    {
        violations.push(format!("linearizability {}", check.summary()));
    }
    let v = &report.verification;
    if !v.during_run.is_empty() {
        violations.push(format!(
            "during the run, {} found a value no write explains (reads with no write of \
             their key overlapping them, compare-and-swaps on a worker's own words)",
            plural(v.during_run_count(), "check", "checks")
        ));
    }
    if !v.mismatches.is_empty() {
        violations.push(format!(
            "the final verification found {} with acknowledged data (missing, wrong or not \
             checked)",
            plural(v.mismatch_count(), "problem", "problems")
        ));
    } else if !v.passed && v.during_run.is_empty() {
        violations.push("the verification failed".to_owned());
    }
    if let Some(replicas) = &report.replicas {
        for line in &replicas.differences {
            violations.push(format!("replicas diverged: {line}"));
        }
    }
    violations
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Width of the timeline buckets: fine enough to time a failover.
const BUCKET_MS: u64 = 1;

/// A run id: UTC date and time, the command, and the process id.
pub fn run_id(command: &str) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}-{command}-{}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        std::process::id()
    )
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// One worker process and its live counters.
struct WorkerProcess {
    client: String,
    child: Child,
    out: PathBuf,
    ops: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    /// The worker printed [`STARTED_LINE`].
    started: Arc<AtomicBool>,
    /// The map epoch its pool runs, as it last said (0: a file, or not
    /// said yet).
    epoch: Arc<AtomicU64>,
    /// When it first had a request served by a region a new epoch brought
    /// (Unix milliseconds; 0: not yet).
    first_use: Arc<AtomicU64>,
}

impl WorkerProcess {
    /// Its workload began, or it ended (and never will begin).
    fn started_or_ended(&mut self) -> bool {
        self.started.load(Ordering::Relaxed) || matches!(self.child.try_wait(), Ok(Some(_)))
    }
}

/// Runs a whole workload against a fresh fabric of `topology`. A run that
/// fails keeps its region files; one that stops with an error says where
/// its logs and region files are.
pub fn execute(
    topology: &Topology,
    topology_name: &str,
    options: &RunOptions,
) -> anyhow::Result<RunOutcome> {
    check_clients(topology, topology_name, options.clients)?;
    let run_id = run_id(&options.command);
    // Absolute: a lab guest sees this folder at the same path.
    let run_dir =
        std::path::absolute(options.reports.join(&run_id)).context("where the reports go")?;
    std::fs::create_dir_all(run_dir.join("workers"))
        .with_context(|| format!("create {}", run_dir.display()))?;
    let data_dir = match &options.data_dir {
        Some(dir) => dir.clone(),
        None => run_dir.join("data"),
    };
    execute_in(
        topology,
        topology_name,
        options,
        &run_id,
        &run_dir,
        &data_dir,
    )
    .with_context(|| {
        format!(
            "run {run_id} stopped; its logs are in {}, its region files in {}",
            run_dir.join("logs").display(),
            data_dir.display()
        )
    })
}

/// Refuses a `--clients` the topology cannot give: none, or more than it
/// has.
fn check_clients(
    topology: &Topology,
    topology_name: &str,
    wanted: Option<usize>,
) -> anyhow::Result<()> {
    let have = topology.clients.len();
    match wanted {
        Some(0) => bail!("--clients 0: a run needs at least one client"),
        Some(n) if n > have => {
            let ids: Vec<String> = topology.clients.iter().map(|c| c.id.to_string()).collect();
            bail!(
                "--clients {n}: {topology_name} has {have} client(s) ({}); ask for at most \
                 {have}, or add [[clients]] to the topology",
                ids.join(", ")
            )
        }
        _ => Ok(()),
    }
}

/// [`execute`] with the run's id and folders made.
fn execute_in(
    topology: &Topology,
    topology_name: &str,
    options: &RunOptions,
    run_id: &str,
    run_dir: &Path,
    data_dir: &Path,
) -> anyhow::Result<RunOutcome> {
    let mut launch = LaunchOptions::new(data_dir.to_path_buf(), run_dir.to_path_buf())?;
    // Fresh keys in the report's folder: every connection proves its key.
    launch.net = options.net;
    launch.control = options.control;
    launch.hold_back = options.faults.iter().find_map(|f| f.kind.held_back());
    let mut fabric = match Fabric::start(topology, launch) {
        Ok(fabric) => fabric,
        Err(err) => {
            return Err(crate::advice::start_error(
                err,
                crate::advice::Starter::Run,
                data_dir,
            ));
        }
    };
    let endpoints = fabric.endpoints();
    println!("{}", crate::summary::live_metrics(&endpoints));
    let clients: Vec<String> = topology
        .clients
        .iter()
        .take(options.clients.unwrap_or(usize::MAX))
        .map(|c| c.id.to_string())
        .collect();
    if clients.is_empty() {
        bail!("{topology_name}: no clients to run a workload");
    }
    // On an allocator pool the keys live in a named object made here, once.
    // The counters may hold what an earlier run on the same data left: the
    // check counts from what they hold now.
    let need = KeySpace::bytes_needed(clients.len(), options.size, options.keys);
    let (space, counters_before) = fabric
        .as_client(&clients[0], |pool| async move {
            let space = space::prepare(&pool, need).await?;
            let before = pool
                .read(VirtAddr(space.base), COUNTER_AREA)
                .await
                .map_err(|e| format!("read the counters: {}", client_vmm::error_chain(&e)))?;
            Ok((space, counter_values(&before)))
        })
        .map_err(|why| anyhow::anyhow!("{topology_name}: where the keys live: {why}"))?;
    if options.workload == Workload::Register {
        let dir = run_dir.join("workers");
        crate::workload::register::setup_on(&fabric, &clients[0], space, options.keys, &dir)
            .map_err(|why| anyhow::anyhow!("{topology_name}: the hot words: {why}"))?;
    }

    let started_unix_ms = unix_ms();
    let start = Instant::now();
    let mut workers = Vec::new();
    for (index, client) in clients.iter().enumerate() {
        workers.push(spawn_worker(
            &fabric,
            run_dir,
            options,
            client,
            index,
            clients.len(),
            started_unix_ms,
        )?);
    }
    let mut epochs = crate::epochs::EpochSampler::new();
    let faults = drive(&mut fabric, &mut workers, options, start, &mut epochs)?;
    let duration_s = start.elapsed().as_secs_f64();

    let mut report = RunReport {
        run_id: run_id.to_owned(),
        command: options.command.clone(),
        topology: topology_name.to_owned(),
        workload: options.workload.name().to_owned(),
        clients: clients.clone(),
        started_unix_ms,
        duration_s,
        ops: BTreeMap::new(),
        timeline: Timeline::new(BUCKET_MS),
        faults,
        verification: Verification::default(),
        notes: Vec::new(),
        roce: None,
        parameters: replay::parameters(options),
        replay: replay::command_line(&replay::program_name(), options),
        data_dir: data_dir.display().to_string(),
        data_kept: true,
        map_epochs: epochs.finish(),
        linearizability: None,
        replicas: None,
    };
    report.notes.extend(first_use_notes(&fabric, &workers));
    let (counters, mut verification) = collect(&mut workers, run_dir, &mut report)?;
    check_counters(
        &fabric,
        &clients[0],
        (space.base, &counters_before),
        &counters,
        &mut verification,
    );
    verification.passed = verification.is_clean();
    report.verification = verification;
    if options.workload == Workload::Register {
        report.linearizability = Some(crate::linearizability::check_run(
            &run_dir.join("workers"),
            crate::linearizability::DEFAULT_BUDGET,
        ));
    }
    note_fault_effects(&mut report, duration_s);
    if fabric.is_lab() {
        let roce = lab_counters(&fabric, &clients);
        report.notes.extend(lab_notes(&roce));
        report.roce = Some(roce);
    }

    // Which copies serve, as the map says at the end (on a file: all).
    let records = match fabric.etcd_mut() {
        Some(etcd) if topology.is_replicated() => match etcd.replica_sets() {
            Ok(records) => Some(records),
            Err(e) => {
                report.notes.push(format!(
                    "the copies' states could not be read from etcd ({e}); every copy is \
                     compared"
                ));
                None
            }
        },
        _ => None,
    };
    let unclean_exits: Vec<String> = fabric
        .stop()
        .into_iter()
        .filter(|(_, _, status)| !status.is_some_and(|s| s.success()))
        .map(|(kind, id, status)| format!("{} {id}: {status:?}", kind.program()))
        .collect();
    for line in &unclean_exits {
        report.notes.push(format!("did not stop cleanly: {line}"));
    }
    // The daemons have stopped: the region files hold what they wrote.
    if topology.is_replicated() {
        let missed = servers_that_missed_writes(options, &report.faults);
        if !missed.is_empty() {
            report.notes.push(format!(
                "the copies on server {} are not compared: on a topology file nothing records \
                 that they missed writes while their server was down or frozen; their owners \
                 stopped using them, and nothing brings them up to date yet (resync)",
                missed.join(", ")
            ));
        }
        let serving = |region: &str, server: &str| {
            !missed.iter().any(|m| m == server)
                && records.as_ref().is_none_or(|records| {
                    records
                        .iter()
                        .find(|r| r.region == region)
                        .and_then(|r| r.state_on(server))
                        .is_none_or(|state| state == control::ReplicaState::Serving)
                })
        };
        report.replicas = Some(crate::replica_copies::compare_copies(
            topology, data_dir, &serving,
        ));
    }
    let violations = contract_violations(&report);
    for line in &violations {
        report.notes.push(format!("contract violated: {line}"));
    }
    // A failed run keeps its region files to be looked at.
    let failed = !violations.is_empty() || !unclean_exits.is_empty();
    if options.data_dir.is_none() && !failed {
        report.data_kept = std::fs::remove_dir_all(data_dir).is_err();
    }
    let files = write_report(run_dir, &report).context("write the report")?;
    Ok(RunOutcome {
        report,
        files,
        endpoints,
        unclean_exits,
    })
}

/// On a topology file, the servers a run killed or froze: their copies
/// missed writes (their owners stopped using them when a link broke or a
/// request went unanswered) and no map says so. None on etcd, whose map
/// records which copies serve.
fn servers_that_missed_writes(options: &RunOptions, faults: &[FaultRecord]) -> Vec<String> {
    if options.control != Control::File {
        return Vec::new();
    }
    let mut servers: Vec<String> = faults
        .iter()
        .filter(|f| {
            matches!(
                FaultKind::from_name(&f.kind),
                Some(FaultKind::KillServer | FaultKind::FreezeServer)
            )
        })
        .map(|f| f.target.clone())
        .collect();
    servers.sort();
    servers.dedup();
    servers
}

/// Runs the workers to their end while injecting the planned faults at
/// their times into the workload (counted from when every worker's workload
/// began) and undoing each after its restore delay; shows progress. Returns
/// what was injected, and when (counted from `start`, like the timeline).
/// On etcd, `epochs` samples every daemon's map epoch meanwhile.
fn drive(
    fabric: &mut Fabric,
    workers: &mut [WorkerProcess],
    options: &RunOptions,
    start: Instant,
    epochs: &mut crate::epochs::EpochSampler,
) -> anyhow::Result<Vec<FaultRecord>> {
    let bar = progress_bar(options);
    let mut faults: Vec<FaultRecord> = Vec::new();
    let mut pending: Vec<&PlannedFault> = options.faults.iter().collect();
    let mut restores: Vec<(Instant, usize)> = Vec::new();
    let limit = options.duration + Duration::from_secs(120) + crate::workload::VERIFY_PATIENCE;
    // When every worker's workload began (a lab guest boots first).
    let mut began: Option<Duration> = None;
    loop {
        if options.control != Control::File {
            epochs.sample(fabric, start);
            for worker in workers.iter() {
                let epoch = worker.epoch.load(Ordering::Relaxed);
                if epoch > 0 {
                    epochs.note(&format!("worker {}", worker.client), epoch, start);
                }
            }
        }
        let elapsed = start.elapsed();
        if began.is_none() && workers.iter_mut().all(WorkerProcess::started_or_ended) {
            began = Some(elapsed);
        }
        let ops: u64 = workers.iter().map(|w| w.ops.load(Ordering::Relaxed)).sum();
        let errors: u64 = workers
            .iter()
            .map(|w| w.errors.load(Ordering::Relaxed))
            .sum();
        bar.set_position(elapsed.as_millis().min(options.duration.as_millis()) as u64);
        bar.set_message(format!(
            "{:>9.0} ops/s  {ops} ops  {errors} errors",
            ops as f64 / elapsed.as_secs_f64().max(0.001)
        ));
        while let Some(i) = pending
            .iter()
            .position(|f| began.is_some_and(|began| began + f.at <= elapsed))
        {
            let fault = pending.remove(i);
            let (at, target) = fault
                .kind
                .inject(fabric, &fault.target)
                .with_context(|| format!("{} {}", fault.kind.name(), fault.target))?;
            bar.println(format!(
                "  {:>6.2}s  {} {target}",
                at.duration_since(start).as_secs_f64(),
                fault.kind.name(),
            ));
            restores.push((at + fault.restore_after, faults.len()));
            faults.push(FaultRecord {
                at_s: at.duration_since(start).as_secs_f64(),
                kind: fault.kind.name().to_owned(),
                target,
                restored_at_s: None,
                recovery_ms: None,
                stall_ms: None,
                errors_seen: 0,
            });
        }
        while let Some(i) = restores
            .iter()
            .position(|(when, _)| *when <= Instant::now())
        {
            let (_, record) = restores.remove(i);
            let fault = &mut faults[record];
            if let Some(kind) = FaultKind::from_name(&fault.kind) {
                kind.restore(fabric, &fault.target)
                    .with_context(|| format!("undo {} {}", fault.kind, fault.target))?;
            }
            fault.restored_at_s = Some(start.elapsed().as_secs_f64());
            let done = match FaultKind::from_name(&fault.kind) {
                Some(kind) if kind.changes_membership() => "settled",
                _ => "restarted",
            };
            bar.println(format!(
                "  {:>6.2}s  {done} {}",
                start.elapsed().as_secs_f64(),
                fault.target
            ));
        }
        let all_done = workers
            .iter_mut()
            .all(|w| matches!(w.child.try_wait(), Ok(Some(_))));
        if all_done && pending.is_empty() && restores.is_empty() {
            break;
        }
        if elapsed > limit {
            bar.abandon();
            for w in workers.iter_mut() {
                let _ = w.child.kill();
            }
            bail!("workers did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if options.control != Control::File {
        epochs.sample_now(fabric, start);
    }
    bar.finish_and_clear();
    Ok(faults)
}

/// Waits for every worker and merges its result into `report`: operation
/// statistics, the timeline, the counters' tallies and what its
/// verification found (a worker that left no result is a mismatch).
fn collect(
    workers: &mut [WorkerProcess],
    run_dir: &Path,
    report: &mut RunReport,
) -> anyhow::Result<(BTreeMap<u64, CounterTally>, Verification)> {
    let mut counters: BTreeMap<u64, CounterTally> = BTreeMap::new();
    let mut verification = Verification::default();
    for worker in workers.iter_mut() {
        let status = worker.child.wait().context("wait for a worker")?;
        let text = std::fs::read_to_string(&worker.out);
        let result: WorkerResult = match text.map(|t| serde_json::from_str(&t)) {
            Ok(Ok(result)) => result,
            _ => {
                verification.push_mismatch(format!(
                    "worker {} ({status}) left no result; see {}",
                    worker.client,
                    run_dir
                        .join("logs")
                        .join(format!("worker-{}.log", worker.client))
                        .display()
                ));
                continue;
            }
        };
        report.merge_ops(&result.ops);
        report.timeline.merge(&result.timeline);
        for (w, tally) in &result.counters {
            let total = counters.entry(*w).or_default();
            total.acked += tally.acked;
            total.uncertain += tally.uncertain;
        }
        verification.merge(&result.verification, &format!("{}: ", result.client));
    }
    Ok((counters, verification))
}

/// For each fault: the errors the application saw from its injection to a
/// second after its undoing, its recovery and longest stall, and a note
/// saying so in the report's words.
fn note_fault_effects(report: &mut RunReport, duration_s: f64) {
    for fault in &mut report.faults {
        let from = fault.at_s;
        let to = fault.restored_at_s.unwrap_or(duration_s) + 1.0;
        let first = (from * 1000.0 / BUCKET_MS as f64) as usize;
        let last = (to * 1000.0 / BUCKET_MS as f64) as usize;
        fault.errors_seen = (first..last).map(|i| report.timeline.errors_at(i)).sum();
    }
    report.note_faults();
}

/// The RoCE counters of a lab run: each device's, scraped now, and each
/// guest's, from its console.
fn lab_counters(fabric: &Fabric, clients: &[String]) -> RoceCounters {
    let mut roce = RoceCounters::default();
    for device in &fabric.topology.fabric_devices {
        let id = device.id.to_string();
        let Ok(admin) = fabric.admin(DaemonKind::FabricDevice, &id) else {
            continue;
        };
        if let Ok((_, text)) = telemetry::http_get(admin, "/metrics", Duration::from_secs(5)) {
            let mut counters = lab::device_roce_counters(&text);
            counters.extend(lab::device_server_counters(&text));
            roce.devices.insert(id, counters);
        }
    }
    for server in &fabric.topology.servers {
        let id = server.id.to_string();
        if crate::guest_server::guest_address(server).is_none() {
            continue;
        }
        let Ok(admin) = fabric.admin(DaemonKind::PmemServer, &id) else {
            continue;
        };
        if let Ok((_, text)) = telemetry::http_get(admin, "/metrics", Duration::from_secs(5)) {
            roce.servers.insert(id, lab::server_counters(&text));
        }
    }
    for client in clients {
        let console = std::fs::read_to_string(fabric.guest_console(client)).unwrap_or_default();
        roce.guests
            .insert(client.clone(), lab::guest_counters(&console));
    }
    roce
}

/// One line per device and guest for the summary.
fn lab_notes(roce: &RoceCounters) -> Vec<String> {
    let get = |m: &BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
    let mut notes = Vec::new();
    for (device, c) in &roce.devices {
        notes.push(format!(
            "RoCE at {device}: {} packets in, {} out, {} retransmissions, {} duplicates, \
             {} NAKs sent, {} ICRC errors",
            get(c, "packets_received"),
            get(c, "packets_sent"),
            get(c, "retransmissions"),
            get(c, "duplicates"),
            get(c, "naks_sent"),
            get(c, "icrc_errors"),
        ));
    }
    for (device, c) in &roce.devices {
        if c.contains_key("server_requests_rdma") {
            notes.push(format!(
                "{device} to servers on verbs: {} requests as RDMA work requests, {} on the \
                 servers' TCP connections, {} queue pairs broke",
                get(c, "server_requests_rdma"),
                get(c, "server_requests_control"),
                get(c, "server_qps_broken"),
            ));
        }
    }
    for (server, c) in &roce.servers {
        notes.push(format!(
            "server {server} (in its guest): executed {} requests itself, {} µs of CPU, {} \
             queue pairs open",
            get(c, "operations"),
            get(c, "cpu_us"),
            get(c, "queue_pairs"),
        ));
    }
    for (client, c) in &roce.guests {
        let shown: Vec<String> = c
            .iter()
            .filter(|(_, v)| **v > 0)
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        notes.push(format!(
            "guest {client} rxe0: {} (others 0)",
            if shown.is_empty() {
                "all counters 0".to_owned()
            } else {
                shown.join(", ")
            }
        ));
    }
    notes
}

fn progress_bar(options: &RunOptions) -> ProgressBar {
    if !options.progress {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(options.duration.as_millis() as u64);
    let style = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}

/// Where worker `client` takes its map from: on `--control etcd` the
/// pool in etcd, as the client's own etcd user on endpoints it reaches
/// (with `--net netns`, over its management link), so it follows the map
/// as a real client does (`add-server`, `add-device`, `remove-device`);
/// otherwise the topology file of the run.
fn worker_map_source(fabric: &Fabric, client: &str) -> Vec<std::ffi::OsString> {
    match fabric.etcd() {
        Some(etcd) => etcd.client_args(client),
        None => vec!["--config".into(), fabric.topology_path.clone().into()],
    }
}

/// Starts `testbed worker` for `client`.
fn spawn_worker(
    fabric: &Fabric,
    run_dir: &Path,
    options: &RunOptions,
    client: &str,
    index: usize,
    clients: usize,
    start_unix_ms: u64,
) -> anyhow::Result<WorkerProcess> {
    let program = std::env::current_exe().context("find the testbed executable")?;
    let out = run_dir.join("workers").join(format!("{client}.json"));
    let log = run_dir.join("logs").join(format!("worker-{client}.log"));
    let log_file =
        std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
    let mut command = fabric.client_command(client, &program, &[run_dir]);
    // The command line alone says where the map comes from.
    command
        .env_remove(client_vmm::pool::ETCD_ENV)
        .env_remove(control::CREDENTIALS_ENV)
        .arg("worker")
        .args(worker_map_source(fabric, client))
        .args([
            "--client",
            client,
            "--index",
            &index.to_string(),
            "--clients",
            &clients.to_string(),
        ])
        .args(["--workload", options.workload.name()])
        .args(["--server-cache", options.server_cache.name()])
        .args(["--duration-ms", &options.duration.as_millis().to_string()])
        .args([
            "--size",
            &options.size.to_string(),
            "--depth",
            &options.depth.to_string(),
        ])
        .args([
            "--keys",
            &options.keys.to_string(),
            "--seed",
            &(options.seed + index as u64).to_string(),
        ])
        .args([
            "--start-unix-ms",
            &start_unix_ms.to_string(),
            "--bucket-ms",
            &BUCKET_MS.to_string(),
        ])
        .arg("--out")
        .arg(&out);
    if options.zipfian {
        command.arg("--zipfian");
    }
    // A data directory given by the user may hold an earlier run's keys.
    if options.data_dir.is_some() {
        command.arg("--clear");
    }
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log_file))
        .spawn()
        .context("start a worker")?;
    let (ops, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let started = Arc::new(AtomicBool::new(false));
    let (epoch, first_use) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    if let Some(stdout) = child.stdout.take() {
        let (ops, errors, started) = (Arc::clone(&ops), Arc::clone(&errors), Arc::clone(&started));
        let (epoch, first_use) = (Arc::clone(&epoch), Arc::clone(&first_use));
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.trim() == STARTED_LINE {
                    started.store(true, Ordering::Relaxed);
                }
                for field in line.split_whitespace() {
                    let (counter, n) = match field.split_once('=') {
                        Some(("ops", n)) => (&ops, n),
                        Some(("errors", n)) => (&errors, n),
                        Some(("epoch", n)) => (&epoch, n),
                        // The first new region served is the one measured.
                        Some(("first_use_unix_ms", n)) => {
                            let at = n.parse().unwrap_or(0);
                            let _ = first_use.compare_exchange(
                                0,
                                at,
                                Ordering::Relaxed,
                                Ordering::Relaxed,
                            );
                            continue;
                        }
                        _ => continue,
                    };
                    counter.store(n.parse().unwrap_or(0), Ordering::Relaxed);
                }
            }
        });
    }
    Ok(WorkerProcess {
        client: client.to_owned(),
        child,
        out,
        ops,
        errors,
        started,
        epoch,
        first_use,
    })
}

/// For each server added under the run: how long after the change was
/// committed in etcd each running worker first had a request served by a
/// region it brought (`map change → first use`), or that it had none.
fn first_use_notes(fabric: &Fabric, workers: &[WorkerProcess]) -> Vec<String> {
    let added = fabric
        .map_changes()
        .iter()
        .filter(|c| c.added && fabric.topology.server(&c.id.as_str().into()).is_some());
    added
        .map(|change| {
            let seen: Vec<String> = workers
                .iter()
                .map(|w| match w.first_use.load(Ordering::Relaxed) {
                    0 => format!("{} none", w.client),
                    at => format!(
                        "{} {} ms",
                        w.client,
                        at.saturating_sub(change.committed_unix_ms)
                    ),
                })
                .collect();
            format!(
                "map change → first use: server {} added at epoch {}; from the change \
                 committed in etcd to the first request a running worker had served by its \
                 regions: {} (the testbed started the server after the change; it was ready \
                 and every device linked to it {} ms after the change)",
                change.id,
                change.epoch,
                seen.join(", "),
                change
                    .settled_unix_ms
                    .saturating_sub(change.committed_unix_ms)
            )
        })
        .collect()
}

/// The counter words in `bytes` (little-endian `u64`s).
fn counter_values(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
        .collect()
}

/// Compares how much every shared counter word (of the space at `base`)
/// grew since `before` with the increments the workers saw acknowledged
/// (plus those that failed visibly and may have applied).
fn check_counters(
    fabric: &Fabric,
    client: &str,
    (base, before): (u64, &[u64]),
    counters: &BTreeMap<u64, CounterTally>,
    verification: &mut Verification,
) {
    if counters.is_empty() {
        return;
    }
    let words: Vec<(u64, CounterTally)> = counters.iter().map(|(w, t)| (*w, *t)).collect();
    let values = fabric.as_client(client, |pool| async move {
        let mut out = Vec::new();
        for (w, tally) in words {
            let value = pool
                .fetch_add(counter_word(base, w), 0)
                .await
                .map_err(|e| client_vmm::error_chain(&e))?;
            out.push((w, tally, value));
        }
        Ok(out)
    });
    match values {
        Err(why) => verification.push_mismatch(format!("cannot read the counters: {why}")),
        Ok(values) => {
            for (w, tally, value) in values {
                verification.counters_checked += 1;
                let start = before.get(w as usize).copied().unwrap_or(0);
                let grew = value.wrapping_sub(start);
                if grew < tally.acked || grew > tally.acked + tally.uncertain {
                    verification.push_mismatch(format!(
                        "counter {w}: grew by {grew} (from {start} to {value}), but {} increments \
                         were acknowledged ({} uncertain)",
                        tally.acked, tally.uncertain
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report_with(verification: Verification) -> RunReport {
        RunReport {
            verification,
            ..RunReport::default()
        }
    }

    #[test]
    fn a_read_during_the_run_is_not_reported_as_lost_acknowledged_data() {
        let mut v = Verification::default();
        v.push_during_run("c1: read of key 905 during the run saw bytes no write of it produced");
        let violations = contract_violations(&report_with(v));
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(
            violations[0].starts_with("during the run, 1 check "),
            "{violations:?}"
        );
        assert!(!violations[0].contains("acknowledged"), "{violations:?}");
    }

    #[test]
    fn an_etcd_fault_the_application_saw_breaks_the_contract_a_server_fault_does_not() {
        let fault = |kind: &str, errors_seen| FaultRecord {
            at_s: 1.0,
            kind: kind.to_owned(),
            target: "etcd".to_owned(),
            restored_at_s: Some(2.0),
            recovery_ms: None,
            stall_ms: None,
            errors_seen,
        };
        let report = RunReport {
            faults: vec![
                fault("kill-etcd", 3),
                fault("kill-etcd-leader", 0),
                fault("kill-server", 5),
            ],
            verification: Verification {
                passed: true,
                ..Verification::default()
            },
            ..RunReport::default()
        };
        assert_eq!(
            contract_violations(&report),
            [
                "kill-etcd etcd at 1.00 s: the application saw 3 errors although only the control \
              plane was down"
            ]
        );
    }

    #[test]
    fn etcd_scenarios_need_etcd_and_the_leader_one_three_members() {
        let etcd = |members| Control::Etcd { members };
        assert!(Scenario::KillEtcd.check_control(Control::File).is_err());
        assert!(Scenario::KillEtcd.check_control(etcd(1)).is_ok());
        let err = Scenario::KillEtcdLeader
            .check_control(etcd(1))
            .expect_err("one member");
        assert!(err.contains("--etcd-members 3"), "{err}");
        assert!(Scenario::KillEtcdLeader.check_control(etcd(3)).is_ok());
        assert!(Scenario::KillServer.check_control(Control::File).is_ok());
        assert_eq!("kill-etcd-leader".parse(), Ok(Scenario::KillEtcdLeader));
    }

    #[test]
    fn a_mismatch_at_the_end_is_reported_as_acknowledged_data() {
        let mut v = Verification::default();
        v.push_mismatch("c1: key 3: acknowledged version 2 but found Version(1)");
        v.push_mismatch("c1: key 4: acknowledged version 2 but found Garbage");
        let violations = contract_violations(&report_with(v));
        assert_eq!(
            violations,
            [
                "the final verification found 2 problems with acknowledged data (missing, wrong \
              or not checked)"
            ]
        );
        let clean = Verification {
            passed: true,
            reads_overlapped: 5,
            reads_torn_by_overlap: 5,
            ..Verification::default()
        };
        assert!(contract_violations(&report_with(clean)).is_empty());
    }
}
