//! The running server: region files, listeners on every NIC, the admin
//! endpoint, and an orderly shutdown.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use telemetry::{AdminServer, Health, Registry};
use topology::{Layout, NicId, ServerId, Topology};
use tracing::{Span, debug, error, info, warn};

use crate::conn::{self, SHUTDOWN_POLL};
use crate::dedup::DedupTable;
use crate::dedup_store::{StoreError, WindowStore};
use crate::exec::{Executor, ServedRegion};
use crate::gate::Gatekeeper;
use crate::metrics::ServerMetrics;
use crate::persist::{PersistMode, PersistPolicy};
use crate::region_file::{RegionFile, RegionFileError};

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
    /// Start with an empty exactly-once window even if its file is damaged.
    pub reset_exactly_once: bool,
    /// Data connections served at once; more are closed on accept.
    pub max_connections: usize,
    /// The folder with the principals' keys: every connection must prove
    /// its key before anything is answered. `None`: no authentication.
    pub secrets: Option<PathBuf>,
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
    /// A region file cannot be used.
    #[error(transparent)]
    Region(#[from] RegionFileError),
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
    /// Flushing the regions at shutdown failed.
    #[error("cannot make the regions durable at shutdown")]
    Persist(#[source] crate::persist::PersistError),
}

/// Counts live connection threads so shutdown can wait for them.
#[derive(Debug, Default)]
struct LiveConnections {
    count: Mutex<usize>,
    gone: Condvar,
}

impl LiveConnections {
    /// Registers a connection if fewer than `max` are live.
    fn try_add(&self, max: usize) -> bool {
        let mut count = self.count.lock().unwrap_or_else(PoisonError::into_inner);
        if *count >= max {
            return false;
        }
        *count += 1;
        true
    }

    fn remove(&self) {
        let mut count = self.count.lock().unwrap_or_else(PoisonError::into_inner);
        *count = count.saturating_sub(1);
        self.gone.notify_all();
    }

    /// Waits until no connection is live, or `limit` passes.
    fn wait_idle(&self, limit: Duration) -> bool {
        let count = self.count.lock().unwrap_or_else(PoisonError::into_inner);
        let (count, _) = self
            .gone
            .wait_timeout_while(count, limit, |c| *c > 0)
            .unwrap_or_else(PoisonError::into_inner);
        *count == 0
    }
}

/// A started server. Dropping it without [`RunningServer::stop`] leaves its
/// threads running until the process exits.
#[derive(Debug)]
pub struct RunningServer {
    exec: Arc<Executor>,
    shutdown: Arc<AtomicBool>,
    live: Arc<LiveConnections>,
    acceptors: Vec<JoinHandle<()>>,
    admin: AdminServer,
    data_addrs: Vec<(NicId, SocketAddr)>,
    mode: Option<PersistMode>,
}

/// Waits up to `timeout` for `listener` to have a connection to accept.
fn wait_acceptable(listener: &TcpListener, timeout: Duration) -> io::Result<bool> {
    let mut fd = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let millis = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `fd` is one valid, initialised pollfd that outlives the call,
    // and the count passed is 1.
    let ready = unsafe { libc::poll(&mut fd, 1, millis) };
    match ready {
        -1 => {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(err)
            }
        }
        0 => Ok(false),
        _ => Ok(true),
    }
}

/// Accepts connections on one NIC until shutdown, one thread per connection.
fn accept_loop(
    listener: TcpListener,
    exec: Arc<Executor>,
    shutdown: Arc<AtomicBool>,
    live: Arc<LiveConnections>,
    max_connections: usize,
) {
    while !shutdown.load(Ordering::Relaxed) {
        match wait_acceptable(&listener, SHUTDOWN_POLL) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                warn!("poll on listener failed: {e}");
                thread::sleep(SHUTDOWN_POLL);
                continue;
            }
        }
        let (stream, peer) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(e) => {
                if e.kind() != io::ErrorKind::WouldBlock {
                    warn!("accept failed: {e}");
                }
                continue;
            }
        };
        if !live.try_add(max_connections) {
            debug!("refused connection from {peer}: {max_connections} connections open");
            exec.metrics().connections_refused.inc();
            drop(stream);
            continue;
        }
        spawn_connection(stream, &exec, &shutdown, &live);
    }
}

