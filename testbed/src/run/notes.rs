//! The report's notes on what a run saw: each fault's effect on the
//! application, the lab's RoCE counters, and when a new server's regions
//! were first used.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::fabric::launch::{DaemonKind, Fabric};
use crate::lab;
use crate::report::{RoceCounters, RunReport};

use super::BUCKET_MS;
use super::worker::WorkerProcess;

/// For each fault: the errors the application saw from its injection to a
/// second after its undoing, its recovery and longest stall, and a note
/// saying so in the report's words.
pub(super) fn note_fault_effects(report: &mut RunReport, duration_s: f64) {
    for fault in &mut report.faults {
        let from = fault.at_s;
        let to = fault.restored_at_s.unwrap_or(duration_s) + 1.0;
        let first = (from * 1000.0 / BUCKET_MS as f64) as usize;
        let last = (to * 1000.0 / BUCKET_MS as f64) as usize;
        fault.errors_seen = (first..last).map(|i| report.timeline.errors_at(i)).sum();
    }
    report.note_faults();
}

/// The RoCE counters of a lab run: each device's, scraped now, and each
/// guest's, from its console.
pub(super) fn lab_counters(fabric: &Fabric, clients: &[String]) -> RoceCounters {
    let mut roce = RoceCounters::default();
    for device in &fabric.topology.fabric_devices {
        let id = device.id.to_string();
        let Ok(admin) = fabric.admin(DaemonKind::FabricDevice, &id) else {
            continue;
        };
        if let Ok((_, text)) = telemetry::http_get(admin, "/metrics", Duration::from_secs(5)) {
            let mut counters = lab::counters::device_roce_counters(&text);
            counters.extend(lab::counters::device_server_counters(&text));
            roce.devices.insert(id, counters);
        }
    }
    for server in &fabric.topology.servers {
        let id = server.id.to_string();
        if crate::lab::guest_server::guest_address(server).is_none() {
            continue;
        }
        let Ok(admin) = fabric.admin(DaemonKind::PmemServer, &id) else {
            continue;
        };
        if let Ok((_, text)) = telemetry::http_get(admin, "/metrics", Duration::from_secs(5)) {
            roce.servers
                .insert(id, lab::counters::server_counters(&text));
        }
    }
    for client in clients {
        let console = std::fs::read_to_string(fabric.guest_console(client)).unwrap_or_default();
        roce.guests
            .insert(client.clone(), lab::counters::guest_counters(&console));
    }
    roce
}

/// One line per device and guest for the summary.
pub(super) fn lab_notes(roce: &RoceCounters) -> Vec<String> {
    let get = |m: &BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
    let mut notes = Vec::new();
    for (device, c) in &roce.devices {
        notes.push(format!(
            "RoCE at {device}: {} packets in, {} out, {} retransmissions, {} duplicates, \
             {} NAKs sent, {} ICRC errors",
            get(c, "packets_received"),
            get(c, "packets_sent"),
            get(c, "retransmissions"),
            get(c, "duplicates"),
            get(c, "naks_sent"),
            get(c, "icrc_errors"),
        ));
    }
    for (device, c) in &roce.devices {
        if c.contains_key("server_requests_rdma") {
            notes.push(format!(
                "{device} to servers on verbs: {} requests as RDMA work requests, {} on the \
                 servers' TCP connections, {} queue pairs broke",
                get(c, "server_requests_rdma"),
                get(c, "server_requests_control"),
                get(c, "server_qps_broken"),
            ));
        }
    }
    for (server, c) in &roce.servers {
        notes.push(format!(
            "server {server} (in its guest): executed {} requests itself, {} µs of CPU, {} \
             queue pairs open",
            get(c, "operations"),
            get(c, "cpu_us"),
            get(c, "queue_pairs"),
        ));
    }
    for (client, c) in &roce.guests {
        let shown: Vec<String> = c
            .iter()
            .filter(|(_, v)| **v > 0)
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        notes.push(format!(
            "guest {client} rxe0: {} (others 0)",
            if shown.is_empty() {
                "all counters 0".to_owned()
            } else {
                shown.join(", ")
            }
        ));
    }
    notes
}

/// For each server added under the run: how long after the change was
/// committed in etcd each running worker first had a request served by a
/// region it brought (`map change → first use`), or that it had none.
pub(super) fn first_use_notes(fabric: &Fabric, workers: &[WorkerProcess]) -> Vec<String> {
    let added = fabric
        .map_changes()
        .iter()
        .filter(|c| c.added && fabric.topology.server(&c.id.as_str().into()).is_some());
    added
        .map(|change| {
            let seen: Vec<String> = workers
                .iter()
                .map(|w| match w.first_use.load(Ordering::Relaxed) {
                    0 => format!("{} none", w.client),
                    at => format!(
                        "{} {} ms",
                        w.client,
                        at.saturating_sub(change.committed_unix_ms)
                    ),
                })
                .collect();
            format!(
                "map change → first use: server {} added at epoch {}; from the change \
                 committed in etcd to the first request a running worker had served by its \
                 regions: {} (the testbed started the server after the change; it was ready \
                 and every device linked to it {} ms after the change)",
                change.id,
                change.epoch,
                seen.join(", "),
                change
                    .settled_unix_ms
                    .saturating_sub(change.committed_unix_ms)
            )
        })
        .collect()
}
