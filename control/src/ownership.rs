//! A replicated region's owner taken over by a surviving fabric device.
//!
//! The owner orders every request of its region; when it dies, another
//! device that reaches the copies writes itself into the map as the new
//! owner, in one transaction checked against the region's record as the
//! device read it (its version):
//!
//! - `owner` becomes the new device and `version` goes up by one, with the
//!   map's epoch;
//! - the **deciding copy** (the first serving one in set order whose
//!   server the new owner reaches) stays serving; every other serving copy
//!   becomes `syncing`. The old owner may have died with a write applied
//!   on one copy and not another, so only the deciding copy is known to
//!   hold every acknowledged change; the others take writes again at once
//!   and serve reads only after a resync. `syncing` and `offline` copies
//!   keep their state.
//! - A serving copy whose server the new owner does not reach (it died
//!   with the old owner) is passed over as the deciding copy: every
//!   serving copy holds every acknowledged change (an acknowledgement
//!   waits for each of them), so any reachable one may decide, and the
//!   one passed over becomes `syncing` like the others. Were it kept as
//!   the deciding copy, the region would have no copy that decides until
//!   that server came back.
//!
//! A device that read an older version loses: the record moved on (another
//! device took over first, or a copy was marked), nothing is written, and
//! the map it then follows names the winner.

use topology::{EnvOverrides, Topology};

use crate::map::{ClusterMap, RecordMismatch};
use crate::plane::Edited;
use crate::replica_state::ReplicaState;
use crate::{ControlError, ControlPlane, Credentials, Endpoints};

/// Why a takeover cannot be written into a map.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OwnershipError {
    /// The map has no record for the region (unknown, or one copy).
    #[error(
        "region {region} has no replica set record in the map (unknown, or a single copy): it \
         has no owner to take over"
    )]
    NotReplicated {
        /// The region.
        region: String,
    },
    /// The new owner is no fabric device of the map.
    #[error("fabric device {device} is not in the map: it cannot own region {region}")]
    UnknownDevice {
        /// The region.
        region: String,
        /// The device.
        device: String,
    },
    /// The record is not at the version the decision was made on.
    #[error(
        "region {region}'s replica set is at version {current} (owner {owner}), not {expected} \
         as read: another device or an operator changed it first; nothing was written"
    )]
    Moved {
        /// The region.
        region: String,
        /// The version the decision was made on.
        expected: u64,
        /// The version the map holds.
        current: u64,
        /// The owner the map names.
        owner: String,
    },
    /// The device owns the region already.
    #[error("fabric device {device} owns region {region} already; nothing to take over")]
    AlreadyOwner {
        /// The region.
        region: String,
        /// The device.
        device: String,
    },
    /// No copy serves: nothing is known to hold every acknowledged write.
    #[error(
        "region {region} has no serving copy: a new owner would have no copy to decide on; an \
         operator must bring one back first"
    )]
    NoServingCopy {
        /// The region.
        region: String,
    },
    /// Every serving copy is on a server the new owner does not reach.
    #[error(
        "fabric device {device} reaches no server of a serving copy of region {region} \
         (serving on {servers}): it cannot take the region over; its requests wait for a \
         device that does, or for one of those servers"
    )]
    NoReachableServingCopy {
        /// The region.
        region: String,
        /// The device.
        device: String,
        /// The servers of the serving copies, comma-separated.
        servers: String,
    },
    /// The map's topology does not load (it is refused everywhere anyway).
    #[error("the map's topology does not load: {why}")]
    BadTopology {
        /// Why.
        why: String,
    },
}

/// A map with a region's owner taken over, and what changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenOver {
    /// The whole new map (next epoch, the region's next version).
    pub map: ClusterMap,
    /// The owner before.
    pub previous: String,
    /// The region's new version.
    pub version: u64,
    /// The server of the deciding copy, which stays serving.
    pub deciding: String,
    /// The servers whose copies went from serving to syncing.
    pub syncing: Vec<String>,
    /// The change in one line, for logs.
    pub note: String,
}

