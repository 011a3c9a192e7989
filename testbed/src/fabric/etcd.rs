//! A testbed fabric on the control plane (`--control etcd`): a real etcd
//! (one member, or several with `--etcd-members`, each on loopback ports
//! of its own with its data in the run's folder; never a system etcd on
//! 2379), its authentication set up for the topology's pool, the topology
//! loaded as the pool's map, and every daemon started with `--etcd` and
//! its own etcd user's credentials file.
//!
//! Members of a cluster run on one host with distinct loopback ports, not
//! in network namespaces of their own: killing a member (or the leader)
//! is what the chaos scenarios need, and a partition between members is
//! not one of them. With `--net netns` every member also takes clients on
//! the root end of each host's management link, so a daemon or a client in
//! its namespace reaches etcd over its own management link and nothing else
//! of the host. Clients (the workers) open the pool on etcd as an etcd user
//! of their own that may read the map only.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Instant;

use control::access::{self, PoolCredentials};
use control::edit::{EditError, Edited};
use control::{ControlError, ControlPlane, Credentials, Endpoints, Intent, Role};
use testkit::Etcd;
use topology::Topology;

use crate::fabric::daemon_kind::DaemonKind;

/// Where a fabric's daemons take their map from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Control {
    /// The topology file the testbed writes (no etcd).
    #[default]
    File,
    /// A real etcd of `members` members, with authentication on.
    Etcd {
        /// How many members.
        members: usize,
    },
}

impl Control {
    /// How the report and the replay line name it: `file`, `etcd`.
    pub fn name(self) -> &'static str {
        match self {
            Control::File => "file",
            Control::Etcd { .. } => "etcd",
        }
    }
}

/// The command-line words of [`Control`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ControlKind {
    /// The topology file the testbed writes.
    File,
    /// A real etcd, with authentication on.
    Etcd,
}

/// `--control` and `--etcd-members`, shared by `up`, `run` and `chaos`.
#[derive(Debug, Clone, clap::Args)]
pub struct ControlArgs {
    /// Where the daemons take their map from: `file` (the topology file)
    /// or `etcd` (a real etcd started for the run, its authentication on,
    /// the topology loaded into it).
    #[arg(long, value_enum, default_value = "file")]
    pub control: ControlKind,
    /// With --control etcd: how many etcd members (on loopback, distinct
    /// ports; with --net netns they also listen on the daemons'
    /// management links).
    #[arg(long, default_value_t = 1)]
    pub etcd_members: usize,
}

impl ControlArgs {
    /// The control these flags ask for; `--etcd-members` other than 1
    /// without `--control etcd`, or 0, is refused.
    pub fn control(&self) -> Result<Control, String> {
        match (self.control, self.etcd_members) {
            (_, 0) => Err("--etcd-members must be at least 1".to_owned()),
            (ControlKind::File, 1) => Ok(Control::File),
            (ControlKind::File, n) => Err(format!(
                "--etcd-members {n} needs --control etcd (the daemons take the map from a file \
                 otherwise)"
            )),
            (ControlKind::Etcd, members) => Ok(Control::Etcd { members }),
        }
    }
}

