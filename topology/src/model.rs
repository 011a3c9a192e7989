//! The fabric model as written in a topology file.
//!
//! PMEM servers have CPU sockets, each socket has PMEM devices and each device
//! exports regions; server NICs hang off a socket. Fabric devices have
//! client-facing ports and links to server NICs. Clients have RNICs, each wired
//! to one fabric device. Plain serde structs: [`crate::validate`] checks them.

use serde::{Deserialize, Serialize};

use crate::ids::{
    ClientId, FabricDeviceId, NicId, PmemDeviceId, PortId, RegionId, RnicId, ServerId, SocketId,
};
use crate::size::{ByteSize, flex_u64, flex_u64_opt};

/// A whole fabric: the pool settings, its servers, fabric devices and clients.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// Pool-wide settings.
    #[serde(default)]
    pub pool: PoolSettings,
    /// PMEM servers, in config order.
    #[serde(default)]
    pub servers: Vec<Server>,
    /// Fabric devices (switch nodes), in config order.
    #[serde(default)]
    pub fabric_devices: Vec<FabricDevice>,
    /// Client hosts, in config order.
    #[serde(default)]
    pub clients: Vec<Client>,
    /// Where the topology was read from, for error messages.
    #[serde(skip)]
    pub source: String,
    /// The environment variables that overrode values of the file, so that
    /// problems with those values are blamed on them.
    #[serde(skip)]
    pub overrides: Vec<Override>,
}

/// A value of the topology set by an environment variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    /// The variable (`PMEMFABRIC_POOL__EXTENT_SIZE`).
    pub var: String,
    /// Its value.
    pub value: String,
    /// The dotted key it sets (`pool.extent_size`).
    pub key: String,
}

impl Override {
    /// `PMEMFABRIC_POOL__EXTENT_SIZE=4MiB`, for messages.
    pub fn assignment(&self) -> String {
        format!("{}={}", self.var, self.value)
    }
}

/// Pool-wide settings that shape the address layout.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSettings {
    /// A name for the pool, used in default keys and reports.
    #[serde(default = "PoolSettings::default_name")]
    pub name: String,
    /// The unit of allocation and translation; every region size is a multiple.
    #[serde(default = "PoolSettings::default_extent_size")]
    pub extent_size: ByteSize,
    /// Where the first automatically placed region starts in PMEM address space.
    #[serde(default = "PoolSettings::default_base_address", with = "flex_u64")]
    pub base_address: u64,
    /// Alignment of automatically placed regions; defaults to the extent size.
    #[serde(default)]
    pub region_alignment: Option<ByteSize>,
    /// The allocator's PMEM-resident metadata; absent for a static pool
    /// (the regions laid end to end, no allocation).
    #[serde(default)]
    pub allocator: Option<AllocatorConfig>,
    /// Copies of every region (1, 2 or 3; 1 when absent): the primary and
    /// backups on servers in other failure domains. A region may say
    /// otherwise ([`Region::replicas`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u64>,
}

/// Where and how large the allocator's metadata is (`[pool.allocator]`).
///
/// With an allocator, every region keeps its first extent for its free-extent
/// bitmap and extent key table, and the metadata region keeps further
/// extents for the superblock, page table and name directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AllocatorConfig {
    /// The region holding the pool metadata; defaults to the first region.
    #[serde(default)]
    pub metadata_region: Option<RegionId>,
    /// Virtual extents the page table maps; defaults to four per data
    /// extent. Fixed once the pool is formatted: a pool meant to gain
    /// servers sets it (room for their extents too) and keeps it, since the
    /// default would change with the pool's extents.
    #[serde(default)]
    pub page_table_entries: Option<u64>,
    /// Entries of the name directory; defaults to 256.
    #[serde(default)]
    pub names: Option<u64>,
}

impl PoolSettings {
    /// The default extent size: 2 MiB, the design's default.
    pub const DEFAULT_EXTENT_SIZE: u64 = 2 << 20;
    /// The default base of the PMEM address space (4 GiB), so that small
    /// numbers are never valid PMEM addresses.
    pub const DEFAULT_BASE_ADDRESS: u64 = 1 << 32;

    fn default_name() -> String {
        "pmem-fabric".to_owned()
    }
    fn default_extent_size() -> ByteSize {
        ByteSize(Self::DEFAULT_EXTENT_SIZE)
    }
    fn default_base_address() -> u64 {
        Self::DEFAULT_BASE_ADDRESS
    }

