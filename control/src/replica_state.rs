//! The state of every replicated region's copies, as the map records it.
//!
//! Where the copies are is the topology's business
//! ([`topology::replicas`]); what each copy may be used for is the map's:
//!
//! - `serving`: the copy holds every acknowledged write; it takes writes and
//!   may answer reads;
//! - `syncing`: the copy takes writes but may lack older ones (it was added,
//!   or came back); it answers no read until a resync makes it `serving`;
//! - `offline`: the copy takes nothing (its server died or was cut off).
//!
//! Each replicated region has one record: its copies' states (one per
//! server of its set, primary first), its **owner** fabric device (the one
//! that orders its mutations) and a **version** that every change of the
//! record bumps, in the same transaction as the map's epoch. A region with
//! one copy has no record. A map whose records do not match its topology's
//! sets is invalid and refused by every reader.

use serde::{Deserialize, Serialize};
use topology::{ReplicaSet, Topology};

/// What a copy of a region may be used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReplicaState {
    /// Holds every acknowledged write: takes writes, answers reads.
    Serving,
    /// Takes writes, may lack older ones: answers no read until resynced.
    Syncing,
    /// Takes nothing.
    Offline,
}

impl ReplicaState {
    /// `serving`, `syncing` or `offline`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Serving => "serving",
            Self::Syncing => "syncing",
            Self::Offline => "offline",
        }
    }

    /// The state named `text`, if it names one.
    pub fn parse(text: &str) -> Option<Self> {
        [Self::Serving, Self::Syncing, Self::Offline]
            .into_iter()
            .find(|s| s.as_str() == text)
    }
}

impl std::fmt::Display for ReplicaState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One copy's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyRecord {
    /// The server holding the copy.
    pub server: String,
    /// What it may be used for.
    pub state: ReplicaState,
}

/// One replicated region's copies, owner and version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaSetRecord {
    /// The region.
    pub region: String,
    /// Bumped by every change of this record.
    pub version: u64,
    /// The fabric device that orders the region's mutations.
    pub owner: String,
    /// One per copy, in the topology's order (primary first).
    pub copies: Vec<CopyRecord>,
}

impl ReplicaSetRecord {
    /// The state of the copy on `server`, if it holds one.
    pub fn state_on(&self, server: &str) -> Option<ReplicaState> {
        self.copies
            .iter()
            .find(|c| c.server == server)
            .map(|c| c.state)
    }

    /// How many copies are serving.
    pub fn serving(&self) -> usize {
        self.copies
            .iter()
            .filter(|c| c.state == ReplicaState::Serving)
            .count()
    }
}

/// The owner `region` gets when its record is new: the fabric devices in
/// turn ([`Topology::default_owners`], which topology validation checks
/// every client granted the region reaches).
fn default_owner(topology: &Topology, region: &str) -> String {
    topology
        .default_owners()
        .into_iter()
        .find(|(r, _)| r.as_str() == region)
        .map(|(_, owner)| owner.to_string())
        .unwrap_or_default()
}

fn servers_of(set: &ReplicaSet) -> Vec<String> {
    set.replicas.iter().map(|r| r.server.to_string()).collect()
}

/// The records of `topology` when the map is first written: every copy
/// serving (a new pool's copies are all empty, hence equal), version 1,
/// owners in turn over the fabric devices.
pub fn initial(topology: &Topology) -> Vec<ReplicaSetRecord> {
    derive(topology, None).0
}

/// The records of `topology` following `previous` (the map it replaces,
/// with its topology): a copy that stays keeps its state; a copy new to a
/// region that was there before starts `syncing` (it lacks the region's
/// data); a new region's copies are all `serving` (all empty). A record
/// whose copies or owner change gets the next version; the owner stays
/// unless its device is gone. Returns the records and one note per region
/// whose copies changed.
pub fn derive(
    topology: &Topology,
    previous: Option<(&Topology, &[ReplicaSetRecord])>,
) -> (Vec<ReplicaSetRecord>, Vec<String>) {
    let mut records = Vec::new();
    let mut notes = Vec::new();
    let sets = topology.replica_sets();
    for set in sets.iter().filter(|s| s.is_replicated()) {
        let region = set.region.to_string();
        let servers = servers_of(set);
        let before = previous.and_then(|(_, records)| records.iter().find(|r| r.region == region));
        let existed =
            previous.is_some_and(|(old, _)| old.regions().any(|p| p.region.id == set.region));
        let copies: Vec<CopyRecord> = servers
            .iter()
            .map(|server| {
                let kept = before.and_then(|b| b.state_on(server));
                let state = match (kept, existed) {
                    (Some(state), _) => state,
                    (None, true) => ReplicaState::Syncing,
                    (None, false) => ReplicaState::Serving,
                };
                CopyRecord {
                    server: server.clone(),
                    state,
                }
            })
            .collect();
        // A region that had one copy: that copy is the primary and serves.
        let copies = match (before, existed) {
            (None, true) => copies
                .into_iter()
                .enumerate()
                .map(|(i, mut c)| {
                    if i == 0 {
                        c.state = ReplicaState::Serving;
                    }
                    c
                })
                .collect(),
            _ => copies,
        };
        let owner = before
            .map(|b| b.owner.clone())
            .filter(|o| topology.fabric_devices.iter().any(|d| d.id.as_str() == o))
            .unwrap_or_else(|| default_owner(topology, &region));
        let version = match before {
            Some(b) if b.copies == copies && b.owner == owner => b.version,
            Some(b) => b.version + 1,
            None => 1,
        };
        if let Some(b) = before
            && b.copies != copies
        {
            let listed: Vec<String> = copies
                .iter()
                .map(|c| format!("{} {}", c.server, c.state))
                .collect();
            notes.push(format!(
                "region {region}: copies now {} (version {version})",
                listed.join(", ")
            ));
        } else if before.is_none() && existed {
            notes.push(format!(
                "region {region} is replicated from now on: its new copies start syncing"
            ));
        }
        records.push(ReplicaSetRecord {
            region,
            version,
            owner,
            copies,
        });
    }
    (records, notes)
}