/// Why the control plane could not be brought up or driven.
#[derive(Debug, thiserror::Error)]
pub enum EtcdControlError {
    /// etcd did not start, or a member did not come back.
    #[error("etcd: {0}")]
    Etcd(String),
    /// Setting up the users or loading the map failed.
    #[error(transparent)]
    Control(#[from] ControlError),
    /// The client's runtime could not start.
    #[error("cannot start a runtime for the etcd client")]
    Runtime(#[source] std::io::Error),
    /// No member says it leads.
    #[error("no etcd member is the leader now ({0})")]
    NoLeader(String),
    /// A membership change could not be made on the map.
    #[error("cannot change the map in etcd: {0}")]
    Edit(#[source] Box<EditError>),
}

/// A host that reaches etcd: a daemon, or a client.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reacher {
    /// A server or fabric device, by its role and id.
    Daemon(Role, String),
    /// A client, by its id.
    Client(String),
}

/// Where each host reaches etcd from: the local address (the root end of
/// its management link) for hosts in network namespaces; a host not named
/// reaches it on loopback.
pub type EtcdReach = BTreeMap<Reacher, IpAddr>;

/// The role the control plane gives a daemon kind.
pub fn role_of(kind: DaemonKind) -> Role {
    match kind {
        DaemonKind::PmemServer => Role::Server,
        DaemonKind::FabricDevice => Role::Device,
    }
}

/// A running etcd holding a fabric's map, with its users' credentials.
#[derive(Debug)]
pub struct EtcdControl {
    members: Vec<Etcd>,
    endpoints: Endpoints,
    pool: String,
    credentials: PathBuf,
    operator: Credentials,
    /// Each host's endpoints when it does not reach etcd on loopback.
    reach: BTreeMap<Reacher, Endpoints>,
    /// The members a fault killed, to restart.
    killed: Vec<usize>,
}

/// A runtime for one etcd client call from synchronous code.
fn runtime() -> Result<tokio::runtime::Runtime, EtcdControlError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(EtcdControlError::Runtime)
}

impl EtcdControl {
    /// Starts `members` etcd members under `run_dir/etcd` (also taking
    /// clients on every address of `reach`), sets up a user for every
    /// daemon and client of `topology` (credentials files in
    /// `run_dir/etcd-credentials`), turns authentication on and loads
    /// `map_text` (the TOML of `topology`, or of part of it) as the pool's
    /// map, at epoch 1, as its operator.
    pub fn start(
        topology: &Topology,
        map_text: &str,
        members: usize,
        run_dir: &Path,
        reach: &EtcdReach,
    ) -> Result<Self, EtcdControlError> {
        let dir = run_dir.join("etcd");
        let mut hosts: Vec<IpAddr> = reach.values().copied().collect();
        hosts.sort();
        hosts.dedup();
        let mut cluster =
            Etcd::start_cluster_on(&dir, members, &hosts).map_err(EtcdControlError::Etcd)?;
        let mut reached = BTreeMap::new();
        for (daemon, host) in reach {
            let urls: Vec<String> = cluster.iter().map(|m| m.endpoint_on(*host)).collect();
            let endpoints = Endpoints::parse(&urls.join(","))
                .map_err(|e| EtcdControlError::Etcd(format!("the endpoints on {host}: {e}")))?;
            reached.insert(daemon.clone(), endpoints);
        }
        let urls: Vec<String> = cluster.iter().map(Etcd::endpoint).collect();
        let endpoints = Endpoints::parse(&urls.join(","))
            .map_err(|e| EtcdControlError::Etcd(format!("its endpoints: {e}")))?;
        let pool = topology.pool.name.clone();
        let credentials = std::path::absolute(run_dir.join("etcd-credentials"))
            .map_err(EtcdControlError::Runtime)?;
        let clients: Vec<String> = topology.clients.iter().map(|c| c.id.to_string()).collect();
        let (made, client_users) = runtime()?.block_on(async {
            let made: PoolCredentials =
                access::secure(&endpoints, &pool, &daemons(topology), None).await?;
            let client_users = match &made.root {
                Some(root) => access::secure_clients(&endpoints, &pool, &clients, root).await?,
                None => Vec::new(),
            };
            let mut operator =
                ControlPlane::connect(&endpoints, &pool, Some(&made.operator)).await?;
            operator.init(map_text).await?;
            Ok::<_, ControlError>((made, client_users))
        })?;
        made.write_to(&credentials)?;
        for (client, creds) in &client_users {
            creds
                .write(&access::client_file(&credentials, client))
                .map_err(ControlError::from)?;
        }
        if let Some(root) = &made.root {
            for member in &mut cluster {
                member.set_root(root.user(), root.password());
            }
        }
        Ok(Self {
            members: cluster,
            endpoints,
            pool,
            credentials,
            operator: made.operator,
            reach: reached,
            killed: Vec::new(),
        })
    }

