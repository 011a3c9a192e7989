//! The floors and the peers pmem-fabric is measured against,
//! run from the distribution's packages on this machine, over loopback:
//!
//! - [`sockperf_rtt`]: the network floor of one hop, `sockperf ping-pong`
//!   over TCP with `--full-rtt` (round trips, not half round trips);
//! - [`iperf3_bandwidth`]: the byte-moving floor, one `iperf3` TCP stream;
//! - [`RedisServer`] and [`redis_benchmark`]: what a user would pick
//!   instead, `redis-server` measured by `redis-benchmark`, in memory or with
//!   `appendonly yes`, `appendfsync always`;
//! - [`cpu_seconds`]: the CPU time a process has used, from `/proc`.
//!
//! [`require_tools`] says exactly which program is missing, the package
//! that provides it and how to install it; the bench installs nothing
//! itself (`scripts/test.sh` and `scripts/ensure-packages.sh` do).
//!
//! Every server runs on `127.0.0.1` on a free port from below the ephemeral
//! range, is ready only once it holds a listening socket on that port (read
//! from `/proc/net/tcp` and the process's own file descriptors, so a stranger
//! on the same port is never mistaken for it), and is killed and reaped when
//! its guard drops. Every client runs under a timeout and is killed when it
//! overshoots.
//!
//! The parsers of the tools' outputs are public so that they can be tested on
//! captured outputs.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::ops::Range;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::report::LatencyHistogram;

/// A distribution package the bench needs: (program probed on PATH, Debian
/// package).
pub const TOOLS: &[(&str, &str)] = &[
    ("sockperf", "sockperf"),
    ("iperf3", "iperf3"),
    ("redis-server", "redis-server"),
    ("redis-benchmark", "redis-tools"),
];

/// The keys `redis-benchmark` uses (`-r`): `key:000000000000` up to
/// `key:000000009999`. GET runs find every one of them present.
pub const REDIS_KEYSPACE: u64 = 10_000;

/// How long `sockperf ping-pong` waits after connecting before it measures;
/// it is fixed in sockperf 3.7 and comes on top of the measured time.
pub const SOCKPERF_SETTLE: Duration = Duration::from_secs(2);

/// How long a client may run past its expected end before it is killed.
const OVERSHOOT: Duration = Duration::from_secs(5);

/// How long a server may take to listen on its port.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long redis may take to answer PING (it answers `-LOADING` while it
/// reads an append-only file left in its folder).
const REDIS_READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How many bytes of a client's output are kept (all of it, in practice).
const CLIENT_OUTPUT_CAP: usize = 16 << 20;

/// How many bytes of a server's output are kept, for error messages.
const SERVER_OUTPUT_CAP: usize = 64 << 10;

/// How many characters of output an error message quotes.
const TAIL_CHARS: usize = 2_000;

/// Ports handed out come from below the kernel's ephemeral range
/// (32768–60999 by default), so an outgoing connection never takes one
/// between the check and the server's bind.
const PORT_RANGE: Range<u16> = 30_000..32_700;

