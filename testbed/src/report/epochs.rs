//! Each daemon's map epoch over a run on etcd: the changes sampled from
//! the daemons' `/metrics`, as a table in `report.md` and a step plot
//! (`map_epochs.svg`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::RunReport;
use super::svg::xy_chart;

/// The plot of every daemon's epoch over the run.
pub const MAP_EPOCHS_FILE: &str = "map_epochs.svg";

/// A daemon seen running a map epoch it did not run at its sample before
/// (its first sample counts as a change).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochChange {
    /// The daemon: `pmem-server A`, `fabric-device B`.
    pub daemon: String,
    /// When it was seen, in seconds from the run's start.
    pub at_s: f64,
    /// The epoch it ran.
    pub epoch: u64,
}

/// Each daemon's changes, in time order, by daemon name.
fn by_daemon(changes: &[EpochChange]) -> BTreeMap<&str, Vec<&EpochChange>> {
    let mut daemons: BTreeMap<&str, Vec<&EpochChange>> = BTreeMap::new();
    for change in changes {
        daemons.entry(&change.daemon).or_default().push(change);
    }
    for list in daemons.values_mut() {
        list.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    }
    daemons
}

/// The `## Map epochs` section: one row per daemon with every epoch it was
/// seen on and from when; nothing when the run sampled none.
pub(super) fn epochs_section(out: &mut String, report: &RunReport) {
    if report.map_epochs.is_empty() {
        return;
    }
    let _ = writeln!(out, "\n## Map epochs\n");
    let _ = writeln!(out, "| daemon | epochs (from, s) |");
    let _ = writeln!(out, "|:--|:--|");
    for (daemon, changes) in by_daemon(&report.map_epochs) {
        let steps: Vec<String> = changes
            .iter()
            .map(|c| format!("{} ({:.2})", c.epoch, c.at_s))
            .collect();
        let _ = writeln!(out, "| `{daemon}` | {} |", steps.join(" → "));
    }
    let _ = writeln!(
        out,
        "\nEach daemon's `*_map_epoch` from its `/metrics`, sampled every few hundred \
         milliseconds during the run: a time is when the sample first saw the epoch, so a \
         change happened up to one sampling period before it.\n\n![Map epochs]({MAP_EPOCHS_FILE})"
    );
}

/// A step plot of each daemon's epoch against time.
pub fn map_epochs_svg(report: &RunReport) -> String {
    let end = report.duration_s;
    let series: Vec<(String, Vec<(f64, f64)>)> = by_daemon(&report.map_epochs)
        .into_iter()
        .map(|(daemon, changes)| {
            let mut points = Vec::new();
            for (i, change) in changes.iter().enumerate() {
                let epoch = change.epoch as f64;
                points.push((change.at_s, epoch));
                let until = changes.get(i + 1).map_or(end, |next| next.at_s);
                points.push((until.max(change.at_s), epoch));
            }
            (daemon.to_owned(), points)
        })
        .collect();
    let named: Vec<(&str, Vec<(f64, f64)>)> = series
        .iter()
        .map(|(name, points)| (name.as_str(), points.clone()))
        .collect();
    xy_chart("Map epoch per daemon", "time (s)", "epoch", &named)
}
