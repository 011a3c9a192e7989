//! `pmemctl`: read, write and run atomics on a pmem-fabric pool from the
//! command line, show the client's address map, paths and counters, and
//! drive the pool's allocator (format, alloc, free, named objects, df,
//! scrub).

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use control::MapSource;
use pmem_client::{AsyncPool, Placement, Pool, ServerCache, operator};
use topology::{RegionId, ServerId, SocketId, Topology};

use crate::ctl::{CliError, Ctl, Output, payload};

#[path = "pmemctl/allocator.rs"]
mod allocator;
#[path = "pmemctl/checksums.rs"]
mod checksums;
#[path = "pmemctl/cluster.rs"]
mod cluster;
#[path = "pmemctl/ctl.rs"]
mod ctl;
#[path = "pmemctl/num.rs"]
mod num;
#[path = "pmemctl/replicas.rs"]
mod replicas;
#[path = "pmemctl/show.rs"]
mod show;

const AFTER_HELP: &str = "\
Addresses and numbers are decimal (4096), hex (0x1000) or sizes (64MiB, 1TiB),
and may be summed: 1TiB+4MiB-100KiB. Addresses are virtual and absolute: the
pool's virtual space starts at 1TiB (0x10000000000), so `pmemctl read 1TiB 16`
reads the first 16 bytes of the pool; `pmemctl map` shows where every region
lies.

Exit status: 0 when the command did what was asked; 1 when it failed; 2 for
a command line that does not parse; 3 when a compare-and-swap did not swap
(the word did not hold OLD; it says what it held).

With an allocator (a topology with [pool.allocator], such as
configs/alloc.toml), addresses come from `alloc` instead: format the pool
once, then allocate, name, free and inspect memory. A freed allocation's keys
are rotated, so using its address afterwards fails with a use-after-free error;
`scrub` reclaims what a crashed client left half-allocated.

`scrub --checksums` is an operator's check of the PMEM itself: each server
records a checksum per 64 KiB block on the first run and verifies it on the
next, naming any block that changed without a write (exit status 1).
`scrub --replicas` compares the copies of replicated regions block by block,
names each block that differs and the damaged copy where the majority or the
checksums recorded at rest decide; `--repair` (map in etcd) has the region's
owner device resync that copy.

Examples:
  pmemctl --config configs/default.toml --client c1 write 1TiB+64 hello --persist
  pmemctl --config configs/default.toml --client c1 read 1TiB 128
  pmemctl --config configs/alloc.toml --client c1 format
  pmemctl --config configs/alloc.toml --client c1 alloc 3MiB --name orders
  pmemctl --config configs/alloc.toml --client c2 open orders
  pmemctl --config configs/alloc.toml --client c1 alloc 4MiB --server B --socket 1
  pmemctl --config configs/alloc.toml --client c1 free 0x10000600000
  pmemctl --config configs/alloc.toml --client c1 ls
  pmemctl --config configs/alloc.toml --client c1 df
  pmemctl --config configs/alloc.toml --client c1 rm orders
  pmemctl --config configs/alloc.toml --client c1 scrub
  pmemctl --config configs/default.toml --secrets keys scrub --checksums --operator admin
  pmemctl --config configs/default.toml --secrets keys rotate-key PA.1 --operator admin
  pmemctl --etcd http://127.0.0.1:2379 --pool default scrub --replicas --repair";

