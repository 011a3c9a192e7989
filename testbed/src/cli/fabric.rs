//! The commands that bring a fabric up or look at one: `validate`, `up`,
//! `restart`, `status`, `keygen`, `down` and `map-follow`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use topology::Layout;

use super::args::*;
use super::print_chain;
use crate::fabric::advice::Starter;
use crate::fabric::launch::{DaemonKind, Fabric, LaunchOptions};
use crate::fabric::prometheus::{PrometheusServer, ScrapeTarget};
use crate::fabric::summary;
use crate::fabric::supervise::{Supervisor, control};
use crate::{load_topology, load_topology_on};

/// `testbed validate`: success when the topology is valid (and usable on
/// the hosts named).
pub fn validate(file: Option<&PathBuf>, hosts: &[String]) -> ExitCode {
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
#[derive(Debug)]
pub struct UpArgs {
    /// The topology file; the embedded default topology when absent.
    pub file: Option<PathBuf>,
    /// How hosts are networked.
    pub net: Net,
    /// Region files go to `data_dir/<server>`.
    pub data_dir: PathBuf,
    /// Also start a Prometheus server scraping every daemon.
    pub prometheus: bool,
    /// Start every pmem-server with its regions recreated empty.
    pub format: bool,
    /// Where the daemons take their map from.
    pub map_from: crate::fabric::etcd::ControlArgs,
}

/// `testbed up`: the fabric up until Ctrl-C or SIGTERM, then stopped.
pub fn up(args: UpArgs) -> anyhow::Result<()> {
    let UpArgs {
        file,
        net,
        data_dir,
        prometheus,
        format,
        map_from,
    } = args;
    let topology = load_topology_on(file.as_deref(), net.into())?;
    let run_dir = PathBuf::from("reports").join(crate::run::run_id("up"));
    let mut options = LaunchOptions::new(data_dir.clone(), run_dir)?;
    options.net = net.into();
    options.format = format;
    options.control = map_from.control().map_err(anyhow::Error::msg)?;
    let signals = signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM]);
    let signals = signals.context("install signal handlers")?;
    let run_dir = options.run_dir.clone();
    let fabric = match Fabric::start(&topology, options) {
        Ok(fabric) => fabric,
        Err(err) => {
            return Err(crate::fabric::advice::start_error(
                err,
                Starter::Up,
                &data_dir,
            ));
        }
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
                    crate::fabric::supervise::exit::describe(status)
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
pub fn pmemctl_lines(fabric: &Fabric) -> anyhow::Result<String> {
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
    Ok(crate::fabric::supervise::pmemctl::lines(
        &crate::fabric::supervise::pmemctl::PmemctlTarget {
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
pub fn control(request: &str, args: ControlArgs) -> anyhow::Result<bool> {
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

/// `testbed keygen`.
pub fn keygen(file: Option<&std::path::Path>, secrets: &std::path::Path) -> anyhow::Result<bool> {
    let topology = load_topology(file)?;
    let written = crate::fabric::keys::generate(&topology, secrets)?;
    println!("{} keys written to {}", written.len(), secrets.display());
    Ok(true)
}

/// `testbed down`.
pub fn down(prefix: Option<&str>) -> ExitCode {
    match crate::fabric::netns::clean_up_crashed_runs(prefix) {
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

/// `testbed map-follow`.
pub fn map_follow(
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
    let run_dir = std::path::absolute(reports.join(crate::run::run_id("map-follow")))?;
    let plan = crate::fabric::map_follow::FollowPlan {
        net: net.into(),
        members,
        changes,
        run_dir: run_dir.clone(),
    };
    let report = crate::fabric::map_follow::measure(&topology, &plan)?;
    print!("{}", report.text());
    std::fs::write(run_dir.join("map_follow.txt"), report.text())
        .with_context(|| format!("write {}", run_dir.display()))?;
    let _ = std::fs::remove_dir_all(run_dir.join("data"));
    println!("logs: {}", run_dir.display());
    Ok(true)
}
