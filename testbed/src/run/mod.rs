//! `testbed run`, `demo` and `chaos`: bring a fabric up, run one worker
//! process per client, inject the planned faults, then verify, report and
//! stop everything.
//!
//! - [`demo`]: `testbed demo`'s topology (one server's regions kept twice)
//!   and its faults (a device's death, then a server's).
//! - [`faults`]: the faults, the chaos scenarios and their seeded plan.
//! - [`freeze`]: the `freeze-server` fault: a server stopped past its
//!   lease, let go once its copies are out of service.
//! - [`copies_down`]: the faults that kill copies once every copy serves:
//!   a region's owner with its deciding copy's server, and a server after
//!   an earlier kill's copies were resynced.
//! - `worker`: the worker processes, started and watched.
//! - `contract`: what a run must hold, and the shared counters checked after it.
//! - `notes`: the report's notes (faults' effects, lab counters, first use).
//! - `outcome`: what a run produced, for the command's summary.
//! - [`replay`]: the command line that runs a run again.
//! - [`replica_copies`]: every serving copy of a replicated region compared.

mod contract;
pub mod copies_down;
pub mod demo;
pub mod faults;
pub mod freeze;
mod notes;
mod outcome;
pub mod replay;
pub mod replica_copies;
mod worker;

pub use contract::contract_violations;
pub use faults::{FaultKind, PlannedFault, Scenario, plan_faults};
pub use outcome::RunOutcome;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use topology::{Topology, VirtAddr};

use crate::fabric::etcd::Control;
use crate::fabric::launch::{Fabric, LaunchOptions, NetMode};
use crate::report::{FaultRecord, RunReport, Timeline, Verification, write_report};
use crate::workload::keys::{COUNTER_AREA, KeySpace};
use crate::workload::space;
use crate::workload::{CounterTally, WorkerResult, Workload};

use contract::{check_counters, counter_values};
use notes::{first_use_notes, lab_counters, lab_notes, note_fault_effects};
use worker::{WorkerProcess, spawn_worker};

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// `run`, `demo` or `chaos`, for the report.
    pub command: String,
    /// The workload.
    pub workload: Workload,
    /// Zipfian keys.
    pub zipfian: bool,
    /// How many of the topology's clients run a worker (all when `None`).
    pub clients: Option<usize>,
    /// How long the workload runs.
    pub duration: Duration,
    /// Value size in bytes.
    pub size: u64,
    /// Operations in flight per client.
    pub depth: usize,
    /// Keys per client.
    pub keys: u64,
    /// Seed of the workload.
    pub seed: u64,
    /// Loopback or netns.
    pub net: NetMode,
    /// The topology file given on the command line (`None`: the embedded
    /// one for `net`), for the replay command line.
    pub topology_file: Option<PathBuf>,
    /// The chaos scenario `faults` were drawn from, for the report.
    pub scenario: Option<Scenario>,
    /// Region files go here (when `None`, a folder inside the report,
    /// removed after a run that passed and kept after one that failed).
    pub data_dir: Option<PathBuf>,
    /// Reports go to `reports/<run-id>/`.
    pub reports: PathBuf,
    /// Faults to inject.
    pub faults: Vec<PlannedFault>,
    /// Where the daemons take their map from (file, or a real etcd).
    pub control: Control,
    /// Show a progress bar.
    pub progress: bool,
    /// Whether the workers' writes ask the servers to bypass their CPU
    /// cache.
    pub server_cache: pmem_client::ServerCache,
    /// `--replicas`: the copies of every region the run set in the
    /// topology's `[pool]`, for the replay command line.
    pub replicas: Option<u64>,
}

