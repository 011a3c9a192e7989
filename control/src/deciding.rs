//! The deciding role of a replicated region moved off a copy whose server
//! turned out dead just after a takeover kept it deciding.
//!
//! A takeover ([`crate::ownership`]) keeps the first serving copy whose
//! server the new owner reaches as the deciding copy and marks every
//! other serving copy `syncing`. When the old owner and that server die
//! at the very same moment, the server may still accept connections
//! while its process is torn down, so the takeover can keep a dead copy
//! deciding; the region then has no copy that decides until the server
//! is back. The new owner probes that server again after its takeover
//! and, when it refuses, moves the role in a second transaction, checked
//! against the takeover's version of the region's record:
//!
//! - the dead deciding copy becomes `offline`;
//! - the next serving copy decides if there is one; its server must be
//!   reachable;
//! - otherwise a copy the takeover itself moved from `serving` to
//!   `syncing` becomes `serving` and decides (the first reachable one in
//!   set order). That is safe only at the takeover's version: the copy
//!   was serving one version before, so it held every change the old
//!   owner acknowledged (each acknowledgement waited for every serving
//!   copy), and nobody has written the region since: the new owner sends
//!   nothing before every write-taking copy's server confirms the
//!   takeover's epoch, which the dead server never does, and any other
//!   change of the record would have raised its version. A copy that was
//!   `syncing` or `offline` before the takeover may lack acknowledged
//!   changes and is never promoted.

use crate::map::{ClusterMap, RecordMismatch};
use crate::plane::Edited;
use crate::replica_state::ReplicaState;
use crate::{ControlError, ControlPlane, Credentials, Endpoints};

/// Why the deciding role cannot be moved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecidingError {
    /// The map has no record for the region.
    #[error("region {region} has no replica set record in the map: no deciding copy to move")]
    NotReplicated {
        /// The region.
        region: String,
    },
    /// The record is not at the takeover's version any more.
    #[error(
        "region {region}'s replica set is at version {current} (owner {owner}), not {expected} \
         as the takeover left it: it changed since, and no copy's state is moved blindly"
    )]
    Moved {
        /// The version the takeover wrote.
        expected: u64,
        /// The version the map holds.
        current: u64,
        /// The region.
        region: String,
        /// The owner the map names.
        owner: String,
    },
    /// The deciding copy is not on the dead server.
    #[error(
        "region {region}'s deciding copy is on server {deciding}, not on {dead}: nothing to move"
    )]
    NotDeciding {
        /// The region.
        region: String,
        /// The server named dead.
        dead: String,
        /// The deciding copy's server (`none` without a serving copy).
        deciding: String,
    },
    /// No other copy may decide.
    #[error(
        "region {region}: no copy other than the one on dead server {dead} may decide (a \
         serving copy on a reachable server, or one this takeover marked syncing, on a reachable \
         server: copies {copies}); its requests wait for {dead}"
    )]
    NoSuccessor {
        /// The region.
        region: String,
        /// The dead deciding copy's server.
        dead: String,
        /// Every copy as `SERVER STATE`, comma-separated.
        copies: String,
    },
}

/// A map with a region's deciding role moved, and what changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecidingMoved {
    /// The whole new map (next epoch, the region's next version).
    pub map: ClusterMap,
    /// The server of the copy that decides now.
    pub deciding: String,
    /// Whether that copy went from `syncing` to `serving` for it.
    pub promoted: bool,
    /// The region's new version.
    pub version: u64,
    /// The change in one line, for logs.
    pub note: String,
}

/// A region's deciding role to move off a dead server's copy.
#[derive(Debug, Clone, Copy)]
pub struct DecidingMove<'a> {
    /// The region.
    pub region: &'a str,
    /// The version of its record the takeover wrote.
    pub takeover_version: u64,
    /// The server of the deciding copy, found dead.
    pub dead: &'a str,
    /// The servers the new owner reaches.
    pub reachable: &'a [&'a str],
    /// The servers whose copies the takeover moved from serving to
    /// syncing.
    pub was_serving: &'a [&'a str],
}

