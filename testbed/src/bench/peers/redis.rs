//! redis-server and redis-benchmark: what a user would pick instead.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::report::LatencyHistogram;

use super::output::tail;
use super::process::{Process, run, start_server, strings};
use super::procfs::cpu_seconds;
use super::{PeerError, Quantiles, READY_TIMEOUT, REDIS_KEYSPACE, REDIS_READY_TIMEOUT};

/// How to run a redis server.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// `appendonly yes` with `appendfsync always`; otherwise no persistence
    /// at all (`save ""`, `appendonly no`).
    pub aof_always: bool,
    /// Its working folder: the append-only files go here (created when
    /// missing).
    pub dir: PathBuf,
}

/// A running `redis-server` on a free loopback port; killed and reaped when
/// dropped.
#[derive(Debug)]
pub struct RedisServer {
    process: Process,
    port: u16,
    dir: PathBuf,
    aof_always: bool,
}

impl RedisServer {
    /// Starts `redis-server --port P --bind 127.0.0.1 --protected-mode no
    /// --daemonize no --dir DIR --save ""` with `--appendonly no`, or
    /// `--appendonly yes --appendfsync always`, and waits until it answers
    /// `PING` with `+PONG`.
    pub fn start(cfg: &RedisConfig) -> Result<Self, PeerError> {
        std::fs::create_dir_all(&cfg.dir).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("create redis folder {}: {e}", cfg.dir.display()),
            )
        })?;
        let dir = cfg.dir.to_string_lossy().into_owned();
        let persistence: &[&str] = if cfg.aof_always {
            &["--appendonly", "yes", "--appendfsync", "always"]
        } else {
            &["--appendonly", "no"]
        };
        let (mut process, port) = start_server("redis-server", READY_TIMEOUT, &|port| {
            let mut args = strings(&[
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--protected-mode",
                "no",
                "--daemonize",
                "no",
                "--dir",
                &dir,
                "--save",
                "",
            ]);
            args.extend(strings(persistence));
            args
        })?;
        let deadline = Instant::now() + REDIS_READY_TIMEOUT;
        loop {
            let answer = redis_ping(port);
            if matches!(&answer, Ok(reply) if reply.starts_with("+PONG")) {
                break;
            }
            if let Some(status) = process.exited() {
                return Err(process.not_ready(port, format!("it exited ({status})")));
            }
            if Instant::now() >= deadline {
                let why = match answer {
                    Ok(reply) => format!("PING answered {:?}", reply.trim_end()),
                    Err(e) => format!("PING failed: {e}"),
                };
                return Err(process.not_ready(
                    port,
                    format!("no +PONG within {REDIS_READY_TIMEOUT:?}: {why}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Self {
            process,
            port,
            dir: cfg.dir.clone(),
            aof_always: cfg.aof_always,
        })
    }

    /// The port it listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its process id (for [`cpu_seconds`]).
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Its working folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether it runs with `appendonly yes`, `appendfsync always`.
    pub fn aof_always(&self) -> bool {
        self.aof_always
    }
}

/// One redis-benchmark test.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RedisResult {
    /// `GET` or `SET`.
    pub test: String,
    /// Requests per second.
    pub ops_per_s: f64,
    /// Latency: p50, p99 and max from redis-benchmark's summary, p99.9 from
    /// its percentile distribution.
    pub latency: Quantiles,
    /// Parallel connections.
    pub clients: usize,
    /// Requests pipelined per connection.
    pub pipeline: usize,
    /// Value size, bytes.
    pub value_size: usize,
    /// The latency distribution redis-benchmark printed (percentile and
    /// cumulative distributions, µs); a step function with a few dozen
    /// steps, for a CDF plot.
    pub histogram: LatencyHistogram,
    /// redis-server CPU seconds per million requests of this test.
    #[serde(default)]
    pub server_cpu_s_per_million: Option<f64>,
}

/// The figures of one redis-benchmark test.
#[derive(Debug, Clone)]
pub struct RedisFigures {
    /// Requests per second.
    pub ops_per_s: f64,
    /// Latency quantiles (see [`RedisResult::latency`]).
    pub latency: Quantiles,
    /// The latency distribution (see [`RedisResult::histogram`]).
    pub histogram: LatencyHistogram,
}

