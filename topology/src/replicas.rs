//! Replica sets: where each copy of a region lives.
//!
//! A region has 1, 2 or 3 copies: `[pool] replicas`, or the region's own
//! `replicas`. The first copy, the **primary**, is where the topology puts
//! the region (its server, socket and PMEM device); the others, the
//! **backups**, are either named in the file (`replicas = ["B:0"]`,
//! `SERVER:SOCKET` or `SERVER:SOCKET:DEVICE`, the device defaulting to the
//! socket's first) or chosen by a deterministic rule:
//!
//! - walk the servers in config order, starting with the one after the
//!   primary's and wrapping around;
//! - take a server whose failure domain (`domain`, by default the server
//!   itself) no copy of the region uses yet and that has a PMEM device;
//! - on it, the socket at the primary socket's position if it has a PMEM
//!   device, else the first socket that has one; its first device.
//!
//! So backups spread round-robin over the servers after each primary, and
//! every reader of the same topology derives the same sets. Two copies of
//! a region never share a server or a failure domain; [`crate::validate`]
//! refuses a topology where they would, naming the region and the servers.
//!
//! The address layout does not change: a replicated region keeps one PMEM
//! address range, and each copy is a region file (or device DAX slot) of
//! the same size on its server.

use crate::ids::{FabricDeviceId, PmemDeviceId, RegionId, ServerId, SocketId};
use crate::model::{RegionReplicas, Server, Topology};

/// The most copies a region may have.
pub const MAX_REPLICAS: u64 = 3;

/// One copy of a region: the server, socket and PMEM device that hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replica {
    /// The server holding the copy.
    pub server: ServerId,
    /// The socket whose PMEM holds it.
    pub socket: SocketId,
    /// The PMEM device it is carved from.
    pub device: PmemDeviceId,
    /// The server's position in config order.
    pub server_index: u16,
    /// The socket's position within its server.
    pub socket_index: u16,
}

/// Every copy of one region, the primary first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaSet {
    /// The region.
    pub region: RegionId,
    /// Its copies: the primary, then the backups in the order given or
    /// chosen.
    pub replicas: Vec<Replica>,
}

impl ReplicaSet {
    /// The copy where the topology places the region.
    pub fn primary(&self) -> &Replica {
        &self.replicas[0]
    }

    /// The other copies.
    pub fn backups(&self) -> &[Replica] {
        &self.replicas[1..]
    }

    /// Whether the region has more than one copy.
    pub fn is_replicated(&self) -> bool {
        self.replicas.len() > 1
    }

    /// The copy `server` holds, if it holds one.
    pub fn on(&self, server: &ServerId) -> Option<&Replica> {
        self.replicas.iter().find(|r| &r.server == server)
    }
}

/// Why a region's copies cannot be placed as asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlacementProblem {
    /// A copy count outside 1..=3; `pool` when it is the pool's.
    BadCount {
        /// The count asked for.
        count: u64,
        /// Whether `[pool] replicas` set it.
        pool: bool,
    },
    /// A backup's place that is not `SERVER:SOCKET[:DEVICE]`.
    BadPlace {
        /// The text written.
        place: String,
    },
    /// A backup's place naming a server, socket or device that is not
    /// there.
    UnknownPlace {
        /// The text written.
        place: String,
        /// What is missing (`server "Z"`, `socket "7" of server "B"`, …).
        missing: String,
    },
    /// Two copies on one server.
    SameServer {
        /// The server.
        server: ServerId,
    },
    /// Two copies on servers of one failure domain.
    SameDomain {
        /// The domain.
        domain: String,
        /// The server of the earlier copy.
        first: ServerId,
        /// The server of the later copy.
        second: ServerId,
    },
    /// Not enough failure domains with a PMEM device for the copies asked.
    TooFewDomains {
        /// Copies asked for.
        wanted: u64,
        /// Domains that could hold a copy, each with its servers.
        domains: Vec<(String, Vec<ServerId>)>,
    },
}