/// Why a floor or a peer could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// A program the bench needs is not installed.
    #[error(
        "`{program}` is not installed: it comes with the Debian package `{package}`; \
         install it as root with `apt-get install -y --no-install-recommends {package}` \
         (or run scripts/ensure-packages.sh {program}:{package}){also}"
    )]
    Missing {
        /// The Debian package that provides it.
        package: String,
        /// The program looked for on PATH.
        program: String,
        /// The other programs missing too, said after the first.
        also: String,
    },
    /// A program could not be started.
    #[error("cannot start `{program}`: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// What the operating system said.
        #[source]
        source: io::Error,
    },
    /// A program exited with a failure or reported an error.
    #[error("`{command}` failed ({status}): {stderr_tail}")]
    Failed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// The end of what it wrote (its error output, else its output).
        stderr_tail: String,
    },
    /// A program ran past its time and was killed.
    #[error(
        "`{command}` did not finish within {after:?} and was killed; its output ended with: {output_tail}"
    )]
    Timeout {
        /// The command line.
        command: String,
        /// The time it had.
        after: Duration,
        /// The end of what it wrote.
        output_tail: String,
    },
    /// A server did not get ready.
    #[error(
        "`{command}` did not get ready on 127.0.0.1:{port}: {why}; its output ended with: {output_tail}"
    )]
    NotReady {
        /// The command line.
        command: String,
        /// The port it was given.
        port: u16,
        /// What went wrong.
        why: String,
        /// The end of what it wrote.
        output_tail: String,
    },
    /// A program's output did not have the figures expected.
    #[error("cannot read {what} from the output of `{program}`: {output_tail}")]
    Parse {
        /// The program.
        program: String,
        /// The figure or section missing.
        what: String,
        /// The end of the output.
        output_tail: String,
    },
    /// The caller asked for something the tools cannot do.
    #[error("invalid benchmark argument: {0}")]
    InvalidArgument(String),
    /// Reading a file, a socket or `/proc` failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Latency quantiles in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Quantiles {
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest sample.
    pub max_us: f64,
    /// How many samples the quantiles come from.
    pub samples: u64,
}

impl Quantiles {
    /// The quantiles of a histogram.
    pub fn from_histogram(h: &LatencyHistogram) -> Self {
        Self {
            p50_us: h.quantile(0.5) as f64,
            p99_us: h.quantile(0.99) as f64,
            p999_us: h.quantile(0.999) as f64,
            max_us: h.max() as f64,
            samples: h.count(),
        }
    }
}

// ---------------------------------------------------------------------------
// Installing the tools.

/// The tools of `tools` whose program is not on PATH, as (program, package).
pub fn missing_tools<'a>(tools: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    tools
        .iter()
        .filter(|(program, _)| find_on_path(program).is_none())
        .copied()
        .collect()
}

/// `Ok` when every program of `tools` (program, package) is on PATH; else
/// [`PeerError::Missing`] naming the first missing program, its package
/// and how to install it, and the others missing.
pub fn require_tools(tools: &[(&str, &str)]) -> Result<(), PeerError> {
    let missing = missing_tools(tools);
    let Some(&(program, package)) = missing.first() else {
        return Ok(());
    };
    let also = if missing.len() > 1 {
        let others: Vec<String> = missing[1..]
            .iter()
            .map(|(program, package)| format!("`{program}` ({package})"))
            .collect();
        format!("; also missing: {}", others.join(", "))
    } else {
        String::new()
    };
    Err(PeerError::Missing {
        package: package.to_owned(),
        program: program.to_owned(),
        also,
    })
}

/// The path of `program` on PATH (or `program` itself when it has a slash),
/// when it is an executable file.
fn find_on_path(program: &str) -> Option<PathBuf> {
    let executable = |path: &Path| {
        path.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let path = PathBuf::from(program);
        return executable(&path).then_some(path);
    }
    let dirs = std::env::var_os("PATH")?;
    std::env::split_paths(&dirs)
        .map(|dir| dir.join(program))
        .find(|path| executable(path))
}

// ---------------------------------------------------------------------------
// sockperf.

/// A sockperf ping-pong run: its quantiles and every round trip it measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SockperfRun {
    /// Message size in bytes.
    pub msg_size: usize,
    /// Round-trip quantiles as sockperf computed them.
    pub quantiles: Quantiles,
    /// Mean round trip, µs.
    pub avg_us: f64,
    /// Every measured round trip (from `--full-log`), µs.
    pub histogram: LatencyHistogram,
}

/// The figures of sockperf's summary.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SockperfStats {
    /// Round-trip quantiles.
    pub quantiles: Quantiles,
    /// Mean round trip, µs.
    pub avg_us: f64,
}

