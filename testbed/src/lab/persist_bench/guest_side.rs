//! The guest side of `testbed bench-persist` (`testbed
//! bench-persist-guest`): the two pmem-servers and the two redis servers
//! started in the guest, one connection to each, and the interleaved
//! rounds of timed durable writes.

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use proto::Status;
use proto::request::Repr;
use topology::secrets::{Principal, read_key};

use super::{DISK_MOUNT, GuestResults, PMEM_MOUNT, PersistPlan, Series, System};
use crate::bench::peers::{RedisConfig, RedisServer};
use crate::fabric::launch::log_tail;
use crate::lab::guest::SECRETS;
use crate::lab::raw_client::{RawClient, Timeouts};
use crate::stats::quantile;

/// Bytes of each region the writes go round.
const SPAN: u64 = 4 << 20;
/// How long a server in the guest may take to print its ready line.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long one request may take before the bench gives up.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// How long connecting to a pmem-server, and each request, may take.
const TIMEOUTS: Timeouts = Timeouts {
    connect: Duration::from_secs(5),
    io: IO_TIMEOUT,
};

/// What the guest runs: `testbed bench-persist-guest`.
#[derive(Debug, Clone)]
pub struct GuestArgs {
    /// The host's work folder, shared with the guest: the topology is read
    /// from it, the servers' logs and `guest-results.json` go to it.
    pub work: PathBuf,
    /// What to measure.
    pub plan: PersistPlan,
}

/// A pmem-server child process; killed when dropped.
#[derive(Debug)]
struct ServerChild {
    child: Child,
}

impl Drop for ServerChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `testbed daemon pmem-server` for `server` with its regions in
/// `data_dir` and `persistence`, waits for its ready line and returns it
/// with the child.
fn start_server(
    work: &Path,
    server: &str,
    data_dir: &str,
    persistence: &str,
) -> anyhow::Result<(ServerChild, BTreeMap<String, String>)> {
    let exe = std::env::current_exe().context("the testbed binary")?;
    let log_path = work.join(format!("server-{server}.log"));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("create {}", log_path.display()))?;
    let mut child = Command::new(exe)
        .args(["daemon", "pmem-server", "--config"])
        .arg(work.join("topology.toml"))
        .args(["--server", server, "--data-dir", data_dir])
        .args(["--persistence", persistence])
        .arg("--secrets")
        .arg(work.join(SECRETS))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .with_context(|| format!("start pmem-server {server}"))?;
    let stdout = child.stdout.take().context("the server's stdout")?;
    let guard = ServerChild { child };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        // Every line is read, so the pipe never fills; the ready line is
        // handed over.
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("ready ") {
                let _ = tx.send(line);
            }
        }
    });
    let line = rx.recv_timeout(READY_TIMEOUT).map_err(|_| {
        anyhow::anyhow!(
            "pmem-server {server} printed no ready line within {READY_TIMEOUT:?}:\n{}",
            log_tail(&log_path, 30)
        )
    })?;
    let fields = testkit::parse_ready_line(&line).map_err(anyhow::Error::msg)?;
    Ok((guard, fields))
}

/// Runs the bench in the guest and writes `guest-results.json` to the work
/// folder.
pub fn guest_main(args: &GuestArgs) -> anyhow::Result<()> {
    let work = &args.work;
    let plan = args.plan;
    let topology =
        topology::Topology::load(work.join("topology.toml")).context("the bench's topology")?;
    let layout = topology::Layout::new(&topology).context("the bench topology's layout")?;
    let region = |id: &str| {
        layout
            .entries()
            .iter()
            .find(|e| e.region_id.as_str() == id)
            .map(|e| e.region)
            .with_context(|| format!("no region {id} in the bench topology"))
    };
    let client_key = read_key(&work.join(SECRETS), Principal::Client("c"))?;
    let mut results = GuestResults::default();
    let mut servers = Vec::new();
    let mut fabric = BTreeMap::new();
    for (system, server, dir, persistence, region_id) in [
        (System::Dax, "D", format!("{PMEM_MOUNT}/D"), "dax", "D1"),
        (System::Msync, "M", format!("{DISK_MOUNT}/M"), "msync", "M1"),
    ] {
        let (child, fields) = start_server(work, server, &dir, persistence)?;
        let mode = fields.get("mode").cloned().unwrap_or_default();
        ensure!(
            mode == persistence,
            "pmem-server {server} runs in mode {mode:?}, not {persistence}"
        );
        results.server_modes.insert(server.to_owned(), mode);
        let nic: SocketAddr = fields
            .get("nic.n0")
            .context("no nic.n0 in the ready line")?
            .parse()
            .context("the ready line's nic.n0")?;
        let link = RawClient::connect(nic, "c", client_key, region(region_id)?, TIMEOUTS)
            .with_context(|| format!("connect to pmem-server {server} at {nic}"))?;
        ensure!(
            !link.key().is_none(),
            "pmem-server {server}'s MAP gives no key for region {region_id}"
        );
        servers.push(child);
        fabric.insert(system, link);
    }
    for server in ["D", "M"] {
        let log =
            std::fs::read_to_string(work.join(format!("server-{server}.log"))).unwrap_or_default();
        results.device_lines.extend(
            log.lines()
                .filter_map(|l| l.find("pmem device ").map(|at| l[at..].to_owned())),
        );
    }
    let redis = RedisServer::start(&RedisConfig {
        aof_always: true,
        dir: PathBuf::from(format!("{DISK_MOUNT}/redis")),
    })
    .context("start redis-server (AOF on the disk)")?;
    let redis_dax = RedisServer::start(&RedisConfig {
        aof_always: true,
        dir: PathBuf::from(format!("{PMEM_MOUNT}/redis")),
    })
    .context("start redis-server (AOF on the fsdax mount)")?;
    let mut resp = BTreeMap::new();
    resp.insert(System::Redis, Resp::connect(redis.port())?);
    resp.insert(System::RedisDax, Resp::connect(redis_dax.port())?);

    let data = vec![0x5Au8; plan.size];
    let mut next = BTreeMap::new();
    let mut measure = |system: System, ops: usize| -> anyhow::Result<Vec<f64>> {
        let counter = next.entry(system).or_insert(0u64);
        let mut us = Vec::with_capacity(ops);
        for _ in 0..ops {
            let i = *counter;
            *counter += 1;
            let took = match system {
                System::Dax | System::Msync => {
                    let link = fabric.get_mut(&system).context("no connection")?;
                    let offset = (i * plan.size as u64) % (SPAN - plan.size as u64);
                    write_persist(link, offset, &data)
                }
                System::Redis | System::RedisDax => {
                    let conn = resp.get_mut(&system).context("no connection")?;
                    let key = format!("k:{:04}", i % 1000);
                    conn.set(key.as_bytes(), &data).map_err(anyhow::Error::from)
                }
            }
            .with_context(|| format!("{} operation {i}", system.name()))?;
            us.push(took.as_secs_f64() * 1e6);
        }
        Ok(us)
    };
    for system in System::ALL {
        measure(system, plan.warmup)?;
    }
    for round in 0..plan.rounds {
        for k in 0..System::ALL.len() {
            let system = System::ALL[(round + k) % System::ALL.len()];
            let us = measure(system, plan.ops)?;
            println!(
                "bench-persist round {round} {}: p50 {:.0} µs",
                system.name(),
                quantile(&us, 0.5)
            );
            results.series.push(Series { system, round, us });
        }
    }
    let path = work.join("guest-results.json");
    std::fs::write(&path, serde_json::to_string(&results)?)
        .with_context(|| format!("write {}", path.display()))?;
    drop((redis, redis_dax, servers));
    Ok(())
}

