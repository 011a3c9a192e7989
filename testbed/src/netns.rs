//! `--net netns`: every host of a topology in its own network namespace.
//!
//! [`plan`] turns a topology into a [`NetPlan`] — namespaces, bridges and veth
//! pairs with deterministic addresses — and a copy of the topology whose
//! listen, admin and RNIC addresses are the planned ones. [`apply`] builds the
//! plan with iproute2 (`ip -batch`) and returns a [`NetnsGuard`] that removes
//! it again when dropped. [`set_link`] takes one link of the topology down or
//! up (chaos `cut-link`), [`teardown_leftovers`] removes what a crashed run
//! left behind (`testbed down`), and [`command_in`] / [`in_namespace`] run
//! programs or closures inside a host's namespace.
//!
//! # Layout
//!
//! Host names are `<prefix>-<kind>-<id>` with kind `s` (PMEM server), `f`
//! (fabric device) or `c` (client) and the id lowercased to `[a-z0-9]`. The
//! prefix is `pf` plus up to four `[a-z0-9]` characters (see
//! [`fresh_prefix`]), so `testbed down` can find every run's leftovers.
//!
//! | what | where | address |
//! |---|---|---|
//! | NIC `n` of server `s` (config order, from 0) | bridge `nic<n>` in the server's namespace | `10.<1+s>.<n>.1/24`, listen port kept (7000 when 0) |
//! | link of device `d` to that NIC | veth `n<n>d<d>` (on the bridge) ↔ `s<s>n<n>` in the device's namespace | device end `10.<1+s>.<n>.<10+d>/24` |
//! | port `p` of device `d` | bridge `port<p>` in the device's namespace | `10.<100+d>.<p>.1/24`, listen port kept (7100 when 0) |
//! | RNIC `r` of client `c`, the `k`-th wired to that port | veth `p<p>c<c>r<r>` (on the bridge) ↔ `rnic<r>` in the client's namespace | client end `10.<100+d>.<p>.<10+k>/24`, the RNIC's `local_addr` |
//! | management of daemon `h` (servers, then devices) | veth `<prefix>-m<h>` in the root namespace ↔ `mgmt0` | `/30` in the run's `/22` of `10.240.0.0/12`: root end `.1`, daemon end `.2`, the daemon's admin address (port kept, 9100 / 9200 by default) |
//!
//! So every NIC and port has one listen address reachable from every linked
//! device or RNIC; a client reaches only its devices' ports (it has no route to
//! any server or management address), and the root namespace reaches only the
//! daemons' admin addresses. Each RNIC's address routes through its own
//! interface (a source-address routing table per RNIC, `arp_ignore=1`), so
//! cutting one RNIC's link never silently moves its traffic to another RNIC.
//! At most 99 servers, 99 fabric devices, 256 NICs per server, 256 ports per
//! device and 200 RNICs per port.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::io::{self, Write as _};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use topology::{
    ClientId, FabricDeviceId, NicId, PortId, RnicId, ServerId, Topology, ValidationErrors,
};

/// The listen port of a server NIC whose topology gives port 0 or none.
pub const DEFAULT_NIC_PORT: u16 = 7000;
/// The listen port of a fabric-device port whose topology gives port 0.
pub const DEFAULT_DEVICE_PORT: u16 = 7100;
/// A server's admin port unless the topology gives one.
pub const DEFAULT_SERVER_ADMIN_PORT: u16 = 9100;
/// A fabric device's admin port unless the topology gives one.
pub const DEFAULT_DEVICE_ADMIN_PORT: u16 = 9200;
/// The most servers the address plan holds.
pub const MAX_SERVERS: usize = 99;
/// The most fabric devices the address plan holds.
pub const MAX_DEVICES: usize = 99;
/// The most NICs per server (one `/24` each).
pub const MAX_NICS: usize = 256;
/// The most client-facing ports per fabric device (one `/24` each).
pub const MAX_PORTS: usize = 256;
/// The most RNICs wired to one fabric-device port.
pub const MAX_RNICS_PER_PORT: usize = 200;
/// The longest interface name Linux accepts.
pub const IFNAME_MAX: usize = 15;
/// The name of the management interface inside each daemon's namespace.
pub const MGMT_IFNAME: &str = "mgmt0";

/// Where `ip netns` keeps its namespace handles (iproute2's `NETNS_RUN_DIR`).
const NETNS_DIRS: [&str; 2] = ["/run/netns", "/var/run/netns"];
/// The management space: `10.240.0.0/12`, one `/22` per run.
const MGMT_BASE: u32 = u32::from_be_bytes([10, 240, 0, 0]);
/// Management `/22` blocks in [`MGMT_BASE`].
const MGMT_SLOTS: u32 = 1024;
/// Root-side management interfaces of a run share the interface group
/// `MGMT_GROUP_BASE + slot` (its management block's slot), so teardown deletes
/// them with one `ip link del group` (one kernel grace period for all).
const MGMT_GROUP_BASE: u32 = 0x7066_0000;
/// The first routing table and rule priority of the per-RNIC source routes.
const SOURCE_TABLE_BASE: u32 = 100;

/// Why network namespaces could not be planned, built or removed.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// Not running as root.
    #[error(
        "--net netns needs root: creating network namespaces and veth pairs requires \
         CAP_SYS_ADMIN and CAP_NET_ADMIN; run as root (for example with sudo) or use \
         --net loopback"
    )]
    NotRoot,
    /// The machine cannot do it (no `ip` command, no namespace support, …).
    #[error("network namespaces are not usable here: {0}")]
    Unsupported(String),
    /// The topology does not fit the address plan.
    #[error("topology too big for --net netns: {0}")]
    TooBig(String),
    /// A prefix that is not `pf` plus up to four `[a-z0-9]` characters.
    #[error(
        "bad netns prefix {0:?}: expected \"pf\" followed by at most four of [a-z0-9] \
         (for example \"pf1234\")"
    )]
    BadPrefix(String),
    /// The topology does not validate.
    #[error("cannot plan namespaces for an invalid topology: {0}")]
    Topology(#[from] ValidationErrors),
    /// A name or address of the plan is already taken on this machine.
    #[error("{0}")]
    InUse(String),
    /// An `ip` command failed.
    #[error("`{command}` failed ({}): {}", status_text(*.status), stderr.trim())]
    Command {
        /// The command line, for a batch with the failing line.
        command: String,
        /// Its exit status (`None` when killed by a signal).
        status: Option<i32>,
        /// What it wrote to stderr.
        stderr: String,
    },
    /// A namespace handle could not be opened or entered.
    #[error("network namespace {name:?}: {source}")]
    Namespace {
        /// The namespace name.
        name: String,
        /// What went wrong.
        #[source]
        source: io::Error,
    },
    /// Running `ip` or talking to it failed.
    #[error("running ip: {0}")]
    Io(#[source] io::Error),
}

fn status_text(status: Option<i32>) -> String {
    match status {
        Some(code) => format!("exit status {code}"),
        None => "killed by a signal".to_owned(),
    }
}

/// The kind of a host of the topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HostKind {
    /// A PMEM server.
    Server,
    /// A fabric device.
    FabricDevice,
    /// A client host.
    Client,
}

