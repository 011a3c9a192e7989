//! The operator's changes to the map as edits of its topology text: add a
//! server or a fabric device from a TOML snippet, remove one by name. Each
//! gives the whole new topology, which the caller writes as one epoch
//! change (validated there, against the revision it read), and notes that
//! say what the change does besides the obvious.
//!
//! The new text is the map's TOML re-written: comments of the loaded file
//! do not survive the first edit, the order of servers, regions and
//! devices (which fixes the address layout) does.

use toml::{Table, Value};

use crate::map::ClusterMap;
use crate::replica_state::ReplicaState;

/// Why an edit cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum EditError {
    /// The map's text or the snippet is not TOML.
    #[error("{what} is not TOML")]
    Toml {
        /// The map or the snippet.
        what: &'static str,
        /// Why.
        #[source]
        source: toml::de::Error,
    },
    /// The snippet does not hold what the command adds.
    #[error(
        "the snippet must hold exactly one [[{table}]] table (the {what} to add), and may hold \
         only that{extra}"
    )]
    Snippet {
        /// The table expected.
        table: &'static str,
        /// What it describes.
        what: &'static str,
        /// What else it may hold.
        extra: &'static str,
    },
    /// The map already has one of that id.
    #[error("the map already has a {kind} {id}; remove it first or choose another id")]
    Exists {
        /// Server or device.
        kind: &'static str,
        /// Its id.
        id: String,
    },
    /// The map has none of that id.
    #[error("the map has no {kind} {id}")]
    Unknown {
        /// Server or device.
        kind: &'static str,
        /// Its id.
        id: String,
    },
    /// The server still holds regions.
    #[error(
        "server {server} holds regions {}: removing it makes them unreachable. Drain it and \
         move its data first, or pass --force to remove it anyway",
        regions.join(", ")
    )]
    HoldsRegions {
        /// The server.
        server: String,
        /// Its regions.
        regions: Vec<String>,
    },
    /// Removing the device leaves clients without any path.
    #[error(
        "removing device {device} leaves client(s) {} without any RNIC: wire them to another \
         device first",
        clients.join(", ")
    )]
    StrandsClients {
        /// The device.
        device: String,
        /// The clients that would have no RNIC left.
        clients: Vec<String>,
    },
    /// The region has a single copy: it has no replica states to change.
    #[error(
        "region {region} has a single copy, so it has no replica states; give it replicas in \
         the topology first"
    )]
    NotReplicated {
        /// The region.
        region: String,
    },
    /// The server holds no copy of the region.
    #[error("server {server} holds no copy of region {region}: its copies are on {}", holders.join(", "))]
    NotACopy {
        /// The region.
        region: String,
        /// The server named.
        server: String,
        /// The servers that hold its copies.
        holders: Vec<String>,
    },
    /// The change would leave the region without a serving copy.
    #[error(
        "marking region {region}'s copy on {server} {state} would leave the region without a \
         serving copy, so nothing could read it; bring another copy to serving first"
    )]
    LastServing {
        /// The region.
        region: String,
        /// The server of its last serving copy.
        server: String,
        /// The state asked for.
        state: ReplicaState,
    },
    /// An offline copy may have missed writes: it must sync first.
    #[error(
        "region {region}'s copy on {server} is offline and may have missed writes: mark it \
         syncing, and serving once its resync is done"
    )]
    NeedsSync {
        /// The region.
        region: String,
        /// The server of the copy.
        server: String,
    },
    /// The copy is in that state already.
    #[error("region {region}'s copy on {server} is {state} already; nothing to change")]
    Unchanged {
        /// The region.
        region: String,
        /// The server of the copy.
        server: String,
        /// Its state.
        state: ReplicaState,
    },
    /// The edited map cannot be written as TOML.
    #[error("cannot write the edited map as TOML")]
    Write(#[source] toml::ser::Error),
}

