//! Path choice, path health and retries, without I/O.
//!
//! A client has one RNIC per fabric device it is wired to; each RNIC with its
//! connection to that device is one *path*. [`PathTable`] knows, per region,
//! which paths reach the region's server and which of them land on the
//! region's own CPU socket, tracks how many requests each path has
//! outstanding, and keeps each path's health:
//!
//! - connection loss or a request timeout marks the whole path Down;
//! - `SERVER_UNAVAILABLE` from a path's device marks only that (path, server)
//!   pair unreachable, so the path keeps carrying requests for other servers.
//!
//! A replicated region has an **owner** fabric device, which orders its
//! requests (the map's replica records, or the topology's default turn
//! order when the map comes from a file): paths through the owner come
//! first, and only they are chosen while one of them is usable. Another
//! device answers `NOT_OWNER` and, when the owner is dead, takes the region
//! over: the next map names it, and its paths come first.
//!
//! Everything that is down is probed again with exponential backoff
//! ([`PathTable::probes_due`], [`PathTable::poll_timeout`]), and comes back when
//! a probe answers. [`Attempts`] is the retry bookkeeping of one request: which
//! path to send it on next, and when to give up.
//!
//! Nothing here reads the clock or touches a socket: every input that depends
//! on time takes `now` as an argument, so failover is tested deterministically
//! on a virtual clock (inputs `handle_*`, outputs `poll_*`).
//!
//! A [`PathId`] is an index into [`PathTable::paths`]; methods given a
//! `PathId` that does not come from the same table panic.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use control::ReplicaSetRecord;
use topology::{
    ClientId, FabricDeviceId, Layout, PortId, RegionId, RegionIndex, RnicId, RnicTransport,
    Topology,
};

/// A path: one RNIC of this client and the connection to its fabric device;
/// index into [`PathTable::paths`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PathId(pub usize);

impl fmt::Display for PathId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "path {}", self.0)
    }
}

/// What a path reaches and how to connect it.
#[derive(Debug, Clone)]
pub struct PathInfo {
    /// The path's id (its position in [`PathTable::paths`]).
    pub id: PathId,
    /// The client's RNIC the path leaves on.
    pub rnic: RnicId,
    /// The fabric device the RNIC is wired to.
    pub device: FabricDeviceId,
    /// The listen address of the device port the RNIC is wired to.
    pub device_addr: String,
    /// The RNIC's local address from the topology, to bind outgoing
    /// connections to (and, with RoCE, the RNIC's IPv4 address).
    pub local_addr: Option<String>,
    /// TCP or RoCE.
    pub transport: RnicTransport,
    /// With RoCE: the RDMA device to open; the first there is when `None`.
    pub rdma_device: Option<String>,
}

impl PathInfo {
    /// Whether `other` leaves on the same RNIC, the same way, for the same
    /// device port: the same path in another epoch of the map.
    pub fn same_link(&self, other: &PathInfo) -> bool {
        self.rnic == other.rnic
            && self.device == other.device
            && self.device_addr == other.device_addr
            && self.local_addr == other.local_addr
            && self.transport == other.transport
            && self.rdma_device == other.rdma_device
    }
}

/// Why an attempt on a path failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The path's connection to its fabric device broke.
    ConnectionLost,
    /// No answer within the attempt's deadline.
    Timeout,
    /// The fabric device answered `SERVER_UNAVAILABLE`: it cannot reach the
    /// region's server right now.
    ServerUnavailable,
    /// The fabric device runs an older epoch of the cluster map than the
    /// client (it answered `STALE_MAP`): it catches up through its own
    /// watch, and is asked again meanwhile like an unreachable server.
    Behind,
    /// The fabric device does not order the region's requests (it answered
    /// `NOT_OWNER`): nothing ran; the request goes to the region's owner.
    /// The path stays healthy.
    NotOwner,
    /// A device other than the region's owner answered `NOT_OWNER`: the
    /// request went there because no path to the owner was usable. Nothing
    /// ran; the device takes the region over if the owner is dead (a new
    /// map names it), or the owner's path comes back. The path stays
    /// healthy.
    OwnerAway,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ConnectionLost => "connection lost",
            Self::Timeout => "timed out",
            Self::ServerUnavailable => "server unavailable",
            Self::Behind => "device behind on the map",
            Self::NotOwner => "not the region's owner device",
            Self::OwnerAway => "not the region's owner (whose paths were down)",
        })
    }
}

/// Timing of probes and retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathConfig {
    /// Delay before the first probe of something that went down.
    pub probe_interval: Duration,
    /// The most the probe delay grows to when probes keep failing.
    pub probe_max: Duration,
    /// How long one attempt on one path may take.
    pub attempt_timeout: Duration,
    /// How long a whole operation may take, retries included.
    pub op_timeout: Duration,
}

impl Default for PathConfig {
    fn default() -> Self {
        Self {
            probe_interval: Duration::from_millis(50),
            probe_max: Duration::from_secs(1),
            attempt_timeout: Duration::from_secs(2),
            op_timeout: Duration::from_secs(10),
        }
    }
}

/// How a path's connection is doing, for status displays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathHealth {
    /// The connection works (some servers may still be marked unreachable
    /// through it; see [`PathTable::unreachable`]).
    Up,
    /// The connection is dead and being probed.
    Down {
        /// When the path went down.
        since: Instant,
    },
}

/// Something down that is due to be tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// The path to probe.
    pub path: PathId,
    /// `None`: reconnect the path (connect + handshake). `Some(s)`: ask server
    /// `s` through the path, which is up.
    pub server: Option<u16>,
}

/// A path table cannot be built from the topology.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The topology has no client with this id.
    #[error("client {client} is not in the topology")]
    UnknownClient {
        /// The client asked for.
        client: ClientId,
    },
    /// The client has no RNIC, so no path at all.
    #[error("client {client} has no RNIC")]
    NoRnic {
        /// The client.
        client: ClientId,
    },
    /// An RNIC is wired to a fabric device the topology does not have.
    #[error(
        "RNIC {rnic} of client {client} is wired to fabric device {device}, which is not in the topology"
    )]
    UnknownDevice {
        /// The client.
        client: ClientId,
        /// The RNIC.
        rnic: RnicId,
        /// The missing device.
        device: FabricDeviceId,
    },
    /// An RNIC is wired to a port its fabric device does not have.
    #[error("RNIC {rnic} of client {client}: fabric device {device} has no {}", port_name(.port))]
    NoPort {
        /// The client.
        client: ClientId,
        /// The RNIC.
        rnic: RnicId,
        /// The device.
        device: FabricDeviceId,
        /// The port the RNIC names; `None` when it names none and the device
        /// has no port at all.
        port: Option<PortId>,
    },
}

fn port_name(port: &Option<PortId>) -> String {
    match port {
        Some(port) => format!("port {port}"),
        None => "port at all".to_owned(),
    }
}

/// When something that is down gets probed next.
#[derive(Debug, Clone, Copy)]
struct ProbeSchedule {
    /// When the next probe is due.
    due: Instant,
    /// The delay that led to `due`; doubled on each failed probe.
    delay: Duration,
    /// A probe was handed out and has not been settled yet.
    in_progress: bool,
}

impl ProbeSchedule {
    fn start(config: &PathConfig, now: Instant) -> Self {
        let delay = config.probe_interval.min(config.probe_max);
        Self {
            due: now + delay,
            delay,
            in_progress: false,
        }
    }

