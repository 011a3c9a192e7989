//! The `pmem-server` command line: parse flags, load the topology, run the daemon.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::persist::PowerDomain;
use crate::{RunningServer, ServerConfig};
use clap::Parser;
use control::{MapFlags, MapSource};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use telemetry::logging::{self, LogFormat, error_chain};
use topology::Persistence;
use tracing::{error, info, warn};

/// Why the daemon does not start without `--secrets` or `--insecure`.
const NO_KEYS: &str = "no --secrets: every connection must prove its principal's key, so the \
    server needs the keys' folder. Make one with `testbed keygen TOPOLOGY --secrets DIR` \
    (a key per client and fabric device, and the operator's) and start with `--secrets DIR`, \
    or pass --insecure to serve without authentication";

/// What `--insecure` is, said once at start.
const INSECURE_WARNING: &str = "--insecure: no authentication; anyone who reaches a data port \
    is served as any device or client it names, gets every region key in a MAP and may rotate \
    them. Use it only where nobody else reaches the data ports (other users of this host \
    included)";

/// Exports the PMEM regions the topology gives one server.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    map: MapFlags,
    /// Which server of the topology this is.
    #[arg(long)]
    server: String,
    /// Directory for the region files (overrides the topology).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Admin address for /metrics and /healthz (overrides the topology).
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// Persistence mechanism: auto, dax, msync, libpmem, or emulated (for
    /// power-loss tests only; overrides the topology).
    #[arg(long, value_parser = parse_persistence)]
    persistence: Option<Persistence>,
    /// Serve every NIC with this transport (tcp or verbs) instead of the
    /// topology's `transport`.
    #[arg(long, value_parser = parse_transport)]
    transport: Option<topology::NicTransport>,
    /// Recreate every region file of this server, discarding its data.
    #[arg(long)]
    format: bool,
    /// Create this region empty although the data directory held it and
    /// its file (or device DAX header) is gone; the other regions keep
    /// their data. Repeat for each region.
    #[arg(long, value_name = "REGION")]
    create_missing: Vec<String>,
    /// Start with an empty exactly-once window, also when its file is
    /// damaged (retried atomics from before may then apply twice).
    #[arg(long)]
    reset_exactly_once: bool,
    /// Data connections served at once that proved their key (with
    /// --insecure: all of them).
    #[arg(long, default_value_t = 4096)]
    max_connections: usize,
    /// Data connections at once that have not proven their key yet (with
    /// --secrets); a new one beyond closes the oldest of them.
    #[arg(long, default_value_t = 256)]
    max_unproven: usize,
    /// A data connection that has not proven its key (with --secrets), or
    /// sent no complete frame (with --insecure), within this many
    /// milliseconds of opening is closed.
    #[arg(long, default_value_t = 10_000)]
    hello_timeout_ms: u64,
    /// A data connection silent for this many milliseconds after its first
    /// frame is closed (0 = never). Off by default: a fabric device's link
    /// may rightly stay quiet for long.
    #[arg(long, default_value_t = 0)]
    idle_timeout_ms: u64,
    /// Folder of the principals' keys (`device.<id>.key`, `client.<id>.key`;
    /// `testbed keygen` makes them): every connection must prove it holds
    /// the key of the device or client it names before anything is
    /// answered. Required unless --insecure.
    #[arg(long, value_name = "DIR")]
    secrets: Option<PathBuf>,
    /// Run without keys: anyone who reaches a data port is served, as any
    /// device or client it names, gets every region key and may rotate
    /// them. Only for a host and network nobody else uses.
    #[arg(long, conflicts_with = "secrets")]
    insecure: bool,
    /// Tests only, with `--persistence emulated`: cut the emulated power
    /// after this many persist steps and exit at once (status 86), as a
    /// machine losing power would.
    #[arg(long, value_name = "STEPS", hide = true)]
    emulated_power_cut_after: Option<u64>,
    /// With `--emulated-power-cut-after`: at the cut, write back a random
    /// subset of the unpersisted words, drawn from this seed.
    #[arg(
        long,
        value_name = "SEED",
        hide = true,
        requires = "emulated_power_cut_after"
    )]
    emulated_eviction_seed: Option<u64>,
    /// Log lines on stderr as text or json (levels from RUST_LOG, default info).
    #[arg(long, value_name = "text|json", default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

fn parse_transport(text: &str) -> Result<topology::NicTransport, String> {
    match text {
        "tcp" => Ok(topology::NicTransport::Tcp),
        "verbs" => Ok(topology::NicTransport::Verbs),
        other => Err(format!("unknown transport {other:?}: tcp or verbs")),
    }
}

fn parse_persistence(text: &str) -> Result<Persistence, String> {
    text.parse()
        .map_err(|e: topology::model::ParsePersistenceError| e.to_string())
}

/// Logs an error with its whole cause chain.
fn report(err: &dyn std::error::Error) {
    error!("{}", error_chain(err));
}

