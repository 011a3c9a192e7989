//! The RDMA lab end to end: a QEMU guest whose stock Debian kernel (rxe)
//! and stock rdma-core are its RDMA stack runs the mixed workload on the
//! verbs transport through the fabric devices' RoCEv2 ports, while both
//! devices are killed in turn; every acknowledged write and atomic reads
//! back. Needs root, QEMU and the lab image (the lab's scripts install and
//! build them), and the `verbs` feature: `scripts/test.sh` runs it in its
//! workspace pass (`--features testbed/verbs`); alone,
//! `cargo test --workspace --features testbed/verbs --test lab`.
#![cfg(feature = "verbs")]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use testbed::fabric::launch::{Fabric, LaunchOptions, NetMode};

static LAB: Mutex<()> = Mutex::new(());

/// `pmemctl` built with the `verbs` feature, next to the test binaries.
fn pmemctl() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("pmemctl")))
        .filter(|p| p.exists())
        .expect(
            "pmemctl next to the test binaries (cargo build -p pmem-client --features verbs --bins)",
        )
}

/// The lab topology's fabric, up, with its data and logs under `dir`.
fn lab_fabric(dir: &std::path::Path) -> Fabric {
    let topology = testbed::load_topology_on(None, NetMode::Lab).expect("lab topology");
    let mut options = LaunchOptions::new(dir.join("data"), dir.join("run")).expect("options");
    options.net = NetMode::Lab;
    options.program = env!("CARGO_BIN_EXE_testbed").into();
    Fabric::start(&topology, options).expect("lab fabric")
}

/// Runs `testbed ARGS --net lab --reports DIR` (one lab at a time) and
/// checks it succeeded with one run; returns the run's report and a text
/// with testbed's output and the guest's console and worker log.
///
/// A run whose guest kernel crashed (an oops or panic on a guest console:
/// the emulated guests' rxe driver has been seen to corrupt its own slab
/// under TCG) is run once more, with the crash printed: that is the guest
/// kernel's fault, not the fabric's. Any other failure fails at once.
fn lab_run(args: &[&str]) -> (serde_json::Value, String) {
    // One lab at a time: every run uses the same namespace.
    let _lab = LAB
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match lab_attempt(args) {
        Attempt::GuestKernelCrashed(text) => {
            eprintln!("the guest kernel crashed; running once more. The first run:\n{text}");
            match lab_attempt(args) {
                Attempt::GuestKernelCrashed(text) | Attempt::Failed(text) => panic!("{text}"),
                Attempt::Passed(report, text) => (report, text),
            }
        }
        Attempt::Failed(text) => panic!("{text}"),
        Attempt::Passed(report, text) => (report, text),
    }
}

/// How one lab run ended.
enum Attempt {
    Passed(serde_json::Value, String),
    Failed(String),
    GuestKernelCrashed(String),
}

/// What a guest kernel prints when it crashes.
const GUEST_KERNEL_CRASH: [&str; 3] = ["Kernel panic - not syncing", "] Oops:", "] BUG: "];

/// One `testbed ARGS --net lab` run in a fresh reports folder, kept when
/// the run fails.
fn lab_attempt(args: &[&str]) -> Attempt {
    let dir = tempfile::tempdir().expect("temp dir");
    let reports = dir.path().join("reports");
    let out = Command::new(env!("CARGO_BIN_EXE_testbed"))
        .args(args)
        .args(["--net", "lab"])
        .arg("--reports")
        .arg(&reports)
        .output()
        .expect("run testbed");
    let runs: Vec<PathBuf> = std::fs::read_dir(&reports)
        .map(|d| d.map(|e| e.expect("entry").path()).collect())
        .unwrap_or_default();
    let mut crashed = false;
    let logs = runs
        .first()
        .map(|run| {
            let read = |name: &str| std::fs::read_to_string(run.join("logs").join(name));
            let console = read("guest-c1.log").unwrap_or_default();
            let worker = read("worker-c1.log").unwrap_or_default();
            let server = read("guest-server-S.log").unwrap_or_default();
            crashed = [&console, &server]
                .iter()
                .any(|log| GUEST_KERNEL_CRASH.iter().any(|sign| log.contains(sign)));
            format!("guest console:\n{console}\nworker:\n{worker}\nserver guest:\n{server}")
        })
        .unwrap_or_default();
    let text = format!(
        "{}\n{}\n{logs}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        // Kept for whoever looks into it: the region files and every log.
        let text = format!(
            "{text}\nthe run's folder is kept in {}",
            dir.keep().display()
        );
        return if crashed {
            Attempt::GuestKernelCrashed(text)
        } else {
            Attempt::Failed(text)
        };
    }
    if runs.len() != 1 {
        return Attempt::Failed(format!("expected one run, found {runs:?}\n{text}"));
    }
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(runs[0].join("report.json")).expect("report.json"),
    )
    .expect("report JSON");
    Attempt::Passed(report, text)
}