/// sockperf ping-pong over TCP loopback with `--full-rtt`: round trips of
/// `msg_size`-byte messages for `duration` (whole seconds, at least one;
/// sockperf drops the first 400 ms and the last 50 ms of it, and waits
/// [`SOCKPERF_SETTLE`] before it starts). Starts `sockperf server --tcp`,
/// runs `sockperf ping-pong --tcp … --full-rtt`, stops the server.
pub fn sockperf_rtt(msg_size: usize, duration: Duration) -> Result<Quantiles, PeerError> {
    sockperf_rtt_run(msg_size, duration).map(|run| run.quantiles)
}

/// [`sockperf_rtt`] with the mean and every round trip, as a histogram.
pub fn sockperf_rtt_run(msg_size: usize, duration: Duration) -> Result<SockperfRun, PeerError> {
    sockperf(msg_size, duration, None)
}

/// [`sockperf_rtt_run`] with the server pinned to CPU `server_cpu` and the
/// client to `client_cpu` (through `taskset -c`, from util-linux).
///
/// Where the two run matters more than anything else on a small virtual
/// machine: on the 2-core machine this was written on, the 64 B p50 was
/// about 14 µs with both on one CPU and 70–85 µs on two CPUs (waking an
/// idle CPU costs the difference), and unpinned runs land on either.
pub fn sockperf_rtt_pinned(
    msg_size: usize,
    duration: Duration,
    server_cpu: usize,
    client_cpu: usize,
) -> Result<SockperfRun, PeerError> {
    sockperf(msg_size, duration, Some((server_cpu, client_cpu)))
}

/// `program args`, or `taskset -c CPU program args` when pinned.
fn pinned(cpu: Option<usize>, program: &str, args: Vec<String>) -> (String, Vec<String>) {
    match cpu {
        None => (program.to_owned(), args),
        Some(cpu) => {
            let mut all = strings(&["-c", &cpu.to_string(), program]);
            all.extend(args);
            ("taskset".to_owned(), all)
        }
    }
}

fn sockperf(
    msg_size: usize,
    duration: Duration,
    cpus: Option<(usize, usize)>,
) -> Result<SockperfRun, PeerError> {
    let secs = whole_seconds(duration);
    let server_cpu = cpus.map(|(server, _)| server);
    let (server_program, _) = pinned(server_cpu, "sockperf", Vec::new());
    let (_server, port) = start_server(&server_program, READY_TIMEOUT, &|port| {
        let args = strings(&[
            "server",
            "--tcp",
            "-i",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ]);
        pinned(server_cpu, "sockperf", args).1
    })?;
    // Removed when dropped; sockperf writes it by name.
    let log = tempfile::Builder::new()
        .prefix("pmem-fabric-sockperf-")
        .suffix(".csv")
        .tempfile()?
        .into_temp_path();
    let args = strings(&[
        "ping-pong",
        "--tcp",
        "-i",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-m",
        &msg_size.to_string(),
        "-t",
        &secs.to_string(),
        "--full-rtt",
        "--full-log",
        &log.to_string_lossy(),
    ]);
    let (program, args) = pinned(cpus.map(|(_, client)| client), "sockperf", args);
    let timeout = Duration::from_secs(secs) + SOCKPERF_SETTLE + OVERSHOOT;
    let done = run(&program, &args, timeout)?;
    let output = done.all_output();
    // sockperf 3.7 exits 0 when it cannot connect, bind or send.
    if let Some(line) = strip_ansi(&output)
        .lines()
        .find(|line| line.contains("ERROR"))
    {
        return Err(PeerError::Failed {
            command: command_line(&program, &args),
            status: done.status.to_string(),
            stderr_tail: line.trim().to_owned(),
        });
    }
    let stats = parse_sockperf(&output)?;
    let log_text = std::fs::read_to_string(&log).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("read sockperf's full log {}: {e}", log.display()),
        )
    })?;
    let histogram = parse_sockperf_full_log(&log_text)?;
    Ok(SockperfRun {
        msg_size,
        quantiles: stats.quantiles,
        avg_us: stats.avg_us,
        histogram,
    })
}

