//! The rendered text passes `promtool check metrics` (parser and linter).
//!
//! promtool comes from the Debian package `prometheus`, which the project's test
//! script installs; these tests fail, not skip, when it is missing.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use telemetry::{
    AdminServer, Health, Histogram, Registry, RegistryError, http_get, promtool_check,
};

/// A registry with every kind of metric, labels, escaping and histograms.
fn every_kind() -> Result<Registry, RegistryError> {
    let registry = Registry::new();
    registry
        .counter("pmem_requests_total", "Requests received.")?
        .add(12);
    let ops = registry.counter_family(
        "pmem_ops_total",
        "Operations by kind and status.",
        &["op", "status"],
    )?;
    ops.with(&["READ", "OK"]).add(10);
    ops.with(&["WRITE", "ERR_BOUNDS"]).inc();
    registry.counter_family("pmem_unused_total", "A family without children.", &["op"])?;
    registry
        .gauge("pmem_in_flight_requests", "Requests in flight.")?
        .set(-2);
    registry
        .gauge_f64("pmem_fill_ratio", "Fraction of the pool in use.")?
        .set(0.375);
    let links = registry.gauge_family("pmem_link_up", "Whether a link is up.", &["link"])?;
    links.with(&["fd0/p1"]).set(1);
    let odd = registry.gauge_f64_family(
        "pmem_odd_labels",
        "Escaping: a backslash \\ and a\nsecond line.",
        &["path"],
    )?;
    odd.with(&["C:\\pmem\n\"quoted\""]).set(f64::INFINITY);
    odd.with(&["nan"]).set(f64::NAN);
    odd.with(&["tiny"]).set(1e-300);
    let latency = registry.histogram(
        "pmem_op_duration_seconds",
        "Time to serve one operation.",
        Histogram::latency_buckets(),
    )?;
    for micros in [3, 40, 900, 12_000, 20_000_000] {
        latency.observe_duration(Duration::from_micros(micros));
    }
    let sizes = registry.histogram_family(
        "pmem_op_size_bytes",
        "Request sizes by kind.",
        &["op"],
        &Histogram::exponential_buckets(512.0, 2.0, 8),
    )?;
    sizes.with(&["WRITE"]).observe(4096.0);
    sizes.with(&["READ"]).observe(100.0);
    registry.register_fn_gauge(
        "pmem_region_size_bytes",
        "Size of each region.",
        &["region"],
        Box::new(|| {
            vec![
                (vec!["r1".into()], 1_073_741_824.0),
                (vec!["r0".into()], 2_147_483_648.0),
            ]
        }),
    )?;
    registry.register_fn_gauge(
        "pmem_persistence_mode_info",
        "The persistence mode in use.",
        &["mode"],
        Box::new(|| vec![(vec!["fsdax".into()], 1.0)]),
    )?;
    registry.register_fn_counter(
        "pmem_flushes_total",
        "Flushes issued.",
        &[],
        Box::new(|| vec![(Vec::new(), 7.0)]),
    )?;
    Ok(registry)
}

#[test]
fn every_metric_kind_passes_promtool() {
    let text = every_kind().unwrap().render();
    if let Err(report) = promtool_check(&text) {
        panic!("{report}\n--- rendered text ---\n{text}");
    }
}

#[test]
fn scraped_text_passes_promtool() {
    let server = AdminServer::start(
        (Ipv4Addr::LOCALHOST, 0).into(),
        Arc::new(every_kind().unwrap()),
        Arc::new(|| Health::Healthy),
    )
    .unwrap();
    let (status, text) = http_get(server.local_addr(), "/metrics", Duration::from_secs(5)).unwrap();
    assert_eq!(status, 200);
    if let Err(report) = promtool_check(&text) {
        panic!("{report}\n--- scraped text ---\n{text}");
    }
}

#[test]
fn promtool_reports_problems() {
    // A counter without HELP and without `_total`: promtool must complain, which
    // shows the helper really runs it (a missing promtool fails here too).
    let report = promtool_check("# TYPE requests counter\nrequests 1\n").unwrap_err();
    assert!(report.contains("no help text"), "{report}");
    assert!(report.contains("_total"), "{report}");
    let report = promtool_check("this is not { exposition\n").unwrap_err();
    assert!(report.contains("promtool check metrics failed"), "{report}");
}
