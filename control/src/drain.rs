//! Draining a server: every copy it holds moved to other servers, one map
//! change at a time, so that it can leave the map with nothing lost.
//!
//! [`next_step`] reads the map as it is and names the next thing to do for
//! the drained server; the caller writes the map it gives (one transaction
//! against the revision it read), or waits, and asks again. Each step is
//! derived from the map alone, so a drain interrupted anywhere continues
//! where it was when it runs again. The kinds of step come in this order,
//! each over every region with a copy on the server (config order) before
//! the next kind:
//!
//! 1. **Pin** the region's address (`address = …` in its table) when the
//!    layout places it: its table may move to another server, and a pinned
//!    region moves neither itself nor any other region.
//! 2. **Add** a copy on another server, while the region has fewer copies
//!    besides the drained one than it should keep (its own `replicas`
//!    count, else the pool's, at least 2 for a replicated region, 1 for a
//!    region with a single copy): a server of a failure domain no copy of
//!    the region uses, not draining, with PMEM. The copy is written into
//!    the region's backup list and starts `syncing`; the region's owner
//!    device resyncs it. A single-copy region becomes replicated by this
//!    change (its owner device then orders its requests). All adds come before any wait, so a server
//!    taking several copies opens them in one restart (a server opens the
//!    copies a map adds to it at its next start).
//! 3. **Wait** while another copy of such a region is `syncing` or
//!    `offline`; an `offline` copy whose server is live (it may have been
//!    taken out for a refused request) is **revived**: marked `syncing`,
//!    so that its owner resyncs it. A copy is dropped only when every other
//!    copy serves.
//! 4. **Drop** the drained server's copy, once another copy serves (every
//!    serving copy holds every acknowledged write): from the backup list,
//!    or, when it is the primary, by moving the region's table to a
//!    serving copy's place. A move must not renumber regions (servers
//!    number the regions they serve at start, and devices address them by
//!    number), so the new primary is a copy whose device is next to the
//!    drained server's in config order, and a move that would renumber is
//!    refused, naming the regions. A region that had a single copy has
//!    one again afterwards (on its new server), as before the drain.
//! 5. **Remove** the server from the map once it holds no copy.

use toml::{Table, Value};
use topology::{Layout, RegionReplicas, ReplicaSet, Server, Topology};

use crate::edit::{self, EditError, array, id_of};
use crate::error::ControlError;
use crate::map::ClusterMap;
use crate::replica_state::ReplicaState;

/// The most copies a region may have.
const MAX_COPIES: usize = topology::replicas::MAX_REPLICAS as usize;

/// What the drain does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Pin `region` at `address`.
    Pin {
        /// The region.
        region: String,
        /// Its start, as the layout placed it.
        address: u64,
    },
    /// Add a copy of `region` on `server`, starting `syncing`.
    Add {
        /// The region.
        region: String,
        /// The server taking the copy.
        server: String,
    },
    /// Wait until `region`'s copy on `server` serves.
    Wait {
        /// The region.
        region: String,
        /// The server of its syncing copy.
        server: String,
    },
    /// Mark `region`'s offline copy on live `server` syncing.
    Revive {
        /// The region.
        region: String,
        /// The server of the offline copy.
        server: String,
    },
    /// Drop the drained server's copy of `region`.
    Drop {
        /// The region.
        region: String,
    },
    /// Remove the drained server from the map: it holds no copy.
    Remove,
}

/// The next step, the map that makes it (none for a wait) and a line for
/// the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// What is done.
    pub step: Step,
    /// The whole next map (next epoch), to write against the revision read.
    pub map: Option<ClusterMap>,
    /// What the step does, for the operator.
    pub note: String,
}

