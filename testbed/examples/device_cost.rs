//! The fabric device's CPU and system calls per forwarded READ (64 B unless told), for
//! comparing two builds of the daemons under the same load.
//!
//! Brings up the bench's fabric (one server, one device; or with
//! `--replicated` the bench's two-copy fabric) from the testbed binary
//! given with `--daemons`, drives pipelined 64 B READs in batches like
//! `testbed bench`'s throughput rows, and for each window reads the
//! device's CPU and idle-polling seconds from its `/metrics` and, with
//! `--perf`, counts its system calls and context switches with `perf stat`.
//!
//! ```sh
//! cargo build --release -p testbed --example device_cost
//! target/release/examples/device_cost --daemons target/release/testbed --rounds 3 --perf
//! ```
//!
//! `--size BYTES` reads that many bytes per READ instead of 64.
//! `--idle N` first opens N authenticated connections and closes them, as
//! `testbed bench` does before it measures.
//!
//! One line per window: ops/s, CPU µs per op (all, and without the turns
//! that polled and found nothing), and per op what `perf stat` counted.
//!
//! With `--callgrind` the device runs under `valgrind --tool=callgrind`
//! (the other daemons as they are) and each window is a dump of its own,
//! `callgrind.out.PID.N` in `--out`: instructions counted there do not
//! depend on what else the machine runs, so two builds compare on a
//! loaded machine. The line then gives the device's instructions per op.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use proto::request::Target;
use testbed::bench::client::{self, BenchConn, BenchOp, Pipelining, Shape};
use testbed::fabric::daemon_kind::DaemonKind;
use testbed::fabric::launch::{Fabric, LaunchOptions};
use testbed::fabric::loopback::loopback_topology;
use testkit::FabricSpec;
use topology::secrets::{Principal, read_key};
use topology::{Layout, Topology};

/// What `perf stat` counts for the device, by event.
const EVENTS: &[&str] = &[
    "task-clock",
    "context-switches",
    "raw_syscalls:sys_enter",
    "syscalls:sys_enter_epoll_wait",
    "syscalls:sys_enter_recvfrom",
    "syscalls:sys_enter_sendto",
    "syscalls:sys_enter_write",
    "syscalls:sys_enter_writev",
    "syscalls:sys_enter_io_uring_enter",
    "syscalls:sys_enter_clock_gettime",
];

struct Args {
    daemons: PathBuf,
    replicated: bool,
    clients: usize,
    depth: usize,
    seconds: f64,
    rounds: usize,
    size: u32,
    idle: usize,
    perf: bool,
    callgrind: bool,
    device_args: Vec<String>,
    out: PathBuf,
}

fn args() -> anyhow::Result<Args> {
    let mut args = Args {
        daemons: PathBuf::new(),
        replicated: false,
        clients: 4,
        depth: 16,
        seconds: 3.0,
        rounds: 3,
        size: 64,
        idle: 0,
        perf: false,
        callgrind: false,
        device_args: Vec::new(),
        out: std::env::temp_dir().join(format!("device-cost-{}", std::process::id())),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--daemons" => args.daemons = value()?.into(),
            "--replicated" => args.replicated = true,
            "--clients" => args.clients = value()?.parse()?,
            "--depth" => args.depth = value()?.parse()?,
            "--seconds" => args.seconds = value()?.parse()?,
            "--rounds" => args.rounds = value()?.parse()?,
            "--idle" => args.idle = value()?.parse()?,
            "--size" => args.size = value()?.parse()?,
            "--perf" => args.perf = true,
            "--callgrind" => args.callgrind = true,
            "--device-arg" => args.device_args.push(value()?),
            "--out" => args.out = value()?.into(),
            other => bail!("unknown argument {other:?}"),
        }
    }
    if args.daemons.as_os_str().is_empty() {
        bail!("--daemons PATH: the testbed binary whose daemons to measure");
    }
    Ok(args)
}