/// Reads, writes and runs atomics on a pmem-fabric pool as one client of it.
#[derive(Debug, Parser)]
#[command(name = "pmemctl", version, after_help = AFTER_HELP)]
struct Cli {
    /// The topology file (the same one the daemons read); every command
    /// but `cluster` needs one.
    #[arg(long, value_name = "TOPOLOGY", global = true)]
    config: Option<PathBuf>,
    /// The client id to connect as (one of the topology's clients);
    /// every command but `rotate-key` and `scrub --checksums` needs one.
    #[arg(long, value_name = "ID", global = true)]
    client: Option<String>,
    /// How long one attempt on one path may take before it is re-sent on
    /// another path.
    #[arg(long, value_name = "MS")]
    attempt_timeout_ms: Option<u64>,
    /// How long a whole operation may take, retries included.
    #[arg(long, value_name = "MS")]
    op_timeout_ms: Option<u64>,
    /// How long connecting to one fabric device may take.
    #[arg(long, value_name = "MS")]
    connect_timeout_ms: Option<u64>,
    /// Take the pool's map from etcd instead of --config, and follow it
    /// while the command runs: etcd's client URLs, comma-separated
    /// (http://h1:2379,http://h2:2379). --config wins when both are given.
    #[arg(long, value_name = "URLS", env = "PMEM_FABRIC_ETCD")]
    etcd: Option<control::Endpoints>,
    /// With --etcd: the file of the etcd user to read the map as (one
    /// line `user:password`, mode 600), when etcd has authentication on.
    #[arg(long, value_name = "FILE", env = "PMEM_FABRIC_ETCD_CREDENTIALS")]
    etcd_credentials: Option<PathBuf>,
    /// With --etcd: the pool whose map to take (its `[pool] name`).
    #[arg(long, value_name = "NAME", default_value = "default")]
    pool: String,
    /// Folder of the principals' keys: prove this client's key
    /// (`client.<ID>.key`) to the fabric devices, or for `rotate-key` and `scrub --checksums` the
    /// operator's (`operator.<NAME>.key`) to the server. Default:
    /// `$PMEM_FABRIC_SECRETS`, if set.
    #[arg(long, value_name = "DIR", global = true)]
    secrets: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Commands on the pool, as its client (`--client`).
    #[command(flatten)]
    Pool(PoolCommand),
    /// Replaces REGION's key with a fresh random one on the server that
    /// owns it (an operator's action; no --client needed). The old key
    /// opens nothing afterwards; clients pick up the new one by themselves.
    #[command(
        override_usage = "pmemctl --config TOPOLOGY [--secrets DIR] rotate-key REGION [--operator NAME]"
    )]
    RotateKey {
        /// The region's id in the topology.
        region: String,
        /// The operator to act as: with --secrets (or
        /// $PMEM_FABRIC_SECRETS), `operator.<NAME>.key` is proven.
        #[arg(long, value_name = "NAME", default_value = "admin")]
        operator: String,
    },
    /// The cluster map and membership in etcd (the control plane): `init`,
    /// `show`, `apply`, `drain-server`. Needs --etcd (or
    /// $PMEM_FABRIC_ETCD), not --config.
    Cluster(cluster::ClusterArgs),
}

