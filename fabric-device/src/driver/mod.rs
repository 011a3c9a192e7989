//! The event loop around the forwarding core: client ports, server links
//! with reconnect and backoff, the admin endpoint, signals.
//!
//! One thread owns every socket and the [`Forwarder`]; mio tells it which
//! sockets are ready. Each turn it reads what is there, lets the core decide,
//! queues or writes the results, answers timeouts, reconnects links whose
//! backoff has passed and flushes what is queued.

mod admission;
mod endpoint;
pub mod backend;
mod packet;
mod roce_port;

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::event::Event;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use proto::FrameDecoder;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook_mio::v1_0::Signals;
use telemetry::{AdminServer, Health, Registry};
use topology::{FabricDeviceId, PortId, Topology};
use tracing::{debug, info, warn};

use crate::forward::{ClientAction, ConnId, Forwarder, ForwarderConfig, LinkAction, LinkId, Reply};
use crate::idmap::IdMap;
use crate::map::{DeviceMap, MapError};
use crate::metrics::DeviceMetrics;
use crate::reconnect::{Backoff, Reconnects};
use crate::roce_metrics::RoceMetrics;
use crate::uplink::{QP_CONNECT_TAG, Uplinks};
use admission::{Admission, Verdict};
use endpoint::{Endpoint, Fill};
use backend::uring::{self, Completion, Op};
use backend::{Backend, IoConfig, Selected};
use roce_port::RoceEndpoint;
pub use roce_port::RocePortError;

const SIGNALS: Token = Token(usize::MAX - 1);
/// The map watcher has a new map waiting.
const MAP_WAKE: Token = Token(usize::MAX - 2);
/// Port `i`'s RoCEv2 packet socket is `Token(ROCE_BASE + i)`.
const ROCE_BASE: usize = 1 << 19;
/// How often RoCE counters are published for `/metrics`.
const ROCE_PUBLISH: Duration = Duration::from_millis(100);
const CLIENT_BASE: usize = 1 << 20;
const LINK_BASE: usize = 1 << 40;
/// How often the region keys of links to servers on verbs are asked for
/// again: a rotated key stops opening RDMA within this long.
const VERBS_KEY_POLL: Duration = Duration::from_secs(1);
/// Longest a poll waits, so housekeeping runs even when nothing happens.
const MAX_POLL_WAIT: Duration = Duration::from_millis(250);
/// A connect that has not completed after this long is a failed one.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Stop reading requests from a client whose replies pile up beyond this.
const CLIENT_OUT_HIGH_WATER: usize = 8 << 20;
/// Client connections closing are logged at most this often.
const CLOSED_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Largest frame body taken from a client connection before its client is
/// known (HELLO, the proof and MAP_REQUEST are far smaller): a peer that
/// has not said who it is cannot make the device hold large frames.
const PRE_SESSION_MAX_BODY: u32 = 4096;
/// A client whose request leaves more than this queued for a link (bytes
/// the server has not taken yet) stops being read until the link is down
/// to [`LINK_OUT_LOW_WATER`]: a link holds at most this plus one request
/// per client, and clients take turns as it drains.
const LINK_OUT_HIGH_WATER: usize = 8 << 20;
const LINK_OUT_LOW_WATER: usize = 2 << 20;

/// Everything a fabric device needs to start.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// The (valid) topology.
    pub topology: Topology,
    /// Where it was read from, re-read on SIGHUP.
    pub topology_path: Option<PathBuf>,
    /// Which fabric device this is.
    pub device: FabricDeviceId,
    /// The admin (metrics/health) address.
    pub admin: SocketAddr,
    /// Timeouts and backpressure of the core.
    pub forwarder: ForwarderConfig,
    /// First reconnect delay of a failed link; doubles up to `reconnect_max`.
    pub reconnect_min: Duration,
    /// Longest reconnect delay.
    pub reconnect_max: Duration,
    /// Client connections served at once that proved their key (all of
    /// them without authentication); more are closed.
    pub max_clients: usize,
    /// Client connections at once that have not proven their key yet (with
    /// authentication); a new one beyond closes the oldest of them.
    pub max_unproven: usize,
    /// A client connection that has not proven its key (without
    /// authentication: said HELLO) this long after it opened is closed.
    pub hello_timeout: Duration,
    /// A client connection idle this long (nothing in flight, no queue
    /// pair, no traffic) is closed; `None`: never.
    pub idle_timeout: Option<Duration>,
    /// The folder of the principals' keys: with it, this device proves its
    /// key to its servers and requires every client to prove its own.
    /// `None`: no authentication.
    pub secrets: Option<std::path::PathBuf>,
    /// Spin on the sockets for this long after the last event before
    /// sleeping in the kernel: trades a CPU for the wake-up latency of an
    /// idle one. Zero (the default) never spins.
    pub busy_poll: Duration,
    /// How the TCP ports and server links move bytes.
    pub io: IoConfig,
}

/// The event loop's back end for the TCP ports and server links.
#[derive(Debug)]
enum Io {
    /// Readiness from the mio poll; reads and writes are system calls.
    Epoll,
    /// Completions from the ring; the mio poll (signals, waker, RoCEv2,
    /// connects in progress) is watched by it.
    Uring(uring::Ring),
}

/// The connection a socket on the ring belongs to.
#[derive(Debug, Clone, Copy)]
enum Owner {
    Client(ConnId),
    Link(LinkId),
}

/// How long a port whose accept failed waits before accepting again.
const ACCEPT_RETRY: Duration = Duration::from_secs(1);

/// Idle connections' buffers are freed after this long without traffic.
const TRIM_IDLE_AFTER: Duration = Duration::from_secs(1);