/// The bench's fabric: server `S` (region `R`), device `F`, client `c`;
/// with `replicated`, a second server `T` and two copies of each region.
fn topology(replicated: bool) -> anyhow::Result<Topology> {
    let mut spec = FabricSpec::new()
        .extent_size("2MiB")
        .server("S", &[("R", "64MiB")]);
    if replicated {
        spec = spec.server("T", &[("U", "8MiB")]);
    }
    let spec = spec.device("F").client("c");
    loopback_topology(&spec, "device-cost", replicated.then_some(2))
}

/// The device's (CPU seconds, idle-polling seconds) from its `/metrics`.
fn cpu_split(admin: SocketAddr) -> anyhow::Result<(f64, f64)> {
    testbed::bench::device_cpu_split(admin)
        .context("no CPU or idle-polling seconds on the device's /metrics")
}

/// A script in `dir` that runs the fabric device of `daemons` under
/// callgrind, counting nothing until told (`callgrind_control`), and every
/// other daemon as it is.
fn callgrind_wrapper(daemons: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let script = dir.join("daemons-under-callgrind");
    let daemons = daemons
        .canonicalize()
        .with_context(|| format!("{}", daemons.display()))?;
    let text = format!(
        "#!/bin/sh\n\
         if [ \"$1 $2\" = \"daemon {device}\" ]; then\n\
         exec valgrind --tool=callgrind --instr-atstart=no \\\n\
         --callgrind-out-file={out}/callgrind.out.%p {daemons} \"$@\"\n\
         fi\n\
         exec {daemons} \"$@\"\n",
        device = DaemonKind::FabricDevice.program(),
        out = dir.display(),
        daemons = daemons.display(),
    );
    std::fs::write(&script, text)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    Ok(script)
}

/// Tells the callgrind of process `pid` to `what` (`--instr=on`, `--dump`
/// ...).
fn callgrind_control(pid: u32, what: &[&str]) -> anyhow::Result<()> {
    let status = Command::new("callgrind_control")
        .args(what)
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("callgrind_control (package valgrind)")?;
    if !status.success() {
        bail!("callgrind_control {what:?} {pid}: {status}");
    }
    Ok(())
}

/// The instructions counted in the dump `callgrind_control` just wrote for
/// window `round` (its `totals:` line).
fn callgrind_total(dir: &std::path::Path, pid: u32, round: usize) -> anyhow::Result<u64> {
    let path = dir.join(format!("callgrind.out.{pid}.{}", round + 1));
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("totals:"))
        .or_else(|| text.lines().find_map(|l| l.strip_prefix("summary:")))
        .and_then(|t| t.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .with_context(|| format!("{}: no totals line", path.display()))
}

