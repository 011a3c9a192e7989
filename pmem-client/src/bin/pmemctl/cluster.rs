//! `pmemctl cluster …`: the cluster map and membership in etcd (the
//! control plane): load the first map, show it with who is alive, replace
//! it at a known epoch, add and remove servers and devices (each one epoch
//! change against the map's revision), and record the operator's intent.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use control::{ControlError, ControlPlane, Credentials, Endpoints, Intent, ReplicaState, Role};
use topology::{EnvOverrides, Topology};

/// The control plane's commands and where etcd is.
#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// etcd's client URLs, comma-separated (http://h1:2379,http://h2:2379).
    #[arg(long, value_name = "URLS", env = "PMEM_FABRIC_ETCD")]
    etcd: Endpoints,
    /// The file of the etcd user to act as (one line `user:password`, mode
    /// 600): the pool's operator's to change the map, when etcd has
    /// authentication on; for `secure`, root's, once another pool set it up.
    #[arg(long, value_name = "FILE", env = "PMEM_FABRIC_ETCD_CREDENTIALS")]
    etcd_credentials: Option<PathBuf>,
    /// The pool (its `[pool] name`); `init` takes it from the file.
    #[arg(long, value_name = "NAME")]
    pool: Option<String>,
    #[command(subcommand)]
    action: ClusterAction,
}

#[derive(Debug, Subcommand)]
enum ClusterAction {
    /// Loads the first map (epoch 1) from a topology file; refused if the
    /// pool already has one.
    Init {
        /// The topology file.
        #[arg(long, value_name = "TOPOLOGY")]
        from: PathBuf,
    },
    /// Shows the map's epoch, every server and device with the operator's
    /// intent and its liveness (from its lease in etcd), and each region's
    /// server.
    Show,
    /// Replaces the map by a topology file's, if the map is still at
    /// EPOCH (what `show` printed): a change made meanwhile by someone
    /// else is never overwritten.
    Apply {
        /// The topology file.
        #[arg(long, value_name = "TOPOLOGY")]
        from: PathBuf,
        /// The epoch the change is based on.
        #[arg(long)]
        epoch: u64,
    },
    /// Turns etcd's authentication on for the topology's pool: a root user
    /// (unless --etcd-credentials names root's file), the pool's operator,
    /// a user per server and device of the topology that may read the
    /// map and intents and write its own liveness key only, and a user per
    /// client that may read the map only, each with a fresh password
    /// written to DIR (owner-only files).
    Secure {
        /// The topology file (its pool, servers and devices).
        #[arg(long, value_name = "TOPOLOGY")]
        from: PathBuf,
        /// Where the credentials files go.
        #[arg(long, value_name = "DIR")]
        credentials_out: PathBuf,
    },
    /// Drains SERVER: records the intent, then moves every copy it holds
    /// to other servers, one map change per step against the map's
    /// revision: pins each region's address, adds a copy on a server of
    /// another failure domain (`syncing`: the region's owner device copies
    /// it), waits until it serves, drops SERVER's copy, and removes SERVER
    /// from the map once it holds nothing. Interrupted and run again, it
    /// goes on from where the map is. A server opens copies added to it at
    /// its next start. A region with a single copy gets one elsewhere the
    /// same way (replicated while it moves, one copy again after). A
    /// primary copy that could only move by renumbering regions (its
    /// serving copies not next to SERVER in config order) is refused,
    /// naming the regions.
    DrainServer {
        /// The server's id.
        server: String,
        /// How long to wait for one new copy to serve, in seconds.
        #[arg(long, value_name = "SECONDS", default_value_t = 600)]
        timeout: u64,
        /// Record the intent only (shown by `show`), move nothing.
        #[arg(long)]
        intent_only: bool,
    },
    /// Adds the server of a TOML snippet (one `[[servers]]` table, and
    /// optionally `[[links]]` with `device` and `nic`; without links every
    /// device reaches every NIC of it) as the next epoch.
    AddServer {
        /// The snippet.
        #[arg(long, value_name = "FILE")]
        from: PathBuf,
    },
    /// Adds the fabric device of a TOML snippet (one `[[fabric_devices]]`
    /// table) as the next epoch.
    AddDevice {
        /// The snippet.
        #[arg(long, value_name = "FILE")]
        from: PathBuf,
    },
    /// Removes SERVER from the map as the next epoch; refused while it
    /// holds regions unless --force. Its data stays on its PMEM.
    RemoveServer {
        /// The server's id.
        server: String,
        /// Remove it although its regions become unreachable (they are named).
        #[arg(long)]
        force: bool,
    },
    /// Removes fabric device DEVICE from the map as the next epoch, with
    /// the clients' RNICs wired to it; refused if a client has no other.
    RemoveDevice {
        /// The device's id.
        device: String,
    },
    /// Marks the copy of REGION on SERVER serving, syncing or offline, as
    /// the next epoch and the region's next replica-set version; refused
    /// when it would leave the region no serving copy, or would let an
    /// offline copy serve without syncing first.
    MarkReplica {
        /// The region's id.
        region: String,
        /// The server holding the copy.
        server: String,
        /// serving, syncing or offline.
        #[arg(value_parser = parse_replica_state)]
        state: ReplicaState,
    },
}

