//! The `freeze-server` fault: a pmem-server stopped with SIGSTOP (alive,
//! its connections open, answering nothing) and let go with SIGCONT once
//! it is past its liveness lease and, on etcd, once the map has taken a
//! copy it holds out of service. What the thawed server then answers
//! belongs to requests its fabric devices gave up on.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use control::ReplicaState;

use crate::fabric::launch::{DaemonKind, Fabric};

/// How long a server stays frozen at least: past its liveness lease in
/// etcd, so the fault is the one a frozen machine makes.
pub fn least_freeze() -> Duration {
    Duration::from_secs(control::registration::LEASE_TTL_SECS.unsigned_abs() + 1)
}

/// How long the thaw waits for the map to take the frozen server's
/// copies out of service before it gives up.
const OFFLINE_PATIENCE: Duration = Duration::from_secs(30);

/// Stops `server` with SIGSTOP; returns when.
pub fn freeze(fabric: &mut Fabric, server: &str) -> anyhow::Result<Instant> {
    fabric
        .signal(DaemonKind::PmemServer, server, libc::SIGSTOP)
        .with_context(|| format!("SIGSTOP to pmem-server {server}"))
}

/// Lets `server` go on with SIGCONT, once (on etcd) the map has taken a
/// copy it holds out of service: a device saw a request to it go
/// unanswered and marked it offline, so what the server answers from
/// before counts nowhere. Copies no request reached while it was frozen
/// missed nothing and stay as they are.
pub fn thaw(fabric: &mut Fabric, server: &str) -> anyhow::Result<()> {
    let waited = await_a_copy_out_of_service(fabric, server);
    fabric
        .signal(DaemonKind::PmemServer, server, libc::SIGCONT)
        .with_context(|| format!("SIGCONT to pmem-server {server}"))?;
    waited
}

/// Waits until the map in etcd has a copy on `server` that is not
/// serving; at once without etcd, or when the server holds no copy of a
/// replicated region.
fn await_a_copy_out_of_service(fabric: &Fabric, server: &str) -> anyhow::Result<()> {
    let Some(etcd) = fabric.etcd() else {
        return Ok(());
    };
    let since = Instant::now();
    loop {
        let states: Vec<ReplicaState> = etcd
            .replica_sets()
            .context("read the replica sets in etcd")?
            .iter()
            .filter_map(|set| set.state_on(server))
            .collect();
        if states.iter().any(|&s| s != ReplicaState::Serving) || states.is_empty() {
            return Ok(());
        }
        if since.elapsed() > OFFLINE_PATIENCE {
            bail!(
                "pmem-server {server} was frozen and after {}s more the map in etcd still has \
                 every copy it holds serving: no fabric device marked one offline (did the \
                 workload reach its regions? see the devices' logs)",
                OFFLINE_PATIENCE.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
