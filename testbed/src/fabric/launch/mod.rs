//! Starting every daemon of a topology as a real process, watching them,
//! killing and restarting them on purpose, and stopping them cleanly.
//!
//! The daemons run from the testbed's own executable (`testbed daemon
//! pmem-server …`, `testbed daemon fabric-device …`), which links both
//! daemons' libraries: one binary to build, and every daemon still a
//! separate process. In netns mode each runs inside its host's namespace.
//!
//! A topology with `[pool.allocator]` gets its pool formatted once the
//! daemons are ready, on the first start only ([`Fabric::start`]).
//!
//! - `error`: why a fabric could not be brought up or managed ([`LaunchError`]).
//! - `process`: a daemon's ready line, its log's tail, its stop.
//! - `faults`: a daemon killed and restarted, a link cut and restored.
//! - `map_changes`: a held-back daemon added to the map on etcd, a device removed.
//! - `supervision`: the daemons that exited on their own, for `testbed up`.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use pmem_client::{AllocError, Allocator, AsyncPool, error_chain};
use topology::Topology;

pub use crate::fabric::daemon_kind::DaemonKind;
use crate::fabric::etcd::{Control, EtcdControl, EtcdReach, Reacher};
use crate::fabric::membership::HeldBack;
use crate::fabric::netns::{self, NetPlan, NetnsGuard};
use crate::lab::LabNet;
use crate::lab::guest_server::{GuestPaths, GuestServer, guest_address};

mod error;
mod faults;
mod map_changes;
mod process;
mod supervision;

pub use error::LaunchError;
pub use map_changes::MapChange;
pub use process::log_tail;
pub use supervision::Exited;

use process::{terminate, wait_or_kill, wait_ready};

/// How hosts are networked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NetMode {
    /// Every host on its own loopback address (as the topology gives them).
    #[default]
    Loopback,
    /// Every host in its own network namespace, links as veth pairs.
    Netns,
    /// The RDMA lab: daemons in the lab's namespace, each client in a QEMU
    /// guest with a kernel RDMA stack on the lab's bridge (see [`crate::lab`]).
    Lab,
}

/// How to bring a fabric up.
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// Loopback or namespaces.
    pub net: NetMode,
    /// Region files go to `data_dir/<server>`.
    pub data_dir: PathBuf,
    /// The effective topology and daemon logs go here.
    pub run_dir: PathBuf,
    /// The executable with the `daemon` subcommand (the testbed itself).
    pub program: PathBuf,
    /// Extra flags for every fabric device.
    pub device_args: Vec<String>,
    /// How long a daemon may take to report ready and a device to bring
    /// its links up.
    pub ready_timeout: Duration,
    /// Where the principals' keys come from (fresh ones by default).
    pub keys: Keys,
    /// Start every pmem-server with `--format` the first time (its regions
    /// recreated empty, their data lost); a restart never formats.
    pub format: bool,
    /// Where the daemons take their map from (the topology file by
    /// default; a real etcd started with the fabric otherwise).
    pub control: Control,
    /// A daemon of this kind is kept out of the first map and not started,
    /// to be added under the workload ([`Fabric::admit_held`]; needs
    /// `--control etcd`).
    pub hold_back: Option<DaemonKind>,
}

/// Where a fabric's keys come from. With keys every daemon gets
/// `--secrets` and every client proves its key; without, every daemon
/// runs `--insecure`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Keys {
    /// A fresh key for every client and device of the topology and for the
    /// operator, made at start into `run_dir/secrets` (see [`crate::fabric::keys`]).
    #[default]
    Fresh,
    /// The keys in this folder.
    Folder(PathBuf),
    /// No keys: the daemons run `--insecure` (for comparisons only).
    Insecure,
}

impl LaunchOptions {
    /// Options for a fabric on loopback, run by this executable.
    pub fn new(data_dir: PathBuf, run_dir: PathBuf) -> Result<Self, LaunchError> {
        Ok(Self {
            net: NetMode::Loopback,
            data_dir,
            run_dir,
            program: std::env::current_exe().map_err(LaunchError::Io)?,
            device_args: vec![
                "--request-timeout-ms".into(),
                "2000".into(),
                "--reconnect-min-ms".into(),
                "20".into(),
                "--reconnect-max-ms".into(),
                "500".into(),
            ],
            ready_timeout: Duration::from_secs(30),
            keys: Keys::Fresh,
            format: false,
            control: Control::File,
            hold_back: None,
        })
    }
}