/// A new topology and what the change does besides the obvious.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edited {
    /// The id of the server or device added or removed.
    pub subject: String,
    /// The whole new topology (TOML).
    pub topology: String,
    /// One line per consequence worth telling the operator.
    pub notes: Vec<String>,
}

pub(crate) fn parse(what: &'static str, text: &str) -> Result<Table, EditError> {
    text.parse::<Table>()
        .map_err(|source| EditError::Toml { what, source })
}

fn write(subject: &str, table: &Table, notes: Vec<String>) -> Result<Edited, EditError> {
    Ok(Edited {
        subject: subject.to_owned(),
        topology: toml::to_string(table).map_err(EditError::Write)?,
        notes,
    })
}

/// The array of tables `key` (created empty when missing; anything else
/// under that key is replaced, and validation says what was wrong).
pub(crate) fn array<'t>(table: &'t mut Table, key: &str) -> &'t mut Vec<Value> {
    let slot = table
        .entry(key.to_owned())
        .or_insert_with(|| Value::Array(Vec::new()));
    if !slot.is_array() {
        *slot = Value::Array(Vec::new());
    }
    match slot {
        Value::Array(items) => items,
        _ => unreachable!("made an array just above"),
    }
}

pub(crate) fn id_of(value: &Value) -> Option<&str> {
    value.get("id").and_then(Value::as_str)
}

