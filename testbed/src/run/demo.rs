//! `testbed demo`: the default fabric with one server's regions kept twice,
//! and the two deaths the application must not notice, a fabric device's
//! and a PMEM server's.
//!
//! Server B's regions get a second copy on server A; server A's keep one.
//! Each replicated region's requests go through its owner device (PB.1's
//! is device A, PB.2's device B), and a region waits for its owner while
//! the owner is down (no other device takes a region over yet). So the
//! device killed is B, which carries half the traffic of the single-copy
//! regions and owns no region the workload uses, and the server killed is
//! B, whose every region has a copy on A.

use std::time::Duration;

use anyhow::Context;
use topology::RegionReplicas;

use crate::run::{FaultKind, PlannedFault};

/// The server whose regions are kept twice, and which is killed.
pub const SERVER: &str = "B";
/// The fabric device that is killed.
pub const DEVICE: &str = "B";

/// The embedded default topology with every region of [`SERVER`] kept
/// twice (its backups placed by the rule, on server A).
pub fn topology() -> anyhow::Result<topology::Topology> {
    let mut topology = crate::load_topology(None).context("the embedded default topology")?;
    let server = topology
        .servers
        .iter_mut()
        .find(|s| s.id.as_str() == SERVER)
        .with_context(|| format!("the default topology has no server {SERVER}"))?;
    for region in server
        .sockets
        .iter_mut()
        .flat_map(|s| s.devices.iter_mut())
        .flat_map(|d| d.regions.iter_mut())
    {
        region.replicas = Some(RegionReplicas::Count(2));
    }
    topology.validate().map_err(|errors| {
        anyhow::anyhow!("the demo's topology (server {SERVER}'s regions kept twice):\n{errors}")
    })?;
    Ok(topology)
}

/// The faults of a demo of `duration`: device [`DEVICE`] killed at 30% and
/// server [`SERVER`] at 65%, each restarted a sixth of the run later (at
/// least half a second).
pub fn faults(duration: Duration) -> Vec<PlannedFault> {
    let restore_after = duration.div_f64(6.0).max(Duration::from_millis(500));
    vec![
        PlannedFault {
            at: duration.mul_f64(0.3),
            kind: FaultKind::KillFabric,
            target: DEVICE.to_owned(),
            restore_after,
        },
        PlannedFault {
            at: duration.mul_f64(0.65),
            kind: FaultKind::KillServer,
            target: SERVER.to_owned(),
            restore_after,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_killed_server_holds_only_regions_with_a_copy_elsewhere() {
        let topology = topology().unwrap();
        let sets = topology.replica_sets();
        let on_b: Vec<_> = sets
            .iter()
            .filter(|s| s.replicas.iter().any(|r| r.server.as_str() == SERVER))
            .collect();
        assert_eq!(on_b.len(), 2, "{sets:?}");
        for set in on_b {
            let servers: Vec<&str> = set.replicas.iter().map(|r| r.server.as_str()).collect();
            assert_eq!(servers, [SERVER, "A"], "{}", set.region);
        }
    }

    #[test]
    fn the_killed_device_owns_no_region_the_workload_uses() {
        // The workload's keys and counters live in the first region of
        // each client's half of the space: PA.1 and PB.1.
        let owners = topology().unwrap().default_owners();
        let owner = |region: &str| {
            owners
                .iter()
                .find(|(r, _)| r.as_str() == region)
                .map(|(_, d)| d.as_str().to_owned())
        };
        assert_eq!(owner("PA.1"), None, "a single copy");
        assert_eq!(owner("PB.1").as_deref(), Some("A"));
        assert_ne!(owner("PB.1").as_deref(), Some(DEVICE));
    }

    #[test]
    fn the_device_dies_and_returns_before_the_server_does() {
        // On a topology file, a device started after the server's death
        // would take the file's word that every copy serves, the ones that
        // missed writes too.
        let faults = faults(Duration::from_secs(30));
        assert_eq!(faults[0].kind, FaultKind::KillFabric);
        assert_eq!(faults[1].kind, FaultKind::KillServer);
        assert!(faults[0].at + faults[0].restore_after < faults[1].at);
    }
}
