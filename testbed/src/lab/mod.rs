//! The RDMA lab: clients that run inside QEMU guests whose stock Linux
//! kernel provides the RDMA stack (Soft-RoCE, `rdma_rxe`) and whose stock
//! rdma-core provides the verbs library, while the pmem-servers and fabric
//! devices run on this host.
//!
//! The shell scripts in the repository's `lab/` folder do the parts that are
//! plain system administration: `image.sh` builds the guest image from
//! Debian packages, `net.sh` makes the lab's network namespace (a bridge,
//! `vh0` with the control address 10.77.0.100, `vh1`/`vh2` for the fabric
//! devices' RoCEv2 ports) and `guest.sh` boots one guest on the bridge,
//! runs one command in it with host folders shared at the same paths, and
//! exits with the command's status.
//!
//! [`LabNet::enter`] brings the namespace up and moves the calling thread
//! into it, so the daemons, the host-side checks and the guests' QEMU
//! processes started from that thread afterwards all live in the lab.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::netns;

/// The lab's network namespace.
pub const NAMESPACE: &str = "pmemlab";

/// Why the lab could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A lab script could not be started.
    #[error("cannot run {script}")]
    Spawn {
        /// The script.
        script: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A lab script failed.
    #[error("{script} {args} failed ({status}):\n{output}")]
    Script {
        /// The script.
        script: PathBuf,
        /// Its arguments.
        args: String,
        /// How it ended.
        status: std::process::ExitStatus,
        /// The end of what it printed.
        output: String,
    },
    /// The calling thread could not enter the namespace.
    #[error("cannot enter the lab's network namespace")]
    Enter(#[source] netns::NetnsError),
    /// The lab needs root.
    #[error("the lab needs root (network namespaces, QEMU taps)")]
    NotRoot(#[source] netns::NetnsError),
}

/// The folder with the lab's scripts: `$PMEM_LAB_SCRIPTS`, or `lab/` of the
/// source tree this testbed was built from.
pub fn scripts_dir() -> PathBuf {
    std::env::var_os("PMEM_LAB_SCRIPTS").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../lab"),
        PathBuf::from,
    )
}

/// Runs lab script `name` with `args` and waits for it; its output goes to
/// the error on failure.
pub fn run_script(name: &str, args: &[&str]) -> Result<(), LabError> {
    let script = scripts_dir().join(name);
    let out = Command::new("bash")
        .arg(&script)
        .args(args)
        .env("PMEM_LAB_NS", NAMESPACE)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| LabError::Spawn {
            script: script.clone(),
            source,
        })?;
    if out.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = text.lines().collect();
    Err(LabError::Script {
        script,
        args: args.join(" "),
        status: out.status,
        output: lines[lines.len().saturating_sub(30)..].join("\n"),
    })
}

/// The lab's network, up; removed again when dropped.
#[derive(Debug)]
pub struct LabNet {
    up: bool,
    /// The namespace the thread came from, to go back to before teardown
    /// (the teardown stops every process whose main thread is in the lab).
    home: Option<std::fs::File>,
}

impl LabNet {
    /// Builds the guest image if needed, brings the lab's namespace up and
    /// moves the calling thread into it.
    pub fn enter() -> Result<LabNet, LabError> {
        netns::require_root().map_err(LabError::NotRoot)?;
        run_script("image.sh", &[])?;
        let home = std::fs::File::open("/proc/thread-self/ns/net").ok();
        run_script("net.sh", &["up"])?;
        let lab = LabNet { up: true, home };
        netns::enter(NAMESPACE).map_err(LabError::Enter)?;
        Ok(lab)
    }

    /// A command that boots a guest and runs `program` in it (add the
    /// program's arguments to the result). `shares` are host folders the
    /// guest sees at the same paths: the program's folder is always one.
    /// The guest's console is the command's stdout, and is copied to `console`.
    pub fn guest_command(&self, program: &Path, shares: &[&Path], console: &Path) -> Command {
        self.guest_command_with(program, shares, console, None, &[])
    }