fn parse_replica_state(text: &str) -> Result<ReplicaState, String> {
    ReplicaState::parse(text)
        .ok_or_else(|| format!("{text:?}: expected serving, syncing or offline"))
}

/// Why a cluster command failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The control plane refused or failed.
    #[error(transparent)]
    Control(#[from] ControlError),
    /// The topology file could not be read.
    #[error("{}: cannot read the topology file", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The topology file does not load.
    #[error(transparent)]
    Load(#[from] topology::LoadError),
    /// `--pool` and the file disagree, or `--pool` is missing.
    #[error("{0}")]
    Pool(String),
    /// The async runtime could not start.
    #[error("cannot start the runtime for etcd")]
    Runtime(#[source] std::io::Error),
    /// `--epoch` is not the map's epoch.
    #[error(
        "the map is at epoch {current}, not {given}; `pmemctl cluster show` prints it, and a \
         change is made against the map as it is"
    )]
    StaleEpoch {
        /// The epoch given.
        given: u64,
        /// The map's.
        current: u64,
    },
    /// The edit cannot be made.
    #[error(transparent)]
    Edit(#[from] control::edit::EditError),
    /// A drain step cannot be made.
    #[error(transparent)]
    Drain(#[from] control::drain::DrainError),
    /// The map kept changing under the drain.
    #[error(
        "the map changed while draining {server} (the step was planned at epoch {expected}, \
         the map is at epoch {current}) {tries} times in a row; nothing of that step was \
         written. Run drain-server again: it goes on from the map as it is"
    )]
    DrainConflict {
        /// The drained server.
        server: String,
        /// The epoch the last step was planned at.
        expected: u64,
        /// The map's epoch then.
        current: u64,
        /// Attempts made.
        tries: u32,
    },
    /// A new copy did not serve in time.
    #[error(
        "region {region}: the copy on {copy} is still syncing after {seconds} s, so {server}'s \
         copy is kept; the steps made so far stay in the map. Is pmem-server {copy} running \
         with the map (it opens copies added to it at its next start) and does the region's \
         owner device reach it? Run drain-server again to go on"
    )]
    DrainTimeout {
        /// The region.
        region: String,
        /// The server of the syncing copy.
        copy: String,
        /// The drained server.
        server: String,
        /// How long it waited.
        seconds: u64,
    },
    /// A copy cannot be marked syncing: nothing could resync it.
    #[error(
        "region {region}: marking the copy on {server} syncing needs a serving copy to resync \
         it from, but {}; nothing was changed. Start the serving copy's server first",
        sources.join(", ")
    )]
    NoResyncSource {
        /// The region.
        region: String,
        /// The server of the copy.
        server: String,
        /// Each serving copy and why it cannot be the source.
        sources: Vec<String>,
    },
    /// A server the map does not have.
    #[error("the map (epoch {epoch}) has no server {server}")]
    UnknownServer {
        /// The server asked for.
        server: String,
        /// The map's epoch.
        epoch: u64,
    },
}