    /// The alignment used for automatically placed regions.
    pub fn alignment(&self) -> u64 {
        self.region_alignment.unwrap_or(self.extent_size).bytes()
    }
}

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            name: Self::default_name(),
            extent_size: Self::default_extent_size(),
            base_address: Self::default_base_address(),
            region_alignment: None,
            allocator: None,
            replicas: None,
        }
    }
}

/// A PMEM server: a DAX host exporting regions over its NICs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Server {
    /// The server's id.
    pub id: ServerId,
    /// Admin (metrics/health) listen address, `host:port`.
    #[serde(default)]
    pub admin: Option<String>,
    /// Directory holding the region files; the daemon's flag overrides it.
    #[serde(default)]
    pub data_dir: Option<String>,
    /// How the server makes writes durable.
    #[serde(default)]
    pub persistence: Persistence,
    /// The failure domain the server shares with others (a rack, a power
    /// feed): two copies of a region never share one. Each server is a
    /// domain of its own when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// CPU sockets with their PMEM devices.
    #[serde(default)]
    pub sockets: Vec<Socket>,
    /// Network interfaces, each attached to one socket.
    #[serde(default)]
    pub nics: Vec<ServerNic>,
}

/// A CPU socket of a server.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Socket {
    /// The socket's id, unique within its server.
    pub id: SocketId,
    /// PMEM devices attached to this socket.
    #[serde(default)]
    pub devices: Vec<PmemDevice>,
}

/// A PMEM device attached to a socket.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PmemDevice {
    /// The device's id, unique within its socket.
    pub id: PmemDeviceId,
    /// Where the device's memory is: a directory (e.g. an fsdax mount) that
    /// holds its region files, or a device DAX character device
    /// (`/dev/daxX.Y`) its regions are laid out in. Without it, the region
    /// files live in the server's data directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Regions carved from this device.
    #[serde(default)]
    pub regions: Vec<Region>,
}

/// A PMEM region: a contiguous piece of persistent memory exported to the pool.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Region {
    /// The region's id, unique in the pool (e.g. `PA.1`).
    pub id: RegionId,
    /// Size in bytes; a multiple of the pool's extent size.
    pub size: ByteSize,
    /// An explicit PMEM address; by default regions are laid out in config order.
    #[serde(
        default,
        with = "flex_u64_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub address: Option<u64>,
    /// Whether the server writes through its CPU cache or around it.
    #[serde(default)]
    pub cache: CachePolicy,
    /// This region's copies, when not the pool's: a count (placed by the
    /// rule of [`crate::replicas`]) or the backups' places, `"SERVER:SOCKET"`
    /// or `"SERVER:SOCKET:DEVICE"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<RegionReplicas>,
}

/// How many copies a region has, or where its backups are.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum RegionReplicas {
    /// This many copies (the primary included), placed by the rule.
    Count(u64),
    /// Backups at these places (`"B:0"`, `"B:0:pmem1"`), after the primary.
    On(Vec<String>),
}

/// How a PMEM server makes writes durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Persistence {
    /// DAX (`MAP_SYNC` + cache-line write-back) where the filesystem supports
    /// it, `msync` otherwise.
    #[default]
    Auto,
    /// DAX only; the server refuses to start without it.
    Dax,
    /// `msync` of the written range.
    Msync,
    /// The system libpmem (PMDK), when the server is built with it.
    Libpmem,
    /// For power-loss tests, not for data: an emulated persistence domain in
    /// which stores stay in the server's private memory and only persisted
    /// cache lines reach the region files, so killing the server loses
    /// exactly what a power cut would.
    Emulated,
}

impl Persistence {
    /// Every mechanism, in documentation order.
    pub const ALL: [Persistence; 5] = [
        Self::Auto,
        Self::Dax,
        Self::Msync,
        Self::Libpmem,
        Self::Emulated,
    ];

    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Dax => "dax",
            Self::Msync => "msync",
            Self::Libpmem => "libpmem",
            Self::Emulated => "emulated",
        }
    }
}

impl std::fmt::Display for Persistence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A persistence name that is none of `auto`, `dax`, `msync`, `libpmem`,
/// `emulated`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown persistence mechanism {0:?} (expected auto, dax, msync, libpmem or emulated)")]
pub struct ParsePersistenceError(pub String);