/// Why a map's records do not match its topology.
pub fn mismatch(topology: &Topology, records: &[ReplicaSetRecord]) -> Option<String> {
    let sets = topology.replica_sets();
    let replicated: Vec<&ReplicaSet> = sets.iter().filter(|s| s.is_replicated()).collect();
    for record in records {
        let Some(set) = replicated
            .iter()
            .find(|s| s.region.as_str() == record.region)
        else {
            return Some(format!(
                "replica_sets records region {:?}, which has no copies to record (unknown or \
                 single-copy)",
                record.region
            ));
        };
        let recorded: Vec<&str> = record.copies.iter().map(|c| c.server.as_str()).collect();
        let placed = servers_of(set);
        if recorded != placed {
            return Some(format!(
                "replica_sets records region {} on servers {} but the topology places its \
                 copies on {}",
                record.region,
                recorded.join(", "),
                placed.join(", ")
            ));
        }
        if !topology
            .fabric_devices
            .iter()
            .any(|d| d.id.as_str() == record.owner)
        {
            return Some(format!(
                "replica_sets gives region {} the owner {:?}, which is no fabric device of the \
                 map",
                record.region, record.owner
            ));
        }
        if records.iter().filter(|r| r.region == record.region).count() > 1 {
            return Some(format!(
                "replica_sets records region {} twice",
                record.region
            ));
        }
    }
    replicated
        .iter()
        .find(|set| !records.iter().any(|r| r.region == set.region.as_str()))
        .map(|set| {
            format!(
                "region {} has {} copies but replica_sets has no record of their states; \
                 write maps with `pmemctl cluster`, which records them",
                set.region,
                set.replicas.len()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_pool_records_every_copy_serving_with_owners_in_turn() {
        assert!(initial(&testkit::default_topology_with("")).is_empty());
        let records = initial(&testkit::default_topology_with("replicas = 2"));
        assert_eq!(records.len(), 4);
        let owners: Vec<&str> = records.iter().map(|r| r.owner.as_str()).collect();
        assert_eq!(owners, ["A", "B", "A", "B"]);
        assert!(records.iter().all(|r| r.version == 1 && r.serving() == 2));
        assert_eq!(records[0].copies[1].server, "B");
        assert_eq!(
            mismatch(&testkit::default_topology_with("replicas = 2"), &records),
            None
        );
    }

    #[test]
    fn copies_added_to_existing_regions_start_syncing_and_bump_the_version() {
        let one = testkit::default_topology_with("");
        let two = testkit::default_topology_with("replicas = 2");
        let (records, notes) = derive(&two, Some((&one, &[])));
        assert_eq!(records[0].state_on("A"), Some(ReplicaState::Serving));
        assert_eq!(records[0].state_on("B"), Some(ReplicaState::Syncing));
        assert_eq!(notes.len(), 4, "{notes:?}");
        // Unchanged topology: the records stay, versions too.
        let (again, notes) = derive(&two, Some((&two, &records)));
        assert_eq!(again, records);
        assert!(notes.is_empty());
    }

    #[test]
    fn records_that_do_not_match_the_topology_are_named() {
        let two = testkit::default_topology_with("replicas = 2");
        let mut records = initial(&two);
        let missing = mismatch(&two, &records[1..]).unwrap();
        assert!(missing.contains("region PA.1 has 2 copies"), "{missing}");
        records[0].copies[1].server = "A".into();
        let wrong = mismatch(&two, &records).unwrap();
        assert!(
            wrong.contains("on servers A, A but the topology places its copies on A, B"),
            "{wrong}"
        );
        let single = mismatch(&testkit::default_topology_with(""), &initial(&two)).unwrap();
        assert!(single.contains("\"PA.1\", which has no copies"), "{single}");
        let mut owned = initial(&two);
        owned[0].owner = "Z".into();
        assert!(mismatch(&two, &owned).unwrap().contains("owner \"Z\""));
    }
}
