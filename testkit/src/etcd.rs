//! A real etcd server for tests and the testbed: Debian's `etcd-server`,
//! one member (or a cluster of several, [`Etcd::start_cluster`]) on
//! loopback ports of its own with a data directory of its own, never the
//! host's system etcd (which its package may start on 2379). Once its
//! authentication is on, [`Etcd::set_root`] gives `etcdctl` root's
//! credentials. [`Etcd::start_cluster_on`] also listens for clients on
//! further local addresses (the root ends of network namespaces' links).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::fabric::free_loopback_port;

/// How long etcd may take to answer after it is started.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running etcd member; killed when dropped.
pub struct Etcd {
    child: Option<Child>,
    name: String,
    client_port: u16,
    peer_port: u16,
    /// Every member's `name=peer URL`, as etcd's `--initial-cluster`.
    initial_cluster: String,
    data_dir: PathBuf,
    log: PathBuf,
    /// Further local addresses it takes clients on (same client port).
    client_hosts: Vec<IpAddr>,
    /// Root's user and password for `etcdctl`, once authentication is on.
    root: Option<(String, String)>,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("name", &self.name)
            .field("endpoint", &self.endpoint())
            .field("running", &self.child.is_some())
            .finish()
    }
}

impl Etcd {
    /// Starts etcd with its data and log under `dir` (`--unsafe-no-fsync`:
    /// tests do not need its own durability) and waits until it answers.
    pub fn start(dir: &Path) -> Result<Etcd, String> {
        let (client_port, peer_port) = (free_loopback_port(), free_loopback_port());
        let mut etcd = Etcd {
            child: None,
            name: "test".to_owned(),
            client_port,
            peer_port,
            initial_cluster: format!("test=http://127.0.0.1:{peer_port}"),
            data_dir: dir.join("etcd-data"),
            log: dir.join("etcd.log"),
            client_hosts: Vec::new(),
            root: None,
        };
        etcd.spawn()?;
        Ok(etcd)
    }

    /// Starts a cluster of `members` members (`etcd0`, `etcd1`, …), each on
    /// loopback ports of its own with its data (`<name>-data`) and log
    /// (`<name>.log`) under `dir`, and waits until every one answers.
    pub fn start_cluster(dir: &Path, members: usize) -> Result<Vec<Etcd>, String> {
        Self::start_cluster_on(dir, members, &[])
    }

    /// [`Etcd::start_cluster`] whose members also take clients on each of
    /// `client_hosts` (local addresses, each member on its own client
    /// port); peers still talk over loopback.
    pub fn start_cluster_on(
        dir: &Path,
        members: usize,
        client_hosts: &[IpAddr],
    ) -> Result<Vec<Etcd>, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let ports: Vec<(u16, u16)> = (0..members.max(1))
            .map(|_| (free_loopback_port(), free_loopback_port()))
            .collect();
        let initial_cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("etcd{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster: Vec<Etcd> = ports
            .into_iter()
            .enumerate()
            .map(|(i, (client_port, peer_port))| Etcd {
                child: None,
                name: format!("etcd{i}"),
                client_port,
                peer_port,
                initial_cluster: initial_cluster.clone(),
                data_dir: dir.join(format!("etcd{i}-data")),
                log: dir.join(format!("etcd{i}.log")),
                client_hosts: client_hosts.to_vec(),
                root: None,
            })
            .collect();
        Self::start_all(&mut cluster)?;
        Ok(cluster)
    }

    /// Starts every member of `cluster` that is not running (a member
    /// alone does not answer until a quorum runs), then waits until each
    /// answers.
    pub fn start_all(cluster: &mut [Etcd]) -> Result<(), String> {
        for member in cluster.iter_mut().filter(|m| m.child.is_none()) {
            member.launch()?;
        }
        for member in cluster.iter_mut() {
            member.await_healthy()?;
        }
        Ok(())
    }

    /// The member's name (`--name`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether its process runs (it was not killed).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Root's credentials for `etcdctl`, once authentication is on.
    pub fn set_root(&mut self, user: &str, password: &str) {
        self.root = Some((user.to_owned(), password.to_owned()));
    }

