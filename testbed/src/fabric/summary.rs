//! `testbed validate`: a readable summary of a topology and its address map.

use std::fmt::Write as _;

use topology::{ByteSize, Layout, Topology};

use crate::fabric::launch::Endpoint;

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
