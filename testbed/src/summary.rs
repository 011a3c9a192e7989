//! `testbed validate`: a readable summary of a topology and its address map.

use std::fmt::Write as _;

use topology::{ByteSize, Layout, Topology};

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
