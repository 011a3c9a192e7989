//! The command line's types: the commands, their options and the option
//! groups several commands share, as clap reads them. Their doc comments
//! are the command line's help, written for a terminal: placeholders such
//! as `DIR/<run-id>` are plain text there, not HTML.
#![allow(rustdoc::invalid_html_tags)]

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use pmem_client::ServerCache;

use crate::fabric::launch::NetMode;
use crate::run::{RunOptions, Scenario};
use crate::workload::Workload;

/// Brings pmem-fabric topologies up on one machine, drives and checks them.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Net {
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
pub struct BenchArgs {
    /// A short smoke run (checks the report is complete, not the targets).
    #[arg(long)]
    pub quick: bool,
    /// Rounds, interleaved where the bench compares systems (default 5, 2
    /// with --quick); the report gives medians and spreads.
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Where the report goes (reports/<run-id>/ by default).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
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
        map_from: crate::fabric::etcd::ControlArgs,
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
    Bench {
        #[command(flatten)]
        bench: BenchArgs,
        /// Idle client connections (each proves its key) held open to
        /// measure the fabric device's memory per connection (default
        /// 10000, 100 with --quick). The bench raises its open-file limit
        /// to fit them; its daemons inherit it.
        #[arg(long, value_name = "N")]
        idle_connections: Option<usize>,
    },
    /// The fabric device's CPU per operation on its RoCEv2 port next to its
    /// TCP port, in interleaved rounds (needs root: a network namespace and
    /// raw sockets).
    BenchRoce {
        #[command(flatten)]
        bench: BenchArgs,
        /// The frame path of the device's RoCEv2 port: xdp (an AF_XDP
        /// socket, the device's default), packet-ring (rings shared with
        /// the kernel) or socket (recvmmsg/sendmmsg).
        #[arg(long, value_name = "xdp|packet-ring|socket", default_value = "xdp")]
        roce_io: crate::bench::roce::RocePath,
        /// How long the device busy-polls after each event, in µs (0: it
        /// sleeps whenever nothing waits; `testbed bench` runs it at 1000).
        #[arg(long, value_name = "US", default_value_t = 0)]
        busy_poll_us: u64,
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
        #[arg(long, value_enum, default_value_t = crate::lab::power_cut::Medium::Disk)]
        medium: crate::lab::power_cut::Medium,
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
        #[arg(long, default_value_t = crate::linearizability::DEFAULT_BUDGET.as_secs())]
        budget: u64,
    },
}

/// Which running `testbed up` a command talks to.
#[derive(Debug, clap::Args)]
pub struct ControlArgs {
    /// The run folder `testbed up` printed (`reports/<run-id>`); by default
    /// the one `testbed up` running under `reports/`.
    #[arg(long, value_name = "DIR")]
    pub run: Option<PathBuf>,
}

/// What `run` and `chaos` run on each client, and for how long.
#[derive(Debug, clap::Args)]
pub struct WorkloadArgs {
    /// ycsb-a, ycsb-b, ycsb-c, counter, mixed, or register (a few hot
    /// words shared by every client, the history checked for
    /// linearizability).
    #[arg(long, default_value = "mixed")]
    pub workload: Workload,
    /// How many of the topology's clients run (all by default).
    #[arg(long)]
    pub clients: Option<usize>,
    /// Seconds of workload.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 256)]
    pub size: u64,
    /// Operations in flight per client.
    #[arg(long, default_value_t = 8)]
    pub depth: usize,
    /// Keys per client (register: hot words shared by all, at most 8).
    #[arg(long, default_value_t = 4096)]
    pub keys: u64,
    /// Zipfian keys instead of uniform.
    #[arg(long)]
    pub zipfian: bool,
    /// Whether the clients' writes ask the servers to bypass their CPU
    /// cache: auto (writes of 64 KiB or more), cached or non-temporal.
    #[arg(long, default_value = "auto")]
    pub server_cache: ServerCache,
    /// Copies of every region (1, 2 or 3): sets the topology's `[pool]
    /// replicas`; the run then compares the copies at its end.
    #[arg(long)]
    pub replicas: Option<u64>,
}

