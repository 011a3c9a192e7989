//! Checks a topology and reports every problem, each naming the file, the
//! item and what is wrong.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use crate::ids::{ClientId, FabricDeviceId, RegionId, ServerId};
use crate::layout::{RegionOverflow, place_regions};
use crate::model::{RnicTransport, Topology};

/// What is wrong with one item of a topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProblemKind {
    /// Another item of the same kind and scope has this id.
    DuplicateId,
    /// The item names something the topology does not have.
    UnknownReference {
        /// What kind of thing is named (`"socket"`, `"server"`, …).
        kind: &'static str,
        /// The name that was not found.
        id: String,
    },
    /// The pool's extent size is zero or not a power of two.
    BadExtentSize {
        /// The configured extent size.
        size: u64,
    },
    /// A region of size zero.
    ZeroSize,
    /// A region size the extent size does not divide.
    SizeNotExtentMultiple {
        /// The region's size.
        size: u64,
        /// The pool's extent size.
        extent: u64,
    },
    /// An explicit region address not aligned to the extent size.
    AddressMisaligned {
        /// The explicit address.
        address: u64,
        /// The pool's extent size.
        extent: u64,
    },
    /// Two regions' explicit addresses overlap.
    AddressOverlap {
        /// The region this one overlaps.
        other: RegionId,
    },
    /// The region does not fit below the end of the 64-bit address space.
    AddressOverflow,
    /// A fabric device without a link to a server: the fabric is not
    /// non-blocking (every fabric device must reach every server).
    MissingLink {
        /// The server the device cannot reach.
        server: ServerId,
    },
    /// An RNIC wired to a fabric device that does not exist.
    RnicUnreachable {
        /// The device the RNIC names.
        device: FabricDeviceId,
    },
    /// A fabric device without client-facing ports.
    NoPorts,
    /// A client without RNICs.
    NoRnics,
    /// A server without NICs.
    NoNics,
    /// The topology has no item of a required kind.
    Empty {
        /// What is missing (`"servers"`, …).
        what: &'static str,
    },
    /// An address that does not parse.
    BadAddress {
        /// The text written.
        address: String,
        /// What was expected.
        expected: &'static str,
    },
    /// Another item already listens on this address.
    DuplicateListen {
        /// The address.
        address: SocketAddr,
        /// The item that listens there first.
        other: String,
    },
    /// The allocator's metadata cannot be laid out.
    AllocatorMetadata(crate::meta::MetaError),
    /// A region id that cannot name a region file on a server.
    UnsafeRegionId,
    /// A `roce` RNIC without an IPv4 `local_addr`.
    RoceRnicAddress,
    /// A `roce` RNIC wired to a device port without a `roce` section.
    RoceRnicPort,
    /// A `verbs` server NIC whose listen address is not IPv4.
    VerbsNicAddress,
    /// A link to a `verbs` server NIC from a device with no RoCEv2 port.
    VerbsLinkWithoutRoce,
    /// A PMEM device path that is not absolute.
    RelativeDevicePath {
        /// The path written.
        path: String,
    },
    /// Another PMEM device of the same server names the same path.
    DuplicateDevicePath {
        /// The path.
        path: String,
        /// The device that names it first.
        other: String,
    },
    /// An extent size set by an environment override divides the size of
    /// none, or not all, of the file's regions.
    ExtentSizeMismatch {
        /// The extent size.
        extent: u64,
        /// The regions whose size it does not divide, with their sizes.
        regions: Vec<(RegionId, u64)>,
    },
    /// On the server's host: a PMEM device path that cannot be looked at.
    DevicePathMissing {
        /// The path.
        path: String,
        /// Why (the system's words).
        error: String,
    },
    /// On the server's host: a PMEM device path that is neither a
    /// directory nor a character device.
    DevicePathWrongKind {
        /// The path.
        path: String,
        /// What it is instead.
        found: &'static str,
    },
    /// A region's copies cannot be placed as asked.
    Replicas(crate::replicas::PlacementProblem),
    /// A client granted a replicated region has no RNIC wired to the
    /// region's owner device, which orders all its requests.
    OwnerUnreachable {
        /// The owner device.
        owner: FabricDeviceId,
        /// The client.
        client: ClientId,
    },
    /// An allow-list range that leaves its region.
    AllowOutOfRange {
        /// The region named by the range.
        region: RegionId,
        /// The region's size.
        region_size: u64,
    },
}