/// Runs a cluster command; returns what to print.
pub fn run(args: ClusterArgs) -> Result<String, ClusterError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ClusterError::Runtime)?;
    runtime.block_on(run_async(args))
}

/// The file's text and its topology, with the pool name `--pool` must match.
fn read_topology(path: &PathBuf) -> Result<(String, Topology), ClusterError> {
    let text = std::fs::read_to_string(path).map_err(|source| ClusterError::Read {
        path: path.clone(),
        source,
    })?;
    let topology =
        Topology::from_toml_str(&path.display().to_string(), &text, &EnvOverrides::None)?;
    Ok((text, topology))
}

async fn run_async(args: ClusterArgs) -> Result<String, ClusterError> {
    let pool = match (&args.action, &args.pool) {
        (
            ClusterAction::Init { from }
            | ClusterAction::Apply { from, .. }
            | ClusterAction::Secure { from, .. },
            given,
        ) => {
            let (_, topology) = read_topology(from)?;
            let named = topology.pool.name.clone();
            if let Some(given) = given
                && *given != named
            {
                return Err(ClusterError::Pool(format!(
                    "--pool {given} but {} is pool {named}",
                    from.display()
                )));
            }
            named
        }
        (_, Some(pool)) => pool.clone(),
        (_, None) => {
            return Err(ClusterError::Pool(
                "--pool NAME is needed for this command (the topology's [pool] name)".to_owned(),
            ));
        }
    };
    let credentials = args
        .etcd_credentials
        .as_deref()
        .map(Credentials::read)
        .transpose()
        .map_err(ControlError::from)?;
    let mut plane = ControlPlane::connect(&args.etcd, &pool, credentials.as_ref()).await?;
    match args.action {
        ClusterAction::Secure {
            from,
            credentials_out,
        } => secure(&args.etcd, &from, &credentials_out, credentials.as_ref()).await,
        ClusterAction::Init { from } => {
            let (text, _) = read_topology(&from)?;
            let map = plane.init(&text).await?;
            Ok(format!(
                "pool {pool}: map loaded from {} at epoch {}\n",
                from.display(),
                map.map.epoch
            ))
        }
        ClusterAction::Show => show(&mut plane, &pool).await,
        ClusterAction::Apply { from, epoch } => {
            let (text, _) = read_topology(&from)?;
            let current = plane.read_map().await?;
            if current.map.epoch != epoch {
                return Err(ClusterError::StaleEpoch {
                    given: epoch,
                    current: current.map.epoch,
                });
            }
            let changed = plane.change_map(&current, &text).await?;
            Ok(format!(
                "pool {pool}: map replaced from {}: epoch {} -> {}\n",
                from.display(),
                epoch,
                changed.map.epoch
            ))
        }
        ClusterAction::AddServer { from } => {
            let snippet = read_text(&from)?;
            let change = |map: &str| control::edit::add_server(map, &snippet);
            let (epoch, added, notes) = edit_map(&mut plane, change).await?;
            plane
                .set_intent(Role::Server, &added, Intent::Active)
                .await?;
            Ok(format!(
                "pool {pool}: server {added} added at epoch {epoch}\n{notes}"
            ))
        }
        ClusterAction::AddDevice { from } => {
            let snippet = read_text(&from)?;
            let change = |map: &str| control::edit::add_device(map, &snippet);
            let (epoch, added, notes) = edit_map(&mut plane, change).await?;
            plane
                .set_intent(Role::Device, &added, Intent::Active)
                .await?;
            Ok(format!(
                "pool {pool}: device {added} added at epoch {epoch}\n{notes}"
            ))
        }
        ClusterAction::RemoveServer { server, force } => {
            let change = |map: &str| control::edit::remove_server(map, &server, force);
            let (epoch, _, notes) = edit_map(&mut plane, change).await?;
            plane
                .set_intent(Role::Server, &server, Intent::Removed)
                .await?;
            Ok(format!(
                "pool {pool}: server {server} removed at epoch {epoch}\n{notes}"
            ))
        }
        ClusterAction::RemoveDevice { device } => {
            let change = |map: &str| control::edit::remove_device(map, &device);
            let (epoch, _, notes) = edit_map(&mut plane, change).await?;
            plane
                .set_intent(Role::Device, &device, Intent::Removed)
                .await?;
            Ok(format!(
                "pool {pool}: device {device} removed at epoch {epoch}\n{notes}"
            ))
        }
        ClusterAction::MarkReplica {
            region,
            server,
            state,
        } => {
            let current = plane.read_map().await?;
            let marked = control::edit::mark_replica(&current.map, &region, &server, state)?;
            if state == ReplicaState::Syncing {
                resync_source(&mut plane, &current.map, &region, &server).await?;
            }
            plane.replace_map(&current, marked.map).await?;
            Ok(format!("pool {pool}: {}\n", marked.note))
        }
        ClusterAction::DrainServer {
            server,
            timeout,
            intent_only: false,
        } => drain_server(&mut plane, &server, Duration::from_secs(timeout)).await,
        ClusterAction::DrainServer { server, .. } => {
            let current = plane.read_map().await?;
            let topology = current.map.topology_at(&plane.keys().map())?;
            if !topology.servers.iter().any(|s| s.id.as_str() == server) {
                return Err(ClusterError::UnknownServer {
                    server,
                    epoch: current.map.epoch,
                });
            }
            plane
                .set_intent(Role::Server, &server, Intent::Draining)
                .await?;
            Ok(format!(
                "server {server}: intent recorded as draining (allocators do not follow the \
                 map's intents yet)\n"
            ))
        }
    }
}