/// Why a drain cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// The map has no such server.
    #[error("the map (epoch {epoch}) has no server {server}")]
    UnknownServer {
        /// The server asked for.
        server: String,
        /// The map's epoch.
        epoch: u64,
    },
    /// No server may take a copy of the region.
    #[error(
        "no server can take a copy of region {region} from {server}, so nothing was changed: \
         {}; add a server in another failure domain (`pmemctl cluster add-server`)",
        why.join("; ")
    )]
    NoPlace {
        /// The region.
        region: String,
        /// The drained server.
        server: String,
        /// Why each other server cannot.
        why: Vec<String>,
    },
    /// No other copy serves: dropping the drained one would lose writes.
    #[error(
        "region {region}: no copy but {server}'s serves (copies: {states}), so dropping it \
         could lose acknowledged writes; nothing was changed. Bring another copy to serving \
         first (`pmemctl cluster mark-replica REGION SERVER syncing`, then the owner's resync)"
    )]
    NoOtherServing {
        /// The region.
        region: String,
        /// The drained server.
        server: String,
        /// Every copy's server and state.
        states: String,
    },
    /// Moving the region's table would move or renumber regions.
    #[error("region {region}: {why}; nothing was changed")]
    WouldMove {
        /// The region.
        region: String,
        /// What would move.
        why: String,
    },
    /// The change makes an invalid map.
    #[error("the drain's change of region {region} makes an invalid map; nothing was changed")]
    Invalid {
        /// The region.
        region: String,
        /// Why.
        #[source]
        source: ControlError,
    },
    /// The map's text cannot be edited.
    #[error(transparent)]
    Edit(#[from] EditError),
    /// The map read is invalid.
    #[error(transparent)]
    Control(#[from] ControlError),
}

/// The regions with a single copy, on `server`, in `map` (read from etcd
/// `key`): what a drain beginning now records, so that they keep one copy
/// (see [`next_step`]'s `single`).
pub fn single_copies(map: &ClusterMap, key: &str, server: &str) -> Result<Vec<String>, DrainError> {
    let topology = map.topology_at(key)?;
    Ok(topology
        .replica_sets()
        .into_iter()
        .filter(|s| !s.is_replicated() && s.primary().server.as_str() == server)
        .map(|s| s.region.to_string())
        .collect())
}

/// The next step of draining `server` off `map` (read from etcd `key`);
/// servers in `avoid` (draining or removed ones) take no copy; servers in
/// `live` have a liveness record (an offline copy of theirs is revived);
/// regions in `single` had a single copy when the drain began (from
/// [`single_copies`]) and get one copy elsewhere, not two.
pub fn next_step(
    map: &ClusterMap,
    key: &str,
    server: &str,
    avoid: &[String],
    live: &[String],
    single: &[String],
) -> Result<Planned, DrainError> {
    let topology = map.topology_at(key)?;
    let Some(drained) = topology.servers.iter().find(|s| s.id.as_str() == server) else {
        return Err(DrainError::UnknownServer {
            server: server.to_owned(),
            epoch: map.epoch,
        });
    };
    let sets: Vec<ReplicaSet> = topology
        .replica_sets()
        .into_iter()
        .filter(|s| s.on(&drained.id).is_some())
        .collect();
    if sets.is_empty() {
        return remove(map, key, server);
    }
    let layout = Layout::new(&topology).map_err(|e| ControlError::InvalidMap {
        source_name: format!("etcd {key} (epoch {})", map.epoch),
        why: e.to_string(),
    })?;
    let drain = Drain {
        map,
        key,
        topology: &topology,
        server,
        avoid,
    };
    for set in &sets {
        let Some(entry) = layout.entry_by_id(&set.region) else {
            continue;
        };
        if region_of(&topology, set).and_then(|r| r.address).is_none() {
            return drain.pin(set, entry.start.get());
        }
    }
    for set in &sets {
        let others = set.replicas.len() - 1;
        if others < wanted(&topology, set, single) && set.replicas.len() < MAX_COPIES {
            return drain.add(set);
        }
    }
    for set in &sets {
        if let Some(copy) = drain.in_state(set, ReplicaState::Offline) {
            let region = set.region.as_str();
            if live.contains(&copy) {
                let marked = crate::edit::mark_replica(map, region, &copy, ReplicaState::Syncing)?;
                return Ok(Planned {
                    step: Step::Revive {
                        region: region.to_owned(),
                        server: copy.clone(),
                    },
                    map: Some(marked.map),
                    note: format!(
                        "region {region}: the copy on {copy} is offline and its server is live: \
                         marked syncing, so that the owner device resyncs it"
                    ),
                });
            }
            let note = format!(
                "region {region}: waiting for the copy on {copy} (offline: its owner device \
                 marks it syncing once server {copy} runs and connects; a server opens copies \
                 added to it at its start)"
            );
            return Ok(Planned {
                step: Step::Wait {
                    region: region.to_owned(),
                    server: copy,
                },
                map: None,
                note,
            });
        }
        if let Some(copy) = drain.in_state(set, ReplicaState::Syncing) {
            let note = format!(
                "region {}: waiting for the copy on {copy} to serve (syncing; the owner device \
                 copies it)",
                set.region
            );
            return Ok(Planned {
                step: Step::Wait {
                    region: set.region.to_string(),
                    server: copy,
                },
                map: None,
                note,
            });
        }
    }
    let mut refused = None;
    for set in &sets {
        match drain.drop_copy(set) {
            Ok(planned) => return Ok(planned),
            Err(e @ DrainError::WouldMove { .. }) => refused = refused.or(Some(e)),
            Err(e) => return Err(e),
        }
    }
    Err(refused.unwrap_or_else(|| DrainError::WouldMove {
        region: sets[0].region.to_string(),
        why: "no step found".to_owned(),
    }))
}

/// The copies a region keeps besides a drained one: its own count, else
/// the pool's, at least 2 for a replicated region (it stays replicated);
/// 1 for a region with a single copy, or one in `single` (it had one when
/// the drain began, and the drain's add made it replicated meanwhile).
fn wanted(topology: &Topology, set: &ReplicaSet, single: &[String]) -> usize {
    if !set.is_replicated() || single.iter().any(|r| r == set.region.as_str()) {
        return 1;
    }
    let count = match region_of(topology, set).and_then(|r| r.replicas.as_ref()) {
        Some(RegionReplicas::Count(n)) => *n,
        _ => topology.pool.replicas.unwrap_or(1),
    };
    usize::try_from(count).unwrap_or(MAX_COPIES).max(2)
}

fn region_of<'t>(topology: &'t Topology, set: &ReplicaSet) -> Option<&'t topology::Region> {
    topology
        .regions()
        .find(|p| p.region.id == set.region)
        .map(|p| p.region)
}

/// `SERVER:SOCKET:DEVICE`.
fn place(server: &str, socket: &str, device: &str) -> String {
    format!("{server}:{socket}:{device}")
}