fn main() -> anyhow::Result<()> {
    let args = args()?;
    let topology = topology(args.replicated)?;
    let layout = Layout::new(&topology)?;
    let region = &layout.entries()[0];
    let mut launch = LaunchOptions::new(args.out.join("data"), args.out.join("run"))?;
    launch.program = if args.callgrind {
        launch.ready_timeout = Duration::from_secs(120);
        callgrind_wrapper(&args.daemons, &args.out)?
    } else {
        args.daemons.clone()
    };
    // Before the daemons start: they inherit the limit.
    testbed::bench::open_files::allow_connections(args.idle)?;
    let connections = (args.idle + 16).to_string();
    launch.device_args = vec![
        "--busy-poll-us".into(),
        "1000".into(),
        "--max-clients".into(),
        connections.clone(),
        "--max-connections-per-client".into(),
        connections,
    ];
    launch.device_args.extend(args.device_args.iter().cloned());
    let fabric = Fabric::start(&topology, launch).context("bring the fabric up")?;
    let port: SocketAddr = fabric
        .ready_field(DaemonKind::FabricDevice, "F", "port.p0")
        .context("no port.p0 in the device's ready line")?
        .parse()?;
    let admin = fabric.admin(DaemonKind::FabricDevice, "F")?;
    let pid = fabric
        .pid(DaemonKind::FabricDevice, "F")
        .context("no device pid")?;
    let key = match fabric.secrets() {
        Some(dir) => Some(read_key(dir, Principal::Client("c"))?),
        None => None,
    };
    // As `testbed bench` does before it measures: connections that say
    // HELLO, stay idle and close.
    let idle = (0..args.idle)
        .map(|_| BenchConn::open_stream(std::net::TcpStream::connect(port)?, "c", key))
        .collect::<std::io::Result<Vec<_>>>()
        .context("open the idle connections")?;
    drop(idle);
    let access = BenchConn::open(port, "c", key)?.region_key(region.region)?;
    let shape = Shape::new(BenchOp::Read, Target::Pmem(region.start), access, args.size);
    let duration = Duration::from_secs_f64(args.seconds);
    println!(
        "device pid {pid}, {} clients x {} in flight, {} s windows, daemons {}",
        args.clients,
        args.depth,
        args.seconds,
        args.daemons.display()
    );
    for round in 0..args.rounds {
        let mut conns = (0..args.clients)
            .map(|_| BenchConn::open(port, "c", key))
            .collect::<std::io::Result<Vec<_>>>()?;
        let perf = args
            .perf
            .then(|| {
                Command::new("perf")
                    .args(["stat", "-x,", "-e", &EVENTS.join(","), "-p"])
                    .arg(pid.to_string())
                    .args(["--", "sleep", &args.seconds.to_string()])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
            })
            .transpose()?;
        let (cpu0, idle0) = cpu_split(admin)?;
        if args.callgrind {
            callgrind_control(pid, &["--zero"])?;
            callgrind_control(pid, &["--instr=on"])?;
        }
        let results: Vec<std::io::Result<(u64, Duration)>> = std::thread::scope(|s| {
            let handles: Vec<_> = conns
                .iter_mut()
                .map(|conn| {
                    let shape = &shape;
                    s.spawn(move || {
                        client::pipelined(conn, shape, args.depth, Pipelining::Batches, duration)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(std::io::Error::other("panicked")))
                })
                .collect()
        });
        if args.callgrind {
            callgrind_control(pid, &["--instr=off"])?;
            callgrind_control(pid, &["--dump"])?;
        }
        let (cpu1, idle1) = cpu_split(admin)?;
        let mut ops = 0u64;
        let mut elapsed = Duration::ZERO;
        for r in results {
            let (n, took) = r?;
            ops += n;
            elapsed = elapsed.max(took);
        }
        let per_op = |x: f64| x / ops.max(1) as f64;
        let mut line = format!(
            "round {round}: {:.0} ops/s, cpu {:.2} us/op, busy {:.2} us/op",
            ops as f64 / elapsed.as_secs_f64(),
            per_op(cpu1 - cpu0) * 1e6,
            per_op((cpu1 - cpu0) - (idle1 - idle0)) * 1e6,
        );
        if args.callgrind {
            let instructions = callgrind_total(&args.out, pid, round)?;
            line.push_str(&format!(
                ", {ops} ops, {:.0} instructions/op",
                per_op(instructions as f64)
            ));
        }
        if let Some(perf) = perf {
            let out = perf.wait_with_output()?;
            let text = String::from_utf8_lossy(&out.stderr);
            for row in text.lines() {
                let fields: Vec<&str> = row.split(',').collect();
                if fields.len() > 2
                    && let Ok(count) = fields[0].parse::<f64>()
                {
                    let name = fields[2].trim_start_matches("syscalls:sys_enter_");
                    // perf counts task-clock in milliseconds.
                    let (name, count) = match name {
                        "task-clock" => ("task-clock us", count * 1e3),
                        other => (other, count),
                    };
                    line.push_str(&format!(", {name} {:.3}", per_op(count)));
                }
            }
        }
        println!("{line}");
    }
    Ok(())
}