/// What a client does with the pool.
#[derive(Debug, Subcommand)]
enum PoolCommand {
    /// Reads LEN bytes at ADDR: a hex dump on stdout (the offset column is
    /// the virtual address), or the raw bytes into a file.
    #[command(
        override_usage = "pmemctl --config TOPOLOGY --client ID [--secrets DIR] read ADDR LEN [--out FILE]"
    )]
    Read {
        /// Virtual address (1TiB is the first byte of the pool).
        #[arg(value_parser = num::parse_number)]
        addr: u64,
        /// Bytes to read (4096, 0x1000, 4KiB).
        #[arg(value_parser = num::parse_number)]
        len: u64,
        /// Write the raw bytes to this file instead of dumping them.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Writes DATA (a UTF-8 string) or the bytes of FILE (`@FILE`) at ADDR.
    #[command(
        override_usage = "pmemctl --config TOPOLOGY --client ID [--secrets DIR] write ADDR DATA|@FILE [--persist] [--non-temporal]"
    )]
    Write {
        /// Virtual address (1TiB is the first byte of the pool).
        #[arg(value_parser = num::parse_number)]
        addr: u64,
        /// The text to write, `@FILE` for a file's bytes, or `@@…` for text
        /// that starts with `@`.
        #[arg(value_name = "DATA|@FILE")]
        data: String,
        /// Return only once the data is durable (WRITE_PERSIST).
        #[arg(long)]
        persist: bool,
        /// Ask the server to store with non-temporal stores, around its CPU
        /// cache, whatever the size (by default only writes of 64 KiB or
        /// more do).
        #[arg(long)]
        non_temporal: bool,
    },
    /// Compare-and-swap of the 8-byte word at ADDR: sets it to NEW if it
    /// holds OLD. Prints the old value when it swapped; when the word held
    /// something else, says what and exits with status 3.
    #[command(
        override_usage = "pmemctl --config TOPOLOGY --client ID [--secrets DIR] cas ADDR OLD NEW"
    )]
    Cas {
        /// Virtual address, 8-byte aligned.
        #[arg(value_parser = num::parse_number)]
        addr: u64,
        /// The value expected.
        #[arg(value_parser = num::parse_operand, allow_hyphen_values = true)]
        old: u64,
        /// The value to store.
        #[arg(value_parser = num::parse_operand, allow_hyphen_values = true)]
        new: u64,
    },
    /// Fetch-and-add on the 8-byte word at ADDR (wrapping; a negative DELTA
    /// subtracts); prints the old value.
    #[command(
        override_usage = "pmemctl --config TOPOLOGY --client ID [--secrets DIR] faa ADDR DELTA"
    )]
    Faa {
        /// Virtual address, 8-byte aligned.
        #[arg(value_parser = num::parse_number)]
        addr: u64,
        /// What to add.
        #[arg(value_parser = num::parse_operand, allow_hyphen_values = true)]
        delta: u64,
    },
    /// Makes LEN bytes at ADDR durable.
    #[command(
        override_usage = "pmemctl --config TOPOLOGY --client ID [--secrets DIR] flush ADDR LEN"
    )]
    Flush {
        /// Virtual address.
        #[arg(value_parser = num::parse_number)]
        addr: u64,
        /// Bytes to flush.
        #[arg(value_parser = num::parse_number)]
        len: u64,
    },
    /// Shows the address map (every region's virtual and PMEM range) and
    /// each path's health.
    #[command(override_usage = "pmemctl --config TOPOLOGY --client ID [--secrets DIR] map")]
    Map,
    /// Shows this client's counters (for this pmemctl's own connection) and
    /// a summary of its paths.
    #[command(override_usage = "pmemctl --config TOPOLOGY --client ID [--secrets DIR] stat")]
    Stat,
    /// Writes the allocator's empty metadata: every extent free, no named
    /// objects. Refuses a formatted pool unless --force.
    #[command(
        override_usage = "pmemctl --config TOPOLOGY --client ID [--secrets DIR] format [--force]"
    )]
    Format {
        /// Format even a formatted pool, freeing everything in it.
        #[arg(long)]
        force: bool,
    },
    /// Allocates SIZE bytes; prints the size and the virtual address.
    #[command(
        override_usage = "pmemctl --config TOPOLOGY --client ID [--secrets DIR] alloc SIZE [--name NAME] [--server SERVER [--socket SOCKET]]"
    )]
    Alloc {
        /// Bytes to allocate (64, 0x1000, 4KiB, 3MiB).
        #[arg(value_parser = num::parse_number)]
        size: u64,
        /// Create it as a named object every client can `open`.
        #[arg(long, value_name = "NAME")]
        name: Option<String>,
        /// Place its extents on this server only (sizes up to a quarter
        /// extent come from slabs and follow it only when a new slab is made).
        #[arg(long, value_name = "SERVER")]
        server: Option<String>,
        /// Place its extents on this CPU socket of --server only.
        #[arg(long, value_name = "SOCKET", requires = "server")]
        socket: Option<String>,
    },
    /// Frees the allocation starting at ADDR (its keys are rotated).
    #[command(override_usage = "pmemctl --config TOPOLOGY --client ID [--secrets DIR] free ADDR")]
    Free {
        /// The virtual address `alloc` printed.
        #[arg(value_parser = num::parse_number)]
        addr: u64,
    },
    /// Prints the size and virtual address of the named object NAME.
    #[command(override_usage = "pmemctl --config TOPOLOGY --client ID [--secrets DIR] open NAME")]
    Open {
        /// The object's name.
        name: String,
    },
    /// Removes the named object NAME and frees its memory.
    #[command(override_usage = "pmemctl --config TOPOLOGY --client ID [--secrets DIR] rm NAME")]
    Rm {
        /// The object's name.
        name: String,
    },
    /// Lists the named objects: address, size, owner and extents (as
    /// SERVER/REGION, `*N` for N of them in a row in one region).
    #[command(override_usage = "pmemctl --config TOPOLOGY --client ID [--secrets DIR] ls")]
    Ls,
    /// Shows capacity used and free per server and region, and slab usage.
    #[command(override_usage = "pmemctl --config TOPOLOGY --client ID [--secrets DIR] df")]
    Df,
    /// Reclaims what clients that crashed mid-allocation left behind, and
    /// says what it reclaimed. Run it when no client is allocating.
    ///
    /// With --checksums instead (an operator's action; no --client needed):
    /// asks the servers to check every block of their regions against the
    /// checksum they recorded for it, recording it on the first scrub after
    /// a server starts and for blocks written since. Names the region and
    /// block of every mismatch and exits non-zero if there is one.
    ///
    /// With --replicas instead (an operator's action): compares every copy
    /// of each replicated region block by block (the checksums of the bytes
    /// as they are, from each copy's server) and names each block that
    /// differs with each copy's checksum and which copy is damaged: the
    /// majority of three copies decides, else the checksums recorded at
    /// rest (--checksums), else nothing. With --repair (the map in etcd)
    /// each damaged copy is marked syncing: its owner device rewrites what
    /// differs from a serving copy, held against the application's writes.
    /// Exits non-zero while a difference is left unrepaired.
    #[command(
        override_usage = "pmemctl --config TOPOLOGY --client ID [--secrets DIR] scrub\n       pmemctl --config TOPOLOGY [--secrets DIR] scrub --checksums [--region REGION]... [--operator NAME]\n       pmemctl --etcd URLS --pool NAME [--secrets DIR] scrub --replicas [--region REGION]... [--repair] [--operator NAME]",
        group(clap::ArgGroup::new("operator_scrub").args(["checksums", "replicas"]))
    )]
    Scrub {
        /// Check the regions' blocks against their checksums.
        #[arg(long)]
        checksums: bool,
        /// Compare the copies of replicated regions block by block.
        #[arg(long)]
        replicas: bool,
        /// With --replicas: mark each copy found damaged syncing (needs
        /// the map in etcd: --etcd), so that its owner device repairs it.
        #[arg(long, requires = "replicas")]
        repair: bool,
        /// With --checksums or --replicas: only this region (repeatable;
        /// default: all).
        #[arg(long, value_name = "REGION", requires = "operator_scrub")]
        region: Vec<String>,
        /// With --checksums or --replicas: the operator to act as (see
        /// rotate-key).
        #[arg(
            long,
            value_name = "NAME",
            default_value = "admin",
            requires = "operator_scrub"
        )]
        operator: String,
    },
}