impl std::fmt::Display for PlacementProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::BadCount { count, pool } => write!(
                f,
                "replicas = {count}{}: a region has 1, 2 or 3 copies",
                if *pool { " (the pool's)" } else { "" }
            ),
            Self::BadPlace { place } => write!(
                f,
                "replica place {place:?} is not SERVER:SOCKET or SERVER:SOCKET:DEVICE \
                 (such as \"B:0\")"
            ),
            Self::UnknownPlace { place, missing } => write!(
                f,
                "replica place {place:?} names {missing}, which the topology does not have"
            ),
            Self::SameServer { server } => write!(
                f,
                "two copies on server {:?}: each copy must be on a server of its own (a \
                 server's death would take both)",
                server.as_str()
            ),
            Self::SameDomain {
                domain,
                first,
                second,
            } => write!(
                f,
                "copies on servers {:?} and {:?} share failure domain {domain:?}: each copy \
                 must be in a domain of its own; name a server of another domain or set its \
                 domain",
                first.as_str(),
                second.as_str()
            ),
            Self::TooFewDomains { wanted, domains } => {
                let listed: Vec<String> = domains
                    .iter()
                    .map(|(domain, servers)| {
                        let names: Vec<&str> = servers.iter().map(ServerId::as_str).collect();
                        format!("{domain:?} ({})", names.join(", "))
                    })
                    .collect();
                write!(
                    f,
                    "needs {wanted} copies in {wanted} failure domains, but only {} domain(s) \
                     have a server with PMEM: {}; add servers in other domains, correct their \
                     domain, or lower replicas",
                    domains.len(),
                    listed.join(", ")
                )
            }
        }
    }
}

/// The copies each region of `topology` should have, or why not.
fn wanted(topology: &Topology, own: Option<&RegionReplicas>) -> Result<u64, PlacementProblem> {
    match own {
        Some(RegionReplicas::Count(count)) => check_count(*count, false),
        Some(RegionReplicas::On(places)) => check_count(places.len() as u64 + 1, false),
        None => check_count(topology.pool.replicas.unwrap_or(1), true),
    }
}

fn check_count(count: u64, pool: bool) -> Result<u64, PlacementProblem> {
    if (1..=MAX_REPLICAS).contains(&count) {
        Ok(count)
    } else {
        Err(PlacementProblem::BadCount { count, pool })
    }
}

/// The copy on socket `socket_index` of server `server_index`, on the
/// socket's device `device` (or its first), if the socket has devices.
fn replica_at(
    topology: &Topology,
    server_index: usize,
    socket_index: usize,
    device: Option<&str>,
) -> Option<Replica> {
    let server = topology.servers.get(server_index)?;
    let socket = server.sockets.get(socket_index)?;
    let device = match device {
        Some(id) => socket.devices.iter().find(|d| d.id.as_str() == id)?,
        None => socket.devices.first()?,
    };
    Some(Replica {
        server: server.id.clone(),
        socket: socket.id.clone(),
        device: device.id.clone(),
        server_index: u16::try_from(server_index).unwrap_or(u16::MAX),
        socket_index: u16::try_from(socket_index).unwrap_or(u16::MAX),
    })
}

/// A backup named `place` (`SERVER:SOCKET[:DEVICE]`).
fn named(topology: &Topology, place: &str) -> Result<Replica, PlacementProblem> {
    let parts: Vec<&str> = place.split(':').collect();
    let (server, socket, device) = match parts.as_slice() {
        [server, socket] => (*server, *socket, None),
        [server, socket, device] => (*server, *socket, Some(*device)),
        _ => return Err(bad_place(place)),
    };
    if server.is_empty() || socket.is_empty() || device.is_some_and(str::is_empty) {
        return Err(bad_place(place));
    }
    let unknown = |missing: String| PlacementProblem::UnknownPlace {
        place: place.to_owned(),
        missing,
    };
    let server_index = topology
        .servers
        .iter()
        .position(|s| s.id.as_str() == server)
        .ok_or_else(|| unknown(format!("server {server:?}")))?;
    let socket_index = topology.servers[server_index]
        .sockets
        .iter()
        .position(|s| s.id.as_str() == socket)
        .ok_or_else(|| unknown(format!("socket {socket:?} of server {server:?}")))?;
    replica_at(topology, server_index, socket_index, device).ok_or_else(|| {
        unknown(match device {
            Some(device) => {
                format!("PMEM device {device:?} of server {server:?} socket {socket:?}")
            }
            None => format!("a PMEM device on socket {socket:?} of server {server:?}"),
        })
    })
}

fn bad_place(place: &str) -> PlacementProblem {
    PlacementProblem::BadPlace {
        place: place.to_owned(),
    }
}

/// Whether `server` has a PMEM device to hold a copy.
fn has_pmem(server: &Server) -> bool {
    server.sockets.iter().any(|s| !s.devices.is_empty())
}

