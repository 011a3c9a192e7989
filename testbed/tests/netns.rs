//! `--net netns`: the plan for the example topologies, and the real thing
//! (needs root: without it these tests fail with the NotRoot message).

use std::collections::{BTreeSet, HashSet};
use std::io::{self, Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use testbed::fabric::netns::{
    self, BridgeOf, HostKind, LinkRef, NetPlan, NetnsError, Veth, apply, fresh_prefix,
    in_namespace, plan, set_link, teardown_leftovers,
};
use topology::{EnvOverrides, Topology};

fn load(name: &str) -> Topology {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../configs")
        .join(name);
    Topology::load_with(&path, &EnvOverrides::None).expect("example topology loads")
}

fn need_root() {
    if let Err(e) = netns::require_root() {
        panic!("{e}");
    }
}

fn ip_of(cidr: &str) -> Ipv4Addr {
    let addr = cidr.split('/').next().expect("an address");
    addr.parse().expect("an IPv4 address")
}

fn subnet24(addr: Ipv4Addr) -> [u8; 3] {
    let [a, b, c, _] = addr.octets();
    [a, b, c]
}

fn sock(addr: &str) -> SocketAddr {
    addr.parse().expect("a socket address")
}

/// The port a listen address keeps: its own, or `default` for port 0.
fn kept(listen: &str, default: u16) -> u16 {
    match sock(listen).port() {
        0 => default,
        port => port,
    }
}

/// The bridge `of` is in namespace `ns`, and the rewritten `listen` address
/// is on it with the `original` one's port (`default` for port 0).
fn assert_listens_on_bridge(
    plan: &NetPlan,
    of: &BridgeOf,
    ns: &str,
    listen: &str,
    original: &str,
    default: u16,
) {
    let bridge = plan
        .bridge(of)
        .unwrap_or_else(|| panic!("no bridge for {of:?}"));
    assert_eq!(bridge.ns, ns);
    let listen = sock(listen);
    assert_eq!(listen.ip(), IpAddr::V4(ip_of(&bridge.addr)));
    assert_eq!(listen.port(), kept(original, default), "port kept");
}

/// The admin address of daemon `host` is its management link's far end,
/// on `port`; that link.
fn assert_admin_over_mgmt<'p>(
    plan: &'p NetPlan,
    kind: HostKind,
    host: &str,
    admin: Option<&str>,
    port: u16,
) -> &'p Veth {
    let mgmt = plan
        .link(&LinkRef::Mgmt {
            kind,
            host: host.to_owned(),
        })
        .unwrap_or_else(|| panic!("no management link for {kind:?} {host}"));
    let admin = sock(admin.expect("an admin address"));
    assert_eq!(
        admin.ip(),
        IpAddr::V4(ip_of(mgmt.addr_b.as_deref().expect("a management address")))
    );
    assert_eq!(admin.port(), port);
    mgmt
}

/// `veth` runs from the bridge `of` (in that bridge's namespace) into
/// namespace `ns`; its far end's address, in the bridge's /24.
fn assert_veth_onto_bridge(plan: &NetPlan, veth: &Veth, of: &BridgeOf, ns: &str) -> Ipv4Addr {
    let bridge = plan
        .bridge(of)
        .unwrap_or_else(|| panic!("no bridge for {of:?}"));
    assert_eq!(veth.ns_a.as_deref(), Some(bridge.ns.as_str()));
    assert_eq!(veth.bridge_a.as_deref(), Some(bridge.name.as_str()));
    assert_eq!(veth.ns_b.as_deref(), Some(ns));
    let end = ip_of(veth.addr_b.as_deref().expect("the far end has an address"));
    assert_eq!(subnet24(end), subnet24(ip_of(&bridge.addr)), "same /24");
    end
}