/// Takes the one `[[table]]` of `snippet`, with any other tables in `extra`.
fn one_table(
    snippet: &mut Table,
    table: &'static str,
    what: &'static str,
    allowed: &[&str],
    extra: &'static str,
) -> Result<Table, EditError> {
    let bad = || EditError::Snippet { table, what, extra };
    if snippet
        .keys()
        .any(|k| k != table && !allowed.contains(&k.as_str()))
    {
        return Err(bad());
    }
    match snippet.remove(table) {
        Some(Value::Array(mut items)) if items.len() == 1 => match items.pop() {
            Some(Value::Table(t)) if t.get("id").and_then(Value::as_str).is_some() => Ok(t),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

/// Adds the server of `snippet` (one `[[servers]]` table) to `map`, after
/// the others so no existing region moves. Fabric devices reach it through
/// the snippet's `[[links]]` (`device`, `nic`); without any, every device
/// is linked to every NIC of the new server.
pub fn add_server(map: &str, snippet: &str) -> Result<Edited, EditError> {
    let mut topology = parse("the map", map)?;
    let mut snippet = parse("the snippet", snippet)?;
    let server = one_table(
        &mut snippet,
        "servers",
        "server",
        &["links"],
        ", and [[links]] (device, nic) saying which fabric devices reach its NICs",
    )?;
    let id = id_of(&Value::Table(server.clone()))
        .unwrap_or_default()
        .to_owned();
    if array(&mut topology, "servers")
        .iter()
        .any(|s| id_of(s) == Some(&id))
    {
        return Err(EditError::Exists { kind: "server", id });
    }
    let nics: Vec<String> = server
        .get("nics")
        .and_then(Value::as_array)
        .map(|nics| nics.iter().filter_map(id_of).map(str::to_owned).collect())
        .unwrap_or_default();
    let devices: Vec<String> = array(&mut topology, "fabric_devices")
        .iter()
        .filter_map(id_of)
        .map(str::to_owned)
        .collect();
    let mut notes = Vec::new();
    let links: Vec<(String, String)> = match snippet.get("links").and_then(Value::as_array) {
        Some(links) => links
            .iter()
            .map(|l| {
                let field = |name| l.get(name).and_then(Value::as_str).unwrap_or_default();
                (field("device").to_owned(), field("nic").to_owned())
            })
            .collect(),
        None => {
            let all: Vec<(String, String)> = devices
                .iter()
                .flat_map(|d| nics.iter().map(move |n| (d.clone(), n.clone())))
                .collect();
            if !all.is_empty() {
                notes.push(format!(
                    "no [[links]] in the snippet: every fabric device ({}) is linked to every \
                     NIC of {id} ({})",
                    devices.join(", "),
                    nics.join(", ")
                ));
            }
            all
        }
    };
    array(&mut topology, "servers").push(Value::Table(server));
    for (device, nic) in links {
        let Some(spec) = array(&mut topology, "fabric_devices")
            .iter_mut()
            .find(|d| id_of(d) == Some(&device))
        else {
            return Err(EditError::Unknown {
                kind: "device",
                id: device,
            });
        };
        let mut link = Table::new();
        link.insert("server".to_owned(), Value::String(id.clone()));
        link.insert("nic".to_owned(), Value::String(nic));
        if let Value::Table(spec) = spec {
            array(spec, "links").push(Value::Table(link));
        }
    }
    write(&id, &topology, notes)
}

/// Adds the fabric device of `snippet` (one `[[fabric_devices]]` table,
/// with its ports and links) to `map`. Clients reach it once their RNICs
/// are wired to it (a change of their own).
pub fn add_device(map: &str, snippet: &str) -> Result<Edited, EditError> {
    let mut topology = parse("the map", map)?;
    let mut snippet = parse("the snippet", snippet)?;
    let device = one_table(&mut snippet, "fabric_devices", "fabric device", &[], "")?;
    let id = id_of(&Value::Table(device.clone()))
        .unwrap_or_default()
        .to_owned();
    let devices = array(&mut topology, "fabric_devices");
    if devices.iter().any(|d| id_of(d) == Some(&id)) {
        return Err(EditError::Exists { kind: "device", id });
    }
    devices.push(Value::Table(device));
    write(
        &id,
        &topology,
        vec![format!(
            "no client is wired to {id} yet: give clients an RNIC with fabric_device = \"{id}\" \
             to use it"
        )],
    )
}

/// The ids of the regions of a `[[servers]]` table.
fn regions_of(server: &Value) -> Vec<String> {
    let list = |v: &Value, key: &str| -> Vec<Value> {
        v.get(key)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    list(server, "sockets")
        .iter()
        .flat_map(|socket| list(socket, "devices"))
        .flat_map(|device| list(&device, "regions"))
        .filter_map(|region| id_of(&region).map(str::to_owned))
        .collect()
}

/// Removes server `name` from `map`, with the fabric devices' links to it.
/// Refused while it holds regions unless `force`; forced, its regions
/// become unreachable and the grants naming them go (both said in the
/// notes). Its files are not touched: a map change never deletes data.
pub fn remove_server(map: &str, name: &str, force: bool) -> Result<Edited, EditError> {
    let mut topology = parse("the map", map)?;
    let servers = array(&mut topology, "servers");
    let Some(at) = servers.iter().position(|s| id_of(s) == Some(name)) else {
        return Err(EditError::Unknown {
            kind: "server",
            id: name.to_owned(),
        });
    };
    let regions = regions_of(&servers[at]);
    if !regions.is_empty() && !force {
        return Err(EditError::HoldsRegions {
            server: name.to_owned(),
            regions,
        });
    }
    servers.remove(at);
    let mut notes = Vec::new();
    if !regions.is_empty() {
        notes.push(format!(
            "regions {} become unreachable (their files stay on {name}'s PMEM)",
            regions.join(", ")
        ));
    }
    for device in array(&mut topology, "fabric_devices") {
        if let Value::Table(device) = device {
            array(device, "links")
                .retain(|l| l.get("server").and_then(Value::as_str) != Some(name));
        }
    }
    for client in array(&mut topology, "clients") {
        let client_id = id_of(client).unwrap_or_default().to_owned();
        if let Value::Table(client) = client {
            let allow = array(client, "allow");
            let before = allow.len();
            allow.retain(|a| {
                a.get("region")
                    .and_then(Value::as_str)
                    .is_none_or(|r| !regions.iter().any(|gone| gone == r))
            });
            if allow.len() != before {
                notes.push(format!(
                    "client {client_id} loses {} grant(s) on those regions",
                    before - allow.len()
                ));
            }
            if allow.is_empty() {
                client.remove("allow");
            }
        }
    }
    write(name, &topology, notes)
}

/// Removes fabric device `name` from `map`, with the clients' RNICs wired
/// to it; refused when a client would have no RNIC left.
pub fn remove_device(map: &str, name: &str) -> Result<Edited, EditError> {
    let mut topology = parse("the map", map)?;
    let devices = array(&mut topology, "fabric_devices");
    let Some(at) = devices.iter().position(|d| id_of(d) == Some(name)) else {
        return Err(EditError::Unknown {
            kind: "device",
            id: name.to_owned(),
        });
    };
    devices.remove(at);
    let on_device = |r: &Value| r.get("fabric_device").and_then(Value::as_str) == Some(name);
    let mut stranded = Vec::new();
    let mut notes = Vec::new();
    for client in array(&mut topology, "clients") {
        let client_id = id_of(client).unwrap_or_default().to_owned();
        if let Value::Table(client) = client {
            let rnics = array(client, "rnics");
            let before = rnics.len();
            rnics.retain(|r| !on_device(r));
            if rnics.is_empty() {
                stranded.push(client_id);
            } else if rnics.len() != before {
                notes.push(format!(
                    "client {client_id} loses its RNIC(s) on {name} and keeps {} other(s)",
                    rnics.len()
                ));
            }
        }
    }
    if !stranded.is_empty() {
        return Err(EditError::StrandsClients {
            device: name.to_owned(),
            clients: stranded,
        });
    }
    write(name, &topology, notes)
}

/// The map after marking `region`'s copy on `server` as `state`: the
/// same topology at the next epoch, the region's record at its next
/// version. Refused for a single-copy region, a server without a copy, a
/// change that leaves the region no serving copy, an offline copy asked to
/// serve without syncing first, and a copy already in that state. The
/// caller writes it against the revision it read
/// ([`crate::ControlPlane::replace_map`]).
pub fn mark_replica(
    map: &ClusterMap,
    region: &str,
    server: &str,
    state: ReplicaState,
) -> Result<Marked, EditError> {
    let mut next = map.clone();
    next.epoch += 1;
    let Some(record) = next.replica_sets.iter_mut().find(|r| r.region == region) else {
        let known = map.topology.parse::<Table>().is_ok_and(|mut t| {
            array(&mut t, "servers")
                .iter()
                .flat_map(regions_of)
                .any(|r| r == region)
        });
        return Err(if known {
            EditError::NotReplicated {
                region: region.to_owned(),
            }
        } else {
            EditError::Unknown {
                kind: "region",
                id: region.to_owned(),
            }
        });
    };
    let holders: Vec<String> = record.copies.iter().map(|c| c.server.clone()).collect();
    let serving = record.serving();
    let Some(copy) = record.copies.iter_mut().find(|c| c.server == server) else {
        return Err(EditError::NotACopy {
            region: region.to_owned(),
            server: server.to_owned(),
            holders,
        });
    };
    let (region, server) = (region.to_owned(), server.to_owned());
    match (copy.state, state) {
        (now, wanted) if now == wanted => {
            return Err(EditError::Unchanged {
                region,
                server,
                state,
            });
        }
        (ReplicaState::Offline, ReplicaState::Serving) => {
            return Err(EditError::NeedsSync { region, server });
        }
        (ReplicaState::Serving, _) if serving == 1 => {
            return Err(EditError::LastServing {
                region,
                server,
                state,
            });
        }
        _ => {}
    }
    let was = copy.state;
    copy.state = state;
    record.version += 1;
    let note = format!(
        "region {region}: copy on {server} {was} -> {state} (replica set version {}, map epoch \
         {})",
        record.version, next.epoch
    );
    Ok(Marked { map: next, note })
}

/// A map with one copy's state changed, and what changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marked {
    /// The whole new map (next epoch, the region's next version).
    pub map: ClusterMap,
    /// The change, for the operator: states, version and epoch.
    pub note: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use topology::{EnvOverrides, Topology};

    fn default_text() -> String {
        std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../configs/default.toml"
        ))
        .unwrap()
    }

    fn load(text: &str) -> Topology {
        let t = Topology::from_toml_str("edited", text, &EnvOverrides::None).unwrap();
        t.validate().unwrap_or_else(|e| panic!("{e}\n{text}"));
        t
    }

    /// A third server for the default topology.
    const SERVER_C: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../topology/tests/fixtures/snippets/server_c.toml"
    ));

    #[test]
    fn an_added_server_goes_last_and_every_device_reaches_it_by_default() {
        let before = load(&default_text());
        let edited = add_server(&default_text(), SERVER_C).unwrap();
        let after = load(&edited.topology);
        assert_eq!(after.servers.len(), 3);
        assert_eq!(after.servers[2].id.as_str(), "C");
        // The regions that were there keep their place.
        let old = topology::Layout::new(&before).unwrap();
        let new = topology::Layout::new(&after).unwrap();
        for (a, b) in old.entries().iter().zip(new.entries()) {
            assert_eq!(
                (a.region_id.as_str(), a.start),
                (b.region_id.as_str(), b.start)
            );
        }
        for device in &after.fabric_devices {
            assert!(device.links.iter().any(|l| l.server.as_str() == "C"));
        }
        assert!(edited.notes[0].contains("every fabric device (A, B)"));

        // Links as the snippet says (validation, at the change, requires
        // every device to reach every server).
        let only_a = format!("{SERVER_C}\n[[links]]\ndevice = \"A\"\nnic = \"n0\"\n");
        let text = add_server(&default_text(), &only_a).unwrap().topology;
        let after = Topology::from_toml_str("edited", &text, &EnvOverrides::None).unwrap();
        let reach = |d: usize| {
            after.fabric_devices[d]
                .links
                .iter()
                .any(|l| l.server.as_str() == "C")
        };
        assert!(reach(0) && !reach(1));
        assert!(after.validate().is_err());

        let again = add_server(
            &add_server(&default_text(), SERVER_C).unwrap().topology,
            SERVER_C,
        );
        assert!(matches!(again, Err(EditError::Exists { .. })));
        let two = format!("{SERVER_C}{}", SERVER_C.replace("\"C\"", "\"D\""));
        assert!(matches!(
            add_server(&default_text(), &two),
            Err(EditError::Snippet { .. })
        ));
    }

    #[test]
    fn a_server_holding_regions_is_removed_only_by_force() {
        let err = remove_server(&default_text(), "B", false).unwrap_err();
        assert!(
            err.to_string().contains("holds regions PB.1, PB.2"),
            "{err}"
        );
        let edited = remove_server(&default_text(), "B", true).unwrap();
        let after = load(&edited.topology);
        assert_eq!(after.servers.len(), 1);
        assert!(
            after
                .fabric_devices
                .iter()
                .all(|d| d.links.iter().all(|l| l.server.as_str() == "A"))
        );
        assert!(
            edited.notes[0].contains("PB.1, PB.2 become unreachable"),
            "{:?}",
            edited.notes
        );
        assert!(matches!(
            remove_server(&default_text(), "Z", true),
            Err(EditError::Unknown { .. })
        ));
    }

    #[test]
    fn devices_come_and_go_without_stranding_clients() {
        let edited = remove_device(&default_text(), "B").unwrap();
        let after = load(&edited.topology);
        assert_eq!(after.fabric_devices.len(), 1);
        assert!(after.clients.iter().all(|c| c.rnics.len() == 1));
        assert_eq!(edited.notes.len(), 2);
        let err = remove_device(&edited.topology, "A").unwrap_err();
        assert!(err.to_string().contains("c1, c2"), "{err}");

        let device_b = r#"
[[fabric_devices]]
id = "B"
ports = [{ id = "p0", listen = "127.0.2.2:7100" }]
links = [{ server = "A", nic = "n0" }, { server = "B", nic = "n0" }]
"#;
        let back = load(&add_device(&edited.topology, device_b).unwrap().topology);
        assert_eq!(back.fabric_devices.len(), 2);
        assert!(matches!(
            add_device(&default_text(), device_b),
            Err(EditError::Exists { .. })
        ));
    }

    fn replicated() -> ClusterMap {
        let text = default_text().replace("name = \"default\"", "name = \"default\"\nreplicas = 2");
        ClusterMap::new(4, text)
    }

    #[test]
    fn a_copy_is_marked_at_the_next_epoch_and_version() {
        let map = replicated();
        let marked = mark_replica(&map, "PA.1", "B", ReplicaState::Offline).unwrap();
        assert_eq!(marked.map.epoch, 5);
        let record = marked.map.replica_set("PA.1").unwrap();
        assert_eq!(record.version, 2);
        assert_eq!(record.state_on("B"), Some(ReplicaState::Offline));
        assert_eq!(record.state_on("A"), Some(ReplicaState::Serving));
        // Other regions' records are untouched.
        assert_eq!(marked.map.replica_set("PA.2"), map.replica_set("PA.2"));
        assert_eq!(
            marked.note,
            "region PA.1: copy on B serving -> offline (replica set version 2, map epoch 5)"
        );
        marked.map.topology_at("/k").unwrap();

        // Back through syncing, never straight to serving.
        let err = mark_replica(&marked.map, "PA.1", "B", ReplicaState::Serving).unwrap_err();
        assert_eq!(
            err.to_string(),
            "region PA.1's copy on B is offline and may have missed writes: mark it syncing, \
             and serving once its resync is done"
        );
        let syncing = mark_replica(&marked.map, "PA.1", "B", ReplicaState::Syncing).unwrap();
        let serving = mark_replica(&syncing.map, "PA.1", "B", ReplicaState::Serving).unwrap();
        assert_eq!(serving.map.replica_set("PA.1").unwrap().version, 4);
        assert_eq!(serving.map.replica_set("PA.1").unwrap().serving(), 2);
    }

    #[test]
    fn replica_marks_that_make_no_sense_are_refused_naming_region_and_server() {
        let map = replicated();
        let offline = mark_replica(&map, "PA.1", "B", ReplicaState::Offline)
            .unwrap()
            .map;
        let err = mark_replica(&offline, "PA.1", "A", ReplicaState::Syncing).unwrap_err();
        assert_eq!(
            err.to_string(),
            "marking region PA.1's copy on A syncing would leave the region without a serving \
             copy, so nothing could read it; bring another copy to serving first"
        );
        let err = mark_replica(&map, "PA.1", "C", ReplicaState::Offline).unwrap_err();
        assert_eq!(
            err.to_string(),
            "server C holds no copy of region PA.1: its copies are on A, B"
        );
        let err = mark_replica(&map, "PA.1", "A", ReplicaState::Serving).unwrap_err();
        assert_eq!(
            err.to_string(),
            "region PA.1's copy on A is serving already; nothing to change"
        );
        let err = mark_replica(&map, "PZ.9", "A", ReplicaState::Offline).unwrap_err();
        assert_eq!(err.to_string(), "the map has no region PZ.9");
        let single = ClusterMap::new(1, default_text());
        let err = mark_replica(&single, "PA.1", "A", ReplicaState::Offline).unwrap_err();
        assert!(
            err.to_string().starts_with("region PA.1 has a single copy"),
            "{err}"
        );
    }
}