/// Reads the summary of `sockperf ping-pong --full-rtt` (3.7): the
/// observation count, `avg-rtt`, `<MAX> observation` and the percentiles
/// 50, 99 and 99.9, all in µs. Fails when the output reports half round
/// trips (`--full-rtt` missing).
pub fn parse_sockperf(output: &str) -> Result<SockperfStats, PeerError> {
    let text = strip_ansi(output);
    let missing = |what: &str| PeerError::Parse {
        program: "sockperf".into(),
        what: what.into(),
        output_tail: tail(&text),
    };
    if !text.contains("Round trip is") {
        return Err(missing(
            "a round-trip summary (`Summary: Round trip is …`; was --full-rtt given?)",
        ));
    }
    let after = |line: &str, marker: &str| -> Option<f64> {
        let (_, rest) = line.split_once(marker)?;
        let number: String = rest
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        number.parse().ok()
    };
    let find = |marker: &str| text.lines().find_map(|line| after(line, marker));
    let samples = text
        .lines()
        .find_map(|line| {
            let (_, rest) = line.split_once("Total ")?;
            let (count, _) = rest.split_once(" observations")?;
            count.trim().parse::<u64>().ok()
        })
        .ok_or_else(|| missing("the observation count (`Total N observations`)"))?;
    let percentile = |p: &str| {
        find(&format!("---> percentile {p} =")).ok_or_else(|| missing(&format!("percentile {p}")))
    };
    Ok(SockperfStats {
        quantiles: Quantiles {
            p50_us: percentile("50.000")?,
            p99_us: percentile("99.000")?,
            p999_us: percentile("99.900")?,
            max_us: find("---> <MAX> observation =")
                .ok_or_else(|| missing("the largest observation (`<MAX> observation`)"))?,
            samples,
        },
        avg_us: find("avg-rtt=").ok_or_else(|| missing("the mean (`avg-rtt=`)"))?,
    })
}

/// Reads the samples of sockperf's `--full-log` file: after the line
/// `packet, txTime(sec), rxTime(sec), rtt(usec)`, one line per message with
/// its round trip in µs (to the nanosecond).
pub fn parse_sockperf_full_log(text: &str) -> Result<LatencyHistogram, PeerError> {
    let mut histogram = LatencyHistogram::new();
    let mut lines = text.lines();
    let header = lines
        .by_ref()
        .find(|line| line.trim_start().starts_with("packet,"));
    if header.is_none() {
        return Err(PeerError::Parse {
            program: "sockperf".into(),
            what: "the sample table of --full-log (`packet, txTime(sec), …`)".into(),
            output_tail: tail(text),
        });
    }
    for line in lines {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() < 4 || fields[0].parse::<u64>().is_err() {
            continue;
        }
        let Ok(rtt_us) = fields[3].parse::<f64>() else {
            continue;
        };
        if rtt_us.is_finite() && rtt_us >= 0.0 {
            histogram.record_duration(Duration::from_nanos((rtt_us * 1_000.0).round() as u64));
        }
    }
    if histogram.is_empty() {
        return Err(PeerError::Parse {
            program: "sockperf".into(),
            what: "any round trip in --full-log".into(),
            output_tail: tail(text),
        });
    }
    Ok(histogram)
}

// ---------------------------------------------------------------------------
// iperf3.

/// iperf3, one TCP stream over loopback for `duration` (whole seconds, at
/// least one): `iperf3 -s -1` and `iperf3 -c 127.0.0.1 -t SECS -J`; returns
/// the bytes per second the receiver got.
pub fn iperf3_bandwidth(duration: Duration) -> Result<f64, PeerError> {
    let secs = whole_seconds(duration);
    let (_server, port) = start_server("iperf3", READY_TIMEOUT, &|port| {
        strings(&["-s", "-1", "-B", "127.0.0.1", "-p", &port.to_string()])
    })?;
    let args = strings(&[
        "-c",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-t",
        &secs.to_string(),
        "-J",
    ]);
    let done = run("iperf3", &args, Duration::from_secs(secs) + OVERSHOOT)?;
    parse_iperf3_json(&done.stdout)
}