    /// Due at once unless a probe is out, its delay back to the first
    /// one's: what a new map does to a (path, server) mark, since the map
    /// may serve the server's regions otherwise (another copy of a
    /// replicated region deciding).
    fn hastened(self, config: &PathConfig, now: Instant) -> Self {
        if self.in_progress {
            return self;
        }
        Self::due_now(config, now)
    }

    /// A probe due at once (a path the map just added).
    fn due_now(config: &PathConfig, now: Instant) -> Self {
        Self {
            due: now,
            delay: config.probe_interval.min(config.probe_max),
            in_progress: false,
        }
    }

    fn probe_failed(&mut self, config: &PathConfig, now: Instant) {
        self.delay = self.delay.saturating_mul(2).min(config.probe_max);
        self.due = now + self.delay;
        self.in_progress = false;
    }

    /// When a probe should be handed out, unless one is already out.
    fn pending(&self) -> Option<Instant> {
        (!self.in_progress).then_some(self.due)
    }

    /// Hands the probe out if it is due and not already out.
    fn take_due(&mut self, now: Instant) -> bool {
        let due = !self.in_progress && self.due <= now;
        if due {
            self.in_progress = true;
        }
        due
    }
}

/// The state of a path's connection.
#[derive(Debug, Clone, Copy)]
enum Connection {
    Up,
    Down {
        since: Instant,
        probe: ProbeSchedule,
    },
}

/// Everything the table tracks about one path.
#[derive(Debug, Clone)]
struct PathState {
    /// Requests sent on the path and not finished yet.
    outstanding: usize,
    connection: Connection,
    /// Servers the path's device reported unavailable, by server index.
    unreachable: BTreeMap<u16, ProbeSchedule>,
    /// The map no longer wires this RNIC to this device: the path takes no
    /// new requests and is not probed.
    retired: bool,
}

impl PathState {
    fn up() -> Self {
        Self {
            outstanding: 0,
            connection: Connection::Up,
            unreachable: BTreeMap::new(),
            retired: false,
        }
    }
}

/// What following a new map did to the paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Followed {
    /// Paths the new map wires that the table did not have (or had
    /// retired): down, with a reconnect probe due at once.
    pub added: Vec<PathId>,
    /// Paths the new map no longer wires: they take no new requests; the
    /// caller closes them once their requests are done.
    pub retired: Vec<PathId>,
}

/// The client's paths with their health and load, and per region the paths
/// that reach it.
#[derive(Debug)]
pub struct PathTable {
    config: PathConfig,
    paths: Vec<PathInfo>,
    states: Vec<PathState>,
    /// Per region index: the owning server's index.
    servers: Vec<u16>,
    /// Per region index: candidate paths in preference order, with whether
    /// they land on the region's socket.
    candidates: Vec<Vec<(PathId, bool)>>,
    /// Per region index: the region's id.
    region_ids: Vec<RegionId>,
    /// Per region index: the owner device of a replicated region; `None`
    /// for a region with one copy.
    owners: Vec<Option<FabricDeviceId>>,
}

impl PathTable {
    /// Paths of `client` (one per RNIC, config order) and, per region index of
    /// `layout`, the candidate paths that reach its server: RNICs whose fabric
    /// device links to the server (from [`Topology::routes`]), each with
    /// `same_socket` = whether that device has a link to a NIC on the region's
    /// socket. Same-socket candidates come first, each group in RNIC order.
    /// Replicated regions get the owners a new map of `topology` records
    /// ([`control::replica_state::initial`]); [`set_owners`](Self::set_owners)
    /// replaces them with those of the map in etcd.
    ///
    /// Errors when the client is unknown, has no RNIC, or an RNIC's fabric
    /// device or port is missing.
    pub fn new(
        topology: &Topology,
        layout: &Layout,
        client: &ClientId,
        config: PathConfig,
    ) -> Result<Self, PathError> {
        let host = topology
            .client(client)
            .ok_or_else(|| PathError::UnknownClient {
                client: client.clone(),
            })?;
        if host.rnics.is_empty() {
            return Err(PathError::NoRnic {
                client: client.clone(),
            });
        }
        let mut paths = Vec::with_capacity(host.rnics.len());
        for (index, rnic) in host.rnics.iter().enumerate() {
            let device = topology.fabric_device(&rnic.fabric_device).ok_or_else(|| {
                PathError::UnknownDevice {
                    client: client.clone(),
                    rnic: rnic.id.clone(),
                    device: rnic.fabric_device.clone(),
                }
            })?;
            let port = rnic.port_on(device).ok_or_else(|| PathError::NoPort {
                client: client.clone(),
                rnic: rnic.id.clone(),
                device: device.id.clone(),
                port: rnic.port.clone(),
            })?;
            paths.push(PathInfo {
                id: PathId(index),
                rnic: rnic.id.clone(),
                device: device.id.clone(),
                device_addr: port.listen.clone(),
                local_addr: rnic.local_addr.clone(),
                transport: rnic.transport,
                rdma_device: rnic.rdma_device.clone(),
            });
        }

        let mut servers = Vec::with_capacity(layout.entries().len());
        let mut candidates = Vec::with_capacity(layout.entries().len());
        let mut region_ids = Vec::with_capacity(layout.entries().len());
        for entry in layout.entries() {
            servers.push(entry.server_index);
            region_ids.push(entry.region_id.clone());
            // Routes come same-socket first, RNICs in config order within each
            // group, one per (RNIC, link); keep the first route of each RNIC.
            let mut list: Vec<(PathId, bool)> = Vec::new();
            for route in topology.routes(client, &entry.region_id) {
                let Some(path) = paths.iter().find(|p| p.rnic == route.rnic) else {
                    continue;
                };
                if list.iter().all(|&(id, _)| id != path.id) {
                    list.push((path.id, route.same_socket));
                }
            }
            candidates.push(list);
        }

        let states = vec![PathState::up(); paths.len()];
        let owners = vec![None; region_ids.len()];
        let mut table = Self {
            config,
            paths,
            states,
            servers,
            candidates,
            region_ids,
            owners,
        };
        table.set_owners(&control::replica_state::initial(topology));
        Ok(table)
    }

    /// Takes the owners of replicated regions from `records` (the map's
    /// replica records); a region without a record has one copy and no
    /// owner.
    pub fn set_owners(&mut self, records: &[ReplicaSetRecord]) {
        self.owners = self
            .region_ids
            .iter()
            .map(|id| {
                records
                    .iter()
                    .find(|r| r.region == id.as_str())
                    .map(|r| FabricDeviceId::new(r.owner.as_str()))
            })
            .collect();
    }

    /// The owner device of `region` when it is replicated.
    pub fn owner_of(&self, region: RegionIndex) -> Option<&FabricDeviceId> {
        self.owners.get(region.0 as usize)?.as_ref()
    }

    /// The id of `region`, if the layout has it.
    pub fn region_id(&self, region: RegionIndex) -> Option<&RegionId> {
        self.region_ids.get(region.0 as usize)
    }

    /// Whether `path` leads to the owner device of `region` (false for a
    /// region with one copy).
    pub fn via_owner(&self, region: RegionIndex, path: PathId) -> bool {
        self.owner_of(region)
            .is_some_and(|owner| self.paths.get(path.0).is_some_and(|p| &p.device == owner))
    }

    /// Whether some candidate path of `region` leads to its owner device,
    /// healthy or not; true for a region with one copy.
    pub fn reaches_owner(&self, region: RegionIndex) -> bool {
        self.owner_of(region).is_none()
            || self
                .candidates(region)
                .iter()
                .any(|&(path, _)| self.via_owner(region, path))
    }

    /// Every path of the client, indexed by [`PathId`].
    pub fn paths(&self) -> &[PathInfo] {
        &self.paths
    }