/// How often a drain looks at the map while a new copy syncs.
const DRAIN_POLL: Duration = Duration::from_millis(500);
/// How often a drain says what it waits for.
const DRAIN_REPORT: Duration = Duration::from_secs(5);
/// How long a drain leaves the owner device after reviving an offline
/// copy before it plans again.
const DRAIN_REVIVE: Duration = Duration::from_secs(2);
/// Map changes by others (owner devices marking copies) a drain step
/// plans again after, before giving up.
const DRAIN_RETRIES: u32 = 5;

/// `drain-server`: the intent, then every step of
/// [`control::drain::next_step`] until the server is removed; each step
/// printed as it is made.
async fn drain_server(
    plane: &mut ControlPlane,
    server: &str,
    timeout: Duration,
) -> Result<String, ClusterError> {
    let current = plane.read_map().await?;
    let topology = current.map.topology_at(&plane.keys().map())?;
    if !topology.servers.iter().any(|s| s.id.as_str() == server) {
        return Err(ClusterError::UnknownServer {
            server: server.to_owned(),
            epoch: current.map.epoch,
        });
    }
    // Regions with a single copy keep one: recorded by the drain that
    // began, read back by one run again.
    let single = match plane.drain_single_copies(server).await? {
        Some(single) => single,
        None => control::drain::single_copies(&current.map, &plane.keys().map(), server)?,
    };
    // What cannot be done is refused before anything is written.
    plan_drain(plane, server, &single).await?;
    plane.record_drain_single_copies(server, &single).await?;
    plane
        .set_intent(Role::Server, server, Intent::Draining)
        .await?;
    println!("server {server}: intent recorded as draining");
    let mut waiting: Option<(control::drain::Step, Instant, Instant)> = None;
    let mut conflicts = 0;
    loop {
        let (current, planned) = plan_drain(plane, server, &single).await?;
        let Some(map) = planned.map else {
            let now = Instant::now();
            let (step, since, reported) = match waiting.take() {
                Some((step, since, reported)) if step == planned.step => (step, since, reported),
                _ => {
                    println!("{}", planned.note);
                    (planned.step, now, now)
                }
            };
            let reported = if now.duration_since(reported) >= DRAIN_REPORT {
                println!(
                    "  still syncing after {} s (map epoch {})",
                    now.duration_since(since).as_secs(),
                    current.map.epoch
                );
                now
            } else {
                reported
            };
            if now.duration_since(since) > timeout {
                let control::drain::Step::Wait {
                    region,
                    server: copy,
                } = step
                else {
                    unreachable!("only a wait comes without a map");
                };
                return Err(ClusterError::DrainTimeout {
                    region,
                    copy,
                    server: server.to_owned(),
                    seconds: timeout.as_secs(),
                });
            }
            waiting = Some((step, since, reported));
            tokio::time::sleep(DRAIN_POLL).await;
            continue;
        };
        waiting = None;
        match plane.replace_map(&current, map).await {
            Ok(written) => {
                conflicts = 0;
                println!("{} (map epoch {})", planned.note, written.map.epoch);
            }
            Err(ControlError::Conflict { expected, current }) => {
                conflicts += 1;
                if conflicts >= DRAIN_RETRIES {
                    return Err(ClusterError::DrainConflict {
                        server: server.to_owned(),
                        expected,
                        current,
                        tries: conflicts,
                    });
                }
                println!(
                    "  the map changed meanwhile (epoch {expected} -> {current}): planning again"
                );
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        if let control::drain::Step::Revive { .. } = planned.step {
            // Give the owner device time to take the copy up before the
            // map is looked at again.
            tokio::time::sleep(DRAIN_REVIVE).await;
        }
        if planned.step == control::drain::Step::Remove {
            plane
                .set_intent(Role::Server, server, Intent::Removed)
                .await?;
            plane.forget_drain_single_copies(server).await?;
            return Ok(format!(
                "server {server}: drained, every copy it held serves elsewhere; removed from \
                 the map (its files stay on its PMEM; its daemon may be stopped)\n"
            ));
        }
    }
}

/// The map and the drain's next step on it; servers draining or removed
/// take no copy; regions in `single` keep one copy.
async fn plan_drain(
    plane: &mut ControlPlane,
    server: &str,
    single: &[String],
) -> Result<(control::VersionedMap, control::drain::Planned), ClusterError> {
    let current = plane.read_map().await?;
    let avoid: Vec<String> = plane
        .intents()
        .await?
        .into_iter()
        .filter(|(role, name, intent)| {
            *role == Role::Server
                && name != server
                && matches!(intent, Intent::Draining | Intent::Removed)
        })
        .map(|(_, name, _)| name)
        .collect();
    let live: Vec<String> = plane
        .members()
        .await?
        .into_iter()
        .filter(|m| m.role == Role::Server)
        .map(|m| m.name)
        .collect();
    let planned = control::drain::next_step(
        &current.map,
        &plane.keys().map(),
        server,
        &avoid,
        &live,
        single,
    )?;
    Ok((current, planned))
}

/// The map in etcd of pool `pool` (its copies' states), for a command
/// that is not a `cluster` one.
pub fn read_map(
    endpoints: &Endpoints,
    pool: &str,
    credentials: Option<&Credentials>,
) -> Result<control::ClusterMap, ClusterError> {
    block_on(async {
        let mut plane = ControlPlane::connect(endpoints, pool, credentials).await?;
        Ok(plane.read_map().await?.map)
    })
}

/// Marks each (region, server) copy `syncing` in pool `pool`'s map, one
/// transaction each against the map read just before; what changed, one
/// line each.
pub fn mark_syncing(
    endpoints: &Endpoints,
    pool: &str,
    credentials: Option<&Credentials>,
    copies: &[(String, String)],
) -> Result<Vec<String>, ClusterError> {
    block_on(async {
        let mut plane = ControlPlane::connect(endpoints, pool, credentials).await?;
        let mut notes = Vec::new();
        for (region, server) in copies {
            let current = plane.read_map().await?;
            let marked =
                control::edit::mark_replica(&current.map, region, server, ReplicaState::Syncing)?;
            resync_source(&mut plane, &current.map, region, server).await?;
            plane.replace_map(&current, marked.map).await?;
            notes.push(marked.note);
        }
        Ok(notes)
    })
}

/// Runs `work` on a runtime of its own.
fn block_on<T>(
    work: impl std::future::Future<Output = Result<T, ClusterError>>,
) -> Result<T, ClusterError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ClusterError::Runtime)?
        .block_on(work)
}

