//! The faults that take copies of replicated regions down on purpose, on a
//! map in etcd:
//!
//! - `kill-owner-and-decider`: the server of a region's deciding copy
//!   (the first serving one) and the region's owner device SIGKILLed at
//!   the same moment (both signalled before either is reaped); both
//!   restarted once the map names another owner of the region (a
//!   surviving device took it over);
//! - `kill-server-after-resync`: a server killed only once every copy in
//!   the map serves again, so after the copies an earlier kill took down
//!   have been brought back by a resync while the workload ran.
//!
//! Both wait, before they kill, until every copy in the map serves: a
//! second failure while a region has one serving copy is one the design
//! does not survive, and these faults are about the ones it must.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use control::{ReplicaSetRecord, ReplicaState};
use topology::Topology;

use crate::fabric::launch::{DaemonKind, Fabric};

/// How long a kill waits for every copy in the map to serve again.
const SERVING_PATIENCE: Duration = Duration::from_secs(60);
/// How long the restart of a killed owner waits for another device to
/// take its region over.
const TAKEOVER_PATIENCE: Duration = Duration::from_secs(30);

/// The region a `kill-owner-and-decider` plan aims at: the first
/// replicated region in the topology's order. On a pool without an
/// allocator the workload's shared counter words sit at the start of the
/// space, in that region, so its FETCH_ADDs are decided there.
pub fn target_region(topology: &Topology) -> Option<String> {
    topology
        .replica_sets()
        .into_iter()
        .find(|set| set.is_replicated())
        .map(|set| set.region.to_string())
}

/// For `kill-server-then-other`: the server the second kill takes, after
/// `first` is back: the first server in the topology's order other than
/// `first` that holds a copy of a region `first` holds a copy of.
pub fn other_server(topology: &Topology, first: &str) -> Option<String> {
    let sets = topology.replica_sets();
    let shared = |server: &topology::ServerId| {
        sets.iter().any(|set| {
            set.is_replicated()
                && set.replicas.iter().any(|r| r.server.as_str() == first)
                && set.on(server).is_some()
        })
    };
    topology
        .servers
        .iter()
        .map(|s| &s.id)
        .find(|id| id.as_str() != first && shared(id))
        .map(ToString::to_string)
}

/// The servers that hold a copy of a replicated region, in the topology's
/// order: where `kill-server-then-other` draws its first server.
pub fn servers_with_copies(topology: &Topology) -> Vec<String> {
    let sets = topology.replica_sets();
    topology
        .servers
        .iter()
        .filter(|s| {
            sets.iter()
                .any(|set| set.is_replicated() && set.on(&s.id).is_some())
        })
        .map(|s| s.id.to_string())
        .collect()
}

/// A kill as it happened: when, what it hit (the fault's target as the
/// report shows it), and a line for the report's notes.
#[derive(Debug)]
pub struct Killed {
    /// When the signals were sent.
    pub at: Instant,
    /// The target as the report names it and the restore reads it.
    pub target: String,
    /// What was hit and what was waited for.
    pub note: String,
}

/// Kills the server of `region`'s deciding copy and the region's owner
/// device at the same moment, once every copy in the map serves.
/// The target reads `DEVICE+SERVER (REGION)`.
pub fn kill_owner_and_decider(fabric: &mut Fabric, region: &str) -> anyhow::Result<Killed> {
    let waited = await_every_copy_serving(fabric, "kill-owner-and-decider")?;
    let records = replica_sets(fabric)?;
    let record = records
        .iter()
        .find(|r| r.region == region)
        .with_context(|| {
            format!(
                "kill-owner-and-decider: region {region} has no replica set in the map (is the \
                 topology replicated: --replicas 2?)"
            )
        })?;
    let deciding = record
        .copies
        .iter()
        .find(|c| c.state == ReplicaState::Serving)
        .map(|c| c.server.clone())
        .with_context(|| format!("kill-owner-and-decider: region {region} has no serving copy"))?;
    let owner = record.owner.clone();
    let also: Vec<&str> = records
        .iter()
        .filter(|r| r.owner == owner && r.region != region)
        .map(|r| r.region.as_str())
        .collect();
    // Both signalled before either is reaped: the server, still tearing
    // down its mappings, may accept the takeover's probe, and the new
    // owner then moves the deciding role off it once it refuses (see
    // docs/replication.md, "The owner and the deciding copy together").
    let at = fabric.kill_together(&[
        (DaemonKind::PmemServer, deciding.as_str()),
        (DaemonKind::FabricDevice, owner.as_str()),
    ])?;
    let also = if also.is_empty() {
        String::new()
    } else {
        format!(" (it also owned {})", also.join(", "))
    };
    Ok(Killed {
        at,
        target: format!("{owner}+{deciding} ({region})"),
        note: format!(
            "kill-owner-and-decider: fabric device {owner} owned region {region}{also}, whose \
             deciding copy was on server {deciding}; both SIGKILLed at the same moment{}",
            waited_note(waited)
        ),
    })
}