impl fmt::Display for ProblemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DuplicateId => write!(f, "duplicate id"),
            Self::AllocatorMetadata(e) => write!(f, "{e}"),
            Self::Replicas(problem) => write!(f, "{problem}"),
            Self::OwnerUnreachable { owner, client } => {
                let (owner, client) = (owner.as_str(), client.as_str());
                write!(
                    f,
                    "its owner, fabric device {owner:?} (replicated regions go to the devices in \
                 turn), orders every request of the region, and client {client:?}, which may \
                 use the region, has no RNIC wired to it: wire one of the client's RNICs to \
                 {owner:?}"
                )
            }
            Self::UnknownReference { kind, id } => write!(f, "refers to unknown {kind} {id:?}"),
            Self::BadExtentSize { size } => write!(
                f,
                "extent size {} ({size} bytes) is not a non-zero power of two (such as 2MiB \
                 or 4MiB)",
                crate::ByteSize(*size)
            ),
            Self::ZeroSize => write!(f, "size is zero"),
            Self::SizeNotExtentMultiple { size, extent } => {
                write!(
                    f,
                    "size {size} is not a multiple of the extent size {}",
                    crate::ByteSize(*extent)
                )?;
                if let Some(hint) = crate::size::decimal_unit_hint(*size) {
                    write!(f, "; {hint}")?;
                }
                Ok(())
            }
            Self::ExtentSizeMismatch { extent, regions } => {
                let listed: Vec<String> = regions
                    .iter()
                    .map(|(id, size)| format!("{:?} ({})", id.as_str(), crate::ByteSize(*size)))
                    .collect();
                write!(
                    f,
                    "extent size {} does not divide the size of region(s) {}; every region's \
                     size must be a multiple of the extent size",
                    crate::ByteSize(*extent),
                    listed.join(", ")
                )
            }
            Self::AddressMisaligned { address, extent } => write!(
                f,
                "address {address:#x} is not aligned to the extent size {extent}"
            ),
            Self::AddressOverlap { other } => {
                write!(
                    f,
                    "PMEM addresses overlap those of region {:?}",
                    other.as_str()
                )
            }
            Self::AddressOverflow => {
                write!(
                    f,
                    "does not fit below the end of the 64-bit PMEM address space"
                )
            }
            Self::MissingLink { server } => write!(
                f,
                "has no link to server {:?}; the fabric must be non-blocking \
                 (every fabric device links to every server)",
                server.as_str()
            ),
            Self::RnicUnreachable { device } => write!(
                f,
                "reaches no fabric device: fabric device {:?} does not exist",
                device.as_str()
            ),
            Self::NoPorts => write!(f, "has no client-facing ports, so no RNIC can reach it"),
            Self::RoceRnicAddress => write!(
                f,
                "transport \"roce\" needs local_addr: the RNIC's IPv4 address (its RoCEv2 GID)"
            ),
            Self::RoceRnicPort => write!(
                f,
                "transport \"roce\" needs a device port with a roce section (interface, ip)"
            ),
            Self::VerbsNicAddress => write!(
                f,
                "transport \"verbs\" needs an IPv4 listen address: it is also the NIC's RoCEv2 \
                 address"
            ),
            Self::VerbsLinkWithoutRoce => write!(
                f,
                "reaches a \"verbs\" server NIC, which needs RDMA: give one of the device's \
                 ports a roce section (interface, ip)"
            ),
            Self::UnsafeRegionId => write!(
                f,
                "id cannot name a region file: it must be 1 to 256 bytes, not \".\" or \"..\", \
                 without '/' or NUL"
            ),
            Self::NoRnics => write!(f, "has no RNICs, so it reaches no fabric device"),
            Self::NoNics => write!(f, "has no NICs, so no fabric device can reach it"),
            Self::Empty { what } => write!(f, "has no {what}"),
            Self::BadAddress { address, expected } => {
                write!(f, "address {address:?} is not {expected}")
            }
            Self::DuplicateListen { address, other } => {
                write!(f, "listen address {address} is already used by {other}")
            }
            Self::RelativeDevicePath { path } => write!(
                f,
                "path {path:?} is not absolute (a directory such as /mnt/pmem0 or a device \
                 DAX character device such as /dev/dax0.0)"
            ),
            Self::DuplicateDevicePath { path, other } => {
                write!(f, "path {path:?} is already used by {other}")
            }
            Self::DevicePathMissing { path, error } => write!(
                f,
                "path {path:?} cannot be used on this host ({error}): mount the fsdax \
                 filesystem there or create the device DAX namespace (ndctl create-namespace \
                 -m devdax), or drop path to keep the regions in the server's data directory"
            ),
            Self::DevicePathWrongKind { path, found } => write!(
                f,
                "path {path:?} is {found}; pmem-server takes a directory (an fsdax mount such \
                 as /mnt/pmem0) or a device DAX character device (such as /dev/dax0.0)"
            ),
            Self::AllowOutOfRange {
                region,
                region_size,
            } => write!(
                f,
                "allowed range leaves region {:?} (size {region_size})",
                region.as_str()
            ),
        }
    }
}