/// `map` with `device` as `region`'s owner, if the region's record is still
/// at `expected_version`: the owner, the version (+1) and the epoch (+1)
/// change, and every serving copy but the deciding one becomes syncing.
/// The deciding copy is the first serving one whose server is not in
/// `unreachable` (the servers `device` has no link to, or found dead).
pub fn take_ownership(
    map: &ClusterMap,
    region: &str,
    device: &str,
    expected_version: u64,
    unreachable: &[&str],
) -> Result<TakenOver, OwnershipError> {
    let topology = Topology::from_toml_str("the map", &map.topology, &EnvOverrides::None)
        .map_err(|e| OwnershipError::BadTopology { why: e.to_string() })?;
    if !topology
        .fabric_devices
        .iter()
        .any(|d| d.id.as_str() == device)
    {
        return Err(OwnershipError::UnknownDevice {
            region: region.to_owned(),
            device: device.to_owned(),
        });
    }
    let (mut next, index) = map
        .next_for_record(region, expected_version)
        .map_err(|mismatch| match mismatch {
            RecordMismatch::NotReplicated => OwnershipError::NotReplicated {
                region: region.to_owned(),
            },
            RecordMismatch::Moved { current, owner } => OwnershipError::Moved {
                region: region.to_owned(),
                expected: expected_version,
                current,
                owner,
            },
        })?;
    let record = &mut next.replica_sets[index];
    if record.owner == device {
        return Err(OwnershipError::AlreadyOwner {
            region: region.to_owned(),
            device: device.to_owned(),
        });
    }
    let serving: Vec<&str> = record
        .copies
        .iter()
        .filter(|c| c.state == ReplicaState::Serving)
        .map(|c| c.server.as_str())
        .collect();
    if serving.is_empty() {
        return Err(OwnershipError::NoServingCopy {
            region: region.to_owned(),
        });
    }
    let Some(deciding) = record.copies.iter().position(|c| {
        c.state == ReplicaState::Serving && !unreachable.contains(&c.server.as_str())
    }) else {
        return Err(OwnershipError::NoReachableServingCopy {
            region: region.to_owned(),
            device: device.to_owned(),
            servers: serving.join(", "),
        });
    };
    let mut syncing = Vec::new();
    for (i, copy) in record.copies.iter_mut().enumerate() {
        if i != deciding && copy.state == ReplicaState::Serving {
            copy.state = ReplicaState::Syncing;
            syncing.push(copy.server.clone());
        }
    }
    let previous = std::mem::replace(&mut record.owner, device.to_owned());
    record.version += 1;
    let version = record.version;
    let deciding = record.copies[deciding].server.clone();
    let resync = if syncing.is_empty() {
        String::new()
    } else {
        format!("; copies on {} syncing", syncing.join(", "))
    };
    let note = format!(
        "region {region}: owner {previous} -> {device} (replica set version {version}, map \
         epoch {}); deciding copy on {deciding}{resync}",
        next.epoch
    );
    Ok(TakenOver {
        map: next,
        previous,
        version,
        deciding,
        syncing,
        note,
    })
}

/// What a takeover attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Takeover {
    /// The map names the device as owner from this epoch on.
    Taken {
        /// The map's new epoch.
        epoch: u64,
        /// The change, for logs.
        note: String,
        /// The region's record's new version.
        version: u64,
        /// The server of the deciding copy.
        deciding: String,
        /// The servers whose copies went from serving to syncing.
        syncing: Vec<String>,
    },
    /// Someone else changed the record first: the map names `owner` at
    /// `version`. Nothing was written.
    Lost {
        /// The owner the map names.
        owner: String,
        /// The record's version now.
        version: u64,
    },
}

/// Why a takeover could not be decided in etcd.
#[derive(Debug, thiserror::Error)]
pub enum TakeoverError {
    /// etcd refused or could not be reached.
    #[error("cannot write fabric device {device} as the owner of region {region} in etcd")]
    Control {
        /// The region.
        region: String,
        /// The device.
        device: String,
        /// Why.
        #[source]
        source: Box<ControlError>,
    },
    /// The map refuses the change.
    #[error("the map refuses fabric device {device} as the owner of region {region}")]
    Refused {
        /// The region.
        region: String,
        /// The device.
        device: String,
        /// Why.
        #[source]
        source: OwnershipError,
    },
}