/// Everything a plan promises, checked against the topology it came from.
fn check_plan(original: &Topology, plan: &NetPlan, rewritten: &Topology) {
    rewritten
        .validate()
        .expect("the rewritten topology validates");

    // Names: namespaces unique; interfaces unique per namespace and ≤ 15.
    let names: HashSet<&str> = plan.namespaces.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(names.len(), plan.namespaces.len(), "namespace names unique");
    assert_eq!(
        plan.namespaces.len(),
        original.servers.len() + original.fabric_devices.len() + original.clients.len()
    );
    for host in &plan.namespaces {
        assert!(host.name.starts_with(&format!("{}-", plan.prefix)));
        assert!(host.name.len() <= 24, "{}", host.name);
    }
    let mut ifaces = HashSet::new();
    let mut add_iface = |ns: Option<&str>, name: &str| {
        assert!(name.len() <= 15, "interface name {name:?} too long");
        if let Some(ns) = ns {
            assert!(names.contains(ns), "unknown namespace {ns}");
        }
        assert!(
            ifaces.insert((ns.map(str::to_owned), name.to_owned())),
            "interface {name} twice in {ns:?}"
        );
    };
    for bridge in &plan.bridges {
        add_iface(Some(&bridge.ns), &bridge.name);
    }
    for veth in &plan.veths {
        add_iface(veth.ns_a.as_deref(), &veth.name_a);
        add_iface(veth.ns_b.as_deref(), &veth.name_b);
        if veth.ns_a.is_none() {
            assert!(veth.name_a.starts_with(&format!("{}-m", plan.prefix)));
        }
    }

    // Addresses: all unique, all in 10.0.0.0/8.
    let mut addrs = HashSet::new();
    let all = plan.bridges.iter().map(|b| b.addr.clone()).chain(
        plan.veths
            .iter()
            .flat_map(|v| v.addr_a.clone().into_iter().chain(v.addr_b.clone())),
    );
    for cidr in all {
        let addr = ip_of(&cidr);
        assert_eq!(addr.octets()[0], 10, "{cidr}");
        assert!(addrs.insert(addr), "address {addr} planned twice");
    }

    // Servers: each NIC a bridge carrying its listen address; admin over mgmt.
    for (orig, server) in original.servers.iter().zip(&rewritten.servers) {
        let ns = plan
            .namespace_of(HostKind::Server, server.id.as_str())
            .expect("a namespace per server");
        for (orig_nic, nic) in orig.nics.iter().zip(&server.nics) {
            let of = BridgeOf::ServerNic {
                server: server.id.clone(),
                nic: nic.id.clone(),
            };
            assert_listens_on_bridge(plan, &of, ns, &nic.listen, &orig_nic.listen, 7000);
        }
        let id = server.id.as_str();
        let admin = server.admin.as_deref();
        let mgmt = assert_admin_over_mgmt(plan, HostKind::Server, id, admin, 9100);
        assert_eq!(mgmt.ns_a, None);
        assert_eq!(mgmt.ns_b.as_deref(), Some(ns));
        let host = plan
            .host(HostKind::Server, server.id.as_str())
            .expect("a host per server");
        assert_eq!(host.admin.as_deref(), server.admin.as_deref());
    }

    // Devices: a veth per server link, a bridge per port.
    let mut links = 0;
    for (orig, device) in original
        .fabric_devices
        .iter()
        .zip(&rewritten.fabric_devices)
    {
        let ns = plan
            .namespace_of(HostKind::FabricDevice, device.id.as_str())
            .expect("a namespace per device");
        let unique: BTreeSet<_> = device
            .links
            .iter()
            .map(|l| (l.server.clone(), l.nic.clone()))
            .collect();
        links += unique.len();
        for link in &device.links {
            let veth = plan
                .server_link(device.id.as_str(), link.server.as_str(), link.nic.as_str())
                .expect("a veth per server link");
            let of = BridgeOf::ServerNic {
                server: link.server.clone(),
                nic: link.nic.clone(),
            };
            assert_veth_onto_bridge(plan, veth, &of, ns);
        }
        for (orig_port, port) in orig.ports.iter().zip(&device.ports) {
            let of = BridgeOf::DevicePort {
                device: device.id.clone(),
                port: port.id.clone(),
            };
            assert_listens_on_bridge(plan, &of, ns, &port.listen, &orig_port.listen, 7100);
        }
        let (id, admin) = (device.id.as_str(), device.admin.as_deref());
        assert_admin_over_mgmt(plan, HostKind::FabricDevice, id, admin, 9200);
    }

    // Clients: a veth per RNIC onto its port's bridge, local_addr its end.
    let mut rnics = 0;
    for client in &rewritten.clients {
        let ns = plan
            .namespace_of(HostKind::Client, client.id.as_str())
            .expect("a namespace per client");
        for rnic in &client.rnics {
            rnics += 1;
            let veth = plan
                .rnic_link(client.id.as_str(), rnic.id.as_str())
                .expect("a veth per RNIC");
            let device = rewritten
                .fabric_device(&rnic.fabric_device)
                .expect("the RNIC's device");
            let port = rnic.port_on(device).expect("the RNIC's port");
            let of = BridgeOf::DevicePort {
                device: device.id.clone(),
                port: port.id.clone(),
            };
            let end = assert_veth_onto_bridge(plan, veth, &of, ns);
            assert_eq!(rnic.local_addr.as_deref(), Some(end.to_string().as_str()));
        }
    }
    let daemons = original.servers.len() + original.fabric_devices.len();
    assert_eq!(plan.veths.len(), links + rnics + daemons);
    assert_eq!(plan.links().count(), plan.veths.len());

    // Nothing but addresses changed.
    let mut back = rewritten.clone();
    for (b, o) in back.servers.iter_mut().zip(&original.servers) {
        b.admin.clone_from(&o.admin);
        for (bn, on) in b.nics.iter_mut().zip(&o.nics) {
            bn.listen.clone_from(&on.listen);
        }
    }
    for (b, o) in back.fabric_devices.iter_mut().zip(&original.fabric_devices) {
        b.admin.clone_from(&o.admin);
        for (bp, op) in b.ports.iter_mut().zip(&o.ports) {
            bp.listen.clone_from(&op.listen);
        }
    }
    for (b, o) in back.clients.iter_mut().zip(&original.clients) {
        for (br, or) in b.rnics.iter_mut().zip(&o.rnics) {
            br.local_addr.clone_from(&or.local_addr);
        }
    }
    assert_eq!(&back, original);
}

