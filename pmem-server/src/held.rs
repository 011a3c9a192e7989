//! The regions a server holds: those the topology places on it (their
//! primary copies) and the backup copies of replicated regions that the
//! topology's replica sets put on it.
//!
//! A backup is an ordinary region of the same size and id, in its own file
//! (or device DAX slot) on the backup's socket and device, so the server
//! opens and serves it like a primary; it knows which copy it holds. On a
//! device DAX device, backups take the slots after the device's own
//! regions, so adding a backup never moves a primary.

use topology::{Layout, LayoutEntry, PmemDeviceId, RegionId, ServerId, SocketId, Topology};

/// Which copy of its region a served region is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CopyRole {
    /// Where the topology places the region (also a single-copy region).
    Primary,
    /// A backup copy of a replicated region.
    Backup,
}

impl CopyRole {
    /// `primary` or `backup`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Primary => "primary",
            Self::Backup => "backup",
        }
    }
}

/// A region this server holds: its layout entry as seen from this server
/// (its socket and device are the copy's) and which copy it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldRegion {
    /// The region's entry, with this server's socket and device.
    pub entry: LayoutEntry,
    /// Which copy.
    pub role: CopyRole,
}

/// A backup's place on this server, for laying out its PMEM devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupPlace {
    /// The socket of the device holding it.
    pub socket: SocketId,
    /// The device holding it.
    pub device: PmemDeviceId,
    /// The region.
    pub region: RegionId,
    /// Its size in bytes.
    pub len: u64,
}

/// Every region `server` holds, in region-index order: primaries and
/// backups.
pub fn held_by(topology: &Topology, layout: &Layout, server: &ServerId) -> Vec<HeldRegion> {
    let sets = topology.replica_sets();
    layout
        .entries()
        .iter()
        .filter_map(|entry| {
            if &entry.server == server {
                return Some(HeldRegion {
                    entry: entry.clone(),
                    role: CopyRole::Primary,
                });
            }
            let set = sets.iter().find(|s| s.region == entry.region_id)?;
            let copy = set.backups().iter().find(|r| &r.server == server)?;
            let mut entry = entry.clone();
            entry.server = copy.server.clone();
            entry.server_index = copy.server_index;
            entry.socket = copy.socket.clone();
            entry.socket_index = copy.socket_index;
            entry.device = copy.device.clone();
            Some(HeldRegion {
                entry,
                role: CopyRole::Backup,
            })
        })
        .collect()
}

/// The backups `server` holds, with their places.
pub fn backups_on(held: &[HeldRegion]) -> Vec<BackupPlace> {
    held.iter()
        .filter(|h| h.role == CopyRole::Backup)
        .map(|h| BackupPlace {
            socket: h.entry.socket.clone(),
            device: h.entry.device.clone(),
            region: h.entry.region_id.clone(),
            len: h.entry.len,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(t: &Topology, server: &str) -> Vec<(String, String, CopyRole)> {
        let layout = Layout::new(t).unwrap();
        held_by(t, &layout, &server.into())
            .into_iter()
            .map(|h| {
                (
                    h.entry.region_id.to_string(),
                    h.entry.socket.to_string(),
                    h.role,
                )
            })
            .collect()
    }

    #[test]
    fn a_single_copy_server_holds_its_own_regions_only() {
        let t = testkit::default_topology_with("");
        let primary = |r: &str, s: &str| (r.to_owned(), s.to_owned(), CopyRole::Primary);
        assert_eq!(held(&t, "A"), [primary("PA.1", "0"), primary("PA.2", "1")]);
        assert!(backups_on(&held_by(&t, &Layout::new(&t).unwrap(), &"A".into())).is_empty());
    }

    #[test]
    fn a_replicated_server_holds_the_other_servers_regions_as_backups() {
        let t = testkit::default_topology_with("replicas = 2");
        let backup = |r: &str, s: &str| (r.to_owned(), s.to_owned(), CopyRole::Backup);
        let a = held(&t, "A");
        assert_eq!(&a[2..], [backup("PB.1", "0"), backup("PB.2", "1")]);
        let layout = Layout::new(&t).unwrap();
        let on_b = held_by(&t, &layout, &"B".into());
        let pa1 = on_b
            .iter()
            .find(|h| h.entry.region_id.as_str() == "PA.1")
            .unwrap();
        // Same region, address and size; this server's socket and device.
        let original = layout.entry_by_id(&"PA.1".into()).unwrap();
        assert_eq!(
            (pa1.entry.region, pa1.entry.start, pa1.entry.len),
            (original.region, original.start, original.len)
        );
        assert_eq!(pa1.entry.server.as_str(), "B");
        assert_eq!(backups_on(&on_b).len(), 2);
    }
}