/// Reads `end.sum_received.bits_per_second` from `iperf3 -J` output and
/// returns bytes per second; an `error` member (iperf3 3.12 exits 0 when it
/// cannot connect) is an error.
pub fn parse_iperf3_json(json: &str) -> Result<f64, PeerError> {
    let parse_error = |what: &str| PeerError::Parse {
        program: "iperf3".into(),
        what: what.into(),
        output_tail: tail(json),
    };
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| parse_error(&format!("its JSON ({e})")))?;
    if let Some(error) = value.get("error").and_then(|e| e.as_str()) {
        return Err(PeerError::Failed {
            command: "iperf3 -c 127.0.0.1 … -J".into(),
            status: "reported an error".into(),
            stderr_tail: error.to_owned(),
        });
    }
    let bits = value
        .pointer("/end/sum_received/bits_per_second")
        .and_then(serde_json::Value::as_f64)
        .ok_or_else(|| parse_error("end.sum_received.bits_per_second"))?;
    if !bits.is_finite() || bits <= 0.0 {
        return Err(parse_error("a positive end.sum_received.bits_per_second"));
    }
    Ok(bits / 8.0)
}

// ---------------------------------------------------------------------------
// redis.

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
fn ms_to_us(ms: f64) -> f64 {
    (ms * 1e6).round() / 1e3
}

/// Sends `PING` to redis on 127.0.0.1:`port` and returns its reply line.
fn redis_ping(port: u16) -> io::Result<String> {
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
fn redis_connect(port: u16, timeout: Duration) -> io::Result<TcpStream> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let conn = TcpStream::connect_timeout(&addr, timeout)?;
    conn.set_read_timeout(Some(timeout))?;
    conn.set_write_timeout(Some(timeout))?;
    conn.set_nodelay(true)?;
    Ok(conn)
}

/// SETs `key:000000000000` … up to `keyspace` keys (redis-benchmark's `-r`
/// names) to `value_size` bytes of `x`, pipelined, and checks every reply.
fn redis_fill(port: u16, keyspace: u64, value_size: usize) -> Result<(), PeerError> {
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

/// CPU seconds (user + system, all threads) process `pid` has used so far,
/// from `/proc/PID/stat`.
pub fn cpu_seconds(pid: u32) -> Result<f64, PeerError> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("read {path}: {e}")))?;
    // SAFETY: sysconf has no preconditions; it returns -1 for an unknown name.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = if ticks > 0 { ticks as f64 } else { 100.0 };
    parse_proc_stat(&text, ticks).ok_or_else(|| PeerError::Parse {
        program: path,
        what: "utime and stime".into(),
        output_tail: tail(&text),
    })
}

/// The resident set of process `pid` in bytes (`VmRSS` of
/// `/proc/PID/status`).
pub fn resident_bytes(pid: u32) -> Result<u64, PeerError> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("read {path}: {e}")))?;
    parse_vm_rss(&text).ok_or_else(|| PeerError::Parse {
        program: path,
        what: "VmRSS".into(),
        output_tail: tail(&text),
    })
}

/// `VmRSS:   1234 kB` → 1234 × 1024.
pub fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut fields = line.split_whitespace().skip(1);
    let kib: u64 = fields.next()?.parse().ok()?;
    (fields.next()? == "kB").then_some(kib * 1024)
}

/// (utime + stime) / `ticks_per_second` from the text of `/proc/PID/stat`;
/// the command name in parentheses may hold spaces and parentheses.
pub fn parse_proc_stat(text: &str, ticks_per_second: f64) -> Option<f64> {
    let (_, rest) = text.rsplit_once(')')?;
    // After the name: state (field 3), …, utime (14), stime (15).
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / ticks_per_second)
}

// ---------------------------------------------------------------------------
// Ports and readiness.

