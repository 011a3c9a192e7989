//! Topology files for tests: a one-server fabric on ephemeral ports, and
//! multi-server fabrics whose data ports are fixed so that daemons can find
//! each other.
//!
//! A pmem-server can listen on `127.0.0.1:0` and report the port it got, but
//! a fabric device connects to the server NICs the topology names, so in a
//! fabric of several daemons every server NIC and device port needs a real
//! port before anything starts. [`FabricSpec::write`] takes them from a
//! [`Ports`] book that hands out fresh free ports for new listeners and
//! keeps the old ones, so a test can write a second version of the fabric
//! (one more server, say) that the running daemons agree with. Admin
//! endpoints are not in these files: the launch helpers put them on
//! `127.0.0.1:0` on the command line.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use topology::{EnvOverrides, Topology};

/// Ports [`free_loopback_port`] has handed out in this process.
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// Lock files of the ports this process holds (see [`claim_across_processes`]);
/// kept open, so the claims last as long as the process.
static CLAIMS: Mutex<Vec<std::fs::File>> = Mutex::new(Vec::new());

/// Ports handed out come from below the kernel's ephemeral range
/// (32768–60999 by default), so an outgoing connection can never take one
/// between the check here and the daemon's bind.
const PORT_RANGE: std::ops::Range<u16> = 20_000..32_000;

/// A loopback TCP port that was free a moment ago (bound and released),
/// outside the ephemeral range, never the same twice in one process; the
/// search starts at a point derived from the process id and the clock, so
/// concurrent test processes rarely even try the same port.
///
/// Test processes that run at once (a test's own `testbed` child, say, or
/// two `cargo test` runs) never hand out the same port: each port handed
/// out is claimed by a lock file that this process holds until it exits.
/// A process that does not use this function may still take the port
/// before the daemon binds it.
///
/// # Panics
///
/// When no port of the range is free (see [`try_free_loopback_port`]).
pub fn free_loopback_port() -> u16 {
    try_free_loopback_port().unwrap_or_else(|| panic!("no free loopback port in {PORT_RANGE:?}"))
}

/// [`free_loopback_port`], or `None` when every port of the range is taken.
pub fn try_free_loopback_port() -> Option<u16> {
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
    let span = u32::from(PORT_RANGE.end - PORT_RANGE.start);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let seed = std::process::id().wrapping_mul(7919).wrapping_add(nanos);
    for step in 0..span {
        let port = PORT_RANGE.start + ((seed.wrapping_add(step.wrapping_mul(97))) % span) as u16;
        if handed_out.contains(&port) {
            continue;
        }
        if claim_across_processes(port) && TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            handed_out.insert(port);
            return Some(port);
        }
    }
    None
}

/// Claims `port` for this process with an exclusive lock on
/// `$TMPDIR/pmem-fabric-test-ports/<port>`, which the kernel drops when the
/// process exits; false when another live process holds it. When the folder
/// cannot be used, every port counts as unclaimed (the bind check remains).
fn claim_across_processes(port: u16) -> bool {
    let path = std::env::temp_dir()
        .join("pmem-fabric-test-ports")
        .join(port.to_string());
    let Ok(file) = crate::open_lock_file(&path) else {
        return true;
    };
    match crate::try_lock_exclusive(&file) {
        Ok(true) => {
            CLAIMS
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(file);
            true
        }
        Ok(false) => false,
        Err(_) => true,
    }
}

/// A TOML basic string.
fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Something in a topology that listens for connections.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Listener {
    ServerNic { server: String, nic: String },
    DevicePort { device: String, port: String },
}

/// The ports a fabric's listeners use, kept across rewrites of its topology:
/// a listener seen before keeps its port, a new one gets a fresh
/// [`free_loopback_port`].
#[derive(Debug, Clone, Default)]
pub struct Ports {
    assigned: BTreeMap<Listener, u16>,
}

impl Ports {
    /// An empty book.
    pub fn new() -> Self {
        Self::default()
    }