impl ControlPlane {
    /// Writes `device` as `region`'s owner if the region's record is still
    /// at `expected_version` ([`take_ownership`], passing over the serving
    /// copies on the servers in `unreachable` as the deciding copy): one
    /// transaction against the map's revision as read. A change elsewhere
    /// in the map meanwhile is read again and the takeover decided anew; a
    /// change of this region's record loses ([`Takeover::Lost`]).
    pub async fn take_over(
        &mut self,
        region: &str,
        device: &str,
        expected_version: u64,
        unreachable: &[&str],
    ) -> Result<Takeover, TakeoverError> {
        let control = |source| TakeoverError::Control {
            region: region.to_owned(),
            device: device.to_owned(),
            source: Box::new(source),
        };
        let edited = self
            .edit_map(|map| {
                match take_ownership(map, region, device, expected_version, unreachable) {
                    Ok(taken) => Ok((
                        taken.map,
                        (taken.note, taken.version, taken.deciding, taken.syncing),
                    )),
                    Err(OwnershipError::Moved { current, owner, .. }) => Err(Ok(Takeover::Lost {
                        owner,
                        version: current,
                    })),
                    Err(source) => Err(Err(TakeoverError::Refused {
                        region: region.to_owned(),
                        device: device.to_owned(),
                        source,
                    })),
                }
            })
            .await
            .map_err(control)?;
        match edited {
            Edited::Written(written, (note, version, deciding, syncing)) => Ok(Takeover::Taken {
                epoch: written.map.epoch,
                note,
                version,
                deciding,
                syncing,
            }),
            Edited::Stopped(outcome) => outcome,
        }
    }
}

/// [`ControlPlane::take_over`] of each of `regions` (a region and the
/// version of its record the decision was made on) by `device`, which does
/// not reach the servers in `unreachable`, one transaction per region over
/// one connection, for a caller without async code (the fabric device's
/// takeover thread), as the etcd user of `credentials` when given. Errs
/// only when etcd cannot be reached at all; each region's own outcome is
/// in the list, in order.
pub fn take_over_blocking(
    endpoints: &Endpoints,
    pool: &str,
    credentials: Option<&Credentials>,
    device: &str,
    regions: &[(&str, u64)],
    unreachable: &[&str],
) -> Result<Vec<Result<Takeover, TakeoverError>>, ControlError> {
    let runtime = crate::blocking::runtime()?;
    runtime.block_on(async {
        let mut plane = ControlPlane::connect(endpoints, pool, credentials).await?;
        let mut outcomes = Vec::with_capacity(regions.len());
        for &(region, version) in regions {
            outcomes.push(plane.take_over(region, device, version, unreachable).await);
        }
        Ok(outcomes)
    })
}

