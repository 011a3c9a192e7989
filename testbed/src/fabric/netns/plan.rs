//! Planning: a topology turned into namespaces, bridges and veths with
//! deterministic names and addresses (see the table in the module above).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::{Ipv4Addr, SocketAddr};

use topology::{FabricDeviceId, NicId, PortId, ServerId, Topology};

use super::{
    Bridge, BridgeOf, DEFAULT_DEVICE_ADMIN_PORT, DEFAULT_DEVICE_PORT, DEFAULT_NIC_PORT,
    DEFAULT_SERVER_ADMIN_PORT, HostKind, IFNAME_MAX, LinkRef, MAX_DEVICES, MAX_NICS, MAX_PORTS,
    MAX_RNICS_PER_PORT, MAX_SERVERS, MGMT_BASE, MGMT_GROUP_BASE, MGMT_IFNAME, MGMT_SLOTS, NetPlan,
    NetnsError, NsHost, SOURCE_TABLE_BASE, Veth,
};

/// Checks a run prefix: `pf` plus at most four of `[a-z0-9]`.
pub fn check_prefix(prefix: &str) -> Result<(), NetnsError> {
    if is_prefix(prefix) {
        Ok(())
    } else {
        Err(NetnsError::BadPrefix(prefix.to_owned()))
    }
}

pub(super) fn is_prefix(prefix: &str) -> bool {
    prefix.len() <= 6
        && prefix.starts_with("pf")
        && prefix[2..]
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Lowercases an id and keeps `[a-z0-9]`, at most 8 characters.
pub(super) fn sanitize(id: &str) -> String {
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
pub(super) fn mgmt_slot(prefix: &str) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for b in prefix.bytes() {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash % MGMT_SLOTS
}

/// The management `/22` of a prefix.
pub(super) fn mgmt_block(prefix: &str) -> u32 {
    MGMT_BASE + mgmt_slot(prefix) * 1024
}

/// The interface group of a prefix's root-side management interfaces.
pub(super) fn mgmt_group(prefix: &str) -> u32 {
    MGMT_GROUP_BASE + mgmt_slot(prefix)
}

pub(super) fn ip(a: u8, b: u8, c: u8, d: u8) -> Ipv4Addr {
    Ipv4Addr::new(a, b, c, d)
}

/// The port of a `host:port` address, or `default` when absent, bad or 0.
pub(super) fn port_of(address: Option<&str>, default: u16) -> u16 {
    match address.and_then(|a| a.parse::<SocketAddr>().ok()) {
        Some(addr) if addr.port() != 0 => addr.port(),
        _ => default,
    }
}

/// The port of an RNIC's `local_addr` when it names one.
pub(super) fn local_port(address: Option<&str>) -> Option<u16> {
    address
        .and_then(|a| a.parse::<SocketAddr>().ok())
        .map(|a| a.port())
        .filter(|&p| p != 0)
}

pub(super) fn too_big(what: String) -> NetnsError {
    NetnsError::TooBig(what)
}

pub(super) fn index_u8(
    index: usize,
    limit: usize,
    what: impl FnOnce() -> String,
) -> Result<u8, NetnsError> {
    if index < limit {
        u8::try_from(index).map_err(|_| too_big(what()))
    } else {
        Err(too_big(what()))
    }
}

/// Adds daemon number `daemon`'s management veth and returns its address.
pub(super) fn push_mgmt(
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
    plan_managing(topology, prefix, Management::Daemons)
}

/// Which hosts get a management link to the root namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Management {
    /// Servers and fabric devices (their admin addresses).
    Daemons,
    /// Clients too, after the daemons: a client then reaches the root end
    /// of its own link (where the run's etcd listens) and nothing else
    /// there.
    DaemonsAndClients,
}

/// [`plan`], with management links for the hosts `management` names.
pub fn plan_managing(
    topology: &Topology,
    prefix: &str,
    management: Management,
) -> Result<(NetPlan, Topology), NetnsError> {
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
    let mut planner = Planner::new(topology, prefix);
    let nic_net = planner.servers(&mut rewritten.servers)?;
    let port_net = planner.devices(&mut rewritten.fabric_devices, &nic_net)?;
    planner.clients(topology, &mut rewritten.clients, &port_net)?;
    if management == Management::DaemonsAndClients {
        planner.client_management(&rewritten.clients)?;
    }
    planner.check_names()?;
    let plan = NetPlan {
        prefix: prefix.to_owned(),
        namespaces: planner.namespaces,
        bridges: planner.bridges,
        veths: planner.veths,
        mgmt_subnet: format!("{}/22", Ipv4Addr::from(planner.mgmt)),
        mgmt_group: mgmt_group(prefix),
    };
    Ok((plan, rewritten))
}

/// Where a server NIC's subnet is: (second octet, third octet, server
/// position).
type NicNets = BTreeMap<(ServerId, NicId), (u8, u8, usize)>;
/// Where a device port's subnet is: (second octet, third octet, device
/// position).
type PortNets = BTreeMap<(FabricDeviceId, PortId), (u8, u8, usize)>;

/// A plan being built: host names, then servers, devices and clients in
/// turn, each rewriting its part of the topology to the planned addresses.
struct Planner<'a> {
    prefix: &'a str,
    mgmt: u32,
    /// Management links handed out so far (servers, then devices, then
    /// clients when they have them).
    daemon: usize,
    server_ns: Vec<String>,
    device_ns: Vec<String>,
    client_ns: Vec<String>,
    namespaces: Vec<NsHost>,
    bridges: Vec<Bridge>,
    veths: Vec<Veth>,
}