    /// The port of `listener`, assigning a fresh one on first use.
    fn assign(&mut self, listener: Listener) -> u16 {
        *self
            .assigned
            .entry(listener)
            .or_insert_with(free_loopback_port)
    }

    fn get(&self, listener: &Listener) -> SocketAddr {
        let port = self.assigned.get(listener).unwrap_or_else(|| {
            panic!("no port assigned to {listener:?}; write a topology that has it first")
        });
        SocketAddr::from((Ipv4Addr::LOCALHOST, *port))
    }

    /// The data address of NIC `nic` (`n0`, `n1`, …) of server `server`.
    ///
    /// # Panics
    ///
    /// When no topology written with this book had that NIC.
    pub fn server_nic(&self, server: &str, nic: &str) -> SocketAddr {
        self.get(&Listener::ServerNic {
            server: server.to_owned(),
            nic: nic.to_owned(),
        })
    }

    /// The address of client-facing port `port` (`p0`) of fabric device
    /// `device`.
    ///
    /// # Panics
    ///
    /// When no topology written with this book had that port.
    pub fn device_port(&self, device: &str, port: &str) -> SocketAddr {
        self.get(&Listener::DevicePort {
            device: device.to_owned(),
            port: port.to_owned(),
        })
    }

    /// Every assigned port, in no particular order.
    pub fn ports(&self) -> Vec<u16> {
        self.assigned.values().copied().collect()
    }
}

/// A test fabric, written as a topology by [`FabricSpec::write`]:
///
/// - pool `test` with extent size `extent_size` (default `1MiB`);
/// - each server has `sockets_per_server` sockets `0`, `1`, …, one PMEM
///   device `pmem<socket>` per socket, and one NIC `n<socket>` per socket;
///   its regions go round-robin over the sockets (first region on socket 0,
///   second on socket 1, …), so the layout's region order is socket by
///   socket;
/// - each fabric device has one port `p0` and links to every NIC of every
///   server;
/// - each client has one RNIC `r<i>` wired to the `i`-th fabric device.
///
/// The topology must be valid, so every list needs at least one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricSpec {
    /// Servers in order: id and regions (id, size such as `"4MiB"`).
    pub servers: Vec<(String, Vec<(String, String)>)>,
    /// Fabric device ids.
    pub devices: Vec<String>,
    /// Client ids.
    pub clients: Vec<String>,
    /// CPU sockets (each with one PMEM device and one NIC) per server.
    pub sockets_per_server: usize,
    /// The pool's extent size; every region size must be a multiple.
    pub extent_size: String,
    /// The lines of `[pool.allocator]`, when the pool has an allocator.
    pub allocator: Option<String>,
    /// Devices whose port has a RoCEv2 side: device id → the port's
    /// interface, the IPv4 address its control listener binds, and its
    /// RoCEv2 address.
    pub roce: std::collections::BTreeMap<String, RoceSpec>,
}

/// The RoCEv2 side of a test device's port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoceSpec {
    /// The network interface the device does raw packet I/O on.
    pub interface: String,
    /// The address the port's control (TCP) listener binds.
    pub control_ip: String,
    /// The port's RoCEv2 address (answered by the device, not the kernel).
    pub roce_ip: String,
}

impl Default for FabricSpec {
    fn default() -> Self {
        Self {
            servers: Vec::new(),
            devices: Vec::new(),
            clients: Vec::new(),
            sockets_per_server: 1,
            extent_size: "1MiB".to_owned(),
            allocator: None,
            roce: std::collections::BTreeMap::new(),
        }
    }
}

impl FabricSpec {
    /// No servers, devices or clients yet; one socket per server.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a server with regions (id, size).
    pub fn server(mut self, id: &str, regions: &[(&str, &str)]) -> Self {
        let regions = regions
            .iter()
            .map(|&(region, size)| (region.to_owned(), size.to_owned()))
            .collect();
        self.servers.push((id.to_owned(), regions));
        self
    }

