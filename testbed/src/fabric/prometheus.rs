//! A real Prometheus server scraping the fabric's daemons.
//!
//! [`scrape_config`] renders a `prometheus.yml` with one job per daemon kind
//! (`pmem-server`, `fabric-device`) and one static target per daemon, labelled
//! `instance_id="<the daemon's id>"`; `configs/prometheus.yml` is its output
//! for the default topology ([`ScrapeTarget::from_topology`]).
//!
//! [`PrometheusServer::start`] writes that config into a directory, runs the
//! distribution's `prometheus` binary on a free loopback port with its TSDB
//! in the same directory, and waits until it is ready; dropping the handle
//! stops the process (SIGTERM, then SIGKILL) and reaps it. Its HTTP API is
//! then at hand: [`PrometheusServer::wait_targets_up`] and
//! [`PrometheusServer::query`].
//!
//! Prometheus hands newly configured targets to its scrapers about five
//! seconds after it starts (its service discovery batches updates that
//! long), so the first scrape of a fresh server lands 5–6 s after the start
//! with a one-second interval.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::{self, File};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use serde::Deserialize;
use topology::Topology;

/// The job of every pmem-server target.
pub const PMEM_SERVER_JOB: &str = "pmem-server";
/// The job of every fabric-device target.
pub const FABRIC_DEVICE_JOB: &str = "fabric-device";
/// The label holding a daemon's id (server or fabric device id).
pub const INSTANCE_ID_LABEL: &str = "instance_id";
/// Where the daemons serve their metrics.
pub const METRICS_PATH: &str = "/metrics";
/// The scrape interval of [`PrometheusServer::start`] and of
/// `configs/prometheus.yml`.
pub const DEFAULT_SCRAPE_INTERVAL: Duration = Duration::from_secs(1);
/// How long [`PrometheusServer::start`] waits for `/-/ready`, by default.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The config file [`PrometheusServer::start`] writes into its directory.
pub const CONFIG_FILE_NAME: &str = "prometheus.yml";
/// The file in its directory that receives Prometheus's log (its stderr).
pub const LOG_FILE_NAME: &str = "prometheus.log";
/// The TSDB directory inside the server's directory.
pub const TSDB_DIR_NAME: &str = "tsdb";

/// How long one HTTP exchange with Prometheus may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// How often readiness and targets are polled.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// How long Prometheus gets to exit after SIGTERM before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How many log lines an error quotes.
const LOG_TAIL_LINES: usize = 20;
/// How many free ports are tried when Prometheus finds its port taken.
const PORT_ATTEMPTS: usize = 3;

/// One sample of a query result: its labels (`__name__` included when the
/// result keeps it) and its value.
pub type Sample = (BTreeMap<String, String>, f64);

/// One daemon for Prometheus to scrape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrapeTarget {
    /// The job: [`PMEM_SERVER_JOB`] or [`FABRIC_DEVICE_JOB`].
    pub job: String,
    /// The daemon's id in the topology (e.g. `"A"`), the `instance_id` label.
    pub instance: String,
    /// The daemon's admin address, serving `/metrics`.
    pub addr: SocketAddr,
}

impl ScrapeTarget {
    /// PMEM server `id` with its admin endpoint at `addr`.
    pub fn pmem_server(id: impl Into<String>, addr: SocketAddr) -> Self {
        Self {
            job: PMEM_SERVER_JOB.to_owned(),
            instance: id.into(),
            addr,
        }
    }

    /// Fabric device `id` with its admin endpoint at `addr`.
    pub fn fabric_device(id: impl Into<String>, addr: SocketAddr) -> Self {
        Self {
            job: FABRIC_DEVICE_JOB.to_owned(),
            instance: id.into(),
            addr,
        }
    }

    /// Every server, then every fabric device, of `topology` that names an
    /// admin address, in config order.
    ///
    /// An admin address that is not `ip:port` is an
    /// [`PrometheusError::BadAdminAddress`].
    pub fn from_topology(topology: &Topology) -> Result<Vec<Self>, PrometheusError> {
        let parse = |daemon: String, text: &str| {
            text.parse::<SocketAddr>()
                .map_err(|_| PrometheusError::BadAdminAddress {
                    daemon,
                    addr: text.to_owned(),
                })
        };
        let mut targets = Vec::new();
        for server in &topology.servers {
            if let Some(admin) = &server.admin {
                let id = server.id.to_string();
                let addr = parse(format!("server {id}"), admin)?;
                targets.push(Self::pmem_server(id, addr));
            }
        }
        for device in &topology.fabric_devices {
            if let Some(admin) = &device.admin {
                let id = device.id.to_string();
                let addr = parse(format!("fabric device {id}"), admin)?;
                targets.push(Self::fabric_device(id, addr));
            }
        }
        Ok(targets)
    }
}