/// Restarts what [`kill_owner_and_decider`] killed (`DEVICE+SERVER
/// (REGION)`), once the map names another owner of the region (a device
/// restarted before that would find itself still the owner, and nothing
/// would have been taken over): the server first, so the device's links
/// come up at once.
pub fn restart_owner_and_decider(fabric: &mut Fabric, target: &str) -> anyhow::Result<()> {
    let parsed = target
        .split_once(" (")
        .and_then(|(pair, region)| Some((pair.split_once('+')?, region.strip_suffix(')')?)));
    let Some(((device, server), region)) = parsed else {
        bail!("kill-owner-and-decider's target {target:?} is not DEVICE+SERVER (REGION)");
    };
    let waited = await_another_owner(fabric, region, device);
    fabric.restart(DaemonKind::PmemServer, server)?;
    fabric.restart(DaemonKind::FabricDevice, device)?;
    waited
}

/// Waits until the map names an owner of `region` other than `device`.
fn await_another_owner(fabric: &Fabric, region: &str, device: &str) -> anyhow::Result<()> {
    let since = Instant::now();
    loop {
        let records = replica_sets(fabric)?;
        let owner = records
            .iter()
            .find(|r| r.region == region)
            .map(|r| r.owner.as_str());
        if owner.is_some_and(|o| o != device) {
            return Ok(());
        }
        if since.elapsed() > TAKEOVER_PATIENCE {
            bail!(
                "fabric device {device} was killed with the deciding copy of region {region}, \
                 and after {} s the map still names {} its owner: no surviving device took it \
                 over (did clients send its requests to another device? see the devices' logs)",
                TAKEOVER_PATIENCE.as_secs(),
                owner.unwrap_or("nobody")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Kills `server` once every copy in the map serves again.
pub fn kill_server_after_resync(fabric: &mut Fabric, server: &str) -> anyhow::Result<Killed> {
    let waited = await_every_copy_serving(fabric, "kill-server-after-resync")?;
    let at = fabric.kill(DaemonKind::PmemServer, server)?;
    Ok(Killed {
        at,
        target: server.to_owned(),
        note: format!(
            "kill-server-after-resync: server {server} SIGKILLed once every copy in the map \
             served again{}",
            waited_note(waited)
        ),
    })
}

fn waited_note(waited: Duration) -> String {
    if waited.is_zero() {
        " (they all served already)".to_owned()
    } else {
        format!(
            " ({:.2} s after it was due: the map had copies that did not serve yet)",
            waited.as_secs_f64()
        )
    }
}

fn replica_sets(fabric: &Fabric) -> anyhow::Result<Vec<ReplicaSetRecord>> {
    let etcd = fabric
        .etcd()
        .context("this fault reads the replica sets from the map: it needs --control etcd")?;
    etcd.replica_sets().context("read the replica sets in etcd")
}

/// Waits until every copy of every replica set in the map serves; how
/// long that took.
fn await_every_copy_serving(fabric: &Fabric, fault: &str) -> anyhow::Result<Duration> {
    let since = Instant::now();
    loop {
        let records = replica_sets(fabric)?;
        let not_serving = copies_not_serving(&records);
        if not_serving.is_empty() {
            return Ok(since.elapsed());
        }
        if since.elapsed() > SERVING_PATIENCE {
            bail!(
                "{fault} waits for every copy in the map to serve before it kills, and after {} s \
                 these still do not: {} (a resync that does not finish? see the fabric devices' \
                 logs)",
                SERVING_PATIENCE.as_secs(),
                not_serving.join("; ")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `REGION on SERVER STATE` for each copy of `records` that does not serve.
fn copies_not_serving(records: &[ReplicaSetRecord]) -> Vec<String> {
    records
        .iter()
        .flat_map(|r| {
            r.copies
                .iter()
                .filter(|c| c.state != ReplicaState::Serving)
                .map(move |c| format!("{} on {} {}", r.region, c.server, c.state))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replicated() -> Topology {
        let text = include_str!("../../../configs/default.toml")
            .replace("name = \"default\"", "name = \"default\"\nreplicas = 2");
        Topology::from_toml_str("default.toml", &text, &topology::EnvOverrides::None)
            .expect("default topology with 2 copies")
    }

    #[test]
    fn the_targets_come_from_the_topology_and_name_the_counters_region() {
        let topology = replicated();
        assert_eq!(target_region(&topology).as_deref(), Some("PA.1"));
        assert_eq!(servers_with_copies(&topology), ["A", "B"]);
        assert_eq!(other_server(&topology, "A").as_deref(), Some("B"));
        assert_eq!(other_server(&topology, "B").as_deref(), Some("A"));
        let single = Topology::from_toml_str(
            "default.toml",
            include_str!("../../../configs/default.toml"),
            &topology::EnvOverrides::None,
        )
        .expect("default topology");
        assert_eq!(target_region(&single), None);
        assert!(servers_with_copies(&single).is_empty());
        assert_eq!(other_server(&single, "A"), None);
    }

    #[test]
    fn the_scenarios_plan_their_kills_and_refuse_a_topology_without_copies() {
        use crate::fabric::launch::NetMode;
        use crate::run::{FaultKind, Scenario, plan_faults};
        let topology = replicated();
        let run = Duration::from_secs(10);
        let both = plan_faults(
            &topology,
            NetMode::Loopback,
            Scenario::KillOwnerAndDecider,
            run,
            2,
            7,
        );
        assert_eq!(both.len(), 2);
        for fault in &both {
            assert_eq!(fault.kind, FaultKind::KillOwnerAndDecider);
            assert_eq!(fault.target, "PA.1");
            assert_eq!(fault.restore_after, Duration::from_secs(1));
        }
        let pair = plan_faults(
            &topology,
            NetMode::Loopback,
            Scenario::KillServerThenOther,
            run,
            3,
            7,
        );
        let kinds: Vec<FaultKind> = pair.iter().map(|f| f.kind).collect();
        assert_eq!(
            kinds,
            [FaultKind::KillServer, FaultKind::KillServerAfterResync]
        );
        assert_ne!(pair[0].target, pair[1].target);
        assert!(pair[1].at >= pair[0].at + pair[0].restore_after);
        // The same seed, the same plan.
        let again = plan_faults(
            &topology,
            NetMode::Loopback,
            Scenario::KillServerThenOther,
            run,
            1,
            7,
        );
        assert_eq!(again, pair);
        let single = Topology::from_toml_str(
            "default.toml",
            include_str!("../../../configs/default.toml"),
            &topology::EnvOverrides::None,
        )
        .expect("default topology");
        let refused = Scenario::KillOwnerAndDecider
            .check_topology(&single)
            .expect_err("one copy per region");
        assert!(refused.contains("--replicas 2"), "{refused}");
        assert!(
            Scenario::KillServerThenOther
                .check_topology(&topology)
                .is_ok()
        );
        assert!(
            Scenario::KillServerThenOther
                .check_control(crate::fabric::etcd::Control::File)
                .is_err()
        );
    }

    #[test]
    fn copies_that_do_not_serve_are_named() {
        let records = control::replica_state::initial(&replicated());
        assert!(copies_not_serving(&records).is_empty());
        let mut records = records;
        records[0].copies[1].state = ReplicaState::Syncing;
        assert_eq!(copies_not_serving(&records), ["PA.1 on B syncing"]);
    }
}