impl RunOptions {
    /// Options for `workload` with the testbed's defaults.
    pub fn new(command: &str, workload: Workload) -> Self {
        Self {
            command: command.to_owned(),
            workload,
            zipfian: false,
            clients: None,
            duration: Duration::from_secs(10),
            size: 256,
            depth: 8,
            keys: 4096,
            seed: 42,
            net: NetMode::Loopback,
            topology_file: None,
            scenario: None,
            data_dir: None,
            reports: PathBuf::from("reports"),
            faults: Vec::new(),
            control: Control::File,
            progress: true,
            server_cache: pmem_client::ServerCache::Auto,
            replicas: None,
        }
    }
}

/// Width of the timeline buckets: fine enough to time a failover.
const BUCKET_MS: u64 = 1;

/// A run id: UTC date and time, the command, and the process id.
pub fn run_id(command: &str) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}-{command}-{}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        std::process::id()
    )
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Runs a whole workload against a fresh fabric of `topology`. A run that
/// fails keeps its region files; one that stops with an error says where
/// its logs and region files are.
pub fn execute(
    topology: &Topology,
    topology_name: &str,
    options: &RunOptions,
) -> anyhow::Result<RunOutcome> {
    check_clients(topology, topology_name, options.clients)?;
    let run_id = run_id(&options.command);
    // Absolute: a lab guest sees this folder at the same path.
    let run_dir =
        std::path::absolute(options.reports.join(&run_id)).context("where the reports go")?;
    std::fs::create_dir_all(run_dir.join("workers"))
        .with_context(|| format!("create {}", run_dir.display()))?;
    let data_dir = match &options.data_dir {
        Some(dir) => dir.clone(),
        None => run_dir.join("data"),
    };
    execute_in(
        topology,
        topology_name,
        options,
        &run_id,
        &run_dir,
        &data_dir,
    )
    .with_context(|| {
        format!(
            "run {run_id} stopped; its logs are in {}, its region files in {}",
            run_dir.join("logs").display(),
            data_dir.display()
        )
    })
}

/// Refuses a `--clients` the topology cannot give: none, or more than it
/// has.
fn check_clients(
    topology: &Topology,
    topology_name: &str,
    wanted: Option<usize>,
) -> anyhow::Result<()> {
    let have = topology.clients.len();
    match wanted {
        Some(0) => bail!("--clients 0: a run needs at least one client"),
        Some(n) if n > have => {
            let ids: Vec<String> = topology.clients.iter().map(|c| c.id.to_string()).collect();
            bail!(
                "--clients {n}: {topology_name} has {have} client(s) ({}); ask for at most \
                 {have}, or add [[clients]] to the topology",
                ids.join(", ")
            )
        }
        _ => Ok(()),
    }
}

