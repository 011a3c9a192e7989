//! The cluster map as etcd holds it: one JSON document with the map's
//! epoch and the topology (TOML, the same text a topology file holds).

use serde::{Deserialize, Serialize};
use topology::{EnvOverrides, Topology};

use crate::error::ControlError;

/// The cluster map: the fabric's shape and the epoch that names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMap {
    /// Bumped by every change; daemons and clients say which epoch they run.
    pub epoch: u64,
    /// The topology, as TOML.
    pub topology: String,
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

    /// The topology, loaded and validated; errors name etcd `key` and the
    /// epoch as the file.
    pub fn topology_at(&self, key: &str) -> Result<Topology, ControlError> {
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
        let map = ClusterMap {
            epoch: 3,
            topology: default_text(),
        };
        let back = ClusterMap::from_json("/k", map.to_json().as_bytes()).unwrap();
        assert_eq!(back, map);
        assert_eq!(back.topology_at("/k").unwrap().servers.len(), 2);
    }

    #[test]
    fn an_invalid_map_is_refused_naming_the_key_and_epoch() {
        let err = ClusterMap::from_json("/k", b"{\"epoch\":1}").unwrap_err();
        assert!(err.to_string().contains("/k"), "{err}");
        let broken = ClusterMap {
            epoch: 7,
            topology: default_text().replace("extent_size", "extent_sizes"),
        };
        let err = ClusterMap::from_json("/k", broken.to_json().as_bytes()).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("etcd /k (epoch 7)"), "{text}");
    }
}