impl std::str::FromStr for Persistence {
    type Err = ParsePersistenceError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == text)
            .ok_or_else(|| ParsePersistenceError(text.to_owned()))
    }
}

/// Whether the server writes a region through its CPU cache or around it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CachePolicy {
    /// Normal stores followed by cache-line write-back.
    #[default]
    WriteBack,
    /// Non-temporal stores that bypass the cache.
    NonTemporal,
}

/// A server network interface, attached to one CPU socket.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServerNic {
    /// The NIC's id, unique within its server.
    pub id: NicId,
    /// The socket whose PCIe root the NIC sits on.
    pub socket: SocketId,
    /// Listen address, `host:port`: the TCP transport, and the control
    /// connection of a `verbs` NIC.
    pub listen: String,
    /// How fabric devices reach the regions behind this NIC.
    #[serde(default)]
    pub transport: NicTransport,
    /// `verbs`: the RDMA device (e.g. `"rxe0"`; default: the first on the
    /// NUMA node of the socket's PMEM, else the first). Its RoCEv2 address
    /// is the IPv4 address of `listen`.
    #[serde(default)]
    pub rdma_device: Option<String>,
}

/// How a server NIC serves the regions of its socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NicTransport {
    /// The device protocol over TCP: a server thread executes each request.
    #[default]
    Tcp,
    /// The regions of the NIC's socket are registered with its RNIC, and
    /// fabric devices read, write and flush them with RDMA over RoCEv2 (an
    /// RC queue pair per device link, set up on the TCP connection at
    /// `listen`, which also carries what RDMA cannot: exactly-once atomics
    /// and requests with per-extent keys).
    Verbs,
}

impl NicTransport {
    /// `tcp` or `verbs`.
    pub fn as_str(self) -> &'static str {
        match self {
            NicTransport::Tcp => "tcp",
            NicTransport::Verbs => "verbs",
        }
    }
}

/// A fabric device: the switch/proxy daemon of one switch node.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FabricDevice {
    /// The device's id.
    pub id: FabricDeviceId,
    /// Admin (metrics/health) listen address, `host:port`.
    #[serde(default)]
    pub admin: Option<String>,
    /// Client-facing ports.
    #[serde(default)]
    pub ports: Vec<FabricPort>,
    /// Links to server NICs.
    #[serde(default)]
    pub links: Vec<FabricLink>,
}

/// A client-facing port of a fabric device.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FabricPort {
    /// The port's id, unique within its device.
    pub id: PortId,
    /// Listen address, `host:port`: the control connection (HELLO, MAP,
    /// QP set-up) and the TCP transport.
    pub listen: String,
    /// RoCEv2 on this port: RDMA NICs reach the device here.
    #[serde(default)]
    pub roce: Option<RocePort>,
}

/// The RoCEv2 side of a fabric device port: raw packet I/O on a network
/// interface, with an IPv4 address the device answers ARP for itself (the
/// host's kernel must not own it, or it would answer UDP 4791 too).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RocePort {
    /// The network interface, e.g. `"veth-roce0"`.
    pub interface: String,
    /// The port's IPv4 address (its RoCEv2 GID is `::ffff:` and this).
    pub ip: String,
    /// Path MTU offered to queue pairs (256, 512, 1024, 2048 or 4096).
    #[serde(default = "default_roce_mtu")]
    pub mtu: u16,
}

fn default_roce_mtu() -> u16 {
    1024
}

/// A link from a fabric device to one server NIC.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FabricLink {
    /// The server at the other end.
    pub server: ServerId,
    /// The server NIC at the other end.
    pub nic: NicId,
}

/// A client host running applications over the pool.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Client {
    /// The client's id.
    pub id: ClientId,
    /// RDMA NICs, each wired to one fabric device.
    #[serde(default)]
    pub rnics: Vec<Rnic>,
    /// PMEM ranges the client may touch; empty means everything.
    #[serde(default)]
    pub allow: Vec<AllowRange>,
}

/// An RDMA NIC of a client.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Rnic {
    /// The RNIC's id, unique within its client.
    pub id: RnicId,
    /// The fabric device it is wired to.
    pub fabric_device: FabricDeviceId,
    /// The device port it is wired to; the device's first port by default.
    #[serde(default)]
    pub port: Option<PortId>,
    /// Local address to bind outgoing connections to; with `roce`, the
    /// RNIC's IPv4 address (its RoCEv2 GID `::ffff:a.b.c.d`).
    #[serde(default)]
    pub local_addr: Option<String>,
    /// How the RNIC reaches its device: `tcp` (the default) or `roce`.
    #[serde(default)]
    pub transport: RnicTransport,
    /// With `roce`: the RDMA device to use (`rxe0`, `mlx5_0`); the first one
    /// there is when absent.
    #[serde(default)]
    pub rdma_device: Option<String>,
}

