//! The floors and the peers pmem-fabric is measured against,
//! run from the distribution's packages on this machine, over loopback:
//!
//! - [`sockperf_rtt`]: the network floor of one hop, `sockperf ping-pong`
//!   over TCP with `--full-rtt` (round trips, not half round trips), and
//!   [`sockperf_rtt_spinning`], the same with both ends polling
//!   (`--nonblocked`), the floor without wake-ups;
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

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::report::LatencyHistogram;

mod iperf3;
mod output;
mod process;
mod procfs;
mod redis;
mod sockperf;

pub use iperf3::{iperf3_bandwidth, parse_iperf3_json};
pub use procfs::{cpu_seconds, listening_inodes, parse_proc_stat, parse_vm_rss, resident_bytes};
pub use redis::{
    RedisConfig, RedisFigures, RedisResult, RedisServer, parse_redis_benchmark, redis_benchmark,
};
pub use sockperf::{
    SockperfRun, SockperfStats, parse_sockperf, parse_sockperf_full_log, sockperf_rtt,
    sockperf_rtt_pinned, sockperf_rtt_run, sockperf_rtt_spinning,
};

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
pub(super) const OVERSHOOT: Duration = Duration::from_secs(5);

/// How long a server may take to listen on its port.
pub(super) const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long redis may take to answer PING (it answers `-LOADING` while it
/// reads an append-only file left in its folder).
pub(super) const REDIS_READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How many bytes of a client's output are kept (all of it, in practice).
pub(super) const CLIENT_OUTPUT_CAP: usize = 16 << 20;

/// How many bytes of a server's output are kept, for error messages.
pub(super) const SERVER_OUTPUT_CAP: usize = 64 << 10;

/// How many characters of output an error message quotes.
pub(super) const TAIL_CHARS: usize = 2_000;

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
pub(super) fn find_on_path(program: &str) -> Option<PathBuf> {
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