/// The server's configuration, where its map came from, and the map's
/// version (`None` for a file).
fn config(args: Args) -> Result<(ServerConfig, MapSource, Option<control::MapVersion>), ExitCode> {
    if args.secrets.is_none() && !args.insecure {
        error!("{}", NO_KEYS);
        return Err(ExitCode::from(2));
    }
    if args.insecure {
        warn!("{}", INSECURE_WARNING);
    }
    let source = args.map.source().map_err(|e| {
        report(&e);
        ExitCode::FAILURE
    })?;
    let (topology, version) = source.load().map_err(|e| {
        report(&e);
        ExitCode::FAILURE
    })?;
    for warning in topology.warnings() {
        warn!("{warning}");
    }
    if let Err(errors) = topology.validate() {
        error!(
            "{}: {} problem(s) in topology",
            topology.source,
            errors.problems.len()
        );
        for problem in &errors.problems {
            error!("{}: {problem}", topology.source);
        }
        return Err(ExitCode::FAILURE);
    }
    let Some(server) = topology.server(&args.server.as_str().into()) else {
        error!(
            "{}: no server {:?} in the topology",
            topology.source, args.server
        );
        return Err(ExitCode::FAILURE);
    };
    let data_dir = args
        .data_dir
        .or_else(|| server.data_dir.as_ref().map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("data").join(server.id.as_str()));
    let admin = match args.admin {
        Some(addr) => addr,
        None => match server.admin.as_deref().map(str::parse::<SocketAddr>) {
            Some(Ok(addr)) => addr,
            Some(Err(_)) | None => SocketAddr::from(([127, 0, 0, 1], 0)),
        },
    };
    let persistence = args.persistence.unwrap_or(server.persistence);
    if persistence == Persistence::Emulated {
        warn!(
            "persistence \"emulated\" is for power-loss tests: stores reach the region files \
             only when persisted, and nothing is durable across a crash of this machine"
        );
        if let Some(steps) = args.emulated_power_cut_after {
            PowerDomain::process().exit_after(steps, args.emulated_eviction_seed);
        }
    } else if args.emulated_power_cut_after.is_some() {
        error!("--emulated-power-cut-after needs --persistence emulated");
        return Err(ExitCode::from(2));
    }
    let config = ServerConfig {
        server: server.id.clone(),
        data_dir,
        admin,
        persistence: persistence.into(),
        format: args.format,
        create_missing: args.create_missing,
        reset_exactly_once: args.reset_exactly_once,
        max_connections: args.max_connections,
        max_unproven: args.max_unproven,
        timeouts: crate::conn::Timeouts {
            hello: Duration::from_millis(args.hello_timeout_ms.max(1)),
            idle: (args.idle_timeout_ms > 0).then(|| Duration::from_millis(args.idle_timeout_ms)),
        },
        secrets: args.secrets,
        transport: args.transport,
        topology,
    };
    Ok((config, source, version))
}

/// Runs the daemon with command-line arguments `args` (the first is the
/// program name), as the `pmem-server` binary does.
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
    let _log = logging::init("pmem-server", &args.server, args.log_format);
    let (config, source, version) = match config(args) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let mut signals = match Signals::new([SIGTERM, SIGINT]) {
        Ok(signals) => signals,
        Err(e) => {
            report(&e);
            return ExitCode::FAILURE;
        }
    };
    let id = config.server.clone();
    let data_dir = config.data_dir.clone();
    let server = match RunningServer::start(config) {
        Ok(server) => server,
        Err(e) => {
            report(&e);
            return ExitCode::FAILURE;
        }
    };
    // Fenced connections are judged against the epoch from the start.
    server.executor().set_epoch(version.map_or(0, |v| v.epoch));
    // On etcd, copies take changes from their region's owner only.
    if let MapSource::Etcd {
        endpoints,
        pool,
        credentials,
    } = &source
    {
        match control::copy_marks::read_copy_states(endpoints, pool, credentials.as_ref()) {
            Ok((records, _)) => {
                // No queue pair exists yet: nobody to fence.
                server.executor().follow_owners(&records);
            }
            Err(e) => warn!(
                "cannot read the owners of replicated regions ({}); changes are not judged by \
                 owner until the next map",
                telemetry::logging::error_chain(&e)
            ),
        }
    }
    let mode = server.mode().map_or("none", |m| m.as_str());
    info!("persistence mode {mode}, data in {}", data_dir.display());
    let mut ready = format!(
        "ready server={id} mode={mode} admin={}",
        server.admin_addr()
    );
    for (nic, addr) in server.data_addrs() {
        ready.push_str(&format!(" nic.{nic}={addr}"));
    }
    // On etcd, the server is a member once it serves, and stops being one
    // before it drains.
    let epoch = version.map_or(0, |v| v.epoch);
    if source.file().is_none() {
        ready.push_str(&format!(" epoch={epoch}"));
    }
    let admin = server.admin_addr().to_string();
    let registration = match source.register(control::Role::Server, id.as_str(), &admin, epoch) {
        Ok(registration) => registration,
        Err(e) => {
            report(&e);
            let _ = server.stop();
            return ExitCode::FAILURE;
        }
    };
    // On etcd, the server follows the map while it runs; the follower owns
    // the registration from then on.
    let metrics = std::sync::Arc::clone(&server.executor().metrics().map);
    let observer = metrics.observer(Box::new(|| {}));
    let follower = match source.watch(version, control::REREAD_PERIOD, observer) {
        Ok(Some(watch)) => crate::follow::MapFollower::start(
            id.clone(),
            std::sync::Arc::clone(server.executor()),
            watch,
            registration,
            epoch,
        )
        .map(Some)
        .map_err(|source| control::ControlError::Runtime { source }),
        Ok(None) => Ok(None),
        Err(e) => Err(e),
    };
    let follower = match follower {
        Ok(follower) => follower,
        Err(e) => {
            report(&e);
            let _ = server.stop();
            return ExitCode::FAILURE;
        }
    };
    println!("{ready}");

    if let Some(signal) = signals.forever().next() {
        info!("signal {signal}, draining");
    }
    drop(follower);
    match server.stop() {
        Ok(()) => {
            info!("stopped cleanly");
            ExitCode::SUCCESS
        }
        Err(e) => {
            report(&e);
            ExitCode::FAILURE
        }
    }
}