    /// etcd's client URLs.
    pub fn endpoints(&self) -> &Endpoints {
        &self.endpoints
    }

    /// The pool whose map etcd holds.
    pub fn pool(&self) -> &str {
        &self.pool
    }

    /// The folder of the users' credentials files.
    pub fn credentials_dir(&self) -> &Path {
        &self.credentials
    }

    /// The operator's credentials file.
    pub fn operator_credentials(&self) -> PathBuf {
        access::operator_file(&self.credentials)
    }

    /// The etcd endpoints daemon `kind` `id` reaches.
    pub fn endpoints_for(&self, kind: DaemonKind, id: &str) -> &Endpoints {
        self.reach
            .get(&Reacher::Daemon(role_of(kind), id.to_owned()))
            .unwrap_or(&self.endpoints)
    }

    /// Where client `client` reads the map: this etcd's pool, as its own
    /// etcd user, on endpoints it reaches (what [`Self::client_args`]
    /// says to a worker). `None` when its credentials file does not read.
    pub fn client_source(&self, client: &str) -> Option<(Endpoints, String, Credentials)> {
        let endpoints = self
            .reach
            .get(&Reacher::Client(client.to_owned()))
            .unwrap_or(&self.endpoints);
        let credentials =
            Credentials::read(&access::client_file(&self.credentials, client)).ok()?;
        Some((endpoints.clone(), self.pool.clone(), credentials))
    }

    /// The flags that open the pool on this etcd as client `client` (a
    /// worker), as its own etcd user, on endpoints it reaches: what
    /// `testbed worker` takes instead of `--config`.
    pub fn client_args(&self, client: &str) -> Vec<OsString> {
        let endpoints = self
            .reach
            .get(&Reacher::Client(client.to_owned()))
            .unwrap_or(&self.endpoints);
        vec![
            "--etcd".into(),
            endpoints.to_string().into(),
            "--pool".into(),
            self.pool.clone().into(),
            "--etcd-credentials".into(),
            access::client_file(&self.credentials, client).into(),
        ]
    }

    /// The flags that put daemon `kind` `id` on this etcd, as its own user,
    /// on endpoints it reaches.
    pub fn daemon_args(&self, kind: DaemonKind, id: &str) -> Vec<OsString> {
        let role = role_of(kind);
        vec![
            "--etcd".into(),
            self.endpoints_for(kind, id).to_string().into(),
            "--pool".into(),
            self.pool.clone().into(),
            "--etcd-credentials".into(),
            access::daemon_file(&self.credentials, role, id).into(),
        ]
    }

    /// The `pmemctl cluster` line an operator runs against this etcd.
    pub fn pmemctl_line(&self) -> String {
        format!(
            "pmemctl cluster --etcd {} --pool {} --etcd-credentials {} show",
            self.endpoints,
            self.pool,
            self.operator_credentials().display()
        )
    }

    /// Changes the map as its operator would with `pmemctl cluster`: reads
    /// it, applies `edit` to its topology, writes the result at the next
    /// epoch (refused if anyone changed the map meanwhile) and records
    /// `intent` for the subject (`role`). Returns the new epoch and what
    /// the edit said.
    pub fn change_map(
        &self,
        role: Role,
        intent: Intent,
        edit: impl FnOnce(&str) -> Result<Edited, EditError>,
    ) -> Result<(u64, Edited), EtcdControlError> {
        runtime()?.block_on(async {
            let mut operator =
                ControlPlane::connect(&self.endpoints, &self.pool, Some(&self.operator)).await?;
            let current = operator.read_map().await?;
            let edited =
                edit(&current.map.topology).map_err(|e| EtcdControlError::Edit(Box::new(e)))?;
            let changed = operator.change_map(&current, &edited.topology).await?;
            operator.set_intent(role, &edited.subject, intent).await?;
            Ok((changed.map.epoch, edited))
        })
    }