/// The `prometheus.yml` that scrapes `targets` every `scrape_interval`: one
/// job per distinct [`ScrapeTarget::job`] (in order of first appearance),
/// each target a `static_configs` entry labelled `instance_id: <id>`,
/// metrics path `/metrics`. The scrape timeout is the interval, at most 10 s.
pub fn scrape_config(targets: &[ScrapeTarget], scrape_interval: Duration) -> String {
    let timeout = scrape_interval.min(Duration::from_secs(10));
    let mut jobs: Vec<(&str, Vec<&ScrapeTarget>)> = Vec::new();
    for target in targets {
        match jobs.iter_mut().find(|(job, _)| *job == target.job) {
            Some((_, members)) => members.push(target),
            None => jobs.push((&target.job, vec![target])),
        }
    }
    let mut out = String::new();
    out.push_str(
        "# Prometheus scrape configuration for pmem-fabric daemons, generated by\n\
         # testbed::fabric::prometheus::scrape_config.\n",
    );
    out.push_str("global:\n");
    let _ = writeln!(
        out,
        "  scrape_interval: {}",
        prometheus_duration(scrape_interval)
    );
    let _ = writeln!(out, "  scrape_timeout: {}", prometheus_duration(timeout));
    if jobs.is_empty() {
        out.push_str("scrape_configs: []\n");
        return out;
    }
    out.push_str("scrape_configs:\n");
    for (job, members) in jobs {
        let _ = writeln!(out, "  - job_name: {}", yaml_string(job));
        let _ = writeln!(out, "    metrics_path: {METRICS_PATH}");
        out.push_str("    static_configs:\n");
        for target in members {
            let _ = writeln!(
                out,
                "      - targets: [{}]",
                yaml_string(&target.addr.to_string())
            );
            out.push_str("        labels:\n");
            let _ = writeln!(
                out,
                "          {INSTANCE_ID_LABEL}: {}",
                yaml_string(&target.instance)
            );
        }
    }
    out
}

/// A Prometheus duration: whole seconds as `Ns`, else milliseconds (at
/// least 1 ms).
fn prometheus_duration(duration: Duration) -> String {
    let millis = duration.as_millis().max(1);
    if millis.is_multiple_of(1000) {
        format!("{}s", millis / 1000)
    } else {
        format!("{millis}ms")
    }
}

/// A YAML double-quoted scalar: a JSON string is one.
fn yaml_string(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

/// What went wrong starting or asking Prometheus.
#[derive(Debug, thiserror::Error)]
pub enum PrometheusError {
    /// The `prometheus` executable is not on `PATH`.
    #[error(
        "{program} is not installed (not found on PATH): install the Debian package \
         `prometheus` (apt-get install prometheus)"
    )]
    NotInstalled {
        /// The program that was looked for.
        program: String,
    },
    /// The process could not be started for another reason.
    #[error("cannot start {program}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The config, log or TSDB directory could not be written.
    #[error("cannot write {}", path.display())]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A topology names an admin address that is not `ip:port`.
    #[error("{daemon}: admin address {addr:?} is not ip:port")]
    BadAdminAddress {
        /// Which daemon.
        daemon: String,
        /// The address as written.
        addr: String,
    },
    /// Prometheus exited before it was ready (bad config, port taken, …).
    #[error("prometheus exited ({status}) before it was ready; its log ends:\n{log_tail}")]
    Exited {
        /// Its exit status.
        status: ExitStatus,
        /// The last lines of its log.
        log_tail: String,
    },
    /// Prometheus did not answer `/-/ready` in time; it was killed.
    #[error("prometheus not ready within {timeout:?}; killed. Its log ends:\n{log_tail}")]
    NotReady {
        /// How long it was given.
        timeout: Duration,
        /// The last lines of its log.
        log_tail: String,
    },
    /// An HTTP exchange with Prometheus failed.
    #[error("GET {path} from prometheus")]
    Http {
        /// The request path.
        path: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Prometheus answered with an error or something that is not the API's
    /// JSON.
    #[error("prometheus API: {0}")]
    Api(String),
    /// Some targets were not up when the timeout passed; every target is
    /// listed with its health.
    #[error("prometheus targets not all up: {}", describe_targets(.0))]
    TargetsDown(Vec<TargetHealth>),
}