#[test]
fn netns_plan_default() {
    let topology = load("default.toml");
    let (plan, rewritten) = plan(&topology, "pf1234").unwrap();
    check_plan(&topology, &plan, &rewritten);
    assert_eq!(plan.namespace_of(HostKind::Server, "A"), Some("pf1234-s-a"));
    assert_eq!(
        plan.namespace_of(HostKind::FabricDevice, "B"),
        Some("pf1234-f-b")
    );
    assert_eq!(
        plan.namespace_of(HostKind::Client, "c2"),
        Some("pf1234-c-c2")
    );
    assert_eq!(rewritten.servers[1].nics[1].listen, "10.2.1.1:7000");
    assert_eq!(
        rewritten.fabric_devices[1].ports[0].listen,
        "10.101.0.1:7100"
    );
    let link = plan.server_link("B", "A", "n1").unwrap();
    assert_eq!(link.addr_b.as_deref(), Some("10.1.1.11/24"));
    assert_eq!(
        rewritten.clients[1].rnics[1].local_addr.as_deref(),
        Some("10.101.0.11")
    );
    assert_eq!(plan.veths.len(), 8 + 4 + 4);
    assert_eq!(plan.bridges.len(), 4 + 2);
    // Deterministic.
    let (again, rewritten_again) = netns::plan(&topology, "pf1234").unwrap();
    assert_eq!(again, plan);
    assert_eq!(rewritten_again, rewritten);
    println!("{plan}");
}