impl HostKind {
    /// The letter in namespace names: `s`, `f` or `c`.
    pub fn letter(self) -> char {
        match self {
            Self::Server => 's',
            Self::FabricDevice => 'f',
            Self::Client => 'c',
        }
    }
}

impl fmt::Display for HostKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Server => "server",
            Self::FabricDevice => "fabric device",
            Self::Client => "client",
        })
    }
}

/// One host of the topology and its namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NsHost {
    /// The namespace name (`ip netns` name).
    pub name: String,
    /// What the host is.
    pub kind: HostKind,
    /// The host's id in the topology.
    pub id: String,
    /// The daemon's admin address (`ip:port`, reachable from the root
    /// namespace); `None` for clients.
    pub admin: Option<String>,
}

/// What a bridge stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BridgeOf {
    /// A server NIC.
    ServerNic {
        /// The server.
        server: ServerId,
        /// The NIC.
        nic: NicId,
    },
    /// A client-facing port of a fabric device.
    DevicePort {
        /// The fabric device.
        device: FabricDeviceId,
        /// The port.
        port: PortId,
    },
}

/// A Linux bridge carrying a NIC's or port's listen address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bridge {
    /// The interface name.
    pub name: String,
    /// The namespace it lives in.
    pub ns: String,
    /// Its address, `a.b.c.d/24`.
    pub addr: String,
    /// What it stands for.
    pub of: BridgeOf,
}

/// Which link of the topology a veth pair is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LinkRef {
    /// A fabric device's link to a server NIC. Side a is the server's end (on
    /// the NIC's bridge), side b the device's.
    ServerLink {
        /// The fabric device.
        device: FabricDeviceId,
        /// The server.
        server: ServerId,
        /// The server's NIC.
        nic: NicId,
    },
    /// A client RNIC wired to a fabric-device port. Side a is the device's end
    /// (on the port's bridge), side b the client's.
    Rnic {
        /// The client.
        client: ClientId,
        /// The RNIC.
        rnic: RnicId,
        /// The fabric device it is wired to.
        device: FabricDeviceId,
    },
    /// A daemon's management link. Side a is in the root namespace, side b in
    /// the daemon's namespace.
    Mgmt {
        /// Server or fabric device.
        kind: HostKind,
        /// The daemon's id.
        host: String,
    },
}

impl fmt::Display for LinkRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ServerLink {
                device,
                server,
                nic,
            } => write!(f, "link fabric device {device} → server {server} NIC {nic}"),
            Self::Rnic {
                client,
                rnic,
                device,
            } => write!(f, "client {client} RNIC {rnic} → fabric device {device}"),
            Self::Mgmt { kind, host } => write!(f, "management link of {kind} {host}"),
        }
    }
}

/// A veth pair: one link of the topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Veth {
    /// Side a's interface name.
    pub name_a: String,
    /// Side a's namespace; `None` is the root namespace.
    pub ns_a: Option<String>,
    /// Side a's address (`a.b.c.d/nn`), if it has one.
    pub addr_a: Option<String>,
    /// The bridge side a is enslaved to, if any.
    pub bridge_a: Option<String>,
    /// Side b's interface name.
    pub name_b: String,
    /// Side b's namespace; `None` is the root namespace.
    pub ns_b: Option<String>,
    /// Side b's address (`a.b.c.d/nn`), if it has one.
    pub addr_b: Option<String>,
    /// The bridge side b is enslaved to, if any.
    pub bridge_b: Option<String>,
    /// The routing table that sends traffic from side b's address out of side
    /// b only (RNICs); [`set_link`] re-installs its route when the link comes
    /// back up.
    pub source_table: Option<u32>,
    /// Which topology link this is.
    pub link: LinkRef,
}

impl Veth {
    /// Both ends: (interface, namespace).
    fn ends(&self) -> [(&str, Option<&str>); 2] {
        [
            (self.name_a.as_str(), self.ns_a.as_deref()),
            (self.name_b.as_str(), self.ns_b.as_deref()),
        ]
    }
}

/// The network layout of a topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetPlan {
    /// The run's prefix of every name.
    pub prefix: String,
    /// Every host, in topology order: servers, fabric devices, clients.
    pub namespaces: Vec<NsHost>,
    /// Every bridge (server NICs, then device ports).
    pub bridges: Vec<Bridge>,
    /// Every veth pair (server links, RNICs, management links).
    pub veths: Vec<Veth>,
    /// The run's management block in the root namespace (`10.x.y.0/22`).
    pub mgmt_subnet: String,
    /// The interface group of the root-side management interfaces.
    pub mgmt_group: u32,
}

impl NetPlan {
    /// The namespace of a host.
    pub fn namespace_of(&self, kind: HostKind, id: &str) -> Option<&str> {
        self.host(kind, id).map(|h| h.name.as_str())
    }

    /// A host of the plan.
    pub fn host(&self, kind: HostKind, id: &str) -> Option<&NsHost> {
        self.namespaces
            .iter()
            .find(|h| h.kind == kind && h.id == id)
    }

    /// Every veth pair, each a link of the topology.
    pub fn links(&self) -> impl Iterator<Item = &Veth> {
        self.veths.iter()
    }

    /// The veth pair of one topology link.
    pub fn link(&self, link: &LinkRef) -> Option<&Veth> {
        self.veths.iter().find(|v| &v.link == link)
    }

    /// The veth pair of fabric device `device`'s link to `server`'s NIC `nic`.
    pub fn server_link(&self, device: &str, server: &str, nic: &str) -> Option<&Veth> {
        self.link(&LinkRef::ServerLink {
            device: device.into(),
            server: server.into(),
            nic: nic.into(),
        })
    }