/// One line per target that is not up.
fn describe_targets(targets: &[TargetHealth]) -> String {
    let mut out = String::new();
    for target in targets.iter().filter(|t| !t.is_up()) {
        let _ = write!(
            out,
            "\n  {}/{} ({}): {}",
            target.job, target.instance, target.addr, target.health
        );
        if !target.last_error.is_empty() {
            let _ = write!(out, ": {}", target.last_error);
        }
    }
    out
}

/// How Prometheus sees one [`ScrapeTarget`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetHealth {
    /// The target's job.
    pub job: String,
    /// The target's id (`instance_id`).
    pub instance: String,
    /// The scraped address.
    pub addr: SocketAddr,
    /// `"up"`, `"down"`, or `"unknown"` (not scraped yet, or not yet among
    /// Prometheus's active targets).
    pub health: String,
    /// Why the last scrape failed; empty when it did not.
    pub last_error: String,
}

impl TargetHealth {
    /// Whether the last scrape succeeded.
    pub fn is_up(&self) -> bool {
        self.health == "up"
    }
}

/// How to run Prometheus; [`Default`] gives what [`PrometheusServer::start`]
/// uses.
#[derive(Debug, Clone)]
pub struct PrometheusOptions {
    /// The executable; `prometheus` (from `PATH`) by default.
    pub program: PathBuf,
    /// How often every target is scraped; [`DEFAULT_SCRAPE_INTERVAL`].
    pub scrape_interval: Duration,
    /// The web listen address; `None` (the default) picks a free port on
    /// 127.0.0.1.
    pub listen: Option<SocketAddr>,
    /// How long to wait for `/-/ready`; [`DEFAULT_READY_TIMEOUT`].
    pub ready_timeout: Duration,
}

impl Default for PrometheusOptions {
    fn default() -> Self {
        Self {
            program: PathBuf::from("prometheus"),
            scrape_interval: DEFAULT_SCRAPE_INTERVAL,
            listen: None,
            ready_timeout: DEFAULT_READY_TIMEOUT,
        }
    }
}

/// A running Prometheus process; dropping it stops and reaps the process.
#[derive(Debug)]
pub struct PrometheusServer {
    child: Mutex<Option<Child>>,
    addr: SocketAddr,
    dir: PathBuf,
    targets: Vec<ScrapeTarget>,
}

impl PrometheusServer {
    /// Writes `dir/prometheus.yml` scraping `targets` every second, starts
    /// `prometheus --config.file dir/prometheus.yml --storage.tsdb.path
    /// dir/tsdb --web.listen-address 127.0.0.1:PORT` (a free port; its log
    /// goes to `dir/prometheus.log`) and waits until `/-/ready` answers 200.
    ///
    /// `dir` is created when missing; a TSDB left there by an earlier run is
    /// reused.
    pub fn start(dir: &Path, targets: &[ScrapeTarget]) -> Result<Self, PrometheusError> {
        Self::start_with(dir, targets, &PrometheusOptions::default())
    }

