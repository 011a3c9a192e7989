//! What the lab's daemons and guests counted: a guest's rxe0 hardware
//! counters from its console, and a fabric device's or PMEM server's
//! counters from its `/metrics` text.

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