    fn spawn(&mut self) -> Result<(), String> {
        self.launch()?;
        self.await_healthy()
    }

    fn launch(&mut self) -> Result<(), String> {
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let listen: Vec<String> = std::iter::once(client.clone())
            .chain(self.client_hosts.iter().map(|h| self.endpoint_on(*h)))
            .collect();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        let child = Command::new("etcd")
            .args(["--name", &self.name])
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(["--listen-client-urls", &listen.join(",")])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster])
            .arg("--unsafe-no-fsync")
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start etcd ({e}); it is Debian's etcd-server package"))?;
        self.child = Some(child);
        Ok(())
    }

    fn await_healthy(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if self.ctl(&["endpoint", "health"]).is_ok() {
                return Ok(());
            }
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!("etcd exited with {status}:\n{}", self.log_tail()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!(
            "etcd did not answer within {START_TIMEOUT:?}:\n{}",
            self.log_tail()
        ))
    }

    /// Its client URL (`http://127.0.0.1:PORT`), what `--etcd` takes.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Its client URL on `host`, one of the addresses it was started on.
    pub fn endpoint_on(&self, host: IpAddr) -> String {
        match host {
            IpAddr::V4(v4) => format!("http://{v4}:{}", self.client_port),
            IpAddr::V6(v6) => format!("http://[{v6}]:{}", self.client_port),
        }
    }

    /// Runs `etcdctl` against this member; its stdout, or why it failed.
    pub fn ctl(&self, args: &[&str]) -> Result<String, String> {
        let mut command = Command::new("etcdctl");
        command
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint()));
        // In its environment, not on its command line, where other users
        // of the host could read it.
        if let Some((user, password)) = &self.root {
            command.env("ETCDCTL_USER", format!("{user}:{password}"));
        }
        let out = command
            .args(args)
            .output()
            .map_err(|e| format!("cannot run etcdctl: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// Puts `value` at `key` (as an operator would by hand).
    pub fn put(&self, key: &str, value: &str) -> Result<(), String> {
        self.ctl(&["put", key, value]).map(drop)
    }

    /// Every key under `prefix` with its value, in key order (values are
    /// taken to be one line each, as the control plane's JSON records are).
    pub fn get_prefix(&self, prefix: &str) -> Result<Vec<(String, String)>, String> {
        let text = self.ctl(&["get", prefix, "--prefix"])?;
        let lines: Vec<&str> = text.lines().collect();
        Ok(lines
            .chunks(2)
            .filter_map(|pair| match pair {
                [key, value] => Some(((*key).to_owned(), (*value).to_owned())),
                _ => None,
            })
            .collect())
    }

    /// Every value under `prefix` parsed as JSON, in key order: the control
    /// plane's records (its map, its members) as a test reads them back.
    ///
    /// # Panics
    ///
    /// When etcdctl fails, or a value is not a `T` (naming its key).
    pub fn get_json_prefix<T: serde::de::DeserializeOwned>(&self, prefix: &str) -> Vec<T> {
        let records = self
            .get_prefix(prefix)
            .unwrap_or_else(|e| panic!("etcdctl get {prefix} --prefix: {e}"));
        records
            .iter()
            .map(|(key, value)| {
                serde_json::from_str(value).unwrap_or_else(|e| panic!("{key}: {e}"))
            })
            .collect()
    }

    /// Whether this member is its cluster's raft leader now (from
    /// `etcdctl endpoint status`).
    pub fn is_leader(&self) -> Result<bool, String> {
        let status = self.ctl(&["endpoint", "status", "--write-out=json"])?;
        let number_after = |field: &str| -> Result<u64, String> {
            let at = status
                .find(field)
                .ok_or_else(|| format!("no {field} in etcdctl's status: {status}"))?;
            let digits: String = status[at + field.len()..]
                .chars()
                .skip_while(|c| !c.is_ascii_digit())
                .take_while(char::is_ascii_digit)
                .collect();
            digits
                .parse()
                .map_err(|_| format!("{field} is not a number in etcdctl's status: {status}"))
        };
        Ok(number_after("\"member_id\"")? == number_after("\"leader\"")?)
    }

    /// Kills the member (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the member again on the same ports and data.
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        self.spawn()
    }

    /// The end of its log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}