#[test]
fn netns_plan_on_etcd_gives_each_client_a_management_link_after_the_daemons() {
    let topology = load("default.toml");
    let (plain, _) = plan(&topology, "pf1234").unwrap();
    let (managed, rewritten) =
        netns::plan_managing(&topology, "pf1234", netns::Management::DaemonsAndClients).unwrap();
    assert_eq!(
        managed.veths.len(),
        plain.veths.len() + topology.clients.len()
    );
    assert_eq!(&managed.veths[..plain.veths.len()], &plain.veths[..]);
    let daemons = topology.servers.len() + topology.fabric_devices.len();
    for (c, client) in rewritten.clients.iter().enumerate() {
        let link = managed
            .link(&LinkRef::Mgmt {
                kind: HostKind::Client,
                host: client.id.to_string(),
            })
            .expect("a management link per client");
        assert_eq!(link.name_a, format!("pf1234-m{}", daemons + c));
        assert_eq!(link.ns_a, None, "its root end is in the root namespace");
        assert_eq!(
            link.ns_b.as_deref(),
            managed.namespace_of(HostKind::Client, client.id.as_str())
        );
        assert_eq!(link.name_b, netns::MGMT_IFNAME);
    }
}

#[test]
fn netns_plan_fig4a() {
    let topology = load("fig4a.toml");
    let (plan, rewritten) = plan(&topology, "pfzz").unwrap();
    check_plan(&topology, &plan, &rewritten);
    assert_eq!(plan.namespaces.len(), 6 + 3 + 9);
    assert_eq!(plan.veths.len(), 18 + 27 + 9);
}

#[test]
fn netns_plan_limits_and_errors() {
    let base = load("default.toml");
    assert!(matches!(
        plan(&base, "xx1234"),
        Err(NetnsError::BadPrefix(_))
    ));
    assert!(matches!(
        plan(&base, "pf12345"),
        Err(NetnsError::BadPrefix(_))
    ));

    let with_servers = |n: usize| {
        let mut t = base.clone();
        let template = t.servers[0].clone();
        t.servers = (0..n)
            .map(|i| {
                let mut s = template.clone();
                s.id = format!("S{i}").as_str().into();
                s.admin = None;
                for nic in &mut s.nics {
                    nic.listen = "127.0.0.1:0".to_owned();
                }
                for socket in &mut s.sockets {
                    for device in &mut socket.devices {
                        for region in &mut device.regions {
                            region.id = format!("S{i}.{}", region.id).as_str().into();
                        }
                    }
                }
                s
            })
            .collect();
        for device in &mut t.fabric_devices {
            device.links = t
                .servers
                .iter()
                .flat_map(|s| {
                    s.nics.iter().map(|n| topology::FabricLink {
                        server: s.id.clone(),
                        nic: n.id.clone(),
                    })
                })
                .collect();
        }
        t.validate().expect("generated topology validates");
        t
    };
    let (fits, rewritten) = plan(&with_servers(99), "pf1").expect("99 servers fit");
    check_plan(&with_servers(99), &fits, &rewritten);
    let err = plan(&with_servers(100), "pf1").unwrap_err();
    assert!(matches!(err, NetnsError::TooBig(_)), "{err}");
    assert!(err.to_string().contains("100 servers"), "{err}");

    let with_clients = |n: usize| {
        let mut t = base.clone();
        let template = t.clients[0].clone();
        t.clients = (0..n)
            .map(|i| {
                let mut c = template.clone();
                c.id = format!("c{i}").as_str().into();
                c.rnics.truncate(1);
                c.rnics[0].local_addr = None;
                c
            })
            .collect();
        t
    };
    let (fits, rewritten) = plan(&with_clients(200), "pf1").expect("200 RNICs per port fit");
    check_plan(&with_clients(200), &fits, &rewritten);
    let err = plan(&with_clients(201), "pf1").unwrap_err();
    assert!(matches!(err, NetnsError::TooBig(_)), "{err}");

    let mut broken = base.clone();
    broken.clients[0].rnics[0].fabric_device = "nowhere".into();
    assert!(matches!(plan(&broken, "pf1"), Err(NetnsError::Topology(_))));

    // Ids that sanitize alike still get distinct namespaces.
    let mut alike = base.clone();
    alike.clients[1].id = "C1".into();
    let (p, rewritten) = plan(&alike, "pf1").unwrap();
    check_plan(&alike, &p, &rewritten);
    assert_eq!(p.namespace_of(HostKind::Client, "c1"), Some("pf1-c-c1"));
    assert_eq!(p.namespace_of(HostKind::Client, "C1"), Some("pf1-c-c1-1"));
}