    /// The veth pair of `client`'s RNIC `rnic`.
    pub fn rnic_link(&self, client: &str, rnic: &str) -> Option<&Veth> {
        self.veths.iter().find(|v| {
            matches!(&v.link, LinkRef::Rnic { client: c, rnic: r, .. }
                if c.as_str() == client && r.as_str() == rnic)
        })
    }

    /// The bridge of a server NIC or device port.
    pub fn bridge(&self, of: &BridgeOf) -> Option<&Bridge> {
        self.bridges.iter().find(|b| &b.of == of)
    }

    /// The root-namespace interfaces of the plan (management ends).
    pub fn root_links(&self) -> impl Iterator<Item = &str> {
        self.veths.iter().flat_map(|v| {
            v.ends()
                .into_iter()
                .filter(|(_, ns)| ns.is_none())
                .map(|(name, _)| name)
        })
    }
}

impl fmt::Display for NetPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "netns plan {} (management {})",
            self.prefix, self.mgmt_subnet
        )?;
        for host in &self.namespaces {
            write!(f, "  {} {}: {}", host.kind, host.id, host.name)?;
            if let Some(admin) = &host.admin {
                write!(f, " admin {admin}")?;
            }
            writeln!(f)?;
        }
        for bridge in &self.bridges {
            writeln!(f, "  bridge {}/{} {}", bridge.ns, bridge.name, bridge.addr)?;
        }
        for veth in &self.veths {
            let end = |name: &str, ns: &Option<String>, addr: &Option<String>| {
                let ns = ns.as_deref().unwrap_or("root");
                match addr {
                    Some(addr) => format!("{ns}/{name} {addr}"),
                    None => format!("{ns}/{name}"),
                }
            };
            writeln!(
                f,
                "  {}: {} ↔ {}",
                veth.link,
                end(&veth.name_a, &veth.ns_a, &veth.addr_a),
                end(&veth.name_b, &veth.ns_b, &veth.addr_b)
            )?;
        }
        Ok(())
    }
}

/// Checks a run prefix: `pf` plus at most four of `[a-z0-9]`.
pub fn check_prefix(prefix: &str) -> Result<(), NetnsError> {
    if is_prefix(prefix) {
        Ok(())
    } else {
        Err(NetnsError::BadPrefix(prefix.to_owned()))
    }
}