    /// The map's replica records now: each replicated region's copies and
    /// their states.
    pub fn replica_sets(&self) -> Result<Vec<control::ReplicaSetRecord>, EtcdControlError> {
        runtime()?.block_on(async {
            let mut operator =
                ControlPlane::connect(&self.endpoints, &self.pool, Some(&self.operator)).await?;
            Ok(operator.read_map().await?.map.replica_sets)
        })
    }

    /// The map's epoch now.
    pub fn epoch(&self) -> Result<u64, EtcdControlError> {
        runtime()?.block_on(async {
            let mut operator =
                ControlPlane::connect(&self.endpoints, &self.pool, Some(&self.operator)).await?;
            Ok(operator.read_map().await?.map.epoch)
        })
    }

    /// Writes the current map again, unchanged, at the next epoch (a change
    /// every daemon must follow and nothing else); returns the new epoch.
    pub fn bump_epoch(&self) -> Result<u64, EtcdControlError> {
        runtime()?.block_on(async {
            let mut operator =
                ControlPlane::connect(&self.endpoints, &self.pool, Some(&self.operator)).await?;
            let current = operator.read_map().await?;
            let topology = current.map.topology.clone();
            Ok(operator.change_map(&current, &topology).await?.map.epoch)
        })
    }

    /// The members' names, in order.
    pub fn member_names(&self) -> Vec<String> {
        self.members.iter().map(|m| m.name().to_owned()).collect()
    }

    /// Kills every member (SIGKILL): etcd is down.
    pub fn kill_all(&mut self) -> Instant {
        let at = Instant::now();
        for (i, member) in self.members.iter_mut().enumerate() {
            if member.is_running() {
                member.kill();
                self.killed.push(i);
            }
        }
        at
    }

    /// Kills the member that leads now (found with `etcdctl endpoint
    /// status`); returns when, and its name.
    pub fn kill_leader(&mut self) -> Result<(Instant, String), EtcdControlError> {
        let mut asked = Vec::new();
        let leader = self.members.iter().position(|m| {
            let answer = m.is_running().then(|| m.is_leader());
            match answer {
                Some(Ok(leads)) => leads,
                Some(Err(why)) => {
                    asked.push(format!("{}: {why}", m.name()));
                    false
                }
                None => false,
            }
        });
        let i = leader.ok_or_else(|| EtcdControlError::NoLeader(asked.join("; ")))?;
        let at = Instant::now();
        self.members[i].kill();
        self.killed.push(i);
        Ok((at, self.members[i].name().to_owned()))
    }

    /// Starts the killed members again (same ports and data) and waits
    /// until every member answers.
    pub fn restart_killed(&mut self) -> Result<(), EtcdControlError> {
        self.killed.clear();
        Etcd::start_all(&mut self.members).map_err(EtcdControlError::Etcd)
    }
}

/// Every server and device of `topology`, as the control plane names them.
fn daemons(topology: &Topology) -> Vec<(Role, String)> {
    let servers = topology
        .servers
        .iter()
        .map(|s| (Role::Server, s.id.to_string()));
    let devices = topology
        .fabric_devices
        .iter()
        .map(|d| (Role::Device, d.id.to_string()));
    servers.chain(devices).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_flags_parse_and_refuse_members_without_etcd() {
        let args = |control, etcd_members| ControlArgs {
            control,
            etcd_members,
        };
        assert_eq!(args(ControlKind::File, 1).control(), Ok(Control::File));
        assert_eq!(
            args(ControlKind::Etcd, 3).control(),
            Ok(Control::Etcd { members: 3 })
        );
        let err = args(ControlKind::File, 3).control().expect_err("refused");
        assert!(err.contains("--control etcd"), "{err}");
        assert!(args(ControlKind::Etcd, 0).control().is_err());
    }
}