#[test]
fn netns_not_root_message_is_clear() {
    let text = NetnsError::NotRoot.to_string();
    assert!(text.contains("needs root"), "{text}");
    assert!(text.contains("--net loopback"), "{text}");
}

/// A TCP echo server listening inside a namespace; remembers its peers.
struct Echo {
    peers: Arc<Mutex<Vec<SocketAddr>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Echo {
    fn start(ns: &str, addr: SocketAddr) -> Self {
        let listener = in_namespace(ns, || TcpListener::bind(addr))
            .expect("the namespace exists")
            .unwrap_or_else(|e| panic!("bind {addr} in {ns}: {e}"));
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let peers = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (peers, stop) = (peers.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((mut stream, peer)) => {
                            peers.lock().expect("peers lock").push(peer);
                            stream.set_nonblocking(false).expect("blocking stream");
                            stream
                                .set_read_timeout(Some(Duration::from_secs(2)))
                                .expect("read timeout");
                            let mut buf = [0u8; 64];
                            while let Ok(n @ 1..) = stream.read(&mut buf) {
                                if stream.write_all(&buf[..n]).is_err() {
                                    break;
                                }
                            }
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(2)),
                    }
                }
            })
        };
        Self {
            peers,
            stop,
            thread: Some(thread),
        }
    }

    fn last_peer(&self) -> Option<IpAddr> {
        self.peers
            .lock()
            .expect("peers lock")
            .last()
            .map(|p| p.ip())
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("echo thread");
        }
    }
}

/// Connects to `dst` from namespace `ns` (root when `None`), from `local`
/// when given, giving up after a second.
fn connect(ns: Option<&str>, local: Option<&str>, dst: SocketAddr) -> io::Result<TcpStream> {
    let local: Option<IpAddr> = local.map(|l| l.parse().expect("a local IP"));
    let attempt = move || -> io::Result<TcpStream> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            let socket = tokio::net::TcpSocket::new_v4()?;
            if let Some(local) = local {
                socket.bind(SocketAddr::new(local, 0))?;
            }
            let stream = tokio::time::timeout(Duration::from_secs(1), socket.connect(dst))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
            let stream = stream.into_std()?;
            stream.set_nonblocking(false)?;
            Ok(stream)
        })
    };
    match ns {
        Some(ns) => in_namespace(ns, attempt).expect("the namespace exists"),
        None => attempt(),
    }
}

/// Connects and checks that bytes come back.
fn round_trip(ns: Option<&str>, local: Option<&str>, dst: SocketAddr) -> io::Result<()> {
    let mut stream = connect(ns, local, dst)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(b"ping")?;
    let mut buf = [0u8; 4];
    stream.read_exact(&mut buf)?;
    assert_eq!(&buf, b"ping");
    Ok(())
}