    /// The timing the table was built with.
    pub fn config(&self) -> &PathConfig {
        &self.config
    }

    /// Best path for a request to `region`, excluding `tried`: among paths
    /// that are Up and not marked unable to reach the region's server,
    /// paths through the owner device of a replicated region before all
    /// others, then same-socket candidates before cross-socket ones, then
    /// fewest outstanding requests, then lowest [`PathId`]. `None` if none
    /// qualifies.
    pub fn choose(&self, region: RegionIndex, tried: &[PathId]) -> Option<PathId> {
        let server = self.server_of(region)?;
        self.candidates(region)
            .iter()
            .filter(|(path, _)| !tried.contains(path) && self.usable(*path, server))
            .min_by_key(|&&(path, same_socket)| {
                (
                    !self.via_owner(region, path),
                    !same_socket,
                    self.outstanding(path),
                    path,
                )
            })
            .map(|&(path, _)| path)
    }

    /// Whether `path` is Up, not retired and not marked unable to reach
    /// `server_index`.
    fn usable(&self, path: PathId, server_index: u16) -> bool {
        let state = &self.states[path.0];
        matches!(state.connection, Connection::Up)
            && !state.retired
            && !state.unreachable.contains_key(&server_index)
    }

    /// Moves the table to a new map, given as `fresh`, the table
    /// [`PathTable::new`] builds from it. A path of `fresh` that leaves on
    /// the same RNIC for the same device port as one of this table keeps
    /// its id, health and counts (its per-server marks follow the servers
    /// through `server_moved`, which gives a server index of the old map
    /// its index in the new one, `None` when the server is gone, and are
    /// probed at once); a path
    /// this table does not have is appended, down with a reconnect probe
    /// due at `now`; a path `fresh` lacks is retired. Region candidates,
    /// servers and owner devices become `fresh`'s.
    pub fn follow(
        &mut self,
        fresh: PathTable,
        server_moved: impl Fn(u16) -> Option<u16>,
        now: Instant,
    ) -> Followed {
        let mut followed = Followed::default();
        let mut id_of_fresh = Vec::with_capacity(fresh.paths.len());
        let mut kept = vec![false; self.paths.len()];
        for info in &fresh.paths {
            let known = self.paths.iter().position(|p| p.same_link(info));
            let id = match known {
                Some(index) => {
                    let state = &mut self.states[index];
                    if state.retired {
                        state.retired = false;
                        state.connection = Connection::Down {
                            since: now,
                            probe: ProbeSchedule::due_now(&self.config, now),
                        };
                        followed.added.push(PathId(index));
                    }
                    let marks = std::mem::take(&mut state.unreachable);
                    let config = &self.config;
                    state.unreachable = marks
                        .into_iter()
                        .filter_map(|(server, backoff)| {
                            Some((server_moved(server)?, backoff.hastened(config, now)))
                        })
                        .collect();
                    kept[index] = true;
                    PathId(index)
                }
                None => {
                    let id = PathId(self.paths.len());
                    self.paths.push(PathInfo { id, ..info.clone() });
                    self.states.push(PathState {
                        connection: Connection::Down {
                            since: now,
                            probe: ProbeSchedule::due_now(&self.config, now),
                        },
                        ..PathState::up()
                    });
                    kept.push(true);
                    followed.added.push(id);
                    id
                }
            };
            id_of_fresh.push(id);
        }
        for (index, kept) in kept.into_iter().enumerate() {
            let state = &mut self.states[index];
            if !kept && !state.retired {
                state.retired = true;
                state.unreachable.clear();
                followed.retired.push(PathId(index));
            }
        }
        self.servers = fresh.servers;
        self.region_ids = fresh.region_ids;
        self.owners = fresh.owners;
        self.candidates = fresh
            .candidates
            .into_iter()
            .map(|list| {
                list.into_iter()
                    .map(|(path, same_socket)| (id_of_fresh[path.0], same_socket))
                    .collect()
            })
            .collect();
        followed
    }

    /// Whether the map no longer wires `path` (see [`follow`](Self::follow)).
    pub fn is_retired(&self, path: PathId) -> bool {
        self.states[path.0].retired
    }

    /// A request was sent on `path`.
    pub fn started(&mut self, path: PathId) {
        self.states[path.0].outstanding += 1;
    }

    /// A request sent on `path` finished (answered, failed or abandoned).
    pub fn finished(&mut self, path: PathId) {
        let state = &mut self.states[path.0];
        state.outstanding = state.outstanding.saturating_sub(1);
    }

    /// Requests sent on `path` and not finished yet.
    pub fn outstanding(&self, path: PathId) -> usize {
        self.states[path.0].outstanding
    }

    /// An attempt on `path` for a region of server `server_index` failed.
    ///
    /// [`Failure::ConnectionLost`] and [`Failure::Timeout`] mark the whole
    /// path Down, with a reconnect probe at `now + probe_interval`;
    /// [`Failure::ServerUnavailable`] marks only (path, server) unreachable,
    /// with a probe of that server at `now + probe_interval`. Something
    /// already down keeps its probe schedule: a probe's own outcome is
    /// reported with [`probe_failed`](Self::probe_failed),
    /// [`path_restored`](Self::path_restored) or
    /// [`report_success`](Self::report_success).
    pub fn report_failure(
        &mut self,
        path: PathId,
        server_index: u16,
        failure: Failure,
        now: Instant,
    ) {
        let config = self.config;
        let state = &mut self.states[path.0];
        match failure {
            Failure::ConnectionLost | Failure::Timeout => {
                if let Connection::Up = state.connection {
                    state.connection = Connection::Down {
                        since: now,
                        probe: ProbeSchedule::start(&config, now),
                    };
                    // Server probes in flight on the dead connection will not
                    // answer; hand them out again once the path is back.
                    for probe in state.unreachable.values_mut() {
                        probe.in_progress = false;
                    }
                }
            }
            Failure::ServerUnavailable | Failure::Behind => {
                state
                    .unreachable
                    .entry(server_index)
                    .or_insert_with(|| ProbeSchedule::start(&config, now));
            }
            // The device and its server are fine; the owner is elsewhere.
            Failure::NotOwner | Failure::OwnerAway => {}
        }
    }

    /// An answer came back on `path` from `server_index`: that pair is
    /// reachable again, and the path is Up.
    pub fn report_success(&mut self, path: PathId, server_index: u16, _now: Instant) {
        let state = &mut self.states[path.0];
        state.unreachable.remove(&server_index);
        state.connection = Connection::Up;
    }

    /// The path's connection was re-established (reconnect and handshake
    /// succeeded): Up again. Its per-server marks stay until their own probes
    /// answer.
    pub fn path_restored(&mut self, path: PathId, _now: Instant) {
        self.states[path.0].connection = Connection::Up;
    }

    /// A probe handed out by [`probes_due`](Self::probes_due) failed: the
    /// next one comes after twice the previous delay, at most `probe_max`.
    /// Ignored when what it probed has meanwhile come back.
    pub fn probe_failed(&mut self, probe: Probe, now: Instant) {
        let config = self.config;
        let state = &mut self.states[probe.path.0];
        let backoff = match probe.server {
            None => match &mut state.connection {
                Connection::Down { probe, .. } => Some(probe),
                Connection::Up => None,
            },
            Some(server) => state.unreachable.get_mut(&server),
        };
        if let Some(backoff) = backoff {
            backoff.probe_failed(&config, now);
        }
    }