/// Runs `testbed chaos --net lab` with two faults of `scenario` and checks
/// the run: it passed, the application saw no error, and the workload went
/// over RoCEv2 without damaged or out-of-sequence packets. Returns the
/// report and the guest's rxe counters.
fn lab_chaos(scenario: &str, extra: &[&str]) -> (serde_json::Value, BTreeMap<String, u64>) {
    let mut args = vec!["chaos", "--scenario", scenario];
    args.extend(["--faults", "2", "--duration", "10", "--seed", "3"]);
    args.extend(extra);
    let (report, text) = lab_run(&args);
    let logs = &text;
    assert_eq!(report["verification"]["passed"], true, "{text}");
    let ops: u64 = report["ops"]
        .as_object()
        .expect("ops")
        .values()
        .map(|s| s["count"].as_u64().unwrap_or(0))
        .sum();
    let errors: u64 = report["ops"]
        .as_object()
        .expect("ops")
        .values()
        .map(|s| s["errors"].as_u64().unwrap_or(0))
        .sum();
    assert!(ops > 0, "no operation completed: {text}");
    assert_eq!(
        errors, 0,
        "device kills are invisible to the application: {text}"
    );
    assert_eq!(report["faults"].as_array().map(Vec::len), Some(2), "{text}");

    // The workload really went over RoCEv2: both devices' ports carried it,
    // and neither side saw a damaged or out-of-sequence packet.
    let counters = |v: &serde_json::Value| -> BTreeMap<String, u64> {
        serde_json::from_value(v.clone()).expect("counters")
    };
    let roce = &report["roce"];
    for device in ["F1", "F2"] {
        let c = counters(&roce["devices"][device]);
        assert!(c["packets_received"] > 0, "{device}: {c:?}\n{text}");
        // On AF_XDP, the device's default frame path where the kernel
        // allows it, as this one does.
        assert!(c["af_xdp_frames"] > 0, "{device}: {c:?}\n{text}");
        assert_eq!(c["icrc_errors"], 0, "{device}: {c:?}");
    }
    let guest = counters(&roce["guests"]["c1"]);
    assert!(guest["sent_pkts"] > 100, "{guest:?}\n{logs}");
    for zero in ["rcvd_seq_err", "out_of_seq_request"] {
        assert_eq!(guest[zero], 0, "rxe {zero}: {guest:?}");
    }
    (report, guest)
}

/// With keys (every run has them): the guest gets a folder holding only
/// its own key, and its control connections prove it to the devices.
#[test]
fn a_guest_rdma_client_runs_verified_through_device_kills() {
    let (_, guest) = lab_chaos("kill-fabric", &[]);
    assert_eq!(guest["retry_exceeded_err"], 0, "{guest:?}");
}

/// Taking a device's RoCEv2 interface down leaves the control connection
/// up: the guest's queue pair retransmits until its retries run out, and
/// the pool fails over on that error completion.
#[test]
fn a_guest_rdma_client_fails_over_when_its_queue_pair_runs_out_of_retries() {
    let (report, guest) = lab_chaos("cut-link", &[]);
    assert!(
        guest["completer_retry_err"] > 0,
        "the QP retransmitted: {guest:?}\nfaults: {}",
        report["faults"]
    );
}