fn replica_place(r: &topology::Replica) -> String {
    place(r.server.as_str(), r.socket.as_str(), r.device.as_str())
}

/// What one drain step needs to know.
struct Drain<'a> {
    map: &'a ClusterMap,
    key: &'a str,
    topology: &'a Topology,
    server: &'a str,
    avoid: &'a [String],
}

impl Drain<'_> {
    /// The state of `set`'s copy on `server` in the map.
    fn state(&self, set: &ReplicaSet, server: &str) -> Option<ReplicaState> {
        self.map
            .replica_set(set.region.as_str())
            .and_then(|r| r.state_on(server))
    }

    /// The server of a copy of `set` in `state`, other than the drained one.
    fn in_state(&self, set: &ReplicaSet, state: ReplicaState) -> Option<String> {
        set.replicas
            .iter()
            .map(|r| r.server.as_str())
            .filter(|s| *s != self.server)
            .find(|s| self.state(set, s) == Some(state))
            .map(str::to_owned)
    }

    fn pin(&self, set: &ReplicaSet, address: u64) -> Result<Planned, DrainError> {
        let region = set.region.as_str();
        let mut table = edit::parse("the map", &self.map.topology)?;
        if let Some(t) = region_table(&mut table, region) {
            t.insert("address".to_owned(), Value::String(format!("{address:#x}")));
        }
        let map = self.checked(region, &table)?;
        Ok(Planned {
            step: Step::Pin {
                region: region.to_owned(),
                address,
            },
            map: Some(map),
            note: format!(
                "region {region}: address pinned at {address:#x} (its table may move; no region \
                 moves)"
            ),
        })
    }

    fn add(&self, set: &ReplicaSet) -> Result<Planned, DrainError> {
        let region = set.region.as_str();
        let (server, at) = self.target(set)?;
        let mut table = edit::parse("the map", &self.map.topology)?;
        let mut backups: Vec<String> = set.backups().iter().map(replica_place).collect();
        backups.push(at.clone());
        if let Some(t) = region_table(&mut table, region) {
            set_backups(t, &backups, self.topology);
        }
        let map = self.checked(region, &table)?;
        Ok(Planned {
            step: Step::Add {
                region: region.to_owned(),
                server: server.clone(),
            },
            map: Some(map),
            note: format!(
                "region {region}: copy added on {server} ({at}), syncing; the owner device \
                 copies it (server {server} opens it at its next start if it runs already)"
            ),
        })
    }

    /// Where a new copy of `set` goes: next to the drained server in config
    /// order when the drained copy is the primary (so its table can move
    /// there), else by the placement rule's walk after the primary.
    fn target(&self, set: &ReplicaSet) -> Result<(String, String), DrainError> {
        let servers = &self.topology.servers;
        let domains: Vec<(&str, &str)> = set
            .replicas
            .iter()
            .filter_map(|r| {
                let s = servers.iter().find(|s| s.id == r.server)?;
                Some((s.failure_domain(), r.server.as_str()))
            })
            .collect();
        let mut why = Vec::new();
        let fits = |s: &Server, why: &mut Vec<String>| -> bool {
            let id = s.id.as_str();
            if set.on(&s.id).is_some() {
                return false;
            }
            if self.avoid.iter().any(|a| a == id) {
                why.push(format!("{id} is draining or removed"));
                return false;
            }
            if let Some((domain, holder)) = domains.iter().find(|(d, _)| *d == s.failure_domain()) {
                why.push(format!(
                    "{id} is in failure domain {domain:?}, which the copy on {holder} uses"
                ));
                return false;
            }
            if !s.sockets.iter().any(|k| !k.devices.is_empty()) {
                why.push(format!("{id} has no PMEM device"));
                return false;
            }
            true
        };
        let primary_here = set.primary().server.as_str() == self.server;
        let bridged = set
            .backups()
            .iter()
            .any(|r| self.bridge_places().contains(&replica_place(r)));
        if primary_here && !bridged {
            for at in self.bridge_places() {
                let name = at.split(':').next().unwrap_or_default();
                if let Some(s) = servers.iter().find(|s| s.id.as_str() == name)
                    && fits(s, &mut Vec::new())
                {
                    return Ok((name.to_owned(), at));
                }
            }
        }
        let start = usize::from(set.primary().server_index);
        for step in 1..servers.len() {
            let s = &servers[(start + step) % servers.len()];
            if !fits(s, &mut why) {
                continue;
            }
            let same = usize::from(set.primary().socket_index);
            let socket = match s.sockets.get(same) {
                Some(k) if !k.devices.is_empty() => k,
                _ => match s.sockets.iter().find(|k| !k.devices.is_empty()) {
                    Some(k) => k,
                    None => continue,
                },
            };
            let device = &socket.devices[0];
            return Ok((
                s.id.to_string(),
                place(s.id.as_str(), socket.id.as_str(), device.id.as_str()),
            ));
        }
        Err(DrainError::NoPlace {
            region: set.region.to_string(),
            server: self.server.to_owned(),
            why,
        })
    }

    /// The devices a table of the drained server can move to without
    /// renumbering a region: the last device of the servers before it up
    /// to the first that holds regions, and the first device of the
    /// servers after it up to the first that holds regions.
    fn bridge_places(&self) -> Vec<String> {
        let servers = &self.topology.servers;
        let Some(at) = servers.iter().position(|s| s.id.as_str() == self.server) else {
            return Vec::new();
        };
        let holds = |s: &Server| {
            s.sockets
                .iter()
                .any(|k| k.devices.iter().any(|d| !d.regions.is_empty()))
        };
        let mut places = Vec::new();
        for s in servers[..at].iter().rev() {
            if let Some((k, d)) = s
                .sockets
                .iter()
                .flat_map(|k| k.devices.iter().map(move |d| (k, d)))
                .last()
            {
                places.push(place(s.id.as_str(), k.id.as_str(), d.id.as_str()));
            }
            if holds(s) {
                break;
            }
        }
        for s in &servers[at + 1..] {
            if let Some((k, d)) = s
                .sockets
                .iter()
                .flat_map(|k| k.devices.iter().map(move |d| (k, d)))
                .next()
            {
                places.push(place(s.id.as_str(), k.id.as_str(), d.id.as_str()));
            }
            if holds(s) {
                break;
            }
        }
        places
    }

    fn drop_copy(&self, set: &ReplicaSet) -> Result<Planned, DrainError> {
        let region = set.region.as_str();
        let serving: Vec<&topology::Replica> = set
            .replicas
            .iter()
            .filter(|r| r.server.as_str() != self.server)
            .filter(|r| self.state(set, r.server.as_str()) == Some(ReplicaState::Serving))
            .collect();
        if serving.is_empty() {
            let states: Vec<String> = set
                .replicas
                .iter()
                .map(|r| {
                    let state = self
                        .state(set, r.server.as_str())
                        .map_or("unrecorded", ReplicaState::as_str);
                    format!("{} {state}", r.server)
                })
                .collect();
            return Err(DrainError::NoOtherServing {
                region: region.to_owned(),
                server: self.server.to_owned(),
                states: states.join(", "),
            });
        }
        let mut table = edit::parse("the map", &self.map.topology)?;
        if set.primary().server.as_str() != self.server {
            let backups: Vec<String> = set
                .backups()
                .iter()
                .filter(|r| r.server.as_str() != self.server)
                .map(replica_place)
                .collect();
            if let Some(t) = region_table(&mut table, region) {
                set_backups(t, &backups, self.topology);
            }
            let map = self.checked(region, &table)?;
            return Ok(self.dropped(region, map, None));
        }
        // The primary: its table moves to a serving copy's place, one next
        // to the drained server first.
        let bridges = self.bridge_places();
        let mut candidates = serving;
        candidates.sort_by_key(|r| !bridges.contains(&replica_place(r)));
        let mut refused = None;
        for new in candidates {
            let mut table = table.clone();
            let backups: Vec<String> = set
                .backups()
                .iter()
                .filter(|r| r.server != new.server)
                .map(replica_place)
                .collect();
            let Some(mut moved) = take_region(&mut table, region) else {
                break;
            };
            set_backups(&mut moved, &backups, self.topology);
            let front = servers_after(self.topology, self.server, new.server.as_str());
            put_region(&mut table, new, moved, front);
            match self.checked(region, &table) {
                Ok(map) => return Ok(self.dropped(region, map, Some(new.server.as_str()))),
                Err(e @ DrainError::WouldMove { .. }) => refused = refused.or(Some(e)),
                Err(e) => return Err(e),
            }
        }
        Err(refused.unwrap_or_else(|| DrainError::WouldMove {
            region: region.to_owned(),
            why: "its table is not in the map".to_owned(),
        }))
    }

    fn dropped(&self, region: &str, map: ClusterMap, moved_to: Option<&str>) -> Planned {
        let copies = map.replica_set(region).map_or_else(
            || "copies now one (a single copy again)".to_owned(),
            |r| {
                let copies: Vec<String> = r
                    .copies
                    .iter()
                    .map(|c| format!("{} {}", c.server, c.state))
                    .collect();
                format!("copies now {}", copies.join(", "))
            },
        );
        let moved = moved_to.map_or_else(String::new, |to| {
            format!(" (its table moved to {to}, now the primary)")
        });
        Planned {
            step: Step::Drop {
                region: region.to_owned(),
            },
            map: Some(map),
            note: format!(
                "region {region}: copy on {} dropped{moved}; {copies}",
                self.server
            ),
        }
    }

    /// The next map with `table` as its topology, refused when it is
    /// invalid or moves or renumbers a region.
    fn checked(&self, region: &str, table: &Table) -> Result<ClusterMap, DrainError> {
        let text = toml::to_string(table).map_err(EditError::Write)?;
        let invalid = |source| DrainError::Invalid {
            region: region.to_owned(),
            source,
        };
        let (next, _) = self.map.next(self.key, &text).map_err(invalid)?;
        let after = next.topology_at(self.key).map_err(invalid)?;
        let layout_error = |e: topology::LayoutError| {
            invalid(ControlError::InvalidMap {
                source_name: format!("the drain's change of region {region}"),
                why: e.to_string(),
            })
        };
        let before = Layout::new(self.topology).map_err(layout_error)?;
        let after = Layout::new(&after).map_err(layout_error)?;
        let mut moved = Vec::new();
        for old in before.entries() {
            match after.entry_by_id(&old.region_id) {
                Some(new) if new.start == old.start && new.region == old.region => {}
                Some(new) => moved.push(format!(
                    "{} (number {} at {:#x} would be number {} at {:#x})",
                    old.region_id,
                    old.region.0,
                    old.start.get(),
                    new.region.0,
                    new.start.get()
                )),
                None => moved.push(format!("{} (gone)", old.region_id)),
            }
        }
        if !moved.is_empty() {
            return Err(DrainError::WouldMove {
                region: region.to_owned(),
                why: format!(
                    "the change would move or renumber regions {}, and servers number the \
                     regions they serve at start",
                    moved.join(", ")
                ),
            });
        }
        Ok(next)
    }
}