/// One WRITE_PERSIST of `data` at `offset` on `client`; how long it took.
fn write_persist(client: &mut RawClient, offset: u64, data: &[u8]) -> anyhow::Result<Duration> {
    let request = Repr::write_persist(client.at(offset), client.key(), data);
    let (answer, took) = client.call_timed(request)?;
    match answer.status {
        Status::Ok => Ok(took),
        status => anyhow::bail!("WRITE_PERSIST answered {status:?}"),
    }
}

/// What went wrong with a redis reply.
#[derive(Debug, thiserror::Error)]
pub enum RespError {
    /// The connection failed.
    #[error("redis connection")]
    Io(#[from] io::Error),
    /// redis answered with an error.
    #[error("redis answered an error: {0}")]
    Error(String),
    /// redis answered something other than `+OK`.
    #[error("unexpected redis reply {0:?}")]
    Unexpected(String),
}

/// A minimal RESP client: SET, and its `+OK` reply.
#[derive(Debug)]
struct Resp {
    reader: BufReader<TcpStream>,
    request: Vec<u8>,
    line: Vec<u8>,
}

impl Resp {
    /// Connects to redis on 127.0.0.1:`port`.
    fn connect(port: u16) -> anyhow::Result<Resp> {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .with_context(|| format!("connect to redis at {addr}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        stream.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(Resp {
            reader: BufReader::new(stream),
            request: Vec::new(),
            line: Vec::new(),
        })
    }

    /// `SET key value`; how long until `+OK` came back.
    fn set(&mut self, key: &[u8], value: &[u8]) -> Result<Duration, RespError> {
        encode_command(&mut self.request, &[b"SET", key, value]);
        let started = Instant::now();
        self.reader.get_mut().write_all(&self.request)?;
        self.line.clear();
        let n = (&mut self.reader)
            .take(4096)
            .read_until(b'\n', &mut self.line)?;
        let took = started.elapsed();
        if n == 0 {
            return Err(RespError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "redis closed the connection",
            )));
        }
        check_ok(&self.line)?;
        Ok(took)
    }
}

/// Writes `args` as a RESP array of bulk strings into `out` (cleared first).
pub fn encode_command(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.clear();
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

/// Checks a one-line RESP reply is `+OK`.
pub fn check_ok(line: &[u8]) -> Result<(), RespError> {
    let text = String::from_utf8_lossy(line);
    let text = text.trim_end_matches(['\r', '\n']);
    match text.strip_prefix('-') {
        Some(error) => Err(RespError::Error(error.to_owned())),
        None if text == "+OK" => Ok(()),
        None => Err(RespError::Unexpected(text.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resp_set_and_replies() {
        let mut out = Vec::new();
        encode_command(&mut out, &[b"SET", b"k:1", b"xy"]);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$3\r\nk:1\r\n$2\r\nxy\r\n");
        assert!(check_ok(b"+OK\r\n").is_ok());
        assert!(matches!(
            check_ok(b"-MISCONF no disk\r\n"),
            Err(RespError::Error(m)) if m == "MISCONF no disk"
        ));
        assert!(matches!(
            check_ok(b"$-1\r\n"),
            Err(RespError::Unexpected(_))
        ));
    }
}