/// The whole RDMA path with a PMEM server on verbs (`configs/lab-verbs.toml`):
/// a server guest with two emulated NVDIMMs on two NUMA nodes (fsdax for
/// socket 0's region, served over TCP; device DAX for socket 1's,
/// registered with its rxe0), the fabric devices on the host, and a client
/// guest whose rxe0 reaches them over RoCEv2. The mixed workload runs
/// verified while the server guest's power is cut (QEMU killed) and it
/// boots again: nothing acknowledged is lost, READ, WRITE, WRITE_PERSIST,
/// FLUSH and ATOMIC_WRITE for the device DAX region went from the devices'
/// queue pairs to the server's RNIC, and the server said where its devices
/// are and how RDMA writes become durable there.
#[test]
fn a_verbs_server_on_emulated_nvdimms_serves_a_roce_client_through_a_power_cut() {
    let topology = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/lab-verbs.toml");
    let (report, text) = lab_run(&[
        "chaos",
        topology,
        "--scenario",
        "kill-server",
        "--faults",
        "1",
        "--duration",
        "15",
        "--seed",
        "3",
    ]);
    assert_eq!(report["verification"]["passed"], true, "{text}");
    assert_eq!(report["faults"].as_array().map(Vec::len), Some(1), "{text}");
    let counters = |v: &serde_json::Value| -> BTreeMap<String, u64> {
        serde_json::from_value(v.clone()).unwrap_or_default()
    };
    let roce = &report["roce"];
    let (mut rdma, mut control) = (0, 0);
    for device in ["F1", "F2"] {
        let c = counters(&roce["devices"][device]);
        rdma += c.get("server_requests_rdma").copied().unwrap_or(0);
        control += c.get("server_requests_control").copied().unwrap_or(0);
        assert_eq!(c.get("icrc_errors"), Some(&0), "{device}: {c:?}");
    }
    // READ, WRITE, WRITE_PERSIST, FLUSH and ATOMIC_WRITE for the device DAX
    // region go as RDMA once a queue pair is up; atomics, and requests while
    // no queue pair is up (before the first one, and after the power cut
    // until the rebooted server's), go to the server's CPU. How many of each
    // there are depends on how fast the emulated guests run and reboot (on
    // a loaded machine the final verification may find the queue pairs
    // still down), so only the RDMA path's use is asserted, not a share.
    assert!(
        rdma >= 20,
        "RDMA work requests {rdma}, control {control}\n{text}"
    );
    let server = counters(&roce["servers"]["S"]);
    assert!(
        server.get("queue_pairs").copied().unwrap_or(0) >= 2,
        "{server:?}\n{text}"
    );
    // The server guest's console (its last boot): device DAX on NUMA node 1,
    // registered with FLUSH to persistence.
    for line in [
        "pmem device pmem0 of socket 0: /mnt/pmem0, fsdax on pmem0, NUMA node 0",
        "pmem device pmem1 of socket 1: /dev/dax1.0, devdax, NUMA node 1",
        "FLUSH to persistence",
        "persistence over RDMA: flush",
        "NIC n0 of socket 0: its threads run on NUMA node 0 (CPUs [0])",
        "NIC n1 of socket 1: its threads run on NUMA node 1 (CPUs [1])",
        "NIC n1 of socket 1: RDMA device rxe0",
    ] {
        assert!(text.contains(line), "{line:?} missing from:\n{text}");
    }
}

/// Every region kept twice, on two server guests on verbs: the copies of
/// the device DAX regions are written and read by their owner device with
/// RDMA on each copy's own queue pair. One guest's power is cut under the
/// mixed workload and it boots again on the same NVDIMMs: nothing
/// acknowledged is lost (every write and atomic reads back), the
/// application sees no error, the owners' work went over RDMA, and the
/// copies that serve at the end and are readable from the host (files,
/// not device DAX) are identical.
///
/// The owners give up on the dead guest's copies within their copy
/// timeout (1 s; sooner where a queue pair to it fails), inside the guest
/// client's 2-s attempt timeout: before that copy timeout existed they waited the 2-s request timeout, the client gave up
/// on its paths to both devices and some requests failed
/// (`docs/replication.md`, "On verbs servers": the lab run).
#[test]
fn a_power_cut_of_one_of_two_verbs_server_guests_holding_copies_is_invisible() {
    let topology = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../configs/lab-verbs-replicated.toml"
    );
    let (report, text) = lab_run(&[
        "chaos",
        topology,
        "--scenario",
        "kill-server",
        "--faults",
        "1",
        "--duration",
        "15",
        "--seed",
        "3",
    ]);
    assert_eq!(report["verification"]["passed"], true, "{text}");
    assert_eq!(report["faults"].as_array().map(Vec::len), Some(1), "{text}");
    let ops = report["ops"].as_object().expect("ops");
    let count: u64 = ops.values().map(|s| s["count"].as_u64().unwrap_or(0)).sum();
    let errors: u64 = ops
        .values()
        .map(|s| s["errors"].as_u64().unwrap_or(0))
        .sum();
    assert!(count > 0, "no operation completed: {text}");
    assert_eq!(errors, 0, "a copy's power cut is invisible: {text}");
    let rdma: u64 = ["F1", "F2"]
        .iter()
        .map(|d| {
            report["roce"]["devices"][d]["server_requests_rdma"]
                .as_u64()
                .unwrap_or(0)
        })
        .sum();
    assert!(
        rdma >= 20,
        "RDMA work requests to the copies: {rdma}\n{text}"
    );
    let differences = report["replicas"]["differences"]
        .as_array()
        .map_or(0, Vec::len);
    assert_eq!(differences, 0, "copies diverged: {text}");
}

