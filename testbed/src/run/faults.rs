//! The faults a run injects: what each does and undoes, the chaos
//! scenarios, and the seeded plan of when and where.

use std::time::{Duration, Instant};

use topology::Topology;

use crate::fabric::etcd::{Control, EtcdControl};
use crate::fabric::launch::{DaemonKind, Fabric, NetMode};
use crate::run::copies_down;

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
    /// copy it holds is out of service (see [`crate::run::freeze`]).
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
    /// SIGKILL the server of a replicated region's deciding copy and then
    /// at once the region's owner device, restart both later (see
    /// [`crate::run::copies_down`]).
    KillOwnerAndDecider,
    /// SIGKILL a server once every copy in the map serves again (after an
    /// earlier kill's copies were resynced), restart it later.
    KillServerAfterResync,
}

/// What an injected fault hit, and when.
#[derive(Debug)]
pub(super) struct Injected {
    /// When it took effect.
    pub at: Instant,
    /// What it hit, as the report names it (the plan's target, or what a
    /// target named by its role turned out to be).
    pub target: String,
    /// A line for the report's notes, when the fault has more to say.
    pub note: Option<String>,
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
            FaultKind::KillOwnerAndDecider => "kill-owner-and-decider",
            FaultKind::KillServerAfterResync => "kill-server-after-resync",
        }
    }

    /// Whether it changes the map's membership (not undone later).
    pub(super) fn changes_membership(self) -> bool {
        matches!(
            self,
            FaultKind::AddServer | FaultKind::AddDevice | FaultKind::RemoveDevice
        )
    }

    /// Whether it waits for the map before it strikes (every copy serving
    /// again), so it may come later than planned: the workers are then
    /// held open until the run's last fault is done.
    pub(super) fn waits_for_the_map(self) -> bool {
        matches!(
            self,
            FaultKind::KillOwnerAndDecider | FaultKind::KillServerAfterResync
        )
    }

    /// The daemon kind a fabric must hold back from its first map for it.
    pub(super) fn held_back(self) -> Option<DaemonKind> {
        match self {
            FaultKind::AddServer => Some(DaemonKind::PmemServer),
            FaultKind::AddDevice => Some(DaemonKind::FabricDevice),
            _ => None,
        }
    }

    /// Whether the application must not see it: another path exists, or
    /// only the control plane is hit and the data path serves on, or (the
    /// faults that need replicated regions) another copy serves.
    pub(super) fn invisible(self) -> bool {
        matches!(
            self,
            FaultKind::KillFabric
                | FaultKind::CutLink
                | FaultKind::KillEtcd
                | FaultKind::KillEtcdLeader
                | FaultKind::AddServer
                | FaultKind::AddDevice
                | FaultKind::RemoveDevice
                | FaultKind::KillOwnerAndDecider
                | FaultKind::KillServerAfterResync
        )
    }

    pub(super) fn from_name(name: &str) -> Option<Self> {
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
            FaultKind::KillOwnerAndDecider,
            FaultKind::KillServerAfterResync,
        ]
        .into_iter()
        .find(|k| k.name() == name)
    }

    /// Injects the fault; returns when it took effect, and what it hit
    /// when the plan named it only by its role (the etcd leader) or by a
    /// region (its owner and deciding copy).
    pub(super) fn inject(self, fabric: &mut Fabric, target: &str) -> anyhow::Result<Injected> {
        let plain = |(at, target): (Instant, String)| Injected {
            at,
            target,
            note: None,
        };
        let killed = |k: copies_down::Killed| Injected {
            at: k.at,
            target: k.target,
            note: Some(k.note),
        };
        fn etcd(fabric: &mut Fabric, kind: FaultKind) -> anyhow::Result<&mut EtcdControl> {
            fabric
                .etcd_mut()
                .ok_or_else(|| anyhow::anyhow!("{} needs --control etcd", kind.name()))
        }
        Ok(match self {
            FaultKind::KillEtcd => plain((etcd(fabric, self)?.kill_all(), target.to_owned())),
            FaultKind::KillEtcdLeader => {
                let (at, leader) = etcd(fabric, self)?.kill_leader()?;
                plain((at, format!("{target} {leader}")))
            }
            FaultKind::AddServer | FaultKind::AddDevice => {
                let at = Instant::now();
                let change = fabric.admit_held()?;
                plain((at, format!("{} at epoch {}", change.id, change.epoch)))
            }
            FaultKind::RemoveDevice => {
                let device = crate::fabric::membership::spare_device(&fabric.topology)?;
                let at = Instant::now();
                let change = fabric.remove_device(&device)?;
                plain((at, format!("{} at epoch {}", change.id, change.epoch)))
            }
            FaultKind::KillOwnerAndDecider => {
                killed(copies_down::kill_owner_and_decider(fabric, target)?)
            }
            FaultKind::KillServerAfterResync => {
                killed(copies_down::kill_server_after_resync(fabric, target)?)
            }
            other => plain((other.inject_daemon(fabric, target)?, target.to_owned())),
        })
    }

    /// Injects a fault on the daemons or links.
    fn inject_daemon(self, fabric: &mut Fabric, target: &str) -> anyhow::Result<Instant> {
        Ok(match self {
            FaultKind::KillFabric => fabric.kill(DaemonKind::FabricDevice, target)?,
            FaultKind::KillServer => fabric.kill(DaemonKind::PmemServer, target)?,
            FaultKind::FreezeServer => crate::run::freeze::freeze(fabric, target)?,
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
            | FaultKind::RemoveDevice
            | FaultKind::KillOwnerAndDecider
            | FaultKind::KillServerAfterResync => Instant::now(),
        })
    }

    /// Undoes the fault.
    pub(super) fn restore(self, fabric: &mut Fabric, target: &str) -> anyhow::Result<()> {
        match self {
            FaultKind::KillFabric => fabric.restart(DaemonKind::FabricDevice, target)?,
            FaultKind::KillServer | FaultKind::KillServerAfterResync => {
                fabric.restart(DaemonKind::PmemServer, target)?
            }
            FaultKind::KillOwnerAndDecider => {
                copies_down::restart_owner_and_decider(fabric, target)?
            }
            FaultKind::FreezeServer => crate::run::freeze::thaw(fabric, target)?,
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
    /// SIGKILL a replicated region's owner device and the server of its
    /// deciding copy a moment apart, restart both (`--control etcd`,
    /// replicated regions).
    KillOwnerAndDecider,
    /// SIGKILL a server, restart it; once its copies are resynced (every
    /// copy in the map serves), SIGKILL a server holding the other copies,
    /// restart it (`--control etcd`, replicated regions).
    KillServerThenOther,
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
            (Scenario::KillOwnerAndDecider | Scenario::KillServerThenOther, Control::File) => {
                Err(format!(
                    "--scenario {} needs --control etcd: it reads which copies serve, and who \
                     owns a region, from the map there (and a dead owner is taken over only \
                     there)",
                    self.name()
                ))
            }
            (Scenario::KillEtcdLeader, Control::Etcd { members }) if members < 3 => Err(format!(
                "--scenario kill-etcd-leader needs --etcd-members 3 or more (with {members}, \
                 killing the leader takes etcd down: that is kill-etcd)"
            )),
            _ => Ok(()),
        }
    }

    /// Whether the scenario can run on `topology`; why not otherwise (the
    /// scenarios about copies need replicated regions).
    pub fn check_topology(self, topology: &Topology) -> Result<(), String> {
        match self {
            Scenario::KillOwnerAndDecider | Scenario::KillServerThenOther
                if !topology.is_replicated() =>
            {
                Err(format!(
                    "--scenario {} kills copies of replicated regions, and {} keeps every region \
                     once: add --replicas 2 (or replicas in the topology's [pool])",
                    self.name(),
                    topology.source
                ))
            }
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
            "kill-owner-and-decider" => Ok(Scenario::KillOwnerAndDecider),
            "kill-server-then-other" => Ok(Scenario::KillServerThenOther),
            other => Err(format!(
                "unknown scenario {other:?} (kill-fabric, kill-server, freeze-server, cut-link, \
                 restart-all, kill-etcd, kill-etcd-leader, add-server, add-device, \
                 remove-device, kill-owner-and-decider, kill-server-then-other)"
            )),
        }
    }
}