/// [`execute`] with the run's id and folders made.
fn execute_in(
    topology: &Topology,
    topology_name: &str,
    options: &RunOptions,
    run_id: &str,
    run_dir: &Path,
    data_dir: &Path,
) -> anyhow::Result<RunOutcome> {
    let mut launch = LaunchOptions::new(data_dir.to_path_buf(), run_dir.to_path_buf())?;
    // Fresh keys in the report's folder: every connection proves its key.
    launch.net = options.net;
    launch.control = options.control;
    launch.hold_back = options.faults.iter().find_map(|f| f.kind.held_back());
    let mut fabric = match Fabric::start(topology, launch) {
        Ok(fabric) => fabric,
        Err(err) => {
            return Err(crate::fabric::advice::start_error(
                err,
                crate::fabric::advice::Starter::Run,
                data_dir,
            ));
        }
    };
    let endpoints = fabric.endpoints();
    println!("{}", crate::fabric::summary::live_metrics(&endpoints));
    let clients: Vec<String> = topology
        .clients
        .iter()
        .take(options.clients.unwrap_or(usize::MAX))
        .map(|c| c.id.to_string())
        .collect();
    if clients.is_empty() {
        bail!("{topology_name}: no clients to run a workload");
    }
    // On an allocator pool the keys live in a named object made here, once.
    // The counters may hold what an earlier run on the same data left: the
    // check counts from what they hold now.
    let need = KeySpace::bytes_needed(clients.len(), options.size, options.keys);
    let (space, counters_before) = fabric
        .as_client(&clients[0], |pool| async move {
            let space = space::prepare(&pool, need).await?;
            let before = pool
                .read(VirtAddr(space.base), COUNTER_AREA)
                .await
                .map_err(|e| format!("read the counters: {}", pmem_client::error_chain(&e)))?;
            Ok((space, counter_values(&before)))
        })
        .map_err(|why| anyhow::anyhow!("{topology_name}: where the keys live: {why}"))?;
    if options.workload == Workload::Register {
        let dir = run_dir.join("workers");
        crate::workload::register::setup_on(&fabric, &clients[0], space, options.keys, &dir)
            .map_err(|why| anyhow::anyhow!("{topology_name}: the hot words: {why}"))?;
    }

    let started_unix_ms = unix_ms();
    let start = Instant::now();
    let mut workers = Vec::new();
    for (index, client) in clients.iter().enumerate() {
        workers.push(spawn_worker(
            &fabric,
            run_dir,
            options,
            client,
            index,
            clients.len(),
            started_unix_ms,
        )?);
    }
    let mut epochs = crate::fabric::epochs::EpochSampler::new();
    let driven = drive(&mut fabric, &mut workers, options, start, &mut epochs);
    let (faults, fault_notes) = match driven {
        Ok(driven) => driven,
        Err(e) => {
            // A run stopped by a fault: its workers (held open, perhaps)
            // would go on against a fabric about to stop.
            for worker in &mut workers {
                let _ = worker.child.kill();
                let _ = worker.child.wait();
            }
            return Err(e);
        }
    };
    let duration_s = start.elapsed().as_secs_f64();

    let mut report = RunReport {
        run_id: run_id.to_owned(),
        command: options.command.clone(),
        topology: topology_name.to_owned(),
        workload: options.workload.name().to_owned(),
        clients: clients.clone(),
        started_unix_ms,
        duration_s,
        ops: BTreeMap::new(),
        timeline: Timeline::new(BUCKET_MS),
        faults,
        verification: Verification::default(),
        notes: Vec::new(),
        roce: None,
        parameters: replay::parameters(options),
        replay: replay::command_line(&replay::program_name(), options),
        data_dir: data_dir.display().to_string(),
        data_kept: true,
        map_epochs: epochs.finish(),
        linearizability: None,
        replicas: None,
    };
    report.notes.extend(fault_notes);
    report.notes.extend(first_use_notes(&fabric, &workers));
    let (counters, mut verification) = collect(&mut workers, run_dir, &mut report)?;
    check_counters(
        &fabric,
        &clients[0],
        (space.base, &counters_before),
        &counters,
        &mut verification,
    );
    verification.passed = verification.is_clean();
    report.verification = verification;
    if options.workload == Workload::Register {
        report.linearizability = Some(crate::linearizability::check_run(
            &run_dir.join("workers"),
            crate::linearizability::DEFAULT_BUDGET,
        ));
    }
    note_fault_effects(&mut report, duration_s);
    if fabric.is_lab() {
        let roce = lab_counters(&fabric, &clients);
        report.notes.extend(lab_notes(&roce));
        report.roce = Some(roce);
    }

    // Which copies serve, as the map says at the end (on a file: all).
    let records = match fabric.etcd_mut() {
        Some(etcd) if topology.is_replicated() => match etcd.replica_sets() {
            Ok(records) => {
                report.notes.push(replica_copies::owners_note(&records));
                Some(records)
            }
            Err(e) => {
                report.notes.push(format!(
                    "the copies' states could not be read from etcd ({e}); every copy is \
                     compared"
                ));
                None
            }
        },
        _ => None,
    };
    let unclean_exits: Vec<String> = fabric
        .stop()
        .into_iter()
        .filter(|(_, _, status)| !status.is_some_and(|s| s.success()))
        .map(|(kind, id, status)| format!("{} {id}: {status:?}", kind.program()))
        .collect();
    for line in &unclean_exits {
        report.notes.push(format!("did not stop cleanly: {line}"));
    }
    // The daemons have stopped: the region files hold what they wrote.
    if topology.is_replicated() {
        let missed = servers_that_missed_writes(options, &report.faults);
        if !missed.is_empty() {
            report.notes.push(format!(
                "the copies on server {} are not compared: on a topology file nothing records \
                 that they missed writes while their server was down or frozen; their owners \
                 stopped using them, and nothing brings them up to date yet (resync)",
                missed.join(", ")
            ));
        }
        let serving = |region: &str, server: &str| {
            !missed.iter().any(|m| m == server)
                && records.as_ref().is_none_or(|records| {
                    records
                        .iter()
                        .find(|r| r.region == region)
                        .and_then(|r| r.state_on(server))
                        .is_none_or(|state| state == control::ReplicaState::Serving)
                })
        };
        report.replicas = Some(crate::run::replica_copies::compare_copies(
            topology, data_dir, &serving,
        ));
    }
    let violations = contract_violations(&report);
    for line in &violations {
        report.notes.push(format!("contract violated: {line}"));
    }
    // A failed run keeps its region files to be looked at.
    let failed = !violations.is_empty() || !unclean_exits.is_empty();
    if options.data_dir.is_none() && !failed {
        report.data_kept = std::fs::remove_dir_all(data_dir).is_err();
    }
    let files = write_report(run_dir, &report).context("write the report")?;
    Ok(RunOutcome {
        report,
        files,
        endpoints,
        unclean_exits,
    })
}