/// `map` with the deciding copy of `ask.region` on `ask.dead` marked
/// `offline` and the role given to another copy, if the record is still
/// at `ask.takeover_version`: the next serving copy, whose server must be
/// reachable, or else the first copy of `ask.was_serving` that is
/// `syncing` and reachable, made `serving`. The version and the map's
/// epoch go up by one.
pub fn move_deciding(
    map: &ClusterMap,
    ask: &DecidingMove<'_>,
) -> Result<DecidingMoved, DecidingError> {
    let DecidingMove {
        region,
        takeover_version,
        dead,
        reachable,
        was_serving,
    } = *ask;
    let (mut next, index) = map
        .next_for_record(region, takeover_version)
        .map_err(|mismatch| match mismatch {
            RecordMismatch::NotReplicated => DecidingError::NotReplicated {
                region: region.to_owned(),
            },
            RecordMismatch::Moved { current, owner } => DecidingError::Moved {
                expected: takeover_version,
                current,
                region: region.to_owned(),
                owner,
            },
        })?;
    let record = &mut next.replica_sets[index];
    let deciding = record
        .copies
        .iter()
        .position(|c| c.state == ReplicaState::Serving);
    let Some(deciding) = deciding.filter(|&i| record.copies[i].server == dead) else {
        return Err(DecidingError::NotDeciding {
            region: region.to_owned(),
            dead: dead.to_owned(),
            deciding: deciding.map_or("none".to_owned(), |i| record.copies[i].server.clone()),
        });
    };
    let reaches = |server: &str| reachable.contains(&server);
    let next_serving = record
        .copies
        .iter()
        .position(|c| c.state == ReplicaState::Serving && c.server != dead);
    let successor = match next_serving {
        // The next serving copy decides as soon as the dead one is out:
        // it must be one the owner reaches.
        Some(i) => reaches(&record.copies[i].server).then_some((i, false)),
        None => record
            .copies
            .iter()
            .position(|c| {
                c.state == ReplicaState::Syncing
                    && was_serving.contains(&c.server.as_str())
                    && reaches(&c.server)
            })
            .map(|i| (i, true)),
    };
    let Some((successor, promoted)) = successor else {
        let copies: Vec<String> = record
            .copies
            .iter()
            .map(|c| format!("{} {}", c.server, c.state))
            .collect();
        return Err(DecidingError::NoSuccessor {
            region: region.to_owned(),
            dead: dead.to_owned(),
            copies: copies.join(", "),
        });
    };
    record.copies[deciding].state = ReplicaState::Offline;
    record.copies[successor].state = ReplicaState::Serving;
    record.version += 1;
    let version = record.version;
    let deciding = record.copies[successor].server.clone();
    let how = if promoted {
        "syncing -> serving (it served until the takeover, which nothing has written since)"
    } else {
        "serving"
    };
    let note = format!(
        "region {region}: deciding copy moved from dead server {dead} (now offline) to {deciding}, \
         {how} (replica set version {version}, map epoch {})",
        next.epoch
    );
    Ok(DecidingMoved {
        map: next,
        deciding,
        promoted,
        version,
        note,
    })
}

/// What moving the deciding role in etcd came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecidingOutcome {
    /// The map names the new deciding copy from this epoch on.
    Moved {
        /// The map's new epoch.
        epoch: u64,
        /// The change, for logs.
        note: String,
    },
    /// The map refuses the change (the record moved on, another copy
    /// decides, no copy may): nothing was written.
    Refused(DecidingError),
}

impl ControlPlane {
    /// Moves a region's deciding role off the copy on a dead server
    /// ([`move_deciding`]) in one transaction against the map's revision
    /// as read; a change elsewhere in the map meanwhile is read again and
    /// decided anew, a change of the region's record refuses.
    pub async fn move_deciding_role(
        &mut self,
        ask: &DecidingMove<'_>,
    ) -> Result<DecidingOutcome, ControlError> {
        let edited = self
            .edit_map(|map| move_deciding(map, ask).map(|moved| (moved.map, moved.note)))
            .await?;
        Ok(match edited {
            Edited::Written(written, note) => DecidingOutcome::Moved {
                epoch: written.map.epoch,
                note,
            },
            Edited::Stopped(refused) => DecidingOutcome::Refused(refused),
        })
    }
}

