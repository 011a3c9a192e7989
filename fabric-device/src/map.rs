//! The device's view of the fabric: the PMEM address map, its links to
//! server NICs, which links reach each region, and which clients it admits.
//!
//! A [`DeviceMap`] is an immutable snapshot built from a validated topology;
//! a reload builds a new one and swaps it in.

use std::collections::HashMap;

use control::replica_state::{self, ReplicaSetRecord, ReplicaState};
use topology::grants::Grants;
use topology::{
    FabricDeviceId, Layout, LayoutError, NicId, PmemAddr, ServerId, SocketId, Topology,
};

/// What identifies a link across reloads: the server NIC and its address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LinkTarget {
    /// The server at the other end.
    pub server: ServerId,
    /// The server NIC.
    pub nic: NicId,
    /// Where that NIC listens.
    pub addr: String,
}

/// One link of this device to a server NIC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSpec {
    /// The NIC it reaches.
    pub target: LinkTarget,
    /// The CPU socket the NIC is attached to.
    pub socket: SocketId,
    /// The server's index in the layout (as MAP entries carry it).
    pub server_index: u16,
}

/// A client the device admits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientPolicy {
    /// The client's number: its position in the topology, stamped on its
    /// exactly-once requests so one client cannot replay another's.
    pub number: u32,
    /// What it may touch.
    pub grants: Grants,
}

impl ClientPolicy {
    /// Whether `[addr, addr + len)` lies inside one allowed range (that
    /// may be changed, for a `write`).
    pub fn allows(&self, addr: PmemAddr, len: u64, write: bool) -> bool {
        self.grants.allows(addr, len, write)
    }
}

/// Why a device map cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    /// The topology does not name this device.
    #[error("{file}: no fabric device {device:?} in the topology")]
    UnknownDevice {
        /// The topology file.
        file: String,
        /// The device asked for.
        device: String,
    },
    /// The topology has problems.
    #[error("{0}")]
    Invalid(#[from] topology::ValidationErrors),
    /// The layout cannot be built.
    #[error("{file}: invalid layout")]
    Layout {
        /// The topology file.
        file: String,
        /// Why.
        #[source]
        source: LayoutError,
    },
}

/// Everything the forwarding core needs to know about the fabric.
#[derive(Debug, Clone)]
pub struct DeviceMap {
    /// This device's id.
    pub device: FabricDeviceId,
    /// The PMEM address layout.
    pub layout: Layout,
    /// This device's links, in config order.
    pub links: Vec<LinkSpec>,
    /// For each region index, the positions in `links` that reach its
    /// server: links on the region's socket first, then the others.
    pub region_links: Vec<Vec<usize>>,
    /// The admitted clients by id: those with an RNIC wired to this device.
    pub clients: HashMap<String, ClientPolicy>,
    /// For each region index, its copies when it has more than one
    /// (`None`: a single-copy region, forwarded as `region_links` says).
    pub replica_sets: Vec<Option<RegionCopies>>,
}

/// One copy of a replicated region as the device reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopySpec {
    /// The server holding the copy.
    pub server: ServerId,
    /// The positions in `DeviceMap::links` that reach that server: links
    /// on the copy's socket first, then the others.
    pub links: Vec<usize>,
    /// What the map says the copy may be used for.
    pub state: ReplicaState,
}

/// A replicated region's copies, owner and record version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionCopies {
    /// The copies in set order, the primary first.
    pub copies: Vec<CopySpec>,
    /// The fabric device that orders the region's requests.
    pub owner: FabricDeviceId,
    /// The version of the region's record in the map.
    pub version: u64,
}