/// What [`Fabric::start`] found of the pool's allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocatorState {
    /// The pool was not formatted; the testbed formatted it.
    Formatted,
    /// The pool was formatted already (its data is kept).
    AlreadyFormatted,
}

/// One running daemon.
#[derive(Debug)]
struct Daemon {
    child: Child,
    fields: BTreeMap<String, String>,
    args: Vec<OsString>,
    log: PathBuf,
    /// A server in a lab guest of its own: how to boot it, cut its power
    /// and stop it.
    guest: Option<GuestServer>,
}

/// A row of the endpoint table `testbed up` prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Which daemon.
    pub kind: DaemonKind,
    /// Its id.
    pub id: String,
    /// Data addresses (`nic.n0=…` / `port.p0=…`).
    pub data: Vec<(String, String)>,
    /// Admin address.
    pub admin: String,
    /// Region files (servers).
    pub data_dir: Option<PathBuf>,
    /// Network namespace (netns mode).
    pub namespace: Option<String>,
}

/// A running fabric: every pmem-server and fabric device of a topology.
#[derive(Debug)]
pub struct Fabric {
    /// The topology as the daemons run it (addresses rewritten in netns mode).
    pub topology: Topology,
    /// Where that topology was written.
    pub topology_path: PathBuf,
    options: LaunchOptions,
    daemons: BTreeMap<(DaemonKind, String), Daemon>,
    net: Option<(NetPlan, NetnsGuard)>,
    /// The lab's network (lab mode).
    lab: Option<LabNet>,
    /// The allocator's state after start, when the pool has one.
    pub allocator: Option<AllocatorState>,
    /// The folder of the principals' keys (absolute); `None`: insecure.
    secrets: Option<PathBuf>,
    /// The control plane, with `--control etcd`.
    etcd: Option<EtcdControl>,
    /// The daemon kept out of the first map, until it is admitted.
    held: Option<HeldBack>,
    /// The membership changes made so far.
    changes: Vec<map_changes::MapChange>,
}

/// How long a server in a lab guest may take to boot and report ready
/// (the first boot makes its namespaces and filesystems, under emulation).
const GUEST_READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a server in a lab guest may take to drain and power off.
const GUEST_STOP_TIMEOUT: Duration = Duration::from_secs(30);