    /// [`start`](Self::start) with other options.
    pub fn start_with(
        dir: &Path,
        targets: &[ScrapeTarget],
        options: &PrometheusOptions,
    ) -> Result<Self, PrometheusError> {
        let write_error = |path: &Path| {
            let path = path.to_path_buf();
            move |source| PrometheusError::Write { path, source }
        };
        let tsdb = dir.join(TSDB_DIR_NAME);
        fs::create_dir_all(&tsdb).map_err(write_error(&tsdb))?;
        let config = dir.join(CONFIG_FILE_NAME);
        fs::write(&config, scrape_config(targets, options.scrape_interval))
            .map_err(write_error(&config))?;
        let log = dir.join(LOG_FILE_NAME);

        let attempts = if options.listen.is_some() {
            1
        } else {
            PORT_ATTEMPTS
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let addr = match options.listen {
                Some(addr) => addr,
                None => free_port().map_err(|source| PrometheusError::Spawn {
                    program: options.program.display().to_string(),
                    source,
                })?,
            };
            let log_file = File::create(&log).map_err(write_error(&log))?;
            let log_file_too = log_file.try_clone().map_err(write_error(&log))?;
            let child = Command::new(&options.program)
                .arg("--config.file")
                .arg(&config)
                .arg("--storage.tsdb.path")
                .arg(&tsdb)
                .arg("--web.listen-address")
                .arg(addr.to_string())
                .stdin(Stdio::null())
                .stdout(log_file)
                .stderr(log_file_too)
                .spawn()
                .map_err(|source| {
                    let program = options.program.display().to_string();
                    if source.kind() == io::ErrorKind::NotFound {
                        PrometheusError::NotInstalled { program }
                    } else {
                        PrometheusError::Spawn { program, source }
                    }
                })?;
            let server = Self {
                child: Mutex::new(Some(child)),
                addr,
                dir: dir.to_path_buf(),
                targets: targets.to_vec(),
            };
            match server.wait_ready(options.ready_timeout) {
                Ok(()) => return Ok(server),
                Err(PrometheusError::Exited { log_tail, .. })
                    if attempt < attempts && log_tail.contains("address already in use") =>
                {
                    // Someone took the free port first: try another one.
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Polls `/-/ready` until it answers 200, the process exits, or `timeout`
    /// passes (then the process is stopped).
    fn wait_ready(&self, timeout: Duration) -> Result<(), PrometheusError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait() {
                return Err(PrometheusError::Exited {
                    status,
                    log_tail: self.log_tail(),
                });
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                self.stop_process();
                return Err(PrometheusError::NotReady {
                    timeout,
                    log_tail: self.log_tail(),
                });
            }
            let exchange = remaining.min(Duration::from_secs(1));
            if let Ok((200, _)) = telemetry::http_get(self.addr, "/-/ready", exchange) {
                return Ok(());
            }
            thread::sleep(POLL_INTERVAL.min(remaining));
        }
    }

    /// The base URL of the web UI and API, e.g. `http://127.0.0.1:34567`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address Prometheus listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The directory holding the config, the log and the TSDB.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The config file Prometheus runs with.
    pub fn config_path(&self) -> PathBuf {
        self.dir.join(CONFIG_FILE_NAME)
    }

    /// The file receiving Prometheus's log.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join(LOG_FILE_NAME)
    }

    /// The process id, until the process has been stopped.
    pub fn pid(&self) -> Option<u32> {
        let child = self.child.lock().unwrap_or_else(PoisonError::into_inner);
        child.as_ref().map(Child::id)
    }

    /// The targets it scrapes.
    pub fn targets(&self) -> &[ScrapeTarget] {
        &self.targets
    }

    /// The health of every configured target, in the order given to
    /// [`start`](Self::start), as `/api/v1/targets` reports it now.
    pub fn target_health(&self) -> Result<Vec<TargetHealth>, PrometheusError> {
        let data: TargetsData = self.api("/api/v1/targets?state=active")?;
        Ok(self
            .targets
            .iter()
            .map(|target| {
                let active = data.active_targets.iter().find(|active| {
                    active.labels.get("job") == Some(&target.job)
                        && active.labels.get(INSTANCE_ID_LABEL) == Some(&target.instance)
                });
                let (health, last_error) = match active {
                    Some(active) => (active.health.clone(), active.last_error.clone()),
                    None => (
                        "unknown".to_owned(),
                        "not among prometheus's active targets yet".to_owned(),
                    ),
                };
                TargetHealth {
                    job: target.job.clone(),
                    instance: target.instance.clone(),
                    addr: target.addr,
                    health,
                    last_error,
                }
            })
            .collect())
    }

    /// Polls `/api/v1/targets` until every configured target's health is
    /// `up` and returns their health; when `timeout` passes first, the
    /// error is [`PrometheusError::TargetsDown`] with every target's last
    /// health.
    ///
    /// A fresh Prometheus scrapes for the first time about 5 s after its
    /// start, so give it more than that.
    pub fn wait_targets_up(&self, timeout: Duration) -> Result<Vec<TargetHealth>, PrometheusError> {
        let deadline = Instant::now() + timeout;
        loop {
            let health = self.target_health()?;
            if health.iter().all(TargetHealth::is_up) {
                return Ok(health);
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(PrometheusError::TargetsDown(health));
            }
            thread::sleep(POLL_INTERVAL.min(remaining));
        }
    }

    /// Runs the instant query `promql` (`/api/v1/query`, evaluated now) and
    /// returns its samples as (labels, value); a scalar result is one sample
    /// without labels. Range (matrix) results are an
    /// [`Api`](PrometheusError::Api) error.
    pub fn query(&self, promql: &str) -> Result<Vec<Sample>, PrometheusError> {
        let path = format!("/api/v1/query?query={}", percent_encode(promql));
        let data: QueryData = self.api(&path)?;
        let parse_value = |(_, text): &(serde_json::Value, String)| {
            text.parse::<f64>()
                .map_err(|_| PrometheusError::Api(format!("sample value {text:?} is not a number")))
        };
        match data.result_type.as_str() {
            "vector" => {
                let samples: Vec<VectorSample> = serde_json::from_value(data.result)
                    .map_err(|e| PrometheusError::Api(format!("malformed vector result: {e}")))?;
                samples
                    .into_iter()
                    .map(|sample| Ok((sample.metric, parse_value(&sample.value)?)))
                    .collect()
            }
            "scalar" => {
                let value: (serde_json::Value, String) = serde_json::from_value(data.result)
                    .map_err(|e| PrometheusError::Api(format!("malformed scalar result: {e}")))?;
                Ok(vec![(BTreeMap::new(), parse_value(&value)?)])
            }
            other => Err(PrometheusError::Api(format!(
                "query {promql:?} gave a {other} result; only vectors and scalars are supported"
            ))),
        }
    }

    /// GETs an API path and returns its `data`, or the API's error.
    fn api<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, PrometheusError> {
        let (status, body) =
            telemetry::http_get(self.addr, path, HTTP_TIMEOUT).map_err(|source| {
                PrometheusError::Http {
                    path: path.to_owned(),
                    source,
                }
            })?;
        let response: ApiResponse<T> = serde_json::from_str(&body).map_err(|e| {
            PrometheusError::Api(format!(
                "GET {path}: HTTP {status} with a body that is not the API's JSON ({e}): {}",
                body.chars().take(500).collect::<String>()
            ))
        })?;
        match response {
            ApiResponse {
                status: ref api_status,
                data: Some(data),
                ..
            } if api_status == "success" && status == 200 => Ok(data),
            ApiResponse {
                error_type, error, ..
            } => Err(PrometheusError::Api(format!(
                "GET {path}: HTTP {status}, {}: {}",
                error_type.as_deref().unwrap_or("error"),
                error.as_deref().unwrap_or("no data and no error message")
            ))),
        }
    }

    /// Stops Prometheus (SIGTERM, SIGKILL after 10 s) and reaps it.
    pub fn stop(self) {
        // Drop does it.
    }

    /// The exit status if the process has exited (it is then reaped).
    fn try_wait(&self) -> Option<ExitStatus> {
        let mut child = self.child.lock().unwrap_or_else(PoisonError::into_inner);
        child.as_mut()?.try_wait().ok().flatten()
    }

    /// SIGTERM, wait up to [`STOP_TIMEOUT`], then SIGKILL; always reaps.
    fn stop_process(&self) {
        let mut slot = self.child.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(mut child) = slot.take() else {
            return;
        };
        if let Ok(None) = child.try_wait() {
            if let Ok(pid) = libc::pid_t::try_from(child.id()) {
                // SAFETY: kill(2) takes plain integers and touches no memory of
                // ours; the child is not reaped yet, so the pid is still ours.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
            let deadline = Instant::now() + STOP_TIMEOUT;
            while let Ok(None) = child.try_wait() {
                if Instant::now() >= deadline {
                    break;
                }
                thread::sleep(Duration::from_millis(10));
            }
        }
        // Both are no-ops for a process already reaped.
        let _ = child.kill();
        let _ = child.wait();
    }

    /// The last lines of the log.
    fn log_tail(&self) -> String {
        let text = fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let start = lines.len().saturating_sub(LOG_TAIL_LINES);
        let tail = lines[start..].join("\n");
        if tail.is_empty() {
            "(nothing)".to_owned()
        } else {
            tail
        }
    }
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        self.stop_process();
    }
}

/// A loopback port that was free a moment ago.
fn free_port() -> io::Result<SocketAddr> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// The envelope of every API answer.
#[derive(Deserialize)]
struct ApiResponse<T> {
    status: String,
    data: Option<T>,
    #[serde(rename = "errorType")]
    error_type: Option<String>,
    error: Option<String>,
}

/// `/api/v1/targets`'s data.
#[derive(Deserialize)]
struct TargetsData {
    #[serde(rename = "activeTargets", default)]
    active_targets: Vec<ActiveTarget>,
}

/// One active target.
#[derive(Deserialize)]
struct ActiveTarget {
    #[serde(default)]
    labels: BTreeMap<String, String>,
    health: String,
    #[serde(rename = "lastError", default)]
    last_error: String,
}

/// `/api/v1/query`'s data.
#[derive(Deserialize)]
struct QueryData {
    #[serde(rename = "resultType")]
    result_type: String,
    result: serde_json::Value,
}

/// One sample of a vector result: labels and `[timestamp, "value"]`.
#[derive(Deserialize)]
struct VectorSample {
    metric: BTreeMap<String, String>,
    value: (serde_json::Value, String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn config_groups_targets_by_job_in_order() {
        let targets = [
            ScrapeTarget::pmem_server("A", addr("127.0.1.1:9100")),
            ScrapeTarget::fabric_device("F", addr("[::1]:9200")),
            ScrapeTarget::pmem_server("B\"x", addr("127.0.1.3:9100")),
        ];
        let text = scrape_config(&targets, Duration::from_millis(1500));
        let expected = "\
# Prometheus scrape configuration for pmem-fabric daemons, generated by
# testbed::fabric::prometheus::scrape_config.
global:
  scrape_interval: 1500ms
  scrape_timeout: 1500ms
scrape_configs:
  - job_name: \"pmem-server\"
    metrics_path: /metrics
    static_configs:
      - targets: [\"127.0.1.1:9100\"]
        labels:
          instance_id: \"A\"
      - targets: [\"127.0.1.3:9100\"]
        labels:
          instance_id: \"B\\\"x\"
  - job_name: \"fabric-device\"
    metrics_path: /metrics
    static_configs:
      - targets: [\"[::1]:9200\"]
        labels:
          instance_id: \"F\"
";
        assert_eq!(text, expected);
    }

    #[test]
    fn empty_config_and_durations() {
        let text = scrape_config(&[], Duration::from_secs(60));
        assert!(
            text.ends_with("  scrape_interval: 60s\n  scrape_timeout: 10s\nscrape_configs: []\n")
        );
        assert_eq!(prometheus_duration(Duration::from_micros(10)), "1ms");
        assert_eq!(prometheus_duration(Duration::from_secs(5)), "5s");
    }

    #[test]
    fn percent_encoding() {
        assert_eq!(
            percent_encode("sum by (op) (rate(x{a=\"b\"}[1m]))"),
            "sum%20by%20%28op%29%20%28rate%28x%7Ba%3D%22b%22%7D%5B1m%5D%29%29"
        );
        assert_eq!(percent_encode("a_b-c.d~é"), "a_b-c.d~%C3%A9");
    }

    #[test]
    fn sample_values_parse_like_prometheus_writes_them() {
        for (text, expected) in [
            ("1", 1.0),
            ("+Inf", f64::INFINITY),
            ("-Inf", f64::NEG_INFINITY),
        ] {
            assert_eq!(text.parse::<f64>().unwrap(), expected);
        }
        assert!("NaN".parse::<f64>().unwrap().is_nan());
    }

    #[test]
    fn targets_down_names_the_down_ones() {
        let error = PrometheusError::TargetsDown(vec![
            TargetHealth {
                job: PMEM_SERVER_JOB.to_owned(),
                instance: "A".to_owned(),
                addr: addr("127.0.0.1:1"),
                health: "down".to_owned(),
                last_error: "connection refused".to_owned(),
            },
            TargetHealth {
                job: FABRIC_DEVICE_JOB.to_owned(),
                instance: "F".to_owned(),
                addr: addr("127.0.0.1:2"),
                health: "up".to_owned(),
                last_error: String::new(),
            },
        ]);
        assert_eq!(
            error.to_string(),
            "prometheus targets not all up: \n  pmem-server/A (127.0.0.1:1): down: connection refused"
        );
    }
}
