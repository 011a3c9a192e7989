//! Membership changes on the map under a run (`--control etcd`): which
//! daemon a fabric holds back from its first map (to add it later, as an
//! operator's `pmemctl cluster add-server` or `add-device` would), the
//! snippet that adds it, and which fabric device can be removed without
//! leaving a client without a path.
//!
//! The first map is the whole topology minus the held-back daemon, made
//! with the same edits `pmemctl cluster` uses, so adding it back puts it
//! where the topology has it: a held-back server goes last, so no region
//! of the first map moves.

use topology::{EnvOverrides, Topology};

use crate::fabric::daemon_kind::DaemonKind;

/// Why a daemon cannot be held back or removed.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    /// The topology has no daemon of that kind to spare.
    #[error("{0}")]
    NoCandidate(String),
    /// The edit of the topology failed.
    #[error("cannot take {id} out of the first map")]
    Edit {
        /// The daemon.
        id: String,
        /// Why.
        #[source]
        source: Box<control::edit::EditError>,
    },
    /// The topology or a part of it does not convert to or from TOML.
    #[error("cannot write the topology of the first map as TOML: {0}")]
    Toml(String),
}

/// A daemon kept out of the first map, and the snippet that adds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldBack {
    /// A server or a fabric device.
    pub kind: DaemonKind,
    /// Its id.
    pub id: String,
    /// What `pmemctl cluster add-server` / `add-device --from` would read:
    /// one `[[servers]]` table with its `[[links]]`, or one
    /// `[[fabric_devices]]` table.
    pub snippet: String,
}

/// The first map of a fabric holding one daemon back.
#[derive(Debug, Clone)]
pub struct FirstMap {
    /// The topology without the held-back daemon.
    pub topology: Topology,
    /// The held-back daemon.
    pub held: HeldBack,
}

/// The fabric device that can leave the map with every client keeping a
/// path: the last one every client wired to it is also wired elsewhere.
pub fn spare_device(topology: &Topology) -> Result<String, MembershipError> {
    topology
        .fabric_devices
        .iter()
        .rev()
        .find(|device| {
            topology.clients.iter().all(|client| {
                let on = |r: &&topology::model::Rnic| r.fabric_device == device.id;
                let here = client.rnics.iter().filter(on).count();
                here == 0 || client.rnics.len() > here
            })
        })
        .map(|d| d.id.to_string())
        .ok_or_else(|| {
            MembershipError::NoCandidate(format!(
                "no fabric device of {} can leave the map: every one is some client's only \
                 path; give the clients an RNIC on a second device",
                topology.pool.name
            ))
        })
}

/// Holds back the last server (`kind` server) or the spare fabric device
/// (see [`spare_device`]) of `topology`.
pub fn hold_back(topology: &Topology, kind: DaemonKind) -> Result<FirstMap, MembershipError> {
    let text = toml::to_string(topology).map_err(|e| MembershipError::Toml(e.to_string()))?;
    let (id, edited, snippet) = match kind {
        DaemonKind::PmemServer => {
            let server = topology.servers.last().ok_or_else(|| {
                MembershipError::NoCandidate("the topology has no server to hold back".into())
            })?;
            let id = server.id.to_string();
            let edited = control::edit::remove_server(&text, &id, true);
            (id, edited, server_snippet(topology, server)?)
        }
        DaemonKind::FabricDevice => {
            let id = spare_device(topology)?;
            let device = topology
                .fabric_devices
                .iter()
                .find(|d| d.id.as_str() == id)
                .ok_or_else(|| MembershipError::NoCandidate(format!("no fabric device {id}")))?;
            let edited = control::edit::remove_device(&text, &id);
            (id, edited, device_snippet(device)?)
        }
    };
    let edited = edited.map_err(|source| MembershipError::Edit {
        id: id.clone(),
        source: Box::new(source),
    })?;
    let first = Topology::from_toml_str("the first map", &edited.topology, &EnvOverrides::None)
        .map_err(|e| MembershipError::Toml(e.to_string()))?;
    Ok(FirstMap {
        topology: first,
        held: HeldBack { kind, id, snippet },
    })
}