/// `scrub --replicas`: what it needs to reach the copies and the map.
struct ReplicaScrub<'a> {
    topology: &'a Topology,
    source: &'a MapSource,
    operator: &'a str,
    secrets: Option<&'a std::path::Path>,
    timeout: Duration,
}

impl ReplicaScrub<'_> {
    /// Compares the copies of `regions` (every replicated one when empty),
    /// judges each difference and, with `repair`, marks the damaged copies
    /// syncing; the report goes to `text`, and an error says when a
    /// difference is left.
    fn run(&self, regions: &[String], repair: bool, text: &mut String) -> Result<(), CliError> {
        let map = match self.source {
            MapSource::Etcd {
                endpoints,
                pool,
                credentials,
            } => Some(cluster::read_map(endpoints, pool, credentials.as_ref())?),
            MapSource::File(_) => None,
        };
        let sets: Vec<topology::ReplicaSet> = self
            .topology
            .replica_sets()
            .into_iter()
            .filter(|s| s.is_replicated())
            .filter(|s| regions.is_empty() || regions.iter().any(|r| r == s.region.as_str()))
            .collect();
        if let Some(unknown) = regions
            .iter()
            .find(|r| !sets.iter().any(|s| s.region.as_str() == r.as_str()))
        {
            return Err(CliError::NotReplicated(unknown.clone()));
        }
        let mut compared = Vec::new();
        let mut found = Vec::new();
        for set in &sets {
            // Only serving copies hold every acknowledged write; a syncing
            // one is being brought up to date already.
            let servers: Vec<&ServerId> = set
                .replicas
                .iter()
                .map(|r| &r.server)
                .filter(|server| {
                    map.as_ref()
                        .and_then(|m| m.replica_set(set.region.as_str()))
                        .and_then(|r| r.state_on(server.as_str()))
                        .is_none_or(|state| state == control::ReplicaState::Serving)
                })
                .collect();
            if servers.len() < 2 {
                continue;
            }
            // Each copy's server checks the checksums it recorded at rest
            // (recording them the first time): the blocks it finds changed
            // without a write.
            let mut recorded: Vec<(String, Vec<u64>)> = Vec::new();
            let mut copies = Vec::new();
            for server in &servers {
                let scrub = operator::scrub_copy(
                    self.topology,
                    &set.region,
                    server,
                    self.operator,
                    self.secrets,
                    self.timeout,
                )?;
                recorded.push((server.to_string(), scrub.mismatches));
                copies.push(operator::copy_sums(
                    self.topology,
                    &set.region,
                    server,
                    self.operator,
                    self.secrets,
                    self.timeout,
                )?);
            }
            let blocks = replicas::differing(&copies);
            for block in blocks {
                let sums: Vec<(String, u64)> = copies
                    .iter()
                    .map(|c| {
                        let sum = c.sums.get(block as usize).copied().unwrap_or(0);
                        (c.server.clone(), sum)
                    })
                    .collect();
                let bad: Vec<String> = recorded
                    .iter()
                    .filter(|(_, mismatches)| mismatches.contains(&block))
                    .map(|(server, _)| server.clone())
                    .collect();
                found.push(replicas::Difference {
                    region: set.region.to_string(),
                    block,
                    block_len: copies[0].block_len,
                    verdict: replicas::judge(&sums, &bad),
                    sums,
                });
            }
            compared.push((
                set.region.to_string(),
                servers.iter().map(|s| s.to_string()).collect(),
                copies
                    .iter()
                    .map(|c| c.sums.len() as u64)
                    .max()
                    .unwrap_or(0),
            ));
        }
        text.push_str(&replicas::render(&compared, &found));
        if found.is_empty() {
            return Ok(());
        }
        let mut damaged: Vec<(String, String)> = Vec::new();
        for d in &found {
            if let replicas::Verdict::Damaged { servers, .. } = &d.verdict {
                for server in servers {
                    let copy = (d.region.clone(), server.clone());
                    if !damaged.contains(&copy) {
                        damaged.push(copy);
                    }
                }
            }
        }
        let undecided = found
            .iter()
            .filter(|d| matches!(d.verdict, replicas::Verdict::Undecided(_)))
            .count();
        if repair && !damaged.is_empty() {
            let MapSource::Etcd {
                endpoints,
                pool,
                credentials,
            } = self.source
            else {
                return Err(CliError::RepairNeedsEtcd);
            };
            let notes = cluster::mark_syncing(endpoints, pool, credentials.as_ref(), &damaged)?;
            for note in notes {
                text.push_str(&format!(
                    "repair: {note}; its owner device rewrites the blocks that differ from a \
                     serving copy\n"
                ));
            }
            if undecided == 0 {
                return Ok(());
            }
        }
        Err(CliError::CopiesDiffer {
            blocks: found.len(),
            undecided,
            repair,
        })
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        // `pmemctl read … | head`: the reader left; nothing to report.
        Err(CliError::Stdout(e)) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pmemctl: error: {}", e.message());
            ExitCode::from(e.exit_code())
        }
    }
}