/// Backups for a region whose primary is `primary`, by the rule of this
/// module, until `wanted` copies or the domains run out.
fn chosen(
    topology: &Topology,
    primary: &Replica,
    wanted: u64,
) -> Result<Vec<Replica>, PlacementProblem> {
    let servers = &topology.servers;
    let start = usize::from(primary.server_index);
    let mut used = vec![servers[start].failure_domain()];
    let mut backups = Vec::new();
    for step in 1..servers.len() {
        if backups.len() as u64 + 1 == wanted {
            break;
        }
        let index = (start + step) % servers.len();
        let server = &servers[index];
        if used.contains(&server.failure_domain()) || !has_pmem(server) {
            continue;
        }
        let same = usize::from(primary.socket_index);
        let socket = if server
            .sockets
            .get(same)
            .is_some_and(|s| !s.devices.is_empty())
        {
            same
        } else {
            server
                .sockets
                .iter()
                .position(|s| !s.devices.is_empty())
                .unwrap_or(0)
        };
        if let Some(replica) = replica_at(topology, index, socket, None) {
            used.push(server.failure_domain());
            backups.push(replica);
        }
    }
    if backups.len() as u64 + 1 < wanted {
        let mut domains: Vec<(String, Vec<ServerId>)> = Vec::new();
        for server in servers.iter().filter(|s| has_pmem(s)) {
            let domain = server.failure_domain();
            match domains.iter_mut().find(|(d, _)| d == domain) {
                Some((_, members)) => members.push(server.id.clone()),
                None => domains.push((domain.to_owned(), vec![server.id.clone()])),
            }
        }
        return Err(PlacementProblem::TooFewDomains { wanted, domains });
    }
    Ok(backups)
}

/// Two copies in one server or one failure domain, if there are.
fn shared(topology: &Topology, replicas: &[Replica]) -> Option<PlacementProblem> {
    fn domain<'a>(topology: &'a Topology, r: &'a Replica) -> &'a str {
        topology
            .servers
            .get(usize::from(r.server_index))
            .map_or(r.server.as_str(), Server::failure_domain)
    }
    let domain = |r| domain(topology, r);
    for (i, later) in replicas.iter().enumerate() {
        for earlier in &replicas[..i] {
            if earlier.server == later.server {
                return Some(PlacementProblem::SameServer {
                    server: later.server.clone(),
                });
            }
            if domain(earlier) == domain(later) {
                return Some(PlacementProblem::SameDomain {
                    domain: domain(later).to_owned(),
                    first: earlier.server.clone(),
                    second: later.server.clone(),
                });
            }
        }
    }
    None
}

/// Every region's replica set (config order), and the problems of those
/// that cannot be placed as asked: such a region's set holds the copies
/// that could be placed (at least the primary).
pub fn place_replicas(topology: &Topology) -> (Vec<ReplicaSet>, Vec<(RegionId, PlacementProblem)>) {
    let mut sets = Vec::new();
    let mut problems = Vec::new();
    for place in topology.regions() {
        let region = place.region;
        let server_index = topology
            .servers
            .iter()
            .position(|s| std::ptr::eq(s, place.server))
            .unwrap_or_default();
        let socket_index = place
            .server
            .sockets
            .iter()
            .position(|s| std::ptr::eq(s, place.socket))
            .unwrap_or_default();
        let primary = Replica {
            server: place.server.id.clone(),
            socket: place.socket.id.clone(),
            device: place.device.id.clone(),
            server_index: u16::try_from(server_index).unwrap_or(u16::MAX),
            socket_index: u16::try_from(socket_index).unwrap_or(u16::MAX),
        };
        let mut replicas = vec![primary.clone()];
        let backups =
            wanted(topology, region.replicas.as_ref()).and_then(|count| match &region.replicas {
                Some(RegionReplicas::On(places)) => {
                    places.iter().map(|p| named(topology, p)).collect()
                }
                _ => chosen(topology, &primary, count),
            });
        match backups {
            Ok(backups) => {
                replicas.extend(backups);
                if let Some(problem) = shared(topology, &replicas) {
                    problems.push((region.id.clone(), problem));
                    replicas.truncate(1);
                }
            }
            Err(problem) => problems.push((region.id.clone(), problem)),
        }
        sets.push(ReplicaSet {
            region: region.id.clone(),
            replicas,
        });
    }
    (sets, problems)
}

impl Topology {
    /// Every region's replica set, in config order (a valid topology's
    /// exactly; see [`place_replicas`] for an invalid one's).
    pub fn replica_sets(&self) -> Vec<ReplicaSet> {
        place_replicas(self).0
    }

    /// Whether any region has more than one copy.
    pub fn is_replicated(&self) -> bool {
        self.replica_sets().iter().any(ReplicaSet::is_replicated)
    }

    /// The owner device of every replicated region when a pool starts (the
    /// device that orders the region's requests): the fabric devices in
    /// turn, in config order, over the replicated regions in config order.
    /// Empty without fabric devices.
    pub fn default_owners(&self) -> Vec<(RegionId, FabricDeviceId)> {
        let devices = &self.fabric_devices;
        if devices.is_empty() {
            return Vec::new();
        }
        self.replica_sets()
            .into_iter()
            .filter(ReplicaSet::is_replicated)
            .enumerate()
            .map(|(nth, set)| (set.region, devices[nth % devices.len()].id.clone()))
            .collect()
    }
}