fn is_prefix(prefix: &str) -> bool {
    prefix.len() <= 6
        && prefix.starts_with("pf")
        && prefix[2..]
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Lowercases an id and keeps `[a-z0-9]`, at most 8 characters.
fn sanitize(id: &str) -> String {
    let mut s: String = id
        .chars()
        .flat_map(char::to_lowercase)
        .filter(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        .take(8)
        .collect();
    if s.is_empty() {
        s.push('x');
    }
    s
}

/// The management slot of a prefix: a stable hash picks one of 1024.
fn mgmt_slot(prefix: &str) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for b in prefix.bytes() {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash % MGMT_SLOTS
}

/// The management `/22` of a prefix.
fn mgmt_block(prefix: &str) -> u32 {
    MGMT_BASE + mgmt_slot(prefix) * 1024
}

/// The interface group of a prefix's root-side management interfaces.
fn mgmt_group(prefix: &str) -> u32 {
    MGMT_GROUP_BASE + mgmt_slot(prefix)
}

fn ip(a: u8, b: u8, c: u8, d: u8) -> Ipv4Addr {
    Ipv4Addr::new(a, b, c, d)
}

/// The port of a `host:port` address, or `default` when absent, bad or 0.
fn port_of(address: Option<&str>, default: u16) -> u16 {
    match address.and_then(|a| a.parse::<SocketAddr>().ok()) {
        Some(addr) if addr.port() != 0 => addr.port(),
        _ => default,
    }
}

/// The port of an RNIC's `local_addr` when it names one.
fn local_port(address: Option<&str>) -> Option<u16> {
    address
        .and_then(|a| a.parse::<SocketAddr>().ok())
        .map(|a| a.port())
        .filter(|&p| p != 0)
}

fn too_big(what: String) -> NetnsError {
    NetnsError::TooBig(what)
}

fn index_u8(index: usize, limit: usize, what: impl FnOnce() -> String) -> Result<u8, NetnsError> {
    if index < limit {
        u8::try_from(index).map_err(|_| too_big(what()))
    } else {
        Err(too_big(what()))
    }
}

/// Adds daemon number `daemon`'s management veth and returns its address.
fn push_mgmt(
    veths: &mut Vec<Veth>,
    prefix: &str,
    block: u32,
    daemon: &mut usize,
    kind: HostKind,
    id: &str,
    ns: &str,
) -> Result<Ipv4Addr, NetnsError> {
    let h = *daemon;
    let offset = u32::try_from(h * 4)
        .ok()
        .filter(|&o| o + 4 <= 1024)
        .ok_or_else(|| too_big(format!("{} daemons", h + 1)))?;
    let (root, inner) = (
        Ipv4Addr::from(block + offset + 1),
        Ipv4Addr::from(block + offset + 2),
    );
    veths.push(Veth {
        name_a: format!("{prefix}-m{h}"),
        ns_a: None,
        addr_a: Some(format!("{root}/30")),
        bridge_a: None,
        name_b: MGMT_IFNAME.to_owned(),
        ns_b: Some(ns.to_owned()),
        addr_b: Some(format!("{inner}/30")),
        bridge_b: None,
        source_table: None,
        link: LinkRef::Mgmt {
            kind,
            host: id.to_owned(),
        },
    });
    *daemon += 1;
    Ok(inner)
}

/// Plans the namespaces, bridges and veth pairs of `topology` under `prefix`
/// and returns the plan with a copy of the topology whose NIC and port listen
/// addresses, admin addresses and RNIC local addresses are the planned ones.
/// Pure: touches nothing on the machine.
pub fn plan(topology: &Topology, prefix: &str) -> Result<(NetPlan, Topology), NetnsError> {
    check_prefix(prefix)?;
    topology.validate()?;
    if topology.servers.len() > MAX_SERVERS {
        return Err(too_big(format!(
            "{} servers (at most {MAX_SERVERS})",
            topology.servers.len()
        )));
    }
    if topology.fabric_devices.len() > MAX_DEVICES {
        return Err(too_big(format!(
            "{} fabric devices (at most {MAX_DEVICES})",
            topology.fabric_devices.len()
        )));
    }

    let mut rewritten = topology.clone();
    let mut namespaces = Vec::new();
    let mut bridges = Vec::new();
    let mut veths = Vec::new();
    let mut taken = HashSet::new();
    let mut ns_name = |kind: HostKind, index: usize, id: &str| {
        let base = format!("{prefix}-{}-{}", kind.letter(), sanitize(id));
        let name = if taken.contains(&base) {
            // Sanitized names never contain '-', so this cannot clash.
            format!("{base}-{index}")
        } else {
            base
        };
        taken.insert(name.clone());
        name
    };
    let server_ns: Vec<String> = topology
        .servers
        .iter()
        .enumerate()
        .map(|(i, s)| ns_name(HostKind::Server, i, s.id.as_str()))
        .collect();
    let device_ns: Vec<String> = topology
        .fabric_devices
        .iter()
        .enumerate()
        .map(|(i, d)| ns_name(HostKind::FabricDevice, i, d.id.as_str()))
        .collect();
    let client_ns: Vec<String> = topology
        .clients
        .iter()
        .enumerate()
        .map(|(i, c)| ns_name(HostKind::Client, i, c.id.as_str()))
        .collect();

    let mgmt = mgmt_block(prefix);
    let mut daemon = 0usize;
    // Servers: one bridge per NIC, a management link each.
    let mut nic_net: BTreeMap<(ServerId, NicId), (u8, u8, usize)> = BTreeMap::new();
    for (s, (server, ns)) in rewritten.servers.iter_mut().zip(&server_ns).enumerate() {
        let s8 = index_u8(s, MAX_SERVERS, || format!("server #{}", s + 1))?;
        if server.nics.len() > MAX_NICS {
            return Err(too_big(format!(
                "server {} has {} NICs (at most {MAX_NICS})",
                server.id,
                server.nics.len()
            )));
        }
        for (n, nic) in server.nics.iter_mut().enumerate() {
            let n8 = index_u8(n, MAX_NICS, || {
                format!("server {} NIC #{}", server.id, n + 1)
            })?;
            let addr = ip(10, 1 + s8, n8, 1);
            bridges.push(Bridge {
                name: format!("nic{n}"),
                ns: ns.clone(),
                addr: format!("{addr}/24"),
                of: BridgeOf::ServerNic {
                    server: server.id.clone(),
                    nic: nic.id.clone(),
                },
            });
            let port = port_of(Some(&nic.listen), DEFAULT_NIC_PORT);
            nic.listen = format!("{addr}:{port}");
            nic_net.insert((server.id.clone(), nic.id.clone()), (1 + s8, n8, s));
        }
        let inner = push_mgmt(
            &mut veths,
            prefix,
            mgmt,
            &mut daemon,
            HostKind::Server,
            server.id.as_str(),
            ns,
        )?;
        let port = port_of(server.admin.as_deref(), DEFAULT_SERVER_ADMIN_PORT);
        server.admin = Some(format!("{inner}:{port}"));
        namespaces.push(NsHost {
            name: ns.clone(),
            kind: HostKind::Server,
            id: server.id.to_string(),
            admin: server.admin.clone(),
        });
    }

    // Fabric devices: a veth per server link, a bridge per port.
    let mut port_net: BTreeMap<(FabricDeviceId, PortId), (u8, u8, usize)> = BTreeMap::new();
    for (d, (device, ns)) in rewritten
        .fabric_devices
        .iter_mut()
        .zip(&device_ns)
        .enumerate()
    {
        let d8 = index_u8(d, MAX_DEVICES, || format!("fabric device #{}", d + 1))?;
        let mut seen = BTreeSet::new();
        for link in &device.links {
            if !seen.insert((link.server.clone(), link.nic.clone())) {
                // A link listed twice is one wire.
                continue;
            }
            let Some(&(b, c, s)) = nic_net.get(&(link.server.clone(), link.nic.clone())) else {
                continue; // validate() reports it; unreachable here.
            };
            let n = usize::from(c);
            veths.push(Veth {
                name_a: format!("n{n}d{d}"),
                ns_a: Some(server_ns[s].clone()),
                addr_a: None,
                bridge_a: Some(format!("nic{n}")),
                name_b: format!("s{s}n{n}"),
                ns_b: Some(ns.clone()),
                addr_b: Some(format!("{}/24", ip(10, b, c, 10 + d8))),
                bridge_b: None,
                source_table: None,
                link: LinkRef::ServerLink {
                    device: device.id.clone(),
                    server: link.server.clone(),
                    nic: link.nic.clone(),
                },
            });
        }
        if device.ports.len() > MAX_PORTS {
            return Err(too_big(format!(
                "fabric device {} has {} ports (at most {MAX_PORTS})",
                device.id,
                device.ports.len()
            )));
        }
        for (p, port) in device.ports.iter_mut().enumerate() {
            let p8 = index_u8(p, MAX_PORTS, || {
                format!("fabric device {} port #{}", device.id, p + 1)
            })?;
            let addr = ip(10, 100 + d8, p8, 1);
            bridges.push(Bridge {
                name: format!("port{p}"),
                ns: ns.clone(),
                addr: format!("{addr}/24"),
                of: BridgeOf::DevicePort {
                    device: device.id.clone(),
                    port: port.id.clone(),
                },
            });
            let listen_port = port_of(Some(&port.listen), DEFAULT_DEVICE_PORT);
            port.listen = format!("{addr}:{listen_port}");
            port_net.insert((device.id.clone(), port.id.clone()), (100 + d8, p8, d));
        }
        let inner = push_mgmt(
            &mut veths,
            prefix,
            mgmt,
            &mut daemon,
            HostKind::FabricDevice,
            device.id.as_str(),
            ns,
        )?;
        let port = port_of(device.admin.as_deref(), DEFAULT_DEVICE_ADMIN_PORT);
        device.admin = Some(format!("{inner}:{port}"));
        namespaces.push(NsHost {
            name: ns.clone(),
            kind: HostKind::FabricDevice,
            id: device.id.to_string(),
            admin: device.admin.clone(),
        });
    }

    // Clients: a veth per RNIC onto its device port's bridge.
    let mut per_port: BTreeMap<(FabricDeviceId, PortId), usize> = BTreeMap::new();
    for (c, (client, ns)) in rewritten.clients.iter_mut().zip(&client_ns).enumerate() {
        for (r, rnic) in client.rnics.iter_mut().enumerate() {
            let Some(device) = topology.fabric_device(&rnic.fabric_device) else {
                continue; // validate() reports it; unreachable here.
            };
            let Some(port) = rnic.port_on(device) else {
                continue;
            };
            let key = (device.id.clone(), port.id.clone());
            let Some(&(b, p8, d)) = port_net.get(&key) else {
                continue;
            };
            let k = per_port.entry(key).or_insert(0);
            if *k >= MAX_RNICS_PER_PORT {
                return Err(too_big(format!(
                    "more than {MAX_RNICS_PER_PORT} RNICs wired to fabric device {} port {}",
                    device.id, port.id
                )));
            }
            let host = 10 + u8::try_from(*k).map_err(|_| too_big("RNICs per port".into()))?;
            *k += 1;
            let addr = ip(10, b, p8, host);
            let table = SOURCE_TABLE_BASE
                + u32::try_from(r).map_err(|_| too_big(format!("client {} RNICs", client.id)))?;
            veths.push(Veth {
                name_a: format!("p{p8}c{c}r{r}"),
                ns_a: Some(device_ns[d].clone()),
                addr_a: None,
                bridge_a: Some(format!("port{p8}")),
                name_b: format!("rnic{r}"),
                ns_b: Some(ns.clone()),
                addr_b: Some(format!("{addr}/24")),
                bridge_b: None,
                source_table: Some(table),
                link: LinkRef::Rnic {
                    client: client.id.clone(),
                    rnic: rnic.id.clone(),
                    device: device.id.clone(),
                },
            });
            rnic.local_addr = Some(match local_port(rnic.local_addr.as_deref()) {
                Some(port) => format!("{addr}:{port}"),
                None => addr.to_string(),
            });
        }
        namespaces.push(NsHost {
            name: ns.clone(),
            kind: HostKind::Client,
            id: client.id.to_string(),
            admin: None,
        });
    }

    for veth in &veths {
        for name in [&veth.name_a, &veth.name_b] {
            if name.len() > IFNAME_MAX {
                return Err(too_big(format!(
                    "interface name {name:?} of {} is longer than {IFNAME_MAX} characters",
                    veth.link
                )));
            }
        }
    }
    let plan = NetPlan {
        prefix: prefix.to_owned(),
        namespaces,
        bridges,
        veths,
        mgmt_subnet: format!("{}/22", Ipv4Addr::from(mgmt)),
        mgmt_group: mgmt_group(prefix),
    };
    Ok((plan, rewritten))
}

/// Fails with [`NetnsError::NotRoot`] unless the effective user is root.
pub fn require_root() -> Result<(), NetnsError> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid == 0 {
        Ok(())
    } else {
        Err(NetnsError::NotRoot)
    }
}

/// A prefix no namespace, root interface or management block on this machine
/// uses yet and that this process has not handed out before: `pf` plus four
/// base-36 characters.
pub fn fresh_prefix() -> Result<String, NetnsError> {
    static GIVEN: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());
    let namespaces = list_namespaces()?;
    let links = root_links()?;
    let addresses = root_addresses()?;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let mut seed = std::process::id()
        .wrapping_mul(2_654_435_761)
        .wrapping_add(nanos);
    for _ in 0..4096 {
        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let mut n = (seed >> 4) % 1_679_616; // 36^4
        let mut digits = [0u8; 4];
        for digit in digits.iter_mut().rev() {
            *digit = b"0123456789abcdefghijklmnopqrstuvwxyz"[(n % 36) as usize];
            n /= 36;
        }
        let prefix = format!("pf{}", String::from_utf8_lossy(&digits));
        let block = mgmt_block(&prefix);
        let dash = format!("{prefix}-");
        if given.contains(&block)
            || namespaces.iter().any(|n| n.starts_with(&dash))
            || links.iter().any(|l| l.starts_with(&dash))
            || addresses.iter().any(|a| in_block(*a, block))
        {
            continue;
        }
        given.insert(block);
        return Ok(prefix);
    }
    Err(NetnsError::InUse(
        "no free netns prefix found; remove old runs with `testbed down`".to_owned(),
    ))
}

