//! A real etcd server for tests and the testbed: Debian's `etcd-server`,
//! one member on loopback ports of its own with a data directory of its
//! own, never the host's system etcd (which its package may start on 2379).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::fabric::free_loopback_port;

/// How long etcd may take to answer after it is started.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running etcd member; killed when dropped.
#[derive(Debug)]
pub struct Etcd {
    child: Option<Child>,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
}

impl Etcd {
    /// Starts etcd with its data and log under `dir` (`--unsafe-no-fsync`:
    /// tests do not need its own durability) and waits until it answers.
    pub fn start(dir: &Path) -> Result<Etcd, String> {
        let mut etcd = Etcd {
            child: None,
            client_port: free_loopback_port(),
            peer_port: free_loopback_port(),
            data_dir: dir.join("etcd-data"),
            log: dir.join("etcd.log"),
        };
        etcd.spawn()?;
        Ok(etcd)
    }

    fn spawn(&mut self) -> Result<(), String> {
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        let child = Command::new("etcd")
            .args(["--name", "test"])
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("test={peer}")])
            .arg("--unsafe-no-fsync")
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start etcd ({e}); it is Debian's etcd-server package"))?;
        self.child = Some(child);
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

    /// Runs `etcdctl` against this member; its stdout, or why it failed.
    pub fn ctl(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint()))
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