/// Refuses to mark `region`'s copy on `server` syncing when no serving
/// copy's server is live (registered in etcd): nothing could resync it.
async fn resync_source(
    plane: &mut ControlPlane,
    map: &control::ClusterMap,
    region: &str,
    server: &str,
) -> Result<(), ClusterError> {
    let Some(record) = map.replica_set(region) else {
        return Ok(());
    };
    let members = plane.members().await?;
    let live = |name: &str| {
        members
            .iter()
            .any(|m| m.role == Role::Server && m.name == name)
    };
    let sources: Vec<&str> = record
        .copies
        .iter()
        .filter(|c| c.server != server && c.state == ReplicaState::Serving)
        .map(|c| c.server.as_str())
        .collect();
    if sources.iter().any(|s| live(s)) {
        return Ok(());
    }
    Err(ClusterError::NoResyncSource {
        region: region.to_owned(),
        server: server.to_owned(),
        sources: if sources.is_empty() {
            vec!["no other copy serves".to_owned()]
        } else {
            sources
                .iter()
                .map(|s| format!("server {s} (serving) is not live in etcd"))
                .collect()
        },
    })
}

/// A file's text.
fn read_text(path: &PathBuf) -> Result<String, ClusterError> {
    std::fs::read_to_string(path).map_err(|source| ClusterError::Read {
        path: path.clone(),
        source,
    })
}