fn in_block(addr: Ipv4Addr, block: u32) -> bool {
    u32::from(addr) & !1023 == block
}

/// Spawns `ip ARGS` with stdin, stdout and stderr piped.
fn spawn_ip(args: &[&str]) -> Result<Child, NetnsError> {
    Command::new("ip")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                NetnsError::Unsupported(
                    "the `ip` command (iproute2) is not installed; install it with \
                     `apt-get install iproute2`"
                        .to_owned(),
                )
            } else {
                NetnsError::Io(e)
            }
        })
}

/// Feeds `input` to a spawned `ip` and waits; `lines` maps batch line numbers
/// in its error messages back to the commands.
fn finish_ip(
    mut child: Child,
    args: &[&str],
    input: Option<&str>,
    lines: &[String],
) -> Result<String, NetnsError> {
    if let Some(mut stdin) = child.stdin.take()
        && let Some(input) = input
    {
        // A write error means ip exited early; its status tells why.
        let _ = stdin.write_all(input.as_bytes());
    }
    let output = child.wait_with_output().map_err(NetnsError::Io)?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let mut command = format!("ip {}", args.join(" "));
    let failed_line = stderr.lines().find_map(|l| {
        l.trim()
            .strip_prefix("Command failed -:")
            .and_then(|n| n.trim().parse::<usize>().ok())
    });
    // `ip -batch` names the failing line ("Command failed -:N") except for
    // arguments it cannot parse; then find the line with the quoted argument.
    let failed_line = failed_line.or_else(|| {
        stderr
            .split('"')
            .skip(1)
            .step_by(2)
            .filter(|quoted| !quoted.is_empty())
            .find_map(|quoted| {
                lines
                    .iter()
                    .position(|l| l.split_whitespace().any(|w| w == quoted))
                    .map(|i| i + 1)
            })
    });
    if let Some(n) = failed_line
        && let Some(line) = n.checked_sub(1).and_then(|i| lines.get(i))
    {
        command = format!("{command} (line {n}: {line})");
    }
    Err(NetnsError::Command {
        command,
        status: output.status.code(),
        stderr,
    })
}

/// Runs `ip ARGS` and returns its stdout.
fn run_ip(args: &[&str]) -> Result<String, NetnsError> {
    let child = spawn_ip(args)?;
    finish_ip(child, args, None, &[])
}

/// A batch of `ip` commands for one namespace (`None`: the root namespace).
struct Batch {
    ns: Option<String>,
    lines: Vec<String>,
}

impl Batch {
    fn new(ns: Option<&str>) -> Self {
        Self {
            ns: ns.map(str::to_owned),
            lines: Vec::new(),
        }
    }

    fn push(&mut self, line: String) {
        self.lines.push(line);
    }

