//! The cluster map as etcd holds it: one JSON document with the map's
//! epoch, the topology (TOML, the same text a topology file holds) and,
//! for a pool with replicated regions, the state of their copies.

use serde::{Deserialize, Serialize};
use topology::{EnvOverrides, Topology};

use crate::error::ControlError;
use crate::replica_state::{self, ReplicaSetRecord};

/// The cluster map: the fabric's shape and the epoch that names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMap {
    /// Bumped by every change; daemons and clients say which epoch they run.
    pub epoch: u64,
    /// The topology, as TOML.
    pub topology: String,
    /// One record per region with more than one copy: the copies' states,
    /// the region's owner device and the record's version. Absent from the
    /// document when no region is replicated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replica_sets: Vec<ReplicaSetRecord>,
}

/// Why a region's record is not the one an edit was decided on
/// ([`ClusterMap::next_for_record`]); each caller says it in its own error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RecordMismatch {
    /// The region has no record: it is not replicated.
    NotReplicated,
    /// The record changed since: its version and owner now.
    Moved {
        /// The record's version now.
        current: u64,
        /// The region's owner device now.
        owner: String,
    },
}

/// A map with the etcd revision it was last changed at: what a change must
/// compare against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionedMap {
    /// The map.
    pub map: ClusterMap,
    /// The etcd `mod_revision` of its key.
    pub revision: i64,
}

impl ClusterMap {
    /// The first map of `topology` at `epoch`: every copy of a replicated
    /// region serving. A topology that does not load gets no records (the
    /// map is refused where it is validated).
    pub fn new(epoch: u64, topology: impl Into<String>) -> Self {
        let topology = topology.into();
        let replica_sets = Topology::from_toml_str("new map", &topology, &EnvOverrides::None)
            .map(|t| replica_state::initial(&t))
            .unwrap_or_default();
        Self {
            epoch,
            topology,
            replica_sets,
        }
    }

    /// The map that replaces this one with `topology` at the next epoch:
    /// copies that stay keep their state, new copies of existing regions
    /// start syncing ([`replica_state::derive`]). Returns it with one note
    /// per region whose copies changed. `key` names this map in errors.
    pub fn next(&self, key: &str, topology: &str) -> Result<(Self, Vec<String>), ControlError> {
        let old = self.topology_at(key)?;
        let next = Self {
            epoch: self.epoch + 1,
            topology: topology.to_owned(),
            replica_sets: Vec::new(),
        };
        let new = next.loaded(key)?;
        let (replica_sets, notes) = replica_state::derive(&new, Some((&old, &self.replica_sets)));
        Ok((
            Self {
                replica_sets,
                ..next
            },
            notes,
        ))
    }

    /// The record of `region`'s copies, if it is replicated.
    pub fn replica_set(&self, region: &str) -> Option<&ReplicaSetRecord> {
        self.replica_sets.iter().find(|r| r.region == region)
    }

    /// This map at its next epoch, for an edit of `region`'s record that
    /// was decided on the record's `version`: the new map and the index
    /// of the record in it, or why the edit cannot go ahead.
    pub(crate) fn next_for_record(
        &self,
        region: &str,
        version: u64,
    ) -> Result<(ClusterMap, usize), RecordMismatch> {
        let index = self
            .replica_sets
            .iter()
            .position(|r| r.region == region)
            .ok_or(RecordMismatch::NotReplicated)?;
        let record = &self.replica_sets[index];
        if record.version != version {
            return Err(RecordMismatch::Moved {
                current: record.version,
                owner: record.owner.clone(),
            });
        }
        let mut next = self.clone();
        next.epoch += 1;
        Ok((next, index))
    }

    /// The document stored in etcd.
    pub fn to_json(&self) -> String {
        // A struct of a number and a string always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// A map read from `key`: its JSON, then its topology, loaded and
    /// validated (nothing invalid is ever handed to a daemon).
    pub fn from_json(key: &str, bytes: &[u8]) -> Result<Self, ControlError> {
        let map: ClusterMap =
            serde_json::from_slice(bytes).map_err(|source| ControlError::BadDocument {
                key: key.to_owned(),
                source,
            })?;
        map.topology_at(key)?;
        Ok(map)
    }

    /// The topology, loaded and validated, with replica records that
    /// match it; errors name etcd `key` and the epoch as the file.
    pub fn topology_at(&self, key: &str) -> Result<Topology, ControlError> {
        let topology = self.loaded(key)?;
        if let Some(why) = replica_state::mismatch(&topology, &self.replica_sets) {
            return Err(ControlError::InvalidMap {
                source_name: format!("etcd {key} (epoch {})", self.epoch),
                why,
            });
        }
        Ok(topology)
    }

    /// The topology, loaded and validated (its replica records unchecked).
    fn loaded(&self, key: &str) -> Result<Topology, ControlError> {
        let source = format!("etcd {key} (epoch {})", self.epoch);
        let topology = Topology::from_toml_str(&source, &self.topology, &EnvOverrides::None)
            .map_err(|e| ControlError::InvalidMap {
                source_name: source.clone(),
                why: e.to_string(),
            })?;
        topology
            .validate()
            .map_err(|errors| ControlError::InvalidMap {
                source_name: source,
                why: errors.to_string(),
            })?;
        Ok(topology)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default_text() -> String {
        std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../configs/default.toml"
        ))
        .unwrap()
    }

    #[test]
    fn a_map_round_trips_through_its_document() {
        let map = ClusterMap::new(3, default_text());
        let back = ClusterMap::from_json("/k", map.to_json().as_bytes()).unwrap();
        assert_eq!(back, map);
        assert_eq!(back.topology_at("/k").unwrap().servers.len(), 2);
    }

    #[test]
    fn an_invalid_map_is_refused_naming_the_key_and_epoch() {
        let err = ClusterMap::from_json("/k", b"{\"epoch\":1}").unwrap_err();
        assert!(err.to_string().contains("/k"), "{err}");
        let broken = ClusterMap::new(7, default_text().replace("extent_size", "extent_sizes"));
        let err = ClusterMap::from_json("/k", broken.to_json().as_bytes()).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("etcd /k (epoch 7)"), "{text}");
    }

    #[test]
    fn a_replicated_map_records_its_copies_and_refuses_records_that_do_not_match() {
        let text = default_text().replace("name = \"default\"", "name = \"default\"\nreplicas = 2");
        let map = ClusterMap::new(1, text.clone());
        assert_eq!(map.replica_sets.len(), 4);
        let json = map.to_json();
        assert!(json.contains("\"replica_sets\""), "{json}");
        assert_eq!(ClusterMap::from_json("/k", json.as_bytes()).unwrap(), map);
        // A single-copy map's document is what it always was.
        assert!(
            !ClusterMap::new(1, default_text())
                .to_json()
                .contains("replica_sets")
        );
        let bare = ClusterMap {
            replica_sets: Vec::new(),
            ..map
        };
        let err = ClusterMap::from_json("/k", bare.to_json().as_bytes()).unwrap_err();
        assert!(
            err.to_string().contains("no record of their states"),
            "{err}"
        );
    }
}