impl Fabric {
    /// Starts every server, then every fabric device, and waits until each
    /// reports ready and every device's links are up. A pool with an
    /// allocator is then formatted if it is not yet, and one line says so.
    pub fn start(topology: &Topology, options: LaunchOptions) -> Result<Self, LaunchError> {
        topology.validate()?;
        std::fs::create_dir_all(options.run_dir.join("logs")).map_err(LaunchError::Io)?;
        let (topology, net, lab) = match options.net {
            NetMode::Loopback => (topology.clone(), None, None),
            NetMode::Netns => {
                netns::require_root()?;
                let prefix = netns::fresh_prefix()?;
                // On etcd, clients open the pool there: they need a link
                // to it as the daemons do.
                let management = match options.control {
                    Control::File => netns::Management::Daemons,
                    Control::Etcd { .. } => netns::Management::DaemonsAndClients,
                };
                let (plan, rewritten) = netns::plan_managing(topology, &prefix, management)?;
                let guard = netns::apply(&plan)?;
                (rewritten, Some((plan, guard)), None)
            }
            NetMode::Lab => (topology.clone(), None, Some(LabNet::enter()?)),
        };
        let (whole, topology, held) = match options.hold_back {
            None => (topology.clone(), topology, None),
            Some(kind) if options.control == Control::File => {
                return Err(LaunchError::HoldBackNeedsEtcd(kind));
            }
            Some(kind) => {
                let first = crate::fabric::membership::hold_back(&topology, kind)?;
                (topology, first.topology, Some(first.held))
            }
        };
        let topology_path = options.run_dir.join("topology.toml");
        let mut text = toml::to_string(&topology)?;
        text.insert_str(
            0,
            "# The topology as this run's daemons use it (written by testbed).\n",
        );
        std::fs::write(&topology_path, &text).map_err(LaunchError::Io)?;
        let etcd = match options.control {
            Control::File => None,
            Control::Etcd { .. } if options.net == NetMode::Lab => {
                return Err(LaunchError::EtcdNeedsLoopback);
            }
            Control::Etcd { members } => Some(EtcdControl::start(
                &whole,
                &text,
                members,
                &options.run_dir,
                &net.as_ref()
                    .map(|(plan, _)| etcd_reach(plan))
                    .unwrap_or_default(),
            )?),
        };
        let secrets = match &options.keys {
            Keys::Fresh => {
                let dir = std::path::absolute(options.run_dir.join("secrets"))
                    .map_err(LaunchError::Io)?;
                // The held-back daemon's key too: it starts later.
                crate::fabric::keys::generate(&whole, &dir)?;
                Some(dir)
            }
            Keys::Folder(dir) => Some(std::path::absolute(dir).map_err(LaunchError::Io)?),
            Keys::Insecure => None,
        };
        let mut fabric = Self {
            topology: topology.clone(),
            topology_path,
            options,
            daemons: BTreeMap::new(),
            net,
            lab,
            allocator: None,
            secrets,
            etcd,
            held,
            changes: Vec::new(),
        };
        let servers: Vec<String> = topology.servers.iter().map(|s| s.id.to_string()).collect();
        let devices: Vec<String> = topology
            .fabric_devices
            .iter()
            .map(|d| d.id.to_string())
            .collect();
        for id in &servers {
            fabric.spawn(DaemonKind::PmemServer, id)?;
        }
        for id in &servers {
            fabric.await_ready(DaemonKind::PmemServer, id)?;
        }
        for id in &devices {
            fabric.spawn(DaemonKind::FabricDevice, id)?;
        }
        for id in &devices {
            fabric.await_ready(DaemonKind::FabricDevice, id)?;
        }
        fabric.allocator = fabric.format_if_needed()?;
        if let Some(state) = fabric.allocator {
            let pool = &fabric.topology.pool.name;
            match state {
                AllocatorState::Formatted => {
                    println!("allocator: formatted pool {pool:?} (first start)");
                }
                AllocatorState::AlreadyFormatted => {
                    println!("allocator: pool {pool:?} already formatted, its data kept");
                }
            }
        }
        Ok(fabric)
    }

    /// With `[pool.allocator]`: attaches as the first client (inside its
    /// namespace in netns mode) and formats the pool if it is not
    /// formatted. A pool formatted for another layout is an error, not
    /// reformatted.
    fn format_if_needed(&self) -> Result<Option<AllocatorState>, LaunchError> {
        let (Some(_), Some(client)) =
            (&self.topology.pool.allocator, self.topology.clients.first())
        else {
            return Ok(None);
        };
        let client = client.id.to_string();
        self.as_client(&client, |pool| async move {
            match Allocator::attach(pool.clone()).await {
                Ok(_) => Ok(AllocatorState::AlreadyFormatted),
                Err(AllocError::NotFormatted { .. }) => {
                    match Allocator::format(pool, false).await {
                        Ok(_) => Ok(AllocatorState::Formatted),
                        // Someone formatted it in between.
                        Err(AllocError::AlreadyFormatted { .. }) => {
                            Ok(AllocatorState::AlreadyFormatted)
                        }
                        Err(e) => Err(error_chain(&e)),
                    }
                }
                Err(e) => Err(error_chain(&e)),
            }
        })
        .map(Some)
        .map_err(|why| LaunchError::Allocator {
            pool: self.topology.pool.name.clone(),
            client,
            why,
        })
    }