    /// Adds a fabric device.
    pub fn device(mut self, id: &str) -> Self {
        self.devices.push(id.to_owned());
        self
    }

    /// Adds a client.
    pub fn client(mut self, id: &str) -> Self {
        self.clients.push(id.to_owned());
        self
    }

    /// Gives the pool an allocator: `settings` are the lines of its
    /// `[pool.allocator]` table (may be empty for the defaults).
    pub fn allocator(mut self, settings: &str) -> Self {
        self.allocator = Some(settings.to_owned());
        self
    }

    /// Gives `device`'s port a RoCEv2 side (see [`RoceSpec`]).
    pub fn roce_port(mut self, device: &str, spec: RoceSpec) -> Self {
        self.roce.insert(device.to_owned(), spec);
        self
    }

    /// Sets the pool's extent size (`"2MiB"`); every region size must be
    /// a multiple.
    pub fn extent_size(mut self, size: &str) -> Self {
        self.extent_size = size.to_owned();
        self
    }

    /// Sets the number of sockets per server.
    pub fn sockets_per_server(mut self, sockets: usize) -> Self {
        self.sockets_per_server = sockets;
        self
    }

    /// Writes the topology to `dir/file_name` with the listen ports `ports`
    /// gives (assigning fresh ones to listeners it has not seen), checks that
    /// it is valid, and returns its path.
    ///
    /// # Panics
    ///
    /// When the file cannot be written or the topology is invalid (naming
    /// every problem).
    pub fn write(&self, dir: &Path, file_name: &str, ports: &mut Ports) -> PathBuf {
        let text = self.render(|listener| ports.assign(listener));
        write_checked(&dir.join(file_name), &text)
    }

    /// The topology, every listener on `127.0.0.1:0` (a daemon reports
    /// the port it got on its ready line), checked valid: for callers that
    /// set what the spec does not say (addresses, a device's path, the
    /// pool's name, admin endpoints) and write the file themselves.
    ///
    /// # Panics
    ///
    /// When the spec makes an invalid topology (naming every problem).
    pub fn topology(&self) -> Topology {
        let text = self.render(|_| 0);
        let topology = Topology::from_toml_str("testkit", &text, &EnvOverrides::None)
            .unwrap_or_else(|e| {
                let why = telemetry::logging::error_chain(&e);
                panic!("testkit made a topology that does not load: {why}\n{text}")
            });
        if let Err(errors) = topology.validate() {
            panic!("testkit made an invalid topology: {errors}\n{text}");
        }
        topology
    }