/// One problem: which file, which item, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The topology file.
    pub file: String,
    /// The offending item, e.g. `fabric device "B"`.
    pub item: String,
    /// What is wrong with it.
    pub kind: ProblemKind,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.file, self.item, self.kind)
    }
}

/// Every problem found in a topology.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors {
    /// The problems, in the order the topology was walked.
    pub problems: Vec<Problem>,
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} problem(s) in topology", self.problems.len())?;
        for p in &self.problems {
            write!(f, "\n  {p}")?;
        }
        Ok(())
    }
}

/// Collects problems while walking a topology.
struct Checker<'a> {
    topology: &'a Topology,
    problems: Vec<Problem>,
    listeners: HashMap<SocketAddr, String>,
}

impl Checker<'_> {
    fn report(&mut self, item: impl Into<String>, kind: ProblemKind) {
        self.problems.push(Problem {
            file: self.topology.source.clone(),
            item: item.into(),
            kind,
        });
    }

    /// Reports a problem with the value at dotted `key`, blamed on the
    /// environment variable that set it, or on the file.
    fn report_key(&mut self, key: &str, item: impl Into<String>, kind: ProblemKind) {
        let file = match self.topology.override_of(key) {
            Some(o) => format!("environment variable {}", o.assignment()),
            None => self.topology.source.clone(),
        };
        self.problems.push(Problem {
            file,
            item: item.into(),
            kind,
        });
    }

    /// Reports every id seen more than once, naming each repeat.
    fn unique<'i>(&mut self, ids: impl IntoIterator<Item = (&'i str, String)>) {
        let mut seen = HashSet::new();
        for (id, item) in ids {
            if !seen.insert(id) {
                self.report(item, ProblemKind::DuplicateId);
            }
        }
    }

    /// Checks a `host:port` listen address and that nobody else uses it.
    fn listen(&mut self, item: String, address: &str) {
        match address.parse::<SocketAddr>() {
            Ok(addr) if addr.port() == 0 => {}
            Ok(addr) => {
                if let Some(other) = self.listeners.get(&addr) {
                    let other = other.clone();
                    self.report(
                        item,
                        ProblemKind::DuplicateListen {
                            address: addr,
                            other,
                        },
                    );
                } else {
                    self.listeners.insert(addr, item);
                }
            }
            Err(_) => self.report(
                item,
                ProblemKind::BadAddress {
                    address: address.to_owned(),
                    expected: "an IP address and port such as 127.0.0.1:7000",
                },
            ),
        }
    }

    /// `[pool.allocator]`: its region exists and its metadata fits.
    fn allocator(&mut self) {
        let Some(config) = &self.topology.pool.allocator else {
            return;
        };
        let item = "pool.allocator";
        if let Some(id) = &config.metadata_region
            && !self.topology.regions().any(|p| &p.region.id == id)
        {
            let kind = ProblemKind::UnknownReference {
                kind: "region",
                id: id.to_string(),
            };
            self.report(item, kind);
            return;
        }
        if !self.problems.is_empty() {
            // The layout the metadata extends is itself broken.
            return;
        }
        if let Err(crate::layout::LayoutError::Allocator(e)) = crate::Layout::new(self.topology) {
            self.report(item, ProblemKind::AllocatorMetadata(e));
        }
    }

    fn pool(&mut self) {
        let pool = &self.topology.pool;
        let extent = pool.extent_size.bytes();
        if extent == 0 || !extent.is_power_of_two() {
            self.report_key(
                "pool.extent_size",
                "pool",
                ProblemKind::BadExtentSize { size: extent },
            );
        }
        for (what, empty) in [
            ("servers", self.topology.servers.is_empty()),
            ("fabric devices", self.topology.fabric_devices.is_empty()),
            ("clients", self.topology.clients.is_empty()),
        ] {
            if empty {
                self.report("topology", ProblemKind::Empty { what });
            }
        }
    }

    fn servers(&mut self) {
        let t = self.topology;
        self.unique(
            t.servers
                .iter()
                .map(|s| (s.id.as_str(), format!("server {:?}", s.id.as_str()))),
        );
        for server in &t.servers {
            let sid = server.id.as_str();
            self.unique(server.sockets.iter().map(|s| {
                (
                    s.id.as_str(),
                    format!("server {sid:?} socket {:?}", s.id.as_str()),
                )
            }));
            self.unique(server.nics.iter().map(|n| {
                (
                    n.id.as_str(),
                    format!("server {sid:?} NIC {:?}", n.id.as_str()),
                )
            }));
            for socket in &server.sockets {
                self.unique(socket.devices.iter().map(|d| {
                    let item = format!(
                        "server {sid:?} socket {:?} PMEM device {:?}",
                        socket.id.as_str(),
                        d.id.as_str()
                    );
                    (d.id.as_str(), item)
                }));
            }
            self.device_paths(server);
            if server.nics.is_empty() {
                self.report(format!("server {sid:?}"), ProblemKind::NoNics);
            }
            for nic in &server.nics {
                let item = format!("server {sid:?} NIC {:?}", nic.id.as_str());
                if server.socket(&nic.socket).is_none() {
                    let kind = ProblemKind::UnknownReference {
                        kind: "socket",
                        id: nic.socket.to_string(),
                    };
                    self.report(item.clone(), kind);
                }
                if nic.transport == crate::model::NicTransport::Verbs
                    && nic
                        .listen
                        .parse::<std::net::SocketAddr>()
                        .is_ok_and(|a| !a.is_ipv4())
                {
                    self.report(item.clone(), ProblemKind::VerbsNicAddress);
                }
                self.listen(item, &nic.listen);
            }
            if let Some(admin) = &server.admin {
                self.listen(format!("server {sid:?} admin"), admin);
            }
        }
    }

    /// Each PMEM device path of `server` is absolute and names no other
    /// device's memory (paths compare by their components, so `/mnt/pmem0/`
    /// and `/mnt/pmem0` are the same).
    fn device_paths(&mut self, server: &crate::model::Server) {
        let mut seen: HashMap<std::path::PathBuf, String> = HashMap::new();
        for socket in &server.sockets {
            for device in &socket.devices {
                let Some(path) = &device.path else { continue };
                let item = format!(
                    "server {:?} socket {:?} PMEM device {:?}",
                    server.id.as_str(),
                    socket.id.as_str(),
                    device.id.as_str()
                );
                let normal: std::path::PathBuf = std::path::Path::new(path).components().collect();
                if !normal.is_absolute() {
                    let kind = ProblemKind::RelativeDevicePath { path: path.clone() };
                    self.report(item, kind);
                } else if let Some(other) = seen.get(&normal) {
                    let kind = ProblemKind::DuplicateDevicePath {
                        path: path.clone(),
                        other: other.clone(),
                    };
                    self.report(item, kind);
                } else {
                    seen.insert(normal, item);
                }
            }
        }
    }

    fn regions(&mut self) {
        let t = self.topology;
        let extent = t.pool.extent_size.bytes();
        self.unique(
            t.regions()
                .map(|p| (p.region.id.as_str(), region_item(&p.region.id))),
        );
        // A bad extent size is reported once, on the pool; the regions'
        // sizes and addresses are measured against a good one only.
        let extent = if extent.is_power_of_two() { extent } else { 0 };
        let overridden = t.override_of("pool.extent_size").is_some();
        let mut undivided = Vec::new();
        for place in t.regions() {
            let region = place.region;
            let item = region_item(&region.id);
            let size = region.size.bytes();
            let id = region.id.as_str();
            if id.is_empty()
                || id.len() > 256
                || id == "."
                || id == ".."
                || id.contains(['/', '\0'])
            {
                self.report(item.clone(), ProblemKind::UnsafeRegionId);
            }
            if size == 0 {
                self.report(item.clone(), ProblemKind::ZeroSize);
            } else if extent != 0 && size % extent != 0 {
                if overridden {
                    undivided.push((region.id.clone(), size));
                } else {
                    self.report(
                        item.clone(),
                        ProblemKind::SizeNotExtentMultiple { size, extent },
                    );
                }
            }
            if let Some(address) = region.address
                && extent != 0
                && address % extent != 0
            {
                self.report(item, ProblemKind::AddressMisaligned { address, extent });
            }
        }
        if !undivided.is_empty() {
            let kind = ProblemKind::ExtentSizeMismatch {
                extent,
                regions: undivided,
            };
            self.report_key("pool.extent_size", "pool extent_size", kind);
        }
        self.region_overlaps();
    }

    /// Reports explicit placements that collide (automatic placement never
    /// collides by construction) and regions that overflow the address space.
    fn region_overlaps(&mut self) {
        let t = self.topology;
        match place_regions(t) {
            Err(RegionOverflow(region)) => {
                self.report(region_item(&region), ProblemKind::AddressOverflow);
            }
            Ok(starts) => {
                let mut spans: Vec<(u64, u64, &RegionId)> = starts
                    .iter()
                    .zip(t.regions())
                    .filter(|(_, p)| p.region.size.bytes() > 0)
                    .map(|(&s, p)| (s, s + p.region.size.bytes(), &p.region.id))
                    .collect();
                spans.sort_unstable_by_key(|&(s, e, _)| (s, e));
                let mut furthest: Option<(u64, &RegionId)> = None;
                for (start, end, id) in spans {
                    if let Some((reach, other)) = furthest
                        && start < reach
                    {
                        let kind = ProblemKind::AddressOverlap {
                            other: other.clone(),
                        };
                        self.report(region_item(id), kind);
                    }
                    if furthest.is_none_or(|(reach, _)| end > reach) {
                        furthest = Some((end, id));
                    }
                }
            }
        }
    }

    /// Every region's copies: counts in range, named places that exist,
    /// never two on one server or in one failure domain.
    fn replicas(&mut self) {
        use crate::replicas::PlacementProblem;
        let (_, problems) = crate::replicas::place_replicas(self.topology);
        let mut pool_reported = false;
        for (region, problem) in problems {
            if let PlacementProblem::BadCount { pool: true, .. } = problem {
                if !pool_reported {
                    pool_reported = true;
                    self.report_key("pool.replicas", "pool", ProblemKind::Replicas(problem));
                }
                continue;
            }
            self.report(region_item(&region), ProblemKind::Replicas(problem));
        }
    }

    /// Every client that may use a replicated region reaches the region's
    /// owner device: an RNIC of the client is wired to it.
    fn owners_reachable(&mut self) {
        let t = self.topology;
        for (region, owner) in t.default_owners() {
            for client in &t.clients {
                let granted =
                    client.allow.is_empty() || client.allow.iter().any(|a| a.region == region);
                let wired = client.rnics.iter().any(|r| r.fabric_device == owner);
                if granted && !wired {
                    let kind = ProblemKind::OwnerUnreachable {
                        owner: owner.clone(),
                        client: client.id.clone(),
                    };
                    self.report(region_item(&region), kind);
                }
            }
        }
    }

    fn roce_port(&mut self, item: &str, roce: &crate::model::RocePort) {
        if roce.ip.parse::<std::net::Ipv4Addr>().is_err() {
            self.report(
                format!("{item} roce"),
                ProblemKind::BadAddress {
                    address: roce.ip.clone(),
                    expected: "an IPv4 address",
                },
            );
        }
        if roce.interface.is_empty() || roce.interface.len() > 15 {
            self.report(
                format!("{item} roce"),
                ProblemKind::BadAddress {
                    address: roce.interface.clone(),
                    expected: "a network interface name (1 to 15 bytes)",
                },
            );
        }
        if ![256, 512, 1024, 2048, 4096].contains(&roce.mtu) {
            self.report(
                format!("{item} roce"),
                ProblemKind::BadAddress {
                    address: roce.mtu.to_string(),
                    expected: "a RoCE path MTU (256, 512, 1024, 2048 or 4096)",
                },
            );
        }
    }

    fn fabric_devices(&mut self) {
        let t = self.topology;
        self.unique(
            t.fabric_devices
                .iter()
                .map(|d| (d.id.as_str(), device_item(&d.id))),
        );
        for device in &t.fabric_devices {
            let item = device_item(&device.id);
            self.unique(
                device
                    .ports
                    .iter()
                    .map(|p| (p.id.as_str(), format!("{item} port {:?}", p.id.as_str()))),
            );
            if device.ports.is_empty() {
                self.report(item.clone(), ProblemKind::NoPorts);
            }
            for port in &device.ports {
                let port_item = format!("{item} port {:?}", port.id.as_str());
                self.listen(port_item.clone(), &port.listen);
                if let Some(roce) = &port.roce {
                    self.roce_port(&port_item, roce);
                }
            }
            if let Some(admin) = &device.admin {
                self.listen(format!("{item} admin"), admin);
            }
            for (n, link) in device.links.iter().enumerate() {
                let link_item = format!("{item} link #{} ({}/{})", n + 1, link.server, link.nic);
                match t.server(&link.server) {
                    None => self.report(
                        link_item,
                        ProblemKind::UnknownReference {
                            kind: "server",
                            id: link.server.to_string(),
                        },
                    ),
                    Some(server) => match server.nic(&link.nic) {
                        None => self.report(
                            link_item,
                            ProblemKind::UnknownReference {
                                kind: "server NIC",
                                id: format!("{}/{}", link.server, link.nic),
                            },
                        ),
                        Some(nic)
                            if nic.transport == crate::model::NicTransport::Verbs
                                && device.ports.iter().all(|p| p.roce.is_none()) =>
                        {
                            self.report(link_item, ProblemKind::VerbsLinkWithoutRoce);
                        }
                        Some(_) => {}
                    },
                }
            }
            for server in &t.servers {
                if !device.links.iter().any(|l| l.server == server.id) {
                    let kind = ProblemKind::MissingLink {
                        server: server.id.clone(),
                    };
                    self.report(item.clone(), kind);
                }
            }
        }
    }

    fn clients(&mut self) {
        let t = self.topology;
        self.unique(
            t.clients
                .iter()
                .map(|c| (c.id.as_str(), format!("client {:?}", c.id.as_str()))),
        );
        for client in &t.clients {
            let cid = client.id.as_str();
            self.unique(client.rnics.iter().map(|r| {
                (
                    r.id.as_str(),
                    format!("client {cid:?} RNIC {:?}", r.id.as_str()),
                )
            }));
            if client.rnics.is_empty() {
                self.report(format!("client {cid:?}"), ProblemKind::NoRnics);
            }
            for rnic in &client.rnics {
                let item = format!("client {cid:?} RNIC {:?}", rnic.id.as_str());
                match t.fabric_device(&rnic.fabric_device) {
                    None => self.report(
                        item.clone(),
                        ProblemKind::RnicUnreachable {
                            device: rnic.fabric_device.clone(),
                        },
                    ),
                    Some(device) => {
                        if let Some(port) = &rnic.port
                            && device.port(port).is_none()
                        {
                            let kind = ProblemKind::UnknownReference {
                                kind: "port",
                                id: format!("{}/{}", device.id, port),
                            };
                            self.report(item.clone(), kind);
                        }
                        if rnic.transport == RnicTransport::Roce
                            && rnic.port_on(device).is_some_and(|p| p.roce.is_none())
                        {
                            self.report(item.clone(), ProblemKind::RoceRnicPort);
                        }
                    }
                }
                if rnic.transport == RnicTransport::Roce
                    && rnic
                        .local_addr
                        .as_deref()
                        .is_none_or(|a| a.parse::<std::net::Ipv4Addr>().is_err())
                {
                    self.report(item.clone(), ProblemKind::RoceRnicAddress);
                }
                if let Some(local) = &rnic.local_addr
                    && local.parse::<IpAddr>().is_err()
                    && local.parse::<SocketAddr>().is_err()
                {
                    let kind = ProblemKind::BadAddress {
                        address: local.clone(),
                        expected: "an IP address (optionally with a port)",
                    };
                    self.report(item, kind);
                }
            }
            for (n, allow) in client.allow.iter().enumerate() {
                let item = format!("client {cid:?} allow #{}", n + 1);
                let Some(place) = t.regions().find(|p| p.region.id == allow.region) else {
                    let kind = ProblemKind::UnknownReference {
                        kind: "region",
                        id: allow.region.to_string(),
                    };
                    self.report(item, kind);
                    continue;
                };
                let region_size = place.region.size.bytes();
                let offset = allow.offset.bytes();
                let size = allow
                    .size
                    .map_or(region_size.saturating_sub(offset), |s| s.bytes());
                if offset.checked_add(size).is_none_or(|end| end > region_size) {
                    let kind = ProblemKind::AllowOutOfRange {
                        region: allow.region.clone(),
                        region_size,
                    };
                    self.report(item, kind);
                }
            }
        }
    }
}