fn run(cli: Cli) -> Result<(), CliError> {
    // Read the input before connecting, so a bad file fails fast.
    let payload = match &cli.command {
        Command::Pool(PoolCommand::Write { data, .. }) => Some(payload(data)?),
        _ => None,
    };
    let source = match cli.command {
        Command::Cluster(args) => {
            let text = cluster::run(args)?;
            return Output::Text(text)
                .write_to(&mut io::stdout().lock())
                .map_err(CliError::Stdout);
        }
        _ => match (&cli.config, &cli.etcd) {
            (Some(_), _) | (None, None) => {
                MapSource::File(cli.config.clone().ok_or(CliError::NoConfig)?)
            }
            (None, Some(endpoints)) => MapSource::from_flags(
                None,
                Some(endpoints.clone()),
                &cli.pool,
                cli.etcd_credentials.as_deref(),
            )?,
        },
    };
    let topology = match &source {
        MapSource::File(config) => Topology::load(config)?,
        MapSource::Etcd { .. } => source.load()?.0,
    };
    let secrets = cli
        .secrets
        .clone()
        .or_else(|| std::env::var_os(pmem_client::pool::SECRETS_ENV).map(PathBuf::from));
    let output = match cli.command {
        Command::RotateKey { region, operator } => {
            let timeout = Duration::from_millis(cli.connect_timeout_ms.unwrap_or(5_000));
            operator::rotate_key(
                &topology,
                &RegionId::new(region.as_str()),
                &operator,
                secrets.as_deref(),
                timeout,
            )?;
            Output::Text(format!("rotated the key of region {region}\n"))
        }
        // Answered before the topology is read.
        Command::Cluster(_) => return Ok(()),
        Command::Pool(PoolCommand::Scrub {
            replicas: true,
            region,
            operator,
            repair,
            ..
        }) => {
            let timeout = Duration::from_millis(cli.connect_timeout_ms.unwrap_or(5_000));
            let scrub = ReplicaScrub {
                topology: &topology,
                source: &source,
                operator: &operator,
                secrets: secrets.as_deref(),
                timeout,
            };
            let mut text = String::new();
            let done = scrub.run(&region, repair, &mut text);
            let mut stdout = io::stdout().lock();
            stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush())
                .map_err(CliError::Stdout)?;
            return done;
        }
        Command::Pool(PoolCommand::Scrub {
            checksums: true,
            region,
            operator,
            ..
        }) => {
            let timeout = Duration::from_millis(cli.connect_timeout_ms.unwrap_or(5_000));
            let regions: Vec<RegionId> = region.iter().map(|r| RegionId::new(r.as_str())).collect();
            let found = operator::scrub_checksums(
                &topology,
                &regions,
                &operator,
                secrets.as_deref(),
                timeout,
            )?;
            let mut stdout = io::stdout().lock();
            stdout
                .write_all(checksums::render(&found).as_bytes())
                .and_then(|()| stdout.flush())
                .map_err(CliError::Stdout)?;
            let damaged: Vec<_> = found.iter().filter(|r| !r.mismatches.is_empty()).collect();
            if !damaged.is_empty() {
                return Err(CliError::Damaged {
                    blocks: damaged.iter().map(|r| r.mismatches.len()).sum(),
                    regions: damaged.len(),
                });
            }
            return Ok(());
        }
        Command::Pool(command) => {
            let client = cli.client.clone().ok_or(CliError::NoClient)?;
            let clients: Vec<String> = topology.clients.iter().map(|c| c.id.to_string()).collect();
            let servers: Vec<(String, Option<String>)> = topology
                .servers
                .iter()
                .map(|s| (s.id.to_string(), s.admin.clone()))
                .collect();
            let mut builder = match source {
                MapSource::File(_) => Pool::builder(topology, client.as_str()),
                MapSource::Etcd {
                    endpoints,
                    pool,
                    credentials,
                } => {
                    let builder = AsyncPool::builder_on_etcd(endpoints, &pool, client.as_str());
                    match credentials {
                        Some(credentials) => builder.etcd_credentials(credentials),
                        None => builder,
                    }
                }
            };
            if let Some(ms) = cli.attempt_timeout_ms {
                builder = builder.attempt_timeout(Duration::from_millis(ms));
            }
            if let Some(ms) = cli.op_timeout_ms {
                builder = builder.op_timeout(Duration::from_millis(ms));
            }
            if let Some(dir) = &secrets {
                builder = builder.secrets(dir);
            }
            if let Some(ms) = cli.connect_timeout_ms {
                builder = builder.connect_timeout(Duration::from_millis(ms));
            }
            let pool = builder.connect()?;
            let ctl = Ctl {
                pool: &pool,
                client: &client,
                clients: &clients,
                servers: &servers,
            };
            on_pool(&ctl, command, payload)?
        }
    };
    let mut stdout = io::BufWriter::new(io::stdout().lock());
    output
        .write_to(&mut stdout)
        .and_then(|()| stdout.flush())
        .map_err(CliError::Stdout)
}

