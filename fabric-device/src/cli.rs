//! The `fabric-device` command line: parse flags, load the topology, run the daemon.

use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use crate::driver::backend::{Backend, IoConfig};
use crate::driver::roce_io::{DEFAULT_RING_FRAMES, RoceIo, RoceIoConfig};
use crate::driver::{Device, DeviceConfig, error_chain};
use crate::forward::ForwarderConfig;
use clap::Parser;
use control::MapFlags;
use telemetry::logging::{self, LogFormat};
use tracing::{error, info, warn};

/// Why the daemon does not start without `--secrets` or `--insecure`.
const NO_KEYS: &str = "no --secrets: every client must prove its key and the device proves \
    its own to the servers, so the device needs the keys' folder. Make one with `testbed keygen \
    TOPOLOGY --secrets DIR` (a key per client and fabric device, and the operator's) and start \
    with `--secrets DIR`, or pass --insecure to serve without authentication";

/// What `--insecure` is, said once at start.
const INSECURE_WARNING: &str = "--insecure: no authentication; anyone who reaches a client \
    port is served as any client it names, with its grants and region keys. Use it only where \
    nobody else reaches the client ports (other users of this host included)";

/// Forwards one-sided requests from clients to the PMEM servers that own
/// their addresses.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    map: MapFlags,
    /// Which fabric device of the topology this is.
    #[arg(long)]
    device: String,
    /// Admin address for /metrics and /healthz (overrides the topology).
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// A forwarded request unanswered for this many milliseconds gets TIMEOUT.
    #[arg(long, default_value_t = 5000)]
    request_timeout_ms: u64,
    /// A request to one copy of a replicated region unanswered for this many
    /// milliseconds loses the copy (its operation goes on with the other
    /// copies); keep it below the clients' attempt timeout (2 s by default).
    #[arg(long, default_value_t = 1000)]
    copy_timeout_ms: u64,
    /// Requests one client connection may have in flight.
    #[arg(long, default_value_t = 256)]
    max_in_flight: usize,
    /// MiB of answers (READ data) one client may have on the way before the
    /// device stops reading its requests.
    #[arg(long, default_value_t = 32)]
    max_reply_mib_per_client: u64,
    /// MiB of answers on the way for all clients together.
    #[arg(long, default_value_t = 512)]
    max_reply_mib_total: u64,
    /// MiB of requests one client's connections may hold while they arrive
    /// (a large request is read once it fits).
    #[arg(long, default_value_t = 64)]
    max_request_mib_per_client: u64,
    /// MiB of requests all client connections may hold while they arrive.
    #[arg(long, default_value_t = 1024)]
    max_request_mib_total: u64,
    /// First delay before reconnecting a failed server link, in milliseconds.
    #[arg(long, default_value_t = 50)]
    reconnect_min_ms: u64,
    /// Longest delay between reconnect attempts, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    reconnect_max_ms: u64,
    /// Spin on the sockets for this many microseconds after each event
    /// before sleeping (lower latency for a whole CPU; 0 = off).
    #[arg(long, default_value_t = 0)]
    busy_poll_us: u64,
    /// Client connections served at once that proved their key (with
    /// --insecure: all of them).
    #[arg(long, default_value_t = 4096)]
    max_clients: usize,
    /// Client connections at once that have not proven their key yet (with
    /// --secrets); a new one beyond closes the oldest of them.
    #[arg(long, default_value_t = 256)]
    max_unproven: usize,
    /// A client connection that has not proven its key (with --secrets), or
    /// said HELLO (with --insecure), this many milliseconds after it opened
    /// is closed.
    #[arg(long, default_value_t = 10_000)]
    hello_timeout_ms: u64,
    /// A client connection with nothing in flight, no queue pair and no
    /// traffic for this many milliseconds is closed (0 = never).
    #[arg(long, default_value_t = 300_000)]
    idle_timeout_ms: u64,
    /// Connections one client may have open at once (counted once they
    /// proved the client's key); further HELLOs from it are refused BUSY.
    #[arg(long, default_value_t = 64)]
    max_connections_per_client: usize,
    /// Folder of the principals' keys (`testbed keygen` makes them): this
    /// device proves its key (`device.<id>.key`) to servers that ask, and
    /// every client must prove its key (`client.<id>.key`) after HELLO
    /// before anything else is answered. Required unless --insecure.
    #[arg(long, value_name = "DIR")]
    secrets: Option<std::path::PathBuf>,
    /// Run without keys: anyone who reaches a client port is served as any
    /// client it names, with that client's grants and region keys, and the
    /// device proves nothing to its servers. Only for a host and network
    /// nobody else uses.
    #[arg(long, conflicts_with = "secrets")]
    insecure: bool,
    /// How the TCP client ports and server links move bytes: `epoll`
    /// (readiness, reads and writes by system call; the default, measured
    /// faster on loopback TCP) or `uring` (io_uring: multishot accept and
    /// receive into shared buffers, sends batched per turn). io_uring falls
    /// back to epoll where the kernel lacks it or has it disabled, and says
    /// why at start.
    #[arg(
        long = "io",
        env = "PMEM_FABRIC_IO",
        value_name = "epoll|uring",
        default_value = "epoll"
    )]
    io: Backend,
    /// With `--io uring`: a kernel thread polls the ring's submission queue,
    /// so sending takes no system call (costs a CPU; for a device with a
    /// core of its own).
    #[arg(long, env = "PMEM_FABRIC_IO_SQPOLL")]
    io_sqpoll: bool,
    /// How the RoCEv2 ports move frames: `xdp` (an XDP program hands the
    /// port's RoCEv2 frames to an AF_XDP socket's rings; ARP still through
    /// the packet socket), `packet-ring` (receive and transmit rings shared
    /// with the kernel, PACKET_MMAP TPACKET_V2) or `socket`
    /// (recvmmsg/sendmmsg, up to 64 frames per call). The rings need no
    /// system call per received frame and one per batch sent. A path the
    /// kernel refuses falls back to the next, and says why at start.
    #[arg(
        long = "roce-io",
        env = "PMEM_FABRIC_ROCE_IO",
        value_name = "xdp|packet-ring|socket",
        default_value = "xdp"
    )]
    roce_io: RoceIo,
    /// Slots of each RoCEv2 ring (receive and transmit), 16 to 32768; a
    /// slot is one frame of the interface's MTU rounded up to a power of
    /// two (2 KiB at MTU 1500: the default takes 4 MiB per port).
    #[arg(
        long,
        env = "PMEM_FABRIC_ROCE_RING_FRAMES",
        default_value_t = DEFAULT_RING_FRAMES as u32,
        value_parser = clap::value_parser!(u32).range(16..=32768)
    )]
    roce_ring_frames: u32,
    /// Bytes per second this device's resyncs copy to a syncing copy of a
    /// replicated region it owns, all resyncs together (`64MiB`, `10MB`,
    /// `1048576`; at least 1 byte).
    #[arg(long, value_name = "BYTES", default_value = "64MiB", value_parser = parse_rate)]
    resync_rate: u64,
    /// Log lines on stderr as text or json (levels from RUST_LOG, default info).
    #[arg(long, value_name = "text|json", default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// A `--resync-rate`: a size per second, at least one byte.