    /// The topology text; `port` gives each listener's port.
    fn render(&self, mut port: impl FnMut(Listener) -> u16) -> String {
        assert!(self.sockets_per_server > 0, "a server needs a socket");
        let sockets = self.sockets_per_server;
        let mut t = String::new();
        // `write!` to a String cannot fail.
        let _ = writeln!(
            t,
            "# Written by testkit.\n[pool]\nname = \"test\"\nextent_size = {}",
            quoted(&self.extent_size)
        );
        if let Some(settings) = &self.allocator {
            let _ = writeln!(t, "[pool.allocator]\n{settings}");
        }
        for (server, regions) in &self.servers {
            let _ = writeln!(t, "\n[[servers]]\nid = {}", quoted(server));
            for socket in 0..sockets {
                let _ = writeln!(
                    t,
                    "\n  [[servers.sockets]]\n  id = \"{socket}\"\n    \
                     [[servers.sockets.devices]]\n    id = \"pmem{socket}\""
                );
                for (region, size) in regions.iter().skip(socket).step_by(sockets) {
                    let _ = writeln!(
                        t,
                        "      [[servers.sockets.devices.regions]]\n      \
                         id = {}\n      size = {}",
                        quoted(region),
                        quoted(size)
                    );
                }
            }
            for socket in 0..sockets {
                let nic = format!("n{socket}");
                let listen = port(Listener::ServerNic {
                    server: server.clone(),
                    nic: nic.clone(),
                });
                let _ = writeln!(
                    t,
                    "\n  [[servers.nics]]\n  id = \"{nic}\"\n  socket = \"{socket}\"\n  \
                     listen = \"127.0.0.1:{listen}\""
                );
            }
        }
        for device in &self.devices {
            let listen = port(Listener::DevicePort {
                device: device.clone(),
                port: "p0".to_owned(),
            });
            let port_line = match self.roce.get(device) {
                Some(r) => format!(
                    "{{ id = \"p0\", listen = \"{}:{listen}\", roce = {{ interface = {}, ip = {} }} }}",
                    r.control_ip,
                    quoted(&r.interface),
                    quoted(&r.roce_ip)
                ),
                None => format!("{{ id = \"p0\", listen = \"127.0.0.1:{listen}\" }}"),
            };
            let _ = writeln!(
                t,
                "\n[[fabric_devices]]\nid = {}\nports = [{port_line}]\nlinks = [",
                quoted(device)
            );
            for (server, _) in &self.servers {
                for socket in 0..sockets {
                    let _ = writeln!(
                        t,
                        "  {{ server = {}, nic = \"n{socket}\" }},",
                        quoted(server)
                    );
                }
            }
            t.push_str("]\n");
        }
        for client in &self.clients {
            let _ = writeln!(t, "\n[[clients]]\nid = {}\nrnics = [", quoted(client));
            for (i, device) in self.devices.iter().enumerate() {
                let _ = writeln!(
                    t,
                    "  {{ id = \"r{i}\", fabric_device = {} }},",
                    quoted(device)
                );
            }
            t.push_str("]\n");
        }
        t
    }
}

/// Writes `text` to `path` and checks that it is a valid topology.
fn write_checked(path: &Path, text: &str) -> PathBuf {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    let topology = Topology::load_with(path, &EnvOverrides::None).unwrap_or_else(|e| {
        let why = telemetry::logging::error_chain(&e);
        panic!("testkit wrote a topology that does not load: {why}\n{text}")
    });
    if let Err(errors) = topology.validate() {
        panic!("testkit wrote an invalid topology: {errors}\n{text}");
    }
    path.to_path_buf()
}

/// Writes `dir/topology.toml`: one server `S` with one socket `0`, PMEM
/// device `pmem0` holding `regions` (id, size) in order, NIC `n0`; fabric
/// device `F` with port `p0`; client `c` with RNIC `r0`; extent size 1 MiB;
/// every listener on `127.0.0.1:0` (ephemeral, reported by the daemon's
/// ready line).
///
/// Writing again replaces the file, e.g. to change a region's size.
///
/// # Panics
///
/// When the file cannot be written or the topology is invalid.
pub fn write_topology(dir: &Path, regions: &[(&str, &str)]) -> PathBuf {
    let text = FabricSpec::new()
        .server("S", regions)
        .device("F")
        .client("c")
        .render(|_| 0);
    write_checked(&dir.join("topology.toml"), &text)
}

/// A fabric whose map grows by one server between two epochs: server `S1`
/// with region `R1` (4 MiB), fabric device `F` and client `c`, written to
/// `dir/one.toml`; the same with server `S2` and its region `R2` added,
/// written to `dir/two.toml`. Every listener has the same port in both.
///
/// # Panics
///
/// When a file cannot be written.
pub fn one_then_two_servers(dir: &Path) -> (PathBuf, PathBuf) {
    let mut ports = Ports::new();
    let one = FabricSpec::new()
        .server("S1", &[("R1", "4MiB")])
        .device("F")
        .client("c");
    let two = one.clone().server("S2", &[("R2", "4MiB")]);
    let config_one = one.write(dir, "one.toml", &mut ports);
    let config_two = two.write(dir, "two.toml", &mut ports);
    (config_one, config_two)
}

/// The embedded default topology (`configs/default.toml`) with `pool_extra`
/// added to its `[pool]` table (for instance `replicas = 2`).
pub fn default_topology_with(pool_extra: &str) -> topology::Topology {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../configs/default.toml"
    ))
    .expect("read configs/default.toml")
    .replace(
        "name = \"default\"",
        &format!("name = \"default\"\n{pool_extra}"),
    );
    topology::Topology::from_toml_str("default.toml", &text, &topology::EnvOverrides::None)
        .expect("the default topology with the pool's extra lines")
}

