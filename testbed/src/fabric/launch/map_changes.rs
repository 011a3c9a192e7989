//! Membership changes of a running fabric on etcd, made as an operator's
//! `pmemctl cluster add-server`, `add-device` and `remove-device` would
//! make them, then carried out on the processes: the added daemon
//! started, the removed one stopped.

use control::Intent;
use control::edit::Edited;
use topology::{EnvOverrides, Topology};

use super::{DaemonKind, Fabric, LaunchError, terminate, wait_or_kill};
use crate::fabric::etcd::{EtcdControl, role_of};
use crate::fabric::membership::{HeldBack, MembershipError};

/// What a membership change did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapChange {
    /// The map's epoch after it.
    pub epoch: u64,
    /// The daemon added or removed.
    pub id: String,
    /// Whether it was added (or removed).
    pub added: bool,
    /// When etcd had committed the change (Unix milliseconds), before the
    /// daemon was started or stopped.
    pub committed_unix_ms: u64,
    /// When the change was carried out (Unix milliseconds): an added
    /// daemon ready and the links to it up, a removed one stopped.
    pub settled_unix_ms: u64,
}

impl Fabric {
    /// The daemon kept out of the first map, until it is admitted.
    pub fn held(&self) -> Option<&HeldBack> {
        self.held.as_ref()
    }

    fn etcd_for(&self, what: &str) -> Result<&EtcdControl, LaunchError> {
        self.etcd.as_ref().ok_or_else(|| {
            LaunchError::Membership(MembershipError::NoCandidate(format!(
                "{what} needs --control etcd"
            )))
        })
    }

    /// Adds the held-back daemon to the map (`add-server` / `add-device`
    /// with its snippet, intent `active`), starts it on etcd and waits
    /// until it is ready; after a server, until every fabric device has
    /// every link up, the new server's too; after a device, until its own
    /// links are up (the servers admitted it).
    pub fn admit_held(&mut self) -> Result<MapChange, LaunchError> {
        let held = self.held.clone().ok_or_else(|| {
            LaunchError::Membership(MembershipError::NoCandidate(
                "no daemon was held back from the first map".to_owned(),
            ))
        })?;
        let snippet = held.snippet.clone();
        let (epoch, edited) = self.etcd_for("adding a daemon")?.change_map(
            role_of(held.kind),
            Intent::Active,
            |map| match held.kind {
                DaemonKind::PmemServer => control::edit::add_server(map, &snippet),
                DaemonKind::FabricDevice => control::edit::add_device(map, &snippet),
            },
        )?;
        let committed_unix_ms = crate::workload::first_use::unix_ms_now();
        self.follow_edit(&edited)?;
        self.held = None;
        self.spawn(held.kind, &held.id)?;
        if let Err(err) = self.await_ready(held.kind, &held.id) {
            return Err(self.explain_refusal(held.kind, &held.id, err));
        }
        let devices = match held.kind {
            DaemonKind::PmemServer => self.daemon_ids(DaemonKind::FabricDevice),
            DaemonKind::FabricDevice => vec![held.id.clone()],
        };
        for device in devices {
            if let Err(err) = self.await_links(&device) {
                return Err(self.explain_refusal(held.kind, &held.id, err));
            }
        }
        let change = MapChange {
            epoch,
            id: held.id,
            added: true,
            committed_unix_ms,
            settled_unix_ms: crate::workload::first_use::unix_ms_now(),
        };
        self.changes.push(change.clone());
        Ok(change)
    }

    /// Every membership change made on this fabric, in order.
    pub fn map_changes(&self) -> &[MapChange] {
        &self.changes
    }

    /// Removes fabric device `id` from the map (`remove-device`, intent
    /// `removed`), then stops its daemon (SIGTERM): an operator retires
    /// the switch it ran on.
    pub fn remove_device(&mut self, id: &str) -> Result<MapChange, LaunchError> {
        let (epoch, edited) = self.etcd_for("removing a device")?.change_map(
            role_of(DaemonKind::FabricDevice),
            Intent::Removed,
            |map| control::edit::remove_device(map, id),
        )?;
        let committed_unix_ms = crate::workload::first_use::unix_ms_now();
        self.follow_edit(&edited)?;
        if let Some(mut daemon) = self
            .daemons
            .remove(&(DaemonKind::FabricDevice, id.to_owned()))
        {
            terminate(&daemon.child);
            wait_or_kill(&mut daemon.child, std::time::Duration::from_secs(15));
        }
        let change = MapChange {
            epoch,
            id: id.to_owned(),
            added: false,
            committed_unix_ms,
            settled_unix_ms: crate::workload::first_use::unix_ms_now(),
        };
        self.changes.push(change.clone());
        Ok(change)
    }

    /// A device added to the map whose links the servers refuse as an
    /// unknown peer: a server that did not take the device's key from the
    /// new map (one that does not follow principals, or whose keys' folder
    /// lacks the device's key).
    fn explain_refusal(&self, kind: DaemonKind, id: &str, err: LaunchError) -> LaunchError {
        let log = self.log_path(kind, id);
        let refused = std::fs::read_to_string(&log).is_ok_and(|t| t.contains("UNKNOWN_CLIENT"));
        if kind == DaemonKind::FabricDevice && refused {
            return LaunchError::AddedDeviceRefused {
                id: id.to_owned(),
                log,
            };
        }
        err
    }

    /// Takes the edited map as the fabric's topology (what daemons started
    /// from now on are checked against); the workers keep theirs.
    fn follow_edit(&mut self, edited: &Edited) -> Result<(), LaunchError> {
        let topology =
            Topology::from_toml_str("the changed map", &edited.topology, &EnvOverrides::None)
                .map_err(|e| LaunchError::Membership(MembershipError::Toml(e.to_string())))?;
        self.topology = topology;
        Ok(())
    }
}