/// One `[[servers]]` table and a `[[links]]` table for every device link to
/// one of its NICs.
fn server_snippet(
    topology: &Topology,
    server: &topology::model::Server,
) -> Result<String, MembershipError> {
    let mut snippet = toml::Table::new();
    snippet.insert("servers".into(), toml_array(std::slice::from_ref(server))?);
    let links: Vec<toml::Value> = topology
        .fabric_devices
        .iter()
        .flat_map(|d| {
            d.links
                .iter()
                .filter(|l| l.server == server.id)
                .map(move |l| {
                    let mut link = toml::Table::new();
                    link.insert("device".into(), d.id.to_string().into());
                    link.insert("nic".into(), l.nic.to_string().into());
                    toml::Value::Table(link)
                })
        })
        .collect();
    snippet.insert("links".into(), toml::Value::Array(links));
    toml::to_string(&snippet).map_err(|e| MembershipError::Toml(e.to_string()))
}

/// One `[[fabric_devices]]` table.
fn device_snippet(device: &topology::model::FabricDevice) -> Result<String, MembershipError> {
    let mut snippet = toml::Table::new();
    snippet.insert(
        "fabric_devices".into(),
        toml_array(std::slice::from_ref(device))?,
    );
    toml::to_string(&snippet).map_err(|e| MembershipError::Toml(e.to_string()))
}

fn toml_array<T: serde::Serialize>(items: &[T]) -> Result<toml::Value, MembershipError> {
    toml::Value::try_from(items).map_err(|e| MembershipError::Toml(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fabric() -> Topology {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../configs/default.toml"
        ))
        .expect("default topology");
        Topology::from_toml_str("default", &text, &EnvOverrides::None).expect("parses")
    }

    #[test]
    fn a_held_back_server_leaves_the_first_map_and_its_snippet_adds_it_back_last() {
        let topology = fabric();
        let first = hold_back(&topology, DaemonKind::PmemServer).expect("held back");
        let last = topology.servers.last().expect("a server").id.clone();
        assert_eq!(first.held.id, last.as_str());
        assert!(first.topology.server(&last).is_none());
        assert!(first.topology.validate().is_ok());
        let map = toml::to_string(&first.topology).expect("toml");
        let added = control::edit::add_server(&map, &first.held.snippet).expect("added back");
        let back =
            Topology::from_toml_str("back", &added.topology, &EnvOverrides::None).expect("parses");
        assert_eq!(
            back.servers.last().map(|s| s.id.clone()),
            Some(last.clone())
        );
        for device in &topology.fabric_devices {
            let before = device.links.iter().filter(|l| l.server == last).count();
            let after = back
                .fabric_device(&device.id)
                .expect("device")
                .links
                .iter()
                .filter(|l| l.server == last)
                .count();
            assert_eq!(before, after, "device {} links to {last}", device.id);
        }
    }

    #[test]
    fn a_held_back_device_is_one_every_client_has_another_path_than() {
        let topology = fabric();
        let first = hold_back(&topology, DaemonKind::FabricDevice).expect("held back");
        let id = first.held.id.as_str();
        assert!(first.topology.fabric_device(&id.into()).is_none());
        for client in &first.topology.clients {
            assert!(
                !client.rnics.is_empty(),
                "client {} keeps a path",
                client.id
            );
        }
        let map = toml::to_string(&first.topology).expect("toml");
        control::edit::add_device(&map, &first.held.snippet).expect("added back");
    }

    #[test]
    fn no_device_is_spare_when_it_is_a_clients_only_path() {
        let mut topology = fabric();
        for client in &mut topology.clients {
            client.rnics.truncate(1);
            let first = topology.fabric_devices[0].id.clone();
            client.rnics[0].fabric_device = first;
        }
        topology.fabric_devices.truncate(1);
        let err = spare_device(&topology).expect_err("no spare");
        assert!(err.to_string().contains("only path"), "{err}");
    }
}