/// Runs a command that works on the pool as its client.
fn on_pool(
    ctl: &Ctl<'_>,
    command: PoolCommand,
    payload: Option<Vec<u8>>,
) -> Result<Output, CliError> {
    Ok(match command {
        PoolCommand::Read { addr, len, out } => ctl.read(addr, len, out)?,
        PoolCommand::Write {
            addr,
            persist,
            non_temporal,
            ..
        } => {
            let cache = match non_temporal {
                true => ServerCache::NonTemporal,
                false => ServerCache::Auto,
            };
            Output::Text(ctl.write(addr, &payload.unwrap_or_default(), persist, cache)?)
        }
        PoolCommand::Cas { addr, old, new } => Output::Text(ctl.cas(addr, old, new)?),
        PoolCommand::Faa { addr, delta } => Output::Text(ctl.faa(addr, delta)?),
        PoolCommand::Flush { addr, len } => Output::Text(ctl.flush(addr, len)?),
        PoolCommand::Map => Output::Text(ctl.map()),
        PoolCommand::Stat => Output::Text(ctl.stat()),
        PoolCommand::Format { force } => Output::Text(ctl.format(force)?),
        PoolCommand::Alloc {
            size,
            name,
            server,
            socket,
        } => Output::Text(ctl.alloc(size, name.as_deref(), &placement(server, socket))?),
        PoolCommand::Free { addr } => Output::Text(ctl.free(addr)?),
        PoolCommand::Open { name } => Output::Text(ctl.open(&name)?),
        PoolCommand::Rm { name } => Output::Text(ctl.remove(&name)?),
        PoolCommand::Ls => Output::Text(ctl.list()?),
        PoolCommand::Df => Output::Text(ctl.df()?),
        PoolCommand::Scrub { .. } => Output::Text(ctl.scrub()?),
    })
}