    /// [`guest_command`](Self::guest_command) with variables set for the
    /// program inside the guest (it does not inherit this process's
    /// environment).
    pub fn guest_command_with_env(
        &self,
        program: &Path,
        shares: &[&Path],
        console: &Path,
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Command {
        self.guest_command_with(program, shares, console, None, env)
    }

    /// [`guest_command`](Self::guest_command) for a guest with `storage`
    /// besides its initramfs.
    pub fn guest_with_storage(
        &self,
        program: &Path,
        shares: &[&Path],
        console: &Path,
        storage: &GuestStorage<'_>,
    ) -> Command {
        self.guest_command_with(program, shares, console, Some(storage), &[])
    }

    fn guest_command_with(
        &self,
        program: &Path,
        shares: &[&Path],
        console: &Path,
        storage: Option<&GuestStorage<'_>>,
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Command {
        let mut command = Command::new("bash");
        command
            .arg(scripts_dir().join("guest.sh"))
            .env("PMEM_LAB_NS", NAMESPACE)
            .arg("--log")
            .arg(console);
        if let Some(folder) = program.parent() {
            command.arg("--share").arg(folder);
        }
        for share in shares {
            command.arg("--share").arg(share);
        }
        if let Some(storage) = storage {
            if let Some(disk) = storage.disk {
                command.arg("--disk").arg(disk);
            }
            for nvdimm in storage.nvdimms {
                command.arg("--nvdimm").arg(nvdimm);
            }
            command
                .arg("--nodes")
                .arg(storage.nodes.max(1).to_string())
                .arg("--pidfile")
                .arg(storage.pidfile);
            if let Some(address) = storage.address {
                command.arg("--ip").arg(address);
            }
        }
        for (name, value) in env {
            let mut pair = std::ffi::OsString::from(format!("{name}="));
            pair.push(value);
            command.arg("--env").arg(pair);
        }
        command.arg("--").arg(program);
        command
    }
}

impl Drop for LabNet {
    fn drop(&mut self) {
        if let Some(home) = self.home.take()
            && let Err(e) = netns::enter_file(&home)
        {
            tracing::warn!("cannot leave the lab's namespace: {e}");
            return;
        }
        if std::mem::take(&mut self.up)
            && let Err(e) = run_script("net.sh", &["down"])
        {
            tracing::warn!("removing the lab's network failed: {e}");
        }
    }
}

/// A guest's rxe0 hardware counters, from the `PMEMLAB-COUNTER name value`
/// lines of its console log.
pub fn guest_counters(console: &str) -> std::collections::BTreeMap<String, u64> {
    console
        .lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("PMEMLAB-COUNTER ")?;
            let (name, value) = rest.split_once(' ')?;
            Some((name.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// A fabric device's RoCE counters from its `/metrics` text: every
/// `fabric_device_roce_<name>_total` series without a `qp` label (the
/// port-wide ones), summed over ports and labels, by `<name>`.
pub fn device_roce_counters(metrics: &str) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("fabric_device_roce_") else {
            continue;
        };
        let (series, value) = match rest.rsplit_once(' ') {
            Some(pair) => pair,
            None => continue,
        };
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        if name.starts_with("qp_") || labels.contains("qp=\"0x") {
            continue;
        }
        let Some(name) = name.strip_suffix("_total") else {
            continue;
        };
        if let Ok(value) = value.parse::<f64>() {
            *out.entry(name.to_owned()).or_insert(0) += value as u64;
        }
    }
    out
}

/// How a fabric device reached its servers on verbs, from its `/metrics`:
/// `server_requests_rdma` (work requests on its queue pairs),
/// `server_requests_control` (left to the servers' TCP connections) and
/// `server_qps_broken`.
pub fn device_server_counters(metrics: &str) -> std::collections::BTreeMap<String, u64> {
    [
        (
            "server_requests_rdma",
            "fabric_device_server_requests_total",
            "path=\"rdma\"",
        ),
        (
            "server_requests_control",
            "fabric_device_server_requests_total",
            "path=\"control\"",
        ),
        (
            "server_qps_broken",
            "fabric_device_server_qps_broken_total",
            "",
        ),
    ]
    .into_iter()
    .filter_map(|(key, name, labels)| {
        Some((
            key.to_owned(),
            telemetry::metric_sum(metrics, name, labels)? as u64,
        ))
    })
    .collect()
}

/// What a PMEM server did itself, from its `/metrics`: `operations` (the
/// requests it executed), `cpu_us` (its process's CPU time) and
/// `queue_pairs` (open RDMA queue pairs).
pub fn server_counters(metrics: &str) -> std::collections::BTreeMap<String, u64> {
    [
        ("operations", "pmem_server_operations_total", 1.0),
        ("cpu_us", "process_cpu_seconds_total", 1e6),
        ("queue_pairs", "pmem_server_queue_pairs", 1.0),
    ]
    .into_iter()
    .filter_map(|(key, name, scale)| {
        Some((
            key.to_owned(),
            (telemetry::metric_sum(metrics, name, "")? * scale) as u64,
        ))
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_side_counters_come_from_the_daemons_metrics() {
        let device = "fabric_device_server_requests_total{path=\"rdma\"} 40\n\
            fabric_device_server_requests_total{path=\"control\"} 2\n\
            fabric_device_server_qps_broken_total 0\n\
            fabric_device_server_qps 2\n";
        let d = device_server_counters(device);
        assert_eq!(d.get("server_requests_rdma"), Some(&40));
        assert_eq!(d.get("server_requests_control"), Some(&2));
        assert_eq!(d.get("server_qps_broken"), Some(&0));
        let server = "pmem_server_operations_total{op=\"READ\",status=\"OK\"} 3\n\
            pmem_server_operations_total{op=\"FETCH_ADD\",status=\"OK\"} 4\n\
            pmem_server_operation_duration_seconds_count{op=\"READ\"} 3\n\
            process_cpu_seconds_total 0.25\n\
            pmem_server_queue_pairs 2\n";
        let s = server_counters(server);
        assert_eq!(s.get("operations"), Some(&7));
        assert_eq!(s.get("cpu_us"), Some(&250_000));
        assert_eq!(s.get("queue_pairs"), Some(&2));
    }

    #[test]
    fn counters_come_from_the_console_and_the_port_wide_series() {
        let console = "noise\nPMEMLAB-COUNTER rcvd_seq_err 0\nPMEMLAB-COUNTER sent_pkts 42\n\
                       PMEMLAB-COUNTER bad\n";
        let guest = guest_counters(console);
        assert_eq!(guest.get("sent_pkts"), Some(&42));
        assert_eq!(guest.get("rcvd_seq_err"), Some(&0));
        assert_eq!(guest.len(), 2);

        let metrics = "# HELP x\n\
            fabric_device_roce_packets_received_total{port=\"p0\"} 5\n\
            fabric_device_roce_packets_received_total{port=\"p1\"} 2\n\
            fabric_device_roce_qp_packets_received_total{port=\"p0\",qp=\"0x100\"} 5\n\
            fabric_device_roce_naks_sent_total{port=\"p0\",qp=\"all\",kind=\"rnr\"} 1\n\
            fabric_device_roce_naks_sent_total{port=\"p0\",qp=\"0x100\",kind=\"rnr\"} 1\n\
            fabric_device_link_up{server=\"A\"} 1\n";
        let device = device_roce_counters(metrics);
        assert_eq!(device.get("packets_received"), Some(&7));
        assert_eq!(device.get("naks_sent"), Some(&1));
        assert_eq!(device.len(), 2);
    }
}

/// What a guest stores data on besides its initramfs, and where its QEMU
/// writes its process id (to cut the guest's power: SIGKILL).
#[derive(Debug, Clone, Copy)]
pub struct GuestStorage<'a> {
    /// A raw disk image, `/dev/vda` in the guest (virtio). What the guest
    /// wrote to it survives a power cut; its page cache does not.
    pub disk: Option<&'a Path>,
    /// Backing files of emulated NVDIMMs (sizes multiples of 2 MiB):
    /// libnvdimm pmem devices in the guest, raw namespaces until `ndctl
    /// create-namespace` makes them fsdax or devdax. Every store the guest
    /// makes lands in the file, written back from a CPU cache or not.
    pub nvdimms: &'a [&'a Path],
    /// NUMA nodes (one vCPU each); NVDIMM i sits on node i mod `nodes`.
    pub nodes: usize,
    /// QEMU's pid file.
    pub pidfile: &'a Path,
    /// The guest's eth0 address (CIDR); `None`: 10.77.0.2/24.
    pub address: Option<&'a str>,
}