/// Whether `to` comes after `server` in config order (a table moved there
/// goes first on its device, else last).
fn servers_after(topology: &Topology, server: &str, to: &str) -> bool {
    let at = |id: &str| topology.servers.iter().position(|s| s.id.as_str() == id);
    at(to) > at(server)
}

/// Removes `server` from the map: it holds no copy.
fn remove(map: &ClusterMap, key: &str, server: &str) -> Result<Planned, DrainError> {
    let edited = edit::remove_server(&map.topology, server, false)?;
    let (next, _) = map.next(key, &edited.topology)?;
    Ok(Planned {
        step: Step::Remove,
        note: format!("server {server} holds no copy: removed from the map"),
        map: Some(next),
    })
}

/// Sets a region table's backup places. None: the region keeps a single
/// copy (the key goes, or says 1 when the pool keeps more by default).
fn set_backups(table: &mut Table, backups: &[String], topology: &Topology) {
    if backups.is_empty() {
        if topology.pool.replicas.unwrap_or(1) > 1 {
            table.insert("replicas".to_owned(), Value::Integer(1));
        } else {
            table.remove("replicas");
        }
    } else {
        let places = backups.iter().cloned().map(Value::String).collect();
        table.insert("replicas".to_owned(), Value::Array(places));
    }
}