    fn args(&self, force: bool) -> Vec<&str> {
        let mut args = Vec::new();
        if let Some(ns) = &self.ns {
            args.extend(["-n", ns.as_str()]);
        }
        if force {
            args.push("-force");
        }
        args.extend(["-batch", "-"]);
        args
    }

    fn spawn(&self, force: bool) -> Result<Child, NetnsError> {
        spawn_ip(&self.args(force))
    }

    fn finish(&self, child: Child, force: bool) -> Result<(), NetnsError> {
        let mut input = self.lines.join("\n");
        input.push('\n');
        finish_ip(child, &self.args(force), Some(&input), &self.lines).map(drop)
    }

    fn run(&self, force: bool) -> Result<(), NetnsError> {
        if self.lines.is_empty() {
            return Ok(());
        }
        let child = self.spawn(force)?;
        self.finish(child, force)
    }
}

/// Runs batches side by side; the first error wins, but all are waited for.
fn run_parallel(batches: &[Batch]) -> Result<(), NetnsError> {
    let mut running = Vec::new();
    let mut first_error = None;
    for batch in batches.iter().filter(|b| !b.lines.is_empty()) {
        match batch.spawn(false) {
            Ok(child) => running.push((batch, child)),
            Err(e) => {
                first_error.get_or_insert(e);
                break;
            }
        }
    }
    for (batch, child) in running {
        if let Err(e) = batch.finish(child, false) {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// The names `ip netns list` shows.
pub fn list_namespaces() -> Result<Vec<String>, NetnsError> {
    let out = run_ip(&["netns", "list"])?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect())
}

/// The interface names of the root namespace.
fn root_links() -> Result<Vec<String>, NetnsError> {
    run_ip(&["-o", "link", "show"]).map(|out| link_names(&out))
}

/// The interface names in `ip -o link show` output.
fn link_names(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|n| {
            let n = n.trim_end_matches(':');
            n.split('@').next().unwrap_or(n).to_owned()
        })
        .collect()
}

/// The IPv4 addresses of the root namespace.
fn root_addresses() -> Result<Vec<Ipv4Addr>, NetnsError> {
    let out = run_ip(&["-o", "-4", "addr", "show"])?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "inet")?;
            words.next()?.split('/').next()?.parse().ok()
        })
        .collect())
}

/// The network (`a.b.c.0/nn`) of an address with prefix length.
fn network_of(cidr: &str) -> Option<String> {
    let (addr, len) = cidr.split_once('/')?;
    let addr: Ipv4Addr = addr.parse().ok()?;
    let len: u32 = len.parse().ok().filter(|&l| l <= 32)?;
    let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
    Some(format!("{}/{len}", Ipv4Addr::from(u32::from(addr) & mask)))
}

/// The bare address of `a.b.c.d/nn`.
fn addr_only(cidr: &str) -> &str {
    cidr.split('/').next().unwrap_or(cidr)
}

/// The `ip` lines that route traffic from a veth's side-b address out of
/// side b only.
fn source_route_lines(veth: &Veth, replace: bool) -> Vec<String> {
    let (Some(table), Some(addr)) = (veth.source_table, &veth.addr_b) else {
        return Vec::new();
    };
    let Some(net) = network_of(addr) else {
        return Vec::new();
    };
    let verb = if replace { "replace" } else { "add" };
    let src = addr_only(addr);
    let mut lines = vec![format!(
        "route {verb} {net} dev {} src {src} table {table}",
        veth.name_b
    )];
    if !replace {
        lines.push(format!("route add unreachable default table {table}"));
        lines.push(format!(
            "rule add from {src} table {table} priority {table}"
        ));
    }
    lines
}

/// Removes the plan's namespaces and root-side interfaces when dropped.
///
/// Stop every process running inside the namespaces first: a namespace's
/// interfaces live until its last process exits (its name goes at once).
#[derive(Debug)]
pub struct NetnsGuard {
    prefix: String,
    namespaces: Vec<String>,
    root_links: Vec<String>,
    group: u32,
    done: bool,
}

impl NetnsGuard {
    /// The run's prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The namespaces this guard removes.
    pub fn namespaces(&self) -> &[String] {
        &self.namespaces
    }

    /// Removes everything now and reports problems (dropping does the same
    /// but can only log them).
    pub fn teardown(mut self) -> Result<(), NetnsError> {
        self.done = true;
        remove(&self.namespaces, &self.root_links, &[self.group]).map(drop)
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        if let Err(e) = remove(&self.namespaces, &self.root_links, &[self.group]) {
            tracing::warn!(
                "removing network namespaces of {} failed: {e} \
                 (`testbed down` removes leftovers)",
                self.prefix
            );
        }
    }
}

/// Deletes those of `namespaces` and root `links` that exist; returns how many.
///
/// Root-side interfaces go first: every veth deletion waits for a kernel RCU
/// grace period, so each of `groups` whose members are all in `links` goes
/// with one `ip link del group` (one wait for all), and the rest each with
/// its own `ip` side by side (the waits overlap). Waiting for a deleted
/// namespace's cleanup to take them is slower still. Deleting the namespaces
/// then takes their veth pairs with them.
fn remove(namespaces: &[String], links: &[String], groups: &[u32]) -> Result<usize, NetnsError> {
    let existing_ns = list_namespaces()?;
    let existing_links = root_links()?;
    let mut pending: Vec<&String> = links
        .iter()
        .filter(|l| existing_links.contains(l))
        .collect();
    let count = pending.len();
    for group in groups {
        let group = group.to_string();
        let members = link_names(&run_ip(&["-o", "link", "show", "group", &group])?);
        if !members.is_empty() && members.iter().all(|m| links.contains(m)) {
            // Errors show in the check below.
            let _ = run_ip(&["link", "del", "group", &group]);
            pending.retain(|l| !members.contains(l));
        }
    }
    let link_batches: Vec<Batch> = pending
        .iter()
        .map(|link| {
            let mut batch = Batch::new(None);
            batch.push(format!("link del dev {link}"));
            batch
        })
        .collect();
    let links_result = run_parallel(&link_batches);
    let mut batch = Batch::new(None);
    for ns in namespaces.iter().filter(|n| existing_ns.contains(n)) {
        batch.push(format!("netns del {ns}"));
    }
    let count = count + batch.lines.len();
    let ns_result = batch.run(true);

    let now = list_namespaces()?;
    let ns_left: Vec<&String> = namespaces.iter().filter(|n| now.contains(n)).collect();
    let now = root_links()?;
    let links_left: Vec<&String> = links.iter().filter(|l| now.contains(l)).collect();
    if !ns_left.is_empty() {
        ns_result?;
    }
    if !links_left.is_empty() {
        links_result?;
    }
    if !ns_left.is_empty() || !links_left.is_empty() {
        return Err(NetnsError::InUse(format!(
            "still present after removal: namespaces {ns_left:?}, root interfaces {links_left:?}"
        )));
    }
    Ok(count)
}