/// How a client's RNIC carries requests to its fabric device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RnicTransport {
    /// The device protocol over TCP (any host, no RDMA needed).
    #[default]
    Tcp,
    /// RDMA over RoCEv2 through the verbs library: READ, WRITE and atomics
    /// on a reliable-connection queue pair that the device's RoCEv2 port
    /// terminates; set-up, FLUSH and in-doubt atomics on the TCP control
    /// connection.
    Roce,
}

/// A range of one region that a client may access.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AllowRange {
    /// The region.
    pub region: RegionId,
    /// Start of the range inside the region.
    #[serde(default)]
    pub offset: ByteSize,
    /// Length of the range; to the end of the region when absent.
    #[serde(default)]
    pub size: Option<ByteSize>,
    /// What the client may do there: `read-write` (the default) or `read`.
    #[serde(default)]
    pub access: Access,
}

/// What a grant lets a client do in its range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    /// READ and FLUSH, and everything that changes memory: WRITE,
    /// WRITE_PERSIST and the atomics.
    #[default]
    ReadWrite,
    /// READ and FLUSH only.
    Read,
}

/// A region with where it sits in the topology, as produced by
/// [`Topology::regions`].
#[derive(Debug, Clone, Copy)]
pub struct RegionPlace<'a> {
    /// The server that owns the region.
    pub server: &'a Server,
    /// The socket the region's device is attached to.
    pub socket: &'a Socket,
    /// The PMEM device the region is carved from.
    pub device: &'a PmemDevice,
    /// The region itself.
    pub region: &'a Region,
}

impl Topology {
    /// Every region in config order (servers, sockets, devices, regions).
    pub fn regions(&self) -> impl Iterator<Item = RegionPlace<'_>> {
        self.servers.iter().flat_map(|server| {
            server.sockets.iter().flat_map(move |socket| {
                socket.devices.iter().flat_map(move |device| {
                    device.regions.iter().map(move |region| RegionPlace {
                        server,
                        socket,
                        device,
                        region,
                    })
                })
            })
        })
    }

    /// The server with this id.
    pub fn server(&self, id: &ServerId) -> Option<&Server> {
        self.servers.iter().find(|s| &s.id == id)
    }

    /// The fabric device with this id.
    pub fn fabric_device(&self, id: &FabricDeviceId) -> Option<&FabricDevice> {
        self.fabric_devices.iter().find(|d| &d.id == id)
    }

    /// The client with this id.
    pub fn client(&self, id: &ClientId) -> Option<&Client> {
        self.clients.iter().find(|c| &c.id == id)
    }

    /// The override that set the value at dotted `key`, if one did.
    pub fn override_of(&self, key: &str) -> Option<&Override> {
        self.overrides.iter().find(|o| o.key == key)
    }

    /// Total bytes of PMEM over all regions.
    pub fn capacity(&self) -> u64 {
        self.regions().map(|p| p.region.size.bytes()).sum()
    }
}

impl Server {
    /// The NIC with this id.
    pub fn nic(&self, id: &NicId) -> Option<&ServerNic> {
        self.nics.iter().find(|n| &n.id == id)
    }

    /// The socket with this id.
    pub fn socket(&self, id: &SocketId) -> Option<&Socket> {
        self.sockets.iter().find(|s| &s.id == id)
    }

    /// The failure domain: the configured one, or the server's own id.
    pub fn failure_domain(&self) -> &str {
        self.domain.as_deref().unwrap_or(self.id.as_str())
    }
}

impl FabricDevice {
    /// The port with this id.
    pub fn port(&self, id: &PortId) -> Option<&FabricPort> {
        self.ports.iter().find(|p| &p.id == id)
    }
}

impl Rnic {
    /// The port this RNIC is wired to on `device`: the named one, or the first.
    pub fn port_on<'a>(&self, device: &'a FabricDevice) -> Option<&'a FabricPort> {
        match &self.port {
            Some(id) => device.port(id),
            None => device.ports.first(),
        }
    }
}