/// The region tables of every device: (server, socket, device, regions).
fn devices_mut(topology: &mut Table) -> Vec<(String, String, String, &mut Vec<Value>)> {
    let mut out = Vec::new();
    for server in array(topology, "servers") {
        let server_id = id_of(server).unwrap_or_default().to_owned();
        let Value::Table(server) = server else {
            continue;
        };
        for socket in array(server, "sockets") {
            let socket_id = id_of(socket).unwrap_or_default().to_owned();
            let Value::Table(socket) = socket else {
                continue;
            };
            for device in array(socket, "devices") {
                let device_id = id_of(device).unwrap_or_default().to_owned();
                let Value::Table(device) = device else {
                    continue;
                };
                out.push((
                    server_id.clone(),
                    socket_id.clone(),
                    device_id,
                    array(device, "regions"),
                ));
            }
        }
    }
    out
}

/// The table of `region`.
fn region_table<'t>(topology: &'t mut Table, region: &str) -> Option<&'t mut Table> {
    devices_mut(topology)
        .into_iter()
        .flat_map(|(_, _, _, regions)| regions.iter_mut())
        .find(|r| id_of(r) == Some(region))
        .and_then(Value::as_table_mut)
}

/// Takes `region`'s table out of its device.
fn take_region(topology: &mut Table, region: &str) -> Option<Table> {
    for (_, _, _, regions) in devices_mut(topology) {
        if let Some(at) = regions.iter().position(|r| id_of(r) == Some(region)) {
            return match regions.remove(at) {
                Value::Table(t) => Some(t),
                _ => None,
            };
        }
    }
    None
}