/// Builds the plan: namespaces, bridges, veth pairs, addresses, `lo` up. On
/// any failure removes what it created and returns the error, naming the
/// failing `ip` command and its stderr.
pub fn apply(plan: &NetPlan) -> Result<NetnsGuard, NetnsError> {
    require_root()?;
    check_prefix(&plan.prefix)?;
    let root_names: Vec<String> = plan.root_links().map(str::to_owned).collect();

    // Refuse to touch anything that is already there.
    let existing_ns = list_namespaces()?;
    if let Some(ns) = plan
        .namespaces
        .iter()
        .find(|h| existing_ns.contains(&h.name))
    {
        return Err(NetnsError::InUse(format!(
            "network namespace {} already exists (left over from a crashed run? \
             `testbed down` removes it)",
            ns.name
        )));
    }
    let existing_links = root_links()?;
    if let Some(link) = root_names.iter().find(|l| existing_links.contains(l)) {
        return Err(NetnsError::InUse(format!(
            "interface {link} already exists in the root namespace (left over from a \
             crashed run? `testbed down` removes it)"
        )));
    }
    let block = mgmt_block(&plan.prefix);
    if let Some(addr) = root_addresses()?.into_iter().find(|a| in_block(*a, block)) {
        return Err(NetnsError::InUse(format!(
            "the management block {} of prefix {} is in use ({addr} is on this machine); \
             use another prefix, or `testbed down` if it is a leftover",
            plan.mgmt_subnet, plan.prefix
        )));
    }

    let guard = NetnsGuard {
        prefix: plan.prefix.clone(),
        namespaces: plan.namespaces.iter().map(|h| h.name.clone()).collect(),
        root_links: root_names,
        group: plan.mgmt_group,
        done: false,
    };

    // Root namespace: namespaces, bridges, veth pairs, root-side addresses.
    let mut root = Batch::new(None);
    for host in &plan.namespaces {
        root.push(format!("netns add {}", host.name));
    }
    for bridge in &plan.bridges {
        root.push(format!(
            "link add name {} netns {} type bridge",
            bridge.name, bridge.ns
        ));
    }
    // Root-side ends join the run's interface group (fast teardown).
    let place = |ns: &Option<String>| match ns {
        Some(ns) => format!("netns {ns}"),
        None => format!("group {}", plan.mgmt_group),
    };
    for veth in &plan.veths {
        root.push(format!(
            "link add name {} {} type veth peer name {} {}",
            veth.name_a,
            place(&veth.ns_a),
            veth.name_b,
            place(&veth.ns_b)
        ));
    }

    // Per namespace: lo, bridges, addresses, ports, links up, source routes.
    let mut batches: BTreeMap<&str, Batch> = BTreeMap::new();
    for host in &plan.namespaces {
        let mut batch = Batch::new(Some(&host.name));
        batch.push("link set dev lo up".to_owned());
        batches.insert(host.name.as_str(), batch);
    }
    for bridge in &plan.bridges {
        let batch = batches
            .entry(bridge.ns.as_str())
            .or_insert_with(|| Batch::new(Some(&bridge.ns)));
        batch.push(format!("addr add {} dev {}", bridge.addr, bridge.name));
        batch.push(format!("link set dev {} up", bridge.name));
    }
    let mut strict_arp = BTreeSet::new();
    for veth in &plan.veths {
        let ends = [
            (&veth.name_a, &veth.ns_a, &veth.addr_a, &veth.bridge_a),
            (&veth.name_b, &veth.ns_b, &veth.addr_b, &veth.bridge_b),
        ];
        for (name, ns, addr, bridge) in ends {
            let batch = match ns {
                None => &mut root,
                Some(ns) => batches
                    .entry(ns.as_str())
                    .or_insert_with(|| Batch::new(Some(ns))),
            };
            if let Some(bridge) = bridge {
                batch.push(format!("link set dev {name} master {bridge}"));
            }
            if let Some(addr) = addr {
                batch.push(format!("addr add {addr} dev {name}"));
            }
            batch.push(format!("link set dev {name} up"));
        }
        if veth.source_table.is_some()
            && let Some(ns) = &veth.ns_b
        {
            let batch = batches
                .entry(ns.as_str())
                .or_insert_with(|| Batch::new(Some(ns)));
            for line in source_route_lines(veth, false) {
                batch.push(line);
            }
            strict_arp.insert(ns.clone());
        }
    }
    let batches: Vec<Batch> = batches.into_values().collect();

    root.run(false)?;
    run_parallel(&batches)?;
    for ns in &strict_arp {
        // Answer ARP only on the interface that has the address, and use it
        // as the source, so several RNICs on one subnet stay separate wires.
        in_namespace(ns, || -> io::Result<()> {
            std::fs::write("/proc/sys/net/ipv4/conf/all/arp_ignore", "1")?;
            std::fs::write("/proc/sys/net/ipv4/conf/all/arp_announce", "2")
        })?
        .map_err(|source| NetnsError::Namespace {
            name: ns.clone(),
            source,
        })?;
    }
    Ok(guard)
}

/// A command that runs `program` inside namespace `ns`
/// (`ip netns exec NS program`); add its arguments to the result.
pub fn command_in(ns: &str, program: &Path) -> Command {
    let mut command = Command::new("ip");
    command.args(["netns", "exec", ns]).arg(program);
    command
}

/// Takes one topology link down or up (chaos `cut-link`): both ends, each in
/// its namespace. Bringing an RNIC back up re-installs its source route.
pub fn set_link(veth: &Veth, up: bool) -> Result<(), NetnsError> {
    let state = if up { "up" } else { "down" };
    for (name, ns) in veth.ends() {
        let mut args = Vec::new();
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        args.extend(["link", "set", "dev", name, state]);
        run_ip(&args)?;
    }
    if up && veth.source_table.is_some() {
        let mut batch = Batch::new(veth.ns_b.as_deref());
        for line in source_route_lines(veth, true) {
            batch.push(line);
        }
        batch.run(false)?;
    }
    Ok(())
}