    /// Probes whose time has come, in path order: `Probe { path, server: None
    /// }` = reconnect the path; `Probe { path, server: Some(s) }` = ask server
    /// `s` through the path (only handed out while the path is Up). Each
    /// returned probe is in progress until [`probe_failed`](Self::probe_failed),
    /// [`path_restored`](Self::path_restored) or
    /// [`report_success`](Self::report_success) settles it, and is not handed
    /// out again meanwhile.
    pub fn probes_due(&mut self, now: Instant) -> Vec<Probe> {
        let mut due = Vec::new();
        for (index, state) in self.states.iter_mut().enumerate() {
            let path = PathId(index);
            if state.retired {
                continue;
            }
            match &mut state.connection {
                Connection::Down { probe, .. } => {
                    if probe.take_due(now) {
                        due.push(Probe { path, server: None });
                    }
                }
                Connection::Up => {
                    for (&server, probe) in &mut state.unreachable {
                        if probe.take_due(now) {
                            due.push(Probe {
                                path,
                                server: Some(server),
                            });
                        }
                    }
                }
            }
        }
        due
    }

    /// When [`probes_due`](Self::probes_due) next has something (possibly
    /// already past); `None` if nothing is down or every probe is in progress.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.states
            .iter()
            .filter(|state| !state.retired)
            .filter_map(|state| match &state.connection {
                Connection::Down { probe, .. } => probe.pending(),
                Connection::Up => state
                    .unreachable
                    .values()
                    .filter_map(ProbeSchedule::pending)
                    .min(),
            })
            .min()
    }

    /// How the path's connection is doing.
    pub fn health(&self, path: PathId) -> PathHealth {
        match self.states[path.0].connection {
            Connection::Up => PathHealth::Up,
            Connection::Down { since, .. } => PathHealth::Down { since },
        }
    }

    /// Whether `path` is marked unable to reach server `server_index` (its
    /// device answered `SERVER_UNAVAILABLE` and no probe has answered since).
    /// The connection's own state is [`health`](Self::health).
    pub fn unreachable(&self, path: PathId, server_index: u16) -> bool {
        self.states[path.0].unreachable.contains_key(&server_index)
    }

    /// The server index of a region (from the layout).
    pub fn server_of(&self, region: RegionIndex) -> Option<u16> {
        self.servers.get(region.0 as usize).copied()
    }

    /// A region's candidate paths in preference order, each with whether it
    /// lands on the region's own socket; empty for an unknown region.
    pub fn candidates(&self, region: RegionIndex) -> &[(PathId, bool)] {
        self.candidates
            .get(region.0 as usize)
            .map_or(&[], Vec::as_slice)
    }
}

/// The retry bookkeeping of one operation (one per-region request).
#[derive(Debug, Clone)]
pub struct Attempts {
    region: RegionIndex,
    start: Instant,
    /// Every path handed out by [`Attempts::next`], in order (repeats when a
    /// recovered path is retried).
    sent: Vec<PathId>,
    /// Failed attempts, in order.
    tried: Vec<(PathId, Failure)>,
}

/// What to do with an operation next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Send the (next) attempt on this path.
    Send(PathId),
    /// Stop and report an error to the application.
    GiveUp(GiveUp),
}

/// Why an operation stops without an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GiveUp {
    /// Every failed attempt, in order.
    pub tried: Vec<(PathId, Failure)>,
    /// Why no further attempt is made.
    pub reason: GiveUpReason,
}

/// Why no further attempt is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUpReason {
    /// No attempt was made: no candidate path is up and reaches the server.
    NoPath,
    /// Every path that could be tried was tried and failed, and none has
    /// come back since.
    AllFailed,
    /// The operation's `op_timeout` has passed.
    Deadline,
}

impl fmt::Display for GiveUpReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NoPath => "no path to the server is up",
            Self::AllFailed => "every path to the server failed",
            Self::Deadline => "the operation timed out",
        })
    }
}

impl fmt::Display for GiveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.reason)?;
        for (i, (path, failure)) in self.tried.iter().enumerate() {
            let sep = if i == 0 { " (" } else { ", " };
            write!(f, "{sep}{path}: {failure}")?;
        }
        if !self.tried.is_empty() {
            f.write_str(")")?;
        }
        Ok(())
    }
}

impl Attempts {
    /// Bookkeeping for an operation on `region` starting at `now`.
    pub fn new(region: RegionIndex, now: Instant) -> Self {
        Self {
            region,
            start: now,
            sent: Vec::new(),
            tried: Vec::new(),
        }
    }

    /// The region the operation is for.
    pub fn region(&self) -> RegionIndex {
        self.region
    }

    /// The region's index in a newer epoch of the map (regions may be
    /// renumbered when others are withdrawn); the start and what was tried
    /// stay (path ids are stable across epochs).
    pub fn renumber(&mut self, region: RegionIndex) {
        self.region = region;
    }

    /// When the operation must be over: start + `op_timeout`.
    pub fn op_deadline(&self, table: &PathTable) -> Instant {
        self.start + table.config().op_timeout
    }

    /// The path for the first or next attempt, recorded as tried.
    ///
    /// Untried paths come first ([`PathTable::choose`]). Once every usable
    /// candidate has been tried, and the op deadline has not passed, a path
    /// that has since come back Up and reaches the server is tried again, so a
    /// request rides out a brief outage. Otherwise [`Next::GiveUp`]:
    /// [`GiveUpReason::Deadline`] once `op_timeout` has passed,
    /// [`GiveUpReason::NoPath`] when no attempt could be made at all,
    /// [`GiveUpReason::AllFailed`] when attempts were made and no path is
    /// left. A give-up before the deadline is not final: calling `next` again
    /// after a path has come back sends on it.
    pub fn next(&mut self, table: &PathTable, now: Instant) -> Next {
        if now >= self.op_deadline(table) {
            return self.give_up(GiveUpReason::Deadline);
        }
        let path = table
            .choose(self.region, &self.sent)
            .or_else(|| table.choose(self.region, &[]));
        match path {
            Some(path) => {
                self.sent.push(path);
                Next::Send(path)
            }
            None if self.sent.is_empty() => self.give_up(GiveUpReason::NoPath),
            None => self.give_up(GiveUpReason::AllFailed),
        }
    }

    fn give_up(&self, reason: GiveUpReason) -> Next {
        Next::GiveUp(GiveUp {
            tried: self.tried.clone(),
            reason,
        })
    }

    /// The attempt on `path` failed with `failure` (the caller also reports it
    /// to the table with [`PathTable::report_failure`]).
    pub fn failed(&mut self, path: PathId, failure: Failure) {
        self.tried.push((path, failure));
    }

    /// Every failed attempt so far, in order.
    pub fn tried(&self) -> &[(PathId, Failure)] {
        &self.tried
    }