/// Round-trips within `within`, retrying (a link that just came up).
fn eventually(ns: Option<&str>, local: Option<&str>, dst: SocketAddr, within: Duration) {
    let start = Instant::now();
    loop {
        match round_trip(ns, local, dst) {
            Ok(()) => return,
            Err(e) if start.elapsed() > within => {
                panic!("{dst} from {ns:?} ({local:?}) still unreachable: {e}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Expects a connection to fail (a dropped SYN ends in `connect`'s own
/// one-second timeout).
fn unreachable(ns: Option<&str>, local: Option<&str>, dst: SocketAddr) {
    let result = connect(ns, local, dst);
    assert!(
        result.is_err(),
        "{dst} reachable from {ns:?} ({local:?}) but should not be"
    );
}

fn namespaces_with(prefix: &str) -> Vec<String> {
    netns::list_namespaces()
        .expect("ip netns list")
        .into_iter()
        .filter(|n| n.starts_with(&format!("{prefix}-")))
        .collect()
}

fn root_links_with(prefix: &str) -> Vec<String> {
    let out = std::process::Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .expect("ip runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|n| n.starts_with(&format!("{prefix}-")))
        .map(str::to_owned)
        .collect()
}

/// Neither a namespace nor a root-namespace link of `prefix` is left.
fn assert_nothing_left(prefix: &str) {
    assert!(
        namespaces_with(prefix).is_empty(),
        "namespaces of {prefix} left"
    );
    assert!(root_links_with(prefix).is_empty(), "links of {prefix} left");
}

fn ns_cmd(ns: &str, args: &[&str]) -> String {
    let out = std::process::Command::new("ip")
        .args(["-n", ns])
        .args(args)
        .output()
        .expect("ip runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn netns_apply_default_connectivity_isolation_and_cut_link() {
    need_root();
    let topology = load("default.toml");
    let prefix = fresh_prefix().unwrap();
    let (plan, t) = plan(&topology, &prefix).unwrap();
    let started = Instant::now();
    let guard = apply(&plan).unwrap();
    let applied = started.elapsed();
    assert_eq!(namespaces_with(&prefix).len(), 6);
    assert_eq!(root_links_with(&prefix).len(), 4);

    let ns = |kind, id| plan.namespace_of(kind, id).unwrap().to_owned();
    let (srv_a, dev_a, dev_b) = (
        ns(HostKind::Server, "A"),
        ns(HostKind::FabricDevice, "A"),
        ns(HostKind::FabricDevice, "B"),
    );
    let (c1, c2) = (ns(HostKind::Client, "c1"), ns(HostKind::Client, "c2"));
    for host in &plan.namespaces {
        let lo = ns_cmd(&host.name, &["-o", "link", "show", "lo"]);
        assert!(lo.contains(",UP"), "lo down in {}: {lo}", host.name);
    }

    // Every device reaches server A's NIC n0 through its own veth.
    let nic = sock(&t.servers[0].nics[0].listen);
    let nic_echo = Echo::start(&srv_a, nic);
    for device in ["A", "B"] {
        let dev_ns = ns(HostKind::FabricDevice, device);
        round_trip(Some(&dev_ns), None, nic).unwrap();
        let end = plan.server_link(device, "A", "n0").unwrap();
        assert_eq!(
            nic_echo.last_peer(),
            Some(IpAddr::V4(ip_of(end.addr_b.as_deref().unwrap()))),
            "device {device} comes from its link's address"
        );
    }
    // Server B's NIC n1 too (another server, another bridge).
    let nic_b1 = sock(&t.servers[1].nics[1].listen);
    let nic_b1_echo = Echo::start(&ns(HostKind::Server, "B"), nic_b1);
    round_trip(Some(&dev_b), None, nic_b1).unwrap();

    // Clients reach their device ports from their RNIC addresses.
    let port_a = sock(&t.fabric_devices[0].ports[0].listen);
    let port_echo = Echo::start(&dev_a, port_a);
    for (client, client_ns) in [(0, &c1), (1, &c2)] {
        let local = t.clients[client].rnics[0].local_addr.clone().unwrap();
        round_trip(Some(client_ns), None, port_a).unwrap();
        assert_eq!(port_echo.last_peer(), Some(local.parse().unwrap()));
        round_trip(Some(client_ns), Some(&local), port_a).unwrap();
    }

    // The root namespace reaches admin addresses; clients reach no server,
    // no admin address and no device they are not wired to.
    let admin = sock(t.servers[0].admin.as_deref().unwrap());
    let admin_echo = Echo::start(&srv_a, admin);
    round_trip(None, None, admin).unwrap();
    unreachable(Some(&c1), None, nic);
    unreachable(Some(&c1), None, nic_b1);
    unreachable(Some(&c1), None, admin);
    let dev_admin = sock(t.fabric_devices[0].admin.as_deref().unwrap());
    unreachable(Some(&c2), None, dev_admin);
    // A device's port is not reachable from another device.
    unreachable(Some(&dev_b), None, port_a);

    // cut-link on a server link: device A loses NIC n0, device B keeps it.
    let link = plan.server_link("A", "A", "n0").unwrap();
    set_link(link, false).unwrap();
    unreachable(Some(&dev_a), None, nic);
    round_trip(Some(&dev_b), None, nic).unwrap();
    set_link(link, true).unwrap();
    eventually(Some(&dev_a), None, nic, Duration::from_secs(3));

    // cut-link on an RNIC: c1 loses device A, c2 keeps it; back after up.
    let rnic = plan.rnic_link("c1", "r0").unwrap();
    let c1_r0 = t.clients[0].rnics[0].local_addr.clone().unwrap();
    set_link(rnic, false).unwrap();
    unreachable(Some(&c1), Some(&c1_r0), port_a);
    unreachable(Some(&c1), None, port_a);
    round_trip(Some(&c2), None, port_a).unwrap();
    set_link(rnic, true).unwrap();
    eventually(Some(&c1), Some(&c1_r0), port_a, Duration::from_secs(3));

    drop((nic_echo, nic_b1_echo, port_echo, admin_echo));
    let started = Instant::now();
    guard.teardown().unwrap();
    let removed = started.elapsed();
    println!("apply of default.toml: {applied:?}; teardown: {removed:?}");
    assert_nothing_left(&prefix);
}

#[test]
fn netns_rnics_on_one_port_stay_separate_wires() {
    need_root();
    // Client c1 with both RNICs on device A's port.
    let mut topology = load("default.toml");
    topology.clients[0].rnics[1].fabric_device = "A".into();
    let prefix = fresh_prefix().unwrap();
    let (plan, t) = plan(&topology, &prefix).unwrap();
    let guard = apply(&plan).unwrap();
    let c1 = plan.namespace_of(HostKind::Client, "c1").unwrap();
    let dev_a = plan.namespace_of(HostKind::FabricDevice, "A").unwrap();
    let r0 = t.clients[0].rnics[0].local_addr.clone().unwrap();
    let r1 = t.clients[0].rnics[1].local_addr.clone().unwrap();
    let arp = in_namespace(c1, || {
        std::fs::read_to_string("/proc/sys/net/ipv4/conf/all/arp_ignore")
    })
    .unwrap()
    .unwrap();
    assert_eq!(arp.trim(), "1");

    let port_a = sock(&t.fabric_devices[0].ports[0].listen);
    let echo = Echo::start(dev_a, port_a);
    round_trip(Some(c1), Some(&r1), port_a).unwrap();
    assert_eq!(echo.last_peer(), Some(r1.parse().unwrap()));
    round_trip(Some(c1), Some(&r0), port_a).unwrap();
    assert_eq!(echo.last_peer(), Some(r0.parse().unwrap()));

    // Cut r0: r1 still works, r0's address does not leak out of r1.
    let link0 = plan.rnic_link("c1", "r0").unwrap();
    set_link(link0, false).unwrap();
    unreachable(Some(c1), Some(&r0), port_a);
    round_trip(Some(c1), Some(&r1), port_a).unwrap();
    set_link(link0, true).unwrap();
    eventually(Some(c1), Some(&r0), port_a, Duration::from_secs(3));

    // And the other way round.
    let link1 = plan.rnic_link("c1", "r1").unwrap();
    set_link(link1, false).unwrap();
    unreachable(Some(c1), Some(&r1), port_a);
    round_trip(Some(c1), Some(&r0), port_a).unwrap();
    assert_eq!(echo.last_peer(), Some(r0.parse().unwrap()));
    set_link(link1, true).unwrap();
    eventually(Some(c1), Some(&r1), port_a, Duration::from_secs(3));

    drop(echo);
    drop(guard);
    assert_nothing_left(&prefix);
}

#[test]
fn netns_leftovers_of_a_crashed_run_are_removed() {
    need_root();
    let topology = load("default.toml");
    let prefix = fresh_prefix().unwrap();
    let (plan, _) = plan(&topology, &prefix).unwrap();
    let guard = apply(&plan).unwrap();
    // A second run with the same names refuses and leaves the first alone.
    let err = apply(&plan).unwrap_err();
    assert!(matches!(err, NetnsError::InUse(_)), "{err}");
    assert!(err.to_string().contains("testbed down"), "{err}");
    assert_eq!(namespaces_with(&prefix).len(), 6);
    std::mem::forget(guard); // the run crashes

    let removed = teardown_leftovers(Some(&prefix)).unwrap();
    assert_eq!(removed, 6 + 4, "6 namespaces and 4 management links");
    assert_nothing_left(&prefix);
    assert_eq!(teardown_leftovers(Some(&prefix)).unwrap(), 0);
}

/// Applies a plan broken by `breaks`, expects the failing command to be
/// named and nothing of the plan to be left.
fn fails_cleanly(breaks: impl FnOnce(&mut NetPlan) -> String) {
    let topology = load("default.toml");
    let prefix = fresh_prefix().expect("a fresh prefix");
    let (mut plan, _) = plan(&topology, &prefix).expect("the plan");
    let culprit = breaks(&mut plan);
    let err = apply(&plan).expect_err("apply fails");
    let NetnsError::Command {
        command, stderr, ..
    } = &err
    else {
        panic!("unexpected error {err}");
    };
    assert!(command.starts_with("ip "), "{err}");
    assert!(command.contains(&culprit), "{err}");
    assert!(!stderr.is_empty(), "{err}");
    assert!(err.to_string().contains(&culprit), "{err}");
    assert!(
        namespaces_with(&prefix).is_empty(),
        "cleaned up after {err}"
    );
    assert!(root_links_with(&prefix).is_empty());
}

#[test]
fn netns_a_failing_command_is_named_and_everything_is_removed() {
    need_root();
    // Fails while creating links in the root namespace.
    fails_cleanly(|plan| {
        plan.bridges[1].name = "a-name-far-too-long-for-linux".to_owned();
        plan.bridges[1].name.clone()
    });
    // Fails while configuring a namespace, after everything was created.
    fails_cleanly(|plan| {
        plan.bridges[3].addr = "10.2.1.1/40".to_owned();
        "addr add 10.2.1.1/40".to_owned()
    });
}

#[test]
fn netns_in_namespace_and_command_in() {
    need_root();
    let err = in_namespace("pf-no-such-namespace", || ()).unwrap_err();
    assert!(matches!(err, NetnsError::Namespace { .. }), "{err}");

    let topology = load("default.toml");
    let prefix = fresh_prefix().unwrap();
    let (plan, t) = plan(&topology, &prefix).unwrap();
    let guard = apply(&plan).unwrap();
    let srv = plan.namespace_of(HostKind::Server, "B").unwrap();
    // A program run with command_in sees the namespace's interfaces.
    let out = netns::command_in(srv, std::path::Path::new("ip"))
        .args(["-o", "-4", "addr", "show"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let nic_ip = sock(&t.servers[1].nics[0].listen).ip().to_string();
    assert!(text.contains(&format!("{nic_ip}/24")), "{text}");
    assert!(text.contains(" mgmt0 "), "{text}");
    // A closure's panic comes back to the caller.
    let panicked = std::panic::catch_unwind(|| {
        let _ = in_namespace(srv, || {
            panic!("deliberate panic inside the namespace (expected)")
        });
    });
    assert!(panicked.is_err());
    drop(guard);
    assert!(namespaces_with(&prefix).is_empty());
}
