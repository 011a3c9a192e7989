//! The Prometheus side of the testbed: the committed scrape config and
//! Grafana dashboard stay true to the daemons, and a real Prometheus scrapes
//! real daemons through `testbed::fabric::prometheus`.

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use testbed::fabric::prometheus::{
    DEFAULT_SCRAPE_INTERVAL, FABRIC_DEVICE_JOB, PMEM_SERVER_JOB, PrometheusError,
    PrometheusOptions, PrometheusServer, Sample, ScrapeTarget, scrape_config,
};
use topology::{EnvOverrides, Topology};

/// Set to `1` to rewrite `configs/prometheus.yml` from `scrape_config`.
const BLESS_VAR: &str = "PMEM_FABRIC_BLESS";

/// What `configs/prometheus.yml` says before the generated text.
const CONFIG_FILE_HEADER: &str = "\
# Scrapes the daemons of configs/default.toml (their admin addresses):
#   prometheus --config.file configs/prometheus.yml
# `testbed up --prometheus` writes and runs its own copy for the fabric it
# starts. Regenerate this file with
#   PMEM_FABRIC_BLESS=1 cargo test -p testbed --test prometheus
# (testbed/tests/prometheus.rs checks it matches the default topology).

";

/// How long a fresh Prometheus may take to report its targets: it hands
/// them to its scrapers about 5 s after the start.
const TARGETS_TIMEOUT: Duration = Duration::from_secs(30);

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn read(path: &str) -> String {
    let path = repo_file(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn default_topology() -> Topology {
    Topology::from_toml_str(
        testbed::DEFAULT_TOPOLOGY_NAME,
        testbed::DEFAULT_TOPOLOGY,
        &EnvOverrides::None,
    )
    .expect("the embedded default topology loads")
}

fn addr(text: &str) -> SocketAddr {
    text.parse().expect("a socket address")
}

/// Runs `promtool check config FILE`, failing the test with its output.
fn promtool_check_config(file: &Path) {
    let output = Command::new("promtool")
        .args(["check", "config"])
        .arg(file)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool ({e}): install the Debian package `prometheus`")
        });
    assert!(
        output.status.success(),
        "promtool check config {} failed ({}):\n{}{}",
        file.display(),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn committed_scrape_config_is_generated_from_the_default_topology() {
    let targets = ScrapeTarget::from_topology(&default_topology()).unwrap();
    assert_eq!(
        targets,
        [
            ScrapeTarget::pmem_server("A", addr("127.0.1.1:9100")),
            ScrapeTarget::pmem_server("B", addr("127.0.1.3:9100")),
            ScrapeTarget::fabric_device("A", addr("127.0.2.1:9200")),
            ScrapeTarget::fabric_device("B", addr("127.0.2.2:9200")),
        ]
    );
    let generated = scrape_config(&targets, DEFAULT_SCRAPE_INTERVAL);
    let expected = format!("{CONFIG_FILE_HEADER}{generated}");
    if std::env::var(BLESS_VAR).as_deref() == Ok("1") {
        std::fs::write(repo_file("configs/prometheus.yml"), &expected).unwrap();
    }
    let committed = read("configs/prometheus.yml");
    assert!(
        committed == expected,
        "configs/prometheus.yml differs from scrape_config for the default topology \
         (rerun with {BLESS_VAR}=1 to rewrite it); expected:\n{expected}"
    );
}

#[test]
fn committed_scrape_config_passes_promtool() {
    promtool_check_config(&repo_file("configs/prometheus.yml"));
}

#[test]
fn unusual_targets_still_make_a_valid_config() {
    let dir = tempfile::tempdir().unwrap();
    let targets = [
        ScrapeTarget::pmem_server("weird \"id\": #1", addr("[::1]:9100")),
        ScrapeTarget::fabric_device("F", addr("127.0.0.1:9200")),
        ScrapeTarget::fabric_device("G", addr("127.0.0.1:9201")),
    ];
    let file = dir.path().join("p.yml");
    std::fs::write(&file, scrape_config(&targets, Duration::from_millis(250))).unwrap();
    promtool_check_config(&file);
    let empty = dir.path().join("empty.yml");
    std::fs::write(&empty, scrape_config(&[], Duration::from_secs(30))).unwrap();
    promtool_check_config(&empty);
}

/// The dashboard's panels (rows have no queries and are skipped).
fn dashboard() -> Value {
    serde_json::from_str(&read("configs/grafana/pmem-fabric.json"))
        .expect("configs/grafana/pmem-fabric.json is JSON")
}

/// Every PromQL expression of the dashboard: panel targets and template
/// variable queries.
fn dashboard_exprs(dashboard: &Value) -> Vec<String> {
    let mut exprs = Vec::new();
    let panels = dashboard["panels"].as_array().expect("panels");
    for panel in panels {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(target["expr"].as_str().expect("a string expr").to_owned());
        }
    }
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("variables");
    for variable in variables {
        if variable["type"] == "query" {
            exprs.push(
                variable["definition"]
                    .as_str()
                    .expect("a definition")
                    .to_owned(),
            );
        }
    }
    exprs
}

/// `expr` with Grafana's variables replaced so Prometheus can run it.
fn concrete(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$server", ".*")
        .replace("$device", ".*")
}

#[test]
fn dashboard_is_a_grafana_dashboard_with_titled_queried_panels() {
    let dashboard = dashboard();
    assert_eq!(dashboard["title"], "pmem-fabric");
    assert!(dashboard["schemaVersion"].as_u64().unwrap() >= 36);
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    assert!(
        variables.iter().any(|v| v["name"] == "DS_PROMETHEUS"
            && v["type"] == "datasource"
            && v["query"] == "prometheus"),
        "no Prometheus datasource variable DS_PROMETHEUS"
    );
    let datasource = serde_json::json!({"type": "prometheus", "uid": "${DS_PROMETHEUS}"});
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 10, "only {} panels", panels.len());
    let mut ids = BTreeSet::new();
    let mut titles = Vec::new();
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or_default();
        assert!(!title.is_empty(), "a panel without a title: {panel}");
        titles.push(title.to_owned());
        assert!(
            ids.insert(panel["id"].as_u64().unwrap()),
            "duplicate id in {title}"
        );
        assert_eq!(panel["datasource"], datasource, "{title}");
        let grid = &panel["gridPos"];
        let (x, w) = (grid["x"].as_u64().unwrap(), grid["w"].as_u64().unwrap());
        assert!(
            w > 0 && x + w <= 24 && grid["h"].as_u64().unwrap() > 0,
            "{title}: {grid}"
        );
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title} has no targets");
        let mut refs = BTreeSet::new();
        for target in targets {
            assert!(!target["expr"].as_str().unwrap().is_empty(), "{title}");
            assert_eq!(target["datasource"], datasource, "{title}");
            assert!(refs.insert(target["refId"].as_str().unwrap()), "{title}");
        }
    }
    // What the issue asks the dashboard to show.
    let exprs = dashboard_exprs(&dashboard).join("\n");
    for needle in [
        "sum by (op) (rate(fabric_device_requests_total",
        "sum by (op) (rate(pmem_server_operations_total",
        "histogram_quantile(0.99, sum by (le, op) (rate(pmem_server_operation_duration_seconds_bucket",
        "fabric_device_server_round_trip_seconds_bucket",
        "fabric_device_processing_seconds_bucket",
        "fabric_device_link_up",
        "up{job=~\"pmem-server|fabric-device\"}",
        "rate(pmem_server_received_bytes_total",
        "rate(pmem_server_sent_bytes_total",
        "fabric_device_in_flight_requests",
        "fabric_device_connected_clients",
    ] {
        assert!(exprs.contains(needle), "no query with {needle:?}");
    }
}