/// A region on fsdax behind a `verbs` NIC: the guest's kernel refuses to
/// pin fsdax pages for the RNIC and rxe has no on-demand paging, so the
/// server stops at start, naming the region, the reason and what to do.
#[test]
fn a_verbs_nic_over_an_fsdax_region_says_to_use_device_dax() {
    let dir = tempfile::tempdir().expect("temp dir");
    let lab_verbs = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../configs/lab-verbs.toml"
    ))
    .expect("lab-verbs.toml");
    // The same fabric with socket 1's device on fsdax too.
    let topology = dir.path().join("fsdax-verbs.toml");
    std::fs::write(
        &topology,
        lab_verbs.replace("path = \"/dev/dax1.0\"", "path = \"/mnt/pmem1\""),
    )
    .expect("write the topology");
    let _lab = LAB
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let out = Command::new(env!("CARGO_BIN_EXE_testbed"))
        .arg("run")
        .arg(&topology)
        .args(["--net", "lab", "--duration", "1", "--reports"])
        .arg(dir.path().join("reports"))
        .output()
        .expect("run testbed");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    for said in [
        "pmem-server S did not start",
        "NIC n1: region S1 cannot be registered with rxe0",
        "refuses long-term pinning of its pages (an fsdax file)",
        "put the region on device DAX",
        "Operation not supported",
    ] {
        assert!(text.contains(said), "{said:?} missing:\n{text}");
    }
}

/// roce-probe and pmemctl on the verbs transport, run from a guest against
/// a lab fabric: every RDMA operation the stock verbs library posts works
/// through the device, and pmemctl's writes and atomics land where the host
/// reads them over TCP. Needs `target/<profile>/{pmemctl,roce-probe}` built
/// with the `verbs` feature (`cargo build -p pmem-client --features verbs --bins`).
#[test]
fn pmemctl_in_a_guest_reads_writes_and_adds_over_rdma() {
    let pmemctl = pmemctl();
    let _lab = LAB
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().expect("temp dir");
    let fabric = lab_fabric(dir.path());

    // One guest runs every step; it stops at the first failure.
    let config = fabric.topology_path.display().to_string();
    // Away from what roce-probe writes (the first 64 KiB of each region).
    let at = (1u64 << 40) + 0x80_0000;
    let script = dir.path().join("pmemctl.sh");
    let steps = [
        format!("write {at:#x} hello-over-rdma"),
        format!("read {at:#x} 15"),
        format!("faa {:#x} 5", at + 64),
        format!("faa {:#x} 5", at + 64),
        "map".to_owned(),
    ];
    // roce-probe first (it writes at each region's start): READ, WRITE,
    // both atomics and ATOMIC_WRITE posted by the stock verbs library.
    let probe = pmemctl.with_file_name("roce-probe");
    let mut text = format!(
        "#!/bin/sh\nset -e\n{} --topology {config} --client c1 --device-port 10.77.0.100:7101 \
         --local-ip 10.77.0.2 --rdma-device rxe0\n",
        probe.display()
    );
    for step in &steps {
        text.push_str(&format!(
            "echo '$ pmemctl {step}'\n{} --config {config} --client c1 {step}\n",
            pmemctl.display()
        ));
    }
    std::fs::write(&script, text).expect("script");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let out = fabric
        .client_command("c1", &script, &[pmemctl.parent().expect("dir")])
        .output()
        .expect("guest");
    let console = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{console}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(console.contains("roce-probe-ok 2"), "{console}");
    assert!(
        console.contains("COMPARE_SWAP 7->10, ATOMIC_WRITE ok"),
        "rxe posts ATOMIC_WRITE: {console}"
    );
    assert!(console.contains("hello-over-rdma"), "{console}");
    assert!(
        console.contains("roce"),
        "map names the RoCE paths: {console}"
    );

    // The host reads the same bytes, and both additions, over TCP.
    let (data, word) = fabric
        .as_client("c1", |pool| async move {
            let data = pool
                .read(topology::VirtAddr(at), 15)
                .await
                .map_err(|e| e.to_string())?;
            let word = pool
                .read(topology::VirtAddr(at + 64), 8)
                .await
                .map_err(|e| e.to_string())?;
            Ok((data, word))
        })
        .expect("host-side read");
    assert_eq!(data, b"hello-over-rdma");
    assert_eq!(word, 10u64.to_le_bytes());
    drop(fabric.stop());
}