impl DeviceMap {
    /// Builds the map of `device` from a topology, validating it first.
    pub fn new(topology: &Topology, device: &FabricDeviceId) -> Result<Self, MapError> {
        topology.validate()?;
        let spec = topology
            .fabric_device(device)
            .ok_or_else(|| MapError::UnknownDevice {
                file: topology.source.clone(),
                device: device.to_string(),
            })?;
        let layout = Layout::new(topology).map_err(|source| MapError::Layout {
            file: topology.source.clone(),
            source,
        })?;
        let server_index: HashMap<&ServerId, u16> = layout
            .entries()
            .iter()
            .map(|e| (&e.server, e.server_index))
            .collect();
        let links: Vec<LinkSpec> = spec
            .links
            .iter()
            .filter_map(|link| {
                let server = topology.server(&link.server)?;
                let nic = server.nic(&link.nic)?;
                let index = topology.servers.iter().position(|s| s.id == server.id)?;
                Some(LinkSpec {
                    target: LinkTarget {
                        server: server.id.clone(),
                        nic: nic.id.clone(),
                        addr: nic.listen.clone(),
                    },
                    socket: nic.socket.clone(),
                    server_index: server_index
                        .get(&server.id)
                        .copied()
                        .unwrap_or(u16::try_from(index).unwrap_or(u16::MAX)),
                })
            })
            .collect();
        let reaching = |server: &ServerId, socket: &SocketId| {
            let mut reach: Vec<usize> = (0..links.len())
                .filter(|&i| &links[i].target.server == server)
                .collect();
            reach.sort_by_key(|&i| &links[i].socket != socket);
            reach
        };
        let region_links = layout
            .entries()
            .iter()
            .map(|entry| reaching(&entry.server, &entry.socket))
            .collect();
        let sets = topology.replica_sets();
        let records = replica_state::initial(topology);
        let replica_sets = layout
            .entries()
            .iter()
            .map(|entry| {
                let set = sets
                    .iter()
                    .find(|s| s.region == entry.region_id && s.is_replicated())?;
                let record = records
                    .iter()
                    .find(|r| r.region == entry.region_id.as_str())?;
                let copies = set
                    .replicas
                    .iter()
                    .map(|copy| CopySpec {
                        server: copy.server.clone(),
                        links: reaching(&copy.server, &copy.socket),
                        state: record
                            .state_on(copy.server.as_str())
                            .unwrap_or(ReplicaState::Serving),
                    })
                    .collect();
                Some(RegionCopies {
                    copies,
                    owner: record.owner.as_str().into(),
                    version: record.version,
                })
            })
            .collect();
        // Only clients with an RNIC wired to this device: servers refuse
        // to let a device act for any other.
        let clients = topology
            .clients
            .iter()
            .enumerate()
            .filter(|(_, client)| client.rnics.iter().any(|r| r.fabric_device == spec.id))
            .map(|(number, client)| {
                let policy = ClientPolicy {
                    number: u32::try_from(number).unwrap_or(u32::MAX),
                    grants: Grants::of(&layout, client),
                };
                (client.id.to_string(), policy)
            })
            .collect();
        Ok(Self {
            device: spec.id.clone(),
            layout,
            links,
            region_links,
            clients,
            replica_sets,
        })
    }

    /// The map with the copies' states, owners and versions of `records`
    /// (the map's in etcd) instead of a new pool's: a record naming a
    /// region or server this map does not replicate is ignored, a region
    /// without a record keeps its copies as they are.
    pub fn with_replica_states(mut self, records: &[ReplicaSetRecord]) -> Self {
        for (entry, set) in self.layout.entries().iter().zip(&mut self.replica_sets) {
            let Some(set) = set.as_mut() else {
                continue;
            };
            let Some(record) = records
                .iter()
                .find(|r| r.region == entry.region_id.as_str())
            else {
                continue;
            };
            for copy in &mut set.copies {
                if let Some(state) = record.state_on(copy.server.as_str()) {
                    copy.state = state;
                }
            }
            set.owner = record.owner.as_str().into();
            set.version = record.version;
        }
        self
    }

    /// Whether a server's MAP agrees with ours for every region this device
    /// routes to that server (same index, start and length): the check that
    /// a link talks to the server the topology means. Regions of other
    /// servers, and regions the server knows but we do not, do not matter.
    pub fn server_agrees(&self, server: &ServerId, theirs: &proto::map::Repr) -> bool {
        self.layout
            .entries()
            .iter()
            .filter(|e| &e.server == server)
            .all(|ours| {
                theirs
                    .entries
                    .iter()
                    .any(|t| t.region == ours.region && t.start == ours.start && t.len == ours.len)
            })
    }

    /// The region entry holding `addr`.
    pub fn lookup(&self, addr: PmemAddr) -> Option<topology::Location<'_>> {
        self.layout.lookup(addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use topology::EnvOverrides;

    fn fig4a() -> Topology {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/fig4a.toml");
        Topology::load_with(path, &EnvOverrides::None).unwrap()
    }

    #[test]
    fn region_links_prefer_the_regions_socket() {
        let t = fig4a();
        let map = DeviceMap::new(&t, &"C".into()).unwrap();
        assert_eq!(map.links.len(), 6);
        // Device C links to server C's socket-0 NIC only (servers alternate).
        let pc5 = map.layout.entry_by_id(&"PC.5".into()).unwrap();
        let reach = &map.region_links[pc5.region.0 as usize];
        assert_eq!(reach.len(), 1);
        assert_eq!(map.links[reach[0]].target.server.as_str(), "C");
        assert_eq!(map.links[reach[0]].socket.as_str(), "0");
    }

    #[test]
    fn same_socket_links_come_first() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/default.toml");
        let t = Topology::load_with(path, &EnvOverrides::None).unwrap();
        let map = DeviceMap::new(&t, &"A".into()).unwrap();
        let pb2 = map.layout.entry_by_id(&"PB.2".into()).unwrap();
        let reach: Vec<(&str, &str)> = map.region_links[pb2.region.0 as usize]
            .iter()
            .map(|&i| {
                (
                    map.links[i].target.server.as_str(),
                    map.links[i].target.nic.as_str(),
                )
            })
            .collect();
        assert_eq!(reach, vec![("B", "n1"), ("B", "n0")]);
    }