/// Whether fabric device `device` holds its liveness record in pool
/// `pool` now (its lease is kept alive), as the etcd user of `credentials`
/// when given; blocks.
pub fn device_registered(
    endpoints: &Endpoints,
    pool: &str,
    credentials: Option<&Credentials>,
    device: &str,
) -> Result<bool, ControlError> {
    let runtime = crate::blocking::runtime()?;
    runtime.block_on(async {
        let mut plane = ControlPlane::connect(endpoints, pool, credentials).await?;
        let members = plane.members().await?;
        Ok(members
            .iter()
            .any(|m| m.role == crate::Role::Device && m.name == device))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replicated() -> ClusterMap {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../configs/default.toml"
        ))
        .expect("configs/default.toml")
        .replace("name = \"default\"", "name = \"default\"\nreplicas = 2");
        ClusterMap::new(4, text)
    }

    #[test]
    fn a_takeover_moves_the_owner_and_resyncs_every_copy_but_the_deciding_one() {
        let map = replicated();
        let before = map.replica_set("PA.1").expect("PA.1").clone();
        assert_eq!(before.owner, "A");
        let taken = take_ownership(&map, "PA.1", "B", before.version, &[]).expect("taken");
        assert_eq!(taken.map.epoch, 5);
        let after = taken.map.replica_set("PA.1").expect("PA.1");
        assert_eq!(after.owner, "B");
        assert_eq!(after.version, before.version + 1);
        assert_eq!(after.state_on("A"), Some(ReplicaState::Serving));
        assert_eq!(after.state_on("B"), Some(ReplicaState::Syncing));
        assert_eq!(
            (taken.previous.as_str(), taken.deciding.as_str()),
            ("A", "A")
        );
        assert_eq!(taken.syncing, ["B"]);
        assert!(taken.note.contains("owner A -> B"), "{}", taken.note);
        // Nothing else of the map changed.
        for other in ["PA.2", "PB.1", "PB.2"] {
            assert_eq!(taken.map.replica_set(other), map.replica_set(other));
        }
        assert_eq!(
            taken
                .map
                .topology_at("/k")
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Ok(())
        );
    }

    #[test]
    fn the_deciding_copy_is_the_first_serving_one_and_other_states_stay() {
        let mut map = replicated();
        let record = map
            .replica_sets
            .iter_mut()
            .find(|r| r.region == "PA.1")
            .expect("PA.1");
        record.copies[0].state = ReplicaState::Offline;
        let taken = take_ownership(&map, "PA.1", "B", 1, &[]).expect("taken");
        let after = taken.map.replica_set("PA.1").expect("PA.1");
        assert_eq!(taken.deciding, "B");
        assert_eq!(after.state_on("A"), Some(ReplicaState::Offline));
        assert_eq!(after.state_on("B"), Some(ReplicaState::Serving));
        assert!(taken.syncing.is_empty());
    }

    #[test]
    fn a_stale_version_an_owner_already_and_strangers_are_refused() {
        let map = replicated();
        assert_eq!(
            take_ownership(&map, "PA.1", "B", 7, &[]),
            Err(OwnershipError::Moved {
                region: "PA.1".into(),
                expected: 7,
                current: 1,
                owner: "A".into()
            })
        );
        assert!(matches!(
            take_ownership(&map, "PA.1", "A", 1, &[]),
            Err(OwnershipError::AlreadyOwner { .. })
        ));
        assert!(matches!(
            take_ownership(&map, "PA.1", "Z", 1, &[]),
            Err(OwnershipError::UnknownDevice { .. })
        ));
        assert!(matches!(
            take_ownership(&map, "nope", "B", 1, &[]),
            Err(OwnershipError::NotReplicated { .. })
        ));
        let mut dead = map.clone();
        for copy in &mut dead.replica_sets[0].copies {
            copy.state = ReplicaState::Offline;
        }
        let region = dead.replica_sets[0].region.clone();
        let err = take_ownership(&dead, &region, "B", 1, &[]).expect_err("no serving copy");
        assert!(err.to_string().contains("no serving copy"), "{err}");
    }

    #[test]
    fn a_serving_copy_the_new_owner_does_not_reach_is_passed_over_as_the_deciding_one() {
        let map = replicated();
        let before = map.replica_set("PA.1").expect("PA.1").clone();
        // The owner A and server A (PA.1's first copy) died together: B
        // reaches only server B's copy, which decides; A's syncs later.
        let taken = take_ownership(&map, "PA.1", "B", before.version, &["A"]).expect("taken");
        let after = taken.map.replica_set("PA.1").expect("PA.1");
        assert_eq!(taken.deciding, "B");
        assert_eq!(taken.syncing, ["A"]);
        assert_eq!(after.state_on("B"), Some(ReplicaState::Serving));
        assert_eq!(after.state_on("A"), Some(ReplicaState::Syncing));
        assert!(taken.note.contains("deciding copy on B"), "{}", taken.note);
        // Reaching no serving copy at all: refused, naming them.
        let err = take_ownership(&map, "PA.1", "B", before.version, &["A", "B"])
            .expect_err("no copy reached");
        assert!(
            matches!(err, OwnershipError::NoReachableServingCopy { .. }),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(text.contains("serving on A, B"), "{text}");
        assert!(text.contains("region PA.1"), "{text}");
    }
}