/// Sums the samples of series `name` in a `/metrics` text.
fn metric(text: &str, name: &str) -> f64 {
    telemetry::metric_sum(text, name, "").unwrap_or(0.0)
}

/// An RDMA FETCH_ADD in doubt: the guest's atomic reaches a device and the
/// server behind it is stopped, then that device is killed. The pool asks
/// again through the other device with the identity the first device gave
/// the atomic; when the server resumes it executes the first copy and
/// answers the second from its exactly-once record. The word is added to
/// once and the application sees one success.
#[test]
fn an_rdma_atomic_in_doubt_when_its_device_dies_runs_exactly_once() {
    use std::time::{Duration, Instant};
    use testbed::fabric::launch::DaemonKind;

    let pmemctl = pmemctl();
    let _lab = LAB
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut fabric = lab_fabric(dir.path());

    // The word lives on server A (region A1, the first one).
    let word = (1u64 << 40) + 0x1000;
    let script = dir.path().join("faa.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nexec {} --config {} --client c1 --attempt-timeout-ms 8000 --op-timeout-ms 30000 faa {word:#x} 1\n",
            pmemctl.display(),
            fabric.topology_path.display()
        ),
    )
    .expect("script");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");

    let server = fabric.pid(DaemonKind::PmemServer, "A").expect("server A");
    // SAFETY: kill(2) on the pid of a child this fabric started and still holds.
    assert_eq!(unsafe { libc::kill(server as i32, libc::SIGSTOP) }, 0);
    let guest = fabric
        .client_command("c1", &script, &[pmemctl.parent().expect("dir")])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("guest");

    // Wait for the atomic to sit in a device, then kill that device.
    let scrape = |fabric: &Fabric, id: &str| {
        let admin = fabric.admin(DaemonKind::FabricDevice, id).expect("admin");
        telemetry::http_get(admin, "/metrics", Duration::from_secs(2))
            .map(|(_, body)| body)
            .unwrap_or_default()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut guest = guest;
    let holder = loop {
        if Instant::now() > deadline || matches!(guest.try_wait(), Ok(Some(_))) {
            let _ = guest.kill();
            let out = guest.wait_with_output().expect("guest");
            panic!(
                "the atomic never sat in a device:\n{}\nF1:\n{}",
                String::from_utf8_lossy(&out.stdout),
                scrape(&fabric, "F1")
            );
        }
        if let Some(id) = ["F1", "F2"]
            .into_iter()
            .find(|id| metric(&scrape(&fabric, id), "fabric_device_in_flight_requests") >= 1.0)
        {
            break id;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    fabric.kill(DaemonKind::FabricDevice, holder).expect("kill");
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(server as i32, libc::SIGCONT) }, 0);

    let out = guest.wait_with_output().expect("guest");
    let console = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{console}");
    let admin = fabric.admin(DaemonKind::PmemServer, "A").expect("admin");
    let server_metrics = telemetry::http_get(admin, "/metrics", Duration::from_secs(5))
        .map(|(_, body)| body)
        .expect("server metrics");
    let value = fabric
        .as_client("c1", |pool| async move {
            pool.read(topology::VirtAddr(word), 8)
                .await
                .map_err(|e| e.to_string())
        })
        .expect("read back");
    assert_eq!(value, 1u64.to_le_bytes(), "added once: {console}");
    assert!(
        metric(&server_metrics, "pmem_server_exactly_once_replays_total") >= 1.0,
        "the second copy was answered from the record: {server_metrics}"
    );
    drop(fabric.stop());
}