    /// Connects to the pool as `client` (inside its namespace in netns
    /// mode) on a runtime of its own and runs `work` with that pool; any
    /// failure comes back as its message. On etcd the pool follows the map
    /// there, as the workers' pools do (a region taken over by another
    /// device is asked of its new owner, not of the topology's).
    pub fn as_client<T, F, Fut>(&self, client: &str, work: F) -> Result<T, String>
    where
        T: Send,
        F: FnOnce(AsyncPool) -> Fut + Send,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let topology = self.host_side(self.topology.clone());
        let as_client = client.to_owned();
        let secrets = self.secrets.clone();
        let on_etcd = self.etcd().and_then(|etcd| etcd.client_source(client));
        let connect_and_work = move || -> Result<T, String> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start a runtime: {e}"))?;
            runtime.block_on(async move {
                let mut builder = match on_etcd {
                    Some((endpoints, pool, credentials)) => {
                        AsyncPool::builder_on_etcd(endpoints, &pool, as_client.as_str())
                            .etcd_credentials(credentials)
                    }
                    None => AsyncPool::builder(topology, as_client.as_str()),
                };
                if let Some(dir) = secrets {
                    builder = builder.secrets(dir);
                }
                let pool = builder.connect_async().await.map_err(|e| error_chain(&e))?;
                work(pool).await
            })
        };
        match self.client_namespace(client) {
            Some(ns) => {
                netns::in_namespace(&ns, connect_and_work).unwrap_or_else(|e| Err(error_chain(&e)))
            }
            None => connect_and_work(),
        }
    }

    fn namespace(&self, kind: DaemonKind, id: &str) -> Option<String> {
        let (plan, _) = self.net.as_ref()?;
        let host = match kind {
            DaemonKind::PmemServer => netns::HostKind::Server,
            DaemonKind::FabricDevice => netns::HostKind::FabricDevice,
        };
        plan.namespace_of(host, id).map(str::to_owned)
    }

    /// The namespace a client runs in (netns mode).
    pub fn client_namespace(&self, client: &str) -> Option<String> {
        let (plan, _) = self.net.as_ref()?;
        plan.namespace_of(netns::HostKind::Client, client)
            .map(str::to_owned)
    }

    /// A command running `program` as this fabric's client `client` (inside
    /// its namespace in netns mode, in a lab guest that sees `shares` in lab
    /// mode).
    ///
    /// With keys, the client finds its own in the folder named by
    /// `PMEM_FABRIC_SECRETS`; a lab guest gets a folder holding only its
    /// client's key (never the devices' keys), shared into the guest.
    pub fn client_command(&self, client: &str, program: &Path, shares: &[&Path]) -> Command {
        let Some(lab) = &self.lab else {
            let mut command = match self.client_namespace(client) {
                Some(ns) => netns::command_in(&ns, program),
                None => Command::new(program),
            };
            if let Some(dir) = &self.secrets {
                command.env(pmem_client::pool::SECRETS_ENV, dir);
            }
            return command;
        };
        let console = self.guest_console(client);
        match self.guest_secrets(client) {
            Ok(Some(dir)) => {
                let mut all = shares.to_vec();
                all.push(&dir);
                let env = [(pmem_client::pool::SECRETS_ENV, dir.as_os_str())];
                lab.guest_command_with_env(program, &all, &console, &env)
            }
            Ok(None) => lab.guest_command(program, shares, &console),
            Err(e) => {
                // The client runs without its key and is refused; say why.
                tracing::warn!("no key folder for lab guest {client}: {e}");
                lab.guest_command(program, shares, &console)
            }
        }
    }

    /// With keys: a folder holding a copy of `client`'s key only (owner
    /// read/write), for a lab guest.
    fn guest_secrets(&self, client: &str) -> std::io::Result<Option<PathBuf>> {
        use std::os::unix::fs::PermissionsExt;
        let Some(secrets) = &self.secrets else {
            return Ok(None);
        };
        let name = topology::secrets::Principal::Client(client).file_name();
        let dir = self.options.run_dir.join("guest-keys").join(client);
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        let to = dir.join(&name);
        std::fs::copy(secrets.join(&name), &to)?;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600))?;
        Ok(Some(dir))
    }

    /// Where a lab guest's console is copied.
    pub fn guest_console(&self, client: &str) -> PathBuf {
        self.options
            .run_dir
            .join("logs")
            .join(format!("guest-{client}.log"))
    }

    /// The folder of the principals' keys the daemons require (clients
    /// find theirs there, e.g. through `PMEM_FABRIC_SECRETS`); `None` when
    /// the fabric runs `--insecure`.
    pub fn secrets(&self) -> Option<&Path> {
        self.secrets.as_deref()
    }

    /// The control plane, with `--control etcd`.
    pub fn etcd(&self) -> Option<&EtcdControl> {
        self.etcd.as_ref()
    }

    /// The control plane, to break and restore it.
    pub fn etcd_mut(&mut self) -> Option<&mut EtcdControl> {
        self.etcd.as_mut()
    }

    /// Whether the clients run in lab guests.
    pub fn is_lab(&self) -> bool {
        self.lab.is_some()
    }

    /// The topology as a client on this host uses it: in lab mode the
    /// clients' RoCE RNICs live in guests, so the host reaches the same
    /// device ports over TCP (set-up and checks, not the workload).
    fn host_side(&self, mut topology: Topology) -> Topology {
        if self.lab.is_some() {
            for rnic in topology.clients.iter_mut().flat_map(|c| c.rnics.iter_mut()) {
                rnic.transport = topology::RnicTransport::Tcp;
                rnic.local_addr = None;
            }
        }
        topology
    }

    /// The admin address a daemon should use: the topology's, or any port.
    fn admin_addr(&self, kind: DaemonKind, id: &str) -> String {
        let given = match kind {
            DaemonKind::PmemServer => self
                .topology
                .server(&id.into())
                .and_then(|s| s.admin.clone()),
            DaemonKind::FabricDevice => self
                .topology
                .fabric_device(&id.into())
                .and_then(|d| d.admin.clone()),
        };
        given.unwrap_or_else(|| "127.0.0.1:0".to_owned())
    }

    fn spawn(&mut self, kind: DaemonKind, id: &str) -> Result<(), LaunchError> {
        if kind == DaemonKind::PmemServer
            && let Some(guest) = self.guest_server(id)?
        {
            return self.launch_guest(id, guest);
        }
        let mut args: Vec<OsString> = vec!["daemon".into(), kind.program().into()];
        match &self.etcd {
            Some(etcd) => args.extend(etcd.daemon_args(kind, id)),
            None => args.extend(["--config".into(), self.topology_path.clone().into()]),
        }
        match kind {
            DaemonKind::PmemServer => {
                args.extend(["--server".into(), id.into(), "--data-dir".into()]);
                args.push(self.options.data_dir.join(id).into());
            }
            DaemonKind::FabricDevice => {
                args.extend(["--device".into(), id.into()]);
                args.extend(self.options.device_args.iter().map(OsString::from));
            }
        }
        args.extend(["--admin".into(), self.admin_addr(kind, id).into()]);
        match &self.secrets {
            Some(dir) => args.extend(["--secrets".into(), dir.clone().into_os_string()]),
            None => args.push("--insecure".into()),
        }
        if kind == DaemonKind::PmemServer && self.options.format {
            // Formatting is for the first start only: a restart keeps the
            // data, so the arguments kept for it go without the flag.
            let mut first = args.clone();
            first.push("--format".into());
            self.launch(kind, id, first)?;
            self.daemon_mut(kind, id)?.args = args;
            return Ok(());
        }
        self.launch(kind, id, args)
    }

    /// In lab mode, a server whose NICs listen on the lab's bridge runs in
    /// a guest of its own: its boot material.
    fn guest_server(&self, id: &str) -> Result<Option<GuestServer>, LaunchError> {
        if self.lab.is_none() {
            return Ok(None);
        }
        let Some(server) = self.topology.server(&id.into()) else {
            return Ok(None);
        };
        let Some(ip) = guest_address(server) else {
            return Ok(None);
        };
        let mut args = vec![
            "--admin".to_owned(),
            self.admin_addr(DaemonKind::PmemServer, id),
        ];
        match &self.secrets {
            Some(dir) => args.extend(["--secrets".to_owned(), dir.display().to_string()]),
            None => args.push("--insecure".to_owned()),
        }
        let data_dir = self.options.data_dir.join(id);
        let paths = GuestPaths {
            program: &self.options.program,
            topology: &self.topology_path,
            data_dir: &data_dir,
            run_dir: &self.options.run_dir,
            secrets: self.secrets.as_deref(),
        };
        Ok(Some(GuestServer::prepare(
            &self.topology,
            server,
            ip,
            paths,
            &args,
        )?))
    }

    /// Boots `guest`, whose console carries the server's ready line.
    fn launch_guest(&mut self, id: &str, guest: GuestServer) -> Result<(), LaunchError> {
        let Some(lab) = &self.lab else {
            return Ok(());
        };
        // The server logs to the guest's console; guest.sh's own complaints
        // go to a file of their own.
        let stderr = self
            .options
            .run_dir
            .join("logs")
            .join(format!("guest-server-{id}.stderr.log"));
        let log = guest.console().to_owned();
        let command = guest.command(lab);
        self.start_daemon(
            (DaemonKind::PmemServer, id),
            command,
            &stderr,
            log,
            Vec::new(),
            Some(guest),
        )
    }

    fn launch(
        &mut self,
        kind: DaemonKind,
        id: &str,
        args: Vec<OsString>,
    ) -> Result<(), LaunchError> {
        let log = self
            .options
            .run_dir
            .join("logs")
            .join(format!("{}-{id}.log", kind.program()));
        let mut command = match self.namespace(kind, id) {
            Some(ns) => netns::command_in(&ns, &self.options.program),
            None => Command::new(&self.options.program),
        };
        command.args(&args);
        let stderr = log.clone();
        self.start_daemon((kind, id), command, &stderr, log, args, None)
    }

    /// Spawns `command` as daemon `kind` `id`: stdout piped (its ready
    /// line), stderr appended to `stderr`; `log` is where its log is read.
    fn start_daemon(
        &mut self,
        (kind, id): (DaemonKind, &str),
        mut command: Command,
        stderr: &Path,
        log: PathBuf,
        args: Vec<OsString>,
        guest: Option<GuestServer>,
    ) -> Result<(), LaunchError> {
        let log_file = File::options()
            .create(true)
            .append(true)
            .open(stderr)
            .map_err(LaunchError::Io)?;
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file))
            .spawn()
            .map_err(LaunchError::Io)?;
        self.daemons.insert(
            (kind, id.to_owned()),
            Daemon {
                child,
                fields: BTreeMap::new(),
                args,
                log,
                guest,
            },
        );
        Ok(())
    }

    fn daemon_mut(&mut self, kind: DaemonKind, id: &str) -> Result<&mut Daemon, LaunchError> {
        self.daemons
            .get_mut(&(kind, id.to_owned()))
            .ok_or_else(|| LaunchError::Unknown {
                kind,
                id: id.to_owned(),
            })
    }

    fn await_ready(&mut self, kind: DaemonKind, id: &str) -> Result<(), LaunchError> {
        let daemon = self.daemon_mut(kind, id)?;
        // A guest boots (and the first time makes its namespaces) first.
        let timeout = if daemon.guest.is_some() {
            GUEST_READY_TIMEOUT
        } else {
            self.options.ready_timeout
        };
        let daemon = self.daemon_mut(kind, id)?;
        match wait_ready(&mut daemon.child, timeout) {
            Ok(fields) => daemon.fields = fields,
            Err(why) => {
                let tail = match &daemon.guest {
                    Some(guest) => guest.console_tail(8),
                    None => log_tail(&daemon.log, 5),
                };
                return Err(LaunchError::NotReady {
                    kind,
                    id: id.to_owned(),
                    why: format!("{why}; last log lines:\n{tail}"),
                    log: daemon.log.display().to_string(),
                });
            }
        }
        if kind == DaemonKind::FabricDevice {
            self.await_links(id)?;
        }
        Ok(())
    }

    /// Waits until a device reports every one of its links up.
    fn await_links(&self, id: &str) -> Result<(), LaunchError> {
        let links = self
            .topology
            .fabric_device(&id.into())
            .map_or(0, |d| d.links.len());
        let admin = self.admin(DaemonKind::FabricDevice, id)?;
        let deadline = Instant::now() + self.options.ready_timeout;
        loop {
            let up = telemetry::http_get(admin, "/metrics", Duration::from_secs(2))
                .map(|(_, text)| {
                    text.lines()
                        .filter(|l| l.starts_with("fabric_device_link_up{") && l.ends_with(" 1"))
                        .count()
                })
                .unwrap_or(0);
            if up >= links {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(LaunchError::NotReady {
                    kind: DaemonKind::FabricDevice,
                    id: id.to_owned(),
                    why: format!("only {up} of {links} links up"),
                    log: self.log_path(DaemonKind::FabricDevice, id),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_path(&self, kind: DaemonKind, id: &str) -> String {
        self.daemons
            .get(&(kind, id.to_owned()))
            .map_or_else(String::new, |d| d.log.display().to_string())
    }

    /// A daemon's admin address.
    pub fn admin(&self, kind: DaemonKind, id: &str) -> Result<SocketAddr, LaunchError> {
        self.daemons
            .get(&(kind, id.to_owned()))
            .and_then(|d| d.fields.get("admin"))
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| LaunchError::Unknown {
                kind,
                id: id.to_owned(),
            })
    }

    /// Every daemon's addresses, for the table `testbed up` prints.
    pub fn endpoints(&self) -> Vec<Endpoint> {
        self.daemons
            .iter()
            .map(|((kind, id), d)| Endpoint {
                kind: *kind,
                id: id.clone(),
                data: d
                    .fields
                    .iter()
                    .filter(|(k, _)| k.starts_with("nic.") || k.starts_with("port."))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                admin: d.fields.get("admin").cloned().unwrap_or_default(),
                data_dir: (*kind == DaemonKind::PmemServer).then(|| self.options.data_dir.join(id)),
                namespace: self.namespace(*kind, id),
            })
            .collect()
    }

    /// A running daemon's process id.
    pub fn pid(&self, kind: DaemonKind, id: &str) -> Option<u32> {
        self.daemons
            .get(&(kind, id.to_owned()))
            .map(|d| d.child.id())
    }

    /// A daemon's field from its ready line (`nic.n0`, `port.p0`, `admin`).
    pub fn ready_field(&self, kind: DaemonKind, id: &str, field: &str) -> Option<&str> {
        self.daemons
            .get(&(kind, id.to_owned()))
            .and_then(|d| d.fields.get(field))
            .map(String::as_str)
    }

    /// The ids of every daemon of `kind`.
    pub fn daemon_ids(&self, kind: DaemonKind) -> Vec<String> {
        self.daemons
            .keys()
            .filter(|(k, _)| *k == kind)
            .map(|(_, id)| id.clone())
            .collect()
    }

    /// The network plan (netns mode).
    pub fn net_plan(&self) -> Option<&NetPlan> {
        self.net.as_ref().map(|(plan, _)| plan)
    }

    /// Stops every device, then every server, with SIGTERM, and returns
    /// each daemon's exit status; namespaces are removed afterwards.
    pub fn stop(mut self) -> Vec<(DaemonKind, String, Option<ExitStatus>)> {
        let mut statuses = Vec::new();
        for kind in [DaemonKind::FabricDevice, DaemonKind::PmemServer] {
            let ids: Vec<String> = self
                .daemons
                .keys()
                .filter(|(k, _)| *k == kind)
                .map(|(_, id)| id.clone())
                .collect();
            for id in &ids {
                if let Some(d) = self.daemons.get_mut(&(kind, id.clone())) {
                    if !matches!(d.child.try_wait(), Ok(None)) {
                        // Exited and reaped already: its pid may be another
                        // process's by now.
                        continue;
                    }
                    match &d.guest {
                        Some(guest) => {
                            if let Err(e) = guest.ask_to_stop() {
                                tracing::warn!("cannot ask server {id}'s guest to stop: {e}");
                            }
                        }
                        None => terminate(&d.child),
                    }
                }
            }
            for id in ids {
                if let Some(mut d) = self.daemons.remove(&(kind, id.clone())) {
                    let limit = if d.guest.is_some() {
                        GUEST_STOP_TIMEOUT
                    } else {
                        Duration::from_secs(15)
                    };
                    let status = wait_or_kill(&mut d.child, limit);
                    if status.is_none()
                        && let Some(guest) = &d.guest
                    {
                        guest.power_cut();
                    }
                    statuses.push((kind, id, status));
                }
            }
        }
        statuses
    }
}

/// Where each daemon and client of `plan` reaches etcd: the root end of its
/// management link.
fn etcd_reach(plan: &NetPlan) -> EtcdReach {
    plan.links()
        .filter_map(|veth| match &veth.link {
            netns::LinkRef::Mgmt { kind, host } => {
                let reacher = match kind {
                    netns::HostKind::Server => Reacher::Daemon(control::Role::Server, host.clone()),
                    netns::HostKind::FabricDevice => {
                        Reacher::Daemon(control::Role::Device, host.clone())
                    }
                    netns::HostKind::Client => Reacher::Client(host.clone()),
                };
                let addr = veth.addr_a.as_deref()?.split('/').next()?.parse().ok()?;
                Some((reacher, addr))
            }
            _ => None,
        })
        .collect()
}

impl Drop for Fabric {
    fn drop(&mut self) {
        for daemon in self.daemons.values_mut() {
            if let Some(guest) = &daemon.guest {
                guest.power_cut();
            }
            let _ = daemon.child.kill();
            let _ = daemon.child.wait();
        }
    }
}