fn parse_rate(text: &str) -> Result<u64, String> {
    let rate: topology::ByteSize = text.parse().map_err(|e| {
        format!("{e}; give bytes per second as a size such as 64MiB, 10MB or 1048576")
    })?;
    if rate.bytes() == 0 {
        return Err(
            "0 bytes per second would never bring a syncing copy up to date; give at least 1 \
             (for instance 64MiB)"
                .into(),
        );
    }
    Ok(rate.bytes())
}

/// Runs the daemon with command-line arguments `args` (the first is the
/// program name), as the `fabric-device` binary does.
pub fn main_with_args<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args = match Args::try_parse_from(args) {
        Ok(args) => args,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let _log = logging::init("fabric-device", &args.device, args.log_format);
    if args.secrets.is_none() && !args.insecure {
        error!("{NO_KEYS}");
        return ExitCode::from(2);
    }
    if args.insecure {
        warn!("{INSECURE_WARNING}");
    }
    let source = args.map.source();
    let loaded = source.and_then(|source| source.load().map(|loaded| (source, loaded)));
    let (source, (topology, version)) = match loaded {
        Ok(loaded) => loaded,
        Err(e) => {
            error!("{}", error_chain(&e));
            return ExitCode::FAILURE;
        }
    };
    for warning in topology.warnings() {
        warn!("{warning}");
    }
    let Some(spec) = topology.fabric_device(&args.device.as_str().into()) else {
        error!(
            "{}: no fabric device {:?} in the topology",
            topology.source, args.device
        );
        return ExitCode::FAILURE;
    };
    let admin = args
        .admin
        .or_else(|| spec.admin.as_deref().and_then(|a| a.parse().ok()))
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
    let config = DeviceConfig {
        device: spec.id.clone(),
        admin,
        topology_path: source.file().map(Path::to_path_buf),
        forwarder: ForwarderConfig {
            request_timeout: Duration::from_millis(args.request_timeout_ms),
            copy_timeout: Duration::from_millis(args.copy_timeout_ms),
            max_in_flight_per_client: args.max_in_flight,
            max_reply_bytes_per_client: args.max_reply_mib_per_client << 20,
            max_reply_bytes_total: args.max_reply_mib_total << 20,
            max_request_bytes_per_client: args.max_request_mib_per_client << 20,
            max_request_bytes_total: args.max_request_mib_total << 20,
            max_connections_per_client: args.max_connections_per_client,
            resync_rate: args.resync_rate,
        },
        reconnect_min: Duration::from_millis(args.reconnect_min_ms),
        reconnect_max: Duration::from_millis(args.reconnect_max_ms),
        max_clients: args.max_clients,
        max_unproven: args.max_unproven,
        hello_timeout: Duration::from_millis(args.hello_timeout_ms),
        idle_timeout: (args.idle_timeout_ms > 0)
            .then(|| Duration::from_millis(args.idle_timeout_ms)),
        secrets: args.secrets.clone(),
        busy_poll: Duration::from_micros(args.busy_poll_us),
        io: IoConfig {
            backend: args.io,
            sqpoll: args.io_sqpoll,
        },
        roce_io: RoceIoConfig {
            path: args.roce_io,
            ring_frames: args.roce_ring_frames as usize,
        },
        topology,
    };
    let id = config.device.clone();
    let epoch = version.map(|v| v.epoch);
    let mut device = match Device::bind(config) {
        Ok(device) => device,
        Err(e) => {
            error!("{}", error_chain(&e));
            return ExitCode::FAILURE;
        }
    };
    // On etcd, the copies' states are the map's, not a new pool's.
    if let control::MapSource::Etcd {
        endpoints,
        pool,
        credentials,
    } = &source
    {
        match control::copy_marks::read_copy_states(endpoints, pool, credentials.as_ref()) {
            Ok((records, _)) => device.use_copy_states(&records),
            Err(e) => {
                error!(
                    "cannot read the states of replicated regions' copies: {}",
                    error_chain(&e)
                );
                return ExitCode::FAILURE;
            }
        }
    }
    let mut ready = format!("ready device={id} admin={}", device.admin_addr());
    for (port, addr) in device.ports() {
        ready.push_str(&format!(" port.{port}={addr}"));
    }
    for (port, ip) in device.roce_ports() {
        ready.push_str(&format!(" roce.{port}={ip}"));
    }
    if let Some(epoch) = epoch {
        ready.push_str(&format!(" epoch={epoch}"));
    }
    // On etcd, the device is a member while it runs.
    let admin = device.admin_addr().to_string();
    let role = control::Role::Device;
    let registration = match source.register(role, id.as_str(), &admin, epoch.unwrap_or(0)) {
        Ok(registration) => registration,
        Err(e) => {
            error!("{}", error_chain(&e));
            return ExitCode::FAILURE;
        }
    };
    // On etcd, the device follows the map while it runs.
    let waker = device.waker();
    let observer = device.map_metrics().observer(Box::new(move || {
        let _ = waker.wake();
    }));
    match source.watch(version, control::REREAD_PERIOD, observer) {
        Ok(Some(watch)) => {
            device.follow(watch, registration, epoch.unwrap_or(0));
            device.mark_copies_in(&source);
        }
        Ok(None) => {}
        Err(e) => {
            error!("{}", error_chain(&e));
            return ExitCode::FAILURE;
        }
    }
    println!("{ready}");
    let ran = device.run();
    match ran {
        Ok(()) => {
            info!("stopped cleanly");
            ExitCode::SUCCESS
        }
        Err(e) => {
            error!("{}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resync_rate_is_a_size_per_second_of_at_least_one_byte() {
        assert_eq!(parse_rate("64MiB"), Ok(64 << 20));
        assert_eq!(parse_rate("10MB"), Ok(10_000_000));
        assert_eq!(parse_rate("1048576"), Ok(1 << 20));
        let zero = parse_rate("0").unwrap_err();
        assert!(zero.contains("at least 1"), "{zero}");
        let unit = parse_rate("5 parsecs").unwrap_err();
        assert!(unit.contains("64MiB"), "{unit}");
        let base = ["fabric-device", "--config", "t.toml", "--device", "F"];
        let args = Args::try_parse_from(base).unwrap();
        assert_eq!(args.resync_rate, 64 << 20, "the default");
        let refused = Args::try_parse_from(base.into_iter().chain(["--resync-rate", "0"]))
            .unwrap_err()
            .to_string();
        assert!(refused.contains("--resync-rate"), "{refused}");
    }
}
