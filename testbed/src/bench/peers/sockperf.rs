//! sockperf: the network floor of one hop (ping-pong round trips).

use std::io;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::bench::waiting::Waiting;
use crate::report::LatencyHistogram;

use super::output::{strip_ansi, tail};
use super::process::{command_line, run, start_server, strings, whole_seconds};
use super::{OVERSHOOT, PeerError, Quantiles, READY_TIMEOUT, SOCKPERF_SETTLE};

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
    sockperf(msg_size, duration, Waiting::Sleep, None)
}

/// [`sockperf_rtt_run`] with both ends polling their sockets
/// ([`Waiting::Spin`]): the round trip without the wake-ups a sleeping
/// end pays. Each end keeps a CPU busy while it runs.
pub fn sockperf_rtt_spinning(
    msg_size: usize,
    duration: Duration,
) -> Result<SockperfRun, PeerError> {
    sockperf(msg_size, duration, Waiting::Spin, None)
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
    sockperf(
        msg_size,
        duration,
        Waiting::Sleep,
        Some((server_cpu, client_cpu)),
    )
}

/// `program args`, or `taskset -c CPU program args` when pinned.
pub(super) fn pinned(
    cpu: Option<usize>,
    program: &str,
    args: Vec<String>,
) -> (String, Vec<String>) {
    match cpu {
        None => (program.to_owned(), args),
        Some(cpu) => {
            let mut all = strings(&["-c", &cpu.to_string(), program]);
            all.extend(args);
            ("taskset".to_owned(), all)
        }
    }
}

pub(super) fn sockperf(
    msg_size: usize,
    duration: Duration,
    waiting: Waiting,
    cpus: Option<(usize, usize)>,
) -> Result<SockperfRun, PeerError> {
    let secs = whole_seconds(duration);
    let server_cpu = cpus.map(|(server, _)| server);
    let (server_program, _) = pinned(server_cpu, "sockperf", Vec::new());
    let (_server, port) = start_server(&server_program, READY_TIMEOUT, &|port| {
        let mut args = strings(&[
            "server",
            "--tcp",
            "-i",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ]);
        args.extend(waiting_flags(waiting));
        pinned(server_cpu, "sockperf", args).1
    })?;
    // Removed when dropped; sockperf writes it by name.
    let log = tempfile::Builder::new()
        .prefix("pmem-fabric-sockperf-")
        .suffix(".csv")
        .tempfile()?
        .into_temp_path();
    let mut args = strings(&[
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
    args.extend(waiting_flags(waiting));
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

/// The flags that make one end of sockperf wait as `waiting` says
/// (sockperf's default is blocking sockets; `--nonblocked` polls).
fn waiting_flags(waiting: Waiting) -> Vec<String> {
    match waiting {
        Waiting::Sleep => Vec::new(),
        Waiting::Spin => strings(&["--nonblocked"]),
    }
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