/// redis-benchmark against `server`: `-t get|set -d SIZE -c CLIENTS -P
/// PIPELINE -n REQUESTS -r` [`REDIS_KEYSPACE`]. For GET, every key of the
/// keyspace is first SET to a `value_size`-byte value, so every GET hits.
/// redis-benchmark has no time limit of its own; it gets 30 s plus 1 ms per
/// request before it is killed.
pub fn redis_benchmark(
    server: &RedisServer,
    test: &str,
    value_size: usize,
    clients: usize,
    pipeline: usize,
    requests: u64,
) -> Result<RedisResult, PeerError> {
    let test = test.to_ascii_uppercase();
    if test != "GET" && test != "SET" {
        return Err(PeerError::InvalidArgument(format!(
            "redis test {test:?}: only GET and SET are measured"
        )));
    }
    if clients == 0 || pipeline == 0 || requests == 0 {
        return Err(PeerError::InvalidArgument(format!(
            "redis-benchmark needs at least one client, one request in a pipeline and one \
             request (got {clients} clients, pipeline {pipeline}, {requests} requests)"
        )));
    }
    // redis-benchmark waits forever for a server that is gone.
    let reply = redis_ping(server.port())?;
    if !reply.starts_with("+PONG") {
        return Err(PeerError::Failed {
            command: format!("PING to redis on 127.0.0.1:{}", server.port()),
            status: "unexpected reply".into(),
            stderr_tail: reply.trim_end().to_owned(),
        });
    }
    if test == "GET" {
        redis_fill(server.port(), REDIS_KEYSPACE, value_size)?;
    }
    let args = strings(&[
        "-h",
        "127.0.0.1",
        "-p",
        &server.port().to_string(),
        "-t",
        &test.to_ascii_lowercase(),
        "-d",
        &value_size.to_string(),
        "-c",
        &clients.to_string(),
        "-P",
        &pipeline.to_string(),
        "-n",
        &requests.to_string(),
        "-r",
        &REDIS_KEYSPACE.to_string(),
    ]);
    let timeout = Duration::from_secs(30) + Duration::from_millis(requests);
    let cpu_before = cpu_seconds(server.pid()).ok();
    let done = run("redis-benchmark", &args, timeout)?;
    let server_cpu_s_per_million = cpu_before
        .zip(cpu_seconds(server.pid()).ok())
        .map(|(before, after)| (after - before) / requests as f64 * 1e6);
    let figures = parse_redis_benchmark(&test, &done.stdout)?;
    Ok(RedisResult {
        server_cpu_s_per_million,
        test,
        ops_per_s: figures.ops_per_s,
        latency: figures.latency,
        clients,
        pipeline,
        value_size,
        histogram: figures.histogram,
    })
}