/// Puts a region's table on the device of copy `at`: first on it when
/// `front`, else last.
fn put_region(topology: &mut Table, at: &topology::Replica, table: Table, front: bool) {
    for (server, socket, device, regions) in devices_mut(topology) {
        if server == at.server.as_str()
            && socket == at.socket.as_str()
            && device == at.device.as_str()
        {
            if front {
                regions.insert(0, Value::Table(table));
            } else {
                regions.push(Value::Table(table));
            }
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edit::mark_replica;

    const KEY: &str = "/pools/test/map";

    /// Servers A (A1), B (B1) and C (a device, no region); the pool keeps
    /// two copies; B1's backup is on A.
    fn three_servers() -> ClusterMap {
        let server = |id: &str, region: Option<&str>, port: u16| {
            let regions = region.map_or_else(String::new, |r| {
                format!(
                    "      [[servers.sockets.devices.regions]]\n      id = \"{r}\"\n      \
                     size = \"4MiB\"\n{}",
                    if r == "B1" {
                        "      replicas = [\"A:0\"]\n"
                    } else {
                        ""
                    }
                )
            });
            format!(
                "[[servers]]\nid = \"{id}\"\n  [[servers.sockets]]\n  id = \"0\"\n    \
                 [[servers.sockets.devices]]\n    id = \"pmem0\"\n{regions}  [[servers.nics]]\n  \
                 id = \"n0\"\n  socket = \"0\"\n  listen = \"127.0.0.1:{port}\"\n"
            )
        };
        let text = format!(
            "[pool]\nname = \"test\"\nextent_size = \"1MiB\"\nreplicas = 2\n{}{}{}\
             [[fabric_devices]]\nid = \"F\"\nports = [{{ id = \"p0\", listen = \
             \"127.0.0.1:7100\" }}]\nlinks = [{{ server = \"A\", nic = \"n0\" }}, {{ server = \
             \"B\", nic = \"n0\" }}, {{ server = \"C\", nic = \"n0\" }}]\n[[clients]]\nid = \
             \"c1\"\nrnics = [{{ id = \"r0\", fabric_device = \"F\" }}]\n",
            server("A", Some("A1"), 7001),
            server("B", Some("B1"), 7002),
            server("C", None, 7003),
        );
        ClusterMap::new(1, text)
    }

    /// Runs the drain of `server` to its end, marking each copy it waits
    /// for serving (as the owner's resync would); the steps taken.
    fn drain(mut map: ClusterMap, server: &str) -> (ClusterMap, Vec<Step>) {
        let single = single_copies(&map, KEY, server).unwrap();
        let mut steps = Vec::new();
        for _ in 0..40 {
            let planned =
                next_step(&map, KEY, server, &[], &[], &single).unwrap_or_else(|e| panic!("{e}"));
            steps.push(planned.step.clone());
            match planned.step {
                Step::Wait { region, server } => {
                    map = mark_replica(&map, &region, &server, ReplicaState::Serving)
                        .unwrap()
                        .map;
                }
                Step::Remove => return (planned.map.unwrap(), steps),
                _ => map = planned.map.unwrap(),
            }
        }
        panic!("the drain did not end: {steps:?}");
    }

    #[test]
    fn a_drain_pins_adds_waits_drops_and_removes_without_moving_a_region() {
        let map = three_servers();
        let before = Layout::new(&map.topology_at(KEY).unwrap()).unwrap();
        let (after, steps) = drain(map, "B");
        let region = |r: &str| r.to_owned();
        assert_eq!(
            steps,
            [
                Step::Pin {
                    region: region("A1"),
                    address: before.entry_by_id(&"A1".into()).unwrap().start.get(),
                },
                Step::Pin {
                    region: region("B1"),
                    address: before.entry_by_id(&"B1".into()).unwrap().start.get(),
                },
                Step::Add {
                    region: region("A1"),
                    server: region("C"),
                },
                Step::Add {
                    region: region("B1"),
                    server: region("C"),
                },
                Step::Wait {
                    region: region("A1"),
                    server: region("C"),
                },
                Step::Wait {
                    region: region("B1"),
                    server: region("C"),
                },
                Step::Drop {
                    region: region("A1")
                },
                Step::Drop {
                    region: region("B1")
                },
                Step::Remove,
            ]
        );
        let topology = after.topology_at(KEY).unwrap();
        assert!(topology.servers.iter().all(|s| s.id.as_str() != "B"));
        let layout = Layout::new(&topology).unwrap();
        for old in before.entries() {
            let new = layout.entry_by_id(&old.region_id).unwrap();
            assert_eq!((new.start, new.region), (old.start, old.region));
        }
        for (region, copies) in [("A1", ["A", "C"]), ("B1", ["A", "C"])] {
            let record = after.replica_set(region).unwrap();
            let servers: Vec<&str> = record.copies.iter().map(|c| c.server.as_str()).collect();
            assert_eq!(servers, copies, "{region}");
            assert_eq!(record.serving(), 2, "{region}");
        }
        // B1's table moved to A, whose copy served.
        assert_eq!(
            layout.entry_by_id(&"B1".into()).unwrap().server.as_str(),
            "A"
        );
    }

    /// A server of a test map: id, failure domain, regions with their one
    /// backup server.
    type TestServer<'a> = (&'a str, Option<&'a str>, &'a [(&'a str, &'a str)]);

    /// A map of `servers`, in that order, all linked to one device; the
    /// pool keeps two copies.
    fn servers_map(servers: &[TestServer<'_>]) -> ClusterMap {
        let mut text =
            String::from("[pool]\nname = \"test\"\nextent_size = \"1MiB\"\nreplicas = 2\n");
        let mut links = Vec::new();
        for (port, (id, domain, regions)) in (7001u16..).zip(servers) {
            let regions: String = regions
                .iter()
                .map(|(r, backup)| {
                    format!(
                        "      [[servers.sockets.devices.regions]]\n      id = \"{r}\"\n      \
                         size = \"4MiB\"\n      replicas = [\"{backup}:0\"]\n"
                    )
                })
                .collect();
            let domain = domain.map_or_else(String::new, |d| format!("domain = \"{d}\"\n"));
            text.push_str(&format!(
                "[[servers]]\nid = \"{id}\"\n{domain}  [[servers.sockets]]\n  id = \"0\"\n    \
                 [[servers.sockets.devices]]\n    id = \"pmem0\"\n{regions}  [[servers.nics]]\n  \
                 id = \"n0\"\n  socket = \"0\"\n  listen = \"127.0.0.1:{port}\"\n"
            ));
            links.push(format!("{{ server = \"{id}\", nic = \"n0\" }}"));
        }
        text.push_str(&format!(
            "[[fabric_devices]]\nid = \"F\"\nports = [{{ id = \"p0\", listen = \
             \"127.0.0.1:7100\" }}]\nlinks = [{}]\n[[clients]]\nid = \"c1\"\nrnics = \
             [{{ id = \"r0\", fabric_device = \"F\" }}]\n",
            links.join(", ")
        ));
        ClusterMap::new(1, text)
    }

    /// Servers B (B1 and B2, both primaries), C (C1) and A (A1), in that
    /// order: B's and C1's backups on A, A1's on C. Only C's device is next
    /// to B's, so both of B's tables move there.
    fn two_primaries_on_b() -> ClusterMap {
        servers_map(&[
            ("B", None, &[("B1", "A"), ("B2", "A")]),
            ("C", None, &[("C1", "A")]),
            ("A", None, &[("A1", "C")]),
        ])
    }

    #[test]
    fn two_primaries_moved_off_a_server_keep_every_region_number() {
        let map = two_primaries_on_b();
        let before = Layout::new(&map.topology_at(KEY).unwrap()).unwrap();
        let (after, steps) = drain(map, "B");
        // B1 cannot go first: ahead of C1 while B2 is still on B, it
        // would take B2's number; B2 goes first, then B1 ahead of it.
        let drops: Vec<&Step> = steps
            .iter()
            .filter(|s| matches!(s, Step::Drop { .. } | Step::Remove))
            .collect();
        let drop = |r: &str| Step::Drop { region: r.into() };
        assert_eq!(
            drops,
            [&drop("B2"), &drop("B1"), &Step::Remove],
            "{steps:?}"
        );
        let topology = after.topology_at(KEY).unwrap();
        assert!(topology.servers.iter().all(|s| s.id.as_str() != "B"));
        let layout = Layout::new(&topology).unwrap();
        for old in before.entries() {
            let new = layout.entry_by_id(&old.region_id).unwrap();
            assert_eq!(
                (new.start, new.region),
                (old.start, old.region),
                "{}",
                old.region_id
            );
        }
        for region in ["B1", "B2"] {
            let record = after.replica_set(region).unwrap();
            assert!(record.state_on("B").is_none(), "{region}");
            assert_eq!(record.serving(), 2, "{region}");
            assert_eq!(
                layout.entry_by_id(&region.into()).unwrap().server.as_str(),
                "C",
                "{region}"
            );
        }
    }

    #[test]
    fn a_primary_that_can_only_move_by_renumbering_is_refused_by_name() {
        // B1's backup is on D; A drains, C shares D's failure domain, so
        // the new copy goes to E: neither D nor E is next to B in config
        // order, and B1's table on either would renumber C1 (and D1).
        let map = servers_map(&[
            ("A", None, &[("A1", "C")]),
            ("B", None, &[("B1", "D")]),
            ("C", Some("rack2"), &[("C1", "A")]),
            ("D", Some("rack2"), &[("D1", "A")]),
            ("E", None, &[]),
        ]);
        let avoid = ["A".to_owned()];
        let mut map = map;
        let err = loop {
            match next_step(&map, KEY, "B", &avoid, &[], &[]) {
                Ok(planned) => match planned.step {
                    Step::Wait { region, server } => {
                        map = mark_replica(&map, &region, &server, ReplicaState::Serving)
                            .unwrap()
                            .map;
                    }
                    Step::Add { ref server, .. } => {
                        assert_eq!(server, "E");
                        map = planned.map.unwrap();
                    }
                    step => {
                        assert!(matches!(step, Step::Pin { .. }), "{step:?}");
                        map = planned.map.unwrap();
                    }
                },
                Err(e) => break e,
            }
        };
        let text = err.to_string();
        assert!(matches!(err, DrainError::WouldMove { .. }), "{text}");
        assert!(
            text.starts_with("region B1: the change would move or renumber regions B1 (number 1"),
            "{text}"
        );
        assert!(text.contains("C1 (number 2 at"), "{text}");
        assert!(text.ends_with("nothing was changed"), "{text}");
        // Nothing written: B still holds B1's primary.
        let layout = Layout::new(&map.topology_at(KEY).unwrap()).unwrap();
        assert_eq!(
            layout.entry_by_id(&"B1".into()).unwrap().server.as_str(),
            "B"
        );
    }

    #[test]
    fn an_interrupted_drain_goes_on_from_the_map() {
        let mut map = three_servers();
        // Up to the first wait, as if the command stopped there.
        loop {
            let planned = next_step(&map, KEY, "B", &[], &[], &[]).unwrap();
            match planned.map {
                Some(next) => map = next,
                None => break,
            }
        }
        let again = next_step(&map, KEY, "B", &[], &[], &[]).unwrap();
        assert_eq!(
            again.step,
            Step::Wait {
                region: "A1".into(),
                server: "C".into()
            }
        );
        assert!(
            again.note.contains("waiting for the copy on C"),
            "{}",
            again.note
        );
        let (after, _) = drain(map, "B");
        assert!(after.replica_set("A1").unwrap().state_on("B").is_none());
    }

    #[test]
    fn a_drain_refuses_what_it_cannot_do_safely_and_changes_nothing() {
        let mut map = three_servers();
        while let Step::Pin { .. } = next_step(&map, KEY, "B", &[], &[], &[]).unwrap().step {
            map = next_step(&map, KEY, "B", &[], &[], &[])
                .unwrap()
                .map
                .unwrap();
        }
        // No server outside the copies' domains but C, which is draining.
        let err = next_step(&map, KEY, "B", &["C".to_owned()], &[], &[]).unwrap_err();
        let err = match err {
            DrainError::NoPlace { .. } => err.to_string(),
            other => panic!("{other}"),
        };
        assert!(
            err.starts_with("no server can take a copy of region A1 from B"),
            "{err}"
        );
        assert!(err.contains("C is draining or removed"), "{err}");

        // A copy that cannot serve yet is waited for; once the only other
        // copy is offline, the drained copy is not dropped.
        let mut map = three_servers();
        while let Some(next) = next_step(&map, KEY, "B", &[], &[], &[]).unwrap().map {
            map = next;
        }
        let offline = mark_replica(&map, "A1", "C", ReplicaState::Offline)
            .unwrap()
            .map;
        let offline = mark_replica(&offline, "B1", "C", ReplicaState::Serving)
            .unwrap()
            .map;
        let offline = mark_replica(&offline, "A1", "A", ReplicaState::Offline)
            .unwrap()
            .map;
        // Neither offline copy's server is live: the drain waits, B's copy
        // stays; A is live: its copy is marked syncing.
        let waits = next_step(&offline, KEY, "B", &[], &[], &[]).unwrap();
        assert_eq!(
            waits.step,
            Step::Wait {
                region: "A1".into(),
                server: "A".into()
            }
        );
        assert!(waits.note.contains("offline"), "{}", waits.note);
        let revived = next_step(&offline, KEY, "B", &[], &["A".to_owned()], &[]).unwrap();
        assert_eq!(
            revived.step,
            Step::Revive {
                region: "A1".into(),
                server: "A".into()
            }
        );
        let record = revived.map.unwrap().replica_set("A1").cloned().unwrap();
        assert_eq!(record.state_on("A"), Some(ReplicaState::Syncing));
        assert_eq!(record.state_on("B"), Some(ReplicaState::Serving));

        let err = next_step(&three_servers(), KEY, "Z", &[], &[], &[])
            .unwrap_err()
            .to_string();
        assert_eq!(err, "the map (epoch 1) has no server Z");
    }

    #[test]
    fn a_single_copy_region_gets_a_copy_next_to_it_and_has_one_again_after_the_drain() {
        // The pool keeps two copies, B1 one (`replicas = 1`); A1's backup
        // is on B by the placement rule.
        let map = ClusterMap::new(
            1,
            three_servers()
                .topology
                .replace("replicas = [\"A:0\"]\n", "replicas = 1\n"),
        );
        let topology = map.topology_at(KEY).unwrap();
        let sets = topology.replica_sets();
        let b1 = sets.iter().find(|s| s.region.as_str() == "B1").unwrap();
        assert!(!b1.is_replicated(), "{b1:?}");
        let before = Layout::new(&topology).unwrap();
        let (after, steps) = drain(map, "B");
        let changes: Vec<Step> = steps
            .into_iter()
            .filter(|s| !matches!(s, Step::Pin { .. }))
            .collect();
        let (region, server) = (|r: &str| r.to_owned(), |s: &str| s.to_owned());
        assert_eq!(
            changes,
            [
                Step::Add {
                    region: region("A1"),
                    server: server("C"),
                },
                // Next to B in config order: B1's table can move there.
                Step::Add {
                    region: region("B1"),
                    server: server("A"),
                },
                Step::Wait {
                    region: region("A1"),
                    server: server("C"),
                },
                Step::Wait {
                    region: region("B1"),
                    server: server("A"),
                },
                Step::Drop {
                    region: region("A1")
                },
                Step::Drop {
                    region: region("B1")
                },
                Step::Remove,
            ]
        );
        let topology = after.topology_at(KEY).unwrap();
        let layout = Layout::new(&topology).unwrap();
        for old in before.entries() {
            let new = layout.entry_by_id(&old.region_id).unwrap();
            assert_eq!((new.start, new.region), (old.start, old.region));
        }
        // B1 has a single copy again, on A, and says so against the pool's
        // two; A1 keeps two.
        let b1 = layout.entry_by_id(&"B1".into()).unwrap();
        assert_eq!(b1.server.as_str(), "A");
        assert!(after.replica_set("B1").is_none());
        assert!(
            topology
                .replica_sets()
                .iter()
                .any(|s| s.region.as_str() == "B1" && !s.is_replicated())
        );
        assert!(
            after.topology.contains("replicas = 1"),
            "{}",
            after.topology
        );
        assert_eq!(after.replica_set("A1").unwrap().serving(), 2);
    }

    #[test]
    fn a_single_copy_pool_drained_stays_single_copy() {
        let text = three_servers()
            .topology
            .replace("replicas = 2\n", "")
            .replace("replicas = [\"A:0\"]\n", "");
        let (after, steps) = drain(ClusterMap::new(1, text), "B");
        assert!(
            steps.contains(&Step::Add {
                region: "B1".into(),
                server: "A".into()
            }),
            "{steps:?}"
        );
        let topology = after.topology_at(KEY).unwrap();
        assert!(topology.servers.iter().all(|s| s.id.as_str() != "B"));
        assert!(topology.replica_sets().iter().all(|s| !s.is_replicated()));
        assert!(!after.topology.contains("replicas"), "{}", after.topology);
    }
}