impl WorkloadArgs {
    /// Run options for `command` with these workload settings and `seed`.
    pub fn options(&self, command: &str, seed: u64) -> RunOptions {
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
pub struct RunArgs {
    /// The topology file; the embedded default topology when absent.
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Seed of the workload's operations and keys (client i uses seed + i).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// How hosts are networked.
    #[arg(long, value_enum, default_value = "loopback")]
    pub net: Net,
    /// Keep region files here (by default a folder in the run's report
    /// folder, removed when the run passes and kept when it fails).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Reports go to DIR/<run-id>/.
    #[arg(long, default_value = "reports")]
    pub reports: PathBuf,
    #[command(flatten)]
    pub control: crate::fabric::etcd::ControlArgs,
}

/// The options of `testbed chaos`.
#[derive(Debug, clap::Args)]
pub struct ChaosArgs {
    /// The topology file; the embedded default topology when absent.
    pub file: Option<PathBuf>,
    /// kill-fabric, kill-server, freeze-server (SIGSTOP a server past its
    /// liveness lease, SIGCONT it once the map took one of its copies out
    /// of service), cut-link (needs --net netns or lab), restart-all,
    /// kill-etcd (needs --control etcd), kill-etcd-leader
    /// (needs --control etcd --etcd-members 3), or a membership change on
    /// the map (needs --control etcd; one change whatever --faults says):
    /// add-server (the last server held back from the first map, added
    /// under the workload), add-device (a device held back, added),
    /// remove-device (a device every client has another path than,
    /// removed and stopped); with replicated regions (--replicas 2) and
    /// --control etcd: kill-owner-and-decider (the server of the first
    /// replicated region's deciding copy killed, and at once the region's
    /// owner device; both restarted once another device owns the region),
    /// kill-server-then-other (a server killed
    /// and restarted, then, once every copy serves again, a server holding
    /// the other copies; one pair whatever --faults says).
    #[arg(long)]
    pub scenario: Scenario,
    /// How many faults.
    #[arg(long, default_value_t = 2)]
    pub faults: usize,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Seed of the fault times and targets and of the workload's
    /// operations and keys (client i uses seed + i).
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// How hosts are networked.
    #[arg(long, value_enum, default_value = "loopback")]
    pub net: Net,
    /// Reports go to DIR/<run-id>/.
    #[arg(long, default_value = "reports")]
    pub reports: PathBuf,
    #[command(flatten)]
    pub control: crate::fabric::etcd::ControlArgs,
}

/// The options of `testbed worker`.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// Where the pool's map comes from: the run's topology file
    /// (`--config`), or etcd (`--etcd`, `--pool`, `--etcd-credentials`),
    /// which the worker's pool then follows.
    #[command(flatten)]
    pub map: ::control::MapFlags,
    #[arg(long)]
    pub client: String,
    #[arg(long)]
    pub index: usize,
    #[arg(long)]
    pub clients: usize,
    #[arg(long)]
    pub workload: Workload,
    #[arg(long)]
    pub duration_ms: u64,
    #[arg(long)]
    pub size: u64,
    #[arg(long)]
    pub depth: usize,
    #[arg(long)]
    pub keys: u64,
    #[arg(long)]
    pub seed: u64,
    #[arg(long)]
    pub start_unix_ms: u64,
    #[arg(long)]
    pub bucket_ms: u64,
    #[arg(long)]
    pub zipfian: bool,
    #[arg(long, default_value = "auto")]
    pub server_cache: ServerCache,
    /// Zero the worker's slice first (a reused data directory).
    #[arg(long)]
    pub clear: bool,
    /// After the duration, go on until the standard input closes (the
    /// run holds it open while a fault waits for the map).
    #[arg(long)]
    pub held_open: bool,
    #[arg(long)]
    pub out: PathBuf,
}

/// The id the testbed's log lines carry: the command (`worker-<client>`
/// for a worker); none for `daemon`, which logs as the daemon it runs.
pub fn log_id(command: &Command) -> Option<String> {
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
        Command::Bench { .. } => "bench",
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
