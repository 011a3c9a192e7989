//! `testbed`: command-line entry point.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use client_vmm::ServerCache;
use testbed::advice::Starter;
use testbed::launch::{DaemonKind, Fabric, LaunchOptions, NetMode};
use testbed::prometheus::{PrometheusServer, ScrapeTarget};
use testbed::run::{RunOptions, Scenario};
use testbed::supervise::{Supervisor, control};
use testbed::workload::{Progress, WorkerConfig, Workload};
use testbed::{load_topology, load_topology_on, summary};
use topology::Layout;

/// Brings pmem-fabric topologies up on one machine, drives and checks them.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Net {
    /// Every host on its own loopback address.
    Loopback,
    /// Every host in its own network namespace (needs root).
    Netns,
    /// The RDMA lab: clients in QEMU guests with a kernel RDMA stack reach
    /// the devices over RoCEv2; the lab's topology by default (needs root).
    Lab,
}

impl From<Net> for NetMode {
    fn from(net: Net) -> Self {
        match net {
            Net::Loopback => NetMode::Loopback,
            Net::Netns => NetMode::Netns,
            Net::Lab => NetMode::Lab,
        }
    }
}

/// How long a bench runs and where its report goes.
#[derive(Debug, clap::Args)]
struct BenchArgs {
    /// A short smoke run (checks the report is complete, not the targets).
    #[arg(long)]
    quick: bool,
    /// Rounds, interleaved where the bench compares systems (default 5, 2
    /// with --quick); the report gives medians and spreads.
    #[arg(long)]
    rounds: Option<usize>,
    /// Where the report goes (reports/<run-id>/ by default).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check a topology file and print a summary with its address map.
    Validate {
        /// The topology file; the embedded default topology when absent.
        file: Option<PathBuf>,
        /// On server SERVER's own machine, also check what only it can:
        /// each PMEM device path exists and is a directory or a device DAX
        /// character device (repeatable).
        #[arg(long, value_name = "SERVER")]
        host: Vec<String>,
    },
    /// Start every daemon of a topology and keep them up until Ctrl-C:
    /// report each exit as it happens, and restart daemons on command
    /// (`help` on its console lists the commands).
    Up {
        /// The topology file; the embedded default topology when absent.
        file: Option<PathBuf>,
        /// How hosts are networked.
        #[arg(long, value_enum, default_value = "loopback")]
        net: Net,
        /// Region files go to DIR/<server>.
        #[arg(long, default_value = "data")]
        data_dir: PathBuf,
        /// Also start a Prometheus server scraping every daemon.
        #[arg(long)]
        prometheus: bool,
        /// Start every pmem-server with its regions recreated empty (their
        /// data lost): for a data directory whose files do not fit the
        /// topology. A daemon restarted later keeps its data.
        #[arg(long)]
        format: bool,
        #[command(flatten)]
        map_from: testbed::etcd::ControlArgs,
    },
    /// Start a daemon of a running `testbed up` again (killed first if it
    /// runs) and wait until it is ready; exit status 1 if it is not.
    Restart {
        /// The daemon's id, or `server ID` / `device ID` when a pmem-server
        /// and a fabric device share the id.
        #[arg(num_args = 1..=2, required = true, value_name = "ID")]
        target: Vec<String>,
        #[command(flatten)]
        control: ControlArgs,
    },
    /// Every daemon of a running `testbed up`: pid, running since, or when
    /// and how it exited.
    Status {
        #[command(flatten)]
        control: ControlArgs,
    },
    /// Write a fresh key for every client and fabric device of a topology
    /// and for the operator `admin` (`client.<id>.key`, `device.<id>.key`,
    /// `operator.admin.key`, owner-only): give the folder to the daemons
    /// with `--secrets` and to clients in `PMEM_FABRIC_SECRETS` (pmemctl:
    /// `--secrets`, also for `rotate-key`).
    Keygen {
        /// The topology file; the embedded default topology when absent.
        file: Option<PathBuf>,
        /// Where the key files go.
        #[arg(long, value_name = "DIR")]
        secrets: PathBuf,
    },
    /// Remove the network namespaces a crashed `--net netns` run left behind
    /// (and kill the daemons still running in them).
    Down {
        /// Only the run whose namespaces start with this prefix (`pfXXXX`);
        /// every testbed run when absent.
        #[arg(long)]
        prefix: Option<String>,
    },
    /// Run a client workload on a fresh fabric, verify it and write a report.
    Run(RunArgs),
    /// Measure how long every daemon of a fabric on a fresh etcd takes to
    /// run a new map epoch, over many changes: p50 and max (a report, not
    /// a test).
    MapFollow {
        /// The topology file; the embedded default topology when absent.
        file: Option<PathBuf>,
        /// How hosts are networked (loopback or netns).
        #[arg(long, value_enum, default_value = "loopback")]
        net: Net,
        /// etcd members.
        #[arg(long, default_value_t = 1)]
        etcd_members: usize,
        /// How many map changes.
        #[arg(long, default_value_t = 22)]
        changes: usize,
        /// Logs and etcd's data go to DIR/<run-id>/.
        #[arg(long, default_value = "reports")]
        reports: PathBuf,
    },
    /// The demo: the default fabric, a mixed workload, a fabric device
    /// killed half way and restarted, then a verified summary.
    Demo {
        /// Seconds of workload.
        #[arg(long, default_value_t = 30.0)]
        duration: f64,
        /// Reports go to DIR/<run-id>/.
        #[arg(long, default_value = "reports")]
        reports: PathBuf,
    },
    /// Run a workload while injecting faults at seeded random times, and
    /// check the contract: fabric-device faults are invisible to the
    /// application, nothing acknowledged is lost.
    Chaos(ChaosArgs),
    /// Measure pmem-fabric against the network floor (sockperf, iperf3) and
    /// redis, and write the ratios with plots.
    Bench(BenchArgs),
    /// The fabric device's CPU per operation on its RoCEv2 port next to its
    /// TCP port, in interleaved rounds (needs root: a network namespace and
    /// raw sockets).
    BenchRoce {
        #[command(flatten)]
        bench: BenchArgs,
        /// The frame path of the device's RoCEv2 port: packet-ring (rings
        /// shared with the kernel, the device's default) or socket
        /// (recvmmsg/sendmmsg).
        #[arg(long, value_name = "packet-ring|socket", default_value = "packet-ring")]
        roce_io: testbed::roce_bench::RocePath,
    },
    /// A PMEM server's own CPU per operation over RDMA (a verbs NIC, device
    /// DAX) next to TCP, in the RDMA lab (root): interleaved rounds.
    BenchVerbs(BenchArgs),
    /// For information: the p50 of one durable small write in one lab guest
    /// with an emulated NVDIMM (root): WRITE_PERSIST on the DAX path and on
    /// the msync path next to redis with `appendfsync always`, interleaved
    /// rounds, the load generator in the guest.
    BenchPersist {
        #[command(flatten)]
        bench: BenchArgs,
        /// Bytes per write.
        #[arg(long, default_value_t = 256)]
        size: usize,
    },
    /// Runs `bench-persist`'s measurement inside its guest.
    #[command(hide = true)]
    BenchPersistGuest {
        /// The shared work folder (topology in, results out).
        #[arg(long)]
        work: PathBuf,
        #[arg(long)]
        rounds: usize,
        #[arg(long)]
        ops: usize,
        #[arg(long)]
        warmup: usize,
        #[arg(long)]
        size: usize,
    },
    /// Cut the power of a pmem-server's QEMU guest (the RDMA lab; root) at
    /// seeded random instants while a workload runs, and check every
    /// acknowledged write and atomic after each boot.
    PowerCut {
        /// How many power cuts.
        #[arg(long, default_value_t = 50)]
        cuts: usize,
        /// Seed of the cut instants.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Where the server keeps its regions: `disk` (virtio disk, msync),
        /// `fsdax` (emulated NVDIMM, DAX with MAP_SYNC) or `devdax` (emulated
        /// NVDIMM as /dev/dax0.0, device DAX).
        #[arg(long, value_enum, default_value_t = testbed::power_cut::Medium::Disk)]
        medium: testbed::power_cut::Medium,
        /// Where the report goes (reports/<run-id>/ by default).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Runs a daemon (used by the testbed to start the fabric's processes).
    #[command(hide = true)]
    Daemon {
        /// pmem-server or fabric-device, then its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Runs one client's workload (used by `run`, `demo` and `chaos`).
    #[command(hide = true)]
    Worker(WorkerArgs),
    /// Check the history a `--workload register` run recorded for
    /// linearizability (stateright's tester, each hot word alone); exit
    /// status 1 when a word has no linearization.
    CheckLinearizable {
        /// The run's folder (`reports/<run-id>`), or a folder of
        /// `*.history.jsonl` files.
        dir: PathBuf,
        /// Seconds the search may take before the words still searched
        /// are called undecided (which fails the check).
        #[arg(long, default_value_t = testbed::linearizability::DEFAULT_BUDGET.as_secs())]
        budget: u64,
    },
}

/// Which running `testbed up` a command talks to.
#[derive(Debug, clap::Args)]
struct ControlArgs {
    /// The run folder `testbed up` printed (`reports/<run-id>`); by default
    /// the one `testbed up` running under `reports/`.
    #[arg(long, value_name = "DIR")]
    run: Option<PathBuf>,
}

/// What `run` and `chaos` run on each client, and for how long.
#[derive(Debug, clap::Args)]
struct WorkloadArgs {
    /// ycsb-a, ycsb-b, ycsb-c, counter, mixed, or register (a few hot
    /// words shared by every client, the history checked for
    /// linearizability).
    #[arg(long, default_value = "mixed")]
    workload: Workload,
    /// How many of the topology's clients run (all by default).
    #[arg(long)]
    clients: Option<usize>,
    /// Seconds of workload.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 256)]
    size: u64,
    /// Operations in flight per client.
    #[arg(long, default_value_t = 8)]
    depth: usize,
    /// Keys per client (register: hot words shared by all, at most 8).
    #[arg(long, default_value_t = 4096)]
    keys: u64,
    /// Zipfian keys instead of uniform.
    #[arg(long)]
    zipfian: bool,
    /// Whether the clients' writes ask the servers to bypass their CPU
    /// cache: auto (writes of 64 KiB or more), cached or non-temporal.
    #[arg(long, default_value = "auto")]
    server_cache: ServerCache,
    /// Copies of every region (1, 2 or 3): sets the topology's `[pool]
    /// replicas`; the run then compares the copies at its end.
    #[arg(long)]
    replicas: Option<u64>,
}

impl WorkloadArgs {
    /// Run options for `command` with these workload settings and `seed`.
    fn options(&self, command: &str, seed: u64) -> RunOptions {
        let mut options = RunOptions::new(command, self.workload);
        options.clients = self.clients;
        options.duration = Duration::from_secs_f64(self.duration);
        options.size = self.size.max(16);
        options.depth = self.depth.max(1);
        options.keys = self.keys.max(1);
        options.zipfian = self.zipfian;
        options.server_cache = self.server_cache;
        options.seed = seed;
        options.replicas = self.replicas;
        options
    }
}

/// The options of `testbed run`.
#[derive(Debug, clap::Args)]
struct RunArgs {
    /// The topology file; the embedded default topology when absent.
    file: Option<PathBuf>,
    #[command(flatten)]
    workload: WorkloadArgs,
    /// Seed of the workload's operations and keys (client i uses seed + i).
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// How hosts are networked.
    #[arg(long, value_enum, default_value = "loopback")]
    net: Net,
    /// Keep region files here (by default a folder in the run's report
    /// folder, removed when the run passes and kept when it fails).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Reports go to DIR/<run-id>/.
    #[arg(long, default_value = "reports")]
    reports: PathBuf,
    #[command(flatten)]
    control: testbed::etcd::ControlArgs,
}

/// The options of `testbed chaos`.
#[derive(Debug, clap::Args)]
struct ChaosArgs {
    /// The topology file; the embedded default topology when absent.
    file: Option<PathBuf>,
    /// kill-fabric, kill-server, freeze-server (SIGSTOP a server past its
    /// liveness lease, SIGCONT it once the map took one of its copies out
    /// of service), cut-link (needs --net netns or lab), restart-all, kill-etcd (needs --control etcd), kill-etcd-leader
    /// (needs --control etcd --etcd-members 3), or a membership change on
    /// the map (needs --control etcd; one change whatever --faults says):
    /// add-server (the last server held back from the first map, added
    /// under the workload), add-device (a device held back, added),
    /// remove-device (a device every client has another path than,
    /// removed and stopped).
    #[arg(long)]
    scenario: Scenario,
    /// How many faults.
    #[arg(long, default_value_t = 2)]
    faults: usize,
    #[command(flatten)]
    workload: WorkloadArgs,
    /// Seed of the fault times and targets and of the workload's
    /// operations and keys (client i uses seed + i).
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// How hosts are networked.
    #[arg(long, value_enum, default_value = "loopback")]
    net: Net,
    /// Reports go to DIR/<run-id>/.
    #[arg(long, default_value = "reports")]
    reports: PathBuf,
    #[command(flatten)]
    control: testbed::etcd::ControlArgs,
}

/// The options of `testbed worker`.
#[derive(Debug, clap::Args)]
struct WorkerArgs {
    /// Where the pool's map comes from: the run's topology file
    /// (`--config`), or etcd (`--etcd`, `--pool`, `--etcd-credentials`),
    /// which the worker's pool then follows.
    #[command(flatten)]
    map: ::control::MapFlags,
    #[arg(long)]
    client: String,
    #[arg(long)]
    index: usize,
    #[arg(long)]
    clients: usize,
    #[arg(long)]
    workload: Workload,
    #[arg(long)]
    duration_ms: u64,
    #[arg(long)]
    size: u64,
    #[arg(long)]
    depth: usize,
    #[arg(long)]
    keys: u64,
    #[arg(long)]
    seed: u64,
    #[arg(long)]
    start_unix_ms: u64,
    #[arg(long)]
    bucket_ms: u64,
    #[arg(long)]
    zipfian: bool,
    #[arg(long, default_value = "auto")]
    server_cache: ServerCache,
    /// Zero the worker's slice first (a reused data directory).
    #[arg(long)]
    clear: bool,
    #[arg(long)]
    out: PathBuf,
}

/// Prints an error with its whole cause chain.
fn print_chain(err: &dyn std::error::Error) {
    eprintln!("error: {}", telemetry::logging::error_chain(err));
}

fn validate(file: Option<&PathBuf>, hosts: &[String]) -> ExitCode {
    let topology = match load_topology(file.map(PathBuf::as_path)) {
        Ok(t) => t,
        Err(err) => {
            print_chain(&err);
            return ExitCode::FAILURE;
        }
    };
    for warning in topology.warnings() {
        eprintln!("warning: {warning}");
    }
    if let Err(errors) = topology.validate() {
        eprintln!(
            "{}: invalid topology, {} problem(s):",
            topology.source,
            errors.problems.len()
        );
        for problem in &errors.problems {
            eprintln!("  {problem}");
        }
        return ExitCode::FAILURE;
    }
    let on_host: Vec<_> = hosts
        .iter()
        .flat_map(|server| topology.check_host(&topology::ServerId::new(server.as_str())))
        .collect();
    if !on_host.is_empty() {
        eprintln!(
            "{}: not usable on this host, {} problem(s):",
            topology.source,
            on_host.len()
        );
        for problem in &on_host {
            eprintln!("  {problem}");
        }
        return ExitCode::FAILURE;
    }
    match Layout::new(&topology) {
        Ok(layout) => {
            print!("{}", summary::render(&topology, &layout));
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("{}: invalid layout: {err}", topology.source);
            ExitCode::FAILURE
        }
    }
}

/// What `testbed up` was asked for.
struct UpArgs {
    file: Option<PathBuf>,
    net: Net,
    data_dir: PathBuf,
    prometheus: bool,
    format: bool,
    map_from: testbed::etcd::ControlArgs,
}

fn up(args: UpArgs) -> anyhow::Result<()> {
    let UpArgs {
        file,
        net,
        data_dir,
        prometheus,
        format,
        map_from,
    } = args;
    let topology = load_topology_on(file.as_deref(), net.into())?;
    let run_dir = PathBuf::from("reports").join(testbed::run::run_id("up"));
    let mut options = LaunchOptions::new(data_dir.clone(), run_dir)?;
    options.net = net.into();
    options.format = format;
    options.control = map_from.control().map_err(anyhow::Error::msg)?;
    let signals = signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM]);
    let signals = signals.context("install signal handlers")?;
    let run_dir = options.run_dir.clone();
    let fabric = match Fabric::start(&topology, options) {
        Ok(fabric) => fabric,
        Err(err) => return Err(testbed::advice::start_error(err, Starter::Up, &data_dir)),
    };
    let endpoints = fabric.endpoints();
    println!("{}", summary::endpoints_table(&endpoints));
    println!("topology in use: {}", fabric.topology_path.display());
    if let Some(etcd) = fabric.etcd() {
        println!(
            "etcd: {} (members {}; pool {}; authentication on, credentials in {})",
            etcd.endpoints(),
            etcd.member_names().join(", "),
            etcd.pool(),
            etcd.credentials_dir().display()
        );
        println!("cluster: {}", etcd.pmemctl_line());
    }
    if let Some(dir) = fabric.secrets() {
        println!(
            "keys: {} (clients: PMEM_FABRIC_SECRETS={0} or pmemctl --secrets {0}; \
             rotate-key as operator admin)",
            dir.display()
        );
    }
    print!("{}", pmemctl_lines(&fabric)?);
    let _prometheus = if prometheus {
        let targets: Vec<ScrapeTarget> = endpoints
            .iter()
            .filter_map(|e| {
                let addr = e.admin.parse().ok()?;
                Some(match e.kind {
                    DaemonKind::PmemServer => ScrapeTarget::pmem_server(e.id.clone(), addr),
                    DaemonKind::FabricDevice => ScrapeTarget::fabric_device(e.id.clone(), addr),
                })
            })
            .collect();
        let server = PrometheusServer::start(&run_dir.join("prometheus"), &targets)
            .context("start Prometheus")?;
        server
            .wait_targets_up(Duration::from_secs(60))
            .context("wait for Prometheus to scrape every daemon")?;
        println!("prometheus: {} (every target up)", server.url());
        Some(server)
    } else {
        None
    };
    println!("run folder: {}", run_dir.display());
    println!("fabric is up; Ctrl-C or SIGTERM stops it");
    let ended = Supervisor::run(fabric, &run_dir, signals);
    println!("stopping");
    let mut clean = true;
    for (kind, id, status) in ended.fabric.stop() {
        let line = match ended.dead.get(&(kind, id.clone())) {
            Some(dead) => dead.clone(),
            None if status.is_some_and(|s| s.success()) => "stopped".to_owned(),
            None => match status {
                Some(status) => format!(
                    "did not stop cleanly ({})",
                    testbed::supervise::exit::describe(status)
                ),
                None => "did not stop within its time and was killed".to_owned(),
            },
        };
        clean &= line == "stopped";
        println!("  {} {id}: {line}", kind.program());
    }
    anyhow::ensure!(clean, "some daemons did not stop cleanly");
    Ok(())
}

