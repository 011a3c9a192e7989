//! The run's worker processes: one `testbed worker` per client, started
//! with its map source and watched through what it prints.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::Context;

use crate::fabric::launch::Fabric;
use crate::workload::STARTED_LINE;

use super::{BUCKET_MS, RunOptions};

/// One worker process and its live counters.
pub(super) struct WorkerProcess {
    pub(super) client: String,
    pub(super) child: Child,
    /// Its standard input when it is held open (`--held-open`): closed
    /// once the run's faults are done, which ends its workload.
    pub(super) stdin: Option<ChildStdin>,
    pub(super) out: PathBuf,
    pub(super) ops: Arc<AtomicU64>,
    pub(super) errors: Arc<AtomicU64>,
    /// The worker printed [`STARTED_LINE`].
    pub(super) started: Arc<AtomicBool>,
    /// The map epoch its pool runs, as it last said (0: a file, or not
    /// said yet).
    pub(super) epoch: Arc<AtomicU64>,
    /// When it first had a request served by a region a new epoch brought
    /// (Unix milliseconds; 0: not yet).
    pub(super) first_use: Arc<AtomicU64>,
}

impl WorkerProcess {
    /// Its workload began, or it ended (and never will begin).
    pub(super) fn started_or_ended(&mut self) -> bool {
        self.started.load(Ordering::Relaxed) || matches!(self.child.try_wait(), Ok(Some(_)))
    }
}

/// Where worker `client` takes its map from: on `--control etcd` the
/// pool in etcd, as the client's own etcd user on endpoints it reaches
/// (with `--net netns`, over its management link), so it follows the map
/// as a real client does (`add-server`, `add-device`, `remove-device`);
/// otherwise the topology file of the run.
fn worker_map_source(fabric: &Fabric, client: &str) -> Vec<std::ffi::OsString> {
    match fabric.etcd() {
        Some(etcd) => etcd.client_args(client),
        None => vec!["--config".into(), fabric.topology_path.clone().into()],
    }
}

/// Starts `testbed worker` for `client`.
pub(super) fn spawn_worker(
    fabric: &Fabric,
    run_dir: &Path,
    options: &RunOptions,
    client: &str,
    index: usize,
    clients: usize,
    start_unix_ms: u64,
) -> anyhow::Result<WorkerProcess> {
    let program = std::env::current_exe().context("find the testbed executable")?;
    let out = run_dir.join("workers").join(format!("{client}.json"));
    let log = run_dir.join("logs").join(format!("worker-{client}.log"));
    let log_file =
        std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
    let mut command = fabric.client_command(client, &program, &[run_dir]);
    // The command line alone says where the map comes from.
    command
        .env_remove(pmem_client::pool::ETCD_ENV)
        .env_remove(control::CREDENTIALS_ENV)
        .arg("worker")
        .args(worker_map_source(fabric, client))
        .args([
            "--client",
            client,
            "--index",
            &index.to_string(),
            "--clients",
            &clients.to_string(),
        ])
        .args(["--workload", options.workload.name()])
        .args(["--server-cache", options.server_cache.name()])
        .args(["--duration-ms", &options.duration.as_millis().to_string()])
        .args([
            "--size",
            &options.size.to_string(),
            "--depth",
            &options.depth.to_string(),
        ])
        .args([
            "--keys",
            &options.keys.to_string(),
            "--seed",
            &(options.seed + index as u64).to_string(),
        ])
        .args([
            "--start-unix-ms",
            &start_unix_ms.to_string(),
            "--bucket-ms",
            &BUCKET_MS.to_string(),
        ])
        .arg("--out")
        .arg(&out);
    if options.zipfian {
        command.arg("--zipfian");
    }
    let held_open = options.faults.iter().any(|f| f.kind.waits_for_the_map());
    if held_open {
        command.arg("--held-open");
    }
    // A data directory given by the user may hold an earlier run's keys.
    if options.data_dir.is_some() {
        command.arg("--clear");
    }
    let mut child = command
        .stdin(if held_open {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log_file))
        .spawn()
        .context("start a worker")?;
    let (ops, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let started = Arc::new(AtomicBool::new(false));
    let (epoch, first_use) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    if let Some(stdout) = child.stdout.take() {
        let (ops, errors, started) = (Arc::clone(&ops), Arc::clone(&errors), Arc::clone(&started));
        let (epoch, first_use) = (Arc::clone(&epoch), Arc::clone(&first_use));
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.trim() == STARTED_LINE {
                    started.store(true, Ordering::Relaxed);
                }
                for field in line.split_whitespace() {
                    let (counter, n) = match field.split_once('=') {
                        Some(("ops", n)) => (&ops, n),
                        Some(("errors", n)) => (&errors, n),
                        Some(("epoch", n)) => (&epoch, n),
                        // The first new region served is the one measured.
                        Some(("first_use_unix_ms", n)) => {
                            let at = n.parse().unwrap_or(0);
                            let _ = first_use.compare_exchange(
                                0,
                                at,
                                Ordering::Relaxed,
                                Ordering::Relaxed,
                            );
                            continue;
                        }
                        _ => continue,
                    };
                    counter.store(n.parse().unwrap_or(0), Ordering::Relaxed);
                }
            }
        });
    }
    let stdin = child.stdin.take();
    Ok(WorkerProcess {
        client: client.to_owned(),
        child,
        stdin,
        out,
        ops,
        errors,
        started,
        epoch,
        first_use,
    })
}