/// On a topology file, the servers a run killed or froze: their copies
/// missed writes (their owners stopped using them when a link broke or a
/// request went unanswered) and no map says so. None on etcd, whose map
/// records which copies serve.
fn servers_that_missed_writes(options: &RunOptions, faults: &[FaultRecord]) -> Vec<String> {
    if options.control != Control::File {
        return Vec::new();
    }
    let mut servers: Vec<String> = faults
        .iter()
        .filter(|f| {
            matches!(
                FaultKind::from_name(&f.kind),
                Some(FaultKind::KillServer | FaultKind::FreezeServer)
            )
        })
        .map(|f| f.target.clone())
        .collect();
    servers.sort();
    servers.dedup();
    servers
}

/// Runs the workers to their end while injecting the planned faults at
/// their times into the workload (counted from when every worker's workload
/// began) and undoing each after its restore delay (undoing what is due
/// before injecting: a fault may wait for an earlier one's target to be
/// back); shows progress. Returns what was injected, and when (counted
/// from `start`, like the timeline), and the faults' notes. On etcd,
/// `epochs` samples every daemon's map epoch meanwhile.
fn drive(
    fabric: &mut Fabric,
    workers: &mut [WorkerProcess],
    options: &RunOptions,
    start: Instant,
    epochs: &mut crate::fabric::epochs::EpochSampler,
) -> anyhow::Result<(Vec<FaultRecord>, Vec<String>)> {
    let bar = progress_bar(options);
    let mut faults: Vec<FaultRecord> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    let mut pending: Vec<&PlannedFault> = options.faults.iter().collect();
    let mut restores: Vec<(Instant, usize)> = Vec::new();
    let limit = options.duration + Duration::from_secs(120) + crate::workload::VERIFY_PATIENCE;
    // When every worker's workload began (a lab guest boots first).
    let mut began: Option<Duration> = None;
    loop {
        if options.control != Control::File {
            epochs.sample(fabric, start);
            for worker in workers.iter() {
                let epoch = worker.epoch.load(Ordering::Relaxed);
                if epoch > 0 {
                    epochs.note(&format!("worker {}", worker.client), epoch, start);
                }
            }
        }
        let elapsed = start.elapsed();
        if began.is_none() && workers.iter_mut().all(WorkerProcess::started_or_ended) {
            began = Some(elapsed);
        }
        let ops: u64 = workers.iter().map(|w| w.ops.load(Ordering::Relaxed)).sum();
        let errors: u64 = workers
            .iter()
            .map(|w| w.errors.load(Ordering::Relaxed))
            .sum();
        bar.set_position(elapsed.as_millis().min(options.duration.as_millis()) as u64);
        bar.set_message(format!(
            "{:>9.0} ops/s  {ops} ops  {errors} errors",
            ops as f64 / elapsed.as_secs_f64().max(0.001)
        ));
        while let Some(i) = restores
            .iter()
            .position(|(when, _)| *when <= Instant::now())
        {
            let (_, record) = restores.remove(i);
            let fault = &mut faults[record];
            if let Some(kind) = FaultKind::from_name(&fault.kind) {
                kind.restore(fabric, &fault.target)
                    .with_context(|| format!("undo {} {}", fault.kind, fault.target))?;
            }
            fault.restored_at_s = Some(start.elapsed().as_secs_f64());
            let done = match FaultKind::from_name(&fault.kind) {
                Some(kind) if kind.changes_membership() => "settled",
                _ => "restarted",
            };
            bar.println(format!(
                "  {:>6.2}s  {done} {}",
                start.elapsed().as_secs_f64(),
                fault.target
            ));
        }
        while let Some(i) = pending
            .iter()
            .position(|f| began.is_some_and(|began| began + f.at <= elapsed))
        {
            let fault = pending.remove(i);
            let injected = fault
                .kind
                .inject(fabric, &fault.target)
                .with_context(|| format!("{} {}", fault.kind.name(), fault.target))?;
            let (at, target) = (injected.at, injected.target);
            notes.extend(injected.note);
            if workers
                .iter_mut()
                .all(|w| matches!(w.child.try_wait(), Ok(Some(_))))
            {
                notes.push(format!(
                    "{} {target} came after the workload had ended: the application saw \
                     nothing of it (run longer: --duration)",
                    fault.kind.name()
                ));
            }
            bar.println(format!(
                "  {:>6.2}s  {} {target}",
                at.duration_since(start).as_secs_f64(),
                fault.kind.name(),
            ));
            restores.push((at + fault.restore_after, faults.len()));
            faults.push(FaultRecord {
                at_s: at.duration_since(start).as_secs_f64(),
                kind: fault.kind.name().to_owned(),
                target,
                restored_at_s: None,
                recovery_ms: None,
                stall_ms: None,
                errors_seen: 0,
            });
        }
        if pending.is_empty() && restores.is_empty() {
            // Workers held open for a fault that waits for the map end
            // their workload now (at their deadline if it is still ahead).
            for worker in workers.iter_mut() {
                worker.stdin.take();
            }
        }
        let all_done = workers
            .iter_mut()
            .all(|w| matches!(w.child.try_wait(), Ok(Some(_))));
        if all_done && pending.is_empty() && restores.is_empty() {
            break;
        }
        if elapsed > limit {
            bar.abandon();
            for w in workers.iter_mut() {
                let _ = w.child.kill();
            }
            bail!("workers did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if options.control != Control::File {
        epochs.sample_now(fabric, start);
    }
    bar.finish_and_clear();
    Ok((faults, notes))
}

/// Waits for every worker and merges its result into `report`: operation
/// statistics, the timeline, the counters' tallies and what its
/// verification found (a worker that left no result is a mismatch).
fn collect(
    workers: &mut [WorkerProcess],
    run_dir: &Path,
    report: &mut RunReport,
) -> anyhow::Result<(BTreeMap<u64, CounterTally>, Verification)> {
    let mut counters: BTreeMap<u64, CounterTally> = BTreeMap::new();
    let mut verification = Verification::default();
    for worker in workers.iter_mut() {
        let status = worker.child.wait().context("wait for a worker")?;
        let text = std::fs::read_to_string(&worker.out);
        let result: WorkerResult = match text.map(|t| serde_json::from_str(&t)) {
            Ok(Ok(result)) => result,
            _ => {
                verification.push_mismatch(format!(
                    "worker {} ({status}) left no result; see {}",
                    worker.client,
                    run_dir
                        .join("logs")
                        .join(format!("worker-{}.log", worker.client))
                        .display()
                ));
                continue;
            }
        };
        report.merge_ops(&result.ops);
        report.timeline.merge(&result.timeline);
        for (w, tally) in &result.counters {
            let total = counters.entry(*w).or_default();
            total.acked += tally.acked;
            total.uncertain += tally.uncertain;
        }
        verification.merge(&result.verification, &format!("{}: ", result.client));
    }
    Ok((counters, verification))
}

fn progress_bar(options: &RunOptions) -> ProgressBar {
    if !options.progress {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(options.duration.as_millis() as u64);
    let style = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report_with(verification: Verification) -> RunReport {
        RunReport {
            verification,
            ..RunReport::default()
        }
    }

    #[test]
    fn a_read_during_the_run_is_not_reported_as_lost_acknowledged_data() {
        let mut v = Verification::default();
        v.push_during_run("c1: read of key 905 during the run saw bytes no write of it produced");
        let violations = contract_violations(&report_with(v));
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(
            violations[0].starts_with("during the run, 1 check "),
            "{violations:?}"
        );
        assert!(!violations[0].contains("acknowledged"), "{violations:?}");
    }

    #[test]
    fn an_etcd_fault_the_application_saw_breaks_the_contract_a_server_fault_does_not() {
        let fault = |kind: &str, errors_seen| FaultRecord {
            at_s: 1.0,
            kind: kind.to_owned(),
            target: "etcd".to_owned(),
            restored_at_s: Some(2.0),
            recovery_ms: None,
            stall_ms: None,
            errors_seen,
        };
        let report = RunReport {
            faults: vec![
                fault("kill-etcd", 3),
                fault("kill-etcd-leader", 0),
                fault("kill-server", 5),
            ],
            verification: Verification {
                passed: true,
                ..Verification::default()
            },
            ..RunReport::default()
        };
        assert_eq!(
            contract_violations(&report),
            [
                "kill-etcd etcd at 1.00 s: the application saw 3 errors although only the control \
              plane was down"
            ]
        );
    }

    #[test]
    fn etcd_scenarios_need_etcd_and_the_leader_one_three_members() {
        let etcd = |members| Control::Etcd { members };
        assert!(Scenario::KillEtcd.check_control(Control::File).is_err());
        assert!(Scenario::KillEtcd.check_control(etcd(1)).is_ok());
        let err = Scenario::KillEtcdLeader
            .check_control(etcd(1))
            .expect_err("one member");
        assert!(err.contains("--etcd-members 3"), "{err}");
        assert!(Scenario::KillEtcdLeader.check_control(etcd(3)).is_ok());
        assert!(Scenario::KillServer.check_control(Control::File).is_ok());
        assert_eq!("kill-etcd-leader".parse(), Ok(Scenario::KillEtcdLeader));
    }

    #[test]
    fn a_mismatch_at_the_end_is_reported_as_acknowledged_data() {
        let mut v = Verification::default();
        v.push_mismatch("c1: key 3: acknowledged version 2 but found Version(1)");
        v.push_mismatch("c1: key 4: acknowledged version 2 but found Garbage");
        let violations = contract_violations(&report_with(v));
        assert_eq!(
            violations,
            [
                "the final verification found 2 problems with acknowledged data (missing, wrong \
              or not checked)"
            ]
        );
        let clean = Verification {
            passed: true,
            reads_overlapped: 5,
            reads_torn_by_overlap: 5,
            ..Verification::default()
        };
        assert!(contract_violations(&report_with(clean)).is_empty());
    }
}