impl<'a> Planner<'a> {
    /// Names every host's namespace (`<prefix>-<kind>-<id>`, unique).
    fn new(topology: &Topology, prefix: &'a str) -> Self {
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
        let server_ns = topology
            .servers
            .iter()
            .enumerate()
            .map(|(i, s)| ns_name(HostKind::Server, i, s.id.as_str()))
            .collect();
        let device_ns = topology
            .fabric_devices
            .iter()
            .enumerate()
            .map(|(i, d)| ns_name(HostKind::FabricDevice, i, d.id.as_str()))
            .collect();
        let client_ns = topology
            .clients
            .iter()
            .enumerate()
            .map(|(i, c)| ns_name(HostKind::Client, i, c.id.as_str()))
            .collect();
        Planner {
            prefix,
            mgmt: mgmt_block(prefix),
            daemon: 0,
            server_ns,
            device_ns,
            client_ns,
            namespaces: Vec::new(),
            bridges: Vec::new(),
            veths: Vec::new(),
        }
    }

    /// Servers: one bridge per NIC, a management link each.
    fn servers(&mut self, servers: &mut [topology::model::Server]) -> Result<NicNets, NetnsError> {
        let (prefix, mgmt) = (self.prefix, self.mgmt);
        let mut nic_net = NicNets::new();
        for (s, server) in servers.iter_mut().enumerate() {
            let ns = self.server_ns[s].clone();
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
                self.bridges.push(Bridge {
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
                &mut self.veths,
                prefix,
                mgmt,
                &mut self.daemon,
                HostKind::Server,
                server.id.as_str(),
                &ns,
            )?;
            let port = port_of(server.admin.as_deref(), DEFAULT_SERVER_ADMIN_PORT);
            server.admin = Some(format!("{inner}:{port}"));
            self.namespaces.push(NsHost {
                name: ns.clone(),
                kind: HostKind::Server,
                id: server.id.to_string(),
                admin: server.admin.clone(),
            });
        }
        Ok(nic_net)
    }

    /// Fabric devices: a veth per server link, a bridge per port.
    fn devices(
        &mut self,
        devices: &mut [topology::model::FabricDevice],
        nic_net: &NicNets,
    ) -> Result<PortNets, NetnsError> {
        let (prefix, mgmt) = (self.prefix, self.mgmt);
        let mut port_net = PortNets::new();
        for (d, device) in devices.iter_mut().enumerate() {
            let ns = self.device_ns[d].clone();
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
                self.veths.push(Veth {
                    name_a: format!("n{n}d{d}"),
                    ns_a: Some(self.server_ns[s].clone()),
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
                self.bridges.push(Bridge {
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
                &mut self.veths,
                prefix,
                mgmt,
                &mut self.daemon,
                HostKind::FabricDevice,
                device.id.as_str(),
                &ns,
            )?;
            let port = port_of(device.admin.as_deref(), DEFAULT_DEVICE_ADMIN_PORT);
            device.admin = Some(format!("{inner}:{port}"));
            self.namespaces.push(NsHost {
                name: ns.clone(),
                kind: HostKind::FabricDevice,
                id: device.id.to_string(),
                admin: device.admin.clone(),
            });
        }
        Ok(port_net)
    }

    /// Clients: a veth per RNIC onto its device port's bridge.
    fn clients(
        &mut self,
        topology: &Topology,
        clients: &mut [topology::model::Client],
        port_net: &PortNets,
    ) -> Result<(), NetnsError> {
        let mut per_port: BTreeMap<(FabricDeviceId, PortId), usize> = BTreeMap::new();
        for (c, client) in clients.iter_mut().enumerate() {
            let ns = self.client_ns[c].clone();
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
                    + u32::try_from(r)
                        .map_err(|_| too_big(format!("client {} RNICs", client.id)))?;
                self.veths.push(Veth {
                    name_a: format!("p{p8}c{c}r{r}"),
                    ns_a: Some(self.device_ns[d].clone()),
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
            self.namespaces.push(NsHost {
                name: ns.clone(),
                kind: HostKind::Client,
                id: client.id.to_string(),
                admin: None,
            });
        }
        Ok(())
    }

    /// A management link per client, numbered after the daemons'.
    fn client_management(&mut self, clients: &[topology::model::Client]) -> Result<(), NetnsError> {
        for (c, client) in clients.iter().enumerate() {
            let ns = self.client_ns[c].clone();
            push_mgmt(
                &mut self.veths,
                self.prefix,
                self.mgmt,
                &mut self.daemon,
                HostKind::Client,
                client.id.as_str(),
                &ns,
            )?;
        }
        Ok(())
    }

    /// Every interface name fits Linux's limit.
    fn check_names(&self) -> Result<(), NetnsError> {
        for veth in &self.veths {
            for name in [&veth.name_a, &veth.name_b] {
                if name.len() > IFNAME_MAX {
                    return Err(too_big(format!(
                        "interface name {name:?} of {} is longer than {IFNAME_MAX} characters",
                        veth.link
                    )));
                }
            }
        }
        Ok(())
    }
}