/// Ready-to-paste `pmemctl` lines for the first client of `fabric` (none
/// in lab mode, whose clients are guests).
fn pmemctl_lines(fabric: &Fabric) -> anyhow::Result<String> {
    if fabric.is_lab() {
        return Ok(String::new());
    }
    let Some((first, others)) = fabric.topology.clients.split_first() else {
        return Ok(String::new());
    };
    let config = std::path::absolute(&fabric.topology_path).context("the topology's path")?;
    let client = first.id.to_string();
    let others: Vec<String> = others.iter().map(|c| c.id.to_string()).collect();
    let namespace = fabric.client_namespace(&client);
    Ok(testbed::supervise::pmemctl::lines(
        &testbed::supervise::pmemctl::PmemctlTarget {
            config: &config,
            client: &client,
            other_clients: &others,
            secrets: fabric.secrets(),
            namespace: namespace.as_deref(),
            allocator: fabric.topology.pool.allocator.is_some(),
        },
    ))
}

/// `testbed restart` and `testbed status`: one request to a running `up`.
fn control(request: &str, args: ControlArgs) -> anyhow::Result<bool> {
    let run = match args.run {
        Some(run) => run,
        None => control::find_running(std::path::Path::new("reports"))?,
    };
    let (text, ok) = control::send(&run, request)?;
    if ok {
        println!("{text}");
    } else {
        eprintln!("testbed: {text}");
    }
    Ok(ok)
}

