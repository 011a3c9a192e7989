//! The RoCEv2 counters on `/metrics`: per queue pair and per port.
//!
//! Queue pairs count in plain integers on the event loop's thread; the loop
//! publishes a snapshot now and then ([`RoceMetrics::publish`]) and the
//! scrape renders it, so the data path takes no lock per packet.

use std::sync::{Arc, Mutex};

use proto::roce::rc::Counters;
use telemetry::{Registry, RegistryError};

use crate::rdma::gateway::GatewayCounters;
use crate::rdma::uplink::UplinkCounters;

/// The counters of one port: its gateway, its reader and its queue pairs.
#[derive(Debug, Clone, Default)]
pub struct PortSnapshot {
    /// The port's id.
    pub port: String,
    /// Gateway-wide drops.
    pub gateway: GatewayCounters,
    /// Frames dropped because the event loop fell behind.
    pub rx_overflow: u64,
    /// ARP requests answered.
    pub arp_replies: u64,
    /// Datagrams not sent for want of the peer's MAC address.
    pub no_neighbor: u64,
    /// Frames whose Ethernet, IPv4 or UDP header does not hold together.
    pub bad_headers: u64,
    /// Receive-ring slots whose descriptor pointed outside the slot.
    pub ring_malformed: u64,
    /// Frames longer than a receive-ring slot.
    pub ring_truncated: u64,
    /// Frames received through the port's `AF_XDP` socket.
    pub af_xdp_frames: u64,
    /// Each live queue pair's number and counters.
    pub qps: Vec<(u32, Counters)>,
    /// Counters summed over every queue pair, closed ones included.
    pub totals: Counters,
}

type Snapshot = Arc<Mutex<Vec<PortSnapshot>>>;

/// Publishes RoCE counters for scrapes.
#[derive(Debug, Clone, Default)]
pub struct RoceMetrics {
    snapshot: Snapshot,
    uplinks: Arc<Mutex<UplinkCounters>>,
}

/// One series of a per-QP counter: its labels and how to read it.
type QpSeries = (&'static str, &'static str, fn(&Counters) -> u64);

/// Per-QP counters: metric suffix, help, reader.
const QP_COUNTERS: [QpSeries; 9] = [
    (
        "packets_received",
        "RoCEv2 datagrams accepted by the queue pair.",
        |c| c.packets_received,
    ),
    (
        "packets_sent",
        "RoCEv2 datagrams sent by the queue pair.",
        |c| c.packets_sent,
    ),
    (
        "bytes_received",
        "Bytes of RoCEv2 datagrams accepted by the queue pair.",
        |c| c.bytes_received,
    ),
    (
        "bytes_sent",
        "Bytes of RoCEv2 datagrams sent by the queue pair.",
        |c| c.bytes_sent,
    ),
    (
        "duplicates",
        "Duplicate requests the queue pair answered or dropped.",
        |c| c.duplicates,
    ),
    (
        "out_of_sequence",
        "Requests past the expected PSN, dropped.",
        |c| c.out_of_sequence,
    ),
    (
        "retransmissions",
        "Go-back-N restarts of the queue pair's requester.",
        |c| c.retransmissions,
    ),
    (
        "icrc_errors",
        "Datagrams for the queue pair dropped for a bad ICRC.",
        |c| c.icrc_errors,
    ),
    (
        "foreign_source",
        "Datagrams for the queue pair from another address, dropped.",
        |c| c.foreign,
    ),
];