/// A loopback TCP port that was free a moment ago, below the ephemeral range,
/// never the same twice in one process.
fn free_loopback_port() -> Result<u16, PeerError> {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
    let span = u32::from(PORT_RANGE.end - PORT_RANGE.start);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let seed = std::process::id().wrapping_mul(7919).wrapping_add(nanos);
    for step in 0..span {
        let port = PORT_RANGE.start + (seed.wrapping_add(step.wrapping_mul(97)) % span) as u16;
        if handed_out.contains(&port) {
            continue;
        }
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            handed_out.insert(port);
            return Ok(port);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("no free loopback port in {PORT_RANGE:?}"),
    )
    .into())
}

/// The inodes of the listening TCP sockets on `port` in the text of
/// `/proc/net/tcp` or `/proc/net/tcp6`.
pub fn listening_inodes(proc_net_tcp: &str, port: u16) -> Vec<u64> {
    const LISTEN: &str = "0A";
    proc_net_tcp
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (_, local_port) = fields.get(1)?.rsplit_once(':')?;
            let local_port = u16::from_str_radix(local_port, 16).ok()?;
            (local_port == port && *fields.get(3)? == LISTEN)
                .then(|| fields.get(9)?.parse().ok())
                .flatten()
        })
        .collect()
}

/// Whether process `pid` holds a socket listening on TCP `port`.
fn listens_on(pid: u32, port: u16) -> bool {
    let inodes: Vec<u64> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|file| std::fs::read_to_string(file).ok())
        .flat_map(|text| listening_inodes(&text, port))
        .collect();
    if inodes.is_empty() {
        return false;
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(Result::ok)
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .any(|target| wanted.iter().any(|w| target.as_os_str() == OsStr::new(w)))
}

/// Starts `program` with `args(port)` on free ports until it listens on its
/// port (three tries: another process may take the port first).
fn start_server(
    program: &str,
    timeout: Duration,
    args: &dyn Fn(u16) -> Vec<String>,
) -> Result<(Process, u16), PeerError> {
    let mut last = None;
    for _ in 0..3 {
        let port = free_loopback_port()?;
        let mut process = Process::spawn(program, &args(port), SERVER_OUTPUT_CAP)?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = process.exited() {
                last = Some(process.not_ready(port, format!("it exited ({status})")));
                break;
            }
            if listens_on(process.pid(), port) {
                return Ok((process, port));
            }
            if Instant::now() >= deadline {
                return Err(process.not_ready(port, format!("not listening after {timeout:?}")));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    Err(last.unwrap_or_else(|| PeerError::InvalidArgument(format!("{program} never started"))))
}

// ---------------------------------------------------------------------------
// Processes.

/// The last bytes a child wrote to one of its pipes, filled by a thread.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::fmt::Debug for Captured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let len = self.0.lock().unwrap_or_else(PoisonError::into_inner).len();
        write!(f, "Captured({len} bytes)")
    }
}

impl Captured {
    /// Captures `pipe` (when there is one), its reader thread going into
    /// `readers`.
    fn of(
        pipe: Option<impl Read + Send + 'static>,
        cap: usize,
        readers: &mut Vec<JoinHandle<()>>,
    ) -> Self {
        match pipe {
            Some(pipe) => {
                let (captured, thread) = Self::start(pipe, cap);
                readers.push(thread);
                captured
            }
            None => Self::default(),
        }
    }

    /// Reads `from` to its end on a thread, keeping the last `cap` bytes.
    fn start(mut from: impl Read + Send + 'static, cap: usize) -> (Self, JoinHandle<()>) {
        let captured = Self::default();
        let sink = captured.clone();
        let thread = std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            loop {
                match from.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => {
                        let mut buf = sink.0.lock().unwrap_or_else(PoisonError::into_inner);
                        buf.extend_from_slice(&chunk[..n]);
                        if buf.len() > cap {
                            let excess = buf.len() - cap;
                            buf.drain(..excess);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        });
        (captured, thread)
    }

    fn text(&self) -> String {
        let buf = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&buf).into_owned()
    }
}