fn run(options: &RunOptions, file: Option<&PathBuf>) -> anyhow::Result<bool> {
    let mut topology = load_topology_on(file.map(PathBuf::as_path), options.net)?;
    if let Some(copies) = options.replicas {
        topology = testbed::with_replicas(topology, copies)?;
    }
    run_on(options, &topology)
}

fn run_on(options: &RunOptions, topology: &topology::Topology) -> anyhow::Result<bool> {
    if options.workload == Workload::Register && matches!(options.net, NetMode::Lab) {
        anyhow::bail!(
            "--workload register orders operations by a clock every client shares, which lab \
             guests do not; run it with --net loopback or --net netns"
        );
    }
    let outcome = testbed::run::execute(topology, &topology.source, options)?;
    print!("{}", outcome.summary());
    let violations = testbed::run::contract_violations(&outcome.report);
    for line in &violations {
        println!("  CONTRACT VIOLATED: {line}");
    }
    Ok(violations.is_empty() && outcome.unclean_exits.is_empty())
}

fn demo(duration: f64, reports: PathBuf) -> anyhow::Result<bool> {
    let mut options = RunOptions::new("demo", Workload::Mixed);
    options.duration = Duration::from_secs_f64(duration);
    options.reports = reports;
    options.faults = testbed::demo::faults(options.duration);
    let topology = testbed::demo::topology()?;
    println!(
        "pmem-fabric demo: default topology (2 PMEM servers, 2 fabric devices, 2 clients x 2 \
         RNICs) with server B's regions kept twice (on B and A), mixed workload for \
         {duration:.0} s; fabric device B killed at 30% and PMEM server B at 65%, each \
         restarted"
    );
    run_on(&options, &topology)
}

