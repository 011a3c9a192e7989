//! `testbed validate`: a readable summary of a topology and its address map.

use std::fmt::Write as _;

use topology::{ByteSize, Layout, Topology};

use crate::launch::Endpoint;
use crate::run::RunOutcome;

/// A table of text cells printed with aligned columns.
#[derive(Debug, Default)]
struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    fn row<I: IntoIterator<Item = S>, S: ToString>(&mut self, cells: I) {
        self.rows
            .push(cells.into_iter().map(|c| c.to_string()).collect());
    }

    fn render(&self, out: &mut String) {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|s| s.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for row in &self.rows {
            let line: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(cell, w)| format!("{cell:<w$}"))
                .collect();
            let _ = writeln!(out, "  {}", line.join("  ").trim_end());
        }
    }
}

/// The summary `testbed validate` prints for a valid topology: counts,
/// capacity, the layout digest and the address map.
pub fn render(topology: &Topology, layout: &Layout) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}: valid topology", topology.source);
    let mut counts = Table::default();
    counts.row(["clients".to_owned(), topology.clients.len().to_string()]);
    counts.row([
        "fabric devices".to_owned(),
        topology.fabric_devices.len().to_string(),
    ]);
    counts.row(["servers".to_owned(), topology.servers.len().to_string()]);
    counts.row(["regions".to_owned(), layout.entries().len().to_string()]);
    counts.row([
        "capacity".to_owned(),
        ByteSize(topology.capacity()).to_string(),
    ]);
    counts.row([
        "extent size".to_owned(),
        ByteSize(layout.extent_size()).to_string(),
    ]);
    counts.row(["layout digest".to_owned(), layout.digest_hex()]);
    counts.render(&mut out);

    let _ = writeln!(out, "\naddress map:");
    let mut map = Table::default();
    map.row([
        "REGION", "SERVER", "SOCKET", "DEVICE", "START", "END", "SIZE",
    ]);
    for e in layout.entries_by_address() {
        map.row([
            e.region_id.to_string(),
            e.server.to_string(),
            e.socket.to_string(),
            e.device.to_string(),
            format!("{:#014x}", e.start.get()),
            format!("{:#014x}", e.end()),
            ByteSize(e.len).to_string(),
        ]);
    }
    map.render(&mut out);
    out
}

/// The table of daemons `testbed up` prints: data and admin addresses,
/// data directories, namespaces.
pub fn endpoints_table(endpoints: &[Endpoint]) -> String {
    let mut table = Table::default();
    table.row(["DAEMON", "ID", "DATA", "ADMIN", "DATA DIR / NAMESPACE"]);
    for e in endpoints {
        let data: Vec<String> = e.data.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let place = match (&e.data_dir, &e.namespace) {
            (Some(dir), Some(ns)) => format!("{} ({ns})", dir.display()),
            (Some(dir), None) => dir.display().to_string(),
            (None, Some(ns)) => ns.clone(),
            (None, None) => String::new(),
        };
        table.row([
            e.kind.program().to_owned(),
            e.id.clone(),
            data.join(" "),
            format!("http://{}/metrics", e.admin),
            place,
        ]);
    }
    let mut out = String::new();
    table.render(&mut out);
    out
}

/// The daemons' `/metrics` addresses, printed when a run's fabric is up:
/// they answer only while the run lasts.
pub fn live_metrics(endpoints: &[Endpoint]) -> String {
    let mut out = String::from("metrics, live while the run lasts (the daemons stop with it):");
    for e in endpoints {
        let _ = write!(
            out,
            "\n  {} {}: http://{}/metrics",
            e.kind.program(),
            e.id,
            e.admin
        );
    }
    out
}

/// What `run`, `demo` and `chaos` print at the end.
pub fn run_summary(outcome: &RunOutcome) -> String {
    let report = &outcome.report;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{} ({} workload, {} clients, {:.1} s)",
        report.run_id,
        report.workload,
        report.clients.len(),
        report.duration_s
    );
    let _ = writeln!(
        out,
        "  operations      {} ({:.0} ops/s)",
        report.ops_total(),
        report.ops_per_s()
    );
    let _ = writeln!(
        out,
        "  errors seen     {} (by the application)",
        report.errors_total()
    );
    for fault in &report.faults {
        let _ = writeln!(out, "  fault           {}", fault.describe());
    }
    let v = &report.verification;
    let _ = writeln!(
        out,
        "  verification    {} ({} keys, {} counters checked at the end)",
        if v.passed { "PASSED" } else { "FAILED" },
        v.keys_checked,
        v.counters_checked
    );
    let _ = writeln!(
        out,
        "  reads checked   {} during the run; {} overlapped a write of their key, {} of them \
         saw a mix of two versions (the contract allows it; not judged)",
        v.reads_checked, v.reads_overlapped, v.reads_torn_by_overlap
    );
    for line in &v.during_run {
        let _ = writeln!(out, "    during the run: {line}");
    }
    for line in &v.mismatches {
        let _ = writeln!(out, "    at the final verification: {line}");
    }
    if let Some(check) = &report.linearizability {
        let _ = writeln!(out, "  linearizability {}", check.summary());
        for line in &check.failure {
            let _ = writeln!(out, "    {line}");
        }
    }
    if let Some(replicas) = &report.replicas {
        let _ = writeln!(out, "  replicas        {}", replicas.summary());
        for line in replicas.differences.iter().chain(&replicas.not_compared) {
            let _ = writeln!(out, "    {line}");
        }
    }
    let _ = writeln!(out, "\n{}", crate::report::summary_table(report));
    let _ = writeln!(
        out,
        "  report          {}",
        outcome.files.markdown.display()
    );
    let _ = writeln!(
        out,
        "  plots           {}, {}, {}",
        outcome.files.latency_cdf.display(),
        outcome.files.latency_tail.display(),
        outcome.files.throughput.display()
    );
    let _ = writeln!(out, "  raw figures     {}", outcome.files.json.display());
    let _ = writeln!(out, "  replay          {}", report.replay);
    let _ = writeln!(
        out,
        "  region files    {}",
        if report.data_kept {
            format!("kept in {}", report.data_dir)
        } else {
            "removed (the run passed)".to_owned()
        }
    );
    // The daemons have stopped: their /metrics addresses were printed
    // while they were live, at the start.
    for line in &outcome.unclean_exits {
        let _ = writeln!(out, "  did not stop cleanly: {line}");
    }
    out
}