impl RoceMetrics {
    /// Registers the RoCE series in `registry`.
    pub fn register(registry: &Registry) -> Result<Self, RegistryError> {
        let metrics = RoceMetrics::default();
        for (suffix, help, read) in QP_COUNTERS {
            let snapshot = Arc::clone(&metrics.snapshot);
            registry.register_fn_counter(
                &format!("fabric_device_roce_{suffix}_total"),
                &format!("{help} Summed over the port's queue pairs, closed ones included."),
                &["port"],
                Box::new(move || {
                    samples(&snapshot, |p, out| {
                        out.push((vec![p.port.clone()], read(&p.totals) as f64));
                    })
                }),
            )?;
            let snapshot = Arc::clone(&metrics.snapshot);
            registry.register_fn_counter(
                &format!("fabric_device_roce_qp_{suffix}_total"),
                help,
                &["port", "qp"],
                Box::new(move || {
                    samples(&snapshot, |p, out| {
                        for (qpn, c) in &p.qps {
                            out.push((vec![p.port.clone(), format!("{qpn:#x}")], read(c) as f64));
                        }
                    })
                }),
            )?;
        }
        let snapshot = Arc::clone(&metrics.snapshot);
        registry.register_fn_counter(
            "fabric_device_roce_naks_sent_total",
            "NAKs the device's queue pairs sent, by kind (qp=\"all\": summed, closed ones included).",
            &["port", "qp", "kind"],
            Box::new(move || {
                samples(&snapshot, |p, out| {
                    let all = std::iter::once(("all".to_owned(), &p.totals));
                    let each = p.qps.iter().map(|(qpn, c)| (format!("{qpn:#x}"), c));
                    for (qp, c) in all.chain(each) {
                        for (kind, n) in [
                            ("psn_sequence", c.naks_sent_sequence),
                            ("rnr", c.naks_sent_rnr),
                            ("invalid_request", c.naks_sent_invalid),
                            ("remote_access", c.naks_sent_access),
                            ("remote_operational", c.naks_sent_operational),
                        ] {
                            let labels = vec![p.port.clone(), qp.clone(), kind.into()];
                            out.push((labels, n as f64));
                        }
                    }
                })
            }),
        )?;
        let snapshot = Arc::clone(&metrics.snapshot);
        registry.register_fn_counter(
            "fabric_device_roce_dropped_total",
            "RoCEv2 frames a port dropped before any queue pair saw them, by reason.",
            &["port", "reason"],
            Box::new(move || {
                samples(&snapshot, |p, out| {
                    for (reason, n) in [
                        ("icrc_error", p.gateway.icrc_errors),
                        ("malformed", p.gateway.malformed),
                        ("unknown_qp", p.gateway.unknown_qp),
                        ("bad_rkey", p.gateway.bad_rkeys),
                        ("rx_overflow", p.rx_overflow),
                        ("no_neighbor", p.no_neighbor),
                        ("bad_headers", p.bad_headers),
                        ("ring_malformed", p.ring_malformed),
                        ("ring_truncated", p.ring_truncated),
                    ] {
                        out.push((vec![p.port.clone(), reason.into()], n as f64));
                    }
                })
            }),
        )?;
        let snapshot = Arc::clone(&metrics.snapshot);
        registry.register_fn_counter(
            "fabric_device_roce_af_xdp_frames_total",
            "Frames a RoCE port received through its AF_XDP socket (0 on the other frame paths; \
             ARP and frames the XDP program passes on arrive by the packet socket).",
            &["port"],
            Box::new(move || {
                samples(&snapshot, |p, out| {
                    out.push((vec![p.port.clone()], p.af_xdp_frames as f64));
                })
            }),
        )?;
        let snapshot = Arc::clone(&metrics.snapshot);
        registry.register_fn_counter(
            "fabric_device_roce_arp_replies_total",
            "ARP requests for a RoCE port's address that the device answered.",
            &["port"],
            Box::new(move || {
                samples(&snapshot, |p, out| {
                    out.push((vec![p.port.clone()], p.arp_replies as f64));
                })
            }),
        )?;
        let uplinks = Arc::clone(&metrics.uplinks);
        let read =
            move |f: fn(&UplinkCounters) -> u64| uplinks.lock().map(|u| f(&u)).unwrap_or(0) as f64;
        let requests = read.clone();
        registry.register_fn_counter(
            "fabric_device_server_requests_total",
            "Requests for servers on verbs, by how they went: rdma (work requests on the \
             device's queue pair to the server's RNIC) or control (the server's TCP connection: \
             exactly-once atomics, per-extent keys, no queue pair yet).",
            &["path"],
            Box::new(move || {
                vec![
                    (vec!["rdma".into()], requests(|u| u.posted)),
                    (vec!["control".into()], requests(|u| u.on_control)),
                ]
            }),
        )?;
        let broken = read.clone();
        registry.register_fn_counter(
            "fabric_device_server_qps_broken_total",
            "Queue pairs to servers that failed (retries exhausted); their links reconnected.",
            &[],
            Box::new(move || vec![(vec![], broken(|u| u.broken))]),
        )?;
        registry.register_fn_gauge(
            "fabric_device_server_qps",
            "RDMA queue pairs to servers on verbs that are up.",
            &[],
            Box::new(move || vec![(vec![], read(|u| u.up))]),
        )?;
        Ok(metrics)
    }

    /// Replaces the published counters of the queue pairs toward servers.
    pub fn publish_uplinks(&self, counters: UplinkCounters) {
        if let Ok(mut published) = self.uplinks.lock() {
            *published = counters;
        }
    }

    /// Replaces the published snapshot.
    pub fn publish(&self, ports: Vec<PortSnapshot>) {
        if let Ok(mut snapshot) = self.snapshot.lock() {
            *snapshot = ports;
        }
    }
}

fn samples(
    snapshot: &Snapshot,
    each: impl Fn(&PortSnapshot, &mut Vec<(Vec<String>, f64)>),
) -> Vec<(Vec<String>, f64)> {
    let mut out = Vec::new();
    if let Ok(ports) = snapshot.lock() {
        for port in ports.iter() {
            each(port, &mut out);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_counters_are_rendered() {
        let registry = Registry::new();
        let metrics = RoceMetrics::register(&registry).expect("register");
        let c = Counters {
            packets_received: 5,
            naks_sent_access: 1,
            ..Counters::default()
        };
        metrics.publish(vec![PortSnapshot {
            port: "p0".into(),
            arp_replies: 2,
            af_xdp_frames: 4,
            qps: vec![(0x100, c)],
            totals: c,
            ..PortSnapshot::default()
        }]);
        let text = registry.render();
        for line in [
            "fabric_device_roce_packets_received_total{port=\"p0\"} 5",
            "fabric_device_roce_qp_packets_received_total{port=\"p0\",qp=\"0x100\"} 5",
            "fabric_device_roce_naks_sent_total{port=\"p0\",qp=\"all\",kind=\"remote_access\"} 1",
            "fabric_device_roce_arp_replies_total{port=\"p0\"} 2",
            "fabric_device_roce_af_xdp_frames_total{port=\"p0\"} 4",
            "fabric_device_roce_dropped_total{port=\"p0\",reason=\"unknown_qp\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from\n{text}"
            );
        }
    }
}