fn region_item(id: &RegionId) -> String {
    format!("region {:?}", id.as_str())
}

fn device_item(id: &FabricDeviceId) -> String {
    format!("fabric device {:?}", id.as_str())
}

/// Something valid but probably not meant, said when a topology loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// The topology file.
    pub file: String,
    /// The item, e.g. `fabric device "F" admin`.
    pub item: String,
    /// What is wrong with it.
    pub text: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.file, self.item, self.text)
    }
}

impl Topology {
    /// What is valid but probably not meant: an admin endpoint (metrics and
    /// health, unauthenticated) listening on every interface.
    pub fn warnings(&self) -> Vec<Warning> {
        let admins = self
            .servers
            .iter()
            .map(|s| (format!("server {:?} admin", s.id.as_str()), &s.admin))
            .chain(
                self.fabric_devices
                    .iter()
                    .map(|d| (format!("{} admin", device_item(&d.id)), &d.admin)),
            );
        admins
            .filter_map(|(item, admin)| {
                let addr = admin.as_deref()?.parse::<SocketAddr>().ok()?;
                addr.ip().is_unspecified().then(|| Warning {
                    file: self.source.clone(),
                    item,
                    text: format!(
                        "{addr} listens on every interface: anyone who reaches this host \
                         reads its metrics (they are not authenticated); give a management \
                         address instead"
                    ),
                })
            })
            .collect()
    }

    /// Every problem of this topology, or `Ok` when there is none.
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        let mut checker = Checker {
            topology: self,
            problems: Vec::new(),
            listeners: HashMap::new(),
        };
        checker.pool();
        checker.servers();
        checker.regions();
        checker.replicas();
        checker.fabric_devices();
        checker.clients();
        checker.owners_reachable();
        checker.allocator();
        if checker.problems.is_empty() {
            Ok(())
        } else {
            Err(ValidationErrors {
                problems: checker.problems,
            })
        }
    }
}