fn spawn_connection(
    stream: TcpStream,
    exec: &Arc<Executor>,
    shutdown: &Arc<AtomicBool>,
    live: &Arc<LiveConnections>,
) {
    let metrics = Arc::clone(exec.metrics());
    metrics.connections_total.inc();
    metrics.connections.inc();
    let (exec, shutdown, live_for_thread) =
        (Arc::clone(exec), Arc::clone(shutdown), Arc::clone(live));
    let span = Span::current();
    let spawned = thread::Builder::new()
        .name("pmem-conn".into())
        .spawn(move || {
            let _span = span.entered();
            let peer = stream
                .peer_addr()
                .map_or_else(|_| "?".to_owned(), |p| p.to_string());
            debug!("connection from {peer} opened");
            match conn::serve(stream, &exec, &shutdown) {
                conn::ConnectionEnd::Malformed(e) => {
                    debug!("closed connection from {peer}: {e}");
                }
                conn::ConnectionEnd::Io(e) => debug!("connection from {peer} failed: {e}"),
                conn::ConnectionEnd::Refused => {
                    debug!("refused connection from {peer}: no proof of its key");
                }
                conn::ConnectionEnd::PeerClosed | conn::ConnectionEnd::Shutdown => {
                    debug!("connection from {peer} closed");
                }
            }
            exec.metrics().connections.dec();
            live_for_thread.remove();
        });
    if let Err(e) = spawned {
        error!("cannot start a connection thread: {e}");
        metrics.connections.dec();
        live.remove();
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
    /// The persistence mode in use (`None` when the server has no regions).
    pub mode: Option<PersistMode>,
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

        let mut regions = Vec::new();
        for entry in layout.entries().iter().filter(|e| e.server == server.id) {
            let file =
                RegionFile::open(&config.data_dir, entry, &config.persistence, config.format)?;
            regions.push(ServedRegion {
                entry: entry.clone(),
                file,
            });
        }
        let mode = regions.first().map(|r| r.file.map.mode());

        let registry = Arc::new(Registry::new());
        let metrics = Arc::new(ServerMetrics::new(Arc::clone(&registry))?);
        register_region_metrics(&registry, &regions, mode)?;
        // One window per lane a client can use: lane 0, and one per RNIC.
        let lanes: Vec<u8> = topology
            .clients
            .iter()
            .map(|c| u8::try_from(c.rnics.len()).unwrap_or(u8::MAX))
            .collect();
        let identities = lanes.iter().map(|&l| usize::from(l) + 1).sum();
        let (store, loaded) = WindowStore::open(
            &config.data_dir,
            &config.persistence,
            config.format || config.reset_exactly_once,
            identities,
        )?;
        let dedup = DedupTable::with_store(store, loaded.windows).bounded_by(lanes);
        let gate = match &config.secrets {
            Some(dir) => Some((dir, Gatekeeper::load(dir, topology, &layout)?)),
            None => None,
        };
        let mut exec = Executor::new(server.id.clone(), layout, regions, dedup, metrics);
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
            let (exec, shutdown, live) =
                (Arc::clone(&exec), Arc::clone(&shutdown), Arc::clone(&live));
            let max = config.max_connections;
            let span = Span::current();
            let handle = thread::Builder::new()
                .name(format!("accept-{nic}"))
                .spawn(move || span.in_scope(|| accept_loop(listener, exec, shutdown, live, max)))
                .map_err(ServerError::Spawn)?;
            acceptors.push(handle);
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

    /// The persistence mode in use (`None` when the server has no regions).
    pub fn mode(&self) -> Option<PersistMode> {
        self.mode
    }

    /// The executor, for in-process use.
    pub fn executor(&self) -> &Arc<Executor> {
        &self.exec
    }

    /// Stops accepting, lets every connection finish the requests it has
    /// received, makes every region durable and stops the admin endpoint.
    pub fn stop(self) -> Result<(), ServerError> {
        self.shutdown.store(true, Ordering::SeqCst);
        for handle in self.acceptors {
            let _ = handle.join();
        }
        if !self.live.wait_idle(Duration::from_secs(10)) {
            warn!("connections still open after 10 s; flushing anyway");
        }
        let persisted = self.exec.persist_all().map_err(ServerError::Persist);
        self.admin.shutdown();
        persisted
    }
}

/// Scrape-time gauges: the persistence mode, and each region's size and
/// generation.
fn register_region_metrics(
    registry: &Registry,
    regions: &[ServedRegion],
    mode: Option<PersistMode>,
) -> Result<(), telemetry::RegistryError> {
    registry.register_fn_gauge(
        "pmem_server_persistence_mode",
        "The persistence mechanism in use (1 for the active mode).",
        &["mode"],
        Box::new(move || {
            mode.map(|m| (vec![m.as_str().to_owned()], 1.0))
                .into_iter()
                .collect()
        }),
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
