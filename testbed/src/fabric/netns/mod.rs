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
//! Submodules: `plan` (the plan), `apply` (building, removing, cutting a
//! link), `ip` (running iproute2), `cleanup` (leftovers of crashed runs),
//! `enter` (running inside a namespace), `host` (root, fresh prefixes).
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
//! | management of client `c`, with [`Management::DaemonsAndClients`] (`--control etcd`: its etcd) | veth `<prefix>-m<h>` after the daemons' ↔ `mgmt0` | the next `/30`: root end `.1` (where etcd listens), client end `.2` |
//!
//! So every NIC and port has one listen address reachable from every linked
//! device or RNIC; a client reaches only its devices' ports (it has no route to
//! any server or daemon's management address; with a management link of its
//! own, the root end of that link too), and the root namespace reaches only the
//! daemons' admin addresses. Each RNIC's address routes through its own
//! interface (a source-address routing table per RNIC, `arp_ignore=1`), so
//! cutting one RNIC's link never silently moves its traffic to another RNIC.
//! At most 99 servers, 99 fabric devices, 256 NICs per server, 256 ports per
//! device and 200 RNICs per port.

use std::{fmt, io};

use topology::{ClientId, FabricDeviceId, NicId, PortId, RnicId, ServerId, ValidationErrors};

mod apply;
mod cleanup;
mod enter;
mod host;
mod ip;
mod plan;

pub use apply::{NetnsGuard, apply, set_link};
pub use cleanup::{clean_up_crashed_runs, teardown_leftovers};
pub use enter::{command_in, enter, enter_file, in_namespace, namespace_pids};
pub use host::{fresh_prefix, require_root};
pub use ip::list_namespaces;
pub use plan::{Management, check_prefix, plan, plan_managing};

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
pub(super) const NETNS_DIRS: [&str; 2] = ["/run/netns", "/var/run/netns"];
/// The management space: `10.240.0.0/12`, one `/22` per run.
pub(super) const MGMT_BASE: u32 = u32::from_be_bytes([10, 240, 0, 0]);
/// Management `/22` blocks in [`MGMT_BASE`].
pub(super) const MGMT_SLOTS: u32 = 1024;
/// Root-side management interfaces of a run share the interface group
/// `MGMT_GROUP_BASE + slot` (its management block's slot), so teardown deletes
/// them with one `ip link del group` (one kernel grace period for all).
pub(super) const MGMT_GROUP_BASE: u32 = 0x7066_0000;
/// The first routing table and rule priority of the per-RNIC source routes.
pub(super) const SOURCE_TABLE_BASE: u32 = 100;

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

pub(super) fn status_text(status: Option<i32>) -> String {
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

#[cfg(test)]
mod tests {
    use super::cleanup::is_testbed_link;
    use super::cleanup::is_testbed_ns;
    use super::ip::network_of;
    use super::plan::is_prefix;
    use super::plan::mgmt_block;
    use super::plan::sanitize;
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