/// Reads one test of redis-benchmark 7.0's default (not `--csv`) output:
/// `====== GET ======`, the `Latency by percentile distribution` and
/// `Cumulative distribution of latencies` sections, `throughput summary: N
/// requests per second` and the `latency summary (msec)` table. Progress
/// lines (ended by carriage returns) are ignored.
pub fn parse_redis_benchmark(test: &str, output: &str) -> Result<RedisFigures, PeerError> {
    let missing = |what: &str| PeerError::Parse {
        program: "redis-benchmark".into(),
        what: what.into(),
        output_tail: tail(output),
    };
    let title = format!("====== {} ======", test.to_ascii_uppercase());
    let lines: Vec<&str> = output
        .split(['\r', '\n'])
        .map(str::trim)
        .skip_while(|line| *line != title)
        .collect();
    if lines.is_empty() {
        return Err(missing(&format!("the test's title `{title}`")));
    }
    // Only this test's section, when the output holds several.
    let end = lines
        .iter()
        .skip(1)
        .position(|line| line.starts_with("====== "))
        .map_or(lines.len(), |i| i + 1);
    let lines = &lines[..end];
    // (value in ms, cumulative count) from both distributions; each line
    // reads `P% <= V milliseconds (cumulative count N)`.
    let mut points: Vec<(f64, u64)> = Vec::new();
    let mut p999_ms = None;
    for line in lines {
        let Some((percent, rest)) = line.split_once("% <= ") else {
            continue;
        };
        let Some((value, rest)) = rest.split_once(" milliseconds (cumulative count ") else {
            continue;
        };
        let (Ok(percent), Ok(value), Ok(count)) = (
            percent.trim().parse::<f64>(),
            value.trim().parse::<f64>(),
            rest.trim_end_matches(')').trim().parse::<u64>(),
        ) else {
            continue;
        };
        if p999_ms.is_none() && percent >= 99.9 {
            p999_ms = Some(value);
        }
        points.push((value, count));
    }
    if points.is_empty() {
        return Err(missing(
            "the latency distribution (`P% <= V milliseconds …`)",
        ));
    }
    points.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut histogram = LatencyHistogram::new();
    let mut seen = 0u64;
    for (value_ms, count) in points {
        if count > seen {
            histogram.record_n(ms_to_us(value_ms).round() as u64, count - seen);
            seen = count;
        }
    }
    let ops_per_s = lines
        .iter()
        .find_map(|line| {
            let rest = line.strip_prefix("throughput summary:")?;
            rest.trim()
                .strip_suffix("requests per second")?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .ok_or_else(|| missing("`throughput summary: N requests per second`"))?;
    let summary = lines
        .iter()
        .position(|line| line.starts_with("latency summary (msec)"))
        .ok_or_else(|| missing("`latency summary (msec)`"))?;
    let mut table = lines[summary + 1..].iter().filter(|l| !l.is_empty());
    let (Some(names), Some(values)) = (table.next(), table.next()) else {
        return Err(missing("the latency summary table"));
    };
    let column = |name: &str| -> Result<f64, PeerError> {
        names
            .split_whitespace()
            .zip(values.split_whitespace())
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| v.parse::<f64>().ok())
            .map(ms_to_us)
            .ok_or_else(|| missing(&format!("`{name}` of the latency summary")))
    };
    let p99_us = column("p99")?;
    let max_us = column("max")?;
    let latency = Quantiles {
        p50_us: column("p50")?,
        p99_us,
        p999_us: p999_ms
            .map(ms_to_us)
            .unwrap_or_else(|| histogram.quantile(0.999) as f64)
            .clamp(p99_us, max_us.max(p99_us)),
        max_us,
        samples: histogram.count(),
    };
    Ok(RedisFigures {
        ops_per_s,
        latency,
        histogram,
    })
}

/// Milliseconds to microseconds, to the nanosecond (redis-benchmark prints
/// three decimals: `1.015` is 1015 µs, not 1014.9999999999999).
pub(super) fn ms_to_us(ms: f64) -> f64 {
    (ms * 1e6).round() / 1e3
}

/// Sends `PING` to redis on 127.0.0.1:`port` and returns its reply line.
pub(super) fn redis_ping(port: u16) -> io::Result<String> {
    let mut conn = redis_connect(port, Duration::from_secs(2))?;
    conn.write_all(b"PING\r\n")?;
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    while !reply.ends_with(b"\r\n") && reply.len() < 4096 {
        if conn.read(&mut byte)? == 0 {
            break;
        }
        reply.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

/// A connection to redis on 127.0.0.1:`port` with read and write timeouts.
pub(super) fn redis_connect(port: u16, timeout: Duration) -> io::Result<TcpStream> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let conn = TcpStream::connect_timeout(&addr, timeout)?;
    conn.set_read_timeout(Some(timeout))?;
    conn.set_write_timeout(Some(timeout))?;
    conn.set_nodelay(true)?;
    Ok(conn)
}

/// SETs `key:000000000000` … up to `keyspace` keys (redis-benchmark's `-r`
/// names) to `value_size` bytes of `x`, pipelined, and checks every reply.
pub(super) fn redis_fill(port: u16, keyspace: u64, value_size: usize) -> Result<(), PeerError> {
    const BATCH: u64 = 500;
    let mut conn = redis_connect(port, Duration::from_secs(60))?;
    let value = vec![b'x'; value_size];
    let mut request = Vec::new();
    let mut replies = Vec::new();
    let mut start = 0;
    while start < keyspace {
        let end = (start + BATCH).min(keyspace);
        request.clear();
        for key in start..end {
            request.extend_from_slice(b"*3\r\n$3\r\nSET\r\n$16\r\n");
            request.extend_from_slice(format!("key:{key:012}\r\n${value_size}\r\n").as_bytes());
            request.extend_from_slice(&value);
            request.extend_from_slice(b"\r\n");
        }
        conn.write_all(&request)?;
        // Every reply to SET is one line: `+OK` or an error.
        replies.clear();
        let mut lines = 0;
        let mut chunk = [0u8; 8192];
        while lines < end - start {
            let n = conn.read(&mut chunk)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "redis closed the connection while keys were being set",
                )
                .into());
            }
            lines += chunk[..n].iter().filter(|b| **b == b'\n').count() as u64;
            replies.extend_from_slice(&chunk[..n]);
        }
        if let Some(bad) = replies
            .split(|b| *b == b'\n')
            .find(|line| !line.is_empty() && *line != b"+OK\r")
        {
            return Err(PeerError::Failed {
                command: format!("SET key:… to {value_size} bytes on 127.0.0.1:{port}"),
                status: "error reply".into(),
                stderr_tail: String::from_utf8_lossy(bad).trim_end().to_owned(),
            });
        }
        start = end;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// CPU time.