#[cfg(test)]
mod tests {
    use super::*;
    use topology::{NicId, RegionId, ServerId, SocketId};

    fn two_by_two() -> FabricSpec {
        FabricSpec::new()
            .server("A", &[("PA.1", "4MiB"), ("PA.2", "4MiB"), ("PA.3", "2MiB")])
            .server("B", &[("PB.1", "4MiB"), ("PB.2", "4MiB")])
            .device("F1")
            .device("F2")
            .client("c1")
            .client("c2")
            .sockets_per_server(2)
    }

    fn load(path: &Path) -> Topology {
        Topology::load_with(path, &EnvOverrides::None).unwrap()
    }

    #[test]
    fn a_port_handed_out_stays_claimed_against_other_processes() {
        let port = free_loopback_port();
        let claim = std::env::temp_dir()
            .join("pmem-fabric-test-ports")
            .join(port.to_string());
        // Another open of the lock file is what another process would hold.
        let other = std::fs::File::open(&claim).expect("the claim's lock file exists");
        assert!(!crate::try_lock_exclusive(&other).expect("flock"));
    }

    #[test]
    fn multi_server_fabric_is_valid_with_distinct_ports() {
        let dir = tempfile::tempdir().unwrap();
        let mut ports = Ports::new();
        let path = two_by_two().write(dir.path(), "fabric.toml", &mut ports);
        let t = load(&path);
        t.validate().unwrap();

        // 2 servers x 2 NICs + 2 device ports, all distinct and non-zero.
        let all = ports.ports();
        assert_eq!(all.len(), 6);
        assert_eq!(all.iter().collect::<BTreeSet<_>>().len(), 6, "{all:?}");
        assert!(!all.contains(&0));

        let a = t.server(&ServerId::new("A")).unwrap();
        assert_eq!(a.sockets.len(), 2);
        assert_eq!(a.nics.len(), 2);
        let on_socket = |socket: &str| -> Vec<&str> {
            a.socket(&SocketId::new(socket)).unwrap().devices[0]
                .regions
                .iter()
                .map(|r| r.id.as_str())
                .collect()
        };
        assert_eq!(on_socket("0"), ["PA.1", "PA.3"], "round-robin");
        assert_eq!(on_socket("1"), ["PA.2"]);
        let n1 = a.nic(&NicId::new("n1")).unwrap();
        assert_eq!(n1.socket.as_str(), "1");
        assert_eq!(n1.listen, ports.server_nic("A", "n1").to_string());

        for device in &t.fabric_devices {
            assert_eq!(device.links.len(), 4, "every NIC of every server");
            assert_eq!(
                device.ports[0].listen,
                ports.device_port(device.id.as_str(), "p0").to_string()
            );
        }
        for client in &t.clients {
            let wired: Vec<&str> = client
                .rnics
                .iter()
                .map(|r| r.fabric_device.as_str())
                .collect();
            assert_eq!(wired, ["F1", "F2"], "one RNIC per device");
        }
        let layout = topology::Layout::new(&t).unwrap();
        assert_eq!(layout.entries().len(), 5);
        assert!(layout.entry_by_id(&RegionId::new("PB.2")).is_some());
    }

    #[test]
    fn the_topology_in_memory_has_every_listener_on_an_ephemeral_port() {
        let t = two_by_two().topology();
        assert_eq!(t.pool.name, "test");
        let listeners: Vec<&str> = t
            .servers
            .iter()
            .flat_map(|s| s.nics.iter().map(|n| n.listen.as_str()))
            .chain(
                t.fabric_devices
                    .iter()
                    .flat_map(|d| d.ports.iter().map(|p| p.listen.as_str())),
            )
            .collect();
        assert_eq!(listeners.len(), 6);
        assert!(
            listeners.iter().all(|l| *l == "127.0.0.1:0"),
            "{listeners:?}"
        );
        assert_eq!(topology::Layout::new(&t).unwrap().entries().len(), 5);
    }