/// Why the device could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The topology has no usable map for this device.
    #[error(transparent)]
    Map(#[from] MapError),
    /// This device's key file (with `--secrets`) cannot be used.
    #[error("--secrets")]
    Secrets(#[from] topology::secrets::SecretError),
    /// A client-facing port cannot be bound.
    #[error("port {port}: cannot listen on {addr}")]
    Bind {
        /// The port.
        port: PortId,
        /// Its address.
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
    /// The event loop failed.
    #[error("event loop failed")]
    Poll(#[source] io::Error),
    /// A port's RoCEv2 side cannot start.
    #[error("port {port}: RoCEv2")]
    Roce {
        /// The port.
        port: PortId,
        /// Why.
        #[source]
        source: RocePortError,
    },
}

/// A server link's socket; when to (re)connect is [`Reconnects`]' call.
#[derive(Debug)]
enum LinkConn {
    /// No socket: waiting to (re)connect.
    Idle,
    /// Connect in progress.
    Connecting { endpoint: Endpoint },
    /// Connected (handshaking or up, as the core knows).
    Connected { endpoint: Endpoint },
}

/// A client connection.
#[derive(Debug)]
struct ClientConn {
    endpoint: Endpoint,
    /// When it was accepted (for the HELLO timeout).
    opened: Instant,
    /// When it last had traffic either way (for the idle timeout).
    active: Instant,
    /// Index of the port it connected to.
    port: usize,
    /// Reading stopped for backpressure; resume when there is room.
    paused: bool,
    /// Its last request filled this link past [`LINK_OUT_HIGH_WATER`]: no
    /// more until the link drains.
    waiting_for: Option<LinkId>,
    /// Close once the queued bytes are written.
    closing: bool,
    /// Listed in [`Device::to_flush`].
    to_flush: bool,
}

/// A bound fabric device, ready to run.
#[derive(Debug)]
pub struct Device {
    config: DeviceConfig,
    poll: Poll,
    io: Io,
    /// Completions taken from the ring this turn.
    completions: Vec<Completion>,
    /// Which connection each socket on the ring belongs to, by slot.
    ring_slots: IdMap<u64, Owner>,
    /// Ports whose accepts failed and stopped, and when to start them
    /// again (a descriptor shortage is not retried every turn).
    accepts_stopped: Vec<(usize, Instant)>,
    core: Forwarder,
    metrics: Arc<DeviceMetrics>,
    listeners: Vec<(PortId, TcpListener, SocketAddr)>,
    /// The RoCEv2 side of each port that has one, by port index.
    roce: Vec<Option<RoceEndpoint>>,
    /// The queue pairs toward servers on verbs (over the first RoCEv2 port).
    uplinks: Uplinks,
    roce_metrics: RoceMetrics,
    roce_published: Instant,
    /// RoCE traffic since the last publication: publish within [`ROCE_PUBLISH`].
    roce_dirty: bool,
    clients: IdMap<ConnId, ClientConn>,
    /// What the client connections count against.
    admission: Admission,
    /// Clients with bytes queued since the last flush: only these are
    /// written at the end of a turn, however many clients are connected.
    to_flush: Vec<ConnId>,
    /// Clients paused for backpressure, checked at the end of a turn.
    paused: Vec<ConnId>,
    /// Client connections closed since the last log line about them.
    closed_unlogged: u64,
    /// When that line was written.
    closed_logged: Instant,
    next_client: usize,
    links: IdMap<LinkId, LinkConn>,
    /// When each link is (re)connected.
    reconnects: Reconnects,
    admin: AdminServer,
    draining: Option<Instant>,
    /// When HELLO timeouts were last checked.
    hello_checked: Instant,
    /// When the keys of links to servers on verbs were last asked for.
    verbs_keys_polled: Instant,
    /// Wakes the loop when the map watcher has a new map.
    waker: Arc<mio::Waker>,
    /// On etcd: the map being followed, and this device's liveness record.
    follow: Option<Following>,
}

/// Following the map in etcd.
#[derive(Debug)]
struct Following {
    watch: control::MapWatch,
    registration: Option<control::Registration>,
    /// The epoch the device runs.
    epoch: u64,
    /// The epoch the device ran when a server's newer one last made it
    /// read the map at once (logged once per epoch).
    reread_logged: Option<u64>,
}

/// Sets up the back end `config` asks for: io_uring where the kernel
/// allows it, else epoll, saying why.
fn start_io(config: IoConfig, spins: bool) -> (Io, Selected) {
    if config.backend == Backend::Epoll {
        let selected = Selected {
            backend: Backend::Epoll,
            fallback: None,
        };
        return (Io::Epoll, selected);
    }
    let (release, disabled) = backend::choice::read_kernel_facts();
    let fallback = match backend::choice::kernel_refusal(&release, disabled.as_deref()) {
        Some(refused) => refused,
        None => match uring::Ring::new(config.sqpoll, spins) {
            Ok(ring) => {
                let selected = Selected {
                    backend: Backend::Uring,
                    fallback: None,
                };
                return (Io::Uring(ring), selected);
            }
            Err(e) => backend::choice::setup_refusal(&e, disabled.as_deref()),
        },
    };
    let selected = Selected {
        backend: Backend::Epoll,
        fallback: Some(fallback),
    };
    (Io::Epoll, selected)
}

fn link_token(link: LinkId) -> Token {
    Token(LINK_BASE + link.0 as usize)
}

impl Device {
    /// Builds the map, binds every client-facing port and the admin address.
    pub fn bind(config: DeviceConfig) -> Result<Self, DeviceError> {
        let map = DeviceMap::new(&config.topology, &config.device)?;
        let registry = Arc::new(Registry::new());
        telemetry::register_process_metrics(&registry)?;
        let metrics = Arc::new(DeviceMetrics::new(Arc::clone(&registry))?);
        let poll = Poll::new().map_err(DeviceError::Poll)?;
        let (io, selected) = start_io(config.io, !config.busy_poll.is_zero());
        info!("{}", selected.log_line(config.io.sqpoll));
        let backends = registry.gauge_family(
            "fabric_device_io_backend",
            "1 for the I/O back end the TCP ports and server links run on (io_uring or \
             epoll); fallback says why io_uring was asked for and does not run (none).",
            &["backend", "fallback"],
        )?;
        backends
            .with(&[
                selected.backend.as_str(),
                selected.fallback.as_ref().map_or("none", |f| f.label),
            ])
            .set(1);
        let waker =
            Arc::new(mio::Waker::new(poll.registry(), MAP_WAKE).map_err(DeviceError::Poll)?);
        let spec = config
            .topology
            .fabric_device(&config.device)
            .ok_or_else(|| MapError::UnknownDevice {
                file: config.topology.source.clone(),
                device: config.device.to_string(),
            })?;
        let mut listeners = Vec::new();
        let mut roce = Vec::new();
        for (i, port) in spec.ports.iter().enumerate() {
            roce.push(match &port.roce {
                Some(r) => {
                    let endpoint = RoceEndpoint::open(r).map_err(|source| DeviceError::Roce {
                        port: port.id.clone(),
                        source,
                    })?;
                    poll.registry()
                        .register(
                            &mut mio::unix::SourceFd(&endpoint.source()),
                            Token(ROCE_BASE + i),
                            Interest::READABLE,
                        )
                        .map_err(DeviceError::Poll)?;
                    Some(endpoint)
                }
                None => None,
            });
            let bind_err = |source| DeviceError::Bind {
                port: port.id.clone(),
                addr: port.listen.clone(),
                source,
            };
            let addr: SocketAddr = port
                .listen
                .parse()
                .map_err(|_| bind_err(io::ErrorKind::InvalidInput.into()))?;
            let mut listener = TcpListener::bind(addr).map_err(bind_err)?;
            let local = listener.local_addr().map_err(bind_err)?;
            match &io {
                Io::Epoll => poll
                    .registry()
                    .register(&mut listener, Token(i), Interest::READABLE)
                    .map_err(DeviceError::Poll)?,
                Io::Uring(ring) => ring.accept(i, listener.as_raw_fd()),
            }
            listeners.push((port.id.clone(), listener, local));
        }
        let roce_metrics = RoceMetrics::register(&registry)?;
        let mut core = Forwarder::new(map, config.forwarder, Arc::clone(&metrics));
        if let Some(dir) = &config.secrets {
            let key = topology::secrets::read_key(
                dir,
                topology::secrets::Principal::Device(config.device.as_str()),
            )?;
            core.set_link_key(proto::auth::Key::new(key));
            let mut client_keys = std::collections::HashMap::new();
            for client in &config.topology.clients {
                let id = client.id.as_str();
                match topology::secrets::read_key(dir, topology::secrets::Principal::Client(id)) {
                    Ok(key) => {
                        client_keys.insert(id.to_owned(), proto::auth::Key::new(key));
                    }
                    // That client cannot connect; the others can.
                    Err(topology::secrets::SecretError::Missing { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            info!(
                "authentication on: links prove this device's key, clients prove theirs ({} keys from {})",
                client_keys.len(),
                dir.display()
            );
            core.require_client_keys(client_keys);
        }
        let now = Instant::now();
        let mut reconnects = Reconnects::new(Backoff {
            min: config.reconnect_min,
            max: config.reconnect_max,
            connect_timeout: CONNECT_TIMEOUT,
        });
        let links = core
            .links()
            .map(|(id, _)| {
                reconnects.add(id, now);
                (id, LinkConn::Idle)
            })
            .collect();
        let health: telemetry::HealthCheck = Arc::new(|| Health::Healthy);
        let admin = AdminServer::start(config.admin, registry, health)?;
        let admission = Admission::new(
            admission::Limits {
                proven: config.max_clients,
                unproven: config.max_unproven,
            },
            config.secrets.is_some(),
        );
        if let Io::Uring(ring) = &io {
            ring.watch(poll.as_raw_fd());
        }
        Ok(Self {
            config,
            poll,
            io,
            completions: Vec::new(),
            ring_slots: IdMap::default(),
            accepts_stopped: Vec::new(),
            core,
            metrics,
            listeners,
            roce,
            uplinks: Uplinks::new(),
            roce_metrics,
            roce_published: now,
            roce_dirty: true,
            clients: IdMap::default(),
            admission,
            to_flush: Vec::new(),
            paused: Vec::new(),
            closed_unlogged: 0,
            closed_logged: Instant::now(),
            next_client: CLIENT_BASE,
            links,
            reconnects,
            admin,
            draining: None,
            hello_checked: now,
            verbs_keys_polled: now,
            waker,
            follow: None,
        })
    }

    /// Wakes the event loop from another thread (the map watcher's).
    pub fn waker(&self) -> Arc<mio::Waker> {
        Arc::clone(&self.waker)
    }

    /// The map-following metrics, for the watcher's observer.
    pub fn map_metrics(&self) -> Arc<control::MapMetrics> {
        Arc::clone(&self.metrics.map)
    }

    /// Follows the map in etcd from `epoch`: every new map `watch` hands
    /// over is applied like a reload, and `registration` (the liveness
    /// record, kept while the device runs) records the epoch.
    pub fn follow(
        &mut self,
        watch: control::MapWatch,
        registration: Option<control::Registration>,
        epoch: u64,
    ) {
        self.metrics.map.epoch.set(epoch as i64);
        let said = self.core.set_epoch(epoch);
        self.say_epoch(said);
        self.follow = Some(Following {
            watch,
            registration,
            epoch,
            reread_logged: None,
        });
    }

    /// The bound address of every client-facing port.
    pub fn ports(&self) -> Vec<(PortId, SocketAddr)> {
        self.listeners
            .iter()
            .map(|(id, _, addr)| (id.clone(), *addr))
            .collect()
    }

    /// The RoCEv2 address of every port that has one.
    pub fn roce_ports(&self) -> Vec<(PortId, std::net::Ipv4Addr)> {
        self.listeners
            .iter()
            .zip(&self.roce)
            .filter_map(|((id, _, _), r)| r.as_ref().map(|r| (id.clone(), r.ip())))
            .collect()
    }

    /// The bound admin address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin.local_addr()
    }

    /// Runs until SIGTERM or SIGINT, then drains: stops accepting and
    /// reading, waits for the requests in flight (at most one request
    /// timeout) and returns. SIGHUP reloads the topology.
    pub fn run(mut self) -> Result<(), DeviceError> {
        let mut signals = Signals::new([SIGTERM, SIGINT, SIGHUP]).map_err(DeviceError::Poll)?;
        self.poll
            .registry()
            .register(&mut signals, SIGNALS, Interest::READABLE)
            .map_err(DeviceError::Poll)?;
        let mut events = Events::with_capacity(1024);
        let mut last_event = Instant::now();
        // The thread's CPU time when the turns that spin and find no event
        // began (read once per run of such turns: preemption while
        // spinning is not idle polling).
        let mut idle_since: Option<Duration> = None;
        // One clock read per turn, after the poll: a turn that spins uses
        // the last one (a turn's work is short next to the busy-poll time
        // and the link timers); only a poll that may sleep reads it anew.
        let mut now = Instant::now();
        loop {
            self.connect_due_links(now);
            let spinning = now.saturating_duration_since(last_event) < self.config.busy_poll;
            let wait = if spinning {
                Duration::ZERO
            } else {
                now = Instant::now();
                self.next_wakeup(now).saturating_duration_since(now)
            };
            self.wait(&mut events, wait)?;
            now = Instant::now();
            let quiet = events.is_empty() && self.completions.is_empty();
            let idle = quiet && spinning;
            if idle && idle_since.is_none() {
                idle_since = telemetry::thread_cpu_time();
            } else if !idle && let Some(since) = idle_since.take() {
                let cpu = telemetry::thread_cpu_time().unwrap_or(since);
                self.metrics.add_idle_poll(cpu.saturating_sub(since));
            }
            if !quiet {
                last_event = now;
            }
            self.dispatch(&events, &mut signals, now);
            self.on_completions(now);
            self.restart_accepts(now);
            self.reread_map_if_behind();
            self.replay_parked(now);
            self.close_silent_clients(now);
            let (expired, silent) = self.core.handle_timeouts(now);
            self.deliver_all(expired);
            self.roce_turn(now);
            self.poll_verbs_keys(now);
            for link in silent {
                self.link_failed(link, now, "requests timed out");
            }
            self.resume_paused(now);
            self.flush_all(now);
            if let Some(deadline) = self.draining
                && (self.core.requests_in_flight() == 0 || now >= deadline)
            {
                self.flush_all(now);
                info!("drained, stopping");
                return Ok(());
            }
        }
    }

    /// Waits up to `wait` for readiness events (epoll) or completions
    /// (io_uring, which then asks mio only when the ring saw its epoll
    /// instance ready, or woke with nothing).
    fn wait(&mut self, events: &mut Events, wait: Duration) -> Result<(), DeviceError> {
        let poll_mio = |poll: &mut Poll, events: &mut Events, wait| match poll
            .poll(events, Some(wait))
        {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(DeviceError::Poll(e)),
        };
        let Io::Uring(ring) = &mut self.io else {
            return poll_mio(&mut self.poll, events, wait);
        };
        ring.wait(wait).map_err(DeviceError::Poll)?;
        self.completions.clear();
        ring.reap(&mut self.completions);
        let watched = self.completions.iter().any(|c| c.op() == Some(Op::Watch));
        if watched || (self.completions.is_empty() && !wait.is_zero()) {
            poll_mio(&mut self.poll, events, Duration::ZERO)
        } else {
            events.clear();
            Ok(())
        }
    }

    /// Handles the ring's completions of this turn.
    fn on_completions(&mut self, now: Instant) {
        let completions = std::mem::take(&mut self.completions);
        for completion in &completions {
            match completion.op() {
                Some(Op::Accept) => self.on_accepted(completion),
                Some(Op::Recv) => self.on_received(completion, now),
                Some(Op::Send) => self.on_sent(completion, now),
                Some(Op::Watch) if !completion.more() => {
                    if let Io::Uring(ring) = &self.io {
                        ring.watch(self.poll.as_raw_fd());
                    }
                }
                Some(Op::Watch | Op::Cancel) | None => {}
            }
        }
        self.completions = completions;
    }

    /// The endpoint on the ring with `slot`, if its connection is open.
    fn ring_endpoint(&mut self, slot: u64) -> Option<(Owner, &mut Endpoint)> {
        let owner = *self.ring_slots.get(&slot)?;
        let endpoint = match owner {
            Owner::Client(conn) => &mut self.clients.get_mut(&conn)?.endpoint,
            Owner::Link(link) => match self.links.get_mut(&link)? {
                LinkConn::Connected { endpoint } => endpoint,
                _ => return None,
            },
        };
        (endpoint.ring_slot() == Some(slot)).then_some((owner, endpoint))
    }

    /// A socket received bytes (or its receive ended): stage them, hand
    /// the buffer back and serve the connection.
    fn on_received(&mut self, completion: &Completion, now: Instant) {
        let Self {
            io,
            ring_slots,
            clients,
            links,
            ..
        } = self;
        let Io::Uring(ring) = io else {
            return;
        };
        let slot = completion.slot();
        let endpoint = match ring_slots.get(&slot) {
            Some(&Owner::Client(conn)) => clients
                .get_mut(&conn)
                .map(|c| (Owner::Client(conn), &mut c.endpoint)),
            Some(&Owner::Link(link)) => match links.get_mut(&link) {
                Some(LinkConn::Connected { endpoint }) => Some((Owner::Link(link), endpoint)),
                _ => None,
            },
            None => None,
        };
        let owner = match endpoint {
            Some((owner, endpoint)) if endpoint.ring_slot() == Some(slot) => {
                let bytes = ring.received(completion);
                endpoint.received(completion.result, bytes, completion.more());
                Some(owner)
            }
            _ => None,
        };
        ring.release(completion);
        match owner {
            Some(Owner::Client(conn)) => self.client_ready(conn, now),
            Some(Owner::Link(link)) => self.serve_link(link, now),
            None => {}
        }
    }

    /// A send completed: the rest or what gathered meanwhile goes out; a
    /// client closing after its last reply is closed once it is out.
    fn on_sent(&mut self, completion: &Completion, now: Instant) {
        if let Io::Uring(ring) = &mut self.io {
            ring.release(completion);
        }
        let Some((owner, endpoint)) = self.ring_endpoint(completion.slot()) else {
            return;
        };
        let sent = endpoint.sent(completion.result);
        let drained = endpoint.pending_out() == 0;
        match (owner, sent) {
            (Owner::Client(conn), Err(e)) => self.close_client(conn, &format!("write failed: {e}")),
            (Owner::Link(link), Err(e)) => self.link_failed(link, now, &format!("write failed: {e}")),
            (Owner::Client(conn), Ok(())) => {
                if drained && self.clients.get(&conn).is_some_and(|c| c.closing) {
                    self.close_client(conn, "refused");
                }
            }
            (Owner::Link(_), Ok(())) => {}
        }
    }

    /// A listener accepted a connection (or its accept failed).
    fn on_accepted(&mut self, completion: &Completion) {
        let port = completion.slot() as usize;
        if completion.result >= 0 {
            // SAFETY: the kernel just opened this descriptor for us; nothing
            // else owns it.
            let stream = unsafe { std::net::TcpStream::from_raw_fd(completion.result) };
            let stream = TcpStream::from_std(stream);
            match stream.peer_addr() {
                Ok(peer) => self.admit_client(port, stream, peer),
                Err(e) => debug!("accepted connection gone before it was served: {e}"),
            }
        } else {
            warn!(
                "accept failed: {}",
                io::Error::from_raw_os_error(-completion.result)
            );
        }
        if !completion.more() && self.draining.is_none() {
            self.accepts_stopped
                .push((port, Instant::now() + if completion.result < 0 { ACCEPT_RETRY } else { Duration::ZERO }));
        }
    }

    /// Starts the multishot accepts that ended again, once their retry
    /// time has come.
    fn restart_accepts(&mut self, now: Instant) {
        if self.accepts_stopped.is_empty() || self.draining.is_some() {
            return;
        }
        let Io::Uring(ring) = &self.io else {
            return;
        };
        let listeners = &self.listeners;
        self.accepts_stopped.retain(|&(port, at)| {
            if now < at {
                return true;
            }
            if let Some((_, listener, _)) = listeners.get(port) {
                ring.accept(port, listener.as_raw_fd());
            }
            false
        });
    }

    /// Handles one batch of readiness events.
    fn dispatch(&mut self, events: &Events, signals: &mut Signals, now: Instant) {
        for event in events.iter() {
            match event.token() {
                SIGNALS => {
                    for signal in signals.pending() {
                        self.on_signal(signal);
                    }
                }
                MAP_WAKE => self.apply_watched_map(),
                Token(i) if i < self.listeners.len() => self.accept(i),
                Token(t) if (ROCE_BASE..ROCE_BASE + self.roce.len()).contains(&t) => {
                    self.roce_receive(t - ROCE_BASE, now);
                }
                Token(t) if t >= LINK_BASE => {
                    let link = LinkId((t - LINK_BASE) as u32);
                    self.on_link_event(link, event, now);
                }
                Token(t) => self.on_client_event(t as ConnId, event, now),
            }
        }
    }

    /// When the loop must wake up next: a request deadline, a link retry.
    fn next_wakeup(&mut self, now: Instant) -> Instant {
        let mut next = now + MAX_POLL_WAIT;
        if let Some(deadline) = self.core.poll_timeout() {
            next = next.min(deadline);
        }
        for port in self.roce.iter().flatten() {
            if let Some(t) = port.gateway.poll_timeout() {
                next = next.min(t);
            }
        }
        if let Some(t) = self.uplinks.poll_timeout() {
            next = next.min(t);
        }
        if self.roce_dirty {
            next = next.min(self.roce_published + ROCE_PUBLISH);
        }
        if let Some(t) = self.reconnects.poll_timeout() {
            next = next.min(t);
        }
        next.max(now)
    }

    fn on_signal(&mut self, signal: i32) {
        match signal {
            SIGHUP => self.reload(),
            _ => {
                if self.draining.is_none() {
                    info!("signal {signal}, draining");
                    self.draining = Some(Instant::now() + self.config.forwarder.request_timeout);
                    for (port, (_, listener, _)) in self.listeners.iter_mut().enumerate() {
                        match &self.io {
                            Io::Epoll => {
                                let _ = self.poll.registry().deregister(listener);
                            }
                            Io::Uring(ring) => ring.stop_accepting(port),
                        }
                    }
                }
            }
        }
    }

    /// Re-reads the topology; a valid one replaces the map without touching
    /// client connections, an invalid one is refused and logged.
    fn reload(&mut self) {
        let device = self.config.device.clone();
        let Some(path) = self.config.topology_path.clone() else {
            warn!("SIGHUP: no topology file to reload (the map follows etcd, if on it)");
            return;
        };
        let loaded = Topology::load(&path)
            .map_err(|e| error_chain(&e))
            .and_then(|t| DeviceMap::new(&t, &device).map_err(|e| error_chain(&e)));
        let map = match loaded {
            Ok(map) => map,
            Err(why) => {
                warn!("reload refused, keeping the old map: {why}");
                self.metrics.reloads.with(&["refused"]).inc();
                return;
            }
        };
        let regions = self.replace_map(map);
        info!("reloaded {}: {regions} regions", path.display());
    }

    /// Applies the newest map the watcher handed over, as a reload does:
    /// client connections and requests in flight stay; one this device
    /// cannot run on (it is not in it, say) is refused and the old one kept.
    fn apply_watched_map(&mut self) {
        let Some(update) = self.follow.as_ref().and_then(|f| f.watch.latest()) else {
            return;
        };
        let running = self.follow.as_ref().map_or(0, |f| f.epoch);
        let epoch = update.version.epoch;
        let map = match DeviceMap::new(&update.topology, &self.config.device) {
            Ok(map) => map,
            Err(e) => {
                warn!(
                    "map epoch={epoch} refused, keeping epoch={running}: {}",
                    error_chain(&e)
                );
                self.metrics.reloads.with(&["refused"]).inc();
                return;
            }
        };
        let regions = self.replace_map(map);
        let said = self.core.set_epoch(epoch);
        self.say_epoch(said);
        self.config.topology = update.topology.clone();
        self.metrics.map.applied(&update);
        if let Some(follow) = &mut self.follow {
            follow.epoch = epoch;
            if let Some(registration) = &follow.registration {
                registration.set_epoch(epoch);
            }
        }
        info!("map epoch={epoch} applied (was epoch={running}): {regions} regions");
    }

    /// Sends the device's MAP_EPOCH on the links the core named; a link
    /// that cannot take it is failed (and reconnects, saying it then).
    fn say_epoch(&mut self, said: Vec<(LinkId, Vec<u8>)>) {
        let now = Instant::now();
        for (link, frame) in said {
            let Some(LinkConn::Connected { endpoint }) = self.links.get_mut(&link) else {
                continue;
            };
            if let Err(e) = endpoint.send(&frame, &[]) {
                self.link_failed(link, now, &format!("write failed: {e}"));
            }
        }
    }

    /// Asks the map watcher to read the map now when a server said it runs
    /// a newer epoch than the device.
    fn reread_map_if_behind(&mut self) {
        if self.core.take_map_reread()
            && let Some(follow) = &mut self.follow
        {
            if follow.reread_logged != Some(follow.epoch) {
                follow.reread_logged = Some(follow.epoch);
                info!(
                    "a server runs a newer map epoch than this device's {}: reading the map now",
                    follow.epoch
                );
            }
            follow.watch.reread_now();
        }
    }

    /// Replaces the core's map by `map`, keeping client connections and
    /// the links it still has; the number of regions it maps.
    fn replace_map(&mut self, map: DeviceMap) -> usize {
        let regions = map.layout.entries().len();
        let outcome = self.core.reload(map);
        self.deliver_all(outcome.failed);
        let now = Instant::now();
        for link in outcome.disconnect {
            self.reconnects.remove(link);
            if let Some(
                LinkConn::Connected { mut endpoint } | LinkConn::Connecting { mut endpoint },
            ) = self.links.remove(&link)
            {
                let _ = self.poll.registry().deregister(&mut endpoint.stream);
                if let Some(slot) = endpoint.ring_slot() {
                    self.ring_slots.remove(&slot);
                }
            }
        }
        for link in outcome.reconnect {
            self.link_failed(link, now, "server disagrees with the new map");
        }
        for link in outcome.connect {
            self.links.insert(link, LinkConn::Idle);
            self.reconnects.add(link, now);
        }
        self.metrics.reloads.with(&["applied"]).inc();
        regions
    }

    /// Closes connections that have not said HELLO (and with
    /// authentication proven their key) within the HELLO timeout, and
    /// connections idle for the idle timeout (nothing in
    /// flight or queued, no queue pair), so idle sockets cannot fill the
    /// connection cap. Checked at most once a second.
    fn close_silent_clients(&mut self, now: Instant) {
        if now < self.hello_checked + Duration::from_secs(1) {
            return;
        }
        self.hello_checked = now;
        for client in self.clients.values_mut() {
            if now.saturating_duration_since(client.active) >= TRIM_IDLE_AFTER {
                client.endpoint.trim_idle();
            }
        }
        let silent: Vec<ConnId> = self
            .clients
            .iter()
            .filter(|(conn, c)| {
                now.saturating_duration_since(c.opened) >= self.config.hello_timeout
                    && self.core.session_client(**conn).is_none()
            })
            .map(|(conn, _)| *conn)
            .collect();
        for conn in silent {
            self.metrics
                .connections_closed
                .with(&["hello_timeout"])
                .inc();
            self.close_client(conn, "no HELLO (or no proof) in time");
        }
        let Some(limit) = self.config.idle_timeout else {
            return;
        };
        let idle: Vec<ConnId> = self
            .clients
            .iter()
            .filter(|(conn, c)| {
                now.saturating_duration_since(c.active) >= limit
                    && c.endpoint.pending_out() == 0
                    && !self.core.client_busy(**conn)
                    && !self
                        .roce
                        .iter()
                        .flatten()
                        .any(|r| r.has_queue_pairs(**conn))
            })
            .map(|(conn, _)| *conn)
            .collect();
        for conn in idle {
            self.metrics.connections_closed.with(&["idle"]).inc();
            self.close_client(conn, "idle");
        }
    }

    /// Hands the requests the core parked while their links were starting
    /// back to it, now that they can be forwarded or refused.
    fn replay_parked(&mut self, now: Instant) {
        for (conn, frame) in self.core.take_unparked() {
            match self.core.client_frame(conn, &frame, now) {
                ClientAction::Forward {
                    link,
                    head,
                    payload,
                } => {
                    // A link that went away again answers through its
                    // pending request's timeout, as for any client request.
                    let _ = send_to_link(&mut self.links, &mut self.uplinks, link, &head, payload);
                }
                ClientAction::Reply(reply) | ClientAction::ReplyAndClose(reply) => {
                    self.deliver_all(vec![(conn, reply)]);
                }
                ClientAction::Nothing | ClientAction::Close | ClientAction::ConnectQp { .. } => {}
            }
        }
    }

    /// Handles the frames waiting on port `index`'s RoCEv2 socket.
    fn roce_receive(&mut self, index: usize, now: Instant) {
        self.roce_dirty = true;
        let Self {
            core,
            links,
            roce,
            uplinks,
            ..
        } = self;
        if let Some(Some(port)) = roce.get_mut(index) {
            port.receive(now, core, uplinks, |uplinks, link, head, payload| {
                let _ = send_to_link(links, uplinks, link, head, payload);
            });
        }
        self.drain_uplinks(now);
    }

    /// Fires the queue pairs' timers, sends what they have ready and, at
    /// most every [`ROCE_PUBLISH`], publishes their counters.
    fn roce_turn(&mut self, now: Instant) {
        self.uplinks.handle_timeout(now);
        self.drain_uplinks(now);
        for (index, port) in self.roce.iter_mut().enumerate() {
            if let Some(port) = port {
                port.gateway.handle_timeout(now);
                self.roce_dirty |= port.transmit(now, &mut self.uplinks, index);
            }
        }
        if self.roce_dirty && now >= self.roce_published + ROCE_PUBLISH {
            self.roce_published = now;
            self.roce_dirty = false;
            let snapshots = self
                .listeners
                .iter()
                .zip(&mut self.roce)
                .filter_map(|((id, _, _), r)| r.as_mut().map(|r| r.snapshot(id.as_str())))
                .collect();
            self.roce_metrics.publish(snapshots);
            self.roce_metrics.publish_uplinks(self.uplinks.counters());
        }
    }

    /// Hands a response (or an error reply) for a queue pair's connection
    /// to its gateway; false when `conn` is not a queue pair's.
    fn roce_deliver(
        roce: &mut [Option<RoceEndpoint>],
        conn: ConnId,
        head: &[u8],
        payload: &[u8],
    ) -> bool {
        roce.iter_mut()
            .flatten()
            .any(|port| port.gateway.deliver(conn, head, payload))
    }

    /// Accepts every connection waiting on port `index` (epoll).
    fn accept(&mut self, index: usize) {
        loop {
            let Some((_, listener, _)) = self.listeners.get(index) else {
                return;
            };
            let (stream, peer) = match listener.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    warn!("accept failed: {e}");
                    return;
                }
            };
            self.admit_client(index, stream, peer);
        }
    }

    /// Serves a connection accepted on port `index`, or closes it when the
    /// caps (or draining) say so.
    fn admit_client(&mut self, index: usize, mut stream: TcpStream, peer: SocketAddr) {
        {
            let verdict = match self.draining {
                Some(_) => Verdict::Refuse("draining"),
                None => self.admission.verdict(),
            };
            match verdict {
                Verdict::Admit => {}
                Verdict::AdmitEvicting(oldest) => {
                    self.metrics
                        .connections_closed
                        .with(&["unproven_evicted"])
                        .inc();
                    self.close_client(oldest, "unproven, evicted for a newer connection");
                }
                Verdict::Refuse(reason) => {
                    debug!("refused client connection from {peer}: {reason}");
                    self.metrics.connections_closed.with(&[reason]).inc();
                    return;
                }
            }
            let conn = self.next_client as ConnId;
            self.next_client += 1;
            let _ = stream.set_nodelay(true);
            let registered = match &self.io {
                Io::Epoll => self
                    .poll
                    .registry()
                    .register(
                        &mut stream,
                        Token(conn as usize),
                        Interest::READABLE | Interest::WRITABLE,
                    )
                    .is_ok(),
                Io::Uring(_) => true,
            };
            if !registered {
                return;
            }
            debug!("client connection {conn} from {peer} opened");
            self.core.client_opened(conn);
            self.admission.opened(conn);
            let mut endpoint = Endpoint::with_decoder(
                stream,
                FrameDecoder::with_max_body_len(PRE_SESSION_MAX_BODY),
            );
            if let Io::Uring(ring) = &self.io {
                endpoint.attach(ring.shared());
                if let Some(slot) = endpoint.ring_slot() {
                    self.ring_slots.insert(slot, Owner::Client(conn));
                }
            }
            self.clients.insert(
                conn,
                ClientConn {
                    endpoint,
                    opened: Instant::now(),
                    active: Instant::now(),
                    port: index,
                    paused: false,
                    waiting_for: None,
                    closing: false,
                    to_flush: false,
                },
            );
        }
    }

    fn on_client_event(&mut self, conn: ConnId, event: &Event, now: Instant) {
        if let Some(client) = self.clients.get_mut(&conn) {
            client.endpoint.note_event(event);
        }
        self.client_ready(conn, now);
    }

    /// A client's socket has something (bytes, room, a hang-up): write
    /// what is queued, then read and handle its requests.
    fn client_ready(&mut self, conn: ConnId, now: Instant) {
        let Some(client) = self.clients.get_mut(&conn) else {
            return;
        };
        client.active = now;
        if let Err(e) = client.endpoint.flush() {
            self.close_client(conn, &format!("write failed: {e}"));
            return;
        }
        self.serve_client(conn, now);
    }

    /// Reads and handles a client's requests until its socket is drained or
    /// backpressure pauses it.
    fn serve_client(&mut self, conn: ConnId, now: Instant) {
        self.serve_client_frames(conn, now);
        if self.admission.is_unproven(conn)
            && self.core.session_client(conn).is_some()
            && !self.admission.proven(conn)
        {
            self.metrics
                .connections_closed
                .with(&["too_many_clients"])
                .inc();
            self.close_client(conn, "proven, but --max-clients connections are open");
            return;
        }
        // Record what the connection holds now that its frames were handled.
        if let Some(client) = self.clients.get_mut(&conn) {
            let charge = client.endpoint.settle_charge() as u64;
            self.core.charge_request_bytes(conn, charge, false);
        }
    }

    /// Hands a client's frames to the core and reads more, until the socket
    /// is drained, the client is paused or the connection closes.
    fn serve_client_frames(&mut self, conn: ConnId, now: Instant) {
        loop {
            let end = self.handle_client_frames(conn, now);
            let Some(client) = self.clients.get_mut(&conn) else {
                return;
            };
            match end {
                FramesEnd::Paused => {
                    self.pause(conn);
                    return;
                }
                FramesEnd::Close(why) => {
                    let _ = client.endpoint.flush();
                    self.close_client(conn, &why);
                    return;
                }
                FramesEnd::Drained => {}
            }
            if self.draining.is_some() || client.closing {
                return;
            }
            let core = &mut self.core;
            let mut admit = |held: usize| core.charge_request_bytes(conn, held as u64, true);
            match client.endpoint.fill(&mut admit) {
                Fill::Full => continue,
                Fill::NotAdmitted => {
                    // Others' frames will free budget; try again then.
                    self.pause(conn);
                    return;
                }
                Fill::Drained => {
                    // Complete frames may have arrived with the last read.
                    if client.endpoint.decoder.buffered() == 0 {
                        return;
                    }
                    match self.handle_client_frames(conn, now) {
                        FramesEnd::Drained => return,
                        FramesEnd::Paused => {
                            self.pause(conn);
                            return;
                        }
                        FramesEnd::Close(why) => {
                            self.close_client(conn, &why);
                            return;
                        }
                    }
                }
                Fill::Closed => {
                    // Answer what was received before the hang-up, then close.
                    let _ = self.handle_client_frames(conn, now);
                    self.close_client(conn, "peer closed");
                    return;
                }
                Fill::Failed(why) => {
                    if client.endpoint.decoder.error().is_some() {
                        // A bad header, or a frame too large for a peer
                        // that has not said who it is.
                        self.metrics.connections_closed.with(&["unframeable"]).inc();
                    }
                    let _ = self.handle_client_frames(conn, now);
                    self.close_client(conn, &why);
                    return;
                }
            }
        }
    }

    /// Stops reading a client until [`Device::resume_paused`] finds room.
    fn pause(&mut self, conn: ConnId) {
        if let Some(client) = self.clients.get_mut(&conn)
            && !client.paused
        {
            client.paused = true;
            self.paused.push(conn);
        }
    }

    /// Lists a client for the end-of-turn flush if it has bytes queued.
    fn queue_flush(&mut self, conn: ConnId) {
        if let Some(client) = self.clients.get_mut(&conn) {
            mark_to_flush(&mut self.to_flush, conn, client);
        }
    }

    /// Hands every complete frame a client sent to the core.
    fn handle_client_frames(&mut self, conn: ConnId, now: Instant) -> FramesEnd {
        let end = self.client_frames(conn, now);
        self.queue_flush(conn);
        end
    }

    fn client_frames(&mut self, conn: ConnId, now: Instant) -> FramesEnd {
        let Self {
            core,
            clients,
            links,
            metrics,
            roce,
            uplinks,
            ..
        } = self;
        let Some(client) = clients.get_mut(&conn) else {
            return FramesEnd::Close("gone".into());
        };
        let ClientConn {
            endpoint,
            closing,
            port,
            waiting_for,
            ..
        } = client;
        loop {
            if *closing {
                return FramesEnd::Drained;
            }
            if !core.client_has_room(conn)
                || endpoint.pending_out() > CLIENT_OUT_HIGH_WATER
                || waiting_for.is_some()
            {
                return FramesEnd::Paused;
            }
            if endpoint.decoder.max_body_len() < proto::frame::MAX_BODY_LEN
                && core.session_client(conn).is_some()
            {
                // The client is known now: it may send requests of any size.
                endpoint
                    .decoder
                    .raise_max_body_len(proto::frame::MAX_BODY_LEN);
            }
            let frame = match endpoint.decoder.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => return FramesEnd::Drained,
                Err(e) => return FramesEnd::Close(format!("malformed stream: {e}")),
            };
            let started = metrics.start_timing();
            let sent = match core.client_frame(conn, frame, now) {
                ClientAction::Forward {
                    link,
                    head,
                    payload,
                } => match send_to_link(links, uplinks, link, &head, payload) {
                    Ok(queued) => {
                        if queued > LINK_OUT_HIGH_WATER {
                            *waiting_for = Some(link);
                        }
                        Ok(())
                    }
                    Err(e) => Err(e),
                },
                ClientAction::Reply(reply) => endpoint.send(reply.as_bytes(), &[]),
                ClientAction::ReplyAndClose(reply) => {
                    *closing = true;
                    endpoint.send(reply.as_bytes(), &[])
                }
                ClientAction::ConnectQp { connect, tag } => {
                    let reply = match roce.get_mut(*port).and_then(Option::as_mut) {
                        Some(roce_port) => roce_port.connect(core, conn, connect, tag),
                        None => proto::error_reply(
                            proto::Opcode::QpConnect,
                            tag,
                            proto::Status::Unsupported,
                        )
                        .to_vec(),
                    };
                    endpoint.send(&reply, &[])
                }
                ClientAction::Nothing => Ok(()),
                ClientAction::Close => return FramesEnd::Close("unframeable stream".into()),
            };
            if let Some(started) = started {
                metrics.observe_device_time(started.elapsed());
            }
            if let Err(e) = sent {
                return FramesEnd::Close(format!("write failed: {e}"));
            }
        }
    }

    fn close_client(&mut self, conn: ConnId, why: &str) {
        if let Some(mut client) = self.clients.remove(&conn) {
            self.admission.closed(conn);
            let _ = self.poll.registry().deregister(&mut client.endpoint.stream);
            if let Some(slot) = client.endpoint.ring_slot() {
                self.ring_slots.remove(&slot);
            }
            debug!("closed client connection {conn}: {why}");
            // A flood of connections must not flood the log: one line per
            // CLOSED_LOG_INTERVAL at most (the metrics count every close).
            self.closed_unlogged += 1;
            let since = self.closed_logged.elapsed();
            if since >= CLOSED_LOG_INTERVAL {
                info!(
                    "{} client connections closed in the last {} s; the last: {why}",
                    self.closed_unlogged,
                    since.as_secs()
                );
                self.closed_unlogged = 0;
                self.closed_logged = Instant::now();
            }
        }
        for port in self.roce.iter_mut().flatten() {
            port.control_closed(&mut self.core, conn);
        }
        self.core.client_closed(conn);
    }

    /// Resumes clients paused for backpressure that have room again.
    fn resume_paused(&mut self, now: Instant) {
        if self.paused.is_empty() {
            return;
        }
        for conn in std::mem::take(&mut self.paused) {
            let Some(client) = self.clients.get_mut(&conn) else {
                continue;
            };
            if let Some(link) = client.waiting_for
                && matches!(self.links.get(&link),
                    Some(LinkConn::Connected { endpoint }) if endpoint.pending_out() > LINK_OUT_LOW_WATER)
            {
                self.paused.push(conn);
                continue;
            }
            client.waiting_for = None;
            if self.core.client_has_room(conn)
                && client.endpoint.pending_out() <= CLIENT_OUT_HIGH_WATER
            {
                client.paused = false;
                self.serve_client(conn, now);
            } else {
                self.paused.push(conn);
            }
        }
    }

    /// Sends error replies produced by the core to their clients.
    fn deliver_all(&mut self, replies: Vec<(ConnId, Reply)>) {
        for (conn, reply) in replies {
            if Self::roce_deliver(&mut self.roce, conn, reply.as_bytes(), &[]) {
                continue;
            }
            if let Some(client) = self.clients.get_mut(&conn) {
                let _ = client.endpoint.send(reply.as_bytes(), &[]);
                mark_to_flush(&mut self.to_flush, conn, client);
            }
        }
    }

    /// Writes everything queued; closes clients that asked for it once
    /// their queue is empty, and clients whose socket failed. Links go
    /// first: the servers can start on their requests while the replies to
    /// clients are written.
    fn flush_all(&mut self, now: Instant) {
        let mut failed = Vec::new();
        for (link, conn) in &mut self.links {
            if let LinkConn::Connected { endpoint } = conn
                && let Err(e) = endpoint.flush()
            {
                failed.push((*link, e.to_string()));
            }
        }
        for (link, why) in failed {
            self.link_failed(link, now, &why);
        }
        let mut close = Vec::new();
        for conn in std::mem::take(&mut self.to_flush) {
            let Some(client) = self.clients.get_mut(&conn) else {
                continue;
            };
            client.to_flush = false;
            match client.endpoint.flush() {
                Ok(()) if client.closing && client.endpoint.pending_out() == 0 => {
                    close.push((conn, "refused".to_owned()));
                }
                // The socket took part: try again next turn.
                Ok(()) => mark_to_flush(&mut self.to_flush, conn, client),
                Err(e) => close.push((conn, format!("write failed: {e}"))),
            }
        }
        for (conn, why) in close {
            self.close_client(conn, &why);
        }
    }

    /// Starts connecting every link whose next attempt is due, and gives
    /// up on connects that take too long.
    fn connect_due_links(&mut self, now: Instant) {
        for link in self.reconnects.timed_out(now) {
            self.link_failed(link, now, "connect timed out");
        }
        for link in self.reconnects.due(now) {
            let Some(addr) = self
                .core
                .link_key(link)
                .and_then(|k| k.addr.parse::<SocketAddr>().ok())
            else {
                continue;
            };
            self.reconnects.connecting(link, now);
            let stream = TcpStream::connect(addr).and_then(|mut stream| {
                let _ = stream.set_nodelay(true);
                self.poll.registry().register(
                    &mut stream,
                    link_token(link),
                    Interest::READABLE | Interest::WRITABLE,
                )?;
                Ok(stream)
            });
            match stream {
                Ok(stream) => {
                    let endpoint = Endpoint::new(stream);
                    self.links.insert(link, LinkConn::Connecting { endpoint });
                }
                Err(e) => self.link_failed(link, now, &e.to_string()),
            }
        }
    }

    /// `link to SERVER/NIC (ADDR, LANE lane)`, for logs.
    fn link_name(&self, link: LinkId) -> Option<String> {
        let key = self.core.link_key(link)?;
        let lane = self.core.link_lane(link)?;
        Some(format!(
            "link to {}/{} ({}, {} lane)",
            key.server,
            key.nic,
            key.addr,
            lane.as_str()
        ))
    }

    /// A link broke: fail its requests, close it and schedule a reconnect.
    fn link_failed(&mut self, link: LinkId, now: Instant, why: &str) {
        let was_up = matches!(self.links.get(&link), Some(LinkConn::Connected { .. }));
        match self.links.insert(link, LinkConn::Idle) {
            Some(LinkConn::Connected { mut endpoint } | LinkConn::Connecting { mut endpoint }) => {
                let _ = self.poll.registry().deregister(&mut endpoint.stream);
                if let Some(slot) = endpoint.ring_slot() {
                    self.ring_slots.remove(&slot);
                }
            }
            Some(LinkConn::Idle) => {}
            None => {
                // Not a link of this device (any more).
                self.links.remove(&link);
                return;
            }
        }
        if let Some(name) = self.link_name(link) {
            if was_up {
                warn!("{name} down: {why}");
            } else {
                debug!("{name} not connected: {why}");
            }
        }
        self.uplinks.close(link);
        let failed = self.core.link_down(link);
        self.deliver_all(failed);
        self.reconnects.failed(link, now);
    }

    fn on_link_event(&mut self, link: LinkId, event: &Event, now: Instant) {
        if let Some(LinkConn::Connecting { endpoint, .. }) = self.links.get_mut(&link) {
            if !event.is_writable() {
                return;
            }
            let connected = match endpoint.stream.take_error() {
                Ok(None) => match endpoint.stream.peer_addr() {
                    Ok(_) => Ok(true),
                    Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
                    Err(e) => Err(e),
                },
                Ok(Some(e)) | Err(e) => Err(e),
            };
            match connected {
                Ok(false) => return,
                Ok(true) => {
                    let Some(LinkConn::Connecting { mut endpoint }) = self.links.remove(&link)
                    else {
                        return;
                    };
                    endpoint.note_event(event);
                    if let Io::Uring(ring) = &self.io {
                        // Connected: from now on the ring moves its bytes.
                        let _ = self.poll.registry().deregister(&mut endpoint.stream);
                        endpoint.attach(ring.shared());
                        if let Some(slot) = endpoint.ring_slot() {
                            self.ring_slots.insert(slot, Owner::Link(link));
                        }
                    }
                    if let Some(name) = self.link_name(link) {
                        info!("{name} connected");
                    }
                    self.reconnects.connected(link);
                    let hello = self.core.link_connected(link);
                    let sent = endpoint.send(&hello, &[]).and_then(|()| endpoint.flush());
                    self.links.insert(link, LinkConn::Connected { endpoint });
                    if let Err(e) = sent {
                        self.link_failed(link, now, &e.to_string());
                    }
                    return;
                }
                Err(e) => {
                    self.link_failed(link, now, &e.to_string());
                    return;
                }
            }
        }
        if let Some(LinkConn::Connected { endpoint }) = self.links.get_mut(&link) {
            endpoint.note_event(event);
        }
        self.serve_link(link, now);
    }

    /// Reads a link's responses and relays them to their clients.
    fn serve_link(&mut self, link: LinkId, now: Instant) {
        loop {
            let Some(LinkConn::Connected { endpoint }) = self.links.get_mut(&link) else {
                return;
            };
            if let Err(e) = endpoint.flush() {
                self.link_failed(link, now, &e.to_string());
                return;
            }
            // Servers are trusted peers: their answers are never held back.
            let fill = endpoint.fill(&mut |_| true);
            if let Some(why) = self.handle_link_frames(link, now) {
                self.link_failed(link, now, &why);
                return;
            }
            if let Err(why) = self.start_uplink(link) {
                self.link_failed(link, now, &why);
                return;
            }
            match fill {
                Fill::Full => continue,
                Fill::Drained | Fill::NotAdmitted => return,
                Fill::Closed => {
                    self.link_failed(link, now, "server closed the connection");
                    return;
                }
                Fill::Failed(why) => {
                    self.link_failed(link, now, &why);
                    return;
                }
            }
        }
    }

    /// For an up link to a `verbs` server NIC: keeps the queue pair's copy
    /// of the server's region keys current and, the first time, sends
    /// QP_CONNECT from the first RoCEv2 port. Returns why the link must
    /// close, if it must.
    fn start_uplink(&mut self, link: LinkId) -> Result<(), String> {
        if self.core.link_status(link) != Some(crate::forward::LinkStatus::Up) {
            return Ok(());
        }
        let Some(key) = self.core.link_key(link) else {
            return Ok(());
        };
        let verbs = self
            .config
            .topology
            .server(&key.server)
            .and_then(|s| s.nic(&key.nic))
            .is_some_and(|n| n.transport == topology::NicTransport::Verbs);
        if !verbs {
            return Ok(());
        }
        let server = key.server.clone();
        let layout = &self.core.map().layout;
        if !crate::uplink::one_sided(layout) {
            return Ok(());
        }
        for entry in layout.entries() {
            if entry.server == server {
                self.uplinks.set_region(entry.region, entry.key, entry.len);
            }
        }
        if self.uplinks.has(link) {
            return Ok(());
        }
        let Some((index, port)) = self
            .roce
            .iter()
            .enumerate()
            .find_map(|(i, p)| p.as_ref().map(|p| (i, p)))
        else {
            return Err("the server NIC is on verbs but this device has no RoCEv2 port".into());
        };
        let connect = self.uplinks.start(link, index, port.ip(), port.mtu());
        let Some(LinkConn::Connected { endpoint }) = self.links.get_mut(&link) else {
            return Ok(());
        };
        endpoint
            .send(&connect, &[])
            .map_err(|e| format!("write failed: {e}"))
    }

    /// Asks every link with a queue pair to a server on verbs for its
    /// server's region keys again, every [`VERBS_KEY_POLL`] (see
    /// [`Forwarder::refresh_keys_soon`]); the answer updates the keys the
    /// queue pairs check.
    fn poll_verbs_keys(&mut self, now: Instant) {
        if now < self.verbs_keys_polled + VERBS_KEY_POLL {
            return;
        }
        self.verbs_keys_polled = now;
        let links: Vec<LinkId> = self
            .links
            .keys()
            .copied()
            .filter(|l| self.uplinks.has(*l))
            .collect();
        for link in links {
            self.core.refresh_keys_soon(link);
            let Some(frame) = self.core.key_refresh(link) else {
                continue;
            };
            if let Some(LinkConn::Connected { endpoint }) = self.links.get_mut(&link)
                && let Err(e) = endpoint.send(&frame, &[])
            {
                self.link_failed(link, now, &format!("write failed: {e}"));
            }
        }
    }

    /// Relays what the queue pairs toward servers completed, and takes down
    /// the links whose queue pair broke.
    fn drain_uplinks(&mut self, now: Instant) {
        while let Some((link, frame)) = self.uplinks.poll_answer() {
            let Self {
                core,
                clients,
                to_flush,
                roce,
                ..
            } = self;
            match core.link_frame(link, &frame, now) {
                LinkAction::Deliver {
                    conn,
                    head,
                    payload,
                } => deliver_answer(roce, clients, to_flush, conn, &head, payload),
                LinkAction::Close(why) => self.link_failed(link, now, &why),
                LinkAction::Send(_) | LinkAction::Nothing => {}
            }
        }
        for (link, status) in self.uplinks.take_broken() {
            self.link_failed(
                link,
                now,
                &format!("its RDMA queue pair to the server failed ({status:?})"),
            );
        }
    }

    /// Hands every complete frame of a link to the core; returns why the
    /// link must close, if it must.
    fn handle_link_frames(&mut self, link: LinkId, now: Instant) -> Option<String> {
        let Self {
            core,
            clients,
            to_flush,
            links,
            metrics,
            roce,
            uplinks,
            ..
        } = self;
        let Some(LinkConn::Connected { endpoint }) = links.get_mut(&link) else {
            return None;
        };
        loop {
            let frame = match endpoint.decoder.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => {
                    // A refusal in this batch may call for the server's
                    // keys again.
                    let refresh = core.key_refresh(link)?;
                    return endpoint
                        .send(&refresh, &[])
                        .err()
                        .map(|e| format!("write failed: {e}"));
                }
                Err(e) => return Some(format!("malformed stream from server: {e}")),
            };
            if let Ok(header) = proto::frame::Header::parse(frame)
                && header.tag == QP_CONNECT_TAG
            {
                if let Err(why) = uplink_answer(uplinks, link, frame) {
                    warn!(
                        "link {}: no RDMA queue pair, requests stay on TCP: {why}",
                        link.0
                    );
                }
                continue;
            }
            let started = metrics.start_timing();
            match core.link_frame(link, frame, now) {
                LinkAction::Deliver {
                    conn,
                    head,
                    payload,
                } => deliver_answer(roce, clients, to_flush, conn, &head, payload),
                LinkAction::Send(bytes) => {
                    if let Err(e) = endpoint.send(&bytes, &[]) {
                        return Some(format!("write failed: {e}"));
                    }
                }
                LinkAction::Nothing => {}
                LinkAction::Close(why) => return Some(why),
            }
            if let Some(started) = started {
                metrics.observe_device_time(started.elapsed());
            }
        }
    }
}

/// Sends a request the core wrote for `link`: as work requests on the
/// link's RDMA queue pair when it can carry them, else on its TCP
/// connection. Returns the bytes the TCP connection has queued (0 when the
/// link is not connected: the core answers the request at its timeout).
fn send_to_link(
    links: &mut IdMap<LinkId, LinkConn>,
    uplinks: &mut Uplinks,
    link: LinkId,
    head: &[u8],
    payload: &[u8],
) -> io::Result<usize> {
    let Some(LinkConn::Connected { endpoint }) = links.get_mut(&link) else {
        return Ok(0);
    };
    if !uplinks.try_post(link, head, payload) {
        endpoint.send(head, payload)?;
    }
    Ok(endpoint.pending_out())
}

/// The server's answer to the QP_CONNECT the device sent on `link`.
fn uplink_answer(uplinks: &mut Uplinks, link: LinkId, frame: &[u8]) -> Result<(), String> {
    let outcome = match proto::parse_frame(frame) {
        Ok((proto::Message::QpAccept(accept), _)) => uplinks.accepted(link, &accept),
        Ok((proto::Message::Response(r), _)) => Err(format!("the server refused it: {}", r.status)),
        Ok((other, _)) => Err(format!("unexpected answer {:?}", other.opcode())),
        Err(e) => Err(format!("malformed answer: {e}")),
    };
    if outcome.is_err() {
        uplinks.close(link);
    }
    outcome
}

/// How handling a client's buffered frames ended.
#[derive(Debug)]
enum FramesEnd {
    /// Every complete frame was handled.
    Drained,
    /// Backpressure: stop reading this client for now.
    Paused,
    /// Close the connection.
    Close(String),
}

/// Hands a server's answer to whoever asked: a queue pair's gateway, or a
/// client connection (listed in `to_flush`).
fn deliver_answer(
    roce: &mut [Option<RoceEndpoint>],
    clients: &mut IdMap<ConnId, ClientConn>,
    to_flush: &mut Vec<ConnId>,
    conn: ConnId,
    head: &[u8],
    payload: &[u8],
) {
    if Device::roce_deliver(roce, conn, head, payload) {
        // A queue pair's operation: its gateway answered it.
    } else if let Some(client) = clients.get_mut(&conn) {
        let _ = client.endpoint.send(head, payload);
        mark_to_flush(to_flush, conn, client);
    }
}

/// Lists `client` in `to_flush` once, if it has bytes queued.
fn mark_to_flush(to_flush: &mut Vec<ConnId>, conn: ConnId, client: &mut ClientConn) {
    if !client.to_flush && client.endpoint.pending_out() > 0 {
        client.to_flush = true;
        to_flush.push(conn);
    }
}

pub use telemetry::logging::error_chain;