/// Real power cuts: the pmem-server runs in a guest with its region files
/// on the guest's virtio disk (msync), QEMU is killed at random instants
/// under a workload of WRITE_PERSIST, WRITE + FLUSH and persistent
/// exactly-once atomics, and after every boot each acknowledged write and
/// atomic is there and the interrupted atomic's retry runs once.
#[test]
fn power_cuts_of_a_server_guest_lose_nothing_acknowledged() {
    power_cuts("disk", "msync on a virtio disk", 3);
}

/// The same on the DAX path: the regions on an emulated NVDIMM, an fsdax
/// namespace with ext4 mounted `-o dax`, mapped with `MAP_SYNC` (mapped
/// without it, the first cut loses every block and atomic the journal had
/// not committed).
#[test]
fn power_cuts_of_a_dax_server_guest_lose_nothing_acknowledged() {
    power_cuts("fsdax", "DAX on an emulated NVDIMM", 3);
}

/// The same on device DAX: the region's header and data in `/dev/dax0.0`,
/// a devdax namespace the first boot makes on the emulated NVDIMM, mapped
/// from the character device and made durable by cache-line write-back;
/// the server says the device's NUMA node. Two cuts keep it short.
#[test]
fn power_cuts_of_a_devdax_server_guest_lose_nothing_acknowledged() {
    power_cuts(
        "devdax",
        "device DAX on an emulated NVDIMM (devdax, /dev/dax0.0)",
        2,
    );
}

/// `testbed bench-persist --quick` (about 12 s): one NVDIMM guest runs a
/// pmem-server on its fsdax mount (mode dax) and one on its virtio disk
/// (mode msync), and redis with `appendfsync always`, and the report has
/// every system's p50 and the ratios to redis.
#[test]
fn bench_persist_measures_dax_msync_and_redis_in_one_nvdimm_guest() {
    let _lab = LAB
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().expect("temp dir");
    let out = Command::new(env!("CARGO_BIN_EXE_testbed"))
        .args(["bench-persist", "--quick", "--size", "64"])
        .arg("--out")
        .arg(dir.path())
        .output()
        .expect("run testbed bench-persist");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "testbed bench-persist failed:\n{text}"
    );
    let report: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("report.json")).expect("report.json"),
    )
    .expect("the report parses");
    assert_eq!(report["server_modes"]["D"], "dax", "{text}");
    assert_eq!(report["server_modes"]["M"], "msync", "{text}");
    let systems = report["systems"].as_array().expect("systems");
    let names: Vec<&str> = systems
        .iter()
        .filter_map(|s| s["system"].as_str())
        .collect();
    assert_eq!(names, ["dax", "msync", "redis", "redis-dax"], "{text}");
    for system in systems {
        let p50 = system["p50_us"].as_f64().expect("p50");
        assert!(
            p50 > 0.0 && p50 <= system["p99_us"].as_f64().expect("p99"),
            "{text}"
        );
    }
    for ratio in ["dax_over_redis", "msync_over_redis"] {
        assert!(
            report[ratio]["median"].as_f64().is_some_and(|r| r > 0.0),
            "{text}"
        );
    }
    assert!(text.contains("| dax / redis |"), "{text}");
}

/// `cuts` power cuts of a server guest whose regions are on `medium`; the
/// report's title names `title`.
fn power_cuts(medium: &str, title: &str, cuts: u64) {
    let _lab = LAB
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().expect("temp dir");
    let out = Command::new(env!("CARGO_BIN_EXE_testbed"))
        .args([
            "power-cut",
            "--cuts",
            &cuts.to_string(),
            "--seed",
            "5",
            "--medium",
            medium,
        ])
        .arg("--out")
        .arg(dir.path())
        .output()
        .expect("run testbed power-cut");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "testbed power-cut failed:\n{text}\nthe run's folder is kept in {}",
        dir.keep().display()
    );
    let report: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("report.json")).expect("report.json"),
    )
    .expect("the report parses");
    assert_eq!(report["medium"], medium, "{text}");
    assert!(text.contains(title), "{text}");
    assert_eq!(report["cuts"], cuts, "{text}");
    assert_eq!(report["lost"], 0, "{text}");
    assert!(report["acknowledged"].as_u64() > Some(100), "{text}");
    assert!(report["blocks_checked"].as_u64() > Some(0), "{text}");
    assert!(
        report["atomics_checked"].as_u64() >= Some(2 * (cuts + 1)),
        "{text}"
    );
}