/// Whether a namespace name is one of a testbed run's (`pf…-s|f|c-…`).
fn is_testbed_ns(name: &str, prefix: Option<&str>) -> bool {
    let Some((head, rest)) = name.split_once('-') else {
        return false;
    };
    let prefix_ok = match prefix {
        Some(p) => head == p,
        None => is_prefix(head),
    };
    prefix_ok && rest.len() > 2 && matches!(rest.as_bytes()[..2], [b's' | b'f' | b'c', b'-'])
}

/// Whether a root interface name is a testbed management end (`pf…-m<n>`).
fn is_testbed_link(name: &str, prefix: Option<&str>) -> bool {
    let Some((head, rest)) = name.split_once('-') else {
        return false;
    };
    let prefix_ok = match prefix {
        Some(p) => head == p,
        None => is_prefix(head),
    };
    prefix_ok
        && rest
            .strip_prefix('m')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// `testbed down`: removes every namespace and root-side management interface
/// of the run with `prefix`, or of every testbed run when `None`. Returns how
/// many namespaces and interfaces it removed. Processes still running inside
/// them keep their interfaces alive until they exit (see [`namespace_pids`]).
pub fn teardown_leftovers(prefix: Option<&str>) -> Result<usize, NetnsError> {
    if let Some(p) = prefix {
        check_prefix(p)?;
    }
    require_root()?;
    let namespaces: Vec<String> = list_namespaces()?
        .into_iter()
        .filter(|n| is_testbed_ns(n, prefix))
        .collect();
    let links: Vec<String> = root_links()?
        .into_iter()
        .filter(|n| is_testbed_link(n, prefix))
        .collect();
    let groups: BTreeSet<u32> = links
        .iter()
        .filter_map(|l| l.split_once('-'))
        .map(|(p, _)| mgmt_group(p))
        .collect();
    remove(&namespaces, &links, &Vec::from_iter(groups))
}

/// `testbed down` after a crash: kills the processes still running inside
/// the leftover namespaces of `prefix` (every testbed run when `None`), so
/// they release their interfaces, then removes the namespaces and
/// management interfaces. Returns (processes killed, items removed).
pub fn clean_up_crashed_runs(prefix: Option<&str>) -> Result<(usize, usize), NetnsError> {
    if let Some(p) = prefix {
        check_prefix(p)?;
    }
    require_root()?;
    let mut killed = 0;
    for ns in list_namespaces()?
        .into_iter()
        .filter(|n| is_testbed_ns(n, prefix))
    {
        for pid in namespace_pids(&ns)? {
            let Ok(pid) = i32::try_from(pid) else {
                continue;
            };
            // SAFETY: kill(2) has no memory effects; the pid was listed by
            // the kernel as running inside a testbed namespace.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                killed += 1;
            }
        }
    }
    if killed > 0 {
        // Give the kernel a moment to reap them and release their interfaces.
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    Ok((killed, teardown_leftovers(prefix)?))
}

/// The processes running inside namespace `ns` (`ip netns pids`).
pub fn namespace_pids(ns: &str) -> Result<Vec<u32>, NetnsError> {
    let out = run_ip(&["netns", "pids", ns])?;
    Ok(out.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

/// Opens the file of namespace `ns`.
fn open_namespace(ns: &str) -> Result<std::fs::File, NetnsError> {
    let file = NETNS_DIRS
        .iter()
        .map(|dir| Path::new(dir).join(ns))
        .find(|p| p.exists())
        .ok_or_else(|| NetnsError::Namespace {
            name: ns.to_owned(),
            source: io::Error::new(io::ErrorKind::NotFound, "no such network namespace"),
        })?;
    std::fs::File::open(&file).map_err(|source| NetnsError::Namespace {
        name: ns.to_owned(),
        source,
    })
}

/// Moves the calling thread into namespace `ns`. Sockets it opens from then
/// on, and threads and processes it starts, belong to `ns`.
pub fn enter(ns: &str) -> Result<(), NetnsError> {
    enter_file(&open_namespace(ns)?).map_err(|source| NetnsError::Namespace {
        name: ns.to_owned(),
        source,
    })
}

/// Moves the calling thread into the network namespace `file` refers to
/// (a `/run/netns` entry or a `/proc/…/ns/net` file).
pub fn enter_file(file: &std::fs::File) -> io::Result<()> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: `file` is an open namespace file descriptor that lives until
    // after the call; setns only changes this thread's network namespace.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `f` on a fresh thread that has entered namespace `ns` and returns its
/// result. Sockets `f` creates belong to `ns` for their whole life, so they
/// may be returned and used from any thread. A panic in `f` is resumed here.
pub fn in_namespace<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> Result<T, NetnsError> {
    std::thread::scope(|scope| {
        let thread = scope.spawn(move || {
            enter(ns)?;
            Ok(f())
        });
        match thread.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        for good in ["pf", "pf1", "pf1234", "pfzz9a"] {
            assert!(is_prefix(good), "{good}");
        }
        for bad in ["", "p", "pf12345", "xx1234", "pf-1", "pfA1"] {
            assert!(!is_prefix(bad), "{bad}");
        }
    }

    #[test]
    fn leftover_names() {
        assert!(is_testbed_ns("pf12-s-a", None));
        assert!(is_testbed_ns("pf12-c-c1-3", Some("pf12")));
        assert!(!is_testbed_ns("pf12-c-c1", Some("pf1")));
        assert!(!is_testbed_ns("pf12-x-a", None));
        assert!(!is_testbed_ns("docker-s-a", None));
        assert!(is_testbed_link("pf12-m0", None));
        assert!(is_testbed_link("pf12-m17", Some("pf12")));
        assert!(!is_testbed_link("pf12-m", None));
        assert!(!is_testbed_link("pf12-mx", None));
        assert!(!is_testbed_link("eth0", None));
    }

    #[test]
    fn sanitizing_and_networks() {
        assert_eq!(sanitize("PA.1"), "pa1");
        assert_eq!(sanitize("..."), "x");
        assert_eq!(sanitize("AVeryLongIdIndeed"), "averylon");
        assert_eq!(network_of("10.1.2.13/24").as_deref(), Some("10.1.2.0/24"));
        assert_eq!(network_of("10.1.2.13/30").as_deref(), Some("10.1.2.12/30"));
        let block = mgmt_block("pf1234");
        assert_eq!(block & 1023, 0);
        assert!((MGMT_BASE..MGMT_BASE + (16 << 16)).contains(&block));
    }
}