/// [`ControlPlane::move_deciding_role`] for a caller without async code
/// (the fabric device's takeover thread), as the etcd user of
/// `credentials` when given; blocks until written, refused or failed.
pub fn move_deciding_blocking(
    endpoints: &Endpoints,
    pool: &str,
    credentials: Option<&Credentials>,
    ask: &DecidingMove<'_>,
) -> Result<DecidingOutcome, ControlError> {
    let runtime = crate::blocking::runtime()?;
    runtime.block_on(async {
        let mut plane = ControlPlane::connect(endpoints, pool, credentials).await?;
        plane.move_deciding_role(ask).await
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ownership::take_ownership;

    fn ask<'a>(
        region: &'a str,
        takeover_version: u64,
        dead: &'a str,
        reachable: &'a [&'a str],
        was_serving: &'a [&'a str],
    ) -> DecidingMove<'a> {
        DecidingMove {
            region,
            takeover_version,
            dead,
            reachable,
            was_serving,
        }
    }

    fn replicated(copies: u32) -> ClusterMap {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../configs/default.toml"
        ))
        .expect("configs/default.toml")
        .replace(
            "name = \"default\"",
            &format!("name = \"default\"\nreplicas = {copies}"),
        );
        ClusterMap::new(4, text)
    }

    /// The race: the takeover by B still reached server A (its process
    /// was being torn down), so A's copy kept deciding and B's went
    /// syncing.
    fn taken_with_a_deciding() -> (ClusterMap, u64, Vec<String>) {
        let map = replicated(2);
        let taken = take_ownership(&map, "PA.1", "B", 1, &[]).expect("taken");
        assert_eq!(taken.deciding, "A");
        (taken.map, taken.version, taken.syncing)
    }

    #[test]
    fn a_copy_the_takeover_marked_syncing_decides_once_the_dead_one_is_offline() {
        let (map, version, syncing) = taken_with_a_deciding();
        let was: Vec<&str> = syncing.iter().map(String::as_str).collect();
        let moved = move_deciding(&map, &ask("PA.1", version, "A", &["B"], &was)).expect("moved");
        let after = moved.map.replica_set("PA.1").expect("PA.1");
        assert_eq!(after.state_on("A"), Some(ReplicaState::Offline));
        assert_eq!(after.state_on("B"), Some(ReplicaState::Serving));
        assert_eq!(after.owner, "B");
        assert_eq!((moved.deciding.as_str(), moved.promoted), ("B", true));
        assert_eq!(
            (moved.version, moved.map.epoch),
            (version + 1, map.epoch + 1)
        );
        assert!(moved.note.contains("from dead server A"), "{}", moved.note);
        for other in ["PA.2", "PB.1", "PB.2"] {
            assert_eq!(moved.map.replica_set(other), map.replica_set(other));
        }
    }

    #[test]
    fn a_copy_that_was_syncing_before_the_takeover_or_is_unreachable_is_never_promoted() {
        let (map, version, _) = taken_with_a_deciding();
        // B's copy was syncing before the takeover (not among those the
        // takeover moved): it may lack acknowledged changes.
        let err = move_deciding(&map, &ask("PA.1", version, "A", &["B"], &[])).expect_err("unsafe");
        assert!(matches!(err, DecidingError::NoSuccessor { .. }), "{err:?}");
        assert!(err.to_string().contains("A serving, B syncing"), "{err}");
        // B is not reached either.
        let err =
            move_deciding(&map, &ask("PA.1", version, "A", &[], &["B"])).expect_err("unreached");
        assert!(matches!(err, DecidingError::NoSuccessor { .. }), "{err:?}");
    }

    #[test]
    fn a_record_changed_since_the_takeover_or_deciding_elsewhere_is_left_alone() {
        let (map, version, _) = taken_with_a_deciding();
        assert_eq!(
            move_deciding(&map, &ask("PA.1", version - 1, "A", &["B"], &["B"]),),
            Err(DecidingError::Moved {
                expected: version - 1,
                current: version,
                region: "PA.1".into(),
                owner: "B".into()
            })
        );
        let err =
            move_deciding(&map, &ask("PA.1", version, "B", &["A"], &["A"])).expect_err("not B");
        assert_eq!(
            err,
            DecidingError::NotDeciding {
                region: "PA.1".into(),
                dead: "B".into(),
                deciding: "A".into()
            }
        );
        assert!(matches!(
            move_deciding(&map, &ask("nope", version, "A", &["B"], &["B"]),),
            Err(DecidingError::NotReplicated { .. })
        ));
    }

    #[test]
    fn with_another_serving_copy_it_decides_if_reached_and_nothing_is_promoted() {
        let map = replicated(2);
        // Two serving copies, as before any takeover: the second decides
        // once the first is offline, without a promotion.
        let version = map.replica_set("PA.1").expect("PA.1").version;
        let moved = move_deciding(&map, &ask("PA.1", version, "A", &["B"], &[])).expect("moved");
        assert_eq!((moved.deciding.as_str(), moved.promoted), ("B", false));
        let after = moved.map.replica_set("PA.1").expect("PA.1");
        assert_eq!(after.state_on("A"), Some(ReplicaState::Offline));
        // The next serving copy is not reached: refused, nothing promoted
        // past it.
        let err = move_deciding(&map, &ask("PA.1", version, "A", &[], &[])).expect_err("unreached");
        assert!(matches!(err, DecidingError::NoSuccessor { .. }), "{err:?}");
    }
}