fn worker(
    config: WorkerConfig,
    map: ::control::MapFlags,
    server_cache: ServerCache,
    start_unix_ms: u64,
    out: PathBuf,
) -> anyhow::Result<()> {
    let source = map.source()?;
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let run_start = Instant::now()
        .checked_sub(Duration::from_millis(now_ms.saturating_sub(start_unix_ms)))
        .unwrap_or_else(Instant::now);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = runtime.block_on(async move {
        let pool = open_pool(source, config.client.as_str(), server_cache).await?;
        let space = testbed::workload::space::open(&pool)
            .await
            .map_err(|why| anyhow::anyhow!("where the keys live: {why}"))?;
        if config.clear {
            testbed::workload::clear_slice(&pool, space, &config)
                .await
                .map_err(|e| anyhow::anyhow!("clear the slice: {}", client_vmm::error_chain(&e)))?;
        }
        let progress = std::sync::Arc::new(Progress::default());
        println!("{}", testbed::workload::STARTED_LINE);
        let reporter = {
            let progress = std::sync::Arc::clone(&progress);
            let pool = pool.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    println!(
                        "progress ops={} errors={} epoch={}",
                        progress.ops.load(std::sync::atomic::Ordering::Relaxed),
                        progress.errors.load(std::sync::atomic::Ordering::Relaxed),
                        pool.map_epoch()
                    );
                }
            })
        };
        // A pool that follows the map: say when regions a new epoch brings
        // are first served.
        let prober =
            (pool.map_epoch() > 0).then(|| testbed::first_use::Prober::start(pool.clone()));
        let result = testbed::workload::run(pool, config, space, run_start, progress).await;
        if let Some(prober) = prober {
            prober.finish(Duration::from_secs(30)).await;
        }
        reporter.abort();
        anyhow::Ok(result)
    })?;
    let text = serde_json::to_string(&result)?;
    std::fs::write(&out, text).with_context(|| format!("write {}", out.display()))?;
    Ok(())
}