/// Reads the map, edits its topology with `change` and writes it as the
/// next epoch in one transaction against the revision read (a change
/// meanwhile is a conflict, nothing written); the new epoch, the id of
/// what was added or removed, and the edit's notes, one indented line
/// each.
async fn edit_map(
    plane: &mut ControlPlane,
    change: impl FnOnce(&str) -> Result<control::edit::Edited, control::edit::EditError>,
) -> Result<(u64, String, String), ClusterError> {
    let current = plane.read_map().await?;
    let edited = change(&current.map.topology)?;
    let written = plane.change_map(&current, &edited.topology).await?;
    let notes = edited
        .notes
        .iter()
        .map(|n| format!("  {n}\n"))
        .collect::<String>();
    Ok((written.map.epoch, edited.subject, notes))
}

/// `secure`: the pool's etcd users and roles (operator, each daemon, each
/// client), authentication on, and the credentials files.
async fn secure(
    etcd: &Endpoints,
    from: &PathBuf,
    out: &std::path::Path,
    root: Option<&Credentials>,
) -> Result<String, ClusterError> {
    let (_, topology) = read_topology(from)?;
    let mut daemons: Vec<(Role, String)> = topology
        .servers
        .iter()
        .map(|s| (Role::Server, s.id.to_string()))
        .collect();
    daemons.extend(
        topology
            .fabric_devices
            .iter()
            .map(|d| (Role::Device, d.id.to_string())),
    );
    let pool = &topology.pool.name;
    let made = control::access::secure(etcd, pool, &daemons, root).await?;
    let mut files = made.write_to(out)?;
    // Clients: users that may read the map only, made as root once
    // authentication is on (the root just made, or the one given).
    let clients: Vec<String> = topology.clients.iter().map(|c| c.id.to_string()).collect();
    if let Some(root) = made.root.as_ref().or(root) {
        for (client, creds) in control::access::secure_clients(etcd, pool, &clients, root).await? {
            let file = control::access::client_file(out, &client);
            creds.write(&file).map_err(ControlError::from)?;
            files.push(file);
        }
    }
    let mut text = format!(
        "pool {pool}: etcd authentication on at {etcd}; {} credentials files in {}:\n",
        files.len(),
        out.display()
    );
    for file in files {
        let _ = writeln!(text, "  {}", file.display());
    }
    let _ = writeln!(
        text,
        "operator: pmemctl cluster --etcd {etcd} --pool {pool} --etcd-credentials {} show",
        control::access::operator_file(out).display()
    );
    Ok(text)
}

