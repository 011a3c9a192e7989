//! The commands that run workloads: `run`, `chaos`, `demo` and
//! `check-linearizable`.

use std::path::PathBuf;
use std::time::Duration;

use super::args::*;
use crate::fabric::launch::NetMode;
use crate::load_topology_on;
use crate::run::RunOptions;
use crate::workload::Workload;

/// `testbed run`.
pub fn run_command(args: RunArgs) -> anyhow::Result<bool> {
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
pub fn chaos(args: ChaosArgs) -> anyhow::Result<bool> {
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
        topology = crate::with_replicas(topology, copies)?;
    }
    options.net = net.into();
    options.control = control.control().map_err(anyhow::Error::msg)?;
    scenario
        .check_control(options.control)
        .map_err(anyhow::Error::msg)?;
    scenario
        .check_topology(&topology)
        .map_err(anyhow::Error::msg)?;
    options.topology_file = file;
    options.scenario = Some(scenario);
    options.reports = reports;
    options.faults = crate::run::plan_faults(
        &topology,
        options.net,
        scenario,
        options.duration,
        faults,
        seed,
    );
    run_on(&options, &topology)
}

/// A run of `options` on `file` (the embedded topology when absent): true
/// when the contract held and every process exited cleanly.
pub fn run(options: &RunOptions, file: Option<&PathBuf>) -> anyhow::Result<bool> {
    let mut topology = load_topology_on(file.map(PathBuf::as_path), options.net)?;
    if let Some(copies) = options.replicas {
        topology = crate::with_replicas(topology, copies)?;
    }
    run_on(options, &topology)
}

/// [`run`](fn@run) on a loaded `topology`.
pub fn run_on(options: &RunOptions, topology: &topology::Topology) -> anyhow::Result<bool> {
    if options.workload == Workload::Register && matches!(options.net, NetMode::Lab) {
        anyhow::bail!(
            "--workload register orders operations by a clock every client shares, which lab \
             guests do not; run it with --net loopback or --net netns"
        );
    }
    let outcome = crate::run::execute(topology, &topology.source, options)?;
    print!("{}", outcome.summary());
    let violations = crate::run::contract_violations(&outcome.report);
    for line in &violations {
        println!("  CONTRACT VIOLATED: {line}");
    }
    Ok(violations.is_empty() && outcome.unclean_exits.is_empty())
}

/// `testbed demo`.
pub fn demo(duration: f64, reports: PathBuf) -> anyhow::Result<bool> {
    let mut options = RunOptions::new("demo", Workload::Mixed);
    options.duration = Duration::from_secs_f64(duration);
    options.reports = reports;
    options.faults = crate::run::demo::faults(options.duration);
    let topology = crate::run::demo::topology()?;
    println!(
        "pmem-fabric demo: default topology (2 PMEM servers, 2 fabric devices, 2 clients x 2 \
         RNICs) with server B's regions kept twice (on B and A), mixed workload for \
         {duration:.0} s; fabric device B killed at 30% and PMEM server B at 65%, each \
         restarted"
    );
    run_on(&options, &topology)
}

/// `testbed check-linearizable`: true when every word's history is
/// linearizable.
pub fn check_linearizable(dir: &std::path::Path, budget: Duration) -> anyhow::Result<bool> {
    let entries = crate::linearizability::history::read_dir(dir)?;
    let report = crate::linearizability::check(&entries, budget)?;
    println!("linearizability: {}", report.summary());
    for line in &report.failure {
        println!("  {line}");
    }
    Ok(report.passed)
}