/// The placement `--server` and `--socket` ask for.
fn placement(server: Option<String>, socket: Option<String>) -> Placement {
    match (server, socket) {
        (Some(server), Some(socket)) => {
            Placement::Socket(ServerId::new(server), SocketId::new(socket))
        }
        (Some(server), None) => Placement::Server(ServerId::new(server)),
        (None, _) => Placement::RoundRobin,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_names_the_start_of_the_virtual_space() {
        assert_eq!(pmem_client::VIRT_BASE, 1 << 40, "the help says 1TiB");
        assert!(AFTER_HELP.contains(&format!("({:#x})", pmem_client::VIRT_BASE)));
        assert_eq!(num::parse_number("1TiB"), Ok(pmem_client::VIRT_BASE));
    }

    #[test]
    fn placement_follows_server_and_socket() {
        assert_eq!(placement(None, None), Placement::RoundRobin);
        assert_eq!(
            placement(Some("B".into()), None),
            Placement::Server(ServerId::new("B"))
        );
        assert_eq!(
            placement(Some("B".into()), Some("1".into())),
            Placement::Socket(ServerId::new("B"), SocketId::new("1"))
        );
    }

    #[test]
    fn socket_needs_a_server() {
        let args = ["pmemctl", "--config", "t.toml", "--client", "c1"];
        let parse = |more: &[&str]| Cli::try_parse_from(args.iter().chain(more));
        assert!(parse(&["alloc", "64", "--socket", "1"]).is_err());
        let cli = parse(&["alloc", "4KiB", "--server", "A", "--socket", "1"]).expect("parses");
        assert!(
            matches!(
                cli.command,
                Command::Pool(PoolCommand::Alloc { size: 4096, .. })
            ),
            "{cli:?}"
        );
    }

    #[test]
    fn usage_lines_name_the_client() {
        use clap::CommandFactory;
        let mut cli = Cli::command();
        for name in ["read", "write", "cas", "faa", "alloc", "df"] {
            let sub = cli.find_subcommand_mut(name).expect("a subcommand");
            let usage = sub.render_usage().to_string();
            assert!(usage.contains("--client ID"), "{name}: {usage}");
            assert!(usage.contains("--config TOPOLOGY"), "{name}: {usage}");
        }
    }

    #[test]
    fn command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
