//! The running server: region files, listeners on every NIC, the admin
//! endpoint, and an orderly shutdown.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use telemetry::{AdminServer, Health, Registry};
use topology::{Layout, LayoutEntry, NicId, NicTransport, ServerId, Topology};
use tracing::{Span, debug, error, info, warn};

use crate::conn::{self, QueuePairs, Timeouts};
use crate::dedup::{DedupTable, Expect, StoreError, WindowStore};
use crate::devices::{DeviceError, ServerDevices, SysRoots};
use crate::exec::Executor;
use crate::gate::Gatekeeper;
use crate::held::{self, CopyRole};
use crate::identities;
use crate::live::{Limits, LiveConnections, Refusal};
use crate::metrics::ServerMetrics;
use crate::missing::{self, MissingError};
use crate::persist::{PersistMode, PersistPolicy};
use crate::region_file::{OpenMode, RegionFile, RegionFileError};
use crate::served_region::ServedRegion;
use crate::sums_file;

/// Everything a server needs to start.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The (valid) topology.
    pub topology: Topology,
    /// Which server of it this is.
    pub server: ServerId,
    /// Where the region files live.
    pub data_dir: PathBuf,
    /// The admin (metrics/health) address.
    pub admin: SocketAddr,
    /// How writes are made durable.
    pub persistence: PersistPolicy,
    /// Recreate every region file, discarding its data.
    pub format: bool,
    /// Regions to create empty when absent although the data directory
    /// held them (`--create-missing`).
    pub create_missing: Vec<String>,
    /// Start with an empty exactly-once window even if its file is damaged.
    pub reset_exactly_once: bool,
    /// Data connections served at once that proved their key (all of
    /// them without authentication); more are closed.
    pub max_connections: usize,
    /// Data connections at once that have not proven their key yet; a new
    /// one beyond closes the oldest of them.
    pub max_unproven: usize,
    /// How long a connection may stay silent before its first frame, and
    /// between frames after it.
    pub timeouts: Timeouts,
    /// The folder with the principals' keys: every connection must prove
    /// its key before anything is answered. `None`: no authentication.
    pub secrets: Option<PathBuf>,
    /// Serve every NIC with this transport instead of the topology's.
    pub transport: Option<NicTransport>,
}