    #[test]
    fn replicated_regions_list_their_copies_links_owner_and_version() {
        let t = testkit::default_topology_with("replicas = 2");
        let map = DeviceMap::new(&t, &"A".into()).unwrap();
        let pb1 = map.layout.entry_by_id(&"PB.1".into()).unwrap().region;
        let set = map.replica_sets[pb1.0 as usize].as_ref().unwrap();
        let copies: Vec<(&str, ReplicaState)> = set
            .copies
            .iter()
            .map(|c| (c.server.as_str(), c.state))
            .collect();
        // Primary first, every copy serving in a new pool.
        assert_eq!(
            copies,
            [("B", ReplicaState::Serving), ("A", ReplicaState::Serving)]
        );
        // The backup on A's socket 0: A's NIC n0 first.
        let first = &map.links[set.copies[1].links[0]];
        assert_eq!(
            (first.target.server.as_str(), first.target.nic.as_str()),
            ("A", "n0")
        );
        assert_eq!(set.copies[1].links.len(), 2);
        assert_eq!(set.version, 1);
        // Owners in turn: PA.1 → A, PA.2 → B, PB.1 → A, PB.2 → B.
        assert_eq!(set.owner.as_str(), "A");

        let mut records = control::replica_state::initial(&t);
        let record = records.iter_mut().find(|r| r.region == "PB.1").unwrap();
        record.copies[1].state = ReplicaState::Offline;
        record.owner = "B".into();
        record.version = 2;
        let map = map.with_replica_states(&records);
        let set = map.replica_sets[pb1.0 as usize].as_ref().unwrap();
        assert_eq!(set.copies[1].state, ReplicaState::Offline);
        assert_eq!((set.owner.as_str(), set.version), ("B", 2));
    }

    #[test]
    fn single_copy_regions_have_no_replica_set() {
        let map = DeviceMap::new(&fig4a(), &"A".into()).unwrap();
        assert!(map.replica_sets.iter().all(Option::is_none));
        assert_eq!(map.replica_sets.len(), map.layout.entries().len());
    }

    #[test]
    fn unknown_device_and_invalid_topology_are_errors() {
        let t = fig4a();
        assert!(matches!(
            DeviceMap::new(&t, &"Z".into()),
            Err(MapError::UnknownDevice { .. })
        ));
        let mut broken = t.clone();
        broken.fabric_devices[0].links.pop();
        assert!(matches!(
            DeviceMap::new(&broken, &"A".into()),
            Err(MapError::Invalid(_))
        ));
    }

    #[test]
    fn allow_lists_become_pmem_ranges() {
        let mut t = fig4a();
        t.clients[0].allow = vec![
            topology::AllowRange {
                region: "PA.2".into(),
                offset: topology::ByteSize(4096),
                size: Some(topology::ByteSize(8192)),
                access: topology::Access::ReadWrite,
            },
            topology::AllowRange {
                region: "PA.3".into(),
                offset: topology::ByteSize(0),
                size: None,
                access: topology::Access::Read,
            },
        ];
        let map = DeviceMap::new(&t, &"A".into()).unwrap();
        let pa2 = map.layout.entry_by_id(&"PA.2".into()).unwrap().start;
        let pa3 = map.layout.entry_by_id(&"PA.3".into()).unwrap().start;
        let at = |base: PmemAddr, offset: u64| base.checked_add(offset).unwrap();
        let a = &map.clients["A"];
        assert!(a.allows(at(pa2, 4096), 8192, true));
        assert!(!a.allows(at(pa2, 4096), 8193, false));
        assert!(!a.allows(pa2, 1, false));
        assert!(!a.allows(PmemAddr(u64::MAX), 2, false));
        assert!(a.allows(pa3, 64, false), "read-only: reads");
        assert!(!a.allows(pa3, 64, true), "read-only: no writes");
        assert!(
            map.clients["B"].allows(pa2, 1 << 20, true),
            "no list: everything"
        );
        assert_eq!(map.clients["B"].number, 1);
    }

    #[test]
    fn only_clients_wired_to_the_device_are_admitted() {
        let mut t = fig4a();
        // Client B keeps only its RNIC on device C.
        t.clients[1]
            .rnics
            .retain(|r| r.fabric_device.as_str() == "C");
        let on_a = DeviceMap::new(&t, &"A".into()).unwrap();
        assert!(!on_a.clients.contains_key("B"));
        assert_eq!(on_a.clients["C"].number, 2, "numbers stay positions");
        let on_c = DeviceMap::new(&t, &"C".into()).unwrap();
        assert_eq!(on_c.clients["B"].number, 1);
    }
}