/// `count` faults of `scenario` at seeded random times in the middle of a
/// run of `duration`, each target restarted after a tenth of the run (etcd
/// after three tenths). A membership scenario changes the map once,
/// whatever `count` says: one daemon is held back, and removing a second
/// device could leave a client without a path. `kill-server-then-other`
/// is one pair of kills whatever `count` says (none for 0).
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
        // Resolved when injected: the region's owner and deciding copy then.
        Scenario::KillOwnerAndDecider => (
            FaultKind::KillOwnerAndDecider,
            copies_down::target_region(topology).into_iter().collect(),
        ),
        Scenario::KillServerThenOther => {
            return plan_server_then_other(topology, duration, count, &mut rng);
        }
    };
    if targets.is_empty() {
        return Vec::new();
    }
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
        FaultKind::FreezeServer => crate::run::freeze::least_freeze(),
        _ => Duration::from_millis(500),
    };
    let restore_after = time_down(duration, share, least);
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

/// How long a fault's target stays down: `share` of the run, at least
/// `least`.
fn time_down(duration: Duration, share: f64, least: Duration) -> Duration {
    duration.mul_f64(share).max(least)
}

/// `kill-server-then-other`: a seeded server holding copies killed early
/// in the run (restarted a tenth of the run later), then, planned at 55 %
/// of the run and injected only once every copy serves again, the first
/// other server holding copies of the same regions (restarted likewise).
fn plan_server_then_other(
    topology: &Topology,
    duration: Duration,
    count: usize,
    rng: &mut crate::workload::keys::Rng,
) -> Vec<PlannedFault> {
    let servers = copies_down::servers_with_copies(topology);
    if count == 0 || servers.is_empty() {
        return Vec::new();
    }
    let first = servers[rng.below(servers.len() as u64) as usize].clone();
    let Some(second) = copies_down::other_server(topology, &first) else {
        return Vec::new();
    };
    let restore_after = time_down(duration, 0.1, Duration::from_millis(500));
    let at = duration.mul_f64(0.2) + duration.mul_f64(0.1 * rng.unit());
    vec![
        PlannedFault {
            at,
            kind: FaultKind::KillServer,
            target: first,
            restore_after,
        },
        PlannedFault {
            at: duration.mul_f64(0.55).max(at + restore_after),
            kind: FaultKind::KillServerAfterResync,
            target: second,
            restore_after,
        },
    ]
}