/// Why the server could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The topology does not name this server.
    #[error("{file}: no server {server:?} in the topology")]
    UnknownServer {
        /// The topology file.
        file: String,
        /// The id asked for.
        server: String,
    },
    /// A key file needed with `--secrets` cannot be used.
    #[error("--secrets")]
    Secrets(#[from] topology::secrets::SecretError),
    /// The layout could not be built.
    #[error("{file}: invalid layout")]
    Layout {
        /// The topology file.
        file: String,
        /// Why.
        #[source]
        source: topology::LayoutError,
    },
    /// The data directory cannot be created.
    #[error("{path}: cannot create the data directory")]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A PMEM device of the topology cannot be used.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A region file cannot be used.
    #[error(transparent)]
    Region(#[from] RegionFileError),
    /// Regions the data directory held are missing.
    #[error(transparent)]
    Missing(#[from] MissingError),
    /// The exactly-once window file cannot be used.
    #[error(transparent)]
    Window(#[from] StoreError),
    /// Exactly-once atomics a crash interrupted cannot be settled.
    #[error(transparent)]
    Recovery(#[from] crate::exec::RecoveryError),
    /// A NIC's listen address cannot be bound.
    #[error("NIC {nic}: cannot listen on {addr}")]
    Bind {
        /// The NIC.
        nic: NicId,
        /// The address.
        addr: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The admin endpoint cannot start.
    #[error("cannot start the admin endpoint")]
    Admin(#[from] telemetry::AdminError),
    /// Metrics cannot be registered.
    #[error("cannot register metrics")]
    Metrics(#[from] telemetry::RegistryError),
    /// A thread cannot be started.
    #[error("cannot start a thread")]
    Spawn(#[source] io::Error),
    /// A `verbs` NIC cannot serve over RDMA.
    #[cfg(feature = "verbs")]
    #[error(transparent)]
    Verbs(#[from] Box<crate::verbs::VerbsNicError>),
    /// A NIC asks for verbs in a build without them.
    #[error(
        "NIC {nic}: transport \"verbs\" needs a pmem-server built with the `verbs` feature \
         (cargo build -p pmem-server --features verbs)"
    )]
    VerbsDisabled {
        /// The NIC.
        nic: NicId,
    },
    /// Flushing the regions at shutdown failed.
    #[error("cannot make the regions durable at shutdown")]
    Persist(#[source] crate::persist::PersistError),
}

/// A started server. Dropping it without [`RunningServer::stop`] leaves its
/// threads running until the process exits.
#[derive(Debug)]
pub struct RunningServer {
    exec: Arc<Executor>,
    shutdown: Arc<AtomicBool>,
    live: Arc<LiveConnections>,
    acceptors: Vec<(JoinHandle<()>, Arc<mio::Waker>)>,
    admin: AdminServer,
    data_addrs: Vec<(NicId, SocketAddr)>,
    mode: Option<PersistMode>,
    /// Where the block checksums are saved at a clean stop.
    data_dir: PathBuf,
}

const LISTENER: mio::Token = mio::Token(0);
const WAKER: mio::Token = mio::Token(1);

/// One NIC's acceptor: its listener and the waker that ends it.
struct Acceptor {
    poll: mio::Poll,
    listener: mio::net::TcpListener,
}

impl Acceptor {
    fn new(listener: TcpListener) -> io::Result<(Acceptor, Arc<mio::Waker>)> {
        listener.set_nonblocking(true)?;
        let mut listener = mio::net::TcpListener::from_std(listener);
        let poll = mio::Poll::new()?;
        poll.registry()
            .register(&mut listener, LISTENER, mio::Interest::READABLE)?;
        let waker = Arc::new(mio::Waker::new(poll.registry(), WAKER)?);
        Ok((Acceptor { poll, listener }, waker))
    }
}

/// What a NIC's accept loop hands each connection.
#[derive(Clone)]
struct NicService {
    exec: Arc<Executor>,
    shutdown: Arc<AtomicBool>,
    live: Arc<LiveConnections>,
    limits: Limits,
    timeouts: Timeouts,
    /// Queue pair set-up, on a `verbs` NIC.
    qps: Option<Arc<dyn QueuePairs>>,
}

/// Accepts connections on one NIC until shutdown (its waker), one thread
/// per connection.
fn accept_loop(mut acceptor: Acceptor, service: NicService) {
    let NicService {
        exec,
        shutdown,
        live,
        limits,
        ..
    } = &service;
    // Without authentication there is nothing to prove.
    let proven = exec.new_session().admits();
    let mut events = mio::Events::with_capacity(8);
    while !shutdown.load(Ordering::Relaxed) {
        if let Err(e) = acceptor.poll.poll(&mut events, None) {
            if e.kind() != io::ErrorKind::Interrupted {
                error!("polling the listener failed, no more connections on it: {e}");
                return;
            }
            continue;
        }
        loop {
            let (stream, peer) = match acceptor.listener.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // E.g. out of descriptors: the next readiness retries.
                    warn!("accept failed: {e}");
                    break;
                }
            };
            let stream = TcpStream::from(OwnedFd::from(stream));
            if let Err(e) = stream.set_nonblocking(false) {
                debug!("dropped connection from {peer}: {e}");
                continue;
            }
            match live.try_add(*limits, &stream, proven) {
                Ok(admitted) => {
                    if admitted.evicted_oldest {
                        exec.metrics()
                            .connections_closed
                            .with(&["unproven_evicted"])
                            .inc();
                    }
                    spawn_connection(stream, admitted.id, &service);
                }
                Err(Refusal::Full) => {
                    debug!("refused connection from {peer}: {limits:?} connections open");
                    exec.metrics().connections_refused.inc();
                }
                Err(Refusal::Closing) => {}
                Err(Refusal::Io(e)) => debug!("dropped connection from {peer}: {e}"),
            }
        }
    }
}

fn spawn_connection(stream: TcpStream, id: u64, service: &NicService) {
    let metrics = Arc::clone(service.exec.metrics());
    metrics.connections_total.inc();
    metrics.connections.inc();
    let live = &service.live;
    let NicService {
        exec,
        shutdown,
        live: live_for_thread,
        timeouts,
        qps,
        limits,
    } = service.clone();
    let span = Span::current();
    let spawned = thread::Builder::new()
        .name("pmem-conn".into())
        .spawn(move || {
            let _span = span.entered();
            let peer = stream
                .peer_addr()
                .map_or_else(|_| "?".to_owned(), |p| p.to_string());
            debug!("connection from {peer} opened");
            let promote = || live_for_thread.promote(id, limits.proven);
            match conn::serve(stream, &exec, &shutdown, timeouts, qps.as_deref(), &promote) {
                conn::ConnectionEnd::Malformed(e) => {
                    debug!("closed connection from {peer}: {e}");
                    exec.metrics()
                        .connections_closed
                        .with(&["unframeable"])
                        .inc();
                }
                conn::ConnectionEnd::Io(e) => debug!("connection from {peer} failed: {e}"),
                conn::ConnectionEnd::Refused => {
                    debug!("refused connection from {peer}: no proof of its key");
                }
                conn::ConnectionEnd::NotAdmitted => {
                    debug!(
                        "closed connection from {peer}: proven, but {} proven connections are \
                         open or it was evicted meanwhile",
                        limits.proven
                    );
                    exec.metrics().connections_refused.inc();
                }
                conn::ConnectionEnd::PeerClosed | conn::ConnectionEnd::Shutdown => {
                    debug!("connection from {peer} closed");
                }
                conn::ConnectionEnd::Silent(reason) => {
                    debug!("closed connection from {peer}: {reason}");
                    exec.metrics().connections_closed.with(&[reason]).inc();
                }
            }
            exec.metrics().connections.dec();
            live_for_thread.remove(id);
        });
    if let Err(e) = spawned {
        error!("cannot start a connection thread: {e}");
        metrics.connections.dec();
        live.remove(id);
    }
}

/// A server's state opened from its data directory, ready to execute: the
/// regions mapped, the exactly-once window loaded and any atomic a crash
/// interrupted completed.
#[derive(Debug)]
pub struct OpenedServer {
    /// The executor over the regions.
    pub exec: Executor,
    /// The metrics it records into.
    pub registry: Arc<Registry>,
    /// The persistence mode of the first region, which the ready line gives
    /// (`None` when the server has no regions; `/metrics` lists every mode).
    pub mode: Option<PersistMode>,
    /// Where the server's PMEM devices are, with their NUMA nodes.
    pub devices: ServerDevices,
}

impl OpenedServer {
    /// Opens (or creates) every region file of `config`'s server and its
    /// exactly-once window, without listening anywhere.
    pub fn open(config: &ServerConfig) -> Result<Self, ServerError> {
        let topology = &config.topology;
        let server = topology
            .server(&config.server)
            .ok_or_else(|| ServerError::UnknownServer {
                file: topology.source.clone(),
                server: config.server.to_string(),
            })?;
        let layout = Layout::new(topology).map_err(|source| ServerError::Layout {
            file: topology.source.clone(),
            source,
        })?;
        std::fs::create_dir_all(&config.data_dir).map_err(|source| ServerError::DataDir {
            path: config.data_dir.clone(),
            source,
        })?;

        // Its own regions and the backup copies it holds.
        let held = held::held_by(topology, &layout, &server.id);
        // Where each PMEM device keeps its regions, and its NUMA node.
        let devices = ServerDevices::resolve_holding(
            server,
            &held::backups_on(&held),
            &config.data_dir,
            &SysRoots::host(),
        )?;
        for line in devices.describe() {
            info!("{line}");
        }
        for warning in devices.warnings() {
            warn!("{warning}");
        }
        let entries: Vec<&LayoutEntry> = held.iter().map(|h| &h.entry).collect();
        let modes = missing::open_modes(
            &server.id,
            &devices,
            &entries,
            &config.persistence,
            config.format,
            &config.create_missing,
        )?;
        let mut regions = Vec::new();
        for ((entry, mode), copy) in entries.into_iter().zip(modes).zip(&held) {
            let mut file = RegionFile::open_with(&devices, entry, &config.persistence, mode)?;
            log_opened(&file, mode);
            if copy.role == CopyRole::Backup {
                info!(
                    "region {}: holding a backup copy at {} (socket {}, device {})",
                    entry.region_id,
                    file.path.display(),
                    entry.socket,
                    entry.device
                );
            }
            let sums_at = sums_file::sums_path(&config.data_dir, entry.region_id.as_str());
            match sums_file::load(&sums_at, &file) {
                Ok(Some(sums)) => {
                    info!(
                        "region {}: block checksums of the last clean stop loaded from {}",
                        entry.region_id,
                        sums_at.display()
                    );
                    file.sums = sums;
                }
                Ok(None) => {}
                Err(e) => warn!("{}", telemetry::logging::error_chain(&e)),
            }
            // RDMA writes on a verbs NIC bypass the marks scrubs rely on.
            let rdma = server.nics.iter().any(|n| {
                n.socket == entry.socket
                    && config.transport.unwrap_or(n.transport) == NicTransport::Verbs
            });
            if rdma {
                file.sums.set_unwatched();
            }
            regions.push(ServedRegion::new(entry.clone(), file).with_role(copy.role));
        }
        let mode = regions.first().map(|r| r.file.map.mode());

        let registry = Arc::new(Registry::new());
        telemetry::register_process_metrics(&registry)?;
        let metrics = Arc::new(ServerMetrics::new(Arc::clone(&registry))?);
        register_region_metrics(&registry, &regions)?;
        // One window per lane a client can use: lane 0, and one per RNIC;
        // with room for identities later maps add.
        let lanes = identities::lanes_of(topology);
        let slots = identities::window_slots(&lanes);
        // Regions kept from an earlier start kept their window beside them:
        // if it is gone, retried atomics could apply twice.
        let expect = if config.format || config.reset_exactly_once {
            Expect::Reset
        } else if regions.iter().any(|r| !r.file.created) {
            Expect::Existing
        } else {
            Expect::New
        };
        let (store, loaded) =
            WindowStore::open(&config.data_dir, &config.persistence, expect, slots)?;
        let dedup = DedupTable::with_store(store, loaded.windows).bounded_by(lanes);
        let gate = match &config.secrets {
            Some(dir) => Some((dir, Gatekeeper::load(dir, topology, &layout)?)),
            None => None,
        };
        let mut exec = Executor::new(server.id.clone(), layout, regions, dedup, metrics);
        exec.owners_by_turn(&topology.default_owners());
        if !loaded.unfinished.is_empty() {
            let recovery = exec.recover_exactly_once(&loaded.unfinished)?;
            info!(
                "recovered {} exactly-once atomics a crash interrupted: {} had changed their \
                 word and are recorded as applied, {} had not and will be applied by their retry",
                loaded.unfinished.len(),
                recovery.applied,
                recovery.not_applied
            );
        }
        if let Some((dir, gate)) = gate {
            info!(
                "authentication on: every connection proves one of {} principals' keys from {}",
                gate.len(),
                dir.display()
            );
            exec = exec.with_gate(gate);
        }
        Ok(Self {
            exec,
            registry,
            mode,
            devices,
        })
    }
}

impl RunningServer {
    /// Opens (or creates) every region of the server, binds every NIC and the
    /// admin address, and starts serving.
    pub fn start(config: ServerConfig) -> Result<Self, ServerError> {
        let OpenedServer {
            exec,
            registry,
            mode,
            devices,
        } = OpenedServer::open(&config)?;
        let exec = Arc::new(exec);
        let server =
            config
                .topology
                .server(&config.server)
                .ok_or_else(|| ServerError::UnknownServer {
                    file: config.topology.source.clone(),
                    server: config.server.to_string(),
                })?;

        let mut qps: HashMap<NicId, Arc<dyn QueuePairs>> = HashMap::new();
        let mut rdma_modes = Vec::new();
        for nic in &server.nics {
            if config.transport.unwrap_or(nic.transport) == NicTransport::Verbs {
                let node = devices.socket_node(&nic.socket);
                let (service, mode) = open_verbs_nic(nic, &exec, node)?;
                rdma_modes.push((vec![nic.id.to_string(), mode.to_owned()], 1.0));
                qps.insert(nic.id.clone(), service);
            }
        }
        registry.register_fn_gauge(
            "pmem_server_rdma_persistence",
            "How RDMA writes to a verbs NIC's regions are made durable (1 for the mode in use): \
             flush (IBTA FLUSH, persistence placement) or apm (READ after WRITE).",
            &["nic", "mode"],
            Box::new(move || rdma_modes.clone()),
        )?;

        // Each NIC's threads run on the NUMA node of its socket's PMEM.
        let mut cpus_of: HashMap<NicId, Vec<usize>> = HashMap::new();
        for nic in &server.nics {
            let Some(node) = devices.socket_node(&nic.socket) else {
                info!(
                    "NIC {} of socket {}: NUMA node of its PMEM unknown, threads not pinned",
                    nic.id, nic.socket
                );
                continue;
            };
            match crate::numa::node_cpus(Path::new("/sys"), node) {
                Some(cpus) => {
                    info!(
                        "NIC {} of socket {}: its threads run on NUMA node {node} (CPUs {cpus:?})",
                        nic.id, nic.socket
                    );
                    cpus_of.insert(nic.id.clone(), cpus);
                }
                None => warn!(
                    "NIC {} of socket {}: NUMA node {node} has no CPUs listed, threads not pinned",
                    nic.id, nic.socket
                ),
            }
        }

        let mut listeners = Vec::new();
        for nic in &server.nics {
            let bind_err = |source| ServerError::Bind {
                nic: nic.id.clone(),
                addr: nic.listen.clone(),
                source,
            };
            let listener = TcpListener::bind(nic.listen.as_str()).map_err(bind_err)?;
            let local = listener.local_addr().map_err(bind_err)?;
            listeners.push((nic.id.clone(), listener, local));
        }

        let shutdown = Arc::new(AtomicBool::new(false));
        let health: telemetry::HealthCheck = {
            let shutdown = Arc::clone(&shutdown);
            Arc::new(move || {
                if shutdown.load(Ordering::Relaxed) {
                    Health::Unhealthy("shutting down".into())
                } else {
                    Health::Healthy
                }
            })
        };
        let admin = AdminServer::start(config.admin, registry, health)?;

        let live = Arc::new(LiveConnections::default());
        let mut acceptors = Vec::new();
        let mut data_addrs = Vec::new();
        for (nic, listener, local) in listeners {
            let (acceptor, waker) =
                Acceptor::new(listener).map_err(|source| ServerError::Bind {
                    nic: nic.clone(),
                    addr: local.to_string(),
                    source,
                })?;
            let service = NicService {
                exec: Arc::clone(&exec),
                shutdown: Arc::clone(&shutdown),
                live: Arc::clone(&live),
                limits: Limits {
                    proven: config.max_connections,
                    unproven: config.max_unproven,
                },
                timeouts: config.timeouts,
                qps: qps.get(&nic).cloned(),
            };
            let span = Span::current();
            let cpus = cpus_of.remove(&nic);
            let handle = thread::Builder::new()
                .name(format!("accept-{nic}"))
                .spawn(move || {
                    // Connection threads inherit the accept thread's CPUs.
                    if let Some(cpus) = cpus
                        && let Err(e) = crate::numa::pin_current_thread(&cpus)
                    {
                        warn!("cannot pin the threads of a NIC to CPUs {cpus:?}: {e}");
                    }
                    span.in_scope(|| accept_loop(acceptor, service))
                })
                .map_err(ServerError::Spawn)?;
            acceptors.push((handle, waker));
            data_addrs.push((nic, local));
        }
        Ok(Self {
            exec,
            shutdown,
            live,
            acceptors,
            admin,
            data_addrs,
            mode,
            data_dir: config.data_dir.clone(),
        })
    }

    /// The bound data address of every NIC.
    pub fn data_addrs(&self) -> &[(NicId, SocketAddr)] {
        &self.data_addrs
    }

    /// The bound admin address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin.local_addr()
    }

    /// The persistence mode of the first region, which the ready line gives
    /// (`None` when the server has no regions; `/metrics` lists every mode).
    pub fn mode(&self) -> Option<PersistMode> {
        self.mode
    }

    /// The executor, for in-process use.
    pub fn executor(&self) -> &Arc<Executor> {
        &self.exec
    }

    /// Stops accepting, lets every connection finish the requests it has
    /// received, makes every region durable, saves the block checksums
    /// scrubs recorded, and stops the admin endpoint.
    pub fn stop(self) -> Result<(), ServerError> {
        self.shutdown.store(true, Ordering::SeqCst);
        for (handle, waker) in self.acceptors {
            if let Err(e) = waker.wake() {
                warn!("cannot wake an acceptor: {e}");
            }
            let _ = handle.join();
        }
        self.live.close_reads();
        let idle = self.live.wait_idle(Duration::from_secs(10));
        if !idle {
            warn!(
                "connections still open after 10 s; flushing anyway, block checksums not saved \
                 (the next scrub records them again)"
            );
        }
        let persisted = self.exec.persist_all().map_err(ServerError::Persist);
        // Nothing writes any more: the checksums can be kept for the next
        // start (a failure only costs re-recording them).
        for region in self.exec.regions().filter(|_| idle) {
            let at = sums_file::sums_path(&self.data_dir, region.entry.region_id.as_str());
            if let Err(e) = sums_file::save(&at, &region.file) {
                warn!("{}", telemetry::logging::error_chain(&e));
            }
        }
        self.admin.shutdown();
        persisted
    }
}

/// Says in the log what opening a region did when it did more than reopen it.
fn log_opened(file: &RegionFile, mode: OpenMode) {
    let region = &file.header.region_id;
    let at = file.path.display();
    match (file.created, mode) {
        (true, OpenMode::Format) => info!("region {region}: formatted empty at {at}, new key"),
        (true, OpenMode::CreateMissing) => {
            warn!("region {region}: created empty at {at} (--create-missing), new key")
        }
        (true, OpenMode::Keep) => info!("region {region}: created empty at {at}, new key"),
        (false, OpenMode::CreateMissing) => warn!(
            "region {region}: --create-missing ignored, the region is present at {at} and \
             keeps its data"
        ),
        (false, _) => {}
    }
}

/// Registers the regions of `nic`'s socket with its RNIC; returns the
/// queue pair service and how RDMA writes are made durable there.
#[cfg(feature = "verbs")]
fn open_verbs_nic(
    nic: &topology::ServerNic,
    exec: &Executor,
    node: Option<u32>,
) -> Result<(Arc<dyn QueuePairs>, &'static str), ServerError> {
    let regions: Vec<&ServedRegion> = exec
        .regions()
        .filter(|r| r.entry.socket == nic.socket)
        .collect();
    let verbs = crate::verbs::VerbsNic::open(nic, &regions, node)?;
    let mode = verbs.persistence().as_str();
    Ok((Arc::new(verbs), mode))
}

/// Without the `verbs` feature a verbs NIC cannot start.
#[cfg(not(feature = "verbs"))]
fn open_verbs_nic(
    nic: &topology::ServerNic,
    _exec: &Executor,
    _node: Option<u32>,
) -> Result<(Arc<dyn QueuePairs>, &'static str), ServerError> {
    Err(ServerError::VerbsDisabled {
        nic: nic.id.clone(),
    })
}

/// Scrape-time gauges: the persistence modes in use, and each region's
/// size and generation.
fn register_region_metrics(
    registry: &Registry,
    regions: &[ServedRegion],
) -> Result<(), telemetry::RegistryError> {
    // Regions on different devices may differ (fsdax on one socket, device
    // DAX on another): every mode in use is 1.
    let modes: std::collections::BTreeSet<&'static str> =
        regions.iter().map(|r| r.file.map.mode().as_str()).collect();
    registry.register_fn_gauge(
        "pmem_server_persistence_mode",
        "The persistence mechanisms in use (1 for each mode some region uses).",
        &["mode"],
        Box::new(move || modes.iter().map(|m| (vec![(*m).to_owned()], 1.0)).collect()),
    )?;
    let sizes: Vec<(Vec<String>, f64)> = regions
        .iter()
        .map(|r| {
            (
                vec![r.entry.region_id.to_string()],
                r.file.data_len() as f64,
            )
        })
        .collect();
    registry.register_fn_gauge(
        "pmem_server_region_size_bytes",
        "Bytes of PMEM exported by each region.",
        &["region"],
        Box::new(move || sizes.clone()),
    )?;
    let generations: Vec<(Vec<String>, f64)> = regions
        .iter()
        .map(|r| {
            (
                vec![r.entry.region_id.to_string()],
                r.file.header.generation as f64,
            )
        })
        .collect();
    registry.register_fn_gauge(
        "pmem_server_region_generation",
        "How many times each region file has been opened by a server.",
        &["region"],
        Box::new(move || generations.clone()),
    )
}