/// The metric names in `expr`: identifiers starting with a daemon prefix.
fn metric_names(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|word| word.starts_with("pmem_server_") || word.starts_with("fabric_device_"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn dashboard_metrics_are_registered_by_the_daemons() {
    let sources: String = [
        "pmem-server/src/metrics.rs",
        "pmem-server/src/server.rs",
        "fabric-device/src/metrics.rs",
    ]
    .into_iter()
    .map(read)
    .collect();
    let mut checked = BTreeSet::new();
    for expr in dashboard_exprs(&dashboard()) {
        let names = metric_names(&expr);
        for name in names {
            let (base, histogram_series) = ["_bucket", "_sum", "_count"]
                .into_iter()
                .find_map(|suffix| name.strip_suffix(suffix).map(|base| (base, true)))
                .unwrap_or((&name, false));
            let literal = format!("\"{base}\"");
            let at = sources.find(&literal).unwrap_or_else(|| {
                panic!("{name} (in {expr}) is not registered by pmem-server or fabric-device")
            });
            if histogram_series {
                // The registering call just before the name is a histogram's.
                let before = &sources[at.saturating_sub(120)..at];
                let call = before.rsplit("r.").next().unwrap_or(before);
                assert!(
                    call.contains("histogram"),
                    "{name} (in {expr}): {base} is not registered as a histogram"
                );
            }
            checked.insert(base.to_owned());
        }
    }
    assert!(checked.len() >= 15, "only {checked:?}");
}

#[test]
fn metric_names_are_found_in_exprs() {
    assert_eq!(
        metric_names(
            "histogram_quantile(0.99, sum by (le) (rate(fabric_device_x_bucket{instance_id=~\"$device\"}[$__rate_interval]))) / pmem_server_y"
        ),
        ["fabric_device_x_bucket", "pmem_server_y"]
    );
}

/// A loopback address nothing listens on: a port just released on an
/// address no other test binds.
fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.63.1:0").expect("bind 127.0.63.1");
    listener.local_addr().expect("the bound address")
}

/// The samples of `promql` once there are some: a target reported up has
/// been scraped, but allow a moment for its samples to become queryable.
fn query_nonempty(prometheus: &PrometheusServer, promql: &str) -> Vec<Sample> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let samples = prometheus.query(promql).expect("the query runs");
        if !samples.is_empty() || Instant::now() >= deadline {
            return samples;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn prometheus_scrapes_a_real_pmem_server_and_fabric_device() {
    let dir = tempfile::tempdir().unwrap();
    let config = testkit::write_topology(dir.path(), &[("R1", "4MiB")]);
    let server = testkit::pmem_server(&config, "S", &dir.path().join("data"), &[]).unwrap();
    let device = testkit::fabric_device(&config, "F", &[]).unwrap();
    let targets = [
        ScrapeTarget::pmem_server("S", server.addr("admin")),
        ScrapeTarget::fabric_device("F", device.addr("admin")),
    ];

    let started = Instant::now();
    let prometheus = PrometheusServer::start(&dir.path().join("prometheus"), &targets).unwrap();
    let ready_after = started.elapsed();
    assert!(prometheus.url().starts_with("http://127.0.0.1:"));
    assert!(prometheus.config_path().is_file());
    let health = prometheus.wait_targets_up(TARGETS_TIMEOUT).unwrap();
    let up_after = started.elapsed();
    eprintln!("prometheus ready after {ready_after:?}, targets up after {up_after:?}");
    assert_eq!(health.len(), 2);
    assert_eq!(
        (health[0].job.as_str(), health[0].instance.as_str()),
        (PMEM_SERVER_JOB, "S")
    );
    assert_eq!(
        (health[1].job.as_str(), health[1].instance.as_str()),
        (FABRIC_DEVICE_JOB, "F")
    );
    assert!(
        health.iter().all(|t| t.is_up() && t.last_error.is_empty()),
        "{health:?}"
    );

    let sizes = query_nonempty(&prometheus, "pmem_server_region_size_bytes");
    assert_eq!(sizes.len(), 1, "{sizes:?}");
    let (labels, size) = &sizes[0];
    assert_eq!(*size, (4 << 20) as f64);
    assert_eq!(labels["region"], "R1");
    assert_eq!(labels["instance_id"], "S");
    assert_eq!(labels["job"], PMEM_SERVER_JOB);
    assert_eq!(labels["instance"], server.addr("admin").to_string());

    let up = prometheus.query("sum by (job, instance_id) (up)").unwrap();
    assert_eq!(up.len(), 2, "{up:?}");
    assert!(up.iter().all(|(_, value)| *value == 1.0), "{up:?}");
    let scalar = prometheus.query("scalar(count(up))").unwrap();
    assert_eq!(scalar, [(Default::default(), 2.0)]);

    // Every dashboard query is valid PromQL for this Prometheus.
    for expr in dashboard_exprs(&dashboard()) {
        if expr.starts_with("label_values(") {
            continue; // Grafana's own function, not PromQL.
        }
        prometheus
            .query(&concrete(&expr))
            .unwrap_or_else(|e| panic!("dashboard query {expr}: {e}"));
    }
    match prometheus.query("sum(") {
        Err(PrometheusError::Api(message)) => assert!(message.contains("bad_data"), "{message}"),
        other => panic!("a bad query gave {other:?}"),
    }
    match prometheus.query("up[1m]") {
        Err(PrometheusError::Api(message)) => assert!(message.contains("matrix"), "{message}"),
        other => panic!("a range query gave {other:?}"),
    }

    let pid = prometheus.pid().unwrap();
    assert!(process_exists(pid));
    let stopping = Instant::now();
    prometheus.stop();
    eprintln!("prometheus stopped in {:?}", stopping.elapsed());
    assert!(
        !process_exists(pid),
        "prometheus {pid} still exists after stop"
    );
}

#[test]
fn a_target_on_a_closed_port_is_reported_down() {
    let dir = tempfile::tempdir().unwrap();
    let closed = closed_port();
    let targets = [ScrapeTarget::pmem_server("gone", closed)];
    let prometheus = PrometheusServer::start_with(
        dir.path(),
        &targets,
        &PrometheusOptions {
            scrape_interval: Duration::from_millis(500),
            ..PrometheusOptions::default()
        },
    )
    .unwrap();
    let pid = prometheus.pid().unwrap();
    let started = Instant::now();
    let timeout = Duration::from_secs(12);
    match prometheus.wait_targets_up(timeout) {
        Err(PrometheusError::TargetsDown(health)) => {
            assert_eq!(health.len(), 1);
            assert_eq!(health[0].instance, "gone");
            assert_eq!(health[0].addr, closed);
            assert_eq!(health[0].health, "down", "{health:?}");
            assert!(
                health[0].last_error.contains("connection refused"),
                "{health:?}"
            );
            let message = PrometheusError::TargetsDown(health).to_string();
            assert!(
                message.contains(&format!("pmem-server/gone ({closed}): down")),
                "{message}"
            );
        }
        other => panic!("a closed port gave {other:?}"),
    }
    // It gave the target the whole timeout before it said so (a timer
    // cannot end early, however slow the machine).
    let waited = started.elapsed();
    assert!(waited >= timeout, "gave up after {waited:?} of {timeout:?}");
    drop(prometheus);
    assert!(
        !process_exists(pid),
        "prometheus {pid} still exists after drop"
    );
}

#[test]
fn a_missing_prometheus_says_which_package_to_install() {
    let dir = tempfile::tempdir().unwrap();
    let options = PrometheusOptions {
        program: PathBuf::from("/nonexistent/prometheus"),
        ..PrometheusOptions::default()
    };
    let error = PrometheusServer::start_with(dir.path(), &[], &options).unwrap_err();
    assert!(
        matches!(error, PrometheusError::NotInstalled { .. }),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("Debian package `prometheus`"),
        "{error}"
    );
}

#[test]
fn a_prometheus_that_exits_early_is_reported_with_its_log() {
    let dir = tempfile::tempdir().unwrap();
    // Stands in for a Prometheus that refuses its config and exits.
    let script = dir.path().join("fake-prometheus");
    std::fs::write(
        &script,
        "#!/bin/sh\necho 'err: no good config' >&2\nexit 3\n",
    )
    .unwrap();
    let mut permissions = std::fs::metadata(&script).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&script, permissions).unwrap();
    let options = PrometheusOptions {
        program: script,
        ..PrometheusOptions::default()
    };
    let error = PrometheusServer::start_with(&dir.path().join("p"), &[], &options).unwrap_err();
    match &error {
        PrometheusError::Exited { status, log_tail } => {
            assert_eq!(status.code(), Some(3));
            assert!(log_tail.contains("no good config"), "{log_tail}");
        }
        other => panic!("{other:?}"),
    }
}