    #[test]
    fn the_second_epoch_adds_a_server_and_keeps_every_port() {
        let dir = tempfile::tempdir().unwrap();
        let (one, two) = one_then_two_servers(dir.path());
        let (one, two) = (load(&one), load(&two));
        let ids =
            |t: &Topology| -> Vec<String> { t.servers.iter().map(|s| s.id.to_string()).collect() };
        assert_eq!(ids(&one), ["S1"]);
        assert_eq!(ids(&two), ["S1", "S2"]);
        assert_eq!(two.servers[0], one.servers[0], "S1 unchanged");
        assert_eq!(two.fabric_devices[0].ports, one.fabric_devices[0].ports);
    }

    #[test]
    fn rewriting_keeps_ports_and_adds_new_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut ports = Ports::new();
        let v1 = two_by_two().write(dir.path(), "v1.toml", &mut ports);
        let before = ports.clone();
        let v2 =
            two_by_two()
                .server("C", &[("PC.1", "4MiB")])
                .write(dir.path(), "v2.toml", &mut ports);
        for (server, nic) in [("A", "n0"), ("A", "n1"), ("B", "n0"), ("B", "n1")] {
            assert_eq!(
                ports.server_nic(server, nic),
                before.server_nic(server, nic)
            );
        }
        for device in ["F1", "F2"] {
            assert_eq!(
                ports.device_port(device, "p0"),
                before.device_port(device, "p0")
            );
        }
        let all = ports.ports();
        assert_eq!(all.len(), 8);
        assert_eq!(all.iter().collect::<BTreeSet<_>>().len(), 8, "{all:?}");
        let (t1, t2) = (load(&v1), load(&v2));
        assert_eq!(t1.servers.len(), 2);
        assert_eq!(t2.servers.len(), 3);
        assert_eq!(t1.servers[..], t2.servers[..2], "old servers unchanged");
    }

    #[test]
    #[should_panic(expected = "invalid topology")]
    fn invalid_specs_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        // 1536 KiB is not a multiple of the 1 MiB extent, and nobody is a client.
        FabricSpec::new()
            .server("A", &[("R", "1536KiB")])
            .device("F")
            .write(dir.path(), "bad.toml", &mut Ports::new());
    }

    #[test]
    fn single_server_topology_uses_ephemeral_ports() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_topology(dir.path(), &[("R1", "4MiB"), ("R2", "2MiB")]);
        assert_eq!(path, dir.path().join("topology.toml"));
        let t = load(&path);
        t.validate().unwrap();
        let s = &t.servers[0];
        assert_eq!(s.id.as_str(), "S");
        assert_eq!(s.nics[0].listen, "127.0.0.1:0");
        assert_eq!(t.fabric_devices[0].id.as_str(), "F");
        assert_eq!(t.fabric_devices[0].ports[0].listen, "127.0.0.1:0");
        assert_eq!(t.clients[0].id.as_str(), "c");
        let regions: Vec<_> = s.sockets[0].devices[0]
            .regions
            .iter()
            .map(|r| (r.id.as_str(), r.size.bytes()))
            .collect();
        assert_eq!(regions, [("R1", 4 << 20), ("R2", 2 << 20)]);
        assert_eq!(t.pool.extent_size.bytes(), 1 << 20);
    }

    #[test]
    fn ids_are_quoted_for_toml() {
        assert_eq!(quoted("PA.1"), "\"PA.1\"");
        assert_eq!(quoted("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000A\"");
    }

    #[test]
    fn free_ports_are_never_repeated() {
        let ports: Vec<u16> = (0..50).map(|_| free_loopback_port()).collect();
        assert_eq!(ports.iter().collect::<BTreeSet<_>>().len(), 50);
        let port = free_loopback_port();
        TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("still free");
    }
}