fn outcome(result: anyhow::Result<bool>) -> ExitCode {
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("testbed: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The id the testbed's log lines carry: the command (`worker-<client>`
/// for a worker); none for `daemon`, which logs as the daemon it runs.
fn log_id(command: &Command) -> Option<String> {
    let name = match command {
        Command::Validate { .. } => "validate",
        Command::Up { .. } => "up",
        Command::Restart { .. } => "restart",
        Command::Status { .. } => "status",
        Command::Down { .. } => "down",
        Command::Keygen { .. } => "keygen",
        Command::Run(_) => "run",
        Command::MapFollow { .. } => "map-follow",
        Command::Demo { .. } => "demo",
        Command::Chaos(_) => "chaos",
        Command::Bench(_) => "bench",
        Command::BenchRoce { .. } => "bench-roce",
        Command::BenchVerbs(_) => "bench-verbs",
        Command::BenchPersist { .. } => "bench-persist",
        Command::BenchPersistGuest { .. } => "bench-persist-guest",
        Command::PowerCut { .. } => "power-cut",
        Command::Daemon { .. } => return None,
        Command::Worker(args) => return Some(format!("worker-{}", args.client)),
        Command::CheckLinearizable { .. } => "check-linearizable",
    };
    Some(name.to_owned())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let _log = log_id(&cli.command)
        .map(|id| telemetry::logging::init("testbed", &id, telemetry::logging::LogFormat::Text));
    match cli.command {
        Command::Validate { file, host } => validate(file.as_ref(), &host),
        Command::Up {
            file,
            net,
            data_dir,
            prometheus,
            format,
            map_from,
        } => outcome(
            up(UpArgs {
                file,
                net,
                data_dir,
                prometheus,
                format,
                map_from,
            })
            .map(|()| true),
        ),
        Command::Restart { target, control } => outcome(self::control(
            &format!("restart {}", target.join(" ")),
            control,
        )),
        Command::Status { control } => outcome(self::control("status", control)),
        Command::Keygen { file, secrets } => outcome(keygen(file.as_deref(), &secrets)),
        Command::Down { prefix } => down(prefix.as_deref()),
        Command::Run(args) => outcome(run_command(args)),
        Command::MapFollow {
            file,
            net,
            etcd_members,
            changes,
            reports,
        } => outcome(map_follow(file, net, etcd_members, changes, reports)),
        Command::Demo { duration, reports } => outcome(demo(duration, reports)),
        Command::BenchRoce { bench, roce_io } => outcome(bench_roce(bench, roce_io)),
        Command::BenchVerbs(args) => outcome(bench_verbs(args)),
        Command::BenchPersist { bench, size } => outcome(bench_persist(bench, size)),
        Command::BenchPersistGuest {
            work,
            rounds,
            ops,
            warmup,
            size,
        } => {
            let plan = testbed::persist_bench::PersistPlan {
                rounds: rounds.clamp(1, 100),
                ops: ops.max(1),
                warmup,
                size: size.clamp(1, 64 << 10),
            };
            let args = testbed::persist_bench::GuestArgs { work, plan };
            outcome(testbed::persist_bench::guest_main(&args).map(|()| true))
        }
        Command::PowerCut {
            cuts,
            seed,
            medium,
            out,
        } => outcome(power_cut(cuts, seed, medium, out)),
        Command::Bench(args) => outcome(bench(args)),
        Command::Chaos(args) => outcome(chaos(args)),
        Command::Daemon { args } => match args.split_first() {
            Some((name, _)) if name == "pmem-server" => pmem_server::cli::main_with_args(args),
            Some((name, _)) if name == "fabric-device" => fabric_device::cli::main_with_args(args),
            _ => {
                eprintln!("testbed daemon: expected pmem-server or fabric-device");
                ExitCode::from(2)
            }
        },
        Command::Worker(args) => outcome(worker_command(args)),
        Command::CheckLinearizable { dir, budget } => {
            outcome(check_linearizable(&dir, Duration::from_secs(budget)))
        }
    }
}

/// `testbed map-follow`.
fn map_follow(
    file: Option<PathBuf>,
    net: Net,
    members: usize,
    changes: usize,
    reports: PathBuf,
) -> anyhow::Result<bool> {
    if matches!(net, Net::Lab) {
        anyhow::bail!("map-follow runs with --net loopback or --net netns");
    }
    if members == 0 || changes == 0 {
        anyhow::bail!("map-follow needs --etcd-members and --changes of at least 1");
    }
    let topology = load_topology_on(file.as_deref(), net.into())?;
    let run_dir = std::path::absolute(reports.join(testbed::run::run_id("map-follow")))?;
    let plan = testbed::map_follow::FollowPlan {
        net: net.into(),
        members,
        changes,
        run_dir: run_dir.clone(),
    };
    let report = testbed::map_follow::measure(&topology, &plan)?;
    print!("{}", report.text());
    std::fs::write(run_dir.join("map_follow.txt"), report.text())
        .with_context(|| format!("write {}", run_dir.display()))?;
    let _ = std::fs::remove_dir_all(run_dir.join("data"));
    println!("logs: {}", run_dir.display());
    Ok(true)
}

/// `testbed check-linearizable`: true when every word's history is
/// linearizable.
fn check_linearizable(dir: &std::path::Path, budget: Duration) -> anyhow::Result<bool> {
    let entries = testbed::linearizability::history::read_dir(dir)?;
    let report = testbed::linearizability::check(&entries, budget)?;
    println!("linearizability: {}", report.summary());
    for line in &report.failure {
        println!("  {line}");
    }
    Ok(report.passed)
}

/// `testbed keygen`.
fn keygen(file: Option<&std::path::Path>, secrets: &std::path::Path) -> anyhow::Result<bool> {
    let topology = load_topology(file)?;
    let written = testbed::keys::generate(&topology, secrets)?;
    println!("{} keys written to {}", written.len(), secrets.display());
    Ok(true)
}

/// `testbed down`.
fn down(prefix: Option<&str>) -> ExitCode {
    match testbed::netns::clean_up_crashed_runs(prefix) {
        Ok((killed, removed)) => {
            println!(
                "killed {killed} leftover processes; removed {removed} namespaces and interfaces left by earlier runs"
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            print_chain(&e);
            ExitCode::FAILURE
        }
    }
}

/// `testbed run`.
fn run_command(args: RunArgs) -> anyhow::Result<bool> {
    let RunArgs {
        file,
        workload,
        seed,
        net,
        data_dir,
        reports,
        control,
    } = args;
    let mut options = workload.options("run", seed);
    options.net = net.into();
    options.control = control.control().map_err(anyhow::Error::msg)?;
    options.topology_file = file.clone();
    options.data_dir = data_dir;
    options.reports = reports;
    run(&options, file.as_ref())
}

/// `testbed chaos`.
fn chaos(args: ChaosArgs) -> anyhow::Result<bool> {
    let ChaosArgs {
        file,
        scenario,
        faults,
        workload,
        seed,
        net,
        reports,
        control,
    } = args;
    let mut topology = load_topology_on(file.as_deref(), net.into())?;
    let mut options = workload.options("chaos", seed);
    if let Some(copies) = options.replicas {
        topology = testbed::with_replicas(topology, copies)?;
    }
    options.net = net.into();
    options.control = control.control().map_err(anyhow::Error::msg)?;
    scenario
        .check_control(options.control)
        .map_err(anyhow::Error::msg)?;
    options.topology_file = file;
    options.scenario = Some(scenario);
    options.reports = reports;
    options.faults = testbed::run::plan_faults(
        &topology,
        options.net,
        scenario,
        options.duration,
        faults,
        seed,
    );
    run_on(&options, &topology)
}

/// Where a report goes: `out`, or a fresh folder under `reports/`.
fn report_dir(out: Option<PathBuf>, kind: &str) -> PathBuf {
    out.unwrap_or_else(|| PathBuf::from("reports").join(testbed::run::run_id(kind)))
}

/// `testbed bench-roce`.
fn bench_roce(
    BenchArgs { quick, rounds, out }: BenchArgs,
    roce_io: testbed::roce_bench::RocePath,
) -> anyhow::Result<bool> {
    let out = report_dir(out, "bench-roce");
    let mut plan = testbed::roce_bench::RocePlan::new(quick, rounds);
    plan.roce_io = roce_io;
    let report = testbed::roce_bench::run(plan, &out)?;
    print!("{}", testbed::roce_bench::markdown(&report));
    println!("\nreport: {}", out.display());
    Ok(true)
}

/// `testbed bench-verbs`.
fn bench_verbs(BenchArgs { quick, rounds, out }: BenchArgs) -> anyhow::Result<bool> {
    let out = report_dir(out, "bench-verbs");
    let plan = testbed::verbs_bench::VerbsPlan::new(quick, rounds);
    let report = testbed::verbs_bench::run(plan, &out)?;
    print!("{}", testbed::verbs_bench::markdown(&report));
    println!("\nreport: {}", out.display());
    Ok(true)
}

/// `testbed bench-persist`.
fn bench_persist(BenchArgs { quick, rounds, out }: BenchArgs, size: usize) -> anyhow::Result<bool> {
    let out = report_dir(out, "bench-persist");
    let plan = testbed::persist_bench::PersistPlan::new(quick, rounds, size);
    let report = testbed::persist_bench::run(plan, &out)?;
    print!("{}", testbed::persist_bench::markdown(&report));
    println!("\nreport: {}", out.join("report.md").display());
    Ok(true)
}

/// `testbed power-cut`: true when nothing acknowledged was lost.
fn power_cut(
    cuts: usize,
    seed: u64,
    medium: testbed::power_cut::Medium,
    out: Option<PathBuf>,
) -> anyhow::Result<bool> {
    let out = report_dir(out, "power-cut");
    let plan = testbed::power_cut::PowerCutPlan {
        cuts,
        medium,
        seed,
        out: out.clone(),
    };
    let report = testbed::power_cut::run(&plan)?;
    print!("{}", testbed::power_cut::markdown(&report));
    println!("\nreport: {}", out.join("report.md").display());
    Ok(report.lost == 0)
}

/// `testbed bench`.
fn bench(BenchArgs { quick, rounds, out }: BenchArgs) -> anyhow::Result<bool> {
    let out = report_dir(out, "bench");
    let (report, files) = testbed::bench::run(quick, rounds, &out)?;
    println!("ratio                               value");
    for (name, value) in &report.ratios {
        println!("{name:<35} {value:>6.2}");
    }
    println!(
        "\nreport: {}\nraw figures: {}",
        files.markdown.display(),
        files.json.display()
    );
    Ok(true)
}

/// `testbed worker`: one client process of a run.
fn worker_command(args: WorkerArgs) -> anyhow::Result<bool> {
    let WorkerArgs {
        map,
        client,
        index,
        clients,
        workload,
        duration_ms,
        size,
        depth,
        keys,
        seed,
        start_unix_ms,
        bucket_ms,
        zipfian,
        server_cache,
        clear,
        out,
    } = args;
    let client_id = client.clone();
    let worker_config = WorkerConfig {
        client,
        index,
        clients,
        workload,
        zipfian,
        duration: Duration::from_millis(duration_ms),
        size: size.max(16),
        depth,
        keys,
        seed,
        bucket_ms,
        clear,
        history: out
            .parent()
            .map(|dir| testbed::workload::register::history_path(dir, &client_id)),
    };
    worker(worker_config, map, server_cache, start_unix_ms, out).map(|()| true)
}

/// Opens the pool as `client` from `source`: a topology file, or etcd (the
/// pool then follows the map), asking the servers for `server_cache` on
/// writes. Keys come from `$PMEM_FABRIC_SECRETS`.
async fn open_pool(
    source: ::control::MapSource,
    client: &str,
    server_cache: ServerCache,
) -> anyhow::Result<client_vmm::AsyncPool> {
    let builder = match source {
        ::control::MapSource::File(path) => {
            let topology = topology::Topology::load(&path)?;
            client_vmm::AsyncPool::builder(topology, client)
        }
        ::control::MapSource::Etcd {
            endpoints,
            pool,
            credentials,
        } => {
            let builder = client_vmm::AsyncPool::builder_on_etcd(endpoints, &pool, client);
            match credentials {
                Some(credentials) => builder.etcd_credentials(credentials),
                None => builder,
            }
        }
    };
    builder
        .server_cache(server_cache)
        .connect_async()
        .await
        .map_err(|e| anyhow::anyhow!(client_vmm::error_chain(&e)))
}