/// The map, members and intents as text.
async fn show(plane: &mut ControlPlane, pool: &str) -> Result<String, ClusterError> {
    let map = plane.read_map().await?;
    let topology = map.map.topology_at(&plane.keys().map())?;
    let sets = topology.replica_sets();
    let members = plane.members().await?;
    let intents = plane.intents().await?;
    let intent_of = |role: Role, name: &str| {
        intents
            .iter()
            .find(|(r, n, _)| *r == role && n == name)
            .map_or(Intent::Active, |(_, _, i)| *i)
    };
    let liveness =
        |role: Role, name: &str| match members.iter().find(|m| m.role == role && m.name == name) {
            Some(m) => format!(
                "live at {} (pid {}, incarnation {:016x}, epoch {})",
                m.address, m.pid, m.incarnation, m.epoch
            ),
            None => "not live".to_owned(),
        };
    let mut out = String::new();
    // `write!` to a String cannot fail.
    let _ = writeln!(
        out,
        "pool {pool}: map epoch {} (etcd revision {}), {}",
        map.map.epoch,
        map.revision,
        plane.endpoints()
    );
    let _ = writeln!(out, "servers:");
    for server in &topology.servers {
        let name = server.id.as_str();
        let intent = intent_of(Role::Server, name);
        let live = members
            .iter()
            .any(|m| m.role == Role::Server && m.name == name);
        let _ = writeln!(
            out,
            "  {name:<12} {:<9} {}",
            intent.as_str(),
            liveness(Role::Server, name)
        );
        // A region is served while its server is live; draining says no
        // new allocation lands there.
        let state = match (live, intent) {
            (false, _) => "unreachable",
            (true, Intent::Draining) => "draining",
            (true, _) => "served",
        };
        for socket in &server.sockets {
            for device in &socket.devices {
                for region in &device.regions {
                    let _ = writeln!(
                        out,
                        "    region {:<10} {:>10} on socket {} of {name}: {state}",
                        region.id.as_str(),
                        region.size.to_string(),
                        socket.id.as_str()
                    );
                    if let Some(line) = copies_line(&map.map, &sets, region.id.as_str()) {
                        let _ = writeln!(out, "      {line}");
                    }
                }
            }
        }
    }
    let _ = writeln!(out, "devices:");
    for device in &topology.fabric_devices {
        let name = device.id.as_str();
        let _ = writeln!(
            out,
            "  {name:<12} {:<9} {}",
            intent_of(Role::Device, name).as_str(),
            liveness(Role::Device, name)
        );
    }
    let _ = writeln!(out, "clients: {}", topology.clients.len());
    // Intents of daemons the map no longer names (removed ones).
    for (role, name, intent) in &intents {
        let named = match role {
            Role::Server => topology.servers.iter().any(|s| s.id.as_str() == name),
            Role::Device => topology
                .fabric_devices
                .iter()
                .any(|d| d.id.as_str() == name),
        };
        if !named {
            let _ = writeln!(
                out,
                "not in the map: {role} {name} ({intent}, {})",
                liveness(*role, name)
            );
        }
    }
    Ok(out)
}

/// A replicated region's copies as `show` prints them: each copy's place
/// and state (primary first), the owner device and the set's version.
fn copies_line(
    map: &control::ClusterMap,
    sets: &[topology::ReplicaSet],
    region: &str,
) -> Option<String> {
    let record = map.replica_set(region)?;
    let set = sets.iter().find(|s| s.region.as_str() == region)?;
    let copies: Vec<String> = set
        .replicas
        .iter()
        .enumerate()
        .map(|(i, copy)| {
            let state = record
                .state_on(copy.server.as_str())
                .map_or("unrecorded", ReplicaState::as_str);
            let role = if i == 0 { "primary" } else { "backup" };
            format!("{}:{} {state} ({role})", copy.server, copy.socket)
        })
        .collect();
    Some(format!(
        "copies: {}; owner device {}; replica set version {}",
        copies.join(", "),
        record.owner,
        record.version
    ))
}