    /// Deadline for the current attempt: `now + attempt_timeout`, but no later
    /// than the operation's deadline.
    pub fn attempt_deadline(&self, table: &PathTable, now: Instant) -> Instant {
        (now + table.config().attempt_timeout).min(self.op_deadline(table))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use topology::EnvOverrides;

    const DEFAULT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/default.toml");
    const FIG4A: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/fig4a.toml");

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn load(path: &str) -> Topology {
        Topology::load_with(path, &EnvOverrides::None).unwrap()
    }

    fn table_for(topology: &Topology, client: &str) -> PathTable {
        let layout = Layout::new(topology).unwrap();
        PathTable::new(
            topology,
            &layout,
            &ClientId::new(client),
            PathConfig::default(),
        )
        .unwrap()
    }

    /// default.toml as client c1: path 0 = r0 → device A, path 1 = r1 → device B.
    fn default_table() -> PathTable {
        table_for(&load(DEFAULT), "c1")
    }

    /// fig4a.toml as client A: paths 0, 1, 2 = RNICs A, B, C → devices A, B, C.
    fn fig4a_table() -> PathTable {
        table_for(&load(FIG4A), "A")
    }

    fn region(topology: &str, id: &str) -> RegionIndex {
        let layout = Layout::new(&load(topology)).unwrap();
        layout.entry_by_id(&id.into()).unwrap().region
    }

    const P0: PathId = PathId(0);
    const P1: PathId = PathId(1);
    const P2: PathId = PathId(2);

    #[test]
    fn paths_are_one_per_rnic_in_config_order() {
        let table = default_table();
        let summary: Vec<_> = table
            .paths()
            .iter()
            .map(|p| {
                (
                    p.id,
                    p.rnic.as_str(),
                    p.device.as_str(),
                    p.device_addr.as_str(),
                    p.local_addr.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (P0, "r0", "A", "127.0.2.1:7100", Some("127.0.3.1")),
                (P1, "r1", "B", "127.0.2.2:7100", Some("127.0.3.2")),
            ]
        );
        assert_eq!(table.config(), &PathConfig::default());
    }

    #[test]
    fn regions_know_their_server_and_candidates() {
        let table = default_table();
        let pb2 = region(DEFAULT, "PB.2");
        assert_eq!(table.server_of(RegionIndex(0)), Some(0));
        assert_eq!(table.server_of(pb2), Some(1));
        // Every device links both NICs of both servers: both paths land on
        // the region's socket.
        assert_eq!(table.candidates(pb2), &[(P0, true), (P1, true)]);
        assert_eq!(table.server_of(RegionIndex(99)), None);
        assert!(table.candidates(RegionIndex(99)).is_empty());
        assert_eq!(table.choose(RegionIndex(99), &[]), None);
    }

    #[test]
    fn same_socket_candidates_come_first() {
        let table = fig4a_table();
        // PC.5 sits on server C socket 1: device B links socket-1 NICs,
        // A links socket 0, C links server C's socket-0 NIC.
        let pc5 = region(FIG4A, "PC.5");
        assert_eq!(table.server_of(pc5), Some(2));
        assert_eq!(
            table.candidates(pc5),
            &[(P1, true), (P0, false), (P2, false)]
        );
        assert_eq!(table.choose(pc5, &[]), Some(P1));
        // PC.1 on socket 0: A and C same-socket, B crosses.
        let pc1 = region(FIG4A, "PC.1");
        assert_eq!(
            table.candidates(pc1),
            &[(P0, true), (P2, true), (P1, false)]
        );
        assert_eq!(table.choose(pc1, &[]), Some(P0));
        // PB.2 on socket 0: C links server B's socket-1 NIC, so it crosses.
        let pb2 = region(FIG4A, "PB.2");
        assert_eq!(
            table.candidates(pb2),
            &[(P0, true), (P1, false), (P2, false)]
        );
    }

    #[test]
    fn same_socket_wins_over_load_but_health_wins_over_socket() {
        let mut table = fig4a_table();
        let t0 = Instant::now();
        let pc5 = region(FIG4A, "PC.5");
        for _ in 0..10 {
            table.started(P1);
        }
        assert_eq!(table.choose(pc5, &[]), Some(P1));
        table.report_failure(P1, 2, Failure::ConnectionLost, t0);
        // Cross-socket paths by load, then id.
        table.started(P0);
        assert_eq!(table.choose(pc5, &[]), Some(P2));
        assert_eq!(table.choose(pc5, &[P2]), Some(P0));
        assert_eq!(table.choose(pc5, &[P0, P2]), None);
    }

    #[test]
    fn least_outstanding_among_equals_then_lowest_id() {
        let mut table = default_table();
        let r = RegionIndex(0);
        assert_eq!(table.choose(r, &[]), Some(P0));
        table.started(P0);
        assert_eq!(table.outstanding(P0), 1);
        assert_eq!(table.choose(r, &[]), Some(P1));
        table.started(P1);
        assert_eq!(table.choose(r, &[]), Some(P0));
        table.started(P1);
        assert_eq!(table.choose(r, &[]), Some(P0));
        table.finished(P1);
        table.finished(P1);
        assert_eq!(table.outstanding(P1), 0);
        assert_eq!(table.choose(r, &[]), Some(P1));
        // Finishing more than started does not underflow.
        table.finished(P1);
        assert_eq!(table.outstanding(P1), 0);
        // Excluded paths are skipped whatever their load.
        assert_eq!(table.choose(r, &[P1]), Some(P0));
    }

    #[test]
    fn connection_loss_moves_traffic_to_the_other_path() {
        let mut table = default_table();
        let t0 = Instant::now();
        let r = RegionIndex(0);

        let mut op = Attempts::new(r, t0);
        assert_eq!(op.next(&table, t0), Next::Send(P0));
        table.started(P0);
        let t1 = t0 + ms(5);
        op.failed(P0, Failure::ConnectionLost);
        table.report_failure(P0, 0, Failure::ConnectionLost, t1);
        table.finished(P0);
        assert_eq!(table.health(P0), PathHealth::Down { since: t1 });
        assert_eq!(op.next(&table, t1), Next::Send(P1));

        // A second operation, to any server, avoids the dead path.
        let mut second = Attempts::new(region(DEFAULT, "PB.1"), t1);
        assert_eq!(second.next(&table, t1), Next::Send(P1));
        // Even with the live path loaded.
        for _ in 0..5 {
            table.started(P1);
        }
        assert_eq!(table.choose(r, &[]), Some(P1));
    }

    #[test]
    fn timeout_marks_the_path_down() {
        let mut table = default_table();
        let t0 = Instant::now();
        table.report_failure(P1, 1, Failure::Timeout, t0);
        assert_eq!(table.health(P1), PathHealth::Down { since: t0 });
        assert_eq!(table.health(P0), PathHealth::Up);
        // A second failure while down keeps the original time and schedule.
        table.report_failure(P1, 0, Failure::ConnectionLost, t0 + ms(30));
        assert_eq!(table.health(P1), PathHealth::Down { since: t0 });
        assert_eq!(table.poll_timeout(), Some(t0 + ms(50)));
    }

    #[test]
    fn server_unavailable_marks_only_that_server() {
        let mut table = default_table();
        let t0 = Instant::now();
        let pa1 = region(DEFAULT, "PA.1");
        let pb1 = region(DEFAULT, "PB.1");
        table.report_failure(P0, 0, Failure::ServerUnavailable, t0);
        assert_eq!(table.health(P0), PathHealth::Up);
        assert!(table.unreachable(P0, 0));
        assert!(!table.unreachable(P0, 1));
        assert!(!table.unreachable(P1, 0));
        assert_eq!(table.choose(pa1, &[]), Some(P1));
        assert_eq!(table.choose(pa1, &[P1]), None);
        // P0 still carries requests for server B.
        assert_eq!(table.choose(pb1, &[]), Some(P0));

        // The server probe goes through the live path.
        assert_eq!(table.poll_timeout(), Some(t0 + ms(50)));
        let probes = table.probes_due(t0 + ms(50));
        assert_eq!(
            probes,
            vec![Probe {
                path: P0,
                server: Some(0)
            }]
        );
        // Its answer clears the mark.
        table.report_success(P0, 0, t0 + ms(51));
        assert!(!table.unreachable(P0, 0));
        assert_eq!(table.choose(pa1, &[]), Some(P0));
        assert_eq!(table.poll_timeout(), None);
    }

    #[test]
    fn probes_back_off_doubling_up_to_the_cap() {
        let mut table = default_table();
        let t0 = Instant::now();
        assert_eq!(table.poll_timeout(), None);
        assert!(table.probes_due(t0 + ms(10_000)).is_empty());

        table.report_failure(P0, 0, Failure::ConnectionLost, t0);
        let reconnect = Probe {
            path: P0,
            server: None,
        };
        assert_eq!(table.poll_timeout(), Some(t0 + ms(50)));
        assert!(table.probes_due(t0 + ms(49)).is_empty());
        let mut now = t0 + ms(50);
        assert_eq!(table.probes_due(now), vec![reconnect]);
        // In progress: not handed out twice, nothing to wait for.
        assert!(table.probes_due(now + ms(500)).is_empty());
        assert_eq!(table.poll_timeout(), None);

        let mut delays = Vec::new();
        for _ in 0..7 {
            now += ms(3); // the probe took a while to fail
            table.probe_failed(reconnect, now);
            let due = table.poll_timeout().unwrap();
            delays.push(due.duration_since(now).as_millis());
            assert!(table.probes_due(due - ms(1)).is_empty());
            now = due;
            assert_eq!(table.probes_due(now), vec![reconnect]);
        }
        assert_eq!(delays, vec![100, 200, 400, 800, 1000, 1000, 1000]);
        assert_eq!(table.health(P0), PathHealth::Down { since: t0 });
    }

    #[test]
    fn server_probes_wait_for_the_connection_and_back_off() {
        let mut table = default_table();
        let t0 = Instant::now();
        table.report_failure(P1, 1, Failure::ServerUnavailable, t0);
        let ask = Probe {
            path: P1,
            server: Some(1),
        };
        assert_eq!(table.probes_due(t0 + ms(50)), vec![ask]);
        table.probe_failed(ask, t0 + ms(60));
        assert_eq!(table.poll_timeout(), Some(t0 + ms(160)));

        // The connection dies: only the reconnect probe is due meanwhile.
        table.report_failure(P1, 0, Failure::ConnectionLost, t0 + ms(100));
        assert_eq!(table.poll_timeout(), Some(t0 + ms(150)));
        let reconnect = Probe {
            path: P1,
            server: None,
        };
        assert_eq!(table.probes_due(t0 + ms(200)), vec![reconnect]);
        assert_eq!(table.poll_timeout(), None);

        // Back up: the server mark stays and its overdue probe is handed out.
        table.path_restored(P1, t0 + ms(210));
        assert_eq!(table.health(P1), PathHealth::Up);
        assert!(table.unreachable(P1, 1));
        assert_eq!(table.poll_timeout(), Some(t0 + ms(160)));
        assert_eq!(table.probes_due(t0 + ms(210)), vec![ask]);
        assert!(table.probes_due(t0 + ms(220)).is_empty());
        // Settled failures of things already back are ignored.
        table.probe_failed(reconnect, t0 + ms(220));
        assert_eq!(table.health(P1), PathHealth::Up);
        table.probe_failed(ask, t0 + ms(220));
        assert_eq!(table.poll_timeout(), Some(t0 + ms(420)));
    }

    #[test]
    fn server_probe_in_flight_on_a_dying_connection_is_reissued() {
        let mut table = default_table();
        let t0 = Instant::now();
        table.report_failure(P0, 1, Failure::ServerUnavailable, t0);
        let ask = Probe {
            path: P0,
            server: Some(1),
        };
        assert_eq!(table.probes_due(t0 + ms(50)), vec![ask]);
        table.report_failure(P0, 1, Failure::ConnectionLost, t0 + ms(55));
        table.path_restored(P0, t0 + ms(120));
        assert_eq!(table.probes_due(t0 + ms(120)), vec![ask]);
    }

    #[test]
    fn restored_path_is_chosen_again() {
        let mut table = default_table();
        let t0 = Instant::now();
        let r = RegionIndex(1);
        table.report_failure(P0, 0, Failure::ConnectionLost, t0);
        assert_eq!(table.choose(r, &[]), Some(P1));
        let probes = table.probes_due(t0 + ms(50));
        assert_eq!(probes.len(), 1);
        table.path_restored(P0, t0 + ms(52));
        assert_eq!(table.health(P0), PathHealth::Up);
        assert_eq!(table.poll_timeout(), None);
        assert_eq!(table.choose(r, &[]), Some(P0));
        // A later loss starts the backoff afresh.
        table.report_failure(P0, 0, Failure::Timeout, t0 + ms(1000));
        assert_eq!(table.poll_timeout(), Some(t0 + ms(1050)));
    }

    #[test]
    fn an_answer_brings_a_down_path_back() {
        let mut table = default_table();
        let t0 = Instant::now();
        table.report_failure(P0, 0, Failure::Timeout, t0);
        table.report_success(P0, 0, t0 + ms(20));
        assert_eq!(table.health(P0), PathHealth::Up);
        assert_eq!(table.poll_timeout(), None);
        assert_eq!(table.choose(RegionIndex(0), &[]), Some(P0));
    }

    #[test]
    fn attempts_try_every_path_then_give_up_all_failed() {
        let mut table = fig4a_table();
        let t0 = Instant::now();
        let pc5 = region(FIG4A, "PC.5");
        let mut op = Attempts::new(pc5, t0);
        let failures = [
            Failure::ServerUnavailable,
            Failure::Timeout,
            Failure::ConnectionLost,
        ];
        let mut order = Vec::new();
        let mut now = t0;
        for failure in failures {
            let Next::Send(path) = op.next(&table, now) else {
                panic!("gave up early");
            };
            order.push(path);
            now += ms(10);
            op.failed(path, failure);
            table.report_failure(path, 2, failure, now);
        }
        // Same-socket B first, then the cross-socket paths.
        assert_eq!(order, vec![P1, P0, P2]);
        let expected = GiveUp {
            tried: vec![
                (P1, Failure::ServerUnavailable),
                (P0, Failure::Timeout),
                (P2, Failure::ConnectionLost),
            ],
            reason: GiveUpReason::AllFailed,
        };
        assert_eq!(op.tried(), expected.tried.as_slice());
        assert_eq!(op.next(&table, now), Next::GiveUp(expected.clone()));
        assert_eq!(
            expected.to_string(),
            "every path to the server failed (path 1: server unavailable, \
             path 0: timed out, path 2: connection lost)"
        );
        // Path B still reaches other servers.
        assert_eq!(table.choose(region(FIG4A, "PA.5"), &[]), Some(P1));
    }

    #[test]
    fn attempts_give_up_no_path_when_nothing_is_up() {
        let mut table = default_table();
        let t0 = Instant::now();
        table.report_failure(P0, 0, Failure::ConnectionLost, t0);
        table.report_failure(P1, 0, Failure::ServerUnavailable, t0);
        let mut op = Attempts::new(RegionIndex(0), t0);
        let next = op.next(&table, t0);
        assert_eq!(
            next,
            Next::GiveUp(GiveUp {
                tried: Vec::new(),
                reason: GiveUpReason::NoPath
            })
        );
        assert!(op.tried().is_empty());
    }

    #[test]
    fn attempts_give_up_after_the_op_deadline() {
        let mut table = default_table();
        let t0 = Instant::now();
        let mut op = Attempts::new(RegionIndex(0), t0);
        assert_eq!(op.next(&table, t0), Next::Send(P0));
        let t1 = t0 + ms(10_000);
        op.failed(P0, Failure::Timeout);
        table.report_failure(P0, 0, Failure::Timeout, t1);
        // P1 is up, but the operation has run out of time.
        assert_eq!(
            op.next(&table, t1),
            Next::GiveUp(GiveUp {
                tried: vec![(P0, Failure::Timeout)],
                reason: GiveUpReason::Deadline
            })
        );
        assert_eq!(op.next(&table, t0 + ms(9_999)), Next::Send(P1));
    }

    #[test]
    fn a_path_that_recovers_before_the_deadline_is_retried() {
        let mut table = default_table();
        let t0 = Instant::now();
        let r = RegionIndex(0);
        let mut op = Attempts::new(r, t0);

        assert_eq!(op.next(&table, t0), Next::Send(P0));
        op.failed(P0, Failure::ConnectionLost);
        table.report_failure(P0, 0, Failure::ConnectionLost, t0 + ms(1));
        assert_eq!(op.next(&table, t0 + ms(1)), Next::Send(P1));

        // P0 reconnects while P1's attempt is out; then P1 dies too.
        let probes = table.probes_due(t0 + ms(51));
        assert_eq!(
            probes,
            vec![Probe {
                path: P0,
                server: None
            }]
        );
        table.path_restored(P0, t0 + ms(60));
        op.failed(P1, Failure::Timeout);
        table.report_failure(P1, 0, Failure::Timeout, t0 + ms(2001));
        assert_eq!(op.next(&table, t0 + ms(2001)), Next::Send(P0));

        // P0 fails again, nothing is left: AllFailed with the whole history.
        op.failed(P0, Failure::ServerUnavailable);
        table.report_failure(P0, 0, Failure::ServerUnavailable, t0 + ms(2002));
        let Next::GiveUp(give_up) = op.next(&table, t0 + ms(2002)) else {
            panic!("expected to give up");
        };
        assert_eq!(give_up.reason, GiveUpReason::AllFailed);
        assert_eq!(
            give_up.tried,
            vec![
                (P0, Failure::ConnectionLost),
                (P1, Failure::Timeout),
                (P0, Failure::ServerUnavailable),
            ]
        );

        // Giving up before the deadline is not final: once P1 is back, the
        // operation can go on.
        table.path_restored(P1, t0 + ms(3000));
        assert_eq!(op.next(&table, t0 + ms(3000)), Next::Send(P1));
    }

    #[test]
    fn attempt_deadline_is_capped_by_the_op_deadline() {
        let table = default_table();
        let t0 = Instant::now();
        let op = Attempts::new(RegionIndex(0), t0);
        assert_eq!(op.region(), RegionIndex(0));
        assert_eq!(op.op_deadline(&table), t0 + ms(10_000));
        assert_eq!(op.attempt_deadline(&table, t0), t0 + ms(2_000));
        assert_eq!(op.attempt_deadline(&table, t0 + ms(7_000)), t0 + ms(9_000));
        assert_eq!(op.attempt_deadline(&table, t0 + ms(9_000)), t0 + ms(10_000));
    }

    #[test]
    fn custom_config_drives_probes_and_deadlines() {
        let topology = load(DEFAULT);
        let layout = Layout::new(&topology).unwrap();
        let config = PathConfig {
            probe_interval: ms(10),
            probe_max: ms(25),
            attempt_timeout: ms(100),
            op_timeout: ms(150),
        };
        let mut table = PathTable::new(&topology, &layout, &"c2".into(), config).unwrap();
        let t0 = Instant::now();
        table.report_failure(P0, 0, Failure::ConnectionLost, t0);
        let reconnect = Probe {
            path: P0,
            server: None,
        };
        assert_eq!(table.probes_due(t0 + ms(10)), vec![reconnect]);
        table.probe_failed(reconnect, t0 + ms(10));
        assert_eq!(table.poll_timeout(), Some(t0 + ms(30)));
        table.probes_due(t0 + ms(30));
        table.probe_failed(reconnect, t0 + ms(30));
        assert_eq!(table.poll_timeout(), Some(t0 + ms(55)));
        let op = Attempts::new(RegionIndex(0), t0);
        assert_eq!(op.attempt_deadline(&table, t0 + ms(100)), t0 + ms(150));
    }

    #[test]
    fn unknown_or_unwired_clients_are_errors() {
        let mut topology = load(DEFAULT);
        let layout = Layout::new(&topology).unwrap();
        let config = PathConfig::default();
        let err = PathTable::new(&topology, &layout, &"nobody".into(), config).unwrap_err();
        assert_eq!(
            err,
            PathError::UnknownClient {
                client: "nobody".into()
            }
        );
        assert_eq!(err.to_string(), "client nobody is not in the topology");

        topology.clients[0].rnics[1].port = Some("p9".into());
        let err = PathTable::new(&topology, &layout, &"c1".into(), config).unwrap_err();
        assert_eq!(
            err.to_string(),
            "RNIC r1 of client c1: fabric device B has no port p9"
        );

        topology.clients[0].rnics[0].fabric_device = "Z".into();
        let err = PathTable::new(&topology, &layout, &"c1".into(), config).unwrap_err();
        assert!(
            matches!(err, PathError::UnknownDevice { ref device, .. } if device.as_str() == "Z")
        );

        topology.clients[0].rnics.clear();
        let err = PathTable::new(&topology, &layout, &"c1".into(), config).unwrap_err();
        assert_eq!(
            err,
            PathError::NoRnic {
                client: "c1".into()
            }
        );
    }

    fn edited(edit: impl Fn(&str) -> String) -> (Topology, Layout) {
        let text = edit(&std::fs::read_to_string(DEFAULT).unwrap());
        let topology = Topology::from_toml_str("edited", &text, &EnvOverrides::None).unwrap();
        topology.validate().unwrap();
        let layout = Layout::new(&topology).unwrap();
        (topology, layout)
    }

    fn fresh(topology: &Topology, layout: &Layout) -> PathTable {
        PathTable::new(
            topology,
            layout,
            &ClientId::new("c1"),
            PathConfig::default(),
        )
        .unwrap()
    }

    #[test]
    fn a_removed_device_retires_its_path_and_the_others_keep_their_state() {
        let t0 = Instant::now();
        let mut table = default_table();
        let r = region(DEFAULT, "PA.1");
        table.started(P0);
        table.report_failure(P0, 1, Failure::ServerUnavailable, t0);
        let (topology, layout) =
            edited(|text| control::edit::remove_device(text, "B").unwrap().topology);
        let followed = table.follow(fresh(&topology, &layout), Some, t0);
        assert_eq!(
            followed,
            Followed {
                added: vec![],
                retired: vec![P1]
            }
        );
        assert_eq!(table.outstanding(P0), 1, "counts stay");
        assert!(table.unreachable(P0, 1), "marks stay");
        assert!(table.is_retired(P1));
        assert_eq!(table.choose(r, &[]), Some(P0));
        assert_eq!(table.choose(r, &[P0]), None, "no new request on P1");
        table.report_failure(P1, 0, Failure::ConnectionLost, t0);
        assert!(
            table
                .probes_due(t0 + ms(10_000))
                .iter()
                .all(|p| p.path != P1),
            "a retired path is not probed"
        );
    }

    #[test]
    fn a_new_map_probes_an_unreachable_server_at_once_unless_a_probe_is_out() {
        let t0 = Instant::now();
        let mut table = default_table();
        table.report_failure(P0, 1, Failure::ServerUnavailable, t0);
        table.report_failure(P1, 1, Failure::ServerUnavailable, t0);
        // Probes of both marks fail a few times: the next is a while off.
        let mut now = t0;
        for _ in 0..4 {
            now += ms(2_000);
            for probe in table.probes_due(now) {
                table.probe_failed(probe, now);
            }
        }
        let t1 = now + ms(1);
        assert_eq!(table.probes_due(t1), vec![]);
        // Both marks' next probes are handed out; one fails before the map
        // changes, the other is still out.
        let out = table.probes_due(now + ms(1_000));
        assert_eq!(out.len(), 2, "{out:?}");
        table.probe_failed(out[0], now + ms(1_000));
        let t2 = now + ms(1_001);
        let (topology, layout) = edited(str::to_owned);
        table.follow(fresh(&topology, &layout), Some, t2);
        let due = table.probes_due(t2);
        assert_eq!(
            due,
            vec![Probe {
                path: out[0].path,
                server: Some(1)
            }],
            "the settled mark is probed at once, the one out is not probed twice"
        );
    }

    #[test]
    fn a_device_added_again_gets_its_old_path_back_down_and_probed_at_once() {
        let t0 = Instant::now();
        let mut table = default_table();
        let (without, layout) =
            edited(|text| control::edit::remove_device(text, "B").unwrap().topology);
        table.follow(fresh(&without, &layout), Some, t0);
        let topology = load(DEFAULT);
        let layout = Layout::new(&topology).unwrap();
        let followed = table.follow(fresh(&topology, &layout), Some, t0);
        assert_eq!(followed.added, vec![P1]);
        assert!(!table.is_retired(P1));
        assert!(matches!(table.health(P1), PathHealth::Down { .. }));
        assert_eq!(
            table.probes_due(t0),
            vec![Probe {
                path: P1,
                server: None
            }]
        );
    }

    #[test]
    fn a_new_rnic_is_appended_and_marks_follow_their_server() {
        let t0 = Instant::now();
        let mut table = default_table();
        table.report_failure(P0, 1, Failure::Behind, t0);
        table.report_failure(P1, 0, Failure::ServerUnavailable, t0);
        let (topology, layout) = edited(|text| {
            text.replace(
                "  { id = \"r1\", fabric_device = \"B\", local_addr = \"127.0.3.2\" },",
                "  { id = \"r1\", fabric_device = \"B\", local_addr = \"127.0.3.2\" },\n  \
                 { id = \"r2\", fabric_device = \"A\", local_addr = \"127.0.3.9\" },",
            )
        });
        // Server 0 is gone from the new map, server 1 is now 0.
        let moves = |server: u16| (server == 1).then_some(0);
        let followed = table.follow(fresh(&topology, &layout), moves, t0);
        let p2 = PathId(2);
        assert_eq!(followed.added, vec![p2]);
        assert_eq!(table.paths()[2].rnic.as_str(), "r2");
        assert!(
            table.unreachable(P0, 0),
            "server 1's mark is now server 0's"
        );
        assert!(!table.unreachable(P0, 1));
        assert!(
            !table.unreachable(P1, 0),
            "the gone server's mark is dropped"
        );
        let r = region(DEFAULT, "PA.1");
        assert!(table.candidates(r).iter().any(|&(p, _)| p == p2));
    }

    const REPLICATED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/replicated.toml");

    /// replicated.toml as client c1: path 0 → device A, path 1 → device B;
    /// owners PA.1 → A, PA.2 → B, PB.1 → A, PB.2 → B.
    fn replicated_table() -> PathTable {
        table_for(&load(REPLICATED), "c1")
    }

    #[test]
    fn a_replicated_regions_owner_paths_come_first_and_alone_while_one_is_up() {
        let t0 = Instant::now();
        let mut table = replicated_table();
        let (pa1, pa2) = (region(REPLICATED, "PA.1"), region(REPLICATED, "PA.2"));
        assert_eq!(table.owner_of(pa1).map(FabricDeviceId::as_str), Some("A"));
        assert_eq!(table.owner_of(pa2).map(FabricDeviceId::as_str), Some("B"));
        assert!(table.via_owner(pa1, P0) && !table.via_owner(pa1, P1));
        // Load does not move a replicated region off its owner.
        for _ in 0..5 {
            table.started(P0);
        }
        assert_eq!(table.choose(pa1, &[]), Some(P0));
        assert_eq!(table.choose(pa2, &[]), Some(P1));
        // The owner's path down: another device (which relays, or answers
        // NOT_OWNER); back up: the owner's path again.
        table.report_failure(P0, 0, Failure::ConnectionLost, t0);
        assert_eq!(table.choose(pa1, &[]), Some(P1));
        table.path_restored(P0, t0);
        assert_eq!(table.choose(pa1, &[]), Some(P0));
        // Tried already: the other path, as for any region.
        assert_eq!(table.choose(pa1, &[P0]), Some(P1));
    }

    #[test]
    fn an_unreplicated_region_has_no_owner_and_chooses_by_load() {
        let mut table = default_table();
        let pa1 = region(DEFAULT, "PA.1");
        assert_eq!(table.owner_of(pa1), None);
        assert!(table.reaches_owner(pa1));
        assert!(!table.via_owner(pa1, P0));
        table.started(P0);
        assert_eq!(table.choose(pa1, &[]), Some(P1));
    }

    #[test]
    fn owners_come_from_the_maps_records_and_follow_a_new_map() {
        let topology = load(REPLICATED);
        let layout = Layout::new(&topology).unwrap();
        let mut table = replicated_table();
        let pa1 = region(REPLICATED, "PA.1");
        let mut records = control::replica_state::initial(&topology);
        records[0].owner = "B".into();
        table.set_owners(&records);
        assert_eq!(table.owner_of(pa1).map(FabricDeviceId::as_str), Some("B"));
        assert_eq!(table.choose(pa1, &[]), Some(P1));
        // A new epoch whose records give PA.1 back to A.
        let mut next = fresh(&topology, &layout);
        records[0].owner = "A".into();
        next.set_owners(&records);
        table.follow(next, Some, Instant::now());
        assert_eq!(table.choose(pa1, &[]), Some(P0));
        // Records without the region: one copy, no owner.
        table.set_owners(&[]);
        assert_eq!(table.owner_of(pa1), None);
    }

    #[test]
    fn not_owner_leaves_the_path_healthy() {
        let t0 = Instant::now();
        let mut table = replicated_table();
        let pa1 = region(REPLICATED, "PA.1");
        table.report_failure(P0, 0, Failure::NotOwner, t0);
        assert_eq!(table.health(P0), PathHealth::Up);
        assert!(!table.unreachable(P0, 0));
        assert_eq!(table.poll_timeout(), None);
        assert_eq!(table.choose(pa1, &[]), Some(P0));
        assert_eq!(
            Failure::NotOwner.to_string(),
            "not the region's owner device"
        );
    }

    #[test]
    fn a_client_without_a_path_to_the_owner_is_told_so() {
        // c1 wired to device A only (a topology validation refuses; the
        // table itself still says it).
        let text = std::fs::read_to_string(REPLICATED).unwrap().replace(
            "  { id = \"r1\", fabric_device = \"B\", local_addr = \"127.0.3.2\" },\n",
            "",
        );
        let topology = Topology::from_toml_str("edited", &text, &EnvOverrides::None).unwrap();
        let table = table_for(&topology, "c1");
        assert_eq!(table.paths().len(), 1);
        let layout = Layout::new(&topology).unwrap();
        let at = |id: &str| layout.entry_by_id(&id.into()).unwrap().region;
        assert!(table.reaches_owner(at("PA.1")));
        assert!(!table.reaches_owner(at("PA.2")));
        // Requests still go somewhere: device A may relay.
        assert_eq!(table.choose(at("PA.2"), &[]), Some(P0));
        assert_eq!(
            table.region_id(at("PA.2")).map(RegionId::as_str),
            Some("PA.2")
        );
    }
}
