//! The event loop around the forwarding core: client ports, server links
//! with reconnect and backoff, the admin endpoint, signals.
//!
//! One thread owns every socket and the [`Forwarder`]; mio tells it which
//! sockets are ready. Each turn it reads what is there, lets the core decide,
//! queues or writes the results, answers timeouts, reconnects links whose
//! backoff has passed and flushes what is queued.

mod admission;
pub mod backend;
mod client_keys;
mod clients;
mod copy_streams;
mod endpoint;
mod links;
mod mapping;
mod packet;
mod packet_ring;
mod reload;
mod replication;
mod resync;
mod ring_events;
pub mod roce_io;
mod roce_port;
mod takeover;
mod uplinks;
mod xdp;

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

use crate::forward::{
    ClientAction, ConnId, Forwarder, ForwarderConfig, LinkAction, LinkId, Offload, Reply,
};
use crate::housekeeping::Gate;
use crate::idmap::IdMap;
use crate::map::{DeviceMap, MapError};
use crate::metrics::DeviceMetrics;
use crate::rdma::metrics::RoceMetrics;
use crate::rdma::uplink::{Posting, QP_CONNECT_TAG, Uplinks};
use crate::reconnect::{ReconnectPolicy, Reconnects};
use admission::{Admission, Verdict};
use backend::uring::{self, Completion, Op, Receive};
use backend::{Backend, IoConfig, Selected};
pub use client_keys::ClientKeyError;
use client_keys::ClientKeys;
use clients::deliver_answer;
use endpoint::{Endpoint, Fill};
use links::send_to_link;
use ring_events::start_io;
use roce_io::RoceIo;
use roce_port::RoceEndpoint;
pub use roce_port::RocePortError;
use uplinks::uplink_answer;

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
    /// How the RoCEv2 ports move frames.
    pub roce_io: roce_io::RoceIoConfig,
}

/// The event loop's back end for the TCP ports and server links.
#[derive(Debug)]
enum Io {
    /// Readiness from the mio poll; reads and writes are system calls.
    Epoll,
    /// Completions from the ring; the mio poll (signals, waker, RoCEv2,
    /// connects in progress) is watched by it.
    Uring(Box<uring::Ring>),
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
    /// A client's key file exists and cannot be used.
    #[error("--secrets")]
    ClientKey(#[from] ClientKeyError),
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
    /// Replicated regions' requests to each copy, one ordered stream per
    /// link across its queue pair and its TCP connection.
    copy_streams: copy_streams::CopyStreams,
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
    /// On etcd: marks the copies of replicated regions this device lost.
    copy_marker: Option<replication::CopyMarker>,
    /// Probes of suspected owners, and takeovers of their regions.
    takeovers: takeover::Takeovers,
    /// When the reports of the marker and probe threads are taken: after
    /// one of them woke the loop, or one was started.
    reports: Gate,
    /// The core's replication outbox of the last turn, emptied: traded
    /// for the core's each turn so that neither allocates anew.
    outbox: Vec<crate::forward::Outgoing>,
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
        let (io, selected) = start_io(config.io);
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
        let roce_paths = registry.gauge_family(
            "fabric_device_roce_io",
            "1 for the frame path each RoCEv2 port runs (packet-ring: PACKET_MMAP rings; \
             socket: recvmmsg/sendmmsg); fallback says why the rings were asked for and do not \
             run (none).",
            &["port", "path", "fallback"],
        )?;
        let mut listeners = Vec::new();
        let mut roce = Vec::new();
        for (i, port) in spec.ports.iter().enumerate() {
            roce.push(match &port.roce {
                Some(r) => {
                    let (endpoint, fallback) =
                        RoceEndpoint::open(r, &config.roce_io).map_err(|source| {
                            DeviceError::Roce {
                                port: port.id.clone(),
                                source,
                            }
                        })?;
                    match &fallback {
                        Some(refused) => warn!(
                            "RoCE port {} on {}: frame path {} ({} was asked for and cannot run: \
                             {}; `--roce-io {}` says so without this line)",
                            port.id,
                            r.interface,
                            endpoint.io_description(),
                            refused.asked,
                            error_chain(&*refused.why),
                            endpoint.io_path()
                        ),
                        None => info!(
                            "RoCE port {} on {}: frame path {}",
                            port.id,
                            r.interface,
                            endpoint.io_description()
                        ),
                    }
                    roce_paths
                        .with(&[
                            port.id.as_str(),
                            endpoint.io_path().as_str(),
                            match fallback.as_ref().map(|f| f.asked) {
                                Some(RoceIo::Xdp) => "xdp_refused",
                                Some(_) => "ring_refused",
                                None => "none",
                            },
                        ])
                        .set(1);
                    for fd in endpoint.sources() {
                        poll.registry()
                            .register(
                                &mut mio::unix::SourceFd(&fd),
                                Token(ROCE_BASE + i),
                                Interest::READABLE,
                            )
                            .map_err(DeviceError::Poll)?;
                    }
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
            let clients = ClientKeys::read(dir, &config.topology).all_usable()?;
            info!(
                "authentication on: links prove this device's key, clients prove theirs ({} keys from {})",
                clients.keys.len(),
                dir.display()
            );
            for (client, file) in &clients.missing {
                info!(
                    "client {client} cannot connect: no key file {}",
                    file.display()
                );
            }
            core.require_client_keys(clients.keys);
        }
        let now = Instant::now();
        let mut reconnects = Reconnects::new(ReconnectPolicy {
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
            copy_streams: copy_streams::CopyStreams::default(),
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
            copy_marker: None,
            takeovers: takeover::Takeovers::new(),
            reports: Gate::default(),
            outbox: Vec::new(),
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
            self.carry_out_replication(now);
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

    /// Handles one batch of readiness events.
    fn dispatch(&mut self, events: &Events, signals: &mut Signals, now: Instant) {
        for event in events.iter() {
            match event.token() {
                SIGNALS => {
                    for signal in signals.pending() {
                        self.on_signal(signal);
                    }
                }
                MAP_WAKE => {
                    // The map watcher, or a marker or probe thread with
                    // its report.
                    self.reports.mark();
                    self.apply_watched_map();
                }
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
}

pub use telemetry::logging::error_chain;