/// A child process whose output is captured; killed and reaped on drop
/// unless it was waited for.
#[derive(Debug)]
struct Process {
    child: Child,
    command: String,
    stdout: Captured,
    stderr: Captured,
    readers: Vec<JoinHandle<()>>,
    reaped: bool,
}

/// How a child ended and what it wrote.
#[derive(Debug)]
struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Finished {
    fn all_output(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

impl Process {
    fn spawn(program: &str, args: &[String], cap: usize) -> Result<Self, PeerError> {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| PeerError::Spawn {
                program: program.to_owned(),
                source,
            })?;
        let mut readers = Vec::new();
        let stdout = Captured::of(child.stdout.take(), cap, &mut readers);
        let stderr = Captured::of(child.stderr.take(), cap, &mut readers);
        Ok(Self {
            child,
            command: command_line(program, args),
            stdout,
            stderr,
            readers,
            reaped: false,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status, when it has exited.
    fn exited(&mut self) -> Option<ExitStatus> {
        match self.child.try_wait() {
            Ok(Some(status)) => {
                self.reaped = true;
                Some(status)
            }
            _ => None,
        }
    }

    /// The end of everything it wrote.
    fn output_tail(&self) -> String {
        tail(&format!("{}\n{}", self.stdout.text(), self.stderr.text()))
    }

    fn not_ready(&self, port: u16, why: String) -> PeerError {
        // Give the reader threads a moment to take the last words of a
        // process that just exited.
        std::thread::sleep(Duration::from_millis(20));
        PeerError::NotReady {
            command: self.command.clone(),
            port,
            why,
            output_tail: self.output_tail(),
        }
    }

    /// Waits for it to exit; kills it after `timeout`.
    fn finish(mut self, timeout: Duration) -> Result<Finished, PeerError> {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                self.reaped = true;
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                self.reaped = true;
                self.join_readers();
                return Err(PeerError::Timeout {
                    command: self.command.clone(),
                    after: timeout,
                    output_tail: self.output_tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        self.join_readers();
        Ok(Finished {
            status,
            stdout: self.stdout.text(),
            stderr: self.stderr.text(),
        })
    }

    fn join_readers(&mut self) {
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `program` to its end within `timeout`; a failure exit is an error.
fn run(program: &str, args: &[String], timeout: Duration) -> Result<Finished, PeerError> {
    let done = Process::spawn(program, args, CLIENT_OUTPUT_CAP)?.finish(timeout)?;
    if !done.status.success() {
        let said = if done.stderr.trim().is_empty() {
            &done.stdout
        } else {
            &done.stderr
        };
        return Err(PeerError::Failed {
            command: command_line(program, args),
            status: done.status.to_string(),
            stderr_tail: tail(said),
        });
    }
    Ok(done)
}

// ---------------------------------------------------------------------------
// Small helpers.

/// `duration` in whole seconds (rounded), at least one: the tools take
/// integers.
fn whole_seconds(duration: Duration) -> u64 {
    (duration.as_secs_f64().round() as u64).max(1)
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

/// A command line for messages; empty arguments shown as `""`.
fn command_line(program: &str, args: &[String]) -> String {
    let mut line = program.to_owned();
    for arg in args {
        line.push(' ');
        if arg.is_empty() {
            line.push_str("\"\"");
        } else {
            line.push_str(arg);
        }
    }
    line
}

/// `text` without ANSI escape sequences (sockperf colours its output).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// The last [`TAIL_CHARS`] characters of `text`, without colours and
/// surrounding blank space.
fn tail(text: &str) -> String {
    let text = strip_ansi(text);
    let text = text.trim();
    let skip = text.chars().count().saturating_sub(TAIL_CHARS);
    let tail: String = text.chars().skip(skip).collect();
    if skip > 0 { format!("…{tail}") } else { tail }
}
